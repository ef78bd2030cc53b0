/* CPU MaxPool2d: forward and argmax vs a direct computation (odd sizes, floor), ties and NaN,
 * backward vs finite differences, accumulation, f16/bf16 storage, errors. */
#include "tests/testutil.h"
#include "ops/conv2d.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_case(nt_ctx *ctx, int N, int C, int H, int W, int k, uint64_t seed) {
  const int OH = H / k, OW = W / k;
  const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
  nt_test_rng rng = {seed};
  float *x = malloc(4 * nx), *y = malloc(4 * ny), *dy = malloc(4 * ny), *dx = malloc(4 * nx),
        *pre = malloc(4 * nx);
  int32_t *am = malloc(4 * ny);
  /* Distinct values on a 2^-8 grid, shuffled (7919 is prime to every nx used): finite
   * differences with a 2^-10 step are then exact and never change a window's winner. */
  for (size_t i = 0; i < nx; i++) x[i] = (float)((i * 7919u) % nx) / 256.f - 4.f;
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  nt_test_fill_uniform(&rng, pre, (int64_t)nx, -1, 1);
  int64_t sx[4] = {N, C, H, W}, sy[4] = {N, C, OH, OW};
  nt_tensor tx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            ty = nt_tensor_view(y, NT_F32, nt_cpu(), 4, sy),
            ta = nt_tensor_view(am, NT_I32, nt_cpu(), 4, sy),
            tdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            tdx = nt_tensor_view(dx, NT_F32, nt_cpu(), 4, sx);
  if (!CHECK_OK(ctx, nt_maxpool2d_forward(ctx, &tx, &ty, &ta, k))) goto done;
  int bad = 0;
  for (int pl = 0; pl < N * C; pl++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float best = -INFINITY;
        int bi = -1;
        for (int dh = 0; dh < k; dh++)
          for (int dw = 0; dw < k; dw++) {
            int i = (oh * k + dh) * W + ow * k + dw;
            if (x[(size_t)pl * H * W + i] > best) best = x[(size_t)pl * H * W + i], bi = i;
          }
        size_t o = ((size_t)pl * OH + oh) * OW + ow;
        bad += y[o] != best || am[o] != bi;
      }
  CHECK(bad == 0, "maxpool %dx%d k%d: %d wrong outputs or argmax", H, W, k, bad);
  /* Backward: dx = pre + scatter(dy); check against finite differences of sum(y * dy). */
  memcpy(dx, pre, 4 * nx);
  if (!CHECK_OK(ctx, nt_maxpool2d_backward(ctx, &tdy, &ta, &tdx))) goto done;
  {
    double *num = malloc(8 * nx), *ana = malloc(8 * nx);
    float *yp = malloc(4 * ny);
    int32_t *ap = malloc(4 * ny);
    nt_tensor typ = nt_tensor_view(yp, NT_F32, nt_cpu(), 4, sy),
              tap = nt_tensor_view(ap, NT_I32, nt_cpu(), 4, sy);
    const float eps = 1.f / 1024.f;
    for (size_t i = 0; i < nx; i++) {
      double l[2];
      for (int s = 0; s < 2; s++) {
        const float keep = x[i];
        x[i] = keep + (s ? -eps : eps);
        nt_maxpool2d_forward(ctx, &tx, &typ, &tap, k);
        x[i] = keep;
        l[s] = 0;
        for (size_t j = 0; j < ny; j++) l[s] += (double)yp[j] * dy[j];
      }
      num[i] = (l[0] - l[1]) / (2.0 * eps);
      ana[i] = (double)dx[i] - pre[i];
    }
    double e = nt_test_rel_err_d(ana, num, (int64_t)nx);
    CHECK(e < 1e-6, "maxpool %dx%d k%d backward vs finite differences: rel err %.3g", H, W, k, e);
    free(num); free(ana); free(yp); free(ap);
  }
  /* f16 / bf16 storage: the same winners, the same (rounded) values. */
  nt_dtype lows[2] = {NT_F16, NT_BF16};
  for (int t = 0; t < 2; t++) {
    uint16_t *lx = malloc(2 * nx), *ly = malloc(2 * ny);
    int32_t *la = malloc(4 * ny);
    for (size_t i = 0; i < nx; i++) nt_store_f32(lx, lows[t], (int64_t)i, x[i]);
    nt_tensor bx = nt_tensor_view(lx, lows[t], nt_cpu(), 4, sx),
              by = nt_tensor_view(ly, lows[t], nt_cpu(), 4, sy),
              ba = nt_tensor_view(la, NT_I32, nt_cpu(), 4, sy);
    if (CHECK_OK(ctx, nt_maxpool2d_forward(ctx, &bx, &by, &ba, k))) {
      int wrong = 0;
      for (size_t o = 0; o < ny; o++) {
        size_t pl = o / ((size_t)OH * OW);
        wrong += nt_load_f32(ly, lows[t], (int64_t)o) !=
                 nt_load_f32(lx, lows[t], (int64_t)(pl * H * W + (size_t)la[o]));
      }
      CHECK(wrong == 0, "maxpool %s: %d outputs differ from x[argmax]", nt_dtype_name(lows[t]),
            wrong);
    }
    free(lx); free(ly); free(la);
  }
done:
  free(x); free(y); free(dy); free(dx); free(pre); free(am);
}

static void test_ties_nan(nt_ctx *ctx) {
  float x[8] = {1, 3, 3, 0, NAN, 2, 5, 5};   /* two 2x2 windows over a 2x4 plane */
  float y[2];
  int32_t am[2];
  int64_t sx[4] = {1, 1, 2, 4}, sy[4] = {1, 1, 1, 2};
  nt_tensor tx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            ty = nt_tensor_view(y, NT_F32, nt_cpu(), 4, sy),
            ta = nt_tensor_view(am, NT_I32, nt_cpu(), 4, sy);
  if (CHECK_OK(ctx, nt_maxpool2d_forward(ctx, &tx, &ty, &ta, 2))) {
    CHECK(isnan(y[0]) && am[0] == 4, "NaN must win its window (got %g at %d)", (double)y[0], am[0]);
    CHECK(y[1] == 5 && am[1] == 6, "the first of tied maxima wins (got %g at %d)", (double)y[1],
          am[1]);
  }
}

static void test_errors(nt_ctx *ctx) {
  static float buf[3][64];
  static int32_t ibuf[64];
  int64_t sx[4] = {1, 2, 5, 5}, sy[4] = {1, 2, 2, 2}, sbad[4] = {1, 2, 3, 2};
  nt_tensor x = nt_tensor_view(buf[0], NT_F32, nt_cpu(), 4, sx);
  nt_tensor y = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sy);
  nt_tensor a = nt_tensor_view(ibuf, NT_I32, nt_cpu(), 4, sy);
  nt_tensor ybad = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sbad);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_maxpool2d_forward(ctx, &x, &ybad, &a, 2));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_maxpool2d_forward(ctx, &x, &y, &a, 0));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_maxpool2d_forward(ctx, &x, &y, &a, 6));
  nt_tensor af = nt_tensor_view(ibuf, NT_F32, nt_cpu(), 4, sy);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_maxpool2d_forward(ctx, &x, &y, &af, 2));
  nt_tensor yh = nt_tensor_view(buf[1], NT_F16, nt_cpu(), 4, sy);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_maxpool2d_forward(ctx, &x, &yh, &a, 2));
  ibuf[0] = 1000;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_maxpool2d_backward(ctx, &y, &a, &x));
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_case(ctx, 2, 3, 28, 28, 2, 1);
  test_case(ctx, 2, 5, 13, 13, 2, 2);
  test_case(ctx, 1, 2, 7, 8, 3, 3);
  test_case(ctx, 3, 1, 5, 5, 1, 4);
  test_ties_nan(ctx);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
