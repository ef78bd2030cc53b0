/* The FSDP unit runtime (dist/fsdp.h). */
#include "dist/fsdp.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "dist/comm_internal.h"

typedef struct {
  nt_shard_layout lay;
  nt_tensor full;       /* compute dtype [padded]: SHARD_GRAD_OP kept, FULL_SHARD while gathered */
  nt_tensor shard;      /* compute dtype [shard]: FULL_SHARD kept, SHARD_GRAD_OP a view of full */
  nt_tensor master0;    /* F32 [shard]: initial master values for a 16-bit compute copy */
  nt_tensor gfull;      /* F32 [padded] whole gradient while it exists (sharded strategies) */
  nt_tensor gshard;     /* F32 [shard] kept gradient shard (sharded strategies) */
  nt_tensor red;        /* reduce-dtype copy of the whole gradient (reduce_dtype != F32) */
  nt_tensor red_shard;  /* reduce-dtype shard result, widened into gshard at the join */
  int64_t gather_seq;   /* the collective that (last) gathered the compute parameters */
  bool gathered, used, reported;
} fsdp_unit;

struct nt_fsdp {
  nt_comm *comm;
  nt_params *p;
  nt_fsdp_options opt;
  int W, rank, n;
  nt_device dev;
  fsdp_unit *u;
  bool sync;
  int n_reported;
  /* Execution orders recorded during the first step (FSDP does the same), for prefetching. */
  int *fwd, *bwd;
  int n_fwd, n_bwd;
  bool recorded;
  int n_gathered, peak_gathered;
  double live_param, peak_param, live_grad, peak_grad, opt_elems, master_elems;
  double t0;   /* trace clock origin */
  struct { nt_tensor t; double *live; int64_t seq; } *deferred;   /* 2 per unit at most */
  int n_deferred;
};

static void trace(nt_fsdp *f, const char *event, int unit, double bytes, bool comm) {
  if (!f->opt.trace) return;
  fprintf(f->opt.trace, "fsdp r%d +%.3f ms %-18s unit %d %10.0f B seq %lld stream %s\n", f->rank,
          1e3 * (nt_dist_now() - f->t0), event, unit, bytes, (long long)nt_comm_seq(f->comm),
          comm && nt_comm_stream(f->comm) ? "comm" : comm ? "host(mpi)" : "compute");
}

nt_fsdp_options nt_fsdp_defaults(void) {
  nt_fsdp_options o;
  memset(&o, 0, sizeof o);
  o.strategy = NT_SHARD_NO_SHARD;
  o.param_dtype = NT_F32;
  o.reduce_dtype = NT_F32;
  o.reshard_after_forward = true;
  o.limit_all_gathers = true;
  o.backward_prefetch = NT_BACKWARD_PREFETCH_PRE;
  o.forward_prefetch = false;
  return o;
}

bool nt_backward_prefetch_parse(const char *s, nt_backward_prefetch *out) {
  if (!strcasecmp(s, "NONE")) *out = NT_BACKWARD_PREFETCH_NONE;
  else if (!strcasecmp(s, "BACKWARD_PRE")) *out = NT_BACKWARD_PREFETCH_PRE;
  else if (!strcasecmp(s, "BACKWARD_POST")) *out = NT_BACKWARD_PREFETCH_POST;
  else return false;
  return true;
}

const nt_shard_layout *nt_fsdp_layout(const nt_fsdp *f, int unit) { return &f->u[unit].lay; }
int nt_fsdp_grad_divisor(const nt_fsdp *f) { return f->W; }
nt_params *nt_fsdp_params(const nt_fsdp *f) { return f->p; }
nt_sharding nt_fsdp_strategy(const nt_fsdp *f) { return f->opt.strategy; }
void nt_fsdp_set_sync(nt_fsdp *f, bool sync) { f->sync = sync; }

static bool sharded(const nt_fsdp *f) { return f->opt.strategy != NT_SHARD_NO_SHARD; }

/* ---- buffers and their byte counts ---- */

static void count(double *live, double *peak, double bytes) {
  *live += bytes;
  if (*live > *peak) *peak = *live;
}

static nt_status alloc_flat(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int64_t n, double *live,
                            double *peak) {
  nt_status st = nt_tensor_alloc(ctx, t, dt, 1, &n);
  if (!st) count(live, peak, (double)nt_tensor_nbytes(t));
  return st;
}

/* Frees a buffer in the compute stream's order: only for buffers the communication stream no
 * longer touches once the compute stream has reached this point (it waited for them). */
static void free_flat(nt_ctx *ctx, nt_tensor *t, double *live) {
  if (!t->owner) return;
  *live -= (double)nt_tensor_nbytes(t);
  nt_tensor_free(ctx, t);
  t->data = NULL;
}

/* A buffer a collective still reads on the communication stream (a whole gradient being
 * reduce-scattered): with host collectives it is free at once; with a communication stream it
 * waits in f->deferred until the compute stream has waited for that collective (the next
 * unit's grads_ready, or the join). This keeps every wait inside the step's own stream order
 * (no events queried by the pool, which a CUDA graph capture would not allow), at the cost of
 * up to two whole gradients alive instead of one. */
static void free_after_collective(nt_ctx *ctx, nt_fsdp *f, nt_tensor *t, double *live) {
  if (!t->owner) return;
  if (!nt_comm_stream(f->comm)) {
    free_flat(ctx, t, live);
    return;
  }
  f->deferred[f->n_deferred].t = *t;
  f->deferred[f->n_deferred].live = live;
  f->deferred[f->n_deferred].seq = nt_comm_seq(f->comm);
  f->n_deferred++;
  t->data = NULL;
  t->owner = NULL;
}

static nt_status free_deferred(nt_ctx *ctx, nt_fsdp *f) {
  if (!f->n_deferred) return NT_OK;
  int64_t seq = 0;
  for (int i = 0; i < f->n_deferred; i++) seq = f->deferred[i].seq > seq ? f->deferred[i].seq : seq;
  nt_status st = nt_comm_wait_seq(f->comm, ctx, seq);
  for (int i = 0; i < f->n_deferred; i++) free_flat(ctx, &f->deferred[i].t, f->deferred[i].live);
  f->n_deferred = 0;
  return st;
}

static nt_status copy_or_convert(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src) {
  return dst->dtype == src->dtype ? nt_tensor_copy(ctx, dst, src) : nt_convert(ctx, dst, src);
}

/* Points the model's unit at the whole compute buffer / gradient (data NULL while absent). */
static void bind_compute(nt_fsdp *f, int j) {
  nt_unit *un = &f->p->units[j];
  fsdp_unit *u = &f->u[j];
  un->compute = nt_tensor_view(u->full.data, f->p->compute_dtype, f->dev, 1, &u->lay.numel);
  if (un->compute.dtype == NT_F32) un->master = un->compute;
}

static void bind_grad(nt_fsdp *f, int j) {
  fsdp_unit *u = &f->u[j];
  f->p->units[j].grad = nt_tensor_view(u->gfull.data, NT_F32, f->dev, 1, &u->lay.numel);
}

/* Builds unit j's kept buffers from the model's values, then frees the model's buffers. */
static nt_status adopt_unit(nt_ctx *ctx, nt_fsdp *f, int j) {
  nt_unit *un = &f->p->units[j];
  fsdp_unit *u = &f->u[j];
  nt_dtype cdt = f->p->compute_dtype;
  nt_tensor pad = {0};
  double scratch = 0, scratch_peak = 0;
  nt_status st = alloc_flat(ctx, &pad, NT_F32, u->lay.padded, &scratch, &scratch_peak);
  if (!st) st = nt_tensor_zero(ctx, &pad);
  nt_tensor head = nt_flat_view(&pad, 0, u->lay.numel);
  if (!st && u->lay.numel) st = nt_tensor_copy(ctx, &head, &un->master);
  nt_tensor mine = nt_flat_view(&pad, u->lay.lo, u->lay.shard);
  if (!st && f->opt.strategy == NT_SHARD_GRAD_OP) {
    st = alloc_flat(ctx, &u->full, cdt, u->lay.padded, &f->live_param, &f->peak_param);
    if (!st) st = copy_or_convert(ctx, &u->full, &pad);
    u->shard = nt_flat_view(&u->full, u->lay.lo, u->lay.shard);
  } else if (!st) {
    st = alloc_flat(ctx, &u->shard, cdt, u->lay.shard, &f->live_param, &f->peak_param);
    if (!st) st = copy_or_convert(ctx, &u->shard, &mine);
  }
  if (!st && cdt != NT_F32) {
    double none = 0, none_peak = 0;
    st = alloc_flat(ctx, &u->master0, NT_F32, u->lay.shard, &none, &none_peak);
    if (!st) st = nt_tensor_copy(ctx, &u->master0, &mine);
  }
  if (!st) st = alloc_flat(ctx, &u->gshard, NT_F32, u->lay.shard, &f->live_grad, &f->peak_grad);
  if (!st) st = nt_tensor_zero(ctx, &u->gshard);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &pad);
  if (st) return st;
  nt_tensor_free(ctx, &un->grad);
  nt_tensor_free(ctx, &un->compute);
  nt_tensor_free(ctx, &un->master);
  un->master = nt_tensor_view(NULL, NT_F32, f->dev, 1, &u->lay.numel);
  bind_compute(f, j);
  bind_grad(f, j);
  return NT_OK;
}

/* stable_buffers: the model's whole buffers stay; the runtime adds the kept shards. */
static nt_status adopt_stable(nt_ctx *ctx, nt_fsdp *f, int j) {
  nt_unit *un = &f->p->units[j];
  fsdp_unit *u = &f->u[j];
  if (u->lay.padded != u->lay.numel)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "fsdp: stable_buffers needs unit sizes that are multiples of the world size: "
                    "unit '%s' has %lld elements at world %d", un->name, (long long)u->lay.numel,
                    f->W);
  size_t cs = nt_dtype_size(f->p->compute_dtype);
  u->full = nt_tensor_view(un->compute.data, f->p->compute_dtype, f->dev, 1, &u->lay.numel);
  u->gfull = nt_tensor_view(un->grad.data, NT_F32, f->dev, 1, &u->lay.numel);
  count(&f->live_param, &f->peak_param, (double)u->lay.numel * (double)cs);
  count(&f->live_grad, &f->peak_grad, (double)u->lay.numel * 4.0);
  nt_tensor mine = nt_flat_view(&u->full, u->lay.lo, u->lay.shard);
  nt_status st = NT_OK;
  if (f->opt.strategy == NT_SHARD_GRAD_OP) {
    u->shard = mine;
  } else {
    st = alloc_flat(ctx, &u->shard, f->p->compute_dtype, u->lay.shard, &f->live_param,
                    &f->peak_param);
    if (!st) st = nt_tensor_copy(ctx, &u->shard, &mine);
  }
  if (!st && f->p->compute_dtype != NT_F32) {
    double none = 0, none_peak = 0;
    nt_tensor m = nt_flat_view(&un->master, u->lay.lo, u->lay.shard);
    st = alloc_flat(ctx, &u->master0, NT_F32, u->lay.shard, &none, &none_peak);
    if (!st) st = nt_tensor_copy(ctx, &u->master0, &m);
  }
  if (!st) st = alloc_flat(ctx, &u->gshard, NT_F32, u->lay.shard, &f->live_grad, &f->peak_grad);
  if (!st) st = nt_tensor_zero(ctx, &u->gshard);
  if (!st) st = nt_ctx_synchronize(ctx);
  if (!st && un->compute.owner) {   /* a 16-bit copy: the fp32 master lives in the shards now */
    nt_tensor_free(ctx, &un->master);
    un->master = nt_tensor_view(NULL, NT_F32, f->dev, 1, &u->lay.numel);
  }
  return st;
}

nt_status nt_fsdp_create(nt_ctx *ctx, nt_comm *comm, nt_params *p, const nt_fsdp_options *opt,
                         nt_fsdp **out) {
  *out = NULL;
  if (!p->allocated) return NT_ERROR(ctx, NT_ERR_STATE, "fsdp: the parameters are not allocated");
  if (opt->param_dtype != p->compute_dtype)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fsdp: param_dtype %s but the model computes in %s",
                    nt_dtype_name(opt->param_dtype), nt_dtype_name(p->compute_dtype));
  if (opt->reduce_dtype != NT_F32 && opt->reduce_dtype != NT_F16 && opt->reduce_dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fsdp: reduce_dtype must be f32, f16 or bf16, not %s",
                    nt_dtype_name(opt->reduce_dtype));
  nt_fsdp *f = calloc(1, sizeof *f);
  if (f) f->u = calloc((size_t)(p->n_units ? p->n_units : 1), sizeof *f->u);
  if (f && f->u) f->fwd = calloc((size_t)(p->n_units ? p->n_units : 1), sizeof(int));
  if (f && f->fwd) f->bwd = calloc((size_t)(p->n_units ? p->n_units : 1), sizeof(int));
  if (f && f->bwd) f->deferred = calloc((size_t)(2 * p->n_units + 2), sizeof *f->deferred);
  if (!f || !f->deferred) {
    nt_fsdp_free(ctx, f);
    return NT_ERROR(ctx, NT_ERR_OOM, "fsdp: out of host memory");
  }
  f->comm = comm;
  f->p = p;
  f->opt = *opt;
  f->W = nt_comm_world(comm);
  f->rank = nt_comm_rank(comm);
  f->n = p->n_units;
  f->dev = nt_ctx_device(ctx);
  f->sync = true;
  f->t0 = nt_dist_now();
  size_t cs = nt_dtype_size(p->compute_dtype);
  nt_status st = NT_OK;
  for (int j = 0; j < f->n && !st; j++) {
    fsdp_unit *u = &f->u[j];
    u->lay = sharded(f) ? nt_shard_layout_of(p->units[j].numel, f->rank, f->W)
                        : nt_shard_layout_of(p->units[j].numel, 0, 1);
    int64_t elems = sharded(f) ? u->lay.shard : u->lay.numel;
    f->opt_elems += (double)elems;
    if (p->compute_dtype != NT_F32) f->master_elems += (double)elems;
    if (sharded(f)) {
      st = opt->stable_buffers ? adopt_stable(ctx, f, j) : adopt_unit(ctx, f, j);
    } else {
      count(&f->live_param, &f->peak_param, (double)u->lay.numel * (double)cs);
      count(&f->live_grad, &f->peak_grad, (double)u->lay.numel * 4.0);
    }
  }
  if (st) {
    nt_fsdp_free(ctx, f);
    return st;
  }
  *out = f;
  return NT_OK;
}

void nt_fsdp_free(nt_ctx *ctx, nt_fsdp *f) {
  if (!f) return;
  for (int j = 0; f->u && j < f->n; j++) {
    fsdp_unit *u = &f->u[j];
    nt_tensor *own[] = {&u->full, &u->master0, &u->gfull, &u->gshard, &u->red, &u->red_shard};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) nt_tensor_free(ctx, own[k]);
    if (f->opt.strategy == NT_SHARD_FULL) nt_tensor_free(ctx, &u->shard);
    if (sharded(f) && !f->opt.stable_buffers) {
      f->p->units[j].compute.data = f->p->units[j].grad.data = NULL;
      f->p->units[j].master.data = NULL;
    }
  }
  for (int i = 0; i < f->n_deferred; i++) nt_tensor_free(ctx, &f->deferred[i].t);
  free(f->deferred);
  free(f->u);
  free(f->fwd);
  free(f->bwd);
  free(f);
}

/* ---- gathering (FULL_SHARD) ---- */

static nt_status gather(nt_ctx *ctx, nt_fsdp *f, int j) {
  fsdp_unit *u = &f->u[j];
  if (u->gathered) return NT_OK;
  nt_status st = NT_OK;
  if (!f->opt.stable_buffers)
    st = alloc_flat(ctx, &u->full, f->p->compute_dtype, u->lay.padded, &f->live_param,
                    &f->peak_param);
  if (!st) st = nt_comm_all_gather(f->comm, ctx, &u->shard, &u->full);
  if (st) return st;
  u->gather_seq = nt_comm_seq(f->comm);
  trace(f, "gather", j, (double)nt_tensor_nbytes(&u->full), true);
  u->gathered = true;
  u->used = false;
  if (++f->n_gathered > f->peak_gathered) f->peak_gathered = f->n_gathered;
  if (!f->opt.stable_buffers) bind_compute(f, j);
  return NT_OK;
}

static void release(nt_ctx *ctx, nt_fsdp *f, int j) {
  fsdp_unit *u = &f->u[j];
  if (!u->gathered) return;
  u->gathered = u->used = false;
  f->n_gathered--;
  if (f->opt.stable_buffers) return;   /* the whole buffer stays (its contents go stale) */
  trace(f, "free-params", j, (double)nt_tensor_nbytes(&u->full), false);
  free_flat(ctx, &u->full, &f->live_param);
  bind_compute(f, j);
}

/* A gather issued ahead of need, unless limit_all_gathers already holds two units. */
static nt_status prefetch(nt_ctx *ctx, nt_fsdp *f, int j) {
  if (j < 0 || f->u[j].gathered) return NT_OK;
  if (f->opt.limit_all_gathers && f->n_gathered >= 2) return NT_OK;
  return gather(ctx, f, j);
}

static void record(int *order, int *n, int j) {
  for (int i = 0; i < *n; i++)
    if (order[i] == j) return;
  order[(*n)++] = j;
}

/* The unit after j in a recorded order; before the first step ends: j + dir. */
static int next_of(const nt_fsdp *f, const int *order, int n, int j, int dir) {
  if (!f->recorded) {
    int k = j + dir;
    return k >= 0 && k < f->n ? k : -1;
  }
  for (int i = 0; i + 1 < n; i++)
    if (order[i] == j) return order[i + 1];
  return -1;
}

static nt_status use_gathered(nt_ctx *ctx, nt_fsdp *f, int j) {
  nt_status st = gather(ctx, f, j);
  trace(f, "compute waits", j, 0, false);
  if (!st) st = nt_comm_wait_seq(f->comm, ctx, f->u[j].gather_seq);
  f->u[j].used = true;
  return st;
}

nt_status nt_fsdp_before_forward(nt_ctx *ctx, void *arg, int j) {
  nt_fsdp *f = arg;
  trace(f, "before_forward", j, 0, false);
  if (f->opt.strategy != NT_SHARD_FULL) return NT_OK;
  if (!f->recorded) record(f->fwd, &f->n_fwd, j);
  if (f->opt.reshard_after_forward)
    for (int k = 0; k < f->n; k++)
      if (k != j && f->u[k].gathered && f->u[k].used) release(ctx, f, k);
  nt_status st = use_gathered(ctx, f, j);
  if (!st && f->opt.forward_prefetch) st = prefetch(ctx, f, next_of(f, f->fwd, f->n_fwd, j, 1));
  return st;
}

nt_status nt_fsdp_before_backward(nt_ctx *ctx, void *arg, int j) {
  nt_fsdp *f = arg;
  trace(f, "before_backward", j, 0, false);
  if (!sharded(f)) return NT_OK;
  fsdp_unit *u = &f->u[j];
  nt_status st = NT_OK;
  if (!u->gfull.data) {
    st = alloc_flat(ctx, &u->gfull, NT_F32, u->lay.padded, &f->live_grad, &f->peak_grad);
    if (!st) st = nt_tensor_zero(ctx, &u->gfull);
    if (!st) trace(f, "alloc-grad", j, (double)nt_tensor_nbytes(&u->gfull), false);
    bind_grad(f, j);
  }
  if (st || f->opt.strategy != NT_SHARD_FULL) return st;
  if (!f->recorded) record(f->bwd, &f->n_bwd, j);
  st = use_gathered(ctx, f, j);
  if (!st && f->opt.backward_prefetch == NT_BACKWARD_PREFETCH_PRE)
    st = prefetch(ctx, f, next_of(f, f->bwd, f->n_bwd, j, -1));
  return st;
}

/* ---- gradient reduction ---- */

static nt_status reduce_unit(nt_ctx *ctx, nt_fsdp *f, int j) {
  fsdp_unit *u = &f->u[j];
  nt_unit *un = &f->p->units[j];
  nt_dtype rd = f->opt.reduce_dtype;
  nt_status st = NT_OK;
  if (!sharded(f)) {
    trace(f, "all_reduce-grad", j, (double)nt_tensor_nbytes(&un->grad), true);
    if (rd == NT_F32) return nt_comm_all_reduce(f->comm, ctx, &un->grad, NT_REDUCE_SUM);
    st = alloc_flat(ctx, &u->red, rd, u->lay.numel, &f->live_grad, &f->peak_grad);
    if (!st) st = nt_convert(ctx, &u->red, &un->grad);
    if (!st) st = nt_comm_all_reduce(f->comm, ctx, &u->red, NT_REDUCE_SUM);
    return st;   /* widened back into the gradient at the join */
  }
  if (!u->gfull.data)
    return NT_ERROR(ctx, NT_ERR_STATE, "fsdp: grads_ready(%d) without before_backward(%d)", j, j);
  if (rd == NT_F32) {
    st = nt_comm_reduce_scatter(f->comm, ctx, &u->gfull, &u->gshard);
  } else {
    st = alloc_flat(ctx, &u->red, rd, u->lay.padded, &f->live_grad, &f->peak_grad);
    if (!st) st = alloc_flat(ctx, &u->red_shard, rd, u->lay.shard, &f->live_grad, &f->peak_grad);
    if (!st) st = nt_convert(ctx, &u->red, &u->gfull);
    if (!st) st = nt_comm_reduce_scatter(f->comm, ctx, &u->red, &u->red_shard);
    free_after_collective(ctx, f, &u->red, &f->live_grad);
  }
  trace(f, "reduce_scatter-grad", j, (double)nt_tensor_nbytes(&u->gfull), true);
  if (f->opt.stable_buffers) return st;
  free_after_collective(ctx, f, &u->gfull, &f->live_grad);
  trace(f, "free-grad", j, (double)u->lay.padded * 4, false);
  bind_grad(f, j);
  return st;
}

/* The compute stream waits for the micro-step's reductions; 16-bit results are widened. */
static nt_status join(nt_ctx *ctx, nt_fsdp *f) {
  nt_status st = NT_OK;
  if (f->sync && f->n_reported > 0) {
    trace(f, "join (compute waits)", -1, 0, false);
    st = nt_comm_wait_seq(f->comm, ctx, nt_comm_seq(f->comm));
    if (!st) st = free_deferred(ctx, f);
    for (int j = 0; j < f->n && !st; j++) {
      fsdp_unit *u = &f->u[j];
      if (u->red.data && !sharded(f)) {
        st = nt_convert(ctx, &f->p->units[j].grad, &u->red);
        free_flat(ctx, &u->red, &f->live_grad);
      }
      if (!st && u->red_shard.data) {
        st = nt_convert(ctx, &u->gshard, &u->red_shard);
        free_flat(ctx, &u->red_shard, &f->live_grad);
      }
    }
  }
  for (int j = 0; j < f->n; j++) f->u[j].reported = false;
  f->n_reported = 0;
  return st;
}

nt_status nt_fsdp_grads_ready(nt_ctx *ctx, void *arg, int j) {
  nt_fsdp *f = arg;
  fsdp_unit *u = &f->u[j];
  nt_status st = NT_OK;
  trace(f, "grads_ready", j, 0, false);
  if (!u->reported) {
    u->reported = true;
    f->n_reported++;
    /* The previous unit's reduction ran beside this unit's backward; its buffers go now. */
    st = free_deferred(ctx, f);
    if (!st && f->sync) st = reduce_unit(ctx, f, j);
  }
  if (!st && f->opt.strategy == NT_SHARD_FULL) {
    release(ctx, f, j);
    if (f->opt.backward_prefetch == NT_BACKWARD_PREFETCH_POST)
      st = prefetch(ctx, f, next_of(f, f->bwd, f->n_bwd, j, -1));
  }
  if (!st && f->n_reported == f->n) st = join(ctx, f);
  return st;
}

nt_status nt_fsdp_finish_backward(nt_ctx *ctx, nt_fsdp *f) { return join(ctx, f); }

nt_status nt_fsdp_zero_grad(nt_ctx *ctx, nt_fsdp *f) {
  for (int j = 0; j < f->n; j++) {
    nt_tensor *g = sharded(f) ? &f->u[j].gfull : &f->p->units[j].grad;
    if (g->data) {
      nt_status st = nt_tensor_zero(ctx, g);
      if (st) return st;
    }
  }
  return NT_OK;
}

/* ---- step-level hooks ---- */

nt_status nt_fsdp_global_reduce(nt_ctx *ctx, void *arg, float *found_inf, float *sumsq) {
  nt_fsdp *f = arg;
  nt_status st = join(ctx, f);
  nt_device dev = nt_ctx_device(ctx);
  if (!st && found_inf) {
    nt_tensor t = nt_tensor_view(found_inf, NT_F32, dev, 0, NULL);
    st = nt_comm_all_reduce(f->comm, ctx, &t, NT_REDUCE_MAX);
  }
  /* NO_SHARD: every rank holds the same whole gradients, so its sum is already global. */
  if (!st && sumsq && sharded(f)) {
    nt_tensor t = nt_tensor_view(sumsq, NT_F32, dev, 0, NULL);
    st = nt_comm_all_reduce(f->comm, ctx, &t, NT_REDUCE_SUM);
  }
  if (!st) st = nt_comm_wait_seq(f->comm, ctx, nt_comm_seq(f->comm));
  trace(f, "global-reduce", -1, 8, true);
  return st;
}

nt_status nt_fsdp_params_updated(nt_ctx *ctx, void *arg) {
  nt_fsdp *f = arg;
  nt_status st = NT_OK;
  f->recorded = f->recorded || f->n_fwd > 0;
  if (f->opt.strategy == NT_SHARD_GRAD_OP) {
    for (int j = 0; j < f->n && !st; j++) {
      fsdp_unit *u = &f->u[j];
      st = nt_comm_all_gather(f->comm, ctx, &u->shard, &u->full);
      u->gather_seq = nt_comm_seq(f->comm);
      trace(f, "all_gather-updated", j, (double)nt_tensor_nbytes(&u->full), true);
    }
    /* The compute stream waits here, in the update stage, rather than in the next forward's
     * before_forward: a forward captured as a CUDA graph cannot wait for an event recorded
     * outside the capture. */
    if (!st) st = nt_comm_wait_seq(f->comm, ctx, nt_comm_seq(f->comm));
  } else if (f->opt.strategy == NT_SHARD_FULL) {
    for (int j = 0; j < f->n; j++) release(ctx, f, j);   /* stale after the update */
  }
  return st;
}

/* ---- views for the optimizer, the norm and checkpoints ---- */

nt_status nt_fsdp_param_units(nt_fsdp *f, nt_param_unit *out) {
  bool half = f->p->compute_dtype != NT_F32;
  for (int j = 0; j < f->n; j++) {
    nt_unit *un = &f->p->units[j];
    fsdp_unit *u = &f->u[j];
    if (sharded(f)) {
      out[j].params = u->shard;
      out[j].grads = u->gshard;
      out[j].master_init = half ? &u->master0 : NULL;
    } else {
      out[j].params = un->compute;
      out[j].grads = un->grad;
      out[j].master_init = half ? &un->master : NULL;
    }
  }
  return NT_OK;
}

void nt_fsdp_drop_master_init(nt_ctx *ctx, nt_fsdp *f) {
  for (int j = 0; j < f->n; j++) nt_tensor_free(ctx, &f->u[j].master0);
}

int nt_fsdp_map_ranges(const nt_fsdp *f, const nt_param_range *in, int n, nt_param_range *out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    int64_t off, len;
    if (!nt_shard_intersect(&f->u[in[i].unit].lay, in[i].offset, in[i].length, &off, &len))
      continue;
    out[k].unit = in[i].unit;
    out[k].offset = off;
    out[k].length = len;
    k++;
  }
  return k;
}

nt_status nt_fsdp_owned_grads(nt_fsdp *f, nt_tensor *out, int *n) {
  *n = 0;
  for (int j = 0; j < f->n; j++) {
    fsdp_unit *u = &f->u[j];
    int64_t real = nt_shard_real(&u->lay);
    if (real == 0) continue;
    out[(*n)++] = sharded(f) ? nt_flat_view(&u->gshard, 0, real) : f->p->units[j].grad;
  }
  return NT_OK;
}

nt_status nt_fsdp_gather_unit(nt_ctx *ctx, nt_fsdp *f, int j, const nt_tensor *src,
                              nt_tensor *dst) {
  fsdp_unit *u = &f->u[j];
  if (nt_tensor_numel(dst) != u->lay.numel || dst->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fsdp: gather of unit %d needs an f32 [%lld] destination",
                    j, (long long)u->lay.numel);
  if (!src && f->p->compute_dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fsdp: a 16-bit compute copy is not the master; give the "
                    "optimizer's master shard");
  nt_tensor whole = sharded(f) ? u->shard : f->p->units[j].compute;
  if (!src) src = &whole;
  if (!sharded(f)) {
    nt_tensor head = nt_flat_view(src, 0, u->lay.numel);
    return nt_tensor_copy(ctx, dst, &head);
  }
  nt_tensor tmp = {0};
  double live = 0, peak = 0;
  nt_status st = alloc_flat(ctx, &tmp, NT_F32, u->lay.padded, &live, &peak);
  if (!st) st = nt_comm_all_gather(f->comm, ctx, src, &tmp);
  if (!st) st = nt_comm_wait_seq(f->comm, ctx, nt_comm_seq(f->comm));
  nt_tensor head = nt_flat_view(&tmp, 0, u->lay.numel);
  if (!st) st = nt_tensor_copy(ctx, dst, &head);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &tmp);
  return st;
}

nt_status nt_fsdp_scatter_unit(nt_ctx *ctx, nt_fsdp *f, int j, const nt_tensor *src,
                               nt_tensor *dst) {
  fsdp_unit *u = &f->u[j];
  int64_t want = sharded(f) ? u->lay.shard : u->lay.numel, real = nt_shard_real(&u->lay);
  if (nt_tensor_numel(src) != u->lay.numel || src->dtype != NT_F32 ||
      nt_tensor_numel(dst) != want || dst->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fsdp: scatter of unit %d: f32 [%lld] into f32 [%lld]", j,
                    (long long)u->lay.numel, (long long)want);
  nt_status st = nt_tensor_zero(ctx, dst);
  nt_tensor from = nt_flat_view(src, u->lay.lo, real), to = nt_flat_view(dst, 0, real);
  if (!st && real > 0) st = nt_tensor_copy(ctx, &to, &from);
  return st;
}

nt_status nt_fsdp_load_unit(nt_ctx *ctx, nt_fsdp *f, int j, const nt_tensor *src) {
  fsdp_unit *u = &f->u[j];
  bool full_shard = f->opt.strategy == NT_SHARD_FULL;
  /* FULL_SHARD keeps the owned shard; the others keep the whole unit (SHARD_GRAD_OP padded). */
  nt_tensor kept = full_shard ? u->shard : sharded(f) ? u->full : f->p->units[j].compute;
  nt_tensor tmp = {0};
  double live = 0, peak = 0;
  if (nt_tensor_numel(src) != u->lay.numel || src->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fsdp: load of unit %d needs f32 [%lld]", j,
                    (long long)u->lay.numel);
  nt_status st = alloc_flat(ctx, &tmp, NT_F32, nt_tensor_numel(&kept), &live, &peak);
  if (!st && full_shard) {
    st = nt_fsdp_scatter_unit(ctx, f, j, src, &tmp);
  } else if (!st) {
    nt_tensor head = nt_flat_view(&tmp, 0, u->lay.numel);
    st = nt_tensor_zero(ctx, &tmp);
    if (!st) st = nt_tensor_copy(ctx, &head, src);
  }
  if (!st) st = copy_or_convert(ctx, &kept, &tmp);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &tmp);
  if (!st && full_shard) release(ctx, f, j);   /* a gathered copy would be stale */
  return st;
}

nt_status nt_fsdp_load_owned(nt_ctx *ctx, nt_fsdp *f, int j, const nt_tensor *owned) {
  fsdp_unit *u = &f->u[j];
  int64_t want = sharded(f) ? u->lay.shard : u->lay.numel;
  if (nt_tensor_numel(owned) != want || owned->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fsdp: load of unit %d's owned values needs f32 [%lld]", j,
                    (long long)want);
  nt_tensor kept = sharded(f) ? u->shard : f->p->units[j].compute;
  nt_status st = kept.data == owned->data ? NT_OK : copy_or_convert(ctx, &kept, owned);
  if (!st && f->opt.strategy == NT_SHARD_GRAD_OP) {   /* the whole compute copy is kept */
    st = nt_comm_all_gather(f->comm, ctx, &u->shard, &u->full);
    if (!st) st = nt_comm_wait_seq(f->comm, ctx, nt_comm_seq(f->comm));
  }
  if (!st) st = nt_ctx_synchronize(ctx);
  if (!st && f->opt.strategy == NT_SHARD_FULL) release(ctx, f, j);
  return st;
}

void nt_fsdp_memory_of(const nt_fsdp *f, nt_fsdp_memory *m) {
  m->parameters = f->peak_param;
  m->gradients = f->peak_grad;
  m->master = 4.0 * f->master_elems;
  m->optimizer = 8.0 * f->opt_elems;
  m->peak_gathered = f->peak_gathered;
}
