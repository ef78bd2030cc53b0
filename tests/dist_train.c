/* Multi-rank test of dist/ (run under mpirun; tests/dist.cmake lists the cases).
 *
 * A three-unit MLP (tanh, MSE), written out by hand on the host over nt_params units, trains
 * for a number of steps with the FSDP runtime under a strategy, each rank taking its slice of a
 * global batch; every rank also trains the same model in one process on the whole global batch
 * (world 1, LOCAL backend) and compares the global losses and the final weights.
 *   --mode train        (default) the comparison; --check-memory also checks the per-rank
 *                       bytes against memest's ZeRO formulas
 *   --mode collectives  every collective and dtype against values computed here
 * Failure injection: --inf-rank/--inf-step (an inf gradient on one rank: every rank must skip),
 * --kill-rank/--kill-step (SIGKILL), --stall-rank/--stall-step (sleeps past the timeout),
 * --config-skew-rank (a different configuration string), --op-skew-rank (a MAX where the
 * others SUM, caught by the collective fingerprint). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dist/comm.h"
#include "dist/fsdp.h"
#include "train/fsdp_step.h"
#include "train/memest.h"
#include "ops/cross_entropy.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "testutil.h"

enum { D = 32, H = 96, C = 16, NU = 3 };   /* widths: multiples of 16 (GEMM-friendly) */

typedef struct {
  const char *mode, *strategy, *optim, *reduce, *device, *backend, *param, *save, *load;
  int steps, batch, accum, global_batch;
  int inf_rank, inf_step, kill_rank, kill_step, stall_rank, stall_step, config_skew_rank,
      op_skew_rank;
  double timeout, clip, rtol;
  bool check_memory, fingerprint, fwd_prefetch, no_reshard, no_limit, trace, stable, use_step;
  const char *bwd_prefetch;
} opts;

typedef struct {
  nt_params p;
  nt_fsdp *f;
  nt_comm *comm;
  nt_sgd *sgd;
  nt_adamw *adam;
  int rows;
  /* activations on the run's device: rows x width */
  nt_tensor x, pre1, h1, pre2, h2, logits, dlogits, dh2, dh1, targets, losses, loss, dscale;
  nt_tensor factor, found_inf, sumsq, gloss;   /* step scalars */
  nt_unit_hooks uh;
  nt_step_hooks sh;
  nt_step *step;           /* --use-step: train/step.c runs the step */
  nt_optimizer opt;        /* its optimizer (train/fsdp_step.h) */
  double step_loss;
  size_t act_bytes;
} run;

static int W, R;        /* world size, rank */
static nt_dtype PDT;    /* parameter (compute) and activation dtype */

/* ---- the model: logits = L3(gelu(L2(gelu(L1 x)))), cross-entropy over C classes ---- */

static nt_status build(nt_ctx *ctx, nt_params *p) {
  static const char *names[NU] = {"l1", "l2", "head"};
  static const int io[NU][2] = {{D, H}, {H, H}, {H, C}};
  memset(p, 0, sizeof *p);
  nt_status st = NT_OK;
  for (int u = 0; u < NU && !st; u++) {
    int idx, unit;
    int64_t ws[2] = {io[u][1], io[u][0]}, bs[1] = {io[u][1]};
    st = nt_params_add_unit(ctx, p, names[u], &unit);
    if (!st) st = nt_params_add(ctx, p, unit, "weight", 2, ws, true, NT_INIT_UNIFORM,
                                1.0f / sqrtf((float)io[u][0]), &idx);
    if (!st) st = nt_params_add(ctx, p, unit, "bias", 1, bs, false, NT_INIT_UNIFORM, 0.1f, &idx);
  }
  if (!st) st = nt_params_alloc(ctx, p, PDT);
  if (!st) st = nt_params_init(ctx, p, 1234);
  return st;
}

static nt_status alloc_acts(nt_ctx *ctx, run *m, int accum) {
  int64_t r = m->rows;
  struct { nt_tensor *t; nt_dtype dt; int64_t w; } a[] = {
      {&m->x, PDT, D},       {&m->pre1, PDT, H}, {&m->h1, PDT, H},
      {&m->pre2, PDT, H},    {&m->h2, PDT, H},   {&m->logits, PDT, C},
      {&m->dlogits, PDT, C}, {&m->dh2, PDT, H},  {&m->dh1, PDT, H},
      {&m->targets, NT_I32, 0}, {&m->losses, NT_F32, 0}};
  nt_status st = NT_OK;
  for (size_t i = 0; i < sizeof a / sizeof a[0] && !st; i++) {
    int64_t shape[2] = {r, a[i].w};
    st = nt_tensor_alloc(ctx, a[i].t, a[i].dt, a[i].w ? 2 : 1, shape);
    if (!st) m->act_bytes += nt_tensor_nbytes(a[i].t);
  }
  nt_tensor *scalars[] = {&m->loss, &m->dscale, &m->factor, &m->found_inf, &m->sumsq, &m->gloss};
  for (size_t i = 0; i < sizeof scalars / sizeof scalars[0] && !st; i++)
    st = nt_tensor_alloc(ctx, scalars[i], NT_F32, 0, NULL);
  float inv = 1.0f / (float)accum;
  nt_tensor h = nt_tensor_view(&inv, NT_F32, nt_cpu(), 0, NULL);
  if (!st) st = nt_tensor_copy(ctx, &m->dscale, &h);
  return st;
}

static nt_tensor view(run *m, int u, int i, nt_param_view which) {
  return nt_params_view(&m->p, u, i, which);
}

/* One micro-step on the rows in m->x / m->targets: returns the mean loss / accum and
 * accumulates its gradient. Hooks are those of the FSDP runtime. */
static nt_status micro_step(nt_ctx *ctx, run *m, const nt_unit_hooks *h, int accum, bool inject_inf,
                            double *loss) {
  nt_status st;
  nt_tensor *ins[NU] = {&m->x, &m->h1, &m->h2}, *outs[NU] = {&m->h1, &m->h2, &m->logits};
  nt_tensor *pres[NU] = {&m->pre1, &m->pre2, NULL};
  for (int u = 0; u < NU; u++) {
    if ((st = nt_unit_before_forward(ctx, h, u))) return st;
    nt_tensor w = view(m, u, 0, NT_VIEW_COMPUTE), b = view(m, u, 1, NT_VIEW_COMPUTE);
    st = nt_linear_forward(ctx, ins[u], &w, &b, outs[u], u < NU - 1 ? NT_ACT_GELU : NT_ACT_NONE,
                           pres[u]);
    if (st) return st;
  }
  st = nt_cross_entropy_fused(ctx, &m->logits, &m->targets, m->dscale.data, m->rows, &m->losses,
                              &m->dlogits);
  if (!st) st = nt_mean(ctx, &m->losses, &m->loss);
  float l = 0;
  nt_tensor hl = nt_tensor_view(&l, NT_F32, nt_cpu(), 0, NULL);
  if (!st) st = nt_tensor_copy(ctx, &hl, &m->loss);
  *loss = (double)l / accum;
  nt_tensor *douts[NU] = {&m->dh1, &m->dh2, &m->dlogits};
  for (int u = NU - 1; u >= 0 && !st; u--) {
    if ((st = nt_unit_before_backward(ctx, h, u))) return st;
    nt_tensor w = view(m, u, 0, NT_VIEW_COMPUTE), gw = view(m, u, 0, NT_VIEW_GRAD),
              gb = view(m, u, 1, NT_VIEW_GRAD);
    nt_linear_bwd_opts bo = {true, u > 0 ? pres[u - 1] : NULL};
    st = nt_linear_backward_ex(ctx, douts[u], ins[u], &w, u > 0 ? douts[u - 1] : NULL, &gw, &gb,
                               &bo);
    if (!st && inject_inf && u == 1) {
      float inf = INFINITY;
      int64_t one = 1;
      nt_tensor src = nt_tensor_view(&inf, NT_F32, nt_cpu(), 1, &one);
      nt_tensor dst = nt_flat_view(&gw, 7, 1);
      st = nt_tensor_copy(ctx, &dst, &src);
    }
    if (!st) st = nt_unit_grads_ready(ctx, h, u);
  }
  return st;
}

/* The optimizer's fp32 master weights of unit u (this rank's shard when sharded). */
static nt_tensor master_of(run *m, int u) {
  nt_tensor master, other, other2;
  if (m->sgd) nt_sgd_state_views(m->sgd, u, &master, &other);
  else nt_adamw_state_views(m->adam, u, &master, &other, &other2);
  return master;
}

static nt_status make_optimizer(nt_ctx *ctx, run *m, const opts *o) {
  nt_param_unit units[NU];
  nt_param_range dec[NU], nodec[NU], mdec[NU], mnodec[NU];
  for (int u = 0; u < NU; u++) {
    dec[u] = (nt_param_range){u, 0, m->p.units[u].n_decay};
    nodec[u] = (nt_param_range){u, m->p.units[u].n_decay,
                                m->p.units[u].numel - m->p.units[u].n_decay};
  }
  int nd = nt_fsdp_map_ranges(m->f, dec, NU, mdec), nn = nt_fsdp_map_ranges(m->f, nodec, NU, mnodec);
  nt_param_group g[2] = {{1.0f, 0.05, nd ? mdec : NULL, nd}, {1.0f, 0.0, nn ? mnodec : NULL, nn}};
  nt_status st = nt_fsdp_param_units(m->f, units);
  if (st) return st;
  if (!strcmp(o->optim, "sgd")) {
    nt_sgd_options so = nt_sgd_defaults(0.05);
    so.momentum = 0.9;
    st = nt_sgd_create(ctx, &so, units, NU, g, 2, &m->sgd);
  } else {
    nt_adamw_options ao = nt_adamw_defaults();
    ao.lr = 3e-3;
    st = nt_adamw_create(ctx, &ao, units, NU, g, 2, &m->adam);
  }
  /* The optimizer holds the fp32 master weights now: drop the copies it was built from. */
  nt_fsdp_drop_master_init(ctx, m->f);
  for (int u = 0; u < NU && !st && PDT != NT_F32 && m->p.units[u].master.owner; u++) {
    nt_tensor master = master_of(m, u);
    st = nt_params_adopt_master(ctx, &m->p, u, &master);
  }
  return st;
}

/* --use-step: the micro-step as train/step.c's body. No loss scaler in these runs; the 1/N of
 * the mean is folded into the loss gradient's seed instead (m->dscale). */
static nt_status step_body(nt_ctx *ctx, void *arg, const float *loss_scale,
                           const nt_unit_hooks *h) {
  (void)loss_scale;
  return micro_step(ctx, arg, h, 1, false, &((run *)arg)->step_loss);
}

static nt_status make_step(nt_ctx *ctx, run *m, const opts *o) {
  nt_optimizer_options oo = nt_optimizer_defaults();
  oo.adamw.lr = 3e-3;
  oo.adamw.weight_decay = 0.05;
  nt_grad_range ranges[NU];
  int n = 0;
  nt_status st = nt_fsdp_optimizer(ctx, m->f, &oo, &m->opt);
  if (!st) st = nt_fsdp_grad_ranges(ctx, m->f, ranges, &n);
  float inv = 1.0f / (float)W;
  nt_tensor h = nt_tensor_view(&inv, NT_F32, nt_cpu(), 0, NULL);
  if (!st) st = nt_tensor_copy(ctx, &m->dscale, &h);
  nt_step_options so = {.params = &m->p, .body = step_body, .body_arg = m,
                        .optimizer = m->opt, .max_norm = (float)o->clip, .ranges = ranges,
                        .n_ranges = n, .hooks = &m->sh, .cuda_graph = 0};
  if (!st) st = nt_step_create(ctx, &so, &m->step);
  m->adam = m->opt.adamw;   /* for the state views */
  return st;
}

/* Deterministic global batch of step s: rows g0 .. g0 + rows of it, copied to the device. */
static nt_status load_rows(nt_ctx *ctx, run *m, int s, int g0) {
  int rows = m->rows;
  float *x = malloc(sizeof(float) * (size_t)rows * D);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)rows);
  for (int r = 0; r < rows; r++) {
    nt_test_rng rng = {(uint64_t)s * 1000003u + (uint64_t)(g0 + r) * 7919u + 17u};
    for (int i = 0; i < D; i++) x[r * D + i] = (float)nt_test_uniform(&rng, -1, 1);
    t[r] = (int32_t)(nt_test_uniform(&rng, 0, C)) % C;
  }
  int64_t xs[2] = {rows, D}, ts[1] = {rows};
  nt_tensor hx = nt_tensor_view(x, NT_F32, nt_cpu(), 2, xs);
  nt_tensor ht = nt_tensor_view(t, NT_I32, nt_cpu(), 1, ts);
  nt_tensor x32;
  nt_status st = nt_tensor_alloc(ctx, &x32, NT_F32, 2, xs);
  if (!st) st = nt_tensor_copy(ctx, &x32, &hx);
  if (!st) st = nt_convert(ctx, &m->x, &x32);
  nt_tensor_free(ctx, &x32);
  if (!st) st = nt_tensor_copy(ctx, &m->targets, &ht);
  if (!st) st = nt_ctx_synchronize(ctx);
  free(x);
  free(t);
  return st;
}

/* The global loss: the ranks' means averaged (equal batches); the step's collective boundary. */
static nt_status reduce_loss(nt_ctx *ctx, run *m, const opts *o, int s, int world, int rank,
                             double local, double *gloss) {
  float lsum = (float)local;
  nt_tensor tl = nt_tensor_view(&lsum, NT_F32, nt_cpu(), 0, NULL);
  bool skew = rank == o->op_skew_rank && s == 3 && world > 1;
  nt_status st = nt_tensor_copy(ctx, &m->gloss, &tl);
  if (!st) st = nt_comm_all_reduce(m->comm, ctx, &m->gloss, skew ? NT_REDUCE_MAX : NT_REDUCE_SUM);
  if (!st) st = nt_comm_wait_seq(m->comm, ctx, nt_comm_seq(m->comm));
  if (!st) st = nt_tensor_copy(ctx, &tl, &m->gloss);
  if (!st) st = nt_comm_check_fingerprint(m->comm, ctx);
  *gloss = (double)lsum / world;
  return st;
}

/* One optimizer step of run m (world = the run's comm). Returns the global mean loss. */
static nt_status train_step(nt_ctx *ctx, run *m, const opts *o, int s, int world, int rank,
                            int accum, bool inject, double *gloss) {
  nt_fsdp *f = m->f;
  if (m->step) {
    nt_status st = load_rows(ctx, m, s, rank * m->rows);
    if (!st) st = nt_step_run(ctx, m->step, 3e-3);
    if (!st) st = reduce_loss(ctx, m, o, s, world, rank, m->step_loss, gloss);
    return st;
  }
  nt_status st = nt_fsdp_zero_grad(ctx, f);
  double local = 0;
  for (int k = 0; k < accum && !st; k++) {
    nt_fsdp_set_sync(f, k == accum - 1);
    double l = 0;
    st = load_rows(ctx, m, s, (k * world + rank) * m->rows);
    if (!st) st = micro_step(ctx, m, &m->uh, accum, inject && k == 0, &l);
    local += l;
  }
  if (!st) st = nt_fsdp_finish_backward(ctx, f);
  nt_tensor owned[NU], *ptrs[NU];
  int n = 0;
  if (!st) st = nt_fsdp_owned_grads(f, owned, &n);
  for (int i = 0; i < n; i++) ptrs[i] = &owned[i];
  float inv_w = 1.0f / (float)nt_fsdp_grad_divisor(f);   /* the mean over the ranks */
  nt_tensor inv_w_host = nt_tensor_view(&inv_w, NT_F32, nt_cpu(), 0, NULL);
  if (!st) st = nt_tensor_copy(ctx, &m->factor, &inv_w_host);
  if (!st) st = nt_tensor_zero(ctx, &m->found_inf);
  if (!st) st = nt_unscale_and_check(ctx, ptrs, n, &m->factor, &m->found_inf);
  if (!st) st = nt_sum_squares(ctx, (const nt_tensor *const *)ptrs, n, &m->sumsq);
  if (!st) st = nt_fsdp_global_reduce(ctx, f, m->found_inf.data, o->clip > 0 ? m->sumsq.data : NULL);
  nt_optim_step_args a = nt_optim_args(-1);
  a.found_inf = &m->found_inf;
  a.max_norm = (float)o->clip;
  a.grad_sumsq = o->clip > 0 ? &m->sumsq : NULL;
  if (!st) st = m->sgd ? nt_sgd_step(ctx, m->sgd, &a) : nt_adamw_step(ctx, m->adam, &a);
  if (!st) st = nt_fsdp_params_updated(ctx, f);
  if (!st) st = reduce_loss(ctx, m, o, s, world, rank, local, gloss);
  return st;
}

/* world: the ranks this run's batch is split over; ref: the one-process reference (NO_SHARD,
 * fp32 reduction, no options). */
static nt_status run_init(nt_ctx *ctx, run *m, nt_comm *comm, const opts *o, int world, bool ref) {
  memset(m, 0, sizeof *m);
  m->comm = comm;
  /* The global batch of a micro-step is --global-batch rows (default --batch per rank); the
   * one-process run takes all of them at once. */
  int global = o->global_batch > 0 ? o->global_batch : o->batch * W;
  if (global % W) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "global batch %d over %d ranks", global, W);
  m->rows = global / world;
  nt_fsdp_options fo = nt_fsdp_defaults();
  if (!ref && !nt_sharding_parse(o->strategy, &fo.strategy))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "strategy %s", o->strategy);
  if (!ref && !nt_dtype_parse(o->reduce, &fo.reduce_dtype))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "reduce dtype %s", o->reduce);
  if (!ref && !nt_backward_prefetch_parse(o->bwd_prefetch, &fo.backward_prefetch))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "backward prefetch %s", o->bwd_prefetch);
  fo.forward_prefetch = o->fwd_prefetch;
  fo.reshard_after_forward = !o->no_reshard;
  fo.limit_all_gathers = !o->no_limit;
  fo.param_dtype = PDT;
  fo.stable_buffers = o->stable && !ref;
  fo.trace = o->trace && !ref && R == 0 ? stdout : NULL;
  nt_status st = alloc_acts(ctx, m, o->accum);
  if (!st) st = build(ctx, &m->p);
  if (!st) st = nt_fsdp_create(ctx, comm, &m->p, &fo, &m->f);
  if (!st) nt_fsdp_hooks(m->f, &m->uh, &m->sh);
  if (!st) st = o->use_step && !ref ? make_step(ctx, m, o) : make_optimizer(ctx, m, o);
  nt_mem_reset_peak(ctx);   /* training from here: activations plus model states */
  return st;
}

static void run_free(nt_ctx *ctx, run *m) {
  nt_step_free(ctx, m->step);
  if (m->opt.adamw) m->adam = NULL;   /* m->opt owns it */
  nt_optimizer_free(ctx, &m->opt);
  nt_sgd_free(ctx, m->sgd);
  nt_adamw_free(ctx, m->adam);
  nt_fsdp_free(ctx, m->f);
  nt_params_free(ctx, &m->p);
  nt_tensor *acts[] = {&m->x,   &m->pre1,    &m->h1,  &m->pre2, &m->h2,      &m->logits,
                       &m->dlogits, &m->dh2, &m->dh1, &m->targets, &m->losses, &m->loss,
                       &m->dscale, &m->factor, &m->found_inf, &m->sumsq, &m->gloss};
  for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) nt_tensor_free(ctx, acts[i]);
}

static bool close_to(double a, double b, double rtol, double atol) {
  return fabs(a - b) <= atol + rtol * fabs(b);
}

static void check_memory(nt_ctx *ctx, run *m, const opts *o) {
  nt_fsdp_memory mem;
  nt_fsdp_memory_of(m->f, &mem);
  nt_model_sizes sz;
  nt_model_sizes_of(&m->p, 0, &sz);
  nt_sharding sh = NT_SHARD_NO_SHARD;
  nt_sharding_parse(o->strategy, &sh);
  nt_mem_estimate e;
  nt_memest_compute(&sz, PDT, o->batch, D, C, sh, W, 0, &e);
  /* Padding adds fewer than W elements per unit and per buffer. */
  double slack = (double)NU * W * 4 * 4;
  if (R == 0)
    printf("memory rank 0 (%s, N=%d): params %.0f (memest %.0f) grads %.0f (%.0f) optimizer %.0f "
           "(%.0f), peak gathered %d\n", o->strategy, W, mem.parameters, e.parameters,
           mem.gradients, e.gradients, mem.optimizer, e.optimizer, mem.peak_gathered);
  if (sh == NT_SHARD_FULL) {
    /* memest allows two of the largest unit gathered; the runtime's peak pair may be smaller,
     * never below the kept shards. */
    double kept = (double)sz.n_flat * 4 / W;
    CHECK(mem.parameters <= e.parameters + slack && mem.parameters >= kept - slack,
          "params %.0f vs memest %.0f (kept shards %.0f)", mem.parameters, e.parameters, kept);
  } else {
    CHECK(close_to(mem.parameters, e.parameters, 0, slack), "params %.0f vs %.0f",
          mem.parameters, e.parameters);
  }
  CHECK(close_to(mem.gradients, e.gradients, 0, slack), "grads %.0f vs %.0f", mem.gradients,
        e.gradients);
  CHECK(close_to(mem.optimizer, e.optimizer, 0, 2 * slack), "optimizer %.0f vs %.0f",
        mem.optimizer, e.optimizer);
  CHECK(close_to(mem.master, e.master, 0, slack), "master %.0f vs %.0f", mem.master, e.master);
  if (sh == NT_SHARD_FULL && !o->no_limit)
    CHECK(mem.peak_gathered <= 2, "peak gathered units %d", mem.peak_gathered);
  /* The pool's peak during training, less the activations and the GPU context's cuBLASLt
   * workspace: the model states as reported plus the linear backward's scratch and the pool's
   * 512-byte rounding (under 64 KiB here). */
  nt_mem_stats ms;
  nt_mem_get_stats(ctx, &ms);
  double states = mem.parameters + mem.gradients + mem.master + mem.optimizer;
  double measured = (double)ms.peak_allocated - (double)m->act_bytes -
                    (double)nt_ctx_workspace_bytes(ctx);
  if (R == 0) printf("pool peak less activations %.0f bytes, model states %.0f\n", measured, states);
  CHECK(measured <= states + 96 * 1024 && measured > 0.8 * states,
        "pool peak %.0f vs states %.0f", measured, states);
}

static void compare_weights(nt_ctx *ctx, run *m, nt_ctx *rctx, run *ref, double rtol) {
  for (int u = 0; u < NU; u++) {
    int64_t n = m->p.units[u].numel;
    float *got = malloc(sizeof(float) * (size_t)n);
    nt_tensor dst = nt_tensor_view(got, NT_F32, nt_cpu(), 1, &n);
    nt_tensor ms = master_of(m, u), rs = master_of(ref, u);
    if (!CHECK_OK(ctx, nt_fsdp_gather_unit(ctx, m->f, u, &ms, &dst))) {
      free(got);
      return;
    }
    float *want = malloc(sizeof(float) * (size_t)n);
    nt_tensor wdst = nt_tensor_view(want, NT_F32, nt_cpu(), 1, &n);
    if (!CHECK_OK(rctx, nt_fsdp_gather_unit(rctx, ref->f, u, &rs, &wdst))) {
      free(got);
      free(want);
      return;
    }
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double d = fabs((double)got[i] - want[i]);
      if (d > worst) worst = d;
      if (!close_to(got[i], want[i], rtol, rtol)) bad++;   /* weights are O(0.1) */
    }
    CHECK(bad == 0, "rank %d unit %d: %d of %lld weights differ (max abs diff %.3g)", R, u, bad,
          (long long)n, worst);
    free(got);
    free(want);
  }
}

/* A consolidated checkpoint of an AdamW run (test format): int32 step, then per unit the whole
 * fp32 master weights, m and v. Written by rank 0 from every rank's shards (gather_unit); read
 * back at any world size (scatter_unit / load_unit): resharding is a property of the file. */
static nt_status save_state(nt_ctx *ctx, run *m, const char *path, int32_t step) {
  FILE *f = R == 0 ? fopen(path, "wb") : NULL;
  if (R == 0 && !f) return NT_ERROR(ctx, NT_ERR_IO, "cannot write %s", path);
  nt_status st = NT_OK;
  if (f) fwrite(&step, sizeof step, 1, f);
  for (int u = 0; u < NU && !st; u++) {
    int64_t n = m->p.units[u].numel;
    float *host = malloc(sizeof(float) * (size_t)n);
    nt_tensor whole = nt_tensor_view(host, NT_F32, nt_cpu(), 1, &n), views[3];
    st = nt_adamw_state_views(m->adam, u, &views[0], &views[1], &views[2]);
    for (int k = 0; k < 3 && !st; k++) {
      st = nt_fsdp_gather_unit(ctx, m->f, u, &views[k], &whole);
      if (!st && f) fwrite(host, sizeof(float), (size_t)n, f);
    }
    free(host);
  }
  if (f) fclose(f);
  return st;
}

static nt_status load_state(nt_ctx *ctx, run *m, const char *path, int32_t *step) {
  FILE *f = fopen(path, "rb");
  if (!f || fread(step, sizeof *step, 1, f) != 1) {
    if (f) fclose(f);
    return NT_ERROR(ctx, NT_ERR_IO, "cannot read %s", path);
  }
  nt_status st = NT_OK;
  for (int u = 0; u < NU && !st; u++) {
    int64_t n = m->p.units[u].numel;
    float *host = malloc(sizeof(float) * (size_t)n);
    nt_tensor whole = nt_tensor_view(host, NT_F32, nt_cpu(), 1, &n), views[3];
    st = nt_adamw_state_views(m->adam, u, &views[0], &views[1], &views[2]);
    for (int k = 0; k < 3 && !st; k++) {
      if (fread(host, sizeof(float), (size_t)n, f) != (size_t)n) {
        st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s is truncated", path);
        break;
      }
      if (k == 0) st = nt_fsdp_load_unit(ctx, m->f, u, &whole);
      if (!st) st = nt_fsdp_scatter_unit(ctx, m->f, u, &whole, &views[k]);
    }
    free(host);
  }
  fclose(f);
  if (!st) st = nt_adamw_set_step(ctx, m->adam, *step);
  return st;
}

static int train(nt_ctx *ctx, nt_comm *comm, const opts *o) {
  char cfg[256];
  snprintf(cfg, sizeof cfg, "%s %s %d %d %d skew=%d", o->strategy, o->optim, o->steps, o->batch,
           o->accum, R == o->config_skew_rank);
  if (!CHECK_OK(ctx, nt_comm_check_config(comm, ctx, cfg, strlen(cfg)))) return 1;
  nt_ctx *rctx = NULL;
  nt_ctx_create(&rctx, nt_ctx_device(ctx));
  nt_dist_launch one = {NT_LAUNCH_SINGLE, 0, 1, 0, "", 0};
  nt_comm_options lo = {NT_COMM_LOCAL, &one, 0, false};
  nt_comm *local = NULL;
  run m, ref;
  memset(&ref, 0, sizeof ref);
  if (!CHECK_OK(ctx, run_init(ctx, &m, comm, o, W, false))) return 1;
  if (!CHECK_OK(rctx, nt_comm_create(rctx, &lo, &local))) return 1;
  if (!CHECK_OK(rctx, run_init(rctx, &ref, local, o, 1, true))) return 1;
  /* Resuming: this run continues from the file; the one-process run trains from scratch up
   * to the same step, so a chain of resumes at other world sizes is checked end to end. */
  int32_t start = 0;
  if (o->load && !CHECK_OK(ctx, load_state(ctx, &m, o->load, &start))) return 1;
  for (int s = 0; s < start; s++) {
    double rl;
    if (!CHECK_OK(rctx, train_step(rctx, &ref, o, s, 1, 0, o->accum, false, &rl))) return 1;
  }
  int bad_loss = 0;
  for (int s = start; s < start + o->steps; s++) {
    if (R == o->kill_rank && s == o->kill_step) raise(SIGKILL);
    if (R == o->stall_rank && s == o->stall_step) sleep((unsigned)(4 * o->timeout + 30));
    bool inject = s == o->inf_step;
    double gl, rl;
    nt_status st = train_step(ctx, &m, o, s, W, R, o->accum, inject && R == o->inf_rank, &gl);
    if (st) {
      fprintf(stderr, "rank %d step %d: %s\n", R, s, nt_last_error(ctx));
      fflush(stderr);
      nt_comm_abort(ctx, comm);
      return 1;
    }
    if (!CHECK_OK(rctx, train_step(rctx, &ref, o, s, 1, 0, o->accum, inject, &rl)))
      return 1;
    if (!close_to(gl, rl, o->rtol, o->rtol / 100)) {
      bad_loss++;
      fprintf(stderr, "rank %d step %d: loss %.8g, one process %.8g\n", R, s, gl, rl);
    }
    if (R == 0 && (s == start || s == start + o->steps - 1)) printf("step %d loss %.6f (ref %.6f)\n", s, gl, rl);
  }
  CHECK(bad_loss == 0, "%d steps' losses differ from one process", bad_loss);
  compare_weights(ctx, &m, rctx, &ref, o->rtol);
  if (o->check_memory) check_memory(ctx, &m, o);
  if (o->save) CHECK_OK(ctx, save_state(ctx, &m, o->save, start + o->steps));
  run_free(ctx, &m);
  run_free(rctx, &ref);
  nt_comm_free(rctx, local);
  nt_ctx_free(rctx);
  return 0;
}

int dist_collectives(nt_ctx *ctx, nt_comm *comm);   /* tests/dist_collectives.c */

int main(int argc, char **argv) {
  opts o = {.mode = "train", .strategy = "NO_SHARD", .optim = "sgd", .reduce = "f32",
            .steps = 20, .batch = 2, .accum = 1, .inf_rank = -1, .inf_step = -1,
            .kill_rank = -1, .kill_step = -1, .stall_rank = -1, .stall_step = -1,
            .config_skew_rank = -1, .op_skew_rank = -1, .timeout = 60, .rtol = 1e-5,
            .bwd_prefetch = "BACKWARD_PRE", .device = "cpu", .backend = "mpi",
            .param = "f32"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
#define OPT_S(name, field) if (!strcmp(a, name)) { o.field = v; i++; continue; }
#define OPT_I(name, field) if (!strcmp(a, name)) { o.field = atoi(v); i++; continue; }
#define OPT_D(name, field) if (!strcmp(a, name)) { o.field = atof(v); i++; continue; }
#define OPT_B(name, field) if (!strcmp(a, name)) { o.field = true; continue; }
    OPT_S("--mode", mode) OPT_S("--strategy", strategy) OPT_S("--optim", optim)
    OPT_S("--reduce-dtype", reduce) OPT_S("--backward-prefetch", bwd_prefetch)
    OPT_S("--device", device) OPT_S("--backend", backend) OPT_S("--param-dtype", param)
    OPT_S("--save", save) OPT_S("--load", load)
    OPT_I("--steps", steps) OPT_I("--batch", batch) OPT_I("--accum", accum)
    OPT_I("--global-batch", global_batch)
    OPT_I("--inf-rank", inf_rank) OPT_I("--inf-step", inf_step)
    OPT_I("--kill-rank", kill_rank) OPT_I("--kill-step", kill_step)
    OPT_I("--stall-rank", stall_rank) OPT_I("--stall-step", stall_step)
    OPT_I("--config-skew-rank", config_skew_rank) OPT_I("--op-skew-rank", op_skew_rank)
    OPT_D("--dist-timeout", timeout) OPT_D("--clip", clip) OPT_D("--rtol", rtol)
    OPT_B("--check-memory", check_memory) OPT_B("--fingerprint", fingerprint)
    OPT_B("--forward-prefetch", fwd_prefetch) OPT_B("--no-reshard-after-forward", no_reshard)
    OPT_B("--no-limit-all-gathers", no_limit) OPT_B("--trace", trace)
    OPT_B("--stable-buffers", stable) OPT_B("--use-step", use_step)
    fprintf(stderr, "unknown option %s\n", a);
    return 2;
  }
  nt_comm_backend backend;
  if (!nt_comm_backend_parse(o.backend, &backend) || !nt_dtype_parse(o.param, &PDT)) return 2;
#ifndef NT_HAVE_MPI
  if (backend != NT_COMM_LOCAL) return nt_test_skip("MPI is not compiled in");
#endif
  bool cuda = !strcmp(o.device, "cuda");
  if (cuda && nt_cuda_device_count() == 0) return nt_test_skip("no GPU");
  nt_ctx *ctx = NULL;
  /* Every rank on GPU 0: several ranks share the one GPU through the MPI backend. */
  nt_ctx_create(&ctx, cuda ? nt_cuda(0) : nt_cpu());
  nt_dist_launch l = {NT_LAUNCH_SINGLE, 0, 1, 0, "", 0};
#ifdef NT_HAVE_MPI
  /* LOCAL: one process without MPI (every strategy at world 1, e.g. under a leak checker). */
  if (backend != NT_COMM_LOCAL && !CHECK_OK(ctx, nt_dist_mpi_init(ctx, &l))) return 1;
#endif
  W = l.world;
  R = l.rank;
  nt_comm_options co = {backend, &l, o.timeout, o.fingerprint};
  nt_comm *comm = NULL;
  if (!CHECK_OK(ctx, nt_comm_create(ctx, &co, &comm))) return 1;
  int rc = !strcmp(o.mode, "collectives") ? dist_collectives(ctx, comm) : train(ctx, comm, &o);
  if (rc) {
    fflush(stdout);
    fflush(stderr);
    nt_comm_abort(ctx, comm);
  }
  nt_comm_free(ctx, comm);
  nt_ctx_free(ctx);
  nt_dist_mpi_finalize();
  rc = rc ? rc : nt_test_finish();
  return rc;
}
