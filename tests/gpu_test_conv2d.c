/* CUDA Conv2d (im2col + cuBLASLt) and MaxPool2d vs the CPU reference, F32 / F16 / BF16, odd
 * sizes (28x28, 13x13, 7x9, 5x7, 11x10), stride 1..3, padding 0..3 (both dx paths), with and
 * without bias (f32 or the dtype), fused ReLU, F32 dw, the CNN's four convolutions (also at
 * the training batch of 128, where the default policy splits the batch into chunks), batches
 * split into several chunks with a shorter last one (default policy and option conv_l2_mb);
 * gradients accumulated twice into zeroed buffers. Tolerances ||gpu - ref|| / ||ref||: F32 1e-5, F16 2e-3,
 * BF16 1e-2. MaxPool must match exactly (values and argmax). */
#include "tests/testutil.h"
#include "ops/conv2d.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int N, Cin, H, W, Cout, KH, KW, stride, pad;
} ccase;

static bool put(nt_ctx *g, nt_tensor *dev, nt_dtype dt, int ndim, const int64_t *shape,
                const void *host) {
  if (!CHECK_OK(g, nt_tensor_alloc(g, dev, dt, ndim, shape))) return false;
  nt_tensor h = nt_tensor_view((void *)host, dt, nt_cpu(), ndim, shape);
  return CHECK_OK(g, nt_tensor_copy(g, dev, &h));
}

static bool get(nt_ctx *g, const nt_tensor *dev, float *out) {
  size_t n = (size_t)nt_tensor_numel(dev);
  void *tmp = malloc(n * nt_dtype_size(dev->dtype) + 1);
  nt_tensor h = nt_tensor_view(tmp, dev->dtype, nt_cpu(), dev->ndim, dev->shape);
  bool ok = CHECK_OK(g, nt_tensor_copy(g, &h, dev));
  for (size_t i = 0; ok && i < n; i++) out[i] = nt_load_f32(tmp, dev->dtype, (int64_t)i);
  free(tmp);
  return ok;
}

/* relu: nt_conv2d_relu_forward and nt_conv2d_relu_backward; f32_dw: dw is F32 whatever dt is. */
static void conv_case(nt_ctx *g, nt_ctx *c, nt_dtype dt, ccase k, bool bias, bool f32_bias,
                      bool relu, bool f32_dw, uint64_t seed) {
  const int OH = (k.H + 2 * k.pad - k.KH) / k.stride + 1,
            OW = (k.W + 2 * k.pad - k.KW) / k.stride + 1;
  const size_t nx = (size_t)k.N * k.Cin * k.H * k.W, nw = (size_t)k.Cout * k.Cin * k.KH * k.KW;
  const size_t ny = (size_t)k.N * k.Cout * OH * OW, nb = (size_t)k.Cout;
  const nt_dtype bdt = f32_bias ? NT_F32 : dt, wdt = f32_dw ? NT_F32 : dt;
  int64_t sx[4] = {k.N, k.Cin, k.H, k.W}, sw[4] = {k.Cout, k.Cin, k.KH, k.KW}, sb[1] = {k.Cout},
          sy[4] = {k.N, k.Cout, OH, OW};
  nt_test_rng rng = {seed};
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * nb), *dy = malloc(4 * ny);
  float *px = malloc(4 * nx), *pw = malloc(4 * nw), *pb = malloc(4 * nb);
  float *ry = malloc(4 * ny), *rdx = malloc(4 * nx), *rdw = malloc(4 * nw), *rdb = malloc(4 * nb);
  float *gy = malloc(4 * ny), *gdx = malloc(4 * nx), *gdw = malloc(4 * nw), *gdb = malloc(4 * nb);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -1, 1);
  nt_test_fill_uniform(&rng, w, (int64_t)nw, -1, 1);
  nt_test_fill_uniform(&rng, b, (int64_t)nb, -1, 1);
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  void *hx = nt_test_to_dtype(x, nx, dt), *hw = nt_test_to_dtype(w, nw, dt);
  void *hb = nt_test_to_dtype(b, nb, bdt), *hdy = nt_test_to_dtype(dy, ny, dt);
  /* Gradients start at zero on both sides, then a second GPU backward must double them. */
  memset(px, 0, 4 * nx);
  memset(pw, 0, 4 * nw);
  memset(pb, 0, 4 * nb);
  void *hpx = nt_test_to_dtype(px, nx, dt), *hpw = nt_test_to_dtype(pw, nw, wdt);
  void *hpb = nt_test_to_dtype(pb, nb, bdt);
  char label[128];
  snprintf(label, sizeof label, "conv %s N%d Cin%d %dx%d Cout%d k%dx%d s%d p%d%s%s%s",
           nt_dtype_name(dt), k.N, k.Cin, k.H, k.W, k.Cout, k.KH, k.KW, k.stride, k.pad,
           bias ? (f32_bias ? " f32-bias" : " bias") : "", relu ? " relu" : "",
           f32_dw ? " f32-dw" : "");
  nt_status (*fwd)(nt_ctx *, const nt_tensor *, const nt_tensor *, const nt_tensor *,
                   nt_tensor *, nt_conv2d_params) =
      relu ? nt_conv2d_relu_forward : nt_conv2d_forward;
  nt_conv2d_params p = {k.stride, k.pad};
  nt_tensor cx = nt_tensor_view(x, NT_F32, nt_cpu(), 4, sx),
            cw = nt_tensor_view(w, NT_F32, nt_cpu(), 4, sw),
            cb = nt_tensor_view(b, NT_F32, nt_cpu(), 1, sb),
            cy = nt_tensor_view(ry, NT_F32, nt_cpu(), 4, sy),
            cdy = nt_tensor_view(dy, NT_F32, nt_cpu(), 4, sy),
            cdx = nt_tensor_view(rdx, NT_F32, nt_cpu(), 4, sx),
            cdw = nt_tensor_view(rdw, NT_F32, nt_cpu(), 4, sw),
            cdb = nt_tensor_view(rdb, NT_F32, nt_cpu(), 1, sb);
  memset(rdx, 0, 4 * nx);
  memset(rdw, 0, 4 * nw);
  memset(rdb, 0, 4 * nb);
  nt_tensor tx = {0}, tw = {0}, tb = {0}, ty = {0}, tdy = {0}, tdx = {0}, tdw = {0}, tdb = {0};
  bool ok = CHECK_OK(c, fwd(c, &cx, &cw, bias ? &cb : NULL, &cy, p)) &&
            (relu || CHECK_OK(c, nt_conv2d_backward(c, &cdy, &cx, &cw, &cdx, &cdw,
                                                   bias ? &cdb : NULL, p)));
  ok = ok && put(g, &tx, dt, 4, sx, hx) && put(g, &tw, dt, 4, sw, hw) &&
       put(g, &tb, bdt, 1, sb, hb) && put(g, &tdy, dt, 4, sy, hdy) &&
       put(g, &tdx, dt, 4, sx, hpx) && put(g, &tdw, wdt, 4, sw, hpw) &&
       put(g, &tdb, bdt, 1, sb, hpb) && CHECK_OK(g, nt_tensor_alloc(g, &ty, dt, 4, sy));
  ok = ok && CHECK_OK(g, fwd(g, &tx, &tw, bias ? &tb : NULL, &ty, p)) &&
       get(g, &ty, gy);
  if (ok) {
    double e = nt_test_rel_err(gy, ry, (int64_t)ny);
    CHECK(nt_test_note(dt, e) < nt_test_tol(dt), "%s: y rel err %.3g", label, e);
    printf("  %-52s y %.2e", label, e);
  }
  /* With the fused ReLU, backward is nt_conv2d_relu_backward; both sides mask dy with the GPU's
   * y (the CPU's could differ in sign right at 0). */
  nt_tensor cgy = nt_tensor_view(gy, NT_F32, nt_cpu(), 4, sy);
  ok = ok && (!relu || CHECK_OK(c, nt_conv2d_relu_backward(c, &cdy, &cgy, &cx, &cw, &cdx, &cdw,
                                                           bias ? &cdb : NULL, p)));
  for (int pass = 1; pass <= 2 && ok; pass++) {
    nt_tensor *gb = bias ? &tdb : NULL;
    ok = CHECK_OK(g, relu ? nt_conv2d_relu_backward(g, &tdy, &ty, &tx, &tw, &tdx, &tdw, gb, p)
                          : nt_conv2d_backward(g, &tdy, &tx, &tw, &tdx, &tdw, gb, p)) &&
         get(g, &tdx, gdx) && get(g, &tdw, gdw) && get(g, &tdb, gdb);
    if (!ok) break;
    for (size_t i = 0; i < nx; i++) gdx[i] /= (float)pass;
    for (size_t i = 0; i < nw; i++) gdw[i] /= (float)pass;
    for (size_t i = 0; i < nb; i++) gdb[i] /= (float)pass;
    double ex = nt_test_rel_err(gdx, rdx, (int64_t)nx), ew = nt_test_rel_err(gdw, rdw, (int64_t)nw);
    double eb = nt_test_rel_err(gdb, rdb, (int64_t)nb);
    CHECK(nt_test_note(dt, ex) < nt_test_tol(dt), "%s: dx rel err %.3g (pass %d)", label, ex, pass);
    CHECK(nt_test_note(dt, ew) < nt_test_tol(dt), "%s: dw rel err %.3g (pass %d)", label, ew, pass);
    /* An F32 db of f16/bf16 data sums dt-precision products: dt's tolerance. */
    CHECK(nt_test_note(dt, eb) < nt_test_tol(dt), "%s: db rel err %.3g (pass %d)", label, eb, pass);
    if (pass == 1) printf(" dx %.2e dw %.2e db %.2e", ex, ew, eb);
  }
  printf("\n");
  nt_tensor *all[8] = {&tx, &tw, &tb, &ty, &tdy, &tdx, &tdw, &tdb};
  for (int i = 0; i < 8; i++) nt_tensor_free(g, all[i]);
  free(hx);
  free(hw);
  free(hb);
  free(hdy);
  free(hpx);
  free(hpw);
  free(hpb);
  free(x);
  free(w);
  free(b);
  free(dy);
  free(px);
  free(pw);
  free(pb);
  free(ry);
  free(rdx);
  free(rdw);
  free(rdb);
  free(gy);
  free(gdx);
  free(gdw);
  free(gdb);
}

static void pool_case(nt_ctx *g, nt_ctx *c, nt_dtype dt, int N, int C, int H, int W, int k) {
  const int OH = H / k, OW = W / k;
  const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
  int64_t sx[4] = {N, C, H, W}, sy[4] = {N, C, OH, OW};
  nt_test_rng rng = {(uint64_t)(H * 31 + k)};
  float *x = malloc(4 * nx), *dy = malloc(4 * ny), *pre = malloc(4 * nx);
  float *ry = malloc(4 * ny), *rdx = malloc(4 * nx), *gy = malloc(4 * ny), *gdx = malloc(4 * nx);
  int32_t *ram = malloc(4 * ny), *gam = malloc(4 * ny);
  nt_test_fill_uniform(&rng, x, (int64_t)nx, -3, 3);
  nt_test_fill_uniform(&rng, dy, (int64_t)ny, -1, 1);
  nt_test_fill_uniform(&rng, pre, (int64_t)nx, -1, 1);
  void *hx = nt_test_to_dtype(x, nx, dt), *hdy = nt_test_to_dtype(dy, ny, dt);
  void *hpre = nt_test_to_dtype(pre, nx, dt);
  /* CPU reference in the same dtype: both sides round identically. */
  void *cyb = malloc(ny * nt_dtype_size(dt)), *cdxb = malloc(nx * nt_dtype_size(dt));
  memcpy(cdxb, hpre, nx * nt_dtype_size(dt));
  nt_tensor cx = nt_tensor_view(hx, dt, nt_cpu(), 4, sx),
            cy = nt_tensor_view(cyb, dt, nt_cpu(), 4, sy),
            ca = nt_tensor_view(ram, NT_I32, nt_cpu(), 4, sy),
            cdy = nt_tensor_view(hdy, dt, nt_cpu(), 4, sy),
            cdx = nt_tensor_view(cdxb, dt, nt_cpu(), 4, sx);
  nt_tensor tx = {0}, ty = {0}, ta = {0}, tdy = {0}, tdx = {0};
  bool ok = CHECK_OK(c, nt_maxpool2d_forward(c, &cx, &cy, &ca, k)) &&
            CHECK_OK(c, nt_maxpool2d_backward(c, &cdy, &ca, &cdx));
  ok = ok && put(g, &tx, dt, 4, sx, hx) && put(g, &tdy, dt, 4, sy, hdy) &&
       put(g, &tdx, dt, 4, sx, hpre) && CHECK_OK(g, nt_tensor_alloc(g, &ty, dt, 4, sy)) &&
       CHECK_OK(g, nt_tensor_alloc(g, &ta, NT_I32, 4, sy));
  ok = ok && CHECK_OK(g, nt_maxpool2d_forward(g, &tx, &ty, &ta, k)) &&
       CHECK_OK(g, nt_maxpool2d_backward(g, &tdy, &ta, &tdx)) && get(g, &ty, gy) &&
       get(g, &tdx, gdx);
  if (ok) {
    nt_tensor ha = nt_tensor_view(gam, NT_I32, nt_cpu(), 4, sy);
    ok = CHECK_OK(g, nt_tensor_copy(g, &ha, &ta));
    int bad = 0;
    for (size_t i = 0; i < ny; i++) {
      ry[i] = nt_load_f32(cyb, dt, (int64_t)i);
      bad += gy[i] != ry[i] || gam[i] != ram[i];
    }
    for (size_t i = 0; i < nx; i++) {
      rdx[i] = nt_load_f32(cdxb, dt, (int64_t)i);
      bad += gdx[i] != rdx[i];
    }
    CHECK(bad == 0, "maxpool %s %dx%d k%d: %d elements differ from the CPU", nt_dtype_name(dt), H,
          W, k, bad);
  }
  nt_tensor *all[5] = {&tx, &ty, &ta, &tdy, &tdx};
  for (int i = 0; i < 5; i++) nt_tensor_free(g, all[i]);
  free(hx);
  free(hdy);
  free(hpre);
  free(cyb);
  free(cdxb);
  free(x);
  free(dy);
  free(pre);
  free(ry);
  free(rdx);
  free(gy);
  free(gdx);
  free(ram);
  free(gam);
}

int main(void) {
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return 1;
  /* Odd sizes, strides 1..3 (stride > 1 and pad >= kernel take the col2im dx path), kernels
   * 1x1 to 5x5, K from 7 to 288 (padded to 8 on the GPU, with and without the bias column). */
  const ccase cases[] = {{4, 3, 28, 28, 5, 3, 3, 1, 1},   {3, 3, 13, 13, 5, 3, 3, 2, 1},
                         {2, 2, 7, 9, 4, 5, 3, 3, 2},     {5, 1, 28, 28, 8, 5, 5, 1, 0},
                         {2, 16, 13, 13, 32, 3, 3, 1, 1}, {3, 7, 6, 6, 3, 1, 1, 1, 0},
                         {2, 3, 5, 7, 4, 3, 3, 1, 3},     {3, 5, 9, 7, 6, 3, 5, 1, 2},
                         {2, 4, 11, 10, 3, 2, 2, 2, 0}};
  const nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
      conv_case(g, c, dts[d], cases[i], true, false, false, false, 50 + (uint64_t)i);
      conv_case(g, c, dts[d], cases[i], i % 2 == 0, true, i % 3 == 0, i % 2 == 1,
                60 + (uint64_t)i);
    }
  /* The CNN's four convolutions (batch 16; conv1 also at the training batch of 128), as the
   * model calls them: fused ReLU, F32 bias; F32 dw (fp32 master gradients) and compute-dtype dw. */
  const ccase cnn[] = {{128, 1, 28, 28, 32, 3, 3, 1, 1}, {16, 1, 28, 28, 32, 3, 3, 1, 1},
                       {16, 32, 28, 28, 32, 3, 3, 1, 1}, {16, 32, 14, 14, 64, 3, 3, 1, 1},
                       {16, 64, 14, 14, 64, 3, 3, 1, 1}};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < (int)(sizeof cnn / sizeof cnn[0]); i++) {
      /* f32 at batch 128: sums of 100352 products, beyond what the 1e-5 bound is about */
      if (i > 0 || d > 0)
        conv_case(g, c, dts[d], cnn[i], true, true, true, true, 70 + (uint64_t)i);
      if (i > 0) conv_case(g, c, dts[d], cnn[i], true, d == 0, false, false, 80 + (uint64_t)i);
    }
  /* The batch in chunks bounded by the option conv_l2_mb (each chunk's scratch: im2col
   * columns, plus the permuted dy in backward). Images per chunk, f32 / 16-bit:
   *   cases[0] at 0.05 MiB: 1 / 1 (4 chunks)
   *   cases[3] at 0.08 MiB: 1 / forward 2, 2, 1, backward 1
   *   cnn[2]   at 1 MiB:    1 / 2 (16 / 8 chunks)
   *   seven 28x28 images at 0.3 MiB: forward 3, 3, 1, backward 2, 2, 2, 1 / 4, 3 */
  const double mbs[4] = {0.05, 0.08, 1, 0.3};
  const ccase seven = {7, 3, 28, 28, 5, 3, 3, 1, 1};
  const ccase chunked[4] = {cases[0], cases[3], cnn[2], seven};
  for (int i = 0; i < 4; i++) {
    nt_ctx_options o = nt_test_ctx_options();
    o.conv_l2_mb = mbs[i];
    nt_ctx *v = nt_test_cuda_ctx_with(&o);
    CHECK(v != NULL, "a context with conv_l2_mb %g", mbs[i]);
    if (!v) continue;
    for (int d = 0; d < 3; d++)
      conv_case(v, c, dts[d], chunked[i], true, i != 1, i == 2, i == 0, 90 + (uint64_t)i);
    nt_ctx_free(v);
  }
  /* The default policy's chunks (ops/conv2d_internal.h), 16-bit only (fp32 sums this long
   * exceed the 1e-5 bound): the CNN's conv2 at batch 128 (7 chunks: 6 x 19 + 14; its dx conv
   * alike) and conv4 (2 x 64), as the model calls them; a stride-2 conv (the col2im dx path) of
   * 301 images: forward 151 + 150, backward 3 chunks of 101, 101, 99. */
  const ccase big[3] = {{128, 32, 28, 28, 32, 3, 3, 1, 1}, {128, 64, 14, 14, 64, 3, 3, 1, 1},
                        {301, 8, 30, 30, 16, 3, 3, 2, 1}};
  for (int d = 1; d < 3; d++)
    for (int i = 0; i < 3; i++)
      conv_case(g, c, dts[d], big[i], true, i < 2, i < 2, i < 2, 100 + (uint64_t)i);
  for (int d = 0; d < 3; d++) {
    pool_case(g, c, dts[d], 4, 5, 28, 28, 2);
    pool_case(g, c, dts[d], 3, 5, 13, 13, 2);
    pool_case(g, c, dts[d], 2, 3, 7, 8, 3);
  }
  nt_ctx_free(c);
  nt_ctx_free(g);
  return nt_test_finish();
}
