/* CPU Conv2d: forward vs an fp64 direct computation, backward (dx, dw, db) vs finite
 * differences of that fp64 function, accumulation, NULL gradients, bf16 storage, flatten as
 * a reshape, clear errors, and the CUDA path's batch-chunking policy. */
#include "tests/testutil.h"
#include "ops/conv2d.h"
#include "ops/conv2d_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int N, Cin, H, W, Cout, KH, KW, stride, pad;
} ccase;

static int out_dim(int in, int k, int s, int p) {
  return (in + 2 * p - k) / s + 1;
}

static void ref_conv(const double *x, const double *w, const double *b, double *y, ccase c) {
  const int OH = out_dim(c.H, c.KH, c.stride, c.pad), OW = out_dim(c.W, c.KW, c.stride, c.pad);
  for (int n = 0; n < c.N; n++)
    for (int co = 0; co < c.Cout; co++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double acc = b ? b[co] : 0;
          for (int ci = 0; ci < c.Cin; ci++)
            for (int kh = 0; kh < c.KH; kh++)
              for (int kw = 0; kw < c.KW; kw++) {
                int ih = oh * c.stride - c.pad + kh, iw = ow * c.stride - c.pad + kw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                acc += x[((n * c.Cin + ci) * c.H + ih) * c.W + iw] *
                       w[((co * c.Cin + ci) * c.KH + kh) * c.KW + kw];
              }
          y[((n * c.Cout + co) * OH + oh) * OW + ow] = acc;
        }
}

static void test_forward(nt_ctx *ctx, ccase c, bool bias, uint64_t seed) {
  const int OH = out_dim(c.H, c.KH, c.stride, c.pad), OW = out_dim(c.W, c.KW, c.stride, c.pad);
  const size_t nx = (size_t)c.N * c.Cin * c.H * c.W, nw = (size_t)c.Cout * c.Cin * c.KH * c.KW;
  const size_t ny = (size_t)c.N * c.Cout * OH * OW;
  nt_test_rng rng = {seed};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * (size_t)c.Cout),
        *y = malloc(4 * ny);
  double *xd = malloc(8 * nx), *wd = malloc(8 * nw), *bd = malloc(8 * (size_t)c.Cout),
         *yd = malloc(8 * ny), *yg = malloc(8 * ny);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, b, c.Cout, -1, 1);
  for (size_t i = 0; i < nx; i++) xd[i] = x[i];
  for (size_t i = 0; i < nw; i++) wd[i] = w[i];
  for (int i = 0; i < c.Cout; i++) bd[i] = b[i];
  ref_conv(xd, wd, bias ? bd : NULL, yd, c);
  int64_t sx[4] = {c.N, c.Cin, c.H, c.W}, sw[4] = {c.Cout, c.Cin, c.KH, c.KW}, sb[1] = {c.Cout},
          sy[4] = {c.N, c.Cout, OH, OW};
  nt_tensor tx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            tw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            tb = nt_tensor_view(b, NT_F32, nt_cpu(), 1, sb),
            ty = nt_tensor_view(y, NT_F32, nt_cpu(), 4, sy);
  nt_conv2d_params p = {c.stride, c.pad};
  if (CHECK_OK(ctx, nt_conv2d_forward(ctx, &tx, &tw, bias ? &tb : NULL, &ty, p))) {
    for (size_t i = 0; i < ny; i++) yg[i] = y[i];
    double e = nt_test_rel_err_d(yg, yd, (int64_t)ny);
    CHECK(e < 1e-6, "conv forward N%d Cin%d %dx%d Cout%d k%dx%d s%d p%d: rel err %.3g", c.N, c.Cin,
          c.H, c.W, c.Cout, c.KH, c.KW, c.stride, c.pad, e);
  }
  /* The fused ReLU variant: relu of the same fp64 result. */
  float *yr = malloc(4 * ny);
  nt_tensor tyr = nt_tensor_view(yr, NT_F32, nt_cpu(), 4, sy);
  if (CHECK_OK(ctx, nt_conv2d_relu_forward(ctx, &tx, &tw, bias ? &tb : NULL, &tyr, p))) {
    int neg = 0;
    for (size_t i = 0; i < ny; i++) {
      yg[i] = yr[i];
      neg += yd[i] < 0;
      yd[i] = yd[i] > 0 ? yd[i] : 0;
    }
    double e = nt_test_rel_err_d(yg, yd, (int64_t)ny);
    CHECK(e < 1e-6 && neg > 0, "conv relu forward: rel err %.3g (%d negatives clamped)", e, neg);
  }
  free(yr);
  /* bf16 storage of the same problem against the f32 result. */
  uint16_t *lx = malloc(2 * nx), *lw = malloc(2 * nw), *ly = malloc(2 * ny);
  for (size_t i = 0; i < nx; i++) lx[i] = nt_f32_to_bf16(x[i]);
  for (size_t i = 0; i < nw; i++) lw[i] = nt_f32_to_bf16(w[i]);
  nt_tensor bx = nt_tensor_view(lx, NT_BF16, nt_cpu(), 4, sx),
            bw = nt_tensor_view(lw, NT_BF16, nt_cpu(), 4, sw),
            by = nt_tensor_view(ly, NT_BF16, nt_cpu(), 4, sy);
  if (CHECK_OK(ctx, nt_conv2d_forward(ctx, &bx, &bw, bias ? &tb : NULL, &by, p))) {
    float *yb = malloc(4 * ny);
    for (size_t i = 0; i < ny; i++) yb[i] = nt_bf16_to_f32(ly[i]);
    double e = nt_test_rel_err(yb, y, (int64_t)ny);
    CHECK(e < 1e-2, "conv forward bf16 (f32 bias): rel err vs f32 %.3g", e);
    free(yb);
  }
  free(lx);
  free(lw);
  free(ly);
  free(x);
  free(w);
  free(b);
  free(y);
  free(xd);
  free(wd);
  free(bd);
  free(yd);
  free(yg);
}

static double loss(const double *x, const double *w, const double *b, const double *g, double *y,
                   ccase c, size_t ny) {
  ref_conv(x, w, b, y, c);
  double l = 0;
  for (size_t i = 0; i < ny; i++) l += y[i] * g[i];
  return l;
}

static void test_backward(nt_ctx *ctx, ccase c, uint64_t seed) {
  const int OH = out_dim(c.H, c.KH, c.stride, c.pad), OW = out_dim(c.W, c.KW, c.stride, c.pad);
  const size_t nx = (size_t)c.N * c.Cin * c.H * c.W, nw = (size_t)c.Cout * c.Cin * c.KH * c.KW;
  const size_t ny = (size_t)c.N * c.Cout * OH * OW, nb = (size_t)c.Cout;
  nt_test_rng rng = {seed};
  /* x w b g | dx dw db (pre-filled) | pre copies */
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * nb), *g = malloc(4 * ny);
  float *dx = malloc(4 * nx), *dw = malloc(4 * nw), *db = malloc(4 * nb);
  float *px = malloc(4 * nx), *pw = malloc(4 * nw), *pb = malloc(4 * nb);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, b, (int64_t)nb, -1, 1);
  nt_test_fill_uniform(&rng, g, (int64_t)ny, -1, 1);
  nt_test_fill_uniform(&rng, px, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, pw, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, pb, (int64_t)nb, -1, 1);
  memcpy(dx, px, 4 * nx);
  memcpy(dw, pw, 4 * nw);
  memcpy(db, pb, 4 * nb);
  int64_t sx[4] = {c.N, c.Cin, c.H, c.W}, sw[4] = {c.Cout, c.Cin, c.KH, c.KW}, sb[1] = {c.Cout},
          sy[4] = {c.N, c.Cout, OH, OW};
  nt_tensor tx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            tw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            tg = nt_tensor_view(g, NT_F32, nt_cpu(), 4, sy),
            tdx = nt_tensor_view(dx, NT_F32, nt_cpu(), 4, sx),
            tdw = nt_tensor_view(dw, NT_F32, nt_cpu(), 4, sw),
            tdb = nt_tensor_view(db, NT_F32, nt_cpu(), 1, sb);
  nt_conv2d_params p = {c.stride, c.pad};
  if (CHECK_OK(ctx, nt_conv2d_backward(ctx, &tg, &tx, &tw, &tdx, &tdw, &tdb, p))) {
    double *xd = malloc(8 * nx), *wd = malloc(8 * nw), *bd = malloc(8 * nb), *gd = malloc(8 * ny),
           *yd = malloc(8 * ny);
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    for (size_t i = 0; i < nw; i++) wd[i] = w[i];
    for (size_t i = 0; i < nb; i++) bd[i] = b[i];
    for (size_t i = 0; i < ny; i++) gd[i] = g[i];
    double *ins[3] = {xd, wd, bd};
    size_t ns[3] = {nx, nw, nb};
    const float *got[3] = {dx, dw, db}, *pre[3] = {px, pw, pb};
    const char *names[3] = {"dx", "dw", "db"};
    for (int which = 0; which < 3; which++) {
      double *num = malloc(8 * ns[which]), *ana = malloc(8 * ns[which]);
      for (size_t i = 0; i < ns[which]; i++) {
        const double keep = ins[which][i], eps = 1e-3;
        ins[which][i] = keep + eps;
        double lp = loss(xd, wd, bd, gd, yd, c, ny);
        ins[which][i] = keep - eps;
        double lm = loss(xd, wd, bd, gd, yd, c, ny);
        ins[which][i] = keep;
        num[i] = (lp - lm) / (2 * eps);
        ana[i] = (double)got[which][i] - (double)pre[which][i];
      }
      double e = nt_test_rel_err_d(ana, num, (int64_t)ns[which]);
      CHECK(e < 1e-5,
            "conv backward N%d Cin%d %dx%d Cout%d k%dx%d s%d p%d: %s vs finite "
            "differences rel err %.3g",
            c.N, c.Cin, c.H, c.W, c.Cout, c.KH, c.KW, c.stride, c.pad, names[which], e);
      free(num);
      free(ana);
    }
    free(xd);
    free(wd);
    free(bd);
    free(gd);
    free(yd);
  }
  /* Only dw requested: dx and db untouched. */
  memcpy(dx, px, 4 * nx);
  memcpy(db, pb, 4 * nb);
  if (CHECK_OK(ctx, nt_conv2d_backward(ctx, &tg, &tx, &tw, NULL, &tdw, NULL, p)))
    CHECK(memcmp(dx, px, 4 * nx) == 0 && memcmp(db, pb, 4 * nb) == 0,
          "NULL gradients must not be written");
  free(x);
  free(w);
  free(b);
  free(g);
  free(dx);
  free(dw);
  free(db);
  free(px);
  free(pw);
  free(pb);
}

/* bf16 x, w, dy with an F32 dw (fp32 master gradients, no bf16 rounding of dw): dw matches the
 * F32 computation on the same (bf16-exact) values, and accumulates. */
static void test_f32_dw(nt_ctx *ctx) {
  const ccase c = {2, 3, 7, 6, 4, 3, 3, 1, 1};
  int64_t sx[4] = {2, 3, 7, 6}, sw[4] = {4, 3, 3, 3}, sy[4] = {2, 4, 7, 6};
  enum { NX = 2 * 3 * 7 * 6, NW = 4 * 3 * 3 * 3, NY = 2 * 4 * 7 * 6 };
  static float x[NX], w[NW], dy[NY], dwf[NW], dwr[NW];
  static uint16_t bx[NX], bw[NW], bdy[NY];
  nt_test_rng rng = {77};
  nt_test_fill_uniform(&rng, x, NX, -1, 1);
  nt_test_fill_uniform(&rng, w, NW, -1, 1);
  nt_test_fill_uniform(&rng, dy, NY, -1, 1);
  for (int i = 0; i < NX; i++) x[i] = nt_bf16_to_f32(bx[i] = nt_f32_to_bf16(x[i]));
  for (int i = 0; i < NW; i++) w[i] = nt_bf16_to_f32(bw[i] = nt_f32_to_bf16(w[i]));
  for (int i = 0; i < NY; i++) dy[i] = nt_bf16_to_f32(bdy[i] = nt_f32_to_bf16(dy[i]));
  memset(dwf, 0, sizeof dwf);
  memset(dwr, 0, sizeof dwr);
  nt_conv2d_params p = {c.stride, c.pad};
  nt_tensor fx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            fw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            fdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            fdw = nt_tensor_view(dwr, NT_F32, nt_cpu(), 4, sw),
            hx = nt_tensor_view(bx, NT_BF16, nt_cpu(), 4, sx),
            hw = nt_tensor_view(bw, NT_BF16, nt_cpu(), 4, sw),
            hdy = nt_tensor_view(bdy, NT_BF16, nt_cpu(), 4, sy),
            hdw = nt_tensor_view(dwf, NT_F32, nt_cpu(), 4, sw);
  bool ok = CHECK_OK(ctx, nt_conv2d_backward(ctx, &fdy, &fx, &fw, NULL, &fdw, NULL, p)) &&
            CHECK_OK(ctx, nt_conv2d_backward(ctx, &hdy, &hx, &hw, NULL, &hdw, NULL, p)) &&
            CHECK_OK(ctx, nt_conv2d_backward(ctx, &hdy, &hx, &hw, NULL, &hdw, NULL, p));
  if (ok) {
    for (int i = 0; i < NW; i++) dwr[i] *= 2;
    double e = nt_test_rel_err(dwf, dwr, NW);
    CHECK(e < 1e-6, "conv bf16 inputs, f32 dw accumulated twice: rel err %.3g", e);
  }
  nt_tensor hdw16 = nt_tensor_view(dwf, NT_F16, nt_cpu(), 4, sw);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_conv2d_backward(ctx, &hdy, &hx, &hw, NULL, &hdw16, NULL, p));
}

/* nt_conv2d_relu_backward = nt_conv2d_backward of dy masked by y > 0 (same sums: exact). */
static void test_relu_backward(nt_ctx *ctx) {
  int64_t sx[4] = {2, 3, 7, 6}, sw[4] = {4, 3, 3, 3}, sy[4] = {2, 4, 7, 6}, sb[1] = {4};
  enum { NX = 2 * 3 * 7 * 6, NW = 4 * 3 * 3 * 3, NY = 2 * 4 * 7 * 6 };
  static float x[NX], w[NW], b[4], y[NY], dy[NY], dz[NY], g1[NX + NW + 4], g2[NX + NW + 4];
  nt_test_rng rng = {78};
  nt_test_fill_uniform(&rng, x, NX, -1, 1);
  nt_test_fill_uniform(&rng, w, NW, -1, 1);
  nt_test_fill_uniform(&rng, b, 4, -1, 1);
  nt_test_fill_uniform(&rng, dy, NY, -1, 1);
  nt_conv2d_params p = {1, 1};
  nt_tensor tx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            tw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            tb = nt_tensor_view(b, NT_F32, nt_cpu(), 1, sb),
            ty = nt_tensor_view(y, NT_F32, nt_cpu(), 4, sy),
            tdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            tdz = nt_tensor_view(dz, NT_F32, nt_cpu(), 4, sy);
  memset(g1, 0, sizeof g1);
  memset(g2, 0, sizeof g2);
  nt_tensor dx1 = nt_tensor_view(g1, NT_F32, nt_cpu(), 4, sx),
            dw1 = nt_tensor_view(g1 + NX, NT_F32, nt_cpu(), 4, sw),
            db1 = nt_tensor_view(g1 + NX + NW, NT_F32, nt_cpu(), 1, sb),
            dx2 = nt_tensor_view(g2, NT_F32, nt_cpu(), 4, sx),
            dw2 = nt_tensor_view(g2 + NX, NT_F32, nt_cpu(), 4, sw),
            db2 = nt_tensor_view(g2 + NX + NW, NT_F32, nt_cpu(), 1, sb);
  if (!CHECK_OK(ctx, nt_conv2d_relu_forward(ctx, &tx, &tw, &tb, &ty, p))) return;
  int masked = 0;
  for (int i = 0; i < NY; i++) {
    dz[i] = y[i] > 0 ? dy[i] : 0.0f;
    masked += !(y[i] > 0);
  }
  if (CHECK_OK(ctx, nt_conv2d_backward(ctx, &tdz, &tx, &tw, &dx1, &dw1, &db1, p)) &&
      CHECK_OK(ctx, nt_conv2d_relu_backward(ctx, &tdy, &ty, &tx, &tw, &dx2, &dw2, &db2, p))) {
    CHECK(masked > 0 && memcmp(g1, g2, sizeof g1) == 0,
          "conv relu backward differs from the backward of the masked dy (%d masked)", masked);
  }
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_conv2d_relu_backward(ctx, &tdy, NULL, &tx, &tw, &dx2, &dw2, &db2, p));
  CHECK_ERR(ctx, NT_ERR_SHAPE,
            nt_conv2d_relu_backward(ctx, &tdy, &tx, &tx, &tw, &dx2, &dw2, &db2, p));
}

static void test_errors(nt_ctx *ctx) {
  static float buf[4][2 * 3 * 8 * 8];
  int64_t sx[4] = {2, 3, 8, 8}, sw[4] = {4, 3, 3, 3}, sy[4] = {2, 4, 8, 8}, sb[1] = {4};
  nt_tensor x = nt_tensor_view(buf[0], NT_F32, nt_cpu(), 4, sx);
  nt_tensor w = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sw);
  nt_tensor y = nt_tensor_view(buf[2], NT_F32, nt_cpu(), 4, sy);
  nt_tensor b = nt_tensor_view(buf[3], NT_F32, nt_cpu(), 1, sb);
  nt_conv2d_params p = {1, 1};
  CHECK_OK(ctx, nt_conv2d_forward(ctx, &x, &w, &b, &y, p));
  int64_t sw2[4] = {4, 2, 3, 3};
  nt_tensor w2 = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sw2);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_conv2d_forward(ctx, &x, &w2, &b, &y, p));
  nt_conv2d_params p2 = {2, 1};
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_conv2d_forward(ctx, &x, &w, &b, &y, p2));
  nt_conv2d_params p0 = {0, 1};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_conv2d_forward(ctx, &x, &w, &b, &y, p0));
  int64_t sbig[4] = {4, 3, 11, 11};
  nt_tensor wbig = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sbig);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_conv2d_forward(ctx, &x, &wbig, &b, &y, p));
  nt_tensor wh = nt_tensor_view(buf[1], NT_F16, nt_cpu(), 4, sw);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_conv2d_forward(ctx, &x, &wh, &b, &y, p));
  int64_t sb5[1] = {5};
  nt_tensor b5 = nt_tensor_view(buf[3], NT_F32, nt_cpu(), 1, sb5);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_conv2d_forward(ctx, &x, &w, &b5, &y, p));
  nt_tensor xi = nt_tensor_view(buf[0], NT_I32, nt_cpu(), 4, sx);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_conv2d_forward(ctx, &xi, &w, &b, &y, p));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_conv2d_backward(ctx, &y, &x, &w, &w, NULL, NULL, p));
  nt_tensor xc = x;
  xc.device = nt_cuda(0);
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_conv2d_forward(ctx, &xc, &w, &b, &y, p));
  /* Flatten is a reshape view: [2, 4, 8, 8] -> [2, 256] over the same memory. */
  int64_t flat[2] = {2, 4 * 8 * 8};
  nt_tensor f;
  if (CHECK_OK(ctx, nt_tensor_reshape(ctx, &y, 2, flat, &f)))
    CHECK(f.data == y.data && f.shape[1] == 256, "flatten must be a view");
}

/* nt_conv2d_chunk_images: the CNN's convolutions at batch 128 (f16), edge cases, the
 * option conv_l2_mb (its default "auto" is < 0), and invariants over a sweep. */
static void test_chunk_policy(void) {
  const double dflt = nt_ctx_options_default().conv_l2_mb;
  CHECK(dflt < 0, "conv_l2_mb defaults to the policy (%g)", dflt);
  /* conv1 forward: 784 rows x Kp 16 x 2 B = 25 KB per image: the batch fits in 8 MiB */
  CHECK(nt_conv2d_chunk_images(128, 784, 784 * 16 * 2, dflt) == 128, "conv1: one chunk");
  /* conv2 forward: 464 KB per image; 16384 rows need 21 images -> 7 chunks of 19 (14 last) */
  int k = nt_conv2d_chunk_images(128, 784, 784 * 296 * 2, dflt);
  CHECK(k == 19, "conv2: %d images per chunk, expected 19", k);
  /* conv4 forward: 229 KB per image; 84 images for 16384 rows would take 19 MB > 16 MiB: 73
   * at most -> 2 chunks of 64 */
  k = nt_conv2d_chunk_images(128, 196, 196 * 584 * 2, dflt);
  CHECK(k == 64, "conv4: %d images per chunk, expected 64", k);
  CHECK(nt_conv2d_chunk_images(4, 784, 784 * 296 * 2, dflt) == 4, "a small batch is one chunk");
  CHECK(nt_conv2d_chunk_images(0, 784, 1e6, dflt) == 1 &&
            nt_conv2d_chunk_images(-3, 1, 1, dflt) == 1,
        "no images: 1");
  CHECK(nt_conv2d_chunk_images(64, 10000, 20.0 * 1048576, dflt) == 1,
        "an image over 16 MiB: 1");
  int bad = 0;
  for (int n = 1; n <= 300; n += 7)
    for (int64_t rows = 1; rows <= 1 << 16; rows *= 4)
      for (double bytes = 256; bytes <= 64.0 * 1048576; bytes *= 8) {
        k = nt_conv2d_chunk_images(n, rows, bytes, dflt);
        const int chunks = (n + k - 1) / k;
        bool ok = k >= 1 && k <= n && (k == 1 || k * bytes <= NT_CONV_CHUNK_MAX_BYTES) &&
                  (n * bytes > NT_CONV_CHUNK_BYTES || k == n);
        /* balanced: one image fewer per chunk would take another chunk */
        ok = ok && (k == 1 || (n + k - 2) / (k - 1) > chunks);
        if (!ok && bad++ == 0)
          printf("  chunk policy: n %d rows %lld bytes %g -> %d per chunk\n", n,
                 (long long)rows, bytes, k);
      }
  CHECK(bad == 0, "chunk policy invariants: %d cases fail", bad);
  CHECK(nt_conv2d_chunk_images(128, 784, 784 * 296 * 2, 0.0) == 128,
        "conv_l2_mb 0: whole batch");
  /* 3 images of 300 kB per MiB: 10 -> 3, 3, 3, 1 */
  k = nt_conv2d_chunk_images(10, 1 << 20, 300000, 1.0);
  CHECK(k == 3, "conv_l2_mb 1: %d images per chunk, expected 3", k);
  CHECK(nt_conv2d_chunk_images(10, 1, 784 * 32 * 2, 0.05) == 1, "conv_l2_mb 0.05: one image");
  nt_ctx_options o = nt_ctx_options_default();
  CHECK(nt_ctx_options_set(&o, "conv_l2_mb", "1.5") == NT_OK && o.conv_l2_mb == 1.5 &&
            nt_ctx_options_set(&o, "conv_l2_mb", "auto") == NT_OK && o.conv_l2_mb < 0 &&
            nt_ctx_options_set(&o, "conv_l2_mb", "-2") == NT_ERR_INVALID_ARG,
        "conv_l2_mb from text: 1.5, auto, -2 refused");
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  const ccase fwd[] = {{2, 3, 28, 28, 5, 3, 3, 1, 1}, {2, 3, 13, 13, 5, 3, 3, 2, 1},
                       {1, 2, 7, 9, 4, 5, 3, 3, 2},   {3, 1, 5, 5, 2, 1, 1, 1, 0},
                       {2, 3, 13, 13, 5, 3, 3, 1, 0}, {1, 4, 6, 6, 3, 6, 6, 1, 0}};
  for (int i = 0; i < (int)(sizeof fwd / sizeof fwd[0]); i++) {
    test_forward(ctx, fwd[i], true, 10 + (uint64_t)i);
    test_forward(ctx, fwd[i], false, 20 + (uint64_t)i);
  }
  const ccase bwd[] = {{2, 3, 6, 7, 4, 3, 3, 2, 1},
                       {1, 2, 5, 5, 3, 3, 3, 1, 0},
                       {2, 3, 13, 13, 5, 3, 3, 2, 1},
                       {1, 1, 4, 6, 2, 2, 3, 1, 2}};
  for (int i = 0; i < (int)(sizeof bwd / sizeof bwd[0]); i++)
    test_backward(ctx, bwd[i], 40 + (uint64_t)i);
  test_f32_dw(ctx);
  test_relu_backward(ctx);
  test_errors(ctx);
  test_chunk_policy();
  nt_ctx_free(ctx);
  return nt_test_finish();
}
