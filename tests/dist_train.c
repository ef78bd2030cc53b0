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
#include "models/memest.h"
#include "ops/reduce.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "testutil.h"

enum { D = 24, H = 96, C = 12, NU = 3 };

typedef struct {
  const char *mode, *strategy, *optim, *reduce;
  int steps, batch, accum;
  int inf_rank, inf_step, kill_rank, kill_step, stall_rank, stall_step, config_skew_rank,
      op_skew_rank;
  double timeout, clip, rtol;
  bool check_memory, fingerprint, fwd_prefetch, no_reshard, no_limit;
  const char *bwd_prefetch;
} opts;

typedef struct {
  nt_params p;
  nt_fsdp *f;
  nt_comm *comm;
  nt_sgd *sgd;
  nt_adamw *adam;
  float *x, *t, *h1, *h2, *y, *dy, *a1, *a2;   /* host activations (rows x width) */
} run;

static int W, R;   /* world size, rank */

/* ---- the model: y = W3 tanh(W2 tanh(W1 x + b1) + b2) + b3 ---- */

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
  if (!st) st = nt_params_alloc(ctx, p, NT_F32);
  if (!st) st = nt_params_init(ctx, p, 1234);
  return st;
}

/* out[b, o] = act(in[b, :] . w[o, :] + bias[o]) */
static void layer_fwd(const float *in, int rows, int ni, int no, nt_tensor w, nt_tensor b,
                      float *out, bool act) {
  const float *wp = w.data, *bp = b.data;
  for (int r = 0; r < rows; r++)
    for (int o = 0; o < no; o++) {
      float s = bp[o];
      for (int i = 0; i < ni; i++) s += in[r * ni + i] * wp[o * ni + i];
      out[r * no + o] = act ? tanhf(s) : s;
    }
}

/* Accumulates dw, db from dout; din (may be NULL) = dout . w. */
static void layer_bwd(const float *in, const float *dout, int rows, int ni, int no, nt_tensor w,
                      nt_tensor gw, nt_tensor gb, float *din) {
  const float *wp = w.data;
  float *gwp = gw.data, *gbp = gb.data;
  for (int o = 0; o < no; o++) {
    float sb = 0;
    for (int r = 0; r < rows; r++) sb += dout[r * no + o];
    gbp[o] += sb;
    for (int i = 0; i < ni; i++) {
      float s = 0;
      for (int r = 0; r < rows; r++) s += dout[r * no + o] * in[r * ni + i];
      gwp[o * ni + i] += s;
    }
  }
  if (din)
    for (int r = 0; r < rows; r++)
      for (int i = 0; i < ni; i++) {
        float s = 0;
        for (int o = 0; o < no; o++) s += dout[r * no + o] * wp[o * ni + i];
        din[r * ni + i] = s;
      }
}

static nt_tensor view(run *m, int u, int i, nt_param_view which) {
  return nt_params_view(&m->p, u, i, which);
}

/* One micro-step on `rows` rows of x/t: returns sum of 0.5 (y - t)^2 / (rows * accum) and
 * accumulates its gradient. Hooks are those of the FSDP runtime. */
static nt_status micro_step(nt_ctx *ctx, run *m, int rows, int accum, bool inject_inf,
                            double *loss) {
  nt_status st;
  nt_fsdp *f = m->f;
  const int io[NU][2] = {{D, H}, {H, H}, {H, C}};
  const float *ins[NU] = {m->x, m->h1, m->h2};
  float *outs[NU] = {m->h1, m->h2, m->y};
  for (int u = 0; u < NU; u++) {
    if ((st = nt_fsdp_before_forward(ctx, f, u))) return st;
    layer_fwd(ins[u], rows, io[u][0], io[u][1], view(m, u, 0, NT_VIEW_COMPUTE),
              view(m, u, 1, NT_VIEW_COMPUTE), outs[u], u < NU - 1);
  }
  double l = 0;
  for (int k = 0; k < rows * C; k++) {
    float d = m->y[k] - m->t[k];
    l += 0.5 * (double)d * d;
    m->dy[k] = d / (float)(rows * accum);
  }
  *loss = l / (rows * accum);
  float *dout = m->dy, *scratch[2] = {m->a1, m->a2};
  for (int u = NU - 1; u >= 0; u--) {
    if ((st = nt_fsdp_before_backward(ctx, f, u))) return st;
    float *din = u > 0 ? scratch[u & 1] : NULL;
    layer_bwd(ins[u], dout, rows, io[u][0], io[u][1], view(m, u, 0, NT_VIEW_COMPUTE),
              view(m, u, 0, NT_VIEW_GRAD), view(m, u, 1, NT_VIEW_GRAD), din);
    if (din) {   /* through the tanh that made this unit's input */
      for (int k = 0; k < rows * io[u][0]; k++) din[k] *= 1.0f - ins[u][k] * ins[u][k];
      dout = din;
    }
    if (inject_inf && u == 1) ((float *)view(m, 1, 0, NT_VIEW_GRAD).data)[7] = INFINITY;
    if ((st = nt_fsdp_grads_ready(ctx, f, u))) return st;
  }
  return NT_OK;
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
    return nt_sgd_create(ctx, &so, units, NU, g, 2, &m->sgd);
  }
  nt_adamw_options ao = nt_adamw_defaults();
  ao.lr = 3e-3;
  return nt_adamw_create(ctx, &ao, units, NU, g, 2, &m->adam);
}

/* Deterministic global batch of step s: row g of G. */
static void batch_rows(int s, int g0, int rows, float *x, float *t) {
  for (int r = 0; r < rows; r++) {
    nt_test_rng rng = {(uint64_t)s * 1000003u + (uint64_t)(g0 + r) * 7919u + 17u};
    for (int i = 0; i < D; i++) x[r * D + i] = (float)nt_test_uniform(&rng, -1, 1);
    for (int c = 0; c < C; c++) t[r * C + c] = (float)nt_test_uniform(&rng, -0.5, 0.5);
  }
}

/* One optimizer step of run m (world = the run's comm). Returns the global mean loss. */
static nt_status train_step(nt_ctx *ctx, run *m, const opts *o, int s, int world, int rank,
                            int accum, bool inject, double *gloss) {
  nt_fsdp *f = m->f;
  int rows = o->batch * (W / world);   /* the reference takes every rank's rows at once */
  nt_status st = nt_fsdp_zero_grad(ctx, f);
  double local = 0;
  for (int k = 0; k < accum && !st; k++) {
    nt_fsdp_set_sync(f, k == accum - 1);
    int g0 = (k * world + rank) * rows;
    batch_rows(s, g0, rows, m->x, m->t);
    double l = 0;
    st = micro_step(ctx, m, rows, accum, inject && k == 0, &l);
    local += l;
  }
  if (!st) st = nt_fsdp_finish_backward(ctx, f);
  float factor = 0, found = 0, sumsq = 0;
  nt_tensor tf = nt_tensor_view(&factor, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor tinf = nt_tensor_view(&found, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor tsq = nt_tensor_view(&sumsq, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor owned[NU], *ptrs[NU];
  int n = 0;
  if (!st) st = nt_fsdp_owned_grads(f, owned, &n);
  for (int i = 0; i < n; i++) ptrs[i] = &owned[i];
  if (!st) st = nt_fsdp_unscale_factor(ctx, f, NULL, &tf);
  if (!st) st = nt_unscale_and_check(ctx, ptrs, n, &tf, &tinf);
  if (!st) st = nt_sum_squares(ctx, (const nt_tensor *const *)ptrs, n, &tsq);
  if (!st) st = nt_fsdp_global_reduce(ctx, f, &found, o->clip > 0 ? &sumsq : NULL);
  nt_optim_step_args a = nt_optim_args(-1);
  a.found_inf = &tinf;
  a.max_norm = (float)o->clip;
  a.grad_sumsq = o->clip > 0 ? &tsq : NULL;
  if (!st) st = m->sgd ? nt_sgd_step(ctx, m->sgd, &a) : nt_adamw_step(ctx, m->adam, &a);
  if (!st) st = nt_fsdp_params_updated(ctx, f);
  /* The global loss: the ranks' means averaged (equal batches). */
  float lsum = (float)local;
  nt_tensor tl = nt_tensor_view(&lsum, NT_F32, nt_cpu(), 0, NULL);
  bool skew = rank == o->op_skew_rank && s == 3 && world > 1;
  if (!st) st = nt_comm_all_reduce(m->comm, ctx, &tl, skew ? NT_REDUCE_MAX : NT_REDUCE_SUM);
  if (!st) st = nt_comm_check_fingerprint(m->comm, ctx);
  *gloss = (double)lsum / world;
  return st;
}

static nt_status run_init(nt_ctx *ctx, run *m, nt_comm *comm, const opts *o, int world) {
  memset(m, 0, sizeof *m);
  m->comm = comm;
  size_t rows = (size_t)o->batch * (size_t)(W / world);
  float **bufs[] = {&m->x, &m->t, &m->h1, &m->h2, &m->y, &m->dy, &m->a1, &m->a2};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    *bufs[i] = calloc(rows * H + rows * D, sizeof(float));
    if (!*bufs[i]) return NT_ERROR(ctx, NT_ERR_OOM, "test buffers");
  }
  nt_fsdp_options fo = nt_fsdp_defaults();
  if (world > 1 && !nt_sharding_parse(o->strategy, &fo.strategy))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "strategy %s", o->strategy);
  if (world > 1 && !nt_dtype_parse(o->reduce, &fo.reduce_dtype))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "reduce dtype %s", o->reduce);
  if (world > 1 && !nt_backward_prefetch_parse(o->bwd_prefetch, &fo.backward_prefetch))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "backward prefetch %s", o->bwd_prefetch);
  fo.forward_prefetch = o->fwd_prefetch;
  fo.reshard_after_forward = !o->no_reshard;
  fo.limit_all_gathers = !o->no_limit;
  nt_status st = build(ctx, &m->p);
  if (!st) st = nt_fsdp_create(ctx, comm, &m->p, &fo, &m->f);
  if (!st) st = make_optimizer(ctx, m, o);
  return st;
}

static void run_free(nt_ctx *ctx, run *m) {
  nt_sgd_free(ctx, m->sgd);
  nt_adamw_free(ctx, m->adam);
  nt_fsdp_free(ctx, m->f);
  nt_params_free(ctx, &m->p);
  float *bufs[] = {m->x, m->t, m->h1, m->h2, m->y, m->dy, m->a1, m->a2};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
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
  nt_memest_compute(&sz, NT_F32, o->batch, D, C, sh, W, 0, &e);
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
  CHECK(mem.master == 0 && e.master == 0, "fp32 has no separate master");
  if (sh == NT_SHARD_FULL && !o->no_limit)
    CHECK(mem.peak_gathered <= 2, "peak gathered units %d", mem.peak_gathered);
  /* The pool's live bytes: model states as reported, within the pool's 512-byte rounding. */
  nt_mem_stats ms;
  nt_mem_get_stats(ctx, &ms);
  double states = mem.parameters + mem.gradients + mem.optimizer;
  if (R == 0) printf("pool peak %zu bytes, model states %.0f\n", ms.peak_allocated, states);
  CHECK((double)ms.peak_allocated <= states + 64 * 1024 && (double)ms.peak_allocated > 0.8 * states,
        "pool peak %zu vs states %.0f", ms.peak_allocated, states);
}

static void compare_weights(nt_ctx *ctx, run *m, run *ref, double rtol) {
  for (int u = 0; u < NU; u++) {
    int64_t n = m->p.units[u].numel;
    float *got = malloc(sizeof(float) * (size_t)n);
    nt_tensor dst = nt_tensor_view(got, NT_F32, nt_cpu(), 1, &n);
    if (!CHECK_OK(ctx, nt_fsdp_gather_unit(ctx, m->f, u, NULL, &dst))) {
      free(got);
      return;
    }
    const float *want = ref->p.units[u].master.data;
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double d = fabs((double)got[i] - want[i]);
      if (d > worst) worst = d;
      if (!close_to(got[i], want[i], rtol, rtol / 10)) bad++;
    }
    CHECK(bad == 0, "rank %d unit %d: %d of %lld weights differ (max abs diff %.3g)", R, u, bad,
          (long long)n, worst);
    free(got);
  }
}

static int train(nt_ctx *ctx, nt_comm *comm, const opts *o) {
  char cfg[256];
  snprintf(cfg, sizeof cfg, "%s %s %d %d %d skew=%d", o->strategy, o->optim, o->steps, o->batch,
           o->accum, R == o->config_skew_rank);
  if (!CHECK_OK(ctx, nt_comm_check_config(comm, ctx, cfg, strlen(cfg)))) return 1;
  nt_ctx *rctx = NULL;
  nt_ctx_create(&rctx, nt_cpu());
  nt_dist_launch one = {NT_LAUNCH_SINGLE, 0, 1, 0, "", 0};
  nt_comm_options lo = {NT_COMM_LOCAL, &one, 0, false};
  nt_comm *local = NULL;
  run m, ref;
  memset(&ref, 0, sizeof ref);
  nt_mem_reset_peak(ctx);
  if (!CHECK_OK(ctx, run_init(ctx, &m, comm, o, W))) return 1;
  if (!CHECK_OK(rctx, nt_comm_create(rctx, &lo, &local))) return 1;
  if (!CHECK_OK(rctx, run_init(rctx, &ref, local, o, 1))) return 1;
  int bad_loss = 0;
  for (int s = 0; s < o->steps; s++) {
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
    if (R == 0 && (s == 0 || s == o->steps - 1)) printf("step %d loss %.6f (ref %.6f)\n", s, gl, rl);
  }
  CHECK(bad_loss == 0, "%d steps' losses differ from one process", bad_loss);
  compare_weights(ctx, &m, &ref, o->rtol);
  if (o->check_memory) check_memory(ctx, &m, o);
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
            .bwd_prefetch = "BACKWARD_PRE"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
#define OPT_S(name, field) if (!strcmp(a, name)) { o.field = v; i++; continue; }
#define OPT_I(name, field) if (!strcmp(a, name)) { o.field = atoi(v); i++; continue; }
#define OPT_D(name, field) if (!strcmp(a, name)) { o.field = atof(v); i++; continue; }
#define OPT_B(name, field) if (!strcmp(a, name)) { o.field = true; continue; }
    OPT_S("--mode", mode) OPT_S("--strategy", strategy) OPT_S("--optim", optim)
    OPT_S("--reduce-dtype", reduce) OPT_S("--backward-prefetch", bwd_prefetch)
    OPT_I("--steps", steps) OPT_I("--batch", batch) OPT_I("--accum", accum)
    OPT_I("--inf-rank", inf_rank) OPT_I("--inf-step", inf_step)
    OPT_I("--kill-rank", kill_rank) OPT_I("--kill-step", kill_step)
    OPT_I("--stall-rank", stall_rank) OPT_I("--stall-step", stall_step)
    OPT_I("--config-skew-rank", config_skew_rank) OPT_I("--op-skew-rank", op_skew_rank)
    OPT_D("--dist-timeout", timeout) OPT_D("--clip", clip) OPT_D("--rtol", rtol)
    OPT_B("--check-memory", check_memory) OPT_B("--fingerprint", fingerprint)
    OPT_B("--forward-prefetch", fwd_prefetch) OPT_B("--no-reshard-after-forward", no_reshard)
    OPT_B("--no-limit-all-gathers", no_limit)
    fprintf(stderr, "unknown option %s\n", a);
    return 2;
  }
#ifndef NT_HAVE_MPI
  return nt_test_skip("MPI is not compiled in");
#endif
  nt_ctx *ctx = NULL;
  nt_ctx_create(&ctx, nt_cpu());
  nt_dist_launch l;
  if (!CHECK_OK(ctx, nt_dist_mpi_init(ctx, &l))) return 1;
  W = l.world;
  R = l.rank;
  nt_comm_options co = {NT_COMM_MPI, &l, o.timeout, o.fingerprint};
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
