/* The unscale folded into the clipping coefficient (nt_optim_step_args.grad_scale, the
 * trainer's path with clipping on). A power-of-two factor gives the unscaled step's bits, with
 * clipping acting and with a coefficient of 1 (a large or infinite max_norm); a gradient that
 * is not finite, squares that overflow fp32, and a loss scale below 2^-127 (1/scale is inf)
 * set found_inf and skip the step; a factor of 1/3 (grad_divisor 3) gives the rule's
 * coefficient, within rounding of unscale-then-clip; without found_inf nothing is checked;
 * max_norm inf equals no clipping; argument errors.
 * Compiled twice: the CPU test, and with NT_TEST_GPU (gpu_test_grad_scale.c), where every case
 * runs on the GPU and the grad_divisor case must also give the CPU's bits. */
#include "testutil.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "amp/scaler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 1003
#define SCALE 4096.0f

typedef struct {
  float p0[N];    /* initial parameters */
  float g[N];     /* unscaled gradients */
  float gs[N];    /* g * SCALE (exact: a power of two) */
} data;

static void make_data(data *d) {
  nt_test_rng r = {4242};
  nt_test_fill_uniform(&r, d->p0, N, -1, 1);
  nt_test_fill_uniform(&r, d->g, N, -3, 3);
  for (int i = 0; i < N; i++) d->gs[i] = d->g[i] * SCALE;
}

/* A scalar F32 tensor on ctx's device holding x. */
static bool scalar(nt_ctx *ctx, nt_tensor *t, float x) {
  memset(t, 0, sizeof *t);
  return CHECK_OK(ctx, nt_tensor_alloc(ctx, t, NT_F32, 0, NULL)) && nt_test_upload(ctx, t, &x);
}

/* One AdamW step (lr 0.01) of a fresh optimizer over p0 with gradients g and the step
 * arguments a (lr and max_norm, and found_inf/grad_scale when given): *p gets the master
 * weights after it, *t the step counter. */
static bool adamw_once(nt_ctx *ctx, const float *p0, const float *g, nt_optim_step_args a,
                       float *p, int32_t *t) {
  int64_t n = N;
  nt_param_unit u;
  nt_adamw *opt = NULL;
  nt_tensor master;
  memset(&u, 0, sizeof u);
  a.lr = 0.01;
  bool ok = CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F32, 1, &n)) &&
            CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &n)) &&
            nt_test_upload(ctx, &u.params, p0) && nt_test_upload(ctx, &u.grads, g) &&
            CHECK_OK(ctx, nt_adamw_create(ctx, NULL, &u, 1, NULL, 0, &opt)) &&
            CHECK_OK(ctx, nt_adamw_step(ctx, opt, &a)) &&
            CHECK_OK(ctx, nt_adamw_state_views(opt, 0, &master, NULL, NULL)) &&
            nt_test_download(ctx, &master, p) && CHECK_OK(ctx, nt_adamw_get_step(ctx, opt, t));
  nt_adamw_free(ctx, opt);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
  return ok;
}

static float read_scalar(nt_ctx *ctx, const nt_tensor *t) {
  float x = -1.0f;
  nt_test_download(ctx, t, &x);
  return x;
}

/* Scaled gradients with grad_scale = 1/SCALE give the unscaled step's bits and leave found_inf
 * at 0; without found_inf, the same bits. */
static void test_power_of_two(nt_ctx *ctx, const data *d, float max_norm) {
  static float ref[N], out[N];
  nt_tensor inv, found;
  int32_t t0 = 0, t1 = 0, t2 = 0;
  if (!scalar(ctx, &inv, 1.0f / SCALE) || !scalar(ctx, &found, 0.0f)) goto done;
  nt_optim_step_args a = nt_optim_args(0.0);
  a.max_norm = max_norm;
  if (!adamw_once(ctx, d->p0, d->g, a, ref, &t0)) goto done;
  a.grad_scale = &inv;
  if (!adamw_once(ctx, d->p0, d->gs, a, out, &t1)) goto done;
  CHECK(t1 == 1 && !memcmp(ref, out, sizeof ref),
        "max_norm %g, no found_inf: step %d, the unscaled bits %d", (double)max_norm, t1,
        !memcmp(ref, out, sizeof ref));
  a.found_inf = &found;
  if (!adamw_once(ctx, d->p0, d->gs, a, out, &t2)) goto done;
  CHECK(t0 == 1 && t2 == 1 && read_scalar(ctx, &found) == 0.0f && !memcmp(ref, out, sizeof ref),
        "max_norm %g: step %d/%d, found_inf %g, the unscaled bits %d", (double)max_norm, t0, t2,
        (double)read_scalar(ctx, &found), !memcmp(ref, out, sizeof ref));
done:
  nt_tensor_free(ctx, &inv);
  nt_tensor_free(ctx, &found);
}

/* max_norm inf is accepted and clips nothing: the unclipped step's bits. */
static void test_inf_max_norm(nt_ctx *ctx, const data *d) {
  static float ref[N], out[N];
  int32_t t0 = 0, t1 = 0;
  nt_optim_step_args a = nt_optim_args(0.0);
  if (!adamw_once(ctx, d->p0, d->g, a, ref, &t0)) return;
  a.max_norm = INFINITY;
  if (!adamw_once(ctx, d->p0, d->g, a, out, &t1)) return;
  CHECK(t0 == 1 && t1 == 1 && !memcmp(ref, out, sizeof ref), "max_norm inf is no clipping");
}

/* The step with grad_scale inv and found_inf is skipped: found_inf 1, step counter 0,
 * parameters bitwise p0. */
static void expect_skip(nt_ctx *ctx, const data *d, const float *g, const nt_tensor *inv,
                        const nt_tensor *found, const char *what) {
  static float out[N];
  int32_t t = -1;
  nt_optim_step_args a = nt_optim_args(0.0);
  a.max_norm = 0.5f;
  a.grad_scale = inv;
  a.found_inf = found;
  if (!adamw_once(ctx, d->p0, g, a, out, &t)) return;
  float fl = read_scalar(ctx, found);
  CHECK(fl == 1.0f && t == 0 && !memcmp(out, d->p0, sizeof out),
        "%s: found_inf %g, step %d, params kept %d", what, (double)fl, t,
        !memcmp(out, d->p0, sizeof out));
}

/* A gradient that is inf or NaN, or squares that overflow fp32, skip the step; without
 * found_inf the step is applied (no check) and the NaN coefficient reaches the parameters. */
static void test_overflow(nt_ctx *ctx, const data *d) {
  static float g[N], out[N];
  const struct { float x; const char *what; } bad[] = {
      {INFINITY, "inf gradient"}, {NAN, "NaN gradient"}, {3e19f, "squares overflow fp32"}};
  nt_tensor inv, found;
  if (!scalar(ctx, &inv, 1.0f / SCALE) || !scalar(ctx, &found, 0.0f)) goto done;
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    memcpy(g, d->gs, sizeof g);
    g[17] = bad[k].x;
    nt_test_upload(ctx, &found, (float[]){0.0f});
    expect_skip(ctx, d, g, &inv, &found, bad[k].what);
  }
  nt_optim_step_args a = nt_optim_args(0.0);
  a.max_norm = 0.5f;
  a.grad_scale = &inv;
  int32_t t = 0;
  g[17] = NAN;
  if (adamw_once(ctx, d->p0, g, a, out, &t))
    CHECK(t == 1 && isnan(out[0]), "no found_inf: step %d applied, params NaN %d", t,
          isnan(out[0]));
done:
  nt_tensor_free(ctx, &inv);
  nt_tensor_free(ctx, &found);
}

/* A loss scale backed off below 2^-127: the scaler's inv_scale = (float)(1 / scale) is inf,
 * which an unscale pass would turn every gradient into inf or NaN with. The folded step is
 * skipped as well, for finite gradients and for zero ones (0 * inf is NaN). */
static void test_scale_underflow(nt_ctx *ctx, const data *d) {
  static float zeros[N];
  nt_scaler_options so = nt_scaler_defaults();
  so.init_scale = ldexpf(1.0f, -127);
  nt_scaler *sc = NULL;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &so, &sc))) return;
  nt_tensor found = nt_scaler_found_inf_tensor(sc), inv = nt_scaler_inv_scale_tensor(sc);
  nt_scaler_values v;
  bool ok = CHECK_OK(ctx, nt_scaler_unscale(ctx, sc, NULL, 0)) &&
            CHECK_OK(ctx, nt_scaler_step(ctx, sc, NULL, 0, NULL)) &&
            nt_test_upload(ctx, &found, (float[]){1.0f}) &&   /* an overflow: back off */
            CHECK_OK(ctx, nt_scaler_update(ctx, sc)) && CHECK_OK(ctx, nt_scaler_read(ctx, sc, &v));
  if (!ok) goto done;
  CHECK(v.scale == ldexpf(1.0f, -128) && isinf(read_scalar(ctx, &inv)),
        "scale %g after the backoff, inv_scale %g", (double)v.scale,
        (double)read_scalar(ctx, &inv));
  const float *gs[2] = {d->g, zeros};
  const char *what[2] = {"scale 2^-128, finite gradients", "scale 2^-128, zero gradients"};
  for (int k = 0; k < 2; k++) {
    if (!CHECK_OK(ctx, nt_scaler_unscale(ctx, sc, NULL, 0))) break;   /* zeroes found_inf */
    expect_skip(ctx, d, gs[k], &inv, &found, what[k]);
    if (!CHECK_OK(ctx, nt_scaler_step(ctx, sc, NULL, 0, NULL)) ||
        !CHECK_OK(ctx, nt_scaler_update(ctx, sc)))
      break;
  }
done:
  nt_scaler_free(ctx, sc);
}

/* grad_divisor 3 (grad_scale 1/3, no loss scale) through SGD with lr 1 from zero parameters,
 * so the parameters are -(g * coef) exactly. Gradients are multiples of 1/4 below 2, so the
 * sum of squares is exact in any order and the coefficient must be the rule's:
 * min(1, max_norm / (sqrtf(S) * inv + 1e-6)) * inv in fp32 (each operation rounded, no FMA).
 * It is within rounding of unscale-then-clip (not the same bits: 1/3 is not a power of two).
 * out gets the parameters. */
static void test_divisor(nt_ctx *ctx, float *out) {
  static float g[N];
  int64_t n = N;
  nt_param_unit u;
  nt_sgd *opt = NULL;
  nt_tensor inv, master;
  const float third = 1.0f / 3.0f, max_norm = 2.0f;
  double s = 0.0, su = 0.0, err = 0.0;
  memset(&u, 0, sizeof u);
  memset(&inv, 0, sizeof inv);
  for (int i = 0; i < N; i++) {
    g[i] = 0.25f * (float)(i % 15 - 7);
    s += (double)g[i] * g[i];
    su += ((double)g[i] / 3) * ((double)g[i] / 3);
  }
  float total = sqrtf((float)s) * third;
  float c = max_norm / (total + 1e-6f);
  float coef = (c < 1.0f ? c : 1.0f) * third;
  double cu = fmin(1.0, max_norm / (sqrt(su) + 1e-6));
  nt_sgd_options so = nt_sgd_defaults(1.0);
  nt_optim_step_args a = nt_optim_args(1.0);
  a.max_norm = max_norm;
  a.grad_scale = &inv;
  bool ok = scalar(ctx, &inv, third) &&
            CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F32, 1, &n)) &&
            CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &n)) &&
            CHECK_OK(ctx, nt_tensor_zero(ctx, &u.params)) && nt_test_upload(ctx, &u.grads, g) &&
            CHECK_OK(ctx, nt_sgd_create(ctx, &so, &u, 1, NULL, 0, &opt)) &&
            CHECK_OK(ctx, nt_sgd_step(ctx, opt, &a)) &&
            CHECK_OK(ctx, nt_sgd_state_views(opt, 0, &master, NULL)) &&
            nt_test_download(ctx, &master, out);
  if (ok) {
    int bad = -1;
    for (int i = 0; i < N; i++) {
      if (out[i] != -(g[i] * coef) && bad < 0) bad = i;
      double want = -((double)g[i] / 3) * cu;
      if (want != 0.0) err = fmax(err, fabs(out[i] - want) / fabs(want));
    }
    CHECK(c < 1.0f && bad < 0, "grad_divisor 3: clipping acts (c %g), first element off the "
          "rule's coefficient %d", (double)c, bad);
    CHECK(err < 1e-6, "grad_divisor 3: %.3g relative to unscale-then-clip", err);
  }
  nt_sgd_free(ctx, opt);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
  nt_tensor_free(ctx, &inv);
}

/* grad_scale without clipping, and a NaN or negative max_norm, are refused. */
static void test_errors(nt_ctx *ctx, const data *d) {
  int64_t n = N;
  nt_param_unit u;
  nt_adamw *opt = NULL;
  nt_tensor inv;
  memset(&u, 0, sizeof u);
  memset(&inv, 0, sizeof inv);
  bool ok = scalar(ctx, &inv, 1.0f / SCALE) &&
            CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F32, 1, &n)) &&
            CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &n)) &&
            nt_test_upload(ctx, &u.params, d->p0) && nt_test_upload(ctx, &u.grads, d->gs) &&
            CHECK_OK(ctx, nt_adamw_create(ctx, NULL, &u, 1, NULL, 0, &opt));
  if (ok) {
    nt_optim_step_args a = nt_optim_args(0.01);
    a.grad_scale = &inv;
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_step(ctx, opt, &a));
    a.max_norm = NAN;
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_step(ctx, opt, &a));
    a.max_norm = -1.0f;
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_step(ctx, opt, &a));
  }
  nt_adamw_free(ctx, opt);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
  nt_tensor_free(ctx, &inv);
}

static void run_all(nt_ctx *ctx, nt_ctx *cpu) {
  static data d;
  static float div_out[N], div_cpu[N];
  make_data(&d);
  test_power_of_two(ctx, &d, 0.5f);       /* the norm of g (about 55) is clipped */
  test_power_of_two(ctx, &d, 1e30f);      /* a coefficient of 1 */
  test_power_of_two(ctx, &d, INFINITY);
  test_inf_max_norm(ctx, &d);
  test_overflow(ctx, &d);
  test_scale_underflow(ctx, &d);
  test_divisor(ctx, div_out);
  if (cpu) {
    test_divisor(cpu, div_cpu);
    CHECK(!memcmp(div_out, div_cpu, sizeof div_out),
          "grad_divisor 3: the GPU's bits are the CPU's");
  }
  test_errors(ctx, &d);
}

int main(void) { return nt_test_main_on_device(NT_TEST_ON_GPU, run_all); }
