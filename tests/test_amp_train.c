/* AMP end to end on a small model: a 2-layer MLP regression (ops/linear, ReLU, MSE computed on
 * the host) whose parameters live in one flat buffer, trained by the fused AdamW (groups: no
 * decay for biases, clipping at 1.0, warmup + cosine lr) under the fp32, bf16 and fp16 (+ loss
 * scaler) policies from the same fp32 initial weights and the same data.
 * Checks:
 *  - every curve falls (final loss < 25% of the first);
 *  - bf16 and fp16 follow the fp32 curve: per step |loss - loss_fp32| <= TOL * loss_fp32 with
 *    TOL = 0.026 for bf16 and 0.0035 for fp16 (observed: 0.0131 and 0.00183 on the CPU,
 *    0.0131 and 0.00179 on the H200);
 *  - an inf injected into one gradient at step 20 skips exactly that step: master weights, m, v
 *    and the compute copy bitwise unchanged, t unchanged, the scale halved, one skip counted;
 *  - saving the optimizer and scaler state at step 30 and resuming in a fresh model gives the
 *    same losses and master weights bit for bit.
 * Also: the precision policies (names, dtype table, FP8's Hopper check and bf16 fallback) and
 * FP8 delayed scaling against a plain reference (amax history roll, margin, 0/inf/NaN amax).
 * Compiled twice: the CPU test and, with NT_TEST_GPU, gpu_test_amp_train.c. */
#include "testutil.h"
#include "amp/policy.h"
#include "amp/fp8.h"
#include "amp/scaler.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "ops/linear.h"
#include "ops/elementwise.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The CPU and GPU builds of this test may run at once (ctest -j): distinct file names. */
#ifdef NT_TEST_GPU
#define STATE_PREFIX "gpu_"
#else
#define STATE_PREFIX ""
#endif

#define B 64
#define IN 13
#define H 37
#define O 3
#define STEPS 80
/* Flat layout, each piece at a multiple of 128 elements (aligned for any dtype). */
#define OFF_W1 0
#define OFF_B1 512
#define OFF_W2 640
#define OFF_B2 768
#define NPARAM 771

typedef struct {
  nt_ctx *ctx;
  nt_policy pol;
  nt_tensor params, grads, master_init, x, h, y, dy, dh, dpre;
  nt_adamw *opt;
  nt_scaler *scaler;
  nt_schedule sched;
} model;

static nt_tensor piece(const nt_tensor *flat, int64_t off, int ndim, int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  char *base = (char *)flat->data + (size_t)off * nt_dtype_size(flat->dtype);
  return nt_tensor_view(base, flat->dtype, flat->device, ndim, shape);
}

/* The batch of step s and its targets: a fixed teacher, t = A x + 0.3 sin(2 x0). */
static void batch(int s, float *x, float *t) {
  nt_test_rng r = {4242u + 7919u * (uint64_t)s}, ra = {17u};
  float a[O * IN];
  nt_test_fill_uniform(&ra, a, O * IN, -0.6f, 0.6f);
  nt_test_fill_uniform(&r, x, B * IN, -1.0f, 1.0f);
  for (int b = 0; b < B; b++)
    for (int o = 0; o < O; o++) {
      double acc = 0.3 * sin(2.0 * x[b * IN]);
      for (int i = 0; i < IN; i++) acc += a[o * IN + i] * x[b * IN + i];
      t[b * O + o] = (float)acc;
    }
}

static void model_free(model *m) {
  nt_ctx *ctx = m->ctx;
  nt_adamw_free(ctx, m->opt);
  nt_scaler_free(ctx, m->scaler);
  nt_tensor *ts[] = {&m->params, &m->grads, &m->master_init, &m->x, &m->h, &m->y, &m->dy, &m->dh, &m->dpre};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) nt_tensor_free(ctx, ts[i]);
  memset(m, 0, sizeof *m);
}

static bool model_init(nt_ctx *ctx, nt_precision prec, model *m) {
  memset(m, 0, sizeof *m);
  m->ctx = ctx;
  if (!CHECK_OK(ctx, nt_policy_make(ctx, prec, &m->pol))) return false;
  nt_dtype cd = m->pol.compute_dtype;
  int64_t np = NPARAM, bx[2] = {B, IN}, bh[2] = {B, H}, by[2] = {B, O};
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->params, cd, 1, &np)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->grads, cd, 1, &np)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->master_init, NT_F32, 1, &np)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->x, cd, 2, bx)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->h, cd, 2, bh)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->dh, cd, 2, bh)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->dpre, cd, 2, bh)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->y, cd, 2, by)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &m->dy, cd, 2, by)))
    return false;
  /* fp32 initial weights (uniform +-1/sqrt(fan_in), as torch.nn.Linear), zero padding. */
  float w[NPARAM];
  memset(w, 0, sizeof w);
  nt_test_rng r = {2024u};
  nt_test_fill_uniform(&r, w + OFF_W1, H * IN + H, -1.0f / sqrtf(IN), 1.0f / sqrtf(IN));
  memmove(w + OFF_B1, w + OFF_W1 + H * IN, sizeof(float) * H);
  memset(w + OFF_W1 + H * IN, 0, sizeof(float) * (size_t)(OFF_B1 - OFF_W1 - H * IN));
  nt_test_fill_uniform(&r, w + OFF_W2, O * H, -1.0f / sqrtf(H), 1.0f / sqrtf(H));
  nt_test_fill_uniform(&r, w + OFF_B2, O, -1.0f / sqrtf(H), 1.0f / sqrtf(H));
  nt_test_upload(ctx, &m->master_init, w);
  nt_test_upload(ctx, &m->params, w);
  static const nt_param_range decay[2] = {{0, OFF_W1, H * IN}, {0, OFF_W2, O * H}};
  static const nt_param_range nodecay[2] = {{0, OFF_B1, H}, {0, OFF_B2, O}};
  nt_param_group groups[2] = {{1.0f, 0.01, decay, 2}, {1.0f, 0.0, nodecay, 2}};
  nt_param_unit u = {m->params, m->grads, &m->master_init};
  nt_adamw_options o = nt_adamw_defaults();
  if (!CHECK_OK(ctx, nt_adamw_create(ctx, &o, &u, 1, groups, 2, &m->opt))) return false;
  nt_scaler_options so = nt_scaler_defaults();
  so.enabled = m->pol.needs_scaler;
  so.init_scale = 4096.0f;
  so.growth_interval = 25;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &so, &m->scaler))) return false;
  m->sched = nt_schedule_warmup_cosine(1e-2, 1e-3, 5, STEPS);
  return true;
}

/* One training step; returns the loss (fp64 on the host) or NAN on failure. inject: put +inf
 * into gradient element 100 after backward. */
static double train_step(model *m, int s, bool inject) {
  nt_ctx *ctx = m->ctx;
  float x[B * IN], t[B * O], y[B * O], dy[B * O];
  nt_tensor w1 = piece(&m->params, OFF_W1, 2, H, IN), b1 = piece(&m->params, OFF_B1, 1, H, 0);
  nt_tensor w2 = piece(&m->params, OFF_W2, 2, O, H), b2 = piece(&m->params, OFF_B2, 1, O, 0);
  nt_tensor dw1 = piece(&m->grads, OFF_W1, 2, H, IN), db1 = piece(&m->grads, OFF_B1, 1, H, 0);
  nt_tensor dw2 = piece(&m->grads, OFF_W2, 2, O, H), db2 = piece(&m->grads, OFF_B2, 1, O, 0);
  batch(s, x, t);
  if (!nt_test_upload(ctx, &m->x, x) || !CHECK_OK(ctx, nt_tensor_zero(ctx, &m->grads)) ||
      !CHECK_OK(ctx, nt_linear_forward(ctx, &m->x, &w1, &b1, &m->h, NT_ACT_RELU, NULL)) ||
      !CHECK_OK(ctx, nt_linear_forward(ctx, &m->h, &w2, &b2, &m->y, NT_ACT_NONE, NULL)) ||
      !nt_test_download(ctx, &m->y, y))
    return NAN;
  nt_scaler_values sv = {1.0f, 0, 0, 0, -1};
  if (m->pol.needs_scaler && !CHECK_OK(ctx, nt_scaler_read(ctx, m->scaler, &sv))) return NAN;
  double loss = 0;
  for (int i = 0; i < B * O; i++) {
    double d = (double)y[i] - t[i];
    loss += d * d;
    dy[i] = (float)(2.0 * d / (B * O) * sv.scale);   /* d(loss * scale)/dy */
  }
  loss /= B * O;
  if (!nt_test_upload(ctx, &m->dy, dy) || !CHECK_OK(ctx, nt_tensor_zero(ctx, &m->dh)) ||
      !CHECK_OK(ctx, nt_tensor_zero(ctx, &m->dpre)) ||
      !CHECK_OK(ctx, nt_linear_backward(ctx, &m->dy, &m->h, &w2, &m->dh, &dw2, &db2)) ||
      !CHECK_OK(ctx, nt_relu_backward(ctx, &m->h, &m->dh, &m->dpre)) ||
      !CHECK_OK(ctx, nt_linear_backward(ctx, &m->dpre, &m->x, &w1, NULL, &dw1, &db1)))
    return NAN;
  if (inject) {
    float inf = INFINITY;
    nt_tensor one = piece(&m->grads, 100, 1, 1, 0);
    if (!nt_test_upload(ctx, &one, &inf)) return NAN;
  }
  nt_optim_step_args a = nt_optim_args(nt_schedule_lr(&m->sched, s));
  a.max_norm = 1.0f;
  if (!CHECK_OK(ctx, nt_test_scaled_step(ctx, m->opt, m->scaler, &m->grads, &a)) ||
      !CHECK_OK(ctx, nt_scaler_update(ctx, m->scaler)))
    return NAN;
  return loss;
}

static bool train(model *m, int from, int to, double *losses, int inject_at) {
  for (int s = from; s < to; s++) {
    losses[s] = train_step(m, s, s == inject_at);
    if (isnan(losses[s])) return false;
  }
  return true;
}

/* master, m, v, compute copy of the model (4 * NPARAM floats). */
static void snapshot(model *m, float *out) {
  nt_tensor mw, mm, vv;
  nt_adamw_state_views(m->opt, 0, &mw, &mm, &vv);
  nt_test_download(m->ctx, &mw, out);
  nt_test_download(m->ctx, &mm, out + NPARAM);
  nt_test_download(m->ctx, &vv, out + 2 * NPARAM);
  nt_test_download(m->ctx, &m->params, out + 3 * NPARAM);
}

static void test_curves(nt_ctx *ctx, double *fp32_out) {
  const nt_precision precs[3] = {NT_PREC_FP32, NT_PREC_BF16, NT_PREC_FP16};
  /* the worst relative gap of each curve to fp32's, about twice the measured one: bf16 0.0131
   * on the CPU and on the H200 (2026-12-04 03:20), fp16 0.00183 on the CPU and 0.00179 on the
   * H200 (docs/tolerances.md) */
  const double tol[3] = {0.0, 0.026, 0.0035};
  static double losses[3][STEPS];
  for (int p = 0; p < 3; p++) {
    model m;
    if (model_init(ctx, precs[p], &m)) train(&m, 0, STEPS, losses[p], -1);
    if (m.scaler && precs[p] == NT_PREC_FP16) {
      nt_scaler_values v;
      CHECK_OK(ctx, nt_scaler_read(ctx, m.scaler, &v));
      CHECK_OK(ctx, nt_scaler_log(ctx, m.scaler));
      printf("fp16: final scale %g, %lld skipped steps\n", (double)v.scale, (long long)v.skipped_total);
      CHECK(v.skipped_total <= 2, "fp16 run skipped %lld steps", (long long)v.skipped_total);
    }
    model_free(&m);
    CHECK(losses[p][STEPS - 1] < 0.25 * losses[p][0], "%s: loss %g -> %g does not fall",
          nt_precision_name(precs[p]), losses[p][0], losses[p][STEPS - 1]);
  }
  for (int p = 1; p < 3; p++) {
    double worst = 0;
    int at = 0;
    for (int s = 0; s < STEPS; s++) {
      double r = fabs(losses[p][s] - losses[0][s]) / losses[0][s];
      if (r > worst) { worst = r; at = s; }
    }
    printf("%s vs fp32: worst relative loss difference %.3g at step %d (tolerance %.3g)\n",
           nt_precision_name(precs[p]), worst, at, tol[p]);
    CHECK(worst <= tol[p], "%s curve leaves fp32's by %.4f at step %d", nt_precision_name(precs[p]),
          worst, at);
  }
  printf("step  fp32      bf16      fp16\n");
  for (int s = 0; s < STEPS; s += 10)
    printf("%4d  %.6f  %.6f  %.6f\n", s, losses[0][s], losses[1][s], losses[2][s]);
  if (fp32_out) memcpy(fp32_out, losses[0], sizeof losses[0]);
}

static void test_inject(nt_ctx *ctx) {
  model m;
  double losses[STEPS];
  static float before[4 * NPARAM], after[4 * NPARAM];
  if (!model_init(ctx, NT_PREC_FP16, &m) || !train(&m, 0, 20, losses, -1)) goto done;
  nt_scaler_values v0, v1;
  int32_t t0 = 0, t1 = 0;
  snapshot(&m, before);
  CHECK_OK(ctx, nt_scaler_read(ctx, m.scaler, &v0));
  CHECK_OK(ctx, nt_adamw_get_step(ctx, m.opt, &t0));
  if (!train(&m, 20, 21, losses, 20)) goto done;
  snapshot(&m, after);
  CHECK_OK(ctx, nt_scaler_read(ctx, m.scaler, &v1));
  CHECK_OK(ctx, nt_adamw_get_step(ctx, m.opt, &t1));
  const char *what[4] = {"master weights", "m", "v", "compute copy"};
  for (int k = 0; k < 4; k++)
    CHECK(memcmp(before + k * NPARAM, after + k * NPARAM, sizeof(float) * NPARAM) == 0,
          "the overflow step changed the %s", what[k]);
  CHECK(t1 == t0, "t advanced on the skipped step (%d -> %d)", t0, t1);
  CHECK(v1.scale == v0.scale * 0.5f, "scale %g -> %g, expected halved", (double)v0.scale, (double)v1.scale);
  CHECK(v1.skipped_total == v0.skipped_total + 1 && v1.last_skipped == v1.updates - 1,
        "skip counters %lld -> %lld", (long long)v0.skipped_total, (long long)v1.skipped_total);
  /* The next clean step updates again. */
  if (train(&m, 21, 22, losses, -1)) {
    snapshot(&m, before);
    CHECK(memcmp(before, after, sizeof(float) * NPARAM) != 0, "training resumes after the skip");
    CHECK_OK(ctx, nt_adamw_get_step(ctx, m.opt, &t1));
    CHECK(t1 == t0 + 1, "t after the next clean step: %d", t1);
  }
done:
  model_free(&m);
}

static void test_resume(nt_ctx *ctx) {
  const char *path = STATE_PREFIX "test_amp_train.state";
  model a, b;
  double la[STEPS], lb[STEPS];
  static float sa[4 * NPARAM], sb[4 * NPARAM];
  nt_scaler_state ss;
  bool ok = model_init(ctx, NT_PREC_FP16, &a) && train(&a, 0, 30, la, -1) &&
            CHECK_OK(ctx, nt_adamw_save(ctx, a.opt, path)) &&
            CHECK_OK(ctx, nt_scaler_state_get(ctx, a.scaler, &ss)) && train(&a, 30, 40, la, -1);
  if (ok && model_init(ctx, NT_PREC_FP16, &b) && CHECK_OK(ctx, nt_adamw_load(ctx, b.opt, path)) &&
      CHECK_OK(ctx, nt_scaler_state_set(ctx, b.scaler, &ss)) && train(&b, 30, 40, lb, -1)) {
    CHECK(memcmp(la + 30, lb + 30, sizeof(double) * 10) == 0, "resumed losses differ");
    snapshot(&a, sa);
    snapshot(&b, sb);
    CHECK(memcmp(sa, sb, sizeof sa) == 0, "resumed state is not bit-identical");
  }
  model_free(&a);
  model_free(&b);
  remove(path);
}

static void test_policy(nt_ctx *ctx) {
  nt_precision p;
  CHECK(nt_precision_parse(ctx, "bf16", &p) == NT_OK && p == NT_PREC_BF16, "parse bf16");
  CHECK(nt_precision_parse(ctx, "float16", &p) == NT_OK && p == NT_PREC_FP16, "parse float16");
  CHECK(nt_precision_parse(ctx, "fp8", &p) == NT_OK && p == NT_PREC_FP8, "parse fp8");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_precision_parse(ctx, "int8", &p));
  for (int i = 0; i < NT_PREC_COUNT; i++)
    CHECK(nt_precision_parse(ctx, nt_precision_name((nt_precision)i), &p) == NT_OK && (int)p == i,
          "name round trip %d", i);
  nt_policy pol;
  const struct { nt_precision p; nt_dtype dt; bool scaler, tf32; } table[] = {
      {NT_PREC_FP32, NT_F32, false, false}, {NT_PREC_TF32, NT_F32, false, true},
      {NT_PREC_BF16, NT_BF16, false, false}, {NT_PREC_FP16, NT_F16, true, false}};
  for (int i = 0; i < 4; i++) {
    CHECK_OK(ctx, nt_policy_make_for(ctx, table[i].p, 90, &pol));
    CHECK(pol.compute_dtype == table[i].dt && pol.needs_scaler == table[i].scaler &&
              pol.allow_tf32 == table[i].tf32 && !pol.fp8 && pol.precision == table[i].p,
          "policy table %s", nt_precision_name(table[i].p));
  }
  CHECK_OK(ctx, nt_policy_make_for(ctx, NT_PREC_FP8, 90, &pol));
  CHECK(pol.fp8 && pol.precision == NT_PREC_FP8 && pol.fp8_forward == NT_FP8_E4M3 &&
            pol.fp8_backward == NT_FP8_E5M2 && pol.compute_dtype == NT_BF16 && !pol.needs_scaler,
        "fp8 on Hopper");
  CHECK_OK(ctx, nt_policy_make_for(ctx, NT_PREC_FP8, 80, &pol));
  CHECK(!pol.fp8 && pol.precision == NT_PREC_BF16 && pol.requested == NT_PREC_FP8 &&
            pol.compute_dtype == NT_BF16, "fp8 on an A100 falls back to bf16");
  int cc = -1;
  CHECK_OK(ctx, nt_policy_compute_capability(ctx, &cc));
  CHECK_OK(ctx, nt_policy_make(ctx, NT_PREC_FP8, &pol));
  CHECK(pol.fp8 == (cc >= 90), "fp8 on this device (cc %d): %d", cc, (int)pol.fp8);
  CHECK_OK(ctx, nt_policy_make(ctx, NT_PREC_TF32, &pol));
  nt_policy_apply(ctx, &pol);
  CHECK(nt_ctx_allow_tf32(ctx), "tf32 policy sets the context flag");
  CHECK_OK(ctx, nt_policy_make(ctx, NT_PREC_FP32, &pol));
  nt_policy_apply(ctx, &pol);
  CHECK(!nt_ctx_allow_tf32(ctx), "fp32 policy clears it");
}

/* FP8 delayed scaling: tensor 0 E4M3 (history 4, margin 0), tensor 1 E5M2 (history 4,
 * margin 1) against a reference that keeps the history newest-first and shifts it. */
static void test_fp8(nt_ctx *ctx) {
  const float amaxes[] = {2, 4, 1, 0.5f, 0.25f, 0.125f, 0, 0, 0, 0, 0, 3, NAN, 1, 1, 1, 1,
                          INFINITY, 2, 1e-45f, 0.5f};
  const int n_steps = (int)(sizeof amaxes / sizeof amaxes[0]);
  nt_fp8_state *s = NULL;
  nt_dtype fmts[2] = {NT_FP8_E4M3, NT_FP8_E5M2};
  nt_fp8_options o = nt_fp8_defaults();
  CHECK(o.history_len == 1024 && o.margin == 0, "TE defaults");
  CHECK(nt_fp8_max(NT_FP8_E4M3) == 448.0f && nt_fp8_max(NT_FP8_E5M2) == 57344.0f, "fp8 max");
  o.history_len = 4;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_fp8_state_create(ctx, &o, (nt_dtype[]){NT_BF16}, 1, &s));
  /* Two states so the two tensors can have different margins. */
  nt_fp8_state *st[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    o.margin = k;
    if (!CHECK_OK(ctx, nt_fp8_state_create(ctx, &o, &fmts[k], 1, &st[k]))) return;
  }
  float ref_hist[2][4] = {{0}}, ref_scale[2] = {1, 1};
  int64_t two = 2;
  nt_tensor x;
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &x, NT_F32, 1, &two))) goto done;
  for (int i = 0; i < n_steps; i++) {
    float xv[2] = {-amaxes[i], amaxes[i] * 0.5f};
    nt_test_upload(ctx, &x, xv);
    for (int k = 0; k < 2; k++) {
      CHECK_OK(ctx, nt_fp8_record_amax(ctx, st[k], 0, &x));
      CHECK_OK(ctx, nt_fp8_update(ctx, st[k]));
      /* Reference. */
      float *h = ref_hist[k];
      h[0] = fabsf(amaxes[i]);
      float m = 0;
      bool nan = false;
      for (int j = 0; j < 4; j++) { if (isnan(h[j])) nan = true; else if (h[j] > m) m = h[j]; }
      if (!nan && isfinite(m) && m > 0) {
        float sc = ldexpf(nt_fp8_max(fmts[k]) / m, -k);
        ref_scale[k] = isinf(sc) ? 3.4028235e38f : sc;
      }
      memmove(h + 1, h, 3 * sizeof(float));
      h[0] = 0;
      float scale, scale_inv, hist[4];
      if (!CHECK_OK(ctx, nt_fp8_read(ctx, st[k], 0, &scale, &scale_inv, hist))) goto done;
      CHECK(memcmp(&scale, &ref_scale[k], 4) == 0 && scale_inv == 1.0f / scale,
            "fp8 tensor %d step %d (amax %g): scale %.9g, expected %.9g", k, i, (double)amaxes[i],
            (double)scale, (double)ref_scale[k]);
      bool same = true;
      for (int j = 0; j < 4; j++) same = same && (memcmp(&hist[j], &h[j], 4) == 0 || (isnan(hist[j]) && isnan(h[j])));
      CHECK(same, "fp8 tensor %d step %d: history %g %g %g %g, expected %g %g %g %g", k, i,
            (double)hist[0], (double)hist[1], (double)hist[2], (double)hist[3], (double)h[0],
            (double)h[1], (double)h[2], (double)h[3]);
    }
  }
  /* Spot values: E4M3 after the first two steps: 448/2 then 448/4. */
  {
    nt_fp8_state *q = NULL;
    o.margin = 0;
    float sc = 0;
    if (CHECK_OK(ctx, nt_fp8_state_create(ctx, &o, fmts, 2, &q))) {
      nt_tensor a = nt_fp8_amax_tensor(q, 1);
      float v = 7.0f;
      nt_test_upload(ctx, &a, &v);
      CHECK_OK(ctx, nt_fp8_update(ctx, q));
      CHECK_OK(ctx, nt_fp8_read(ctx, q, 1, &sc, NULL, NULL));
      CHECK(sc == 57344.0f / 7.0f, "E5M2 scale %g", (double)sc);
      CHECK_OK(ctx, nt_fp8_read(ctx, q, 0, &sc, NULL, NULL));
      CHECK(sc == 1.0f, "a tensor without amax keeps scale 1 (%g)", (double)sc);
      CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_fp8_read(ctx, q, 2, &sc, NULL, NULL));
      nt_fp8_state_free(ctx, q);
    }
  }
done:
  nt_tensor_free(ctx, &x);
  nt_fp8_state_free(ctx, st[0]);
  nt_fp8_state_free(ctx, st[1]);
}

#if defined(NT_TEST_GPU) && defined(NT_HAVE_CUDA)
#include <cuda_runtime_api.h>
/* The AMP step (grads in, unscale + check, AdamW with the device lr, scaler update) captured
 * once as a CUDA graph and replayed must match the eager steps bit for bit, overflow included:
 * nothing in the step depends on host values that change between steps. */
static void test_graph(nt_ctx *ctx) {
  enum { NG = 1001, NSTEP = 6 };
  int64_t n = NG;
  nt_param_unit u[2];
  nt_adamw *opt[2] = {NULL, NULL};
  nt_scaler *sc[2] = {NULL, NULL};
  nt_tensor staged, lr_t;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaStream_t stream = (cudaStream_t)nt_ctx_stream(ctx);
  float g[NG], p[NG], out[2][NG], sc_out[2];
  memset(u, 0, sizeof u);
  memset(&staged, 0, sizeof staged);
  memset(&lr_t, 0, sizeof lr_t);
  nt_scaler_options so = nt_scaler_defaults();
  so.init_scale = 1024.0f;
  so.growth_interval = 2;
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &staged, NT_F16, 1, &n)) ||
      !CHECK_OK(ctx, nt_tensor_alloc(ctx, &lr_t, NT_F32, 0, NULL)))
    goto done;
  nt_test_rng r = {5u};
  nt_test_fill_uniform(&r, p, NG, -1, 1);
  for (int k = 0; k < 2; k++) {
    if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].params, NT_F16, 1, &n)) ||
        !CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].grads, NT_F16, 1, &n)))
      goto done;
    nt_test_upload(ctx, &u[k].params, p);
    if (!CHECK_OK(ctx, nt_adamw_create(ctx, NULL, &u[k], 1, NULL, 0, &opt[k])) ||
        !CHECK_OK(ctx, nt_scaler_create(ctx, &so, &sc[k])))
      goto done;
  }
  nt_optim_step_args a = nt_optim_args(-1.0);
  a.lr_tensor = &lr_t;
  /* Capture model 1's step: copy the staged grads in, then the AMP step. */
  cudaError_t ce = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  CHECK(ce == cudaSuccess, "begin capture: %s", cudaGetErrorString(ce));
  if (ce != cudaSuccess) goto done;
  nt_status st = nt_tensor_copy(ctx, &u[1].grads, &staged);
  if (!st) st = nt_test_scaled_step(ctx, opt[1], sc[1], &u[1].grads, &a);
  if (!st) st = nt_scaler_update(ctx, sc[1]);
  ce = cudaStreamEndCapture(stream, &graph);
  CHECK(ce == cudaSuccess, "end capture: %s", cudaGetErrorString(ce));
  if (!CHECK_OK(ctx, st) || ce != cudaSuccess) goto done;
  ce = cudaGraphInstantiate(&exec, graph, 0);
  CHECK(ce == cudaSuccess, "instantiate: %s", cudaGetErrorString(ce));
  if (ce != cudaSuccess) goto done;
  for (int s = 0; s < NSTEP; s++) {
    nt_test_rng rg = {100u + (uint64_t)s};
    nt_test_fill_uniform(&rg, g, NG, -512, 512);
    if (s == 3) g[17] = INFINITY;
    float lr = 1e-3f * (float)(s + 1);
    nt_test_upload(ctx, &staged, g);
    nt_test_upload(ctx, &lr_t, &lr);
    /* Eager model 0. */
    CHECK_OK(ctx, nt_tensor_copy(ctx, &u[0].grads, &staged));
    CHECK_OK(ctx, nt_test_scaled_step(ctx, opt[0], sc[0], &u[0].grads, &a));
    CHECK_OK(ctx, nt_scaler_update(ctx, sc[0]));
    /* Replayed model 1. */
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "graph launch");
  }
  for (int k = 0; k < 2; k++) {
    nt_tensor master;
    nt_scaler_values v;
    nt_adamw_state_views(opt[k], 0, &master, NULL, NULL);
    nt_test_download(ctx, &master, out[k]);
    CHECK_OK(ctx, nt_scaler_read(ctx, sc[k], &v));
    sc_out[k] = v.scale;
    if (k == 1) CHECK(v.skipped_total == 1, "graph run skipped %lld steps", (long long)v.skipped_total);
  }
  CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0 && sc_out[0] == sc_out[1],
        "CUDA graph replay differs from the eager steps (scale %g vs %g)", (double)sc_out[1],
        (double)sc_out[0]);
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  for (int k = 0; k < 2; k++) {
    nt_adamw_free(ctx, opt[k]);
    nt_scaler_free(ctx, sc[k]);
    nt_tensor_free(ctx, &u[k].params);
    nt_tensor_free(ctx, &u[k].grads);
  }
  nt_tensor_free(ctx, &staged);
  nt_tensor_free(ctx, &lr_t);
}
#endif

int main(void) {
  nt_ctx *cpu = NULL;
  if (nt_ctx_create(&cpu, nt_cpu()) != NT_OK) return 1;
#ifdef NT_TEST_GPU
  nt_ctx *ctx = nt_test_cuda_ctx();
  if (!ctx) {
    nt_ctx_free(cpu);
    return nt_test_skip("no GPU");
  }
  double gpu32[STEPS], cpu32[STEPS];
  test_curves(ctx, gpu32);
  /* The GPU's fp32 curve against the CPU's (GEMM reduction orders differ). */
  model m;
  if (model_init(cpu, NT_PREC_FP32, &m) && train(&m, 0, STEPS, cpu32, -1)) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(gpu32[s] - cpu32[s]) / cpu32[s]);
    printf("GPU vs CPU fp32 curve: worst relative difference %.2g\n", worst);
    /* about twice the H200's 3.7e-7 (2026-12-04 03:20) */
    CHECK(worst < 7e-7, "GPU fp32 curve differs from the CPU's by %.3g", worst);
  }
  model_free(&m);
  test_inject(ctx);
  test_resume(ctx);
  test_policy(ctx);
  test_fp8(ctx);
#ifdef NT_HAVE_CUDA
  test_graph(ctx);
#endif
  nt_ctx_free(ctx);
#else
  test_curves(cpu, NULL);
  test_inject(cpu);
  test_resume(cpu);
  test_policy(cpu);
  test_fp8(cpu);
#endif
  nt_ctx_free(cpu);
  return nt_test_finish();
}
