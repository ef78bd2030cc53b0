/* CUDA causal attention vs the CPU reference, F32 / F16 / BF16, for both the tensor-core path
 * (F16/BF16, D 32 and 64) and the simple kernels (NT_ATTN_SIMPLE=1, other D, unaligned
 * views). Odd T (1, 37, 65, 100, 257, 513, 700), several tiles of T (64, 128, 1024; from
 * T = 512 the backward uses 8-warp blocks; both block shapes are also forced on the other
 * side with NT_ATTN_BWD_WARPS; the forward's 128-key tiles and 3-blocks-per-SM build with
 * NT_ATTN_FWD_KEYS / NT_ATTN_FWD_BLOCKS / NT_ATTN_FWD_WARPS; the two-barrier backward with
 * NT_ATTN_BWD_PIPE=0 in both block shapes),
 * B and H > 1,
 * large-magnitude scores. Gradients are checked once from zero and again after a second
 * backward call (must be exactly twice: accumulation). Tolerances ||gpu - ref|| / ||ref||:
 * F16 2e-3, BF16 1e-2; F32 1e-5 forward and 1e-4 backward (dS = P * (dP - D) cancels: the
 * difference of two fp32 sums over D and T loses about a digit against the fp64 CPU). */
#include "tests/testutil.h"
#include "ops/attention.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int B, H, T, D;
  float mag;
} acase;

static double tol_bwd(nt_dtype dt) {
  return dt == NT_F32 ? 1e-4 : dt == NT_F16 ? 2e-3 : 1e-2;
}

static nt_status upload(nt_ctx *g, nt_tensor *dev, const void *host) {
  nt_tensor h = nt_tensor_view((void *)host, dev->dtype, nt_cpu(), dev->ndim, dev->shape);
  return nt_tensor_copy(g, dev, &h);
}

static nt_status download_f32(nt_ctx *g, const nt_tensor *dev, float *out) {
  size_t n = (size_t)nt_tensor_numel(dev);
  void *tmp = malloc(n * nt_dtype_size(dev->dtype) + 1);
  nt_tensor h = nt_tensor_view(tmp, dev->dtype, nt_cpu(), dev->ndim, dev->shape);
  nt_status st = nt_tensor_copy(g, &h, dev);
  for (size_t i = 0; st == NT_OK && i < n; i++) out[i] = nt_load_f32(tmp, dev->dtype, (int64_t)i);
  free(tmp);
  return st;
}

/* unaligned: the device tensors start 2 elements into their allocation (forces the simple
 * kernels through the alignment check). */
static void run_case(nt_ctx *g, nt_ctx *c, nt_dtype dt, acase a, const char *mode, bool unaligned,
                     uint64_t seed) {
  const size_t n = (size_t)a.B * a.H * a.T * a.D, rows = (size_t)a.B * a.H * a.T;
  int64_t shape[4] = {a.B, a.H, a.T, a.D}, lshape[3] = {a.B, a.H, a.T};
  nt_test_rng rng = {seed};
  float *h = malloc(sizeof(float) * n * 12 + sizeof(float) * rows * 2);
  float *q = h, *k = h + n, *v = h + 2 * n, *dout = h + 3 * n;
  float *o_ref = h + 4 * n, *g_ref = h + 5 * n, *o_got = h + 8 * n, *g_got = h + 9 * n;
  float *lse_ref = h + 12 * n, *lse_got = lse_ref + rows;
  nt_test_fill_uniform(&rng, q, (int64_t)n, -a.mag, a.mag);
  nt_test_fill_uniform(&rng, k, (int64_t)n, -a.mag, a.mag);
  nt_test_fill_uniform(&rng, v, (int64_t)n, -1, 1);
  nt_test_fill_uniform(&rng, dout, (int64_t)n, -1, 1);
  void *hq = nt_test_to_dtype(q, n, dt), *hk = nt_test_to_dtype(k, n, dt);
  void *hv = nt_test_to_dtype(v, n, dt), *hd = nt_test_to_dtype(dout, n, dt);
  char label[160];
  snprintf(label, sizeof label, "%s %s B%d H%d T%d D%d mag %g%s", mode, nt_dtype_name(dt), a.B, a.H,
           a.T, a.D, (double)a.mag, unaligned ? " unaligned" : "");

  /* CPU reference in f32 storage from the same (rounded) inputs. */
  nt_tensor cq = nt_tensor_view(q, NT_F32, nt_cpu(), 4, shape),
            ck = nt_tensor_view(k, NT_F32, nt_cpu(), 4, shape),
            cv = nt_tensor_view(v, NT_F32, nt_cpu(), 4, shape),
            cd = nt_tensor_view(dout, NT_F32, nt_cpu(), 4, shape),
            co = nt_tensor_view(o_ref, NT_F32, nt_cpu(), 4, shape),
            cl = nt_tensor_view(lse_ref, NT_F32, nt_cpu(), 3, lshape);
  nt_tensor cg[3];
  for (int i = 0; i < 3; i++) cg[i] = nt_tensor_view(g_ref + i * n, NT_F32, nt_cpu(), 4, shape);
  memset(g_ref, 0, sizeof(float) * 3 * n);
  if (!CHECK_OK(c, nt_attention_forward(c, &cq, &ck, &cv, &co, &cl)) ||
      !CHECK_OK(c, nt_attention_backward(c, &cd, &cq, &ck, &cv, &co, &cl, &cg[0], &cg[1], &cg[2])))
    goto free_host;

  /* Device tensors: one allocation each, optionally viewed 2 elements in. */
  nt_tensor alloc[8], t[8]; /* q k v dout out dq dk dv */
  nt_tensor dl = {0};
  memset(alloc, 0, sizeof alloc);
  const int64_t pad = unaligned ? 2 : 0;
  int64_t flat = (int64_t)n + pad;
  bool ok = true;
  for (int i = 0; i < 8 && ok; i++) {
    ok = CHECK_OK(g, nt_tensor_alloc(g, &alloc[i], dt, 1, &flat));
    if (ok) {
      t[i] = nt_tensor_view((char *)alloc[i].data + pad * (int64_t)nt_dtype_size(dt), dt,
                            nt_ctx_device(g), 4, shape);
    }
  }
  ok = ok && CHECK_OK(g, nt_tensor_alloc(g, &dl, NT_F32, 3, lshape));
  ok = ok && CHECK_OK(g, upload(g, &t[0], hq)) && CHECK_OK(g, upload(g, &t[1], hk)) &&
       CHECK_OK(g, upload(g, &t[2], hv)) && CHECK_OK(g, upload(g, &t[3], hd));
  ok = ok && CHECK_OK(g, nt_attention_forward(g, &t[0], &t[1], &t[2], &t[4], &dl));
  ok = ok && CHECK_OK(g, download_f32(g, &t[4], o_got)) &&
       CHECK_OK(g, download_f32(g, &dl, lse_got));
  if (ok) {
    double eo = nt_test_rel_err(o_got, o_ref, (int64_t)n);
    double el = nt_test_rel_err(lse_got, lse_ref, (int64_t)rows);
    CHECK(eo < nt_test_tol(dt), "%s: out rel err %.3g", label, eo);
    /* lse is fp32 in every dtype; its error comes from the rounded scores (1e-5 f32). */
    CHECK(el < (dt == NT_F32 ? 1e-5 : nt_test_tol(dt)), "%s: lse rel err %.3g", label, el);
    printf("  %-48s out %.2e lse %.2e", label, eo, el);
  }
  for (int i = 5; i < 8 && ok; i++) ok = CHECK_OK(g, nt_tensor_zero(g, &t[i]));
  for (int pass = 1; pass <= 2 && ok; pass++) {
    ok = CHECK_OK(
        g, nt_attention_backward(g, &t[3], &t[0], &t[1], &t[2], &t[4], &dl, &t[5], &t[6], &t[7]));
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3 && ok; i++) {
      ok = CHECK_OK(g, download_f32(g, &t[5 + i], g_got + i * n));
      if (!ok) break;
      for (size_t j = 0; j < n; j++) g_got[i * n + j] /= (float)pass;
      double e = nt_test_rel_err(g_got + i * n, g_ref + i * n, (int64_t)n);
      CHECK(e < tol_bwd(dt), "%s: %s rel err %.3g after %d backward call(s)", label, names[i], e,
            pass);
      if (pass == 1) printf(" %s %.2e", names[i], e);
    }
  }
  printf("\n");
  for (int i = 0; i < 8; i++) nt_tensor_free(g, &alloc[i]);
  nt_tensor_free(g, &dl);
free_host:
  free(hq);
  free(hk);
  free(hv);
  free(hd);
  free(h);
}

static void test_layout_gpu(nt_ctx *g, nt_ctx *c, nt_dtype dt) {
  const int B = 3, T = 37, H = 6, D = 24, C = H * D;
  const size_t n = (size_t)B * T * C;
  int64_t s3[3] = {B, T, 3 * C}, s4[4] = {B, H, T, D}, sy[3] = {B, T, C};
  nt_test_rng rng = {77};
  float *x = malloc(sizeof(float) * 3 * n * 4), *pre = x + 3 * n, *ref = x + 6 * n,
        *got = x + 9 * n;
  nt_test_fill_uniform(&rng, x, (int64_t)(3 * n), -3, 3);
  nt_test_fill_uniform(&rng, pre, (int64_t)(3 * n), -1, 1);
  void *hx = nt_test_to_dtype(x, 3 * n, dt), *hpre = nt_test_to_dtype(pre, 3 * n, dt);
  nt_tensor cp[3], gp[3], gx = {0}, gy = {0}, gback = {0};
  float *cparts = malloc(sizeof(float) * 3 * n);
  nt_tensor cx = nt_tensor_view(x, NT_F32, nt_cpu(), 3, s3);
  for (int i = 0; i < 3; i++) cp[i] = nt_tensor_view(cparts + i * n, NT_F32, nt_cpu(), 4, s4);
  memset(gp, 0, sizeof gp);
  bool ok = CHECK_OK(c, nt_qkv_split(c, &cx, H, &cp[0], &cp[1], &cp[2]));
  ok = ok && CHECK_OK(g, nt_tensor_alloc(g, &gx, dt, 3, s3)) &&
       CHECK_OK(g, nt_tensor_alloc(g, &gback, dt, 3, s3)) &&
       CHECK_OK(g, nt_tensor_alloc(g, &gy, dt, 3, sy));
  for (int i = 0; i < 3 && ok; i++) ok = CHECK_OK(g, nt_tensor_alloc(g, &gp[i], dt, 4, s4));
  ok = ok && CHECK_OK(g, upload(g, &gx, hx)) &&
       CHECK_OK(g, nt_qkv_split(g, &gx, H, &gp[0], &gp[1], &gp[2]));
  for (int i = 0; i < 3 && ok; i++) {
    ok = CHECK_OK(g, download_f32(g, &gp[i], got));
    int bad = 0;
    for (size_t j = 0; ok && j < n; j++) bad += got[j] != cparts[i * n + j];
    CHECK(bad == 0, "qkv_split %s part %d: %d wrong", nt_dtype_name(dt), i, bad);
  }
  /* split backward into a pre-filled dqkv: pre + qkv (a permutation there and back). */
  ok = ok && CHECK_OK(g, upload(g, &gback, hpre)) &&
       CHECK_OK(g, nt_qkv_split_backward(g, &gp[0], &gp[1], &gp[2], &gback)) &&
       CHECK_OK(g, download_f32(g, &gback, got));
  if (ok) {
    /* The same fp32 sum rounded to dt on both sides: bit-exact. */
    int bad = 0;
    for (size_t j = 0; j < 3 * n; j++) {
      float r = pre[j] + x[j], rounded;
      uint32_t cell;
      nt_store_f32(&cell, dt, 0, r);
      rounded = nt_load_f32(&cell, dt, 0);
      ref[j] = rounded;
      bad += got[j] != ref[j];
    }
    CHECK(bad == 0, "qkv_split_backward %s: %d wrong", nt_dtype_name(dt), bad);
  }
  /* merge of k, then merge backward into k again (k + k). */
  ok = ok && CHECK_OK(g, nt_heads_merge(g, &gp[1], &gy)) && CHECK_OK(g, download_f32(g, &gy, got));
  if (ok) {
    int bad = 0;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int cc = 0; cc < C; cc++)
          bad += got[((size_t)b * T + t) * C + cc] != x[((size_t)b * T + t) * 3 * C + C + cc];
    CHECK(bad == 0, "heads_merge %s: %d wrong", nt_dtype_name(dt), bad);
  }
  ok = ok && CHECK_OK(g, nt_heads_merge_backward(g, &gy, &gp[1])) &&
       CHECK_OK(g, download_f32(g, &gp[1], got));
  if (ok) {
    int bad = 0;
    for (size_t j = 0; j < n; j++) bad += got[j] != 2.f * cparts[n + j];
    CHECK(bad == 0, "heads_merge_backward %s: %d wrong", nt_dtype_name(dt), bad);
  }
  for (int i = 0; i < 3; i++) nt_tensor_free(g, &gp[i]);
  nt_tensor_free(g, &gx);
  nt_tensor_free(g, &gy);
  nt_tensor_free(g, &gback);
  free(hx);
  free(hpre);
  free(x);
  free(cparts);
}

int main(void) {
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  nt_ctx *c;
  if (nt_ctx_create(&c, nt_cpu())) return 1;
  const acase cases[] = {
      {2, 3, 37, 64, 2.f},   {1, 2, 100, 32, 2.f}, {2, 2, 257, 64, 2.f}, {1, 1, 1, 64, 2.f},
      {3, 2, 64, 64, 2.f},   {1, 1, 128, 64, 2.f}, {2, 1, 65, 32, 2.f},  {2, 3, 200, 64, 6.f},
      {1, 2, 1024, 64, 1.f}, {4, 6, 256, 64, 1.f}, {1, 2, 100, 48, 2.f}, {1, 1, 50, 128, 2.f},
      {2, 1, 20, 7, 2.f},    {1, 1, 130, 96, 1.f}, {1, 3, 700, 64, 1.f}, {2, 1, 513, 32, 2.f}};
  const nt_dtype dts[3] = {NT_BF16, NT_F16, NT_F32};
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int mode = 0; mode < 2; mode++) {
    /* mode 0: whatever the dispatch picks (tensor cores for F16/BF16 with D 32/64);
     * mode 1: NT_ATTN_SIMPLE=1, the fallback kernels for everything. */
    if (mode == 1) setenv("NT_ATTN_SIMPLE", "1", 1);
    for (int d = 0; d < 3; d++)
      for (int i = 0; i < ncases; i++) {
        if (mode == 1 && cases[i].T > 300) continue; /* the simple kernels are slow */
        run_case(g, c, dts[d], cases[i], mode ? "simple" : "auto", false, 100 + (uint64_t)i);
      }
    unsetenv("NT_ATTN_SIMPLE");
  }
  /* The kernel variants the defaults do not pick, on every tensor-core case: pass 0 forces
   * the forward's 128-key tiles and each backward block shape on the side of T = 512 the
   * default does not give it (128-key blocks with T below one block, 64-key blocks at long
   * T); pass 1 the forward's 3-blocks-per-SM build with the two-barrier backward
   * (NT_ATTN_BWD_PIPE=0) in its default block shape; pass 2 the forward's 8 warps of 16 rows
   * (NT_ATTN_FWD_WARPS=8) with the two-barrier backward in the other block shape. */
  const char *fwd_var[3][2] = {
      {"NT_ATTN_FWD_KEYS", "128"}, {"NT_ATTN_FWD_BLOCKS", "3"}, {"NT_ATTN_FWD_WARPS", "8"}};
  for (int pass = 0; pass < 3; pass++) {
    setenv(fwd_var[pass][0], fwd_var[pass][1], 1);
    if (pass >= 1) setenv("NT_ATTN_BWD_PIPE", "0", 1);
    for (int d = 0; d < 2; d++)
      for (int i = 0; i < ncases; i++) {
        if (cases[i].D != 32 && cases[i].D != 64) continue;
        const bool long_t = cases[i].T >= 512;
        if (pass != 1) setenv("NT_ATTN_BWD_WARPS", long_t ? "4" : "8", 1);
        const char *label = pass == 1   ? "fwd 3 blocks/SM, bwd 2 barriers"
                            : pass == 2 ? "fwd 8 warps, bwd other shape, 2 barriers"
                            : long_t    ? "fwd 128 keys, bwd 4 warps"
                                        : "fwd 128 keys, bwd 8 warps";
        run_case(g, c, dts[d], cases[i], label, false, 200 + (uint64_t)i);
      }
    unsetenv("NT_ATTN_BWD_WARPS");
    unsetenv("NT_ATTN_BWD_PIPE");
    unsetenv(fwd_var[pass][0]);
  }
  /* Unaligned views must fall back to the simple kernels and still be right. */
  run_case(g, c, NT_BF16, (acase){2, 2, 37, 64, 2.f}, "auto", true, 300);
  run_case(g, c, NT_F16, (acase){1, 2, 70, 32, 2.f}, "auto", true, 301);
  for (int d = 0; d < 3; d++) test_layout_gpu(g, c, dts[d]);
  /* Mixed devices are a clear error. */
  {
    int64_t s[4] = {1, 1, 4, 8}, ls[3] = {1, 1, 4};
    float host[32] = {0}, hl[4];
    nt_tensor hq = nt_tensor_view(host, NT_F32, nt_cpu(), 4, s);
    nt_tensor hls = nt_tensor_view(hl, NT_F32, nt_cpu(), 3, ls);
    nt_tensor dq = {0};
    if (CHECK_OK(g, nt_tensor_alloc(g, &dq, NT_F32, 4, s))) {
      CHECK_ERR(g, NT_ERR_DEVICE, nt_attention_forward(g, &dq, &hq, &dq, &dq, &hls));
      nt_tensor_free(g, &dq);
    }
  }
  nt_ctx_free(c);
  nt_ctx_free(g);
  return nt_test_finish();
}
