/* Linear on the CPU: forward (none, relu, gelu with the pre-activation) against fp64, backward
 * against central finite differences of a loss computed in double, gradients accumulate (+=),
 * the bias-gradient paths (column sums, alone, non-F32), bf16, the _ex options (dx
 * overwritten, a preceding GELU's backward fused into dx), and argument errors. */
#include "tests/testutil.h"
#include "ops/linear.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B0 = 2, B1 = 3, IN = 7, OUT = 5, R = B0 * B1 };

static double gelu_d(double x) {
  return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* Values rounded through dtype dt, kept as floats and stored in mem. */
static void fill(nt_test_rng *r, nt_dtype dt, void *mem, float *vals, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    nt_store_f32(mem, dt, i, (float)nt_test_uniform(r, -1, 1));
    vals[i] = nt_load_f32(mem, dt, i);
  }
}

static void test_forward(nt_ctx *ctx, nt_dtype dt) {
  nt_test_rng r = {42 + dt};
  float xv[R * IN], wv[OUT * IN], bv[OUT];
  uint32_t xm[R * IN], wm[OUT * IN], ym[R * OUT], pm[R * OUT];
  float bm[OUT];
  fill(&r, dt, xm, xv, R * IN);
  fill(&r, dt, wm, wv, OUT * IN);
  fill(&r, NT_F32, bm, bv, OUT);
  nt_tensor x = nt_tensor_view(xm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor w = nt_tensor_view(wm, dt, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor b = nt_tensor_view(bm, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  nt_tensor y = nt_tensor_view(ym, dt, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  nt_tensor pre = nt_tensor_view(pm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  /* about twice the measured (docs/tolerances.md) */
  double tol = dt == NT_F32 ? 1.3e-7 : dt == NT_F16 ? 5e-4 : 3.3e-3;
  for (int act = NT_ACT_NONE; act <= NT_ACT_RELU; act++)
    for (int with_b = 0; with_b < 2; with_b++) {
      if (!CHECK_OK(ctx, nt_linear_forward(ctx, &x, &w, with_b ? &b : NULL, &y,
                                           (nt_activation)act, &pre)))
        continue;
      double ref[R * OUT], pref[R * OUT], got[R * OUT], gotp[R * OUT];
      for (int i = 0; i < R; i++)
        for (int o = 0; o < OUT; o++) {
          double s = with_b ? bv[o] : 0;
          for (int k = 0; k < IN; k++) s += (double)xv[i * IN + k] * wv[o * IN + k];
          pref[i * OUT + o] = s;
          ref[i * OUT + o] = act == NT_ACT_GELU ? gelu_d(s) : act == NT_ACT_RELU ? fmax(s, 0) : s;
          got[i * OUT + o] = nt_load_f32(ym, dt, i * OUT + o);
          gotp[i * OUT + o] = nt_load_f32(pm, dt, i * OUT + o);
        }
      double e = nt_test_rel_err_d(got, ref, R * OUT);
      CHECK(nt_test_note(dt, e) < tol, "%s forward act %d bias %d: rel err %.3g", nt_dtype_name(dt), act, with_b, e);
      if (act == NT_ACT_GELU) {
        e = nt_test_rel_err_d(gotp, pref, R * OUT);
        CHECK(nt_test_note(dt, e) < tol, "%s forward gelu pre-activation rel err %.3g", nt_dtype_name(dt), e);
      }
    }
  /* A residual added in the GEMM: into a fresh y, then in place (y is its own residual). */
  uint32_t resm[R * OUT];
  float resv[R * OUT];
  fill(&r, dt, resm, resv, R * OUT);
  nt_tensor res = nt_tensor_view(resm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  double ref[R * OUT], got[R * OUT];
  for (int i = 0; i < R; i++)
    for (int o = 0; o < OUT; o++) {
      double s = bv[o] + resv[i * OUT + o];
      for (int k = 0; k < IN; k++) s += (double)xv[i * IN + k] * wv[o * IN + k];
      ref[i * OUT + o] = s;
    }
  for (int inplace = 0; inplace < 2; inplace++) {
    if (inplace) memcpy(ym, resm, sizeof resm);
    nt_linear_fwd_opts fo = {.residual = inplace ? &y : &res};
    if (!CHECK_OK(ctx, nt_linear_forward_ex(ctx, &x, &w, &b, &y, NT_ACT_NONE, NULL, &fo))) return;
    for (int i = 0; i < R * OUT; i++) got[i] = nt_load_f32(ym, dt, i);
    double e = nt_test_rel_err_d(got, ref, R * OUT);
    CHECK(e < tol, "%s forward + residual%s: rel err %.3g", nt_dtype_name(dt),
          inplace ? " (in place)" : "", e);
  }
}

/* loss = sum(y * g) in double, y = x W^T + b computed by nt_linear_forward in fp32. */
static double loss(nt_ctx *ctx, nt_tensor *x, nt_tensor *w, nt_tensor *b, const float *g) {
  float y[R * OUT];
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  if (nt_linear_forward(ctx, x, w, b, &yt, NT_ACT_NONE, NULL)) return NAN;
  double s = 0;
  for (int i = 0; i < R * OUT; i++) s += (double)y[i] * g[i];
  return s;
}

static void fd_grad(nt_ctx *ctx, nt_tensor *x, nt_tensor *w, nt_tensor *b, const float *g,
                    float *param, int n, double *out) {
  const float eps = 1e-2f;  /* the loss is linear in each parameter: no truncation error */
  for (int i = 0; i < n; i++) {
    float keep = param[i];
    param[i] = keep + eps;
    double lp = loss(ctx, x, w, b, g);
    param[i] = keep - eps;
    double lm = loss(ctx, x, w, b, g);
    param[i] = keep;
    out[i] = (lp - lm) / (2.0 * (double)eps);
  }
}

static void test_backward_fd(nt_ctx *ctx) {
  nt_test_rng r = {7};
  float xv[R * IN], wv[OUT * IN], bv[OUT], g[R * OUT];
  nt_test_fill_uniform(&r, xv, R * IN, -1, 1);
  nt_test_fill_uniform(&r, wv, OUT * IN, -1, 1);
  nt_test_fill_uniform(&r, bv, OUT, -1, 1);
  nt_test_fill_uniform(&r, g, R * OUT, -1, 1);
  nt_tensor x = nt_tensor_view(xv, NT_F32, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor w = nt_tensor_view(wv, NT_F32, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor b = nt_tensor_view(bv, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  nt_tensor dy = nt_tensor_view(g, NT_F32, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  float dx[R * IN] = {0}, dw[OUT * IN] = {0}, db[OUT] = {0};
  nt_tensor dxt = nt_tensor_view(dx, NT_F32, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor dwt = nt_tensor_view(dw, NT_F32, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor dbt = nt_tensor_view(db, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  if (!CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, &dxt, &dwt, &dbt))) return;
  double fx[R * IN], fw[OUT * IN], fb[OUT], ax[R * IN], aw[OUT * IN], ab[OUT];
  fd_grad(ctx, &x, &w, &b, g, xv, R * IN, fx);
  fd_grad(ctx, &x, &w, &b, g, wv, OUT * IN, fw);
  fd_grad(ctx, &x, &w, &b, g, bv, OUT, fb);
  for (int i = 0; i < R * IN; i++) ax[i] = dx[i];
  for (int i = 0; i < OUT * IN; i++) aw[i] = dw[i];
  for (int i = 0; i < OUT; i++) ab[i] = db[i];
  double ex = nt_test_rel_err_d(ax, fx, R * IN), ew = nt_test_rel_err_d(aw, fw, OUT * IN);
  double eb = nt_test_rel_err_d(ab, fb, OUT);
  CHECK(ex < 1e-3, "dx vs finite differences: %.3g", ex);
  CHECK(ew < 1e-3, "dW vs finite differences: %.3g", ew);
  CHECK(eb < 1e-3, "db vs finite differences: %.3g", eb);

  /* Accumulation: a second call adds the same gradients again. */
  if (!CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, &dxt, &dwt, &dbt))) return;
  double e2 = 0;
  for (int i = 0; i < R * IN; i++) e2 = fmax(e2, fabs(dx[i] - 2 * ax[i]));
  for (int i = 0; i < OUT * IN; i++) e2 = fmax(e2, fabs(dw[i] - 2 * aw[i]));
  for (int i = 0; i < OUT; i++) e2 = fmax(e2, fabs(db[i] - 2 * ab[i]));
  CHECK(e2 < 1e-5, "second backward doubles every gradient (max dev %.3g)", e2);

  /* db alone (no dW: the column sums) and only dx. */
  float db2[OUT] = {0}, dx2[R * IN] = {0};
  nt_tensor db2t = nt_tensor_view(db2, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  nt_tensor dx2t = nt_tensor_view(dx2, NT_F32, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, NULL, NULL, &db2t));
  CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, &dx2t, NULL, NULL));
  double e3 = 0;
  for (int i = 0; i < OUT; i++) e3 = fmax(e3, fabs(db2[i] - ab[i]));
  for (int i = 0; i < R * IN; i++) e3 = fmax(e3, fabs(dx2[i] - ax[i]));
  CHECK(e3 < 1e-5, "db alone / dx alone match (max dev %.3g)", e3);
}

/* bf16 activations and weights, fp32 weight/bias gradients (the mixed-precision layout), and
 * bf16 gradients with a bf16 db (the ones-vector path), against fp64. */
static void test_backward_bf16(nt_ctx *ctx) {
  nt_test_rng r = {9};
  uint16_t xm[R * IN], wm[OUT * IN], gm[R * OUT], dxm[R * IN], dwm[OUT * IN], dbm[OUT];
  float xv[R * IN], wv[OUT * IN], gv[R * OUT], dwf[OUT * IN], dbf[OUT];
  fill(&r, NT_BF16, xm, xv, R * IN);
  fill(&r, NT_BF16, wm, wv, OUT * IN);
  fill(&r, NT_BF16, gm, gv, R * OUT);
  memset(dxm, 0, sizeof dxm); memset(dwm, 0, sizeof dwm); memset(dbm, 0, sizeof dbm);
  for (int i = 0; i < OUT * IN; i++) dwf[i] = 0.5f;
  for (int i = 0; i < OUT; i++) dbf[i] = -0.25f;
  nt_tensor x = nt_tensor_view(xm, NT_BF16, nt_cpu(), 2, (int64_t[]){R, IN});
  nt_tensor w = nt_tensor_view(wm, NT_BF16, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor dy = nt_tensor_view(gm, NT_BF16, nt_cpu(), 2, (int64_t[]){R, OUT});
  nt_tensor dx = nt_tensor_view(dxm, NT_BF16, nt_cpu(), 2, (int64_t[]){R, IN});
  nt_tensor dwF = nt_tensor_view(dwf, NT_F32, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor dbF = nt_tensor_view(dbf, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  nt_tensor dwB = nt_tensor_view(dwm, NT_BF16, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor dbB = nt_tensor_view(dbm, NT_BF16, nt_cpu(), 1, (int64_t[]){OUT});
  if (!CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, &dx, &dwF, &dbF))) return;
  if (!CHECK_OK(ctx, nt_linear_backward(ctx, &dy, &x, &w, NULL, &dwB, &dbB))) return;
  double rdx[R * IN], rdw[OUT * IN], rdb[OUT], g1[R * IN], g2[OUT * IN], g3[OUT], g4[OUT * IN];
  double g5[OUT];
  for (int i = 0; i < R; i++)
    for (int k = 0; k < IN; k++) {
      double s = 0;
      for (int o = 0; o < OUT; o++) s += (double)gv[i * OUT + o] * wv[o * IN + k];
      rdx[i * IN + k] = s;
      g1[i * IN + k] = nt_load_f32(dxm, NT_BF16, i * IN + k);
    }
  for (int o = 0; o < OUT; o++) {
    double sb = 0;
    for (int i = 0; i < R; i++) sb += gv[i * OUT + o];
    rdb[o] = sb;
    g3[o] = dbf[o] + 0.25;
    g5[o] = nt_load_f32(dbm, NT_BF16, o);
    for (int k = 0; k < IN; k++) {
      double s = 0;
      for (int i = 0; i < R; i++) s += (double)gv[i * OUT + o] * xv[i * IN + k];
      rdw[o * IN + k] = s;
      g2[o * IN + k] = dwf[o * IN + k] - 0.5;
      g4[o * IN + k] = nt_load_f32(dwm, NT_BF16, o * IN + k);
    }
  }
  double e1 = nt_test_rel_err_d(g1, rdx, R * IN), e2 = nt_test_rel_err_d(g2, rdw, OUT * IN);
  double e3 = nt_test_rel_err_d(g3, rdb, OUT), e4 = nt_test_rel_err_d(g4, rdw, OUT * IN);
  double e5 = nt_test_rel_err_d(g5, rdb, OUT);
  CHECK(e1 < 1e-2, "bf16 dx rel err %.3g", e1);
  CHECK(e2 < 1e-5, "bf16 inputs, f32 dW accumulated rel err %.3g", e2);
  CHECK(e3 < 1e-5, "bf16 inputs, f32 db (column sums) accumulated rel err %.3g", e3);
  CHECK(e4 < 1e-2, "bf16 dW rel err %.3g", e4);
  CHECK(e5 < 1e-2, "bf16 db (ones-vector GEMM) rel err %.3g", e5);
}

static double gelu_grad_d(double x) {
  const double s = 0.7978845608028654, c = 0.044715;
  double t = tanh(s * (x + c * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
}

/* loss(pre) = sum(g * (gelu(pre) W^T)) in double: the bias does not depend on pre. */
static double loss_of_pre(const double *pre, const float *wv, const float *g) {
  double s = 0;
  for (int i = 0; i < R; i++)
    for (int o = 0; o < OUT; o++) {
      double y = 0;
      for (int k = 0; k < IN; k++) y += gelu_d(pre[i * IN + k]) * wv[o * IN + k];
      s += y * g[i * OUT + o];
    }
  return s;
}

/* nt_linear_backward_ex: overwrite_dx ignores (NaN-filled) dx; dgelu_pre gives the gradient of
 * the pre-activation (F32: against finite differences of a double loss; bf16: against fp64
 * with the rounded inputs); dW and db still accumulate; a second call gives the same dx. */
static void test_backward_ex(nt_ctx *ctx, nt_dtype dt) {
  nt_test_rng r = {31 + dt};
  uint32_t prem[R * IN], xm[R * IN], wm[OUT * IN], gm[R * OUT], dxm[R * IN];
  float prev[R * IN], xv[R * IN], wv[OUT * IN], gv[R * OUT], dwf[OUT * IN], dbf[OUT];
  for (int i = 0; i < R * IN; i++) {
    nt_store_f32(prem, dt, i, (float)nt_test_uniform(&r, -2, 2));
    prev[i] = nt_load_f32(prem, dt, i);
    nt_store_f32(xm, dt, i, (float)gelu_d(prev[i]));   /* x = gelu(pre), as the forward */
    xv[i] = nt_load_f32(xm, dt, i);
  }
  fill(&r, dt, wm, wv, OUT * IN);
  fill(&r, dt, gm, gv, R * OUT);
  for (int i = 0; i < OUT * IN; i++) dwf[i] = 0.5f;
  for (int i = 0; i < OUT; i++) dbf[i] = -0.25f;
  nt_tensor pre = nt_tensor_view(prem, dt, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor x = nt_tensor_view(xm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor w = nt_tensor_view(wm, dt, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor dy = nt_tensor_view(gm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, OUT});
  nt_tensor dx = nt_tensor_view(dxm, dt, nt_cpu(), 3, (int64_t[]){B0, B1, IN});
  nt_tensor dw = nt_tensor_view(dwf, NT_F32, nt_cpu(), 2, (int64_t[]){OUT, IN});
  nt_tensor db = nt_tensor_view(dbf, NT_F32, nt_cpu(), 1, (int64_t[]){OUT});
  double tol = dt == NT_F32 ? 1.3e-7 : dt == NT_F16 ? 5e-4 : 3.5e-3;   /* twice the measured */
  /* reference gradients: dy W, its product with gelu'(pre), dy^T x, column sums of dy */
  double rdx[R * IN], rdp[R * IN], rdw[OUT * IN], rdb[OUT], got[R * IN];
  for (int i = 0; i < R; i++)
    for (int k = 0; k < IN; k++) {
      double s = 0;
      for (int o = 0; o < OUT; o++) s += (double)gv[i * OUT + o] * wv[o * IN + k];
      rdx[i * IN + k] = s;
      rdp[i * IN + k] = s * gelu_grad_d(prev[i * IN + k]);
    }
  for (int o = 0; o < OUT; o++) {
    rdb[o] = 0;
    for (int i = 0; i < R; i++) rdb[o] += gv[i * OUT + o];
    for (int k = 0; k < IN; k++) {
      double s = 0;
      for (int i = 0; i < R; i++) s += (double)gv[i * OUT + o] * xv[i * IN + k];
      rdw[o * IN + k] = s;
    }
  }
  if (dt == NT_F32) {
    /* the analytic reference itself against central differences in double */
    double pd[R * IN], fd[R * IN];
    for (int i = 0; i < R * IN; i++) pd[i] = prev[i];
    for (int i = 0; i < R * IN; i++) {
      const double eps = 1e-5;
      double keep = pd[i];
      pd[i] = keep + eps;
      double lp = loss_of_pre(pd, wv, gv);
      pd[i] = keep - eps;
      double lm = loss_of_pre(pd, wv, gv);
      pd[i] = keep;
      fd[i] = (lp - lm) / (2 * eps);
    }
    double e = nt_test_rel_err_d(rdp, fd, R * IN);
    CHECK(e < 1e-7, "gelu-fused dx reference vs finite differences: %.3g", e);
  }
  for (int rep = 0; rep < 2; rep++) {
    for (int i = 0; i < R * IN; i++) nt_store_f32(dxm, dt, i, NAN);
    nt_linear_bwd_opts o = {.overwrite_dx = true, .dgelu_pre = &pre};
    if (!CHECK_OK(ctx, nt_linear_backward_ex(ctx, &dy, &x, &w, &dx, &dw, &db, &o))) return;
    for (int i = 0; i < R * IN; i++) got[i] = nt_load_f32(dxm, dt, i);
    double e = nt_test_rel_err_d(got, rdp, R * IN);
    CHECK(nt_test_note(dt, e) < tol, "%s call %d: gelu-fused overwritten dx rel err %.3g", nt_dtype_name(dt), rep, e);
    double gw[OUT * IN], gb[OUT], scale = rep + 1;
    for (int i = 0; i < OUT * IN; i++) gw[i] = (dwf[i] - 0.5) / scale;
    for (int i = 0; i < OUT; i++) gb[i] = (dbf[i] + 0.25) / scale;
    double ew = nt_test_rel_err_d(gw, rdw, OUT * IN), eb = nt_test_rel_err_d(gb, rdb, OUT);
    CHECK(ew < 1e-5 && eb < 1e-5, "%s call %d: dW, db accumulate (rel err %.3g, %.3g)",
          nt_dtype_name(dt), rep, ew, eb);
  }
  /* overwrite alone: dx = dy W, NaN in dx not read, dW/db skipped */
  for (int i = 0; i < R * IN; i++) nt_store_f32(dxm, dt, i, NAN);
  nt_linear_bwd_opts o = {.overwrite_dx = true};
  if (!CHECK_OK(ctx, nt_linear_backward_ex(ctx, &dy, &x, &w, &dx, NULL, NULL, &o))) return;
  for (int i = 0; i < R * IN; i++) got[i] = nt_load_f32(dxm, dt, i);
  double e = nt_test_rel_err_d(got, rdx, R * IN);
  CHECK(nt_test_note(dt, e) < tol, "%s: overwritten dx rel err %.3g", nt_dtype_name(dt), e);
  /* NULL options accumulate, as nt_linear_backward */
  if (!CHECK_OK(ctx, nt_linear_backward_ex(ctx, &dy, &x, &w, &dx, NULL, NULL, NULL))) return;
  for (int i = 0; i < R * IN; i++) got[i] = nt_load_f32(dxm, dt, i) / 2.0;
  e = nt_test_rel_err_d(got, rdx, R * IN);
  CHECK(nt_test_note(dt, e) < tol, "%s: NULL options accumulate (rel err %.3g)", nt_dtype_name(dt), e);
}

static void test_errors(nt_ctx *ctx) {
  float buf[256];
  nt_tensor x = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 6});
  nt_tensor w = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){5, 7});
  nt_tensor y = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 5});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_forward(ctx, &x, &w, NULL, &y, NT_ACT_NONE, NULL));
  x.shape[1] = 7;
  nt_tensor w3 = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){1, 5, 7});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_forward(ctx, &x, &w3, NULL, &y, NT_ACT_NONE, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_linear_forward(ctx, &x, &w, NULL, &y, NT_ACT_GELU, NULL));
  nt_tensor y3 = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){2, 2, 5});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_forward(ctx, &x, &w, NULL, &y3, NT_ACT_NONE, NULL));
  nt_tensor wb = w;
  wb.dtype = NT_BF16;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_linear_forward(ctx, &x, &wb, NULL, &y, NT_ACT_NONE, NULL));
  nt_tensor b = nt_tensor_view(buf, NT_F32, nt_cpu(), 1, (int64_t[]){4});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_forward(ctx, &x, &w, &b, &y, NT_ACT_NONE, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_backward(ctx, &y, &x, &w, NULL, NULL, &b));
  nt_tensor dx = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 6});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_backward(ctx, &y, &x, &w, &dx, NULL, NULL));
  nt_tensor yb = y;
  yb.dtype = NT_BF16;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_linear_backward(ctx, &yb, &x, &w, NULL, NULL, NULL));
  /* _ex: the fused GELU backward needs dx overwritten, a dx, and a pre of x's shape and dx's
   * dtype that does not overlap dx */
  float pbuf[64], dbuf[64];
  nt_tensor pre = nt_tensor_view(pbuf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 7});
  nt_tensor dx7 = nt_tensor_view(dbuf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 7});
  nt_linear_bwd_opts o = {.dgelu_pre = &pre};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_linear_backward_ex(ctx, &y, &x, &w, &dx7, NULL, NULL, &o));
  o.overwrite_dx = true;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_linear_backward_ex(ctx, &y, &x, &w, NULL, NULL, NULL, &o));
  nt_tensor pre6 = nt_tensor_view(pbuf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 6});
  o.dgelu_pre = &pre6;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_backward_ex(ctx, &y, &x, &w, &dx7, NULL, NULL, &o));
  nt_tensor preb = pre;
  preb.dtype = NT_BF16;
  o.dgelu_pre = &preb;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_linear_backward_ex(ctx, &y, &x, &w, &dx7, NULL, NULL, &o));
  nt_tensor pre_in_dx = nt_tensor_view(dbuf + 3, NT_F32, nt_cpu(), 2, (int64_t[]){4, 7});
  o.dgelu_pre = &pre_in_dx;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_linear_backward_ex(ctx, &y, &x, &w, &dx7, NULL, NULL, &o));
  /* the residual has y's shape */
  nt_tensor r3 = nt_tensor_view(pbuf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 4});
  nt_linear_fwd_opts fo = {.residual = &r3};
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_linear_forward_ex(ctx, &x, &w, NULL, &y, NT_ACT_NONE, NULL, &fo));
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_forward(ctx, NT_F32);
  test_forward(ctx, NT_BF16);
  test_forward(ctx, NT_F16);
  test_backward_fd(ctx);
  test_backward_bf16(ctx);
  test_backward_ex(ctx, NT_F32);
  test_backward_ex(ctx, NT_BF16);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
