/* FP8 cases run on any context, included by test_fp8_linear.c (a CPU context) and
 * gpu_test_fp8_linear.c (a CUDA one). The fused forms of the FP8 linear backward against the
 * unfused ops on the same context:
 *   - nt_fp8_quantize_dual with gelu_pre and colsum against nt_gelu_backward into a zeroed
 *     tensor followed by the plain dual call: the same bytes in both layouts and the same
 *     amax; the column sums (added to what colsum held) against fp64 sums of that tensor.
 *   - nt_fp8_linear_backward_ex with overwrite_dx and dy_gelu_pre against nt_gelu_backward
 *     and nt_fp8_linear_backward into zeroed outputs: the same dx and dW bits (the same FP8
 *     operands reach the same GEMMs), and db within `db_bound` (the GPU sums in another order);
 *     with an F32 db (the fused pass), a BF16 db and dx alone (the GELU backward in a scratch).
 * dx starts as NaN where overwrite_dx must not read it. And a 2-layer MLP that must learn with
 * FP8 linears (fp8_mlp_ratio). */
#ifndef NT_TESTS_FP8_CASES_H
#define NT_TESTS_FP8_CASES_H
#include "tests/testutil.h"
#include "amp/fp8_linear.h"
#include "ops/elementwise.h"
#include "ops/quantize.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A [rows, cols] tensor of dt on ctx (rows < 0: a 1-D [cols]), filled from h (or with `fill`
 * where h is NULL); FP8 tensors are left unfilled. */
static bool fused_tensor(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int64_t rows, int64_t cols,
                         const float *h, float fill) {
  int64_t shape[2] = {rows, cols};
  int nd = rows < 0 ? 1 : 2;
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, t, dt, nd, nd == 1 ? shape + 1 : shape))) return false;
  if (dt == NT_FP8_E4M3 || dt == NT_FP8_E5M2) return true;
  int64_t n = nt_tensor_numel(t);
  float *f = malloc((size_t)n * sizeof *f + 1);
  for (int64_t i = 0; i < n; i++) f[i] = h ? h[i] : fill;
  bool ok = nt_test_upload(ctx, t, f);
  free(f);
  return ok;
}

/* The bytes of an FP8 tensor on ctx. */
static uint8_t *fused_bytes(nt_ctx *ctx, const nt_tensor *t) {
  int64_t n = nt_tensor_numel(t);
  uint8_t *h = malloc((size_t)n + 1);
  nt_tensor v = nt_tensor_view(h, t->dtype, nt_cpu(), t->ndim, t->shape);
  if (!CHECK_OK(ctx, nt_tensor_copy(ctx, &v, t))) memset(h, 0, (size_t)n);
  return h;
}

static float *fused_floats(nt_ctx *ctx, const nt_tensor *t) {
  float *h = malloc((size_t)nt_tensor_numel(t) * sizeof *h + 1);
  nt_test_download(ctx, t, h);
  return h;
}

/* g = 0 + dy * gelu'(pre) in a new tensor of dy's dtype (the unfused GELU backward). */
static bool fused_gelu_ref(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *pre, nt_tensor *g) {
  return fused_tensor(ctx, g, dy->dtype, dy->shape[0], dy->shape[1], NULL, 0.0f) &&
         CHECK_OK(ctx, nt_gelu_backward(ctx, pre, dy, g));
}

static void fused_dual_case(nt_ctx *ctx, nt_dtype dt, int64_t R, int64_t C, int64_t pad,
                            double cs_bound) {
  nt_test_rng rng = {(uint64_t)(R * 31 + C + dt)};
  float *dyh = malloc(sizeof(float) * (size_t)(R * C)), *preh = malloc(sizeof(float) * (size_t)(R * C));
  nt_test_fill_uniform(&rng, dyh, R * C, -0.05f, 0.05f);
  nt_test_fill_uniform(&rng, preh, R * C, -4.0f, 4.0f);
  const float one = 1.0f, scale = 2048.0f;
  nt_tensor dy = {0}, pre = {0}, g = {0}, y[4] = {{0}}, sc = {0}, am[2] = {{0}}, cs = {0};
  bool ok = fused_tensor(ctx, &dy, dt, R, C, dyh, 0) && fused_tensor(ctx, &pre, dt, R, C, preh, 0) &&
            fused_gelu_ref(ctx, &dy, &pre, &g) &&
            fused_tensor(ctx, &y[0], NT_FP8_E5M2, R, C + pad, NULL, 0) &&
            fused_tensor(ctx, &y[1], NT_FP8_E5M2, C, R + pad, NULL, 0) &&
            fused_tensor(ctx, &y[2], NT_FP8_E5M2, R, C + pad, NULL, 0) &&
            fused_tensor(ctx, &y[3], NT_FP8_E5M2, C, R + pad, NULL, 0) &&
            fused_tensor(ctx, &sc, NT_F32, -1, 1, &scale, 0) &&
            fused_tensor(ctx, &am[0], NT_F32, -1, 1, NULL, 0) &&
            fused_tensor(ctx, &am[1], NT_F32, -1, 1, NULL, 0) &&
            fused_tensor(ctx, &cs, NT_F32, -1, C, NULL, one);
  nt_fp8_dual_opts o = {&pre, &cs};
  if (ok && CHECK_OK(ctx, nt_fp8_quantize_dual(ctx, &g, &y[0], &y[1], &sc, &am[0], NULL)) &&
      CHECK_OK(ctx, nt_fp8_quantize_dual(ctx, &dy, &y[2], &y[3], &sc, &am[1], &o))) {
    uint8_t *b[4];
    for (int i = 0; i < 4; i++) b[i] = fused_bytes(ctx, &y[i]);
    float *gh = fused_floats(ctx, &g), *csh = fused_floats(ctx, &cs), a[2];
    nt_test_download(ctx, &am[0], &a[0]);
    nt_test_download(ctx, &am[1], &a[1]);
    double *ref = malloc(sizeof(double) * (size_t)C), *got = malloc(sizeof(double) * (size_t)C);
    for (int64_t c = 0; c < C; c++) {
      ref[c] = one;
      for (int64_t r = 0; r < R; r++) ref[c] += gh[r * C + c];
      got[c] = csh[c];
    }
    double e = nt_test_rel_err_d(got, ref, C);
    printf("  dual + GELU backward + column sums %s [%lld, %lld] pad %lld: bytes %s, amax %g "
           "vs %g, column sums rel err %.3g (bound %g)\n", nt_dtype_name(dt), (long long)R,
           (long long)C, (long long)pad,
           memcmp(b[0], b[2], (size_t)(R * (C + pad))) == 0 &&
                   memcmp(b[1], b[3], (size_t)(C * (R + pad))) == 0 ? "equal" : "DIFFER",
           a[1], a[0], e, cs_bound);
    CHECK(memcmp(b[0], b[2], (size_t)(R * (C + pad))) == 0, "fused dual rows: the unfused bytes");
    CHECK(memcmp(b[1], b[3], (size_t)(C * (R + pad))) == 0, "fused dual transposed: the bytes");
    CHECK(a[0] == a[1] && a[0] > 0, "fused dual amax %g, unfused %g", a[1], a[0]);
    CHECK(e <= cs_bound, "fused column sums rel err %.3g > %g", e, cs_bound);
    for (int i = 0; i < 4; i++) free(b[i]);
    free(gh); free(csh); free(ref); free(got);
  }
  nt_tensor *all[] = {&dy, &pre, &g, &y[0], &y[1], &y[2], &y[3], &sc, &am[0], &am[1], &cs};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]->data) nt_tensor_free(ctx, all[i]);
  free(dyh); free(preh);
}

/* One backward pass of a layer [N, K] on M rows, unfused (reference) or fused. */
static bool fused_bwd_run(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, bool fused, nt_tensor *dy,
                          nt_tensor *pre, nt_tensor *x, nt_tensor *w, nt_tensor *dx,
                          nt_tensor *dw, nt_tensor *db) {
  if (fused) {
    nt_fp8_linear_bwd_opts o = {.overwrite_dx = true, .dy_gelu_pre = pre};
    return CHECK_OK(ctx, nt_fp8_linear_backward_ex(ctx, cfg, dy, x, w, dx, dw, db, &o));
  }
  nt_tensor g = {0};
  bool ok = fused_gelu_ref(ctx, dy, pre, &g) &&
            CHECK_OK(ctx, nt_fp8_linear_backward(ctx, cfg, &g, x, w, dx, dw, db));
  if (g.data) nt_tensor_free(ctx, &g);
  return ok;
}

static void fused_backward_case(nt_ctx *ctx, nt_dtype dt, nt_dtype db_dt, bool with_dw,
                                int64_t M, int64_t K, int64_t N, bool emulate, double db_bound) {
  nt_test_rng rng = {(uint64_t)(M * 7 + K * 3 + N + dt + db_dt)};
  float *xh = malloc(sizeof(float) * (size_t)(M * K)), *wh = malloc(sizeof(float) * (size_t)(N * K));
  float *dyh = malloc(sizeof(float) * (size_t)(M * N)), *preh = malloc(sizeof(float) * (size_t)(M * N));
  nt_test_fill_uniform(&rng, xh, M * K, -1, 1);
  nt_test_fill_uniform(&rng, wh, N * K, -0.2f, 0.2f);
  nt_test_fill_uniform(&rng, dyh, M * N, -0.01f, 0.01f);
  nt_test_fill_uniform(&rng, preh, M * N, -4, 4);
  nt_tensor x = {0}, w = {0}, dy = {0}, pre = {0}, dx[2] = {{0}}, dw[2] = {{0}}, db[2] = {{0}};
  nt_fp8_state *s = NULL;
  bool ok = CHECK_OK(ctx, nt_fp8_linear_state_create(ctx, NULL, 1, &s)) &&
            fused_tensor(ctx, &x, dt, M, K, xh, 0) && fused_tensor(ctx, &w, dt, N, K, wh, 0) &&
            fused_tensor(ctx, &dy, dt, M, N, dyh, 0) && fused_tensor(ctx, &pre, dt, M, N, preh, 0);
  for (int i = 0; ok && i < 2; i++)
    ok = fused_tensor(ctx, &dx[i], dt, M, K, NULL, i ? NAN : 0.0f) &&
         fused_tensor(ctx, &dw[i], NT_F32, N, K, NULL, 0) &&
         fused_tensor(ctx, &db[i], db_dt, -1, N, NULL, 0);
  nt_fp8_linear_cfg cfg = {s, 0, emulate};
  nt_tensor *dwp[2] = {with_dw ? &dw[0] : NULL, with_dw ? &dw[1] : NULL};
  nt_tensor *dbp[2] = {with_dw ? &db[0] : NULL, with_dw ? &db[1] : NULL};
  /* A first pass records the amaxes, the update turns them into the scales both passes use. */
  if (ok && fused_bwd_run(ctx, &cfg, false, &dy, &pre, &x, &w, &dx[0], dwp[0], dbp[0]) &&
      CHECK_OK(ctx, nt_fp8_update(ctx, s)) &&
      CHECK_OK(ctx, nt_tensor_zero(ctx, &dx[0])) && CHECK_OK(ctx, nt_tensor_zero(ctx, &dw[0])) &&
      CHECK_OK(ctx, nt_tensor_zero(ctx, &db[0])) &&
      fused_bwd_run(ctx, &cfg, false, &dy, &pre, &x, &w, &dx[0], dwp[0], dbp[0]) &&
      fused_bwd_run(ctx, &cfg, true, &dy, &pre, &x, &w, &dx[1], dwp[1], dbp[1])) {
    float *h[6] = {fused_floats(ctx, &dx[0]), fused_floats(ctx, &dx[1]), fused_floats(ctx, &dw[0]),
                   fused_floats(ctx, &dw[1]), fused_floats(ctx, &db[0]), fused_floats(ctx, &db[1])};
    bool dx_same = memcmp(h[0], h[1], sizeof(float) * (size_t)(M * K)) == 0;
    bool dw_same = memcmp(h[2], h[3], sizeof(float) * (size_t)(N * K)) == 0;
    double e = with_dw ? nt_test_rel_err(h[5], h[4], N) : 0.0;
    printf("  fused backward %s db %s%s [%lld x %lld] x [%lld x %lld]^T%s: dx %s, dW %s, db rel "
           "err %.3g (bound %g)\n", nt_dtype_name(dt), nt_dtype_name(db_dt),
           with_dw ? "" : " (dx only)", (long long)M, (long long)K, (long long)N, (long long)K,
           emulate ? " emulated" : "", dx_same ? "equal" : "DIFFER", dw_same ? "equal" : "DIFFER",
           e, db_bound);
    CHECK(dx_same, "fused backward dx: the unfused bits (NaN start overwritten)");
    CHECK(dw_same, "fused backward dW: the unfused bits");
    CHECK(e <= db_bound, "fused backward db rel err %.3g > %g", e, db_bound);
    for (int i = 0; i < 6; i++) free(h[i]);
  }
  nt_tensor *all[] = {&x, &w, &dy, &pre, &dx[0], &dx[1], &dw[0], &dw[1], &db[0], &db[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]->data) nt_tensor_free(ctx, all[i]);
  nt_fp8_state_free(ctx, s);
  free(xh); free(wh); free(dyh); free(preh);
}

/* Errors of the new options name the problem. */
static void fused_errors(nt_ctx *ctx) {
  nt_tensor x = {0}, pre = {0}, y0 = {0}, y1 = {0}, sc = {0}, cs = {0};
  const float scale = 1.0f;
  if (fused_tensor(ctx, &x, NT_F32, 4, 8, NULL, 1) && fused_tensor(ctx, &pre, NT_BF16, 4, 8, NULL, 1) &&
      fused_tensor(ctx, &y0, NT_FP8_E4M3, 4, 16, NULL, 0) &&
      fused_tensor(ctx, &y1, NT_FP8_E4M3, 8, 16, NULL, 0) &&
      fused_tensor(ctx, &sc, NT_F32, -1, 1, &scale, 0) &&
      fused_tensor(ctx, &cs, NT_F32, -1, 7, NULL, 0)) {
    nt_fp8_dual_opts o = {&pre, NULL};
    CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_quantize_dual(ctx, &x, &y0, &y1, &sc, NULL, &o));
    o = (nt_fp8_dual_opts){NULL, &cs};
    CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_quantize_dual(ctx, &x, &y0, &y1, &sc, NULL, &o));
  }
  nt_tensor *all[] = {&x, &pre, &y0, &y1, &sc, &cs};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]->data) nt_tensor_free(ctx, all[i]);
}

/* A 2-layer MLP (in 40 -> hidden, ReLU -> out 24, FP8 linears) fitted by SGD to |teacher(x)| on
 * one batch: the loss ratio last/first after `steps` steps, or a negative number on failure. */
static double fp8_mlp_ratio(nt_ctx *ctx, int steps, bool emulate, int64_t TB, int64_t TH) {
  const int64_t TI = 40, TO = 24;
  nt_test_rng rng = {99};
  float *xh = malloc(sizeof(float) * (size_t)(TB * TI)), *th = malloc(sizeof(float) * (size_t)(TB * TO));
  float *w1h = malloc(sizeof(float) * (size_t)(TH * TI)), *w2h = malloc(sizeof(float) * (size_t)(TO * TH));
  float *teach = malloc(sizeof(float) * (size_t)(TO * TI)), *yh = malloc(sizeof(float) * (size_t)(TB * TO));
  float *dyh = malloc(sizeof(float) * (size_t)(TB * TO));
  nt_test_fill_uniform(&rng, xh, TB * TI, -1, 1);
  nt_test_fill_uniform(&rng, teach, TO * TI, -0.5f, 0.5f);
  for (int64_t b = 0; b < TB; b++)
    for (int64_t o = 0; o < TO; o++) {
      double s = 0;
      for (int64_t i = 0; i < TI; i++) s += xh[b * TI + i] * teach[o * TI + i];
      th[b * TO + o] = (float)fabs(s);  /* a nonlinear target */
    }
  const float r1 = (float)(1 / sqrt((double)TI)), r2 = (float)(1 / sqrt((double)TH));
  nt_test_fill_uniform(&rng, w1h, TH * TI, -r1, r1);
  nt_test_fill_uniform(&rng, w2h, TO * TH, -r2, r2);
  nt_tensor x = {0}, w1 = {0}, b1 = {0}, w2 = {0}, b2 = {0}, a = {0}, y = {0}, dy = {0};
  nt_tensor da = {0}, dh = {0}, dw1 = {0}, db1 = {0}, dw2 = {0}, db2 = {0};
  nt_fp8_state *s = NULL;
  double first = -1, last = -1;
  nt_status st = NT_OK;
  bool ok = fused_tensor(ctx, &x, NT_F32, TB, TI, xh, 0) &&
            fused_tensor(ctx, &w1, NT_F32, TH, TI, w1h, 0) &&
            fused_tensor(ctx, &b1, NT_F32, -1, TH, NULL, 0) &&
            fused_tensor(ctx, &w2, NT_F32, TO, TH, w2h, 0) &&
            fused_tensor(ctx, &b2, NT_F32, -1, TO, NULL, 0) &&
            fused_tensor(ctx, &a, NT_F32, TB, TH, NULL, 0) &&
            fused_tensor(ctx, &y, NT_F32, TB, TO, NULL, 0) &&
            fused_tensor(ctx, &dy, NT_F32, TB, TO, NULL, 0) &&
            fused_tensor(ctx, &da, NT_F32, TB, TH, NULL, 0) &&
            fused_tensor(ctx, &dh, NT_F32, TB, TH, NULL, 0) &&
            fused_tensor(ctx, &dw1, NT_F32, TH, TI, NULL, 0) &&
            fused_tensor(ctx, &db1, NT_F32, -1, TH, NULL, 0) &&
            fused_tensor(ctx, &dw2, NT_F32, TO, TH, NULL, 0) &&
            fused_tensor(ctx, &db2, NT_F32, -1, TO, NULL, 0) &&
            CHECK_OK(ctx, nt_fp8_linear_state_create(ctx, NULL, 2, &s));
  nt_fp8_linear_cfg l1 = {s, 0, emulate}, l2 = {s, 3, emulate};
  nt_tensor hy = nt_tensor_view(yh, NT_F32, nt_cpu(), 2, (int64_t[]){TB, TO});
  nt_tensor hdy = nt_tensor_view(dyh, NT_F32, nt_cpu(), 2, (int64_t[]){TB, TO});
  nt_tensor *grads[7] = {&da, &dh, &dw1, &db1, &dw2, &db2, NULL};
  const float lr = 0.3f;
  for (int it = 0; ok && it < steps; it++) {
    if ((st = nt_fp8_linear_forward(ctx, &l1, &x, &w1, &b1, &a, NT_ACT_RELU, NULL)) ||
        (st = nt_fp8_linear_forward(ctx, &l2, &a, &w2, &b2, &y, NT_ACT_NONE, NULL)) ||
        (st = nt_tensor_copy(ctx, &hy, &y)))
      break;
    double loss = 0;
    for (int64_t i = 0; i < TB * TO; i++) {
      double d = yh[i] - th[i];
      loss += d * d / (double)(TB * TO);
      dyh[i] = (float)(2 * d / (double)(TB * TO));
    }
    if (it == 0) first = loss;
    last = loss;
    if (it % 50 == 0 || it == steps - 1)
      printf("  mlp (%s) step %3d: loss %.5f\n", emulate ? "emulated" : "fp8", it, loss);
    for (int g = 0; grads[g] && !st; g++) st = nt_tensor_zero(ctx, grads[g]);
    if (st || (st = nt_tensor_copy(ctx, &dy, &hdy)) ||
        (st = nt_fp8_linear_backward(ctx, &l2, &dy, &a, &w2, &da, &dw2, &db2)) ||
        (st = nt_relu_backward(ctx, &a, &da, &dh)) ||
        (st = nt_fp8_linear_backward(ctx, &l1, &dh, &x, &w1, NULL, &dw1, &db1)) ||
        (st = nt_axpy(ctx, -lr, &dw1, &w1)) || (st = nt_axpy(ctx, -lr, &db1, &b1)) ||
        (st = nt_axpy(ctx, -lr, &dw2, &w2)) || (st = nt_axpy(ctx, -lr, &db2, &b2)) ||
        (st = nt_fp8_update(ctx, s)))
      break;
  }
  if (st) fprintf(stderr, "mlp training: %s\n", nt_last_error(ctx));
  nt_tensor *all[] = {&x, &w1, &b1, &w2, &b2, &a, &y, &dy, &da, &dh, &dw1, &db1, &dw2, &db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]->data) nt_tensor_free(ctx, all[i]);
  nt_fp8_state_free(ctx, s);
  free(xh); free(th); free(w1h); free(w2h); free(teach); free(yh); free(dyh);
  return !ok || st || first <= 0 ? -1.0 : last / first;
}

#endif
