/* CUDA NHWC Conv2d (tensor-core implicit GEMM for F16 / BF16, direct kernels for F32) and NHWC
 * MaxPool2d against the CPU reference (ops/conv2d_nhwc.h). Conv: the CNN's four layers at its
 * default widths (32 / 64), at small ones (8 / 16: the widths scripts/gpu_sanitize.sh trains)
 * and at odd ones (5 / 12), batch 16, and conv2 / conv4 at the training batch 256; odd shapes
 * (N*H*W not a multiple of the 128-row tile, Cin = 1 / 3 / 8 / 24 / 40, Cout = 5 / 24 / 40 /
 * 72), stride 2 (dx by the direct kernel), pad 0, a 3x5 kernel; bias f32 or the dtype, fused
 * ReLU (forward) and the ReLU mask (backward), dw f32 or the dtype. Outputs written whole (y,
 * dx, the pools' y and argmax) start as NaN (argmax: a sentinel), so an element a kernel skips
 * fails the comparison; dw / db are accumulated onto a prefilled value, and a second backward
 * must give bit-identical gradients (fixed-order split-K). Relative errors ||gpu - ref|| /
 * ||ref|| are printed per case, and the worst per dtype at the end; the bounds (below) are
 * under twice the H200's worst. MaxPool must match exactly, in both y layouts, with and
 * without the mask, and so must the fused conv + pool forward against conv then pool (Cout 5 /
 * 8 / 12 / 16 / 24 / 32 / 64 / 72, NCHW y among them for Cout 8 / 12 / 16). */
#include "tests/testutil.h"
#include "ops/conv2d_nhwc.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int N, Cin, H, W, Cout, KH, KW, stride, pad;
} ccase;

static bool put(nt_ctx *g, nt_tensor *dev, nt_dtype dt, int ndim, const int64_t *shape,
                const float *src) {
  if (!CHECK_OK(g, nt_tensor_alloc(g, dev, dt, ndim, shape))) return false;
  return nt_test_upload(g, dev, src);
}

/* An output that a kernel must write whole, allocated holding garbage no kernel produces: NaN
 * in a float dtype (it equals nothing, and makes a relative error infinite), kUnwritten in I32
 * (an argmax is never negative). */
enum { kUnwritten = -12345 };
static bool put_garbage(nt_ctx *g, nt_tensor *dev, nt_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *h = malloc(((size_t)n + 1) * sizeof *h);
  if (!h) return false;
  for (int64_t i = 0; i < n; i++) h[i] = dt == NT_I32 ? (float)kUnwritten : NAN;
  bool ok = put(g, dev, dt, ndim, shape, h);
  free(h);
  return ok;
}

static double worst[3][4];   /* [dtype][y, dx, dw, db] */

/* Bounds on ||gpu - ref|| / ||ref||, [f32, f16, bf16][y, dx, dw, db]: under twice the worst
 * the H200 measured over these cases (session 12, 03:20 UTC):
 *   f32  y 4.17e-7 dx 4.15e-7 dw 1.57e-7 db 1.82e-7
 *   f16  y 2.12e-4 dx 2.12e-4 dw 2.28e-4 db 2.41e-4
 *   bf16 y 1.89e-3 dx 1.68e-3 dw 2.16e-3 db 2.07e-3 */
static const double bound[3][4] = {{8e-7, 8e-7, 3e-7, 3.6e-7},
                                   {4.2e-4, 4.2e-4, 4.5e-4, 4.8e-4},
                                   {3.7e-3, 3.3e-3, 4.3e-3, 4.1e-3}};

static int dt_index(nt_dtype dt) { return dt == NT_F32 ? 0 : dt == NT_F16 ? 1 : 2; }

static double check_err(nt_dtype dt, int what, const float *got, const float *ref, size_t n,
                        const char *label, const char *name) {
  double e = nt_test_rel_err(got, ref, (int64_t)n);
  CHECK(e < bound[dt_index(dt)][what], "%s: %s rel err %.3g (bound %.2g)", label, name, e,
        bound[dt_index(dt)][what]);
  if (e > worst[dt_index(dt)][what]) worst[dt_index(dt)][what] = e;
  return e;
}

static void conv_case(nt_ctx *g, nt_ctx *c, nt_dtype dt, ccase k, bool f32_bias, bool relu,
                      bool f32_dw, uint64_t seed) {
  const int OH = (k.H + 2 * k.pad - k.KH) / k.stride + 1,
            OW = (k.W + 2 * k.pad - k.KW) / k.stride + 1;
  const size_t nx = (size_t)k.N * k.H * k.W * k.Cin, nw = (size_t)k.Cout * k.Cin * k.KH * k.KW;
  const size_t ny = (size_t)k.N * OH * OW * k.Cout, nb = (size_t)k.Cout;
  const nt_dtype bdt = f32_bias ? NT_F32 : dt, wdt = f32_dw ? NT_F32 : dt;
  int64_t sx[4] = {k.N, k.H, k.W, k.Cin}, sw[4] = {k.Cout, k.Cin, k.KH, k.KW},
          sb[1] = {k.Cout}, sy[4] = {k.N, OH, OW, k.Cout};
  nt_test_rng rng = {seed};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * nb), *dy = malloc(4 * ny);
  float *pw = malloc(4 * nw), *pb = malloc(4 * nb), *junk = malloc(4 * nx);
  float *ry = malloc(4 * ny), *rdx = malloc(4 * nx), *rdw = malloc(4 * nw), *rdb = malloc(4 * nb);
  float *gy = malloc(4 * ny), *gdx = malloc(4 * nx), *gdw = malloc(4 * nw), *gdb = malloc(4 * nb);
  float *gdw2 = malloc(4 * nw), *gdb2 = malloc(4 * nb);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, b, (int64_t)nb, -1, 1);
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  nt_test_fill_uniform(&rng, pw, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, pb, (int64_t)nb, -1, 1);
  for (size_t i = 0; i < nx; i++) junk[i] = NAN;   /* dx is overwritten whole */
  /* Round the inputs to the dtypes the GPU sees, so the reference starts from the same values. */
  free(nt_test_to_dtype(x, nx, dt));
  free(nt_test_to_dtype(w, nw, dt));
  free(nt_test_to_dtype(b, nb, bdt));
  free(nt_test_to_dtype(dy, ny, dt));
  free(nt_test_to_dtype(pw, nw, wdt));
  free(nt_test_to_dtype(pb, nb, bdt));
  char label[160];
  snprintf(label, sizeof label, "%s N%d %dx%dx%d->%d k%dx%d s%d p%d%s%s%s", nt_dtype_name(dt),
           k.N, k.H, k.W, k.Cin, k.Cout, k.KH, k.KW, k.stride, k.pad, f32_bias ? " b32" : "",
           relu ? " relu" : "", f32_dw ? " dw32" : "");
  nt_conv2d_params p = {k.stride, k.pad};
  /* CPU reference in f32 (fp64 sums) from the rounded inputs; the ReLU mask is the reference
   * y rounded to dt, handed to both sides. */
  memcpy(rdw, pw, 4 * nw);
  memcpy(rdb, pb, 4 * nb);
  nt_tensor cx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            cw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            cb = nt_tensor_view(b, NT_F32, nt_cpu(), 1, sb),
            cy = nt_tensor_view(ry, NT_F32, nt_cpu(), 4, sy),
            cdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            cdx = nt_tensor_view(rdx, NT_F32, nt_cpu(), 4, sx),
            cdw = nt_tensor_view(rdw, NT_F32, nt_cpu(), 4, sw),
            cdb = nt_tensor_view(rdb, NT_F32, nt_cpu(), 1, sb);
  bool ok = CHECK_OK(c, nt_conv2d_nhwc_forward(c, &cx, &cw, &cb, &cy, p, relu));
  float *mask = malloc(4 * ny);
  memcpy(mask, ry, 4 * ny);
  free(nt_test_to_dtype(mask, ny, dt));
  nt_tensor cm = nt_tensor_view(mask, NT_F32, nt_cpu(), 4, sy);
  /* with the ReLU: dy masked by y on the way in, dx masked by x on the way out */
  ok = ok && CHECK_OK(c, nt_conv2d_nhwc_backward(c, &cdy, relu ? &cm : NULL, &cx, &cw, &cdx,
                                                 relu ? &cx : NULL, &cdw, &cdb, p));
  nt_tensor tx = {0}, tw = {0}, tb = {0}, ty = {0}, tdy = {0}, tm = {0}, tdx = {0}, tdw = {0},
            tdb = {0};
  ok = ok && put(g, &tx, dt, 4, sx, x) && put(g, &tw, dt, 4, sw, w) &&
       put(g, &tb, bdt, 1, sb, b) && put(g, &tdy, dt, 4, sy, dy) && put(g, &tm, dt, 4, sy, mask) &&
       put(g, &tdx, dt, 4, sx, junk) && put_garbage(g, &ty, dt, 4, sy) &&
       CHECK_OK(g, nt_tensor_alloc(g, &tdw, wdt, 4, sw)) &&
       CHECK_OK(g, nt_tensor_alloc(g, &tdb, bdt, 1, sb));
  ok = ok && CHECK_OK(g, nt_conv2d_nhwc_forward(g, &tx, &tw, &tb, &ty, p, relu)) &&
       nt_test_download(g, &ty, gy);
  if (ok) {
    printf("  %-44s y %.2e", label, check_err(dt, 0, gy, ry, ny, label, "y"));
  }
  /* two backward passes from the same prefilled dw / db: bit-identical */
  for (int pass = 0; pass < 2 && ok; pass++) {
    ok = nt_test_upload(g, &tdw, pw) && nt_test_upload(g, &tdb, pb) &&
         CHECK_OK(g, nt_conv2d_nhwc_backward(g, &tdy, relu ? &tm : NULL, &tx, &tw, &tdx,
                                             relu ? &tx : NULL, &tdw, &tdb, p)) &&
         nt_test_download(g, &tdx, gdx) && nt_test_download(g, &tdw, pass ? gdw2 : gdw) &&
         nt_test_download(g, &tdb, pass ? gdb2 : gdb);
  }
  if (ok) {
    /* dw and db are compared as gradients (the prefill removed), their accumulation by the
     * totals: the sums are in fp32 on the GPU, so the prefill's rounding is part of dw's. */
    for (size_t i = 0; i < nw; i++) {
      gdw[i] -= pw[i];
      rdw[i] -= pw[i];
    }
    for (size_t i = 0; i < nb; i++) {
      gdb[i] -= pb[i];
      rdb[i] -= pb[i];
    }
    double ex = check_err(dt, 1, gdx, rdx, nx, label, "dx");
    double ew = check_err(dt, 2, gdw, rdw, nw, label, "dw");
    double eb = check_err(dt, 3, gdb, rdb, nb, label, "db");
    printf(" dx %.2e dw %.2e db %.2e\n", ex, ew, eb);
    for (size_t i = 0; i < nw; i++) gdw2[i] -= pw[i];
    for (size_t i = 0; i < nb; i++) gdb2[i] -= pb[i];
    CHECK(memcmp(gdw, gdw2, 4 * nw) == 0 && memcmp(gdb, gdb2, 4 * nb) == 0,
          "%s: a second backward gives the same dw / db bits", label);
  } else {
    printf("\n");
  }
  nt_tensor *all[9] = {&tx, &tw, &tb, &ty, &tdy, &tm, &tdx, &tdw, &tdb};
  for (int i = 0; i < 9; i++) nt_tensor_free(g, all[i]);
  float *bufs[17] = {x, w, b, dy, pw, pb, junk, ry, rdx, rdw, rdb, gy, gdx, gdw, gdb, gdw2, gdb2};
  for (int i = 0; i < 17; i++) free(bufs[i]);
  free(mask);
}

/* dx only, dw only, db only: each output alone (the others NULL). */
static void partial_outputs(nt_ctx *g, nt_ctx *c, nt_dtype dt) {
  const ccase k = {3, 8, 9, 9, 16, 3, 3, 1, 1};
  const size_t nx = (size_t)k.N * k.H * k.W * k.Cin, nw = (size_t)k.Cout * k.Cin * 9,
               ny = (size_t)k.N * k.H * k.W * k.Cout;
  int64_t sx[4] = {k.N, k.H, k.W, k.Cin}, sw[4] = {k.Cout, k.Cin, 3, 3}, sb[1] = {k.Cout},
          sy[4] = {k.N, k.H, k.W, k.Cout};
  nt_test_rng rng = {77};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *dy = malloc(4 * ny);
  float *rdx = malloc(4 * nx), *rdw = calloc(nw, 4), *rdb = calloc(16, 4);
  float *gdx = malloc(4 * nx), *gdw = malloc(4 * nw), *gdb = malloc(4 * 16), *zero = calloc(nw, 4);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  free(nt_test_to_dtype(x, nx, dt));
  free(nt_test_to_dtype(w, nw, dt));
  free(nt_test_to_dtype(dy, ny, dt));
  nt_conv2d_params p = {1, 1};
  nt_tensor cx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            cw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            cdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            cdx = nt_tensor_view(rdx, NT_F32, nt_cpu(), 4, sx),
            cdw = nt_tensor_view(rdw, NT_F32, nt_cpu(), 4, sw),
            cdb = nt_tensor_view(rdb, NT_F32, nt_cpu(), 1, sb);
  nt_tensor tx = {0}, tw = {0}, tdy = {0}, tdx = {0}, tdw = {0}, tdb = {0};
  bool ok = CHECK_OK(c, nt_conv2d_nhwc_backward(c, &cdy, NULL, &cx, &cw, &cdx, NULL, &cdw, &cdb,
                                                p)) &&
            put(g, &tx, dt, 4, sx, x) && put(g, &tw, dt, 4, sw, w) &&
            put(g, &tdy, dt, 4, sy, dy) && put(g, &tdx, dt, 4, sx, x) &&
            put(g, &tdw, NT_F32, 4, sw, zero) && put(g, &tdb, NT_F32, 1, sb, zero);
  ok = ok &&
       CHECK_OK(g, nt_conv2d_nhwc_backward(g, &tdy, NULL, &tx, &tw, &tdx, NULL, NULL, NULL, p)) &&
       CHECK_OK(g, nt_conv2d_nhwc_backward(g, &tdy, NULL, &tx, &tw, NULL, NULL, &tdw, NULL, p)) &&
       CHECK_OK(g, nt_conv2d_nhwc_backward(g, &tdy, NULL, &tx, &tw, NULL, NULL, NULL, &tdb, p)) &&
       nt_test_download(g, &tdx, gdx) && nt_test_download(g, &tdw, gdw) &&
       nt_test_download(g, &tdb, gdb);
  if (ok) {
    double ex = nt_test_rel_err(gdx, rdx, (int64_t)nx), ew = nt_test_rel_err(gdw, rdw, (int64_t)nw),
           eb = nt_test_rel_err(gdb, rdb, 16);
    const double *b = bound[dt_index(dt)];
    CHECK(ex < b[1] && ew < b[2] && eb < b[3], "%s: dx / dw / db alone: %.3g %.3g %.3g",
          nt_dtype_name(dt), ex, ew, eb);
  }
  nt_tensor *all[6] = {&tx, &tw, &tdy, &tdx, &tdw, &tdb};
  for (int i = 0; i < 6; i++) nt_tensor_free(g, all[i]);
  float *bufs[10] = {x, w, dy, rdx, rdw, rdb, gdx, gdw, gdb, zero};
  for (int i = 0; i < 10; i++) free(bufs[i]);
}

/* The conv + pool forward (pool in the conv's epilogue for F16 / BF16) against the GPU's own
 * conv then pool: the same values and argmax, bit for bit (the conv's rows only move). Both
 * pools' outputs start as garbage (put_garbage): an element either skips is counted apart. */
static void fused_pool_case(nt_ctx *g, nt_dtype dt, ccase k, bool nchw, uint64_t seed) {
  const int OH = (k.H + 2 * k.pad - k.KH) / k.stride + 1,
            OW = (k.W + 2 * k.pad - k.KW) / k.stride + 1, PH = OH / 2, PW = OW / 2;
  const size_t nx = (size_t)k.N * k.H * k.W * k.Cin, nw = (size_t)k.Cout * k.Cin * k.KH * k.KW;
  const size_t nz = (size_t)k.N * OH * OW * k.Cout, np = (size_t)k.N * PH * PW * k.Cout;
  int64_t sx[4] = {k.N, k.H, k.W, k.Cin}, sw[4] = {k.Cout, k.Cin, k.KH, k.KW}, sb[1] = {k.Cout},
          sz[4] = {k.N, OH, OW, k.Cout}, sp_hwc[4] = {k.N, PH, PW, k.Cout},
          sp_chw[4] = {k.N, k.Cout, PH, PW};
  const int64_t *sp = nchw ? sp_chw : sp_hwc;
  nt_test_rng rng = {seed};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * k.Cout);
  float *ya = malloc(4 * np), *yb = malloc(4 * np);
  int32_t *aa = malloc(4 * np), *ab = malloc(4 * np);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, b, k.Cout, -1, 1);
  nt_conv2d_params p = {k.stride, k.pad};
  nt_tensor tx = {0}, tw = {0}, tb = {0}, tz = {0}, t1 = {0}, t2 = {0}, m1 = {0}, m2 = {0};
  bool ok = put(g, &tx, dt, 4, sx, x) && put(g, &tw, dt, 4, sw, w) &&
            put(g, &tb, NT_F32, 1, sb, b) && put_garbage(g, &tz, dt, 4, sz) &&
            put_garbage(g, &t1, dt, 4, sp) && put_garbage(g, &t2, dt, 4, sp) &&
            put_garbage(g, &m1, NT_I32, 4, sp) && put_garbage(g, &m2, NT_I32, 4, sp);
  ok = ok && CHECK_OK(g, nt_conv2d_nhwc_forward(g, &tx, &tw, &tb, &tz, p, true)) &&
       CHECK_OK(g, nt_maxpool2d_nhwc_forward(g, &tz, &t1, &m1, 2, nchw)) &&
       CHECK_OK(g, nt_conv2d_nhwc_pool_forward(g, &tx, &tw, &tb, &t2, &m2, p, true, nchw, NULL)) &&
       nt_test_download(g, &t1, ya) && nt_test_download(g, &t2, yb);
  if (ok) {
    nt_tensor ha = nt_tensor_view(aa, NT_I32, nt_cpu(), 4, sp),
              hb = nt_tensor_view(ab, NT_I32, nt_cpu(), 4, sp);
    ok = CHECK_OK(g, nt_tensor_copy(g, &ha, &m1)) && CHECK_OK(g, nt_tensor_copy(g, &hb, &m2));
    int bad = 0, unwritten = 0;
    for (size_t i = 0; ok && i < np; i++) {
      bad += ya[i] != yb[i] || aa[i] != ab[i];
      unwritten += isnan(ya[i]) || isnan(yb[i]) || aa[i] == kUnwritten || ab[i] == kUnwritten;
    }
    CHECK(ok && bad == 0, "conv+pool %s N%d %dx%dx%d->%d%s: %d of %zu outputs differ from conv "
          "then pool (%d left unwritten by one of them)", nt_dtype_name(dt), k.N, k.H, k.W,
          k.Cin, k.Cout, nchw ? " nchw-y" : "", bad, np, unwritten);
  }
  nt_tensor *all[8] = {&tx, &tw, &tb, &tz, &t1, &t2, &m1, &m2};
  for (int i = 0; i < 8; i++) nt_tensor_free(g, all[i]);
  free(x);
  free(w);
  free(b);
  free(ya);
  free(yb);
  free(aa);
  free(ab);
  (void)nz;
}

static void pool_case(nt_ctx *g, nt_ctx *c, nt_dtype dt, int N, int H, int W, int C, int k,
                      bool nchw, bool masked) {
  const int OH = H / k, OW = W / k;
  const size_t nx = (size_t)N * H * W * C, ny = (size_t)N * OH * OW * C;
  int64_t sx[4] = {N, H, W, C}, sy_hwc[4] = {N, OH, OW, C}, sy_chw[4] = {N, C, OH, OW};
  const int64_t *sy = nchw ? sy_chw : sy_hwc;
  nt_test_rng rng = {(uint64_t)(H * 31 + k + C)};
  float *x = malloc(4 * nx), *dy = malloc(4 * ny), *junk = malloc(4 * nx);
  float *ry = malloc(4 * ny), *rdx = malloc(4 * nx), *gy = malloc(4 * ny), *gdx = malloc(4 * nx);
  int32_t *ram = malloc(4 * ny), *gam = malloc(4 * ny);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -3, 3);
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  for (size_t i = 0; i < nx; i++) junk[i] = NAN;   /* dx is overwritten whole */
  free(nt_test_to_dtype(x, nx, dt));
  free(nt_test_to_dtype(dy, ny, dt));
  nt_tensor cx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            cy = nt_tensor_view(ry, NT_F32, nt_cpu(), 4, sy),
            ca = nt_tensor_view(ram, NT_I32, nt_cpu(), 4, sy),
            cdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            cdx = nt_tensor_view(rdx, NT_F32, nt_cpu(), 4, sx);
  nt_tensor tx = {0}, ty = {0}, ta = {0}, tdy = {0}, tdx = {0};
  bool ok = CHECK_OK(c, nt_maxpool2d_nhwc_forward(c, &cx, &cy, &ca, k, nchw)) &&
            CHECK_OK(c, nt_maxpool2d_nhwc_backward(c, &cdy, &ca, masked ? &cy : NULL, &cdx, k,
                                                   nchw));
  ok = ok && put(g, &tx, dt, 4, sx, x) && put(g, &tdy, dt, 4, sy, dy) &&
       put(g, &tdx, dt, 4, sx, junk) && put_garbage(g, &ty, dt, 4, sy) &&
       put_garbage(g, &ta, NT_I32, 4, sy);
  ok = ok && CHECK_OK(g, nt_maxpool2d_nhwc_forward(g, &tx, &ty, &ta, k, nchw)) &&
       CHECK_OK(g, nt_maxpool2d_nhwc_backward(g, &tdy, &ta, masked ? &ty : NULL, &tdx, k, nchw)) &&
       nt_test_download(g, &ty, gy) && nt_test_download(g, &tdx, gdx);
  if (ok) {
    nt_tensor ha = nt_tensor_view(gam, NT_I32, nt_cpu(), 4, sy);
    ok = CHECK_OK(g, nt_tensor_copy(g, &ha, &ta));
    int bad = 0;
    for (size_t i = 0; i < ny; i++) bad += gy[i] != ry[i] || gam[i] != ram[i];
    for (size_t i = 0; i < nx; i++) bad += gdx[i] != rdx[i];
    CHECK(bad == 0, "maxpool_nhwc %s %dx%dx%d k%d%s%s: %d elements differ from the CPU",
          nt_dtype_name(dt), H, W, C, k, nchw ? " nchw-y" : "", masked ? " masked" : "", bad);
  }
  nt_tensor *all[5] = {&tx, &ty, &ta, &tdy, &tdx};
  for (int i = 0; i < 5; i++) nt_tensor_free(g, all[i]);
  float *bufs[7] = {x, dy, junk, ry, rdx, gy, gdx};
  for (int i = 0; i < 7; i++) free(bufs[i]);
  free(ram);
  free(gam);
}

int main(int argc, char **argv) {
  bool quick;
  if (!nt_test_quick_arg(argc, argv, &quick)) return 2;
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return 1;
  const nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  /* The CNN's layers as the model runs them (conv1 without dx in the model, tested anyway):
   * at its default widths 32 / 64, at 8 / 16 (gpu_sanitize.sh's --widths 8,16,32: Cout under
   * the 32-wide column tile, Cin 8 and 16 padded to one 32-wide k-step per tap) and at 5 / 12
   * (Cin and Cout not multiples of 8: element loads, element stores). */
  const ccase cnn[] = {{16, 1, 28, 28, 32, 3, 3, 1, 1},  {16, 32, 28, 28, 32, 3, 3, 1, 1},
                       {16, 32, 14, 14, 64, 3, 3, 1, 1}, {16, 64, 14, 14, 64, 3, 3, 1, 1},
                       {16, 1, 28, 28, 8, 3, 3, 1, 1},   {16, 8, 28, 28, 8, 3, 3, 1, 1},
                       {16, 8, 14, 14, 16, 3, 3, 1, 1},  {16, 16, 14, 14, 16, 3, 3, 1, 1},
                       {16, 1, 28, 28, 5, 3, 3, 1, 1},   {16, 5, 28, 28, 5, 3, 3, 1, 1},
                       {16, 5, 14, 14, 12, 3, 3, 1, 1},  {16, 12, 14, 14, 12, 3, 3, 1, 1}};
  /* Odd shapes: M = N*OH*OW not a multiple of 128; Cin 3 and 5 (element loads), 8 / 24 / 40
   * (16-byte chunks, Cp padded to 32 / 64); Cout 5, 24, 40, 72 (> 64: two column tiles);
   * stride 2 (dx by the direct kernel); pad 0; a 3x5 kernel (different pads for dx). */
  const ccase odd[] = {{3, 3, 7, 9, 5, 3, 3, 1, 1},    {2, 8, 13, 11, 24, 3, 3, 1, 1},
                       {3, 24, 9, 10, 40, 3, 3, 1, 1}, {2, 40, 6, 7, 72, 3, 3, 1, 1},
                       {3, 16, 11, 13, 32, 3, 3, 2, 1}, {2, 32, 9, 9, 16, 3, 3, 1, 0},
                       {2, 8, 9, 12, 8, 3, 5, 1, 1},   {5, 1, 28, 28, 32, 3, 3, 1, 1},
                       {1, 5, 5, 5, 3, 1, 1, 1, 0}};
  for (int d = 0; d < 3; d++) {
    for (int i = 0; i < (int)(sizeof cnn / sizeof cnn[0]); i++) {
      conv_case(g, c, dts[d], cnn[i], true, true, true, 10 + (uint64_t)i);
      conv_case(g, c, dts[d], cnn[i], false, false, false, 20 + (uint64_t)i);
    }
    for (int i = 0; i < (int)(sizeof odd / sizeof odd[0]); i++)
      conv_case(g, c, dts[d], odd[i], i % 2 == 0, i % 3 != 1, i % 2 == 1, 30 + (uint64_t)i);
    partial_outputs(g, c, dts[d]);
  }
  /* the training batch (the most split-K partials): conv2 in f16, conv4 in bf16 (the CPU
   * reference takes ~20 s each) */
  const ccase big[] = {{256, 32, 28, 28, 32, 3, 3, 1, 1}, {256, 64, 14, 14, 64, 3, 3, 1, 1}};
  for (int i = 0; i < (quick ? 0 : 2); i++)   /* --quick: the small cases reach every kernel */
    conv_case(g, c, dts[1 + i], big[i], true, true, true, 40 + (uint64_t)i);
  for (int d = 0; d < 3; d++) {
    pool_case(g, c, dts[d], 4, 28, 28, 32, 2, false, true);
    pool_case(g, c, dts[d], 4, 14, 14, 64, 2, true, true);
    pool_case(g, c, dts[d], 3, 13, 13, 5, 2, false, false);
    pool_case(g, c, dts[d], 2, 7, 8, 3, 3, true, false);
  }
  /* conv + pool (odd entries write y NCHW, even ones NHWC): the CNN's two at the default
   * widths (pool2 writes NCHW), at 8 / 16 and at 5 / 12 (each in the model's layout); odd
   * planes (7x9 -> 3x4: the last conv row and column are dropped), Cin 1 / 3 / 8 / 16, Cout 5
   * / 8 / 16 / 24 / 72, a stride-2 conv */
  const ccase fused[] = {{16, 32, 28, 28, 32, 3, 3, 1, 1}, {16, 64, 14, 14, 64, 3, 3, 1, 1},
                         {3, 8, 7, 9, 24, 3, 3, 1, 1},     {2, 3, 6, 10, 5, 3, 3, 1, 1},
                         {5, 1, 28, 28, 32, 3, 3, 1, 1},   {2, 16, 12, 12, 72, 3, 3, 1, 1},
                         {2, 8, 15, 13, 16, 3, 3, 2, 1},   {16, 16, 14, 14, 16, 3, 3, 1, 1},
                         {16, 8, 28, 28, 8, 3, 3, 1, 1},   {16, 12, 14, 14, 12, 3, 3, 1, 1},
                         {16, 5, 28, 28, 5, 3, 3, 1, 1},   {3, 8, 10, 14, 16, 3, 3, 1, 1},
                         {2, 16, 9, 7, 8, 3, 3, 1, 1},     {3, 16, 14, 14, 8, 3, 3, 1, 1}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < (int)(sizeof fused / sizeof fused[0]); i++)
      fused_pool_case(g, dts[d], fused[i], i % 2 == 1, 50 + (uint64_t)i);
  const char *names[4] = {"y", "dx", "dw", "db"};
  for (int d = 0; d < 3; d++) {
    printf("worst %s:", nt_dtype_name(dts[d]));
    for (int j = 0; j < 4; j++) printf(" %s %.2e", names[j], worst[d][j]);
    printf("\n");
  }
  nt_ctx_free(c);
  nt_ctx_free(g);
  return nt_test_finish();
}
