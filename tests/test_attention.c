/* CPU causal attention: forward vs an fp64 softmax(QK^T/sqrt(D) + mask) V, backward vs
 * finite differences of that fp64 function, accumulation, bf16/f16 storage, head
 * split/merge permutations, and clear errors for bad arguments. */
#include "tests/testutil.h"
#include "ops/attention.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Naive fp64 attention over one [B*H, T, D] problem with the full T x T score matrix. */
static void ref_forward(const double *q, const double *k, const double *v, double *o, double *lse,
                        int BH, int T, int D) {
  const double scale = 1.0 / sqrt((double)D);
  double *s = malloc(sizeof(double) * (size_t)T * T);
  for (int bh = 0; bh < BH; bh++) {
    const double *Q = q + (size_t)bh * T * D, *K = k + (size_t)bh * T * D,
                 *V = v + (size_t)bh * T * D;
    for (int i = 0; i < T; i++) {
      double m = -INFINITY;
      for (int j = 0; j < T; j++) {
        double acc = 0;
        for (int d = 0; d < D; d++) acc += Q[i * D + d] * K[j * D + d];
        s[i * T + j] = j > i ? -INFINITY : acc * scale;
        if (s[i * T + j] > m) m = s[i * T + j];
      }
      double l = 0;
      for (int j = 0; j < T; j++) l += exp(s[i * T + j] - m);
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int j = 0; j < T; j++) acc += exp(s[i * T + j] - m) / l * V[j * D + d];
        o[((size_t)bh * T + i) * D + d] = acc;
      }
      if (lse) lse[(size_t)bh * T + i] = m + log(l);
    }
  }
  free(s);
}

static void to_double(const float *x, double *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i];
}

static void test_forward(nt_ctx *ctx, int B, int H, int T, int D, uint64_t seed) {
  const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
  nt_test_rng rng = {seed};
  float *q = malloc(4 * n), *k = malloc(4 * n), *v = malloc(4 * n), *o = malloc(4 * n);
  float *lse = malloc(4 * rows);
  double *qd = malloc(8 * n), *kd = malloc(8 * n), *vd = malloc(8 * n), *od = malloc(8 * n);
  double *lsed = malloc(8 * rows), *ofd = malloc(8 * n), *lfd = malloc(8 * rows);
  nt_test_fill_uniform(&rng, q, (int64_t)n, -2, 2);
  nt_test_fill_uniform(&rng, k, (int64_t)n, -2, 2);
  nt_test_fill_uniform(&rng, v, (int64_t)n, -1, 1);
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor tq = nt_tensor_view(q, NT_F32, nt_cpu(), 4, shape);
  nt_tensor tk = nt_tensor_view(k, NT_F32, nt_cpu(), 4, shape);
  nt_tensor tv = nt_tensor_view(v, NT_F32, nt_cpu(), 4, shape);
  nt_tensor to = nt_tensor_view(o, NT_F32, nt_cpu(), 4, shape);
  nt_tensor tl = nt_tensor_view(lse, NT_F32, nt_cpu(), 3, lshape);
  if (CHECK_OK(ctx, nt_attention_forward(ctx, &tq, &tk, &tv, &to, &tl))) {
    to_double(q, qd, n);
    to_double(k, kd, n);
    to_double(v, vd, n);
    ref_forward(qd, kd, vd, od, lsed, B * H, T, D);
    to_double(o, ofd, n);
    to_double(lse, lfd, rows);
    double eo = nt_test_rel_err_d(ofd, od, (int64_t)n),
           el = nt_test_rel_err_d(lfd, lsed, (int64_t)rows);
    CHECK(eo < 1e-6, "forward B%d H%d T%d D%d: out rel err %.3g", B, H, T, D, eo);
    CHECK(el < 1e-6, "forward B%d H%d T%d D%d: lse rel err %.3g", B, H, T, D, el);
  }
  /* Low-precision storage: same math, inputs and output rounded; compare with f32. */
  nt_dtype lows[2] = {NT_BF16, NT_F16};
  double tols[2] = {1e-2, 2e-3};
  for (int t = 0; t < 2; t++) {
    uint16_t *buf = malloc(2 * 4 * n);
    nt_tensor lq = nt_tensor_view(buf, lows[t], nt_cpu(), 4, shape);
    nt_tensor lk = nt_tensor_view(buf + n, lows[t], nt_cpu(), 4, shape);
    nt_tensor lv = nt_tensor_view(buf + 2 * n, lows[t], nt_cpu(), 4, shape);
    nt_tensor lo = nt_tensor_view(buf + 3 * n, lows[t], nt_cpu(), 4, shape);
    for (size_t i = 0; i < n; i++) {
      nt_store_f32(lq.data, lows[t], (int64_t)i, q[i]);
      nt_store_f32(lk.data, lows[t], (int64_t)i, k[i]);
      nt_store_f32(lv.data, lows[t], (int64_t)i, v[i]);
    }
    if (CHECK_OK(ctx, nt_attention_forward(ctx, &lq, &lk, &lv, &lo, &tl))) {
      float *of = malloc(4 * n);
      for (size_t i = 0; i < n; i++) of[i] = nt_load_f32(lo.data, lows[t], (int64_t)i);
      double e = nt_test_rel_err(of, o, (int64_t)n);
      CHECK(e < tols[t], "forward %s T%d D%d: rel err vs f32 %.3g", nt_dtype_name(lows[t]), T, D,
            e);
      free(of);
    }
    free(buf);
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(lse);
  free(qd);
  free(kd);
  free(vd);
  free(od);
  free(lsed);
  free(ofd);
  free(lfd);
}

/* loss = sum(out * g) of the fp64 reference. */
static double ref_loss(const double *q, const double *k, const double *v, const double *g,
                       double *scratch, int BH, int T, int D) {
  ref_forward(q, k, v, scratch, NULL, BH, T, D);
  double l = 0;
  for (size_t i = 0; i < (size_t)BH * T * D; i++) l += scratch[i] * g[i];
  return l;
}

static void test_backward(nt_ctx *ctx, int B, int H, int T, int D, uint64_t seed) {
  const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
  nt_test_rng rng = {seed};
  float *f = malloc(4 * n * 9), *lse = malloc(4 * rows);
  float *q = f, *k = f + n, *v = f + 2 * n, *g = f + 4 * n, *dq = f + 5 * n, *dk = f + 6 * n,
        *dv = f + 7 * n, *pre = f + 8 * n;
  nt_test_fill_uniform(&rng, f, (int64_t)(5 * n), -1.5f, 1.5f);
  nt_test_fill_uniform(&rng, pre, (int64_t)n, -1, 1);
  /* Gradients start from a known non-zero value: the backward must add to it. */
  memcpy(dq, pre, 4 * n);
  memcpy(dk, pre, 4 * n);
  memcpy(dv, pre, 4 * n);
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor t[8];
  for (int i = 0; i < 8; i++) t[i] = nt_tensor_view(f + i * n, NT_F32, nt_cpu(), 4, shape);
  nt_tensor tl = nt_tensor_view(lse, NT_F32, nt_cpu(), 3, lshape);
  if (!CHECK_OK(ctx, nt_attention_forward(ctx, &t[0], &t[1], &t[2], &t[3], &tl))) goto done;
  if (!CHECK_OK(ctx, nt_attention_backward(ctx, &t[4], &t[0], &t[1], &t[2], &t[3], &tl, &t[5],
                                           &t[6], &t[7])))
    goto done;
  double *d = malloc(8 * n * 5);
  double *qd = d, *kd = d + n, *vd = d + 2 * n, *gd = d + 3 * n, *scratch = d + 4 * n;
  to_double(q, qd, n);
  to_double(k, kd, n);
  to_double(v, vd, n);
  to_double(g, gd, n);
  double *ins[3] = {qd, kd, vd};
  const float *got[3] = {dq, dk, dv};
  const char *names[3] = {"dq", "dk", "dv"};
  double *num = malloc(8 * n), *ana = malloc(8 * n);
  for (int which = 0; which < 3; which++) {
    const double eps = 1e-5;
    for (size_t i = 0; i < n; i++) {
      const double keep = ins[which][i];
      ins[which][i] = keep + eps;
      double lp = ref_loss(qd, kd, vd, gd, scratch, B * H, T, D);
      ins[which][i] = keep - eps;
      double lm = ref_loss(qd, kd, vd, gd, scratch, B * H, T, D);
      ins[which][i] = keep;
      num[i] = (lp - lm) / (2 * eps);
      ana[i] = (double)got[which][i] - (double)pre[i];
    }
    double e = nt_test_rel_err_d(ana, num, (int64_t)n);
    CHECK(e < 1e-5, "backward B%d H%d T%d D%d: %s vs finite differences rel err %.3g", B, H, T, D,
          names[which], e);
  }
  free(num);
  free(ana);
  free(d);
done:
  free(f);
  free(lse);
}

static void test_layout(nt_ctx *ctx) {
  const int B = 2, T = 5, H = 3, D = 7, C = H * D;
  const size_t n = (size_t)B * T * C;
  float *qkv = malloc(4 * 3 * n), *parts = malloc(4 * 3 * n), *back = malloc(4 * 3 * n);
  for (size_t i = 0; i < 3 * n; i++) qkv[i] = (float)i;
  int64_t s3[3] = {B, T, 3 * C}, s4[4] = {B, H, T, D}, sy[3] = {B, T, C};
  nt_tensor tqkv = nt_tensor_view(qkv, NT_F32, nt_cpu(), 3, s3);
  nt_tensor tp[3];
  for (int i = 0; i < 3; i++) tp[i] = nt_tensor_view(parts + i * n, NT_F32, nt_cpu(), 4, s4);
  if (CHECK_OK(ctx, nt_qkv_split(ctx, &tqkv, H, &tp[0], &tp[1], &tp[2]))) {
    int bad = 0;
    for (int s = 0; s < 3; s++)
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
          for (int t = 0; t < T; t++)
            for (int d = 0; d < D; d++)
              bad += parts[s * n + (((size_t)b * H + h) * T + t) * D + d] !=
                     qkv[((size_t)b * T + t) * 3 * C + s * C + h * D + d];
    CHECK(bad == 0, "qkv_split: %d misplaced elements", bad);
  }
  /* Backward accumulates: start from 1 and add the split parts back -> qkv + 1. */
  for (size_t i = 0; i < 3 * n; i++) back[i] = 1.f;
  nt_tensor tback = nt_tensor_view(back, NT_F32, nt_cpu(), 3, s3);
  if (CHECK_OK(ctx, nt_qkv_split_backward(ctx, &tp[0], &tp[1], &tp[2], &tback))) {
    int bad = 0;
    for (size_t i = 0; i < 3 * n; i++) bad += back[i] != qkv[i] + 1.f;
    CHECK(bad == 0, "qkv_split_backward: %d wrong elements", bad);
  }
  float *y = malloc(4 * n), *dh = malloc(4 * n);
  nt_tensor ty = nt_tensor_view(y, NT_F32, nt_cpu(), 3, sy);
  nt_tensor tdh = nt_tensor_view(dh, NT_F32, nt_cpu(), 4, s4);
  if (CHECK_OK(ctx, nt_heads_merge(ctx, &tp[1], &ty))) {
    int bad = 0;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
          bad += y[((size_t)b * T + t) * C + c] != qkv[((size_t)b * T + t) * 3 * C + C + c];
    CHECK(bad == 0, "heads_merge: %d misplaced elements", bad);
  }
  for (size_t i = 0; i < n; i++) dh[i] = 2.f;
  if (CHECK_OK(ctx, nt_heads_merge_backward(ctx, &ty, &tdh))) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += dh[i] != parts[n + i] + 2.f;
    CHECK(bad == 0, "heads_merge_backward: %d wrong elements", bad);
  }
  /* Errors: C not divisible by heads, wrong part shape. */
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_qkv_split(ctx, &tqkv, 4, &tp[0], &tp[1], &tp[2]));
  nt_tensor wrong = tp[2];
  wrong.shape[2] = T - 1;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_qkv_split(ctx, &tqkv, H, &tp[0], &tp[1], &wrong));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_heads_merge(ctx, &tp[0], &tqkv));
  free(qkv);
  free(parts);
  free(back);
  free(y);
  free(dh);
}

static void test_errors(nt_ctx *ctx) {
  static float buf[6][2 * 3 * 5 * 8];
  int64_t s[4] = {2, 3, 5, 8}, sk[4] = {2, 3, 6, 8}, ls[3] = {2, 3, 5}, big[4] = {1, 1, 2, 200};
  nt_tensor q = nt_tensor_view(buf[0], NT_F32, nt_cpu(), 4, s);
  nt_tensor k = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, s);
  nt_tensor v = nt_tensor_view(buf[2], NT_F32, nt_cpu(), 4, s);
  nt_tensor o = nt_tensor_view(buf[3], NT_F32, nt_cpu(), 4, s);
  nt_tensor lse = nt_tensor_view(buf[4], NT_F32, nt_cpu(), 3, ls);
  nt_tensor kbad = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 3, sk);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_attention_forward(ctx, &q, &kbad, &v, &o, &lse));
  kbad = nt_tensor_view(buf[1], NT_F32, nt_cpu(), 4, sk);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_attention_forward(ctx, &q, &kbad, &v, &o, &lse));
  nt_tensor vh = nt_tensor_view(buf[2], NT_F16, nt_cpu(), 4, s);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_attention_forward(ctx, &q, &k, &vh, &o, &lse));
  nt_tensor lbad = nt_tensor_view(buf[4], NT_F16, nt_cpu(), 3, ls);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_attention_forward(ctx, &q, &k, &v, &o, &lbad));
  int64_t ls2[3] = {2, 3, 4};
  lbad = nt_tensor_view(buf[4], NT_F32, nt_cpu(), 3, ls2);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_attention_forward(ctx, &q, &k, &v, &o, &lbad));
  nt_tensor qi = nt_tensor_view(buf[0], NT_I32, nt_cpu(), 4, s);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_attention_forward(ctx, &qi, &k, &v, &o, &lse));
  nt_tensor qbig = nt_tensor_view(buf[0], NT_F32, nt_cpu(), 4, big);
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_attention_forward(ctx, &qbig, &qbig, &qbig, &qbig, &lse));
  nt_tensor qt = nt_tensor_transpose(&q, 1, 2);
  nt_tensor kt = nt_tensor_transpose(&k, 1, 2), vt = nt_tensor_transpose(&v, 1, 2),
            ot = nt_tensor_transpose(&o, 1, 2);
  int64_t ls3[3] = {2, 5, 3};
  nt_tensor lt = nt_tensor_view(buf[4], NT_F32, nt_cpu(), 3, ls3);
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_attention_forward(ctx, &qt, &kt, &vt, &ot, &lt));
  nt_tensor qc = q;
  qc.device = nt_cuda(0);
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_attention_forward(ctx, &qc, &k, &v, &o, &lse));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_attention_forward(ctx, &q, &k, &v, &o, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_attention_backward(ctx, &o, &q, &k, &v, &o, &lse, &q, &kbad, &v));
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) {
    fprintf(stderr, "%s\n", nt_last_error(ctx));
    return 1;
  }
  test_forward(ctx, 2, 3, 37, 16, 1);
  test_forward(ctx, 1, 2, 100, 64, 2);
  test_forward(ctx, 1, 1, 1, 8, 3);
  test_forward(ctx, 2, 1, 19, 5, 4);
  test_forward(ctx, 1, 1, 9, 128, 5);
  test_backward(ctx, 1, 2, 7, 5, 10);
  test_backward(ctx, 2, 1, 11, 8, 11);
  test_backward(ctx, 1, 1, 1, 3, 12);
  test_layout(ctx);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
