/* The training step's stages on the CPU (train/step.h) with the GPT:
 *  - a 96-layer GPT (98 units: more than the optimizer once allowed) builds and steps, with
 *    clipping and the fp16 loss scaler;
 *  - the unit hooks come in the documented order (forward: embeddings, blocks, ln_f; gradients
 *    ready: ln_f, blocks last first, embeddings) and the step hooks once per step, with the
 *    found_inf / sumsq pointers the configuration asks for (with clipping: sumsq only, the
 *    unscale being folded into the optimizer; without: found_inf only);
 *  - running the unscale and norm stages over per-unit element ranges (each unit cut in two)
 *    gives the same parameters, bit for bit, as whole units;
 *  - an injected overflow skips the optimizer on the device and backs the scale off, and the
 *    trace reports it;
 *  - the trainer's ranks draw their own batches and dropout (a 2-rank layout run rank by rank
 *    in one process), and the loader-fed GPT repeats itself exactly. */
#include "tests/testutil.h"
#include "train/step.h"
#include "train/train.h"
#include "models/gpt.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 4 };

typedef struct {
  nt_gpt *g;
  nt_tensor x, y;
  int32_t xs[B * T], ys[B * T];
  int inject_inf;                 /* > 0: poison a gradient element on this micro-step */
  int calls;
} gpt_body;

static nt_status body(nt_ctx *ctx, void *arg, const float *loss_scale, const nt_unit_hooks *h) {
  gpt_body *b = arg;
  nt_status st = nt_gpt_train_step(ctx, b->g, &b->x, &b->y, loss_scale, h);
  if (!st && ++b->calls == b->inject_inf) {
    nt_params *p = nt_gpt_params(b->g);
    ((float *)p->units[1].grad.data)[3] = INFINITY;
  }
  return st;
}

static bool make_gpt(nt_ctx *ctx, int n_layer, nt_dtype dt, gpt_body *b) {
  nt_gpt_config c = {n_layer, 1, 8, T, 16, 0.1f, 0};
  memset(b, 0, sizeof *b);
  nt_ctx_manual_seed(ctx, 3);   /* the same dropout masks for every model built here */
  nt_ctx_set_rng_offset(ctx, 0);
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, dt, B, T, &b->g)) ||
      !CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(b->g), 5)))
    return false;
  nt_test_rng r = {11};
  for (int i = 0; i < B * T; i++) {
    b->xs[i] = (int32_t)nt_test_uniform(&r, 0, 15.999);
    b->ys[i] = (int32_t)nt_test_uniform(&r, 0, 15.999);
  }
  int64_t sh[2] = {B, T};
  b->x = nt_tensor_view(b->xs, NT_I32, nt_cpu(), 2, sh);
  b->y = nt_tensor_view(b->ys, NT_I32, nt_cpu(), 2, sh);
  return true;
}

static nt_optimizer_options fp16_options(void) {
  nt_optimizer_options oo = nt_optimizer_defaults();
  oo.adamw.lr = 1e-2;
  oo.adamw.weight_decay = 0.1;
  oo.scaler.enabled = true;
  oo.scaler.init_scale = 1024.0f;
  oo.scaler.growth_interval = 2;
  return oo;
}

static void test_deep_gpt(nt_ctx *ctx) {
  gpt_body b;
  nt_optimizer opt = {0};
  nt_step *s = NULL;
  if (!make_gpt(ctx, 96, NT_F16, &b)) goto done;
  nt_params *p = nt_gpt_params(b.g);
  CHECK(p->n_units == 98, "96 blocks + embeddings + ln_f = 98 units, got %d", p->n_units);
  nt_optimizer_options oo = fp16_options();
  if (!CHECK_OK(ctx, nt_optimizer_for_params(ctx, p, &oo, &opt))) goto done;
  nt_step_options so = {0};
  so.params = p;
  so.body = body;
  so.body_arg = &b;
  so.optimizer = opt;
  so.max_norm = 1.0f;
  if (!CHECK_OK(ctx, nt_step_create(ctx, &so, &s))) goto done;
  float w0 = ((float *)p->units[97].master.data)[0];
  float l[3];
  for (int i = 0; i < 3; i++) {
    if (!CHECK_OK(ctx, nt_step_run(ctx, s, 1e-2))) goto done;
    memcpy(&l[i], nt_gpt_loss(b.g)->data, sizeof(float));
  }
  float w1 = ((float *)p->units[97].master.data)[0];
  int32_t t = 0;
  CHECK_OK(ctx, nt_adamw_get_step(ctx, opt.adamw, &t));
  CHECK(isfinite(l[0]) && isfinite(l[2]) && t == 3 && w0 != w1 && nt_step_count(s) == 3,
        "96-layer GPT steps: losses %g %g, adamw step %d, ln_f weight %g -> %g", (double)l[0],
        (double)l[2], t, (double)w0, (double)w1);
  float norm = 0;
  CHECK_OK(ctx, nt_adamw_last_grad_norm(ctx, opt.adamw, &norm));
  CHECK(norm > 0 && isfinite(norm), "the step's clipping saw the gradient norm %g", (double)norm);
done:
  nt_step_free(ctx, s);
  nt_optimizer_free(ctx, &opt);
  nt_gpt_free(ctx, b.g);
}

/* ---- hooks ---- */

typedef struct {
  int fwd[16], bwd[16], ready[16];
  int n_fwd, n_bwd, n_ready, n_reduce, n_updated;
  bool saw_found, saw_sumsq;
} hook_log;

static void record(int *list, int *n, int u) {
  if (*n < 16) list[*n] = u;
  (*n)++;
}

static nt_status on_fwd(nt_ctx *ctx, void *arg, int u) {
  hook_log *h = arg;
  (void)ctx;
  record(h->fwd, &h->n_fwd, u);
  return NT_OK;
}

static nt_status on_bwd(nt_ctx *ctx, void *arg, int u) {
  hook_log *h = arg;
  (void)ctx;
  record(h->bwd, &h->n_bwd, u);
  return NT_OK;
}

static nt_status on_ready(nt_ctx *ctx, void *arg, int u) {
  hook_log *h = arg;
  (void)ctx;
  record(h->ready, &h->n_ready, u);
  return NT_OK;
}

static nt_status on_reduce(nt_ctx *ctx, void *arg, float *found, float *sumsq) {
  hook_log *h = arg;
  (void)ctx;
  h->n_reduce++;
  h->saw_found = found != NULL;
  h->saw_sumsq = sumsq != NULL && *sumsq > 0.0f;
  return NT_OK;
}

static nt_status on_updated(nt_ctx *ctx, void *arg) {
  hook_log *h = arg;
  (void)ctx;
  h->n_updated++;
  return NT_OK;
}

static bool same_order(const int *got, int n, const int *want, int m) {
  if (n != m) return false;
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) return false;
  return true;
}

static void test_hooks(nt_ctx *ctx) {
  gpt_body b;
  nt_optimizer opt = {0};
  nt_step *s = NULL;
  hook_log log;
  memset(&log, 0, sizeof log);
  if (!make_gpt(ctx, 2, NT_F16, &b)) goto done;
  nt_params *p = nt_gpt_params(b.g);
  nt_optimizer_options oo = fp16_options();
  if (!CHECK_OK(ctx, nt_optimizer_for_params(ctx, p, &oo, &opt))) goto done;
  nt_unit_hooks uh = {&log, on_fwd, on_bwd, on_ready};
  nt_step_hooks sh = {&log, &uh, on_reduce, on_updated, NULL};
  nt_step_options so = {0};
  so.params = p;
  so.body = body;
  so.body_arg = &b;
  so.optimizer = opt;
  so.max_norm = 1.0f;
  so.hooks = &sh;
  if (!CHECK_OK(ctx, nt_step_create(ctx, &so, &s)) || !CHECK_OK(ctx, nt_step_run(ctx, s, 1e-3)))
    goto done;
  /* units: 0 embeddings, 1-2 blocks, 3 ln_f */
  const int fwd[] = {0, 1, 2, 3, 0}, bwd[] = {0, 3, 2, 1}, ready[] = {3, 2, 1, 0};
  CHECK(same_order(log.fwd, log.n_fwd, fwd, 5),
        "before_forward: embeddings, blocks, ln_f, the tied head's embeddings (%d calls)",
        log.n_fwd);
  CHECK(same_order(log.bwd, log.n_bwd, bwd, 4),
        "before_backward: the tied head's embeddings, ln_f, blocks last first (%d calls)",
        log.n_bwd);
  CHECK(same_order(log.ready, log.n_ready, ready, 4),
        "grads_ready: ln_f, blocks last first, embeddings (%d calls)", log.n_ready);
  /* clipping on: the unscale is folded into the optimizer, found_inf is set after the
   * reduction from the reduced sum of squares */
  CHECK(log.n_reduce == 1 && !log.saw_found && log.saw_sumsq && log.n_updated == 1,
        "step hooks once per step: reduce %d (found_inf %d, sumsq %d), updated %d",
        log.n_reduce, log.saw_found, log.saw_sumsq, log.n_updated);
  /* clipping off: the unscale pass sets found_inf, which is reduced; no sum of squares */
  nt_step_free(ctx, s);
  s = NULL;
  so.max_norm = 0.0f;
  memset(&log, 0, sizeof log);
  if (!CHECK_OK(ctx, nt_step_create(ctx, &so, &s)) || !CHECK_OK(ctx, nt_step_run(ctx, s, 1e-3)))
    goto done;
  CHECK(log.n_reduce == 1 && log.saw_found && !log.saw_sumsq && log.n_updated == 1,
        "without clipping: reduce %d (found_inf %d, sumsq %d), updated %d", log.n_reduce,
        log.saw_found, log.saw_sumsq, log.n_updated);
done:
  nt_step_free(ctx, s);
  nt_optimizer_free(ctx, &opt);
  nt_gpt_free(ctx, b.g);
}

/* ---- owned ranges, overflow and the trace ---- */

/* Four fp16 steps (an overflow injected on the second) with the given ranges (NULL: whole
 * units); copies the fp32 master weights of every unit to `out` (n floats at most). */
static int64_t run_ranges(nt_ctx *ctx, bool split, float *out, int64_t cap, FILE *trace,
                          float *scale_out) {
  gpt_body b;
  nt_optimizer opt = {0};
  nt_step *s = NULL;
  nt_grad_range *r = NULL;
  int64_t n = -1;
  if (!make_gpt(ctx, 2, NT_F16, &b)) goto done;
  b.inject_inf = 2;
  nt_params *p = nt_gpt_params(b.g);
  nt_optimizer_options oo = fp16_options();
  if (!CHECK_OK(ctx, nt_optimizer_for_params(ctx, p, &oo, &opt))) goto done;
  nt_step_options so = {0};
  so.params = p;
  so.body = body;
  so.body_arg = &b;
  so.optimizer = opt;
  so.max_norm = 0.5f;
  so.trace = trace;
  if (split) {
    r = calloc((size_t)(2 * p->n_units), sizeof *r);
    for (int u = 0; u < p->n_units; u++) {
      int64_t mid = p->units[u].numel / 2;
      r[2 * u] = (nt_grad_range){p->units[u].grad, 0, mid};
      r[2 * u + 1] = (nt_grad_range){p->units[u].grad, mid, p->units[u].numel};
    }
    so.ranges = r;
    so.n_ranges = 2 * p->n_units;
  }
  if (!CHECK_OK(ctx, nt_step_create(ctx, &so, &s))) goto done;
  for (int i = 0; i < 4; i++)
    if (!CHECK_OK(ctx, nt_step_run(ctx, s, 1e-2))) goto done;
  n = 0;
  for (int u = 0; u < p->n_units; u++) {
    int64_t k = p->units[u].numel;
    if (n + k > cap) break;
    memcpy(out + n, p->units[u].master.data, (size_t)k * sizeof(float));
    n += k;
  }
  nt_scaler_values v;
  CHECK_OK(ctx, nt_scaler_read(ctx, opt.scaler, &v));
  *scale_out = v.scale;
  int32_t t = 0;
  CHECK_OK(ctx, nt_adamw_get_step(ctx, opt.adamw, &t));
  CHECK(t == 3 && v.skipped_total == 1, "the overflow step was skipped: adamw step %d of 4, "
        "skipped %lld", t, (long long)v.skipped_total);
done:
  free(r);
  nt_step_free(ctx, s);
  nt_optimizer_free(ctx, &opt);
  nt_gpt_free(ctx, b.g);
  return n;
}

static void test_ranges_and_trace(nt_ctx *ctx) {
  enum { CAP = 1 << 16 };
  float *a = malloc(CAP * sizeof(float)), *c = malloc(CAP * sizeof(float));
  float sa = 0, sc = 0;
  FILE *tr = tmpfile();
  int64_t na = run_ranges(ctx, false, a, CAP, tr, &sa);
  int64_t nc = run_ranges(ctx, true, c, CAP, NULL, &sc);
  CHECK(na > 0 && na == nc && memcmp(a, c, (size_t)na * sizeof(float)) == 0 && sa == sc,
        "per-unit ranges (each unit in two) give the whole units' parameters bit for bit "
        "(%lld elements, scale %g vs %g)", (long long)na, (double)sa, (double)sc);
  /* growth_interval 2: 1024 -> (skip) 512 -> 512 -> 1024 */
  CHECK(sa == 1024.0f, "scale after back-off and growth: %g", (double)sa);
  char text[4096] = {0};
  if (tr) {
    rewind(tr);
    size_t k = fread(text, 1, sizeof text - 1, tr);
    text[k] = 0;
    fclose(tr);
  }
  CHECK(strstr(text, "amp step 2: scale 1024, found_inf 1 -> optimizer step skipped, scale now "
                     "512") != NULL,
        "the trace reports the skipped step:\n%s", text);
  CHECK(strstr(text, "amp step 3:") != NULL && strstr(text, "growth tracker") != NULL,
        "the trace has a line per step");
  free(a);
  free(c);
}

/* Losses of a short synthetic-token GPT run as `rank` of `world`. */
static bool rank_losses(nt_ctx *ctx, int rank, int world, int workers, double *out, int n) {
  nt_train_options o = nt_train_defaults(NT_MODEL_GPT);
  o.gpt = (nt_gpt_config){1, 2, 16, 8, 32, 0.1f, 0};
  o.gpt_data = "synthetic";
  o.batch_size = 2;
  o.max_iters = n;
  o.lr_decay_iters = n;
  o.warmup_iters = 1;
  o.eval_interval = 0;
  o.log_interval = 0;
  o.quiet = true;
  o.record_losses = true;
  o.num_workers = workers;
  o.rank = rank;
  o.world_size = world;
  nt_train_result r;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &r))) return false;
  bool ok = r.n_losses == n;
  for (int i = 0; ok && i < n; i++) out[i] = r.losses[i];
  nt_train_result_free(&r);
  CHECK(ok, "%d losses recorded", n);
  return ok;
}

static void test_ranks(nt_ctx *ctx) {
  enum { N = 6 };
  double a[N], b[N], c[N], d[N];
  if (!rank_losses(ctx, 0, 1, 2, a, N) || !rank_losses(ctx, 0, 1, 0, b, N) ||
      !rank_losses(ctx, 0, 2, 2, c, N) || !rank_losses(ctx, 1, 2, 2, d, N))
    return;
  CHECK(memcmp(a, b, sizeof a) == 0, "the loader-fed GPT gives the same losses with 2 worker "
        "threads as synchronously");
  CHECK(a[0] != c[0] && c[0] != d[0] && a[N - 1] != d[N - 1],
        "ranks draw different batches: rank 0/1 %g, 0/2 %g, 1/2 %g", a[0], c[0], d[0]);
  nt_train_options o = nt_train_defaults(NT_MODEL_GPT);
  o.rank = 2;
  o.world_size = 2;
  nt_train_result r;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_train_run(ctx, &o, &r));
}

static void test_errors(nt_ctx *ctx) {
  nt_step *s = NULL;
  nt_step_options so = {0};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_step_create(ctx, &so, &s));
  nt_params empty = {0};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_optimizer_for_params(ctx, &empty, NULL,
                                                              &(nt_optimizer){0}));
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_deep_gpt(ctx);
  test_hooks(ctx);
  test_ranges_and_trace(ctx);
  test_ranks(ctx);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
