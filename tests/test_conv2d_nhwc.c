/* NHWC Conv2d and MaxPool2d on the CPU (ops/conv2d_nhwc.h): the same results as the NCHW ops
 * on permuted tensors (forward with bias and ReLU, backward with the ReLU mask, several strides,
 * pads and kernels), dx overwritten and dw / db accumulated, a finite-difference check of the
 * backward, the pool in both y layouts with the mask, and clear errors (outputs that share
 * memory with inputs among them). */
#include "tests/testutil.h"
#include "ops/conv2d_nhwc.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* [N, C, H, W] <-> [N, H, W, C] */
static void to_nhwc(const float *a, float *b, int N, int C, int H, int W) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          b[((n * H + h) * W + w) * C + c] = a[((n * C + c) * H + h) * W + w];
}

typedef struct {
  int N, Cin, H, W, Cout, KH, KW, stride, pad;
} ccase;

static void against_nchw(ccase k, bool relu) {
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return;
  const int OH = (k.H + 2 * k.pad - k.KH) / k.stride + 1,
            OW = (k.W + 2 * k.pad - k.KW) / k.stride + 1;
  const int nx = k.N * k.Cin * k.H * k.W, nw = k.Cout * k.Cin * k.KH * k.KW,
            ny = k.N * k.Cout * OH * OW;
  nt_test_rng r = {(uint64_t)(nx + nw)};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * k.Cout), *dy = malloc(4 * ny);
  float *y = malloc(4 * ny), *dx = calloc(nx, 4), *dw = calloc(nw, 4), *db = calloc(k.Cout, 4);
  float *xh = malloc(4 * nx), *dyh = malloc(4 * ny), *yh = malloc(4 * ny), *dxh = malloc(4 * nx);
  float *dwh = malloc(4 * nw), *dbh = malloc(4 * k.Cout), *t = malloc(4 * (nx > ny ? nx : ny));
  nt_test_fill_uniform(&r, x, nx, -1, 1);
  nt_test_fill_uniform(&r, w, nw, -1, 1);
  nt_test_fill_uniform(&r, b, k.Cout, -1, 1);
  nt_test_fill_uniform(&r, dy, ny, -1, 1);
  nt_test_fill_uniform(&r, dwh, nw, -1, 1);   /* NHWC dw / db start from a prefill */
  nt_test_fill_uniform(&r, dbh, k.Cout, -1, 1);
  memcpy(dw, dwh, 4 * nw);
  memcpy(db, dbh, 4 * k.Cout);
  for (int i = 0; i < nx; i++) dxh[i] = 9.0f;   /* overwritten */
  to_nhwc(x, xh, k.N, k.Cin, k.H, k.W);
  to_nhwc(dy, dyh, k.N, k.Cout, OH, OW);
  int64_t sx[4] = {k.N, k.Cin, k.H, k.W}, sxh[4] = {k.N, k.H, k.W, k.Cin},
          sw[4] = {k.Cout, k.Cin, k.KH, k.KW}, sb[1] = {k.Cout}, sy[4] = {k.N, k.Cout, OH, OW},
          syh[4] = {k.N, OH, OW, k.Cout};
  nt_device cpu = nt_cpu();
  nt_tensor X = nt_tensor_view(x, NT_F32, cpu, 4, sx), Xh = nt_tensor_view(xh, NT_F32, cpu, 4, sxh);
  nt_tensor Wt = nt_tensor_view(w, NT_F32, cpu, 4, sw), B = nt_tensor_view(b, NT_F32, cpu, 1, sb);
  nt_tensor Y = nt_tensor_view(y, NT_F32, cpu, 4, sy), Yh = nt_tensor_view(yh, NT_F32, cpu, 4, syh);
  nt_tensor DY = nt_tensor_view(dy, NT_F32, cpu, 4, sy),
            DYh = nt_tensor_view(dyh, NT_F32, cpu, 4, syh);
  nt_tensor DX = nt_tensor_view(dx, NT_F32, cpu, 4, sx),
            DXh = nt_tensor_view(dxh, NT_F32, cpu, 4, sxh);
  nt_tensor DW = nt_tensor_view(dw, NT_F32, cpu, 4, sw),
            DWh = nt_tensor_view(dwh, NT_F32, cpu, 4, sw);
  nt_tensor DB = nt_tensor_view(db, NT_F32, cpu, 1, sb),
            DBh = nt_tensor_view(dbh, NT_F32, cpu, 1, sb);
  nt_conv2d_params p = {k.stride, k.pad};
  CHECK_OK(c, relu ? nt_conv2d_relu_forward(c, &X, &Wt, &B, &Y, p)
                   : nt_conv2d_forward(c, &X, &Wt, &B, &Y, p));
  CHECK_OK(c, nt_conv2d_nhwc_forward(c, &Xh, &Wt, &B, &Yh, p, relu));
  to_nhwc(y, t, k.N, k.Cout, OH, OW);
  CHECK(nt_test_rel_err(yh, t, ny) < 1e-6, "nhwc y matches nchw (k%dx%d s%d p%d)", k.KH, k.KW,
        k.stride, k.pad);
  CHECK_OK(c, relu ? nt_conv2d_relu_backward(c, &DY, &Y, &X, &Wt, &DX, &DW, &DB, p)
                   : nt_conv2d_backward(c, &DY, &X, &Wt, &DX, &DW, &DB, p));
  /* with the ReLU also dx_mask = x: the NCHW dx masked by x > 0 */
  CHECK_OK(c, nt_conv2d_nhwc_backward(c, &DYh, relu ? &Yh : NULL, &Xh, &Wt, &DXh,
                                      relu ? &Xh : NULL, &DWh, &DBh, p));
  for (int i = 0; relu && i < nx; i++)
    if (!(x[i] > 0)) dx[i] = 0.0f;
  to_nhwc(dx, t, k.N, k.Cin, k.H, k.W);
  CHECK(nt_test_rel_err(dxh, t, nx) < 1e-6, "nhwc dx matches nchw");
  CHECK(nt_test_rel_err(dwh, dw, nw) < 1e-6, "nhwc dw accumulates as nchw");
  CHECK(nt_test_rel_err(dbh, db, k.Cout) < 1e-6, "nhwc db accumulates as nchw");
  float *bufs[15] = {x, w, b, dy, y, dx, dw, db, xh, dyh, yh, dxh, dwh, dbh, t};
  for (int i = 0; i < 15; i++) free(bufs[i]);
  nt_ctx_free(c);
}

/* L = sum(conv(x) * g * mask), mask = (relu output > 0) of the unperturbed forward (the ReLU's
 * kinks would otherwise be crossed): dL/dx, dL/dw, dL/db by central differences against the
 * backward given that ReLU output. */
static double fd_loss(nt_ctx *c, const nt_tensor *x, const nt_tensor *w, const nt_tensor *b,
                      nt_tensor *y, const float *g, const float *relu_y, nt_conv2d_params p) {
  if (nt_conv2d_nhwc_forward(c, x, w, b, y, p, false)) return NAN;
  double s = 0;
  for (int64_t i = 0; i < nt_tensor_numel(y); i++)
    if (relu_y[i] > 0) s += (double)((float *)y->data)[i] * g[i];
  return s;
}

static void finite_differences(void) {
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return;
  enum { N = 2, H = 5, W = 6, CI = 3, CO = 4 };
  const int nx = N * H * W * CI, nw = CO * CI * 9, ny = N * H * W * CO;
  nt_test_rng r = {5};
  float x[nx], w[nw], b[CO], g[ny], y[ny], dx[nx], dw[nw], db[CO];
  nt_test_fill_uniform(&r, x, nx, -1, 1);
  nt_test_fill_uniform(&r, w, nw, -1, 1);
  nt_test_fill_uniform(&r, b, CO, -0.5f, 0.5f);
  nt_test_fill_uniform(&r, g, ny, -1, 1);
  memset(dw, 0, sizeof dw);
  memset(db, 0, sizeof db);
  int64_t sx[4] = {N, H, W, CI}, sw[4] = {CO, CI, 3, 3}, sb[1] = {CO}, sy[4] = {N, H, W, CO};
  nt_device cpu = nt_cpu();
  nt_tensor X = nt_tensor_view(x, NT_F32, cpu, 4, sx), Wt = nt_tensor_view(w, NT_F32, cpu, 4, sw),
            B = nt_tensor_view(b, NT_F32, cpu, 1, sb), Y = nt_tensor_view(y, NT_F32, cpu, 4, sy),
            G = nt_tensor_view(g, NT_F32, cpu, 4, sy), DX = nt_tensor_view(dx, NT_F32, cpu, 4, sx),
            DW = nt_tensor_view(dw, NT_F32, cpu, 4, sw),
            DB = nt_tensor_view(db, NT_F32, cpu, 1, sb);
  nt_conv2d_params p = {1, 1};
  CHECK_OK(c, nt_conv2d_nhwc_forward(c, &X, &Wt, &B, &Y, p, true));
  float ysave[ny];
  memcpy(ysave, y, sizeof y);
  nt_tensor YS = nt_tensor_view(ysave, NT_F32, cpu, 4, sy);
  CHECK_OK(c, nt_conv2d_nhwc_backward(c, &G, &YS, &X, &Wt, &DX, NULL, &DW, &DB, p));
  const float h = 1e-2f;   /* L is linear in each input: only rounding limits h */
  double worst = 0;
  float *params[3] = {x, w, b}, *grads[3] = {dx, dw, db};
  const int sizes[3] = {nx, nw, CO};
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < sizes[t]; i += 1 + sizes[t] / 17) {
      const float keep = params[t][i];
      params[t][i] = keep + h;
      const double lp = fd_loss(c, &X, &Wt, &B, &Y, g, ysave, p);
      params[t][i] = keep - h;
      const double lm = fd_loss(c, &X, &Wt, &B, &Y, g, ysave, p);
      params[t][i] = keep;
      const double fd = (lp - lm) / (2 * h), e = fabs(fd - grads[t][i]) / (fabs(fd) + 1e-2);
      if (e > worst) worst = e;
    }
  printf("  finite differences: worst relative error %.3g\n", worst);
  CHECK(worst < 2e-3, "nhwc backward vs finite differences: %.3g", worst);
  nt_ctx_free(c);
}

static void pool_against_nchw(int N, int C, int H, int Wd, int k) {
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return;
  const int OH = H / k, OW = Wd / k, nx = N * C * H * Wd, ny = N * C * OH * OW;
  nt_test_rng r = {(uint64_t)(nx + k)};
  float *x = malloc(4 * nx), *xh = malloc(4 * nx), *y = malloc(4 * ny), *yh = malloc(4 * ny);
  float *dy = malloc(4 * ny), *dx = calloc(nx, 4), *dxh = malloc(4 * nx), *t = malloc(4 * nx);
  float *m = malloc(4 * ny), *mdy = malloc(4 * ny);
  int32_t *am = malloc(4 * ny), *amh = malloc(4 * ny);
  nt_test_fill_uniform(&r, x, nx, -2, 2);
  nt_test_fill_uniform(&r, dy, ny, -1, 1);
  x[3] = x[2];   /* a tie: the first maximum wins on both sides */
  to_nhwc(x, xh, N, C, H, Wd);
  int64_t sx[4] = {N, C, H, Wd}, sxh[4] = {N, H, Wd, C}, sy[4] = {N, C, OH, OW};
  nt_device cpu = nt_cpu();
  nt_tensor X = nt_tensor_view(x, NT_F32, cpu, 4, sx), Xh = nt_tensor_view(xh, NT_F32, cpu, 4, sxh),
            Y = nt_tensor_view(y, NT_F32, cpu, 4, sy), Yh = nt_tensor_view(yh, NT_F32, cpu, 4, sy),
            A = nt_tensor_view(am, NT_I32, cpu, 4, sy),
            Ah = nt_tensor_view(amh, NT_I32, cpu, 4, sy),
            MDY = nt_tensor_view(mdy, NT_F32, cpu, 4, sy),
            DYv = nt_tensor_view(dy, NT_F32, cpu, 4, sy),
            DX = nt_tensor_view(dx, NT_F32, cpu, 4, sx),
            DXh = nt_tensor_view(dxh, NT_F32, cpu, 4, sxh),
            M = nt_tensor_view(m, NT_F32, cpu, 4, sy);
  /* y in NCHW order straight from the NHWC input: the same values and argmax as the NCHW op */
  CHECK_OK(c, nt_maxpool2d_forward(c, &X, &Y, &A, k));
  CHECK_OK(c, nt_maxpool2d_nhwc_forward(c, &Xh, &Yh, &Ah, k, true));
  CHECK(memcmp(y, yh, 4 * ny) == 0 && memcmp(am, amh, 4 * ny) == 0, "pool nchw-y matches nchw");
  /* backward with the mask m = y: the NCHW op on dy * (y > 0) */
  memcpy(m, y, 4 * ny);
  for (int i = 0; i < ny; i++) mdy[i] = y[i] > 0 ? dy[i] : 0.0f;
  for (int i = 0; i < nx; i++) dxh[i] = 3.0f;
  CHECK_OK(c, nt_maxpool2d_backward(c, &MDY, &A, &DX));
  CHECK_OK(c, nt_maxpool2d_nhwc_backward(c, &DYv, &Ah, &M, &DXh, k, true));
  to_nhwc(dx, t, N, C, H, Wd);
  CHECK(memcmp(t, dxh, 4 * nx) == 0, "pool backward (masked, nchw-y) matches nchw");
  /* NHWC y: the permutation of the NCHW one */
  int64_t syh[4] = {N, OH, OW, C};
  Yh = nt_tensor_view(yh, NT_F32, cpu, 4, syh);
  Ah = nt_tensor_view(amh, NT_I32, cpu, 4, syh);
  nt_tensor DYh = nt_tensor_view(mdy, NT_F32, cpu, 4, syh);
  CHECK_OK(c, nt_maxpool2d_nhwc_forward(c, &Xh, &Yh, &Ah, k, false));
  to_nhwc(y, t, N, C, OH, OW);
  CHECK(memcmp(t, yh, 4 * ny) == 0, "pool nhwc-y is the permuted nchw y");
  to_nhwc(dy, mdy, N, C, OH, OW);
  for (int i = 0; i < ny; i++) mdy[i] = yh[i] > 0 ? mdy[i] : 0.0f;
  CHECK_OK(c, nt_maxpool2d_nhwc_backward(c, &DYh, &Ah, NULL, &DXh, k, false));
  to_nhwc(dx, t, N, C, H, Wd);
  CHECK(memcmp(t, dxh, 4 * nx) == 0, "pool backward (nhwc-y) matches nchw");
  /* errors */
  CHECK_ERR(c, NT_ERR_SHAPE, nt_maxpool2d_nhwc_forward(c, &Xh, &Y, &A, k, false));
  CHECK_ERR(c, NT_ERR_INVALID_ARG, nt_maxpool2d_nhwc_forward(c, &Xh, &Yh, &Ah, 0, false));
  float *bufs[10] = {x, xh, y, yh, dy, dx, dxh, t, m, mdy};
  for (int i = 0; i < 10; i++) free(bufs[i]);
  free(am);
  free(amh);
  nt_ctx_free(c);
}

/* conv + pool on the CPU: conv then pool, with and without a caller's scratch; errors. */
static void conv_pool(void) {
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return;
  enum { N = 2, H = 7, W = 9, CI = 3, CO = 4, PH = 3, PW = 4 };
  const int nx = N * H * W * CI, nw = CO * CI * 9, nz = N * H * W * CO, np = N * PH * PW * CO;
  nt_test_rng r = {9};
  float x[nx], w[nw], b[CO], z[nz], y1[np], y2[np], y3[np], scr[nz];
  int32_t a1[np], a2[np], a3[np];
  nt_test_fill_uniform(&r, x, nx, -1, 1);
  nt_test_fill_uniform(&r, w, nw, -1, 1);
  nt_test_fill_uniform(&r, b, CO, -1, 1);
  int64_t sx[4] = {N, H, W, CI}, sw[4] = {CO, CI, 3, 3}, sb[1] = {CO}, sz[4] = {N, H, W, CO},
          sp[4] = {N, CO, PH, PW}, ss[1] = {nz}, small[1] = {nz - 1};
  nt_device cpu = nt_cpu();
  nt_tensor X = nt_tensor_view(x, NT_F32, cpu, 4, sx), Wt = nt_tensor_view(w, NT_F32, cpu, 4, sw),
            B = nt_tensor_view(b, NT_F32, cpu, 1, sb), Z = nt_tensor_view(z, NT_F32, cpu, 4, sz),
            Y1 = nt_tensor_view(y1, NT_F32, cpu, 4, sp),
            Y2 = nt_tensor_view(y2, NT_F32, cpu, 4, sp),
            Y3 = nt_tensor_view(y3, NT_F32, cpu, 4, sp),
            A1 = nt_tensor_view(a1, NT_I32, cpu, 4, sp),
            A2 = nt_tensor_view(a2, NT_I32, cpu, 4, sp),
            A3 = nt_tensor_view(a3, NT_I32, cpu, 4, sp),
            S = nt_tensor_view(scr, NT_F32, cpu, 1, ss),
            Ss = nt_tensor_view(scr, NT_F32, cpu, 1, small);
  nt_conv2d_params p = {1, 1};
  CHECK_OK(c, nt_conv2d_nhwc_forward(c, &X, &Wt, &B, &Z, p, true));
  CHECK_OK(c, nt_maxpool2d_nhwc_forward(c, &Z, &Y1, &A1, 2, true));
  CHECK_OK(c, nt_conv2d_nhwc_pool_forward(c, &X, &Wt, &B, &Y2, &A2, p, true, true, NULL));
  CHECK_OK(c, nt_conv2d_nhwc_pool_forward(c, &X, &Wt, &B, &Y3, &A3, p, true, true, &S));
  CHECK(!memcmp(y1, y2, sizeof y1) && !memcmp(a1, a2, sizeof a1) && !memcmp(y1, y3, sizeof y1) &&
        !memcmp(a1, a3, sizeof a1), "conv + pool equals conv then pool");
  CHECK_ERR(c, NT_ERR_SHAPE,
            nt_conv2d_nhwc_pool_forward(c, &X, &Wt, &B, &Y3, &A3, p, true, true, &Ss));
  CHECK_ERR(c, NT_ERR_SHAPE,
            nt_conv2d_nhwc_pool_forward(c, &X, &Wt, &B, &Y3, &A3, p, true, false, NULL));
  nt_ctx_free(c);
}

static void errors(void) {
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return;
  float buf[4096] = {0};
  int64_t sx[4] = {2, 6, 6, 3}, sw[4] = {4, 3, 3, 3}, sy[4] = {2, 6, 6, 4}, bad[4] = {2, 6, 6, 5};
  int64_t sw2[4] = {4, 2, 3, 3};
  nt_device cpu = nt_cpu();
  nt_tensor X = nt_tensor_view(buf, NT_F32, cpu, 4, sx),
            Wt = nt_tensor_view(buf, NT_F32, cpu, 4, sw),
            Y = nt_tensor_view(buf, NT_F32, cpu, 4, sy),
            Yb = nt_tensor_view(buf, NT_F32, cpu, 4, bad),
            W2 = nt_tensor_view(buf, NT_F32, cpu, 4, sw2);
  nt_conv2d_params p = {1, 1}, bp = {0, 1};
  CHECK_ERR(c, NT_ERR_SHAPE, nt_conv2d_nhwc_forward(c, &X, &Wt, NULL, &Yb, p, false));
  CHECK_ERR(c, NT_ERR_SHAPE, nt_conv2d_nhwc_forward(c, &X, &W2, NULL, &Y, p, false));
  CHECK_ERR(c, NT_ERR_INVALID_ARG, nt_conv2d_nhwc_forward(c, &X, &Wt, NULL, &Y, bp, false));
  CHECK_ERR(c, NT_ERR_INVALID_ARG, nt_conv2d_nhwc_forward(c, NULL, &Wt, NULL, &Y, p, false));
  CHECK_ERR(c, NT_ERR_SHAPE,
            nt_conv2d_nhwc_backward(c, &Y, NULL, &X, &Wt, &Y, NULL, NULL, NULL, p));
  CHECK_ERR(c, NT_ERR_SHAPE,
            nt_conv2d_nhwc_backward(c, &Y, NULL, &X, &Wt, NULL, NULL, &W2, NULL, p));
  CHECK_ERR(c, NT_ERR_SHAPE,
            nt_conv2d_nhwc_backward(c, &Y, NULL, &X, &Wt, &X, &Y, NULL, NULL, p));
  /* outputs sharing memory with inputs: apart, x and w at 0 and 216 (inputs may overlap each
   * other), y and dy at 1024, dx and the pool's y at 2048, dw at 3072, argmax in am; then y
   * over x, dx over dy or x, dw over x, the pool's y over x, its argmax and scratch over its y */
  int64_t sp[4] = {2, 3, 3, 4}, ss[1] = {288};
  int32_t am[72];
  nt_tensor W0 = nt_tensor_view(buf + 216, NT_F32, cpu, 4, sw),
            Y1 = nt_tensor_view(buf + 1024, NT_F32, cpu, 4, sy),
            DX = nt_tensor_view(buf + 2048, NT_F32, cpu, 4, sx),
            DW = nt_tensor_view(buf + 3072, NT_F32, cpu, 4, sw),
            DXy = nt_tensor_view(buf + 1024, NT_F32, cpu, 4, sx),
            P = nt_tensor_view(buf + 2048, NT_F32, cpu, 4, sp),
            Px = nt_tensor_view(buf, NT_F32, cpu, 4, sp),
            A = nt_tensor_view(am, NT_I32, cpu, 4, sp),
            Ay = nt_tensor_view(buf + 2048, NT_I32, cpu, 4, sp),
            S = nt_tensor_view(buf + 1900, NT_F32, cpu, 1, ss);
  CHECK_OK(c, nt_conv2d_nhwc_forward(c, &X, &W0, NULL, &Y1, p, false));
  CHECK_OK(c, nt_conv2d_nhwc_backward(c, &Y1, NULL, &X, &W0, &DX, &X, &DW, NULL, p));
  CHECK_OK(c, nt_conv2d_nhwc_pool_forward(c, &X, &W0, NULL, &P, &A, p, false, false, NULL));
  CHECK_ERR(c, NT_ERR_INVALID_ARG, nt_conv2d_nhwc_forward(c, &X, &W0, NULL, &Y, p, false));
  CHECK(strstr(nt_last_error(c), "y overlaps x"), "alias message: %s", nt_last_error(c));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_backward(c, &Y1, NULL, &X, &W0, &DXy, NULL, NULL, NULL, p));
  CHECK(strstr(nt_last_error(c), "dx overlaps dy"), "alias message: %s", nt_last_error(c));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_backward(c, &Y1, NULL, &X, &W0, &X, NULL, NULL, NULL, p));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_backward(c, &Y1, NULL, &X, &W0, NULL, NULL, &Wt, NULL, p));
  CHECK(strstr(nt_last_error(c), "dw overlaps x"), "alias message: %s", nt_last_error(c));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_pool_forward(c, &X, &W0, NULL, &Px, &A, p, false, false, NULL));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_pool_forward(c, &X, &W0, NULL, &P, &Ay, p, false, false, NULL));
  CHECK(strstr(nt_last_error(c), "argmax overlaps y"), "alias message: %s", nt_last_error(c));
  CHECK_ERR(c, NT_ERR_INVALID_ARG,
            nt_conv2d_nhwc_pool_forward(c, &X, &W0, NULL, &P, &A, p, false, false, &S));
  CHECK(strstr(nt_last_error(c), "scratch overlaps y"), "alias message: %s", nt_last_error(c));
  nt_ctx_free(c);
}

int main(void) {
  const ccase cases[] = {{2, 3, 7, 9, 5, 3, 3, 1, 1},  {2, 4, 9, 8, 3, 3, 3, 2, 1},
                         {1, 2, 6, 7, 4, 3, 5, 1, 2},  {3, 1, 8, 8, 6, 3, 3, 1, 0},
                         {2, 5, 11, 10, 2, 2, 2, 2, 0}, {1, 8, 6, 6, 16, 1, 1, 1, 0}};
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    against_nchw(cases[i], false);
    against_nchw(cases[i], true);
  }
  finite_differences();
  pool_against_nchw(2, 3, 8, 8, 2);
  pool_against_nchw(2, 5, 7, 9, 2);
  pool_against_nchw(1, 4, 11, 11, 4);
  conv_pool();
  errors();
  return nt_test_finish();
}
