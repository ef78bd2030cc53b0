/* CPU causal attention: forward vs an fp64 dropout(softmax(QK^T/sqrt(D) + mask)) V whose
 * dropout mask the test builds itself from the Philox stream, backward (with and without
 * dropout) vs finite differences of that fp64 function, the dropped fraction over a large
 * tensor, strided q/k/v/out/gradient views of [B, T, 3C] and [B, T, C] buffers against
 * contiguous copies, overwrite vs accumulate, p = 0 against the plain path bit for bit, the
 * keep threshold, bf16/f16 storage, offsets relative to the RNG step base, head split/merge
 * permutations, and clear errors for bad arguments. */
#include "tests/testutil.h"
#include "ops/attention.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The byte threshold of p written out: round(p * 256), halves up, at most 255. */
static uint32_t ref_threshold(float p) {
  const double t = floor((double)p * 256.0 + 0.5);
  return t >= 255.0 ? 255u : (uint32_t)t;
}

/* The dropout factor of every (bh, i, j) of a [BH, T, T] problem: 0 when dropped,
 * 256 / (256 - thr) when kept. Built here from core's Philox block function with the rule of
 * ops/attention.h written out (element e: byte e % 4 of stream number offset + e / 4 against
 * the byte threshold), not through ops/attention. */
static double *ref_mask(int BH, int T, float p, uint64_t seed, uint64_t offset) {
  const size_t n = (size_t)BH * T * T;
  const uint32_t thr = ref_threshold(p);
  double *m = malloc(8 * n);
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  for (size_t e = 0; e < n; e++) {
    const uint64_t idx = offset + e / 4, blk = idx / 4;
    const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0};
    uint32_t w[4];
    nt_philox4x32_10(ctr, key, w);
    const uint32_t byte = (w[idx % 4] >> (8 * (e % 4))) & 0xffu;
    m[e] = byte >= thr ? 256.0 / (256.0 - thr) : 0.0;
  }
  return m;
}

/* Naive fp64 attention over one [B*H, T, D] problem with the full T x T score matrix; mask
 * (NULL: none) multiplies the normalised probabilities. */
static void ref_forward(const double *q, const double *k, const double *v, double *o, double *lse,
                        int BH, int T, int D, const double *mask) {
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
        for (int j = 0; j < T; j++) {
          const double f = mask ? mask[((size_t)bh * T + i) * T + j] : 1.0;
          acc += exp(s[i * T + j] - m) / l * f * V[j * D + d];
        }
        o[((size_t)bh * T + i) * D + d] = acc;
      }
      if (lse) lse[(size_t)bh * T + i] = m + log(l);
    }
  }
  free(s);
}

/* The worst bf16 and f16 forward errors against f32 (printed at the end). */
static double low_worst[2];

static void to_double(const float *x, double *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i];
}

/* Forward against the fp64 reference; p > 0 drops with (rseed, offset). */
static void test_forward(nt_ctx *ctx, int B, int H, int T, int D, uint64_t seed, float p,
                         uint64_t rseed, uint64_t offset) {
  const nt_attention_opts opts = {p, rseed, offset, false};
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
  if (CHECK_OK(ctx, nt_attention_forward_ex(ctx, &tq, &tk, &tv, &to, &tl, &opts))) {
    double *mask = p > 0.f ? ref_mask(B * H, T, p, rseed, offset) : NULL;
    to_double(q, qd, n);
    to_double(k, kd, n);
    to_double(v, vd, n);
    ref_forward(qd, kd, vd, od, lsed, B * H, T, D, mask);
    free(mask);
    to_double(o, ofd, n);
    to_double(lse, lfd, rows);
    double eo = nt_test_rel_err_d(ofd, od, (int64_t)n),
           el = nt_test_rel_err_d(lfd, lsed, (int64_t)rows);
    CHECK(eo < 1e-6, "forward B%d H%d T%d D%d p %g: out rel err %.3g", B, H, T, D, (double)p,
          eo);
    CHECK(el < 1e-6, "forward B%d H%d T%d D%d p %g: lse rel err %.3g", B, H, T, D, (double)p,
          el);
  }
  /* Low-precision storage: same math, inputs and output rounded; compare with f32. */
  nt_dtype lows[2] = {NT_BF16, NT_F16};
  double tols[2] = {6e-3, 8e-4};   /* about twice the measured (docs/tolerances.md) */
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
    if (CHECK_OK(ctx, nt_attention_forward_ex(ctx, &lq, &lk, &lv, &lo, &tl, &opts))) {
      float *of = malloc(4 * n);
      for (size_t i = 0; i < n; i++) of[i] = nt_load_f32(lo.data, lows[t], (int64_t)i);
      double e = nt_test_rel_err(of, o, (int64_t)n);
      CHECK(e < tols[t], "forward %s T%d D%d: rel err vs f32 %.3g", nt_dtype_name(lows[t]), T, D,
            e);
      if (e > low_worst[t]) low_worst[t] = e;
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
                       double *scratch, int BH, int T, int D, const double *mask) {
  ref_forward(q, k, v, scratch, NULL, BH, T, D, mask);
  double l = 0;
  for (size_t i = 0; i < (size_t)BH * T * D; i++) l += scratch[i] * g[i];
  return l;
}

/* Backward (accumulating into non-zero gradients) against central differences of the fp64
 * loss; p > 0: the same dropout mask in forward, backward and the reference. */
static void test_backward(nt_ctx *ctx, int B, int H, int T, int D, uint64_t seed, float p,
                          uint64_t rseed, uint64_t offset) {
  const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
  const nt_attention_opts opts = {p, rseed, offset, false};
  nt_test_rng rng = {seed};
  float *f = malloc(4 * n * 9), *lse = malloc(4 * rows);
  float *q = f, *k = f + n, *v = f + 2 * n, *g = f + 4 * n, *dq = f + 5 * n, *dk = f + 6 * n,
        *dv = f + 7 * n, *pre = f + 8 * n;
  double *mask = p > 0.f ? ref_mask(B * H, T, p, rseed, offset) : NULL;
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
  if (!CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[3], &tl, &opts)))
    goto done;
  if (!CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[4], &t[0], &t[1], &t[2], &t[3], &tl, &t[5],
                                              &t[6], &t[7], &opts)))
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
      double lp = ref_loss(qd, kd, vd, gd, scratch, B * H, T, D, mask);
      ins[which][i] = keep - eps;
      double lm = ref_loss(qd, kd, vd, gd, scratch, B * H, T, D, mask);
      ins[which][i] = keep;
      num[i] = (lp - lm) / (2 * eps);
      ana[i] = (double)got[which][i] - (double)pre[i];
    }
    double e = nt_test_rel_err_d(ana, num, (int64_t)n);
    CHECK(e < 1e-5, "backward B%d H%d T%d D%d p %g: %s vs finite differences rel err %.3g", B, H,
          T, D, (double)p, names[which], e);
  }
  free(num);
  free(ana);
  free(d);
done:
  free(mask);
  free(f);
  free(lse);
}

/* The fraction dropped over about half a million probabilities, read back through the op:
 * with q = k = 0 row i's probabilities are all 1 / (i + 1), so with v = 1 (D = 1)
 * out_i * (i + 1) * (1 - p_eff) counts the keys it kept (p_eff = thr / 256). The counts must
 * also match the test's own mask row by row, and the fraction lie within 6 binomial standard
 * deviations (sqrt(p (1 - p) / N), about 5.5e-4 at p = 0.2) of p_eff. */
static void test_dropout_fraction(nt_ctx *ctx, float p, uint64_t rseed, uint64_t offset) {
  const int B = 2, H = 2, T = 513, D = 1;
  const size_t n = (size_t)B * H * T * D;
  float *buf = calloc(5 * n, 4);
  float *q = buf, *k = buf + n, *v = buf + 2 * n, *o = buf + 3 * n, *lse = buf + 4 * n;
  for (size_t i = 0; i < n; i++) v[i] = 1.f;
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor tq = nt_tensor_view(q, NT_F32, nt_cpu(), 4, shape),
            tk = nt_tensor_view(k, NT_F32, nt_cpu(), 4, shape),
            tv = nt_tensor_view(v, NT_F32, nt_cpu(), 4, shape),
            to = nt_tensor_view(o, NT_F32, nt_cpu(), 4, shape),
            tl = nt_tensor_view(lse, NT_F32, nt_cpu(), 3, lshape);
  const nt_attention_opts opts = {p, rseed, offset, false};
  if (CHECK_OK(ctx, nt_attention_forward_ex(ctx, &tq, &tk, &tv, &to, &tl, &opts))) {
    double *mask = ref_mask(B * H, T, p, rseed, offset);
    const double pe = ref_threshold(p) / 256.0;
    double kept = 0, total = 0;
    int bad_rows = 0;
    for (int bh = 0; bh < B * H; bh++)
      for (int i = 0; i < T; i++) {
        const double c = o[(size_t)bh * T + i] * (i + 1) * (1.0 - pe);
        int ref = 0;
        for (int j = 0; j <= i; j++) ref += mask[((size_t)bh * T + i) * T + j] > 0;
        bad_rows += fabs(c - ref) > 1e-3 * (i + 1);
        kept += c;
        total += i + 1;
      }
    const double frac = 1.0 - kept / total, sd = sqrt(pe * (1.0 - pe) / total);
    CHECK(bad_rows == 0, "dropout p %g: %d rows keep a different count than the mask", (double)p,
          bad_rows);
    CHECK(fabs(frac - pe) < 6 * sd, "dropout p %g: dropped fraction %.5f over %.0f (sd %.2g)",
          (double)p, frac, total, sd);
    printf("  dropout p %.2f (p_eff %.5f): dropped %.5f of %.0f probabilities (|diff| %.1f sd)\n",
           (double)p, pe, frac, total, fabs(frac - pe) / sd);
    free(mask);
  }
  free(buf);
}

/* Copies a [B, H, T, D] view into a contiguous float array (or back). */
static void gather(const nt_tensor *t, float *dst) {
  const int64_t B = t->shape[0], H = t->shape[1], T = t->shape[2], D = t->shape[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t d = 0; d < D; d++)
          *dst++ = nt_load_f32(t->data, t->dtype,
                               b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + d);
}

/* A [B, H, T, D] view of head-interleaved rows: element (b, h, t, d) at
 * off + b * T * row + t * row + h * D + d (row = parts * H * D, the [B, T, parts * C] layout). */
static nt_tensor heads_view(float *base, int64_t off, int B, int H, int T, int D, int parts) {
  int64_t shape[4] = {B, H, T, D};
  nt_tensor t = nt_tensor_view(base + off, NT_F32, nt_cpu(), 4, shape);
  const int64_t row = (int64_t)parts * H * D;
  t.stride[0] = T * row;
  t.stride[1] = D;
  t.stride[2] = row;
  t.stride[3] = 1;
  return t;
}

/* q, k, v straight out of a [B, T, 3C] buffer, out into [B, T, C], dout from [B, T, C], dq,
 * dk, dv into a [B, T, 3C] gradient buffer: the same numbers as contiguous copies, bit for
 * bit (the CPU reference runs the same arithmetic), with and without dropout; what lies
 * between the views is left alone. */
static void test_strided(nt_ctx *ctx, int B, int H, int T, int D, float p) {
  const int C = H * D;
  const size_t n = (size_t)B * T * C;
  const nt_attention_opts opts = {p, 77, 40, false};
  nt_test_rng rng = {55};
  float *qkv = malloc(4 * 3 * n), *y = malloc(4 * n), *dy = malloc(4 * n),
        *dqkv = malloc(4 * 3 * n), *lse = malloc(4 * (size_t)B * H * T),
        *lse2 = malloc(4 * (size_t)B * H * T), *c = malloc(4 * 8 * n), *got = malloc(4 * n);
  nt_test_fill_uniform(&rng, qkv, (int64_t)(3 * n), -2, 2);
  nt_test_fill_uniform(&rng, dy, (int64_t)n, -1, 1);
  for (size_t i = 0; i < n; i++) y[i] = 1234.f;   /* out covers all of y */
  for (size_t i = 0; i < 3 * n; i++) dqkv[i] = 0.5f;
  nt_tensor sq = heads_view(qkv, 0, B, H, T, D, 3), sk = heads_view(qkv, C, B, H, T, D, 3),
            sv = heads_view(qkv, 2 * C, B, H, T, D, 3), so = heads_view(y, 0, B, H, T, D, 1),
            sd = heads_view(dy, 0, B, H, T, D, 1), sdq = heads_view(dqkv, 0, B, H, T, D, 3),
            sdk = heads_view(dqkv, C, B, H, T, D, 3), sdv = heads_view(dqkv, 2 * C, B, H, T, D, 3);
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor tl = nt_tensor_view(lse, NT_F32, nt_cpu(), 3, lshape),
            tl2 = nt_tensor_view(lse2, NT_F32, nt_cpu(), 3, lshape);
  nt_tensor ct[8];   /* contiguous q k v dout out dq dk dv */
  for (int i = 0; i < 8; i++) ct[i] = nt_tensor_view(c + i * n, NT_F32, nt_cpu(), 4, shape);
  gather(&sq, c);
  gather(&sk, c + n);
  gather(&sv, c + 2 * n);
  gather(&sd, c + 3 * n);
  for (size_t i = 0; i < 3 * n; i++) c[5 * n + i] = 0.5f;
  char label[64];
  snprintf(label, sizeof label, "strided B%d H%d T%d D%d p %g", B, H, T, D, (double)p);
  if (!CHECK_OK(ctx, nt_attention_forward_ex(ctx, &sq, &sk, &sv, &so, &tl, &opts)) ||
      !CHECK_OK(ctx, nt_attention_forward_ex(ctx, &ct[0], &ct[1], &ct[2], &ct[4], &tl2, &opts)) ||
      !CHECK_OK(ctx, nt_attention_backward_ex(ctx, &sd, &sq, &sk, &sv, &so, &tl, &sdq, &sdk, &sdv,
                                              &opts)) ||
      !CHECK_OK(ctx, nt_attention_backward_ex(ctx, &ct[3], &ct[0], &ct[1], &ct[2], &ct[4], &tl2,
                                              &ct[5], &ct[6], &ct[7], &opts)))
    goto done;
  gather(&so, got);
  CHECK(memcmp(got, c + 4 * n, 4 * n) == 0, "%s: out differs from the contiguous run", label);
  CHECK(memcmp(lse, lse2, 4 * (size_t)B * H * T) == 0, "%s: lse differs", label);
  const nt_tensor *sg[3] = {&sdq, &sdk, &sdv};
  for (int i = 0; i < 3; i++) {
    gather(sg[i], got);
    CHECK(memcmp(got, c + (5 + i) * n, 4 * n) == 0, "%s: gradient %d differs", label, i);
  }
  printf("  %s: identical to contiguous copies\n", label);
done:
  free(qkv);
  free(y);
  free(dy);
  free(dqkv);
  free(lse);
  free(lse2);
  free(c);
  free(got);
}

/* overwrite = true stores the gradients: into NaN-filled dq, dk, dv (never read) it gives
 * exactly what accumulating into zeros gives; without it the backward adds to what is there.
 * And p = 0 (any seed and offset, even one not a multiple of 4) is the NULL-options path bit
 * for bit, forward and backward. */
static void test_overwrite_and_p0(nt_ctx *ctx, float p) {
  const int B = 2, H = 2, T = 19, D = 6;
  const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
  nt_test_rng rng = {91};
  float *f = malloc(4 * n * 11), *lse = malloc(4 * rows), *lse0 = malloc(4 * rows);
  nt_test_fill_uniform(&rng, f, (int64_t)(5 * n), -1.5f, 1.5f);   /* q k v dout (out) */
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor t[11];   /* q k v dout out | acc dq dk dv | ow dq dk dv (+ out of the p = 0 run) */
  for (int i = 0; i < 11; i++) t[i] = nt_tensor_view(f + i * n, NT_F32, nt_cpu(), 4, shape);
  nt_tensor tl = nt_tensor_view(lse, NT_F32, nt_cpu(), 3, lshape),
            tl0 = nt_tensor_view(lse0, NT_F32, nt_cpu(), 3, lshape);
  memset(f + 5 * n, 0, 4 * 3 * n);
  for (size_t i = 0; i < 3 * n; i++) f[8 * n + i] = NAN;
  const nt_attention_opts acc = {p, 5, 8, false}, ow = {p, 5, 8, true};
  if (!CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[4], &tl, &acc)) ||
      !CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl, &t[5],
                                              &t[6], &t[7], &acc)) ||
      !CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl, &t[8],
                                              &t[9], &t[10], &ow)))
    goto done;
  CHECK(memcmp(f + 5 * n, f + 8 * n, 4 * 3 * n) == 0,
        "p %g: overwrite into NaN differs from accumulating into zeros", (double)p);
  /* A second accumulating call doubles; a second overwriting one changes nothing. */
  if (CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl, &t[5],
                                             &t[6], &t[7], &acc)) &&
      CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl, &t[8],
                                             &t[9], &t[10], &ow))) {
    int bad = 0;
    for (size_t i = 0; i < 3 * n; i++) bad += f[5 * n + i] != 2.f * f[8 * n + i];
    CHECK(bad == 0, "p %g: accumulate twice != 2 x overwrite (%d elements)", (double)p, bad);
  }
  if (p == 0.f) {
    /* NULL options against p = 0 with a stream that would be rejected if it were used. */
    const nt_attention_opts zero = {0.f, 999, 6, false};
    float *o0 = malloc(4 * n), *g0 = malloc(4 * 3 * n);
    nt_tensor to0 = nt_tensor_view(o0, NT_F32, nt_cpu(), 4, shape);
    nt_tensor tg0[3];
    for (int i = 0; i < 3; i++) tg0[i] = nt_tensor_view(g0 + i * n, NT_F32, nt_cpu(), 4, shape);
    memset(g0, 0, 4 * 3 * n);
    memset(f + 5 * n, 0, 4 * 3 * n);
    if (CHECK_OK(ctx, nt_attention_forward(ctx, &t[0], &t[1], &t[2], &t[4], &tl)) &&
        CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &to0, &tl0, &zero)) &&
        CHECK_OK(ctx, nt_attention_backward(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl, &t[5],
                                            &t[6], &t[7])) &&
        CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &to0, &tl0,
                                               &tg0[0], &tg0[1], &tg0[2], &zero))) {
      CHECK(memcmp(o0, f + 4 * n, 4 * n) == 0 && memcmp(lse0, lse, 4 * rows) == 0,
            "p = 0 forward differs from the plain path");
      CHECK(memcmp(g0, f + 5 * n, 4 * 3 * n) == 0, "p = 0 backward differs from the plain path");
    }
    free(o0);
    free(g0);
  }
done:
  free(f);
  free(lse);
  free(lse0);
}

/* Inside an RNG step the dropout offset is relative to the context's step base: forward and
 * backward equal, bit for bit, the calls outside a step with the offset base + offset added
 * by hand; the next step (same relative offset, advanced base) drops other probabilities. */
static void test_step_base(nt_ctx *ctx) {
  const int B = 2, H = 2, T = 13, D = 8;
  const float p = 0.3f;
  const uint64_t seed = 31, start = (1ull << 35) + 12;
  const size_t n = (size_t)B * H * T * D, rows = (size_t)B * H * T;
  nt_test_rng rng = {57};
  /* q k v dout | out dq dk dv (step) | out dq dk dv (by hand) | out (next step) */
  float *f = malloc(4 * n * 13), *lse = malloc(4 * rows * 3);
  nt_test_fill_uniform(&rng, f, (int64_t)(4 * n), -1.5f, 1.5f);
  int64_t shape[4] = {B, H, T, D}, lshape[3] = {B, H, T};
  nt_tensor t[13], tl[3];
  for (int i = 0; i < 13; i++) t[i] = nt_tensor_view(f + i * n, NT_F32, nt_cpu(), 4, shape);
  for (int i = 0; i < 3; i++) tl[i] = nt_tensor_view(lse + i * rows, NT_F32, nt_cpu(), 3, lshape);
  nt_attention_opts o = {p, seed, 0, true};
  nt_ctx_set_rng_offset(ctx, start);
  uint64_t used = 0;
  if (CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx))) {
    nt_ctx_rng_reserve(ctx, 10);   /* another op's numbers first: the mask's offset is 12 */
    o.offset = nt_ctx_rng_reserve(ctx, nt_attention_rng_numbers(B, H, T));
    CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[4], &tl[0], &o));
    CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[4], &tl[0], &t[5],
                                           &t[6], &t[7], &o));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, &used));
  }
  /* 676 probabilities: 169 numbers, rounded up to 172 */
  CHECK(o.offset == 12 && used == 12 + 172, "relative offset %llu, step count %llu",
        (unsigned long long)o.offset, (unsigned long long)used);
  nt_attention_opts abs = o;
  abs.offset = start + o.offset;
  if (CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[8], &tl[1], &abs)) &&
      CHECK_OK(ctx, nt_attention_backward_ex(ctx, &t[3], &t[0], &t[1], &t[2], &t[8], &tl[1],
                                             &t[9], &t[10], &t[11], &abs))) {
    CHECK(memcmp(f + 4 * n, f + 8 * n, 4 * 4 * n) == 0 && memcmp(lse, lse + rows, 4 * rows) == 0,
          "attention dropout in a step differs from the absolute offset");
  }
  if (CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx))) {
    nt_ctx_rng_reserve(ctx, 10);
    o.offset = nt_ctx_rng_reserve(ctx, nt_attention_rng_numbers(B, H, T));
    CHECK_OK(ctx, nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[12], &tl[2], &o));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, NULL));
    CHECK(memcmp(f + 4 * n, f + 12 * n, 4 * n) != 0, "the next step draws another mask");
    CHECK(memcmp(lse, lse + 2 * rows, 4 * rows) == 0, "lse does not depend on the mask");
  }
  CHECK(nt_ctx_rng_offset(ctx) == start + 2 * used, "two steps: offset %llu",
        (unsigned long long)nt_ctx_rng_offset(ctx));
  free(f);
  free(lse);
}

/* The byte threshold round(p * 256) (at most 255), the factor 256 / (256 - thr) and the
 * reservation ceil(B*H*T*T / 4), against values worked out by hand. */
static void test_threshold(void) {
  const float ps[] = {0.f, 1e-9f, 0.0019f, 0.002f, 0.1f, 0.2f, 0.5f, 0.9f, 0.998f, 0.999999f};
  const uint32_t want[] = {0, 0, 0, 1, 26, 51, 128, 230, 255, 255};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    const uint32_t t = nt_attention_keep_threshold(ps[i]);
    CHECK(t == want[i], "keep threshold of p %g: %u, want %u", (double)ps[i], t, want[i]);
    CHECK(nt_attention_keep_scale(ps[i]) == 256.0 / (256.0 - want[i]), "keep scale of p %g: %g",
          (double)ps[i], nt_attention_keep_scale(ps[i]));
  }
  CHECK(nt_attention_rng_numbers(2, 2, 13) == 169 && nt_attention_rng_numbers(1, 1, 3) == 3 &&
            nt_attention_rng_numbers(16, 12, 1024) == 16ull * 12 * 1024 * 256,
        "dropout reservation sizes");
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
  /* Strided B, H, T dims are fine, a strided D is not. */
  int64_t s5[4] = {2, 3, 8, 5};
  nt_tensor q5 = nt_tensor_view(buf[0], NT_F32, nt_cpu(), 4, s5);
  nt_tensor qt = nt_tensor_transpose(&q5, 2, 3);
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_attention_forward(ctx, &qt, &k, &v, &o, &lse));
  nt_tensor ot = nt_tensor_transpose(&q5, 2, 3);
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_attention_forward(ctx, &q, &k, &v, &ot, &lse));
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED,
            nt_attention_backward(ctx, &o, &q, &k, &v, &o, &lse, &qt, &k, &v));
  /* Dropout: p in [0, 1), a Philox-block offset. */
  const nt_attention_opts bad_p[3] = {{1.f, 0, 0, false}, {-0.1f, 0, 0, false},
                                      {NAN, 0, 0, false}};
  for (int i = 0; i < 3; i++)
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
              nt_attention_forward_ex(ctx, &q, &k, &v, &o, &lse, &bad_p[i]));
  const nt_attention_opts bad_off = {0.1f, 1, 6, false};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_attention_forward_ex(ctx, &q, &k, &v, &o, &lse, &bad_off));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_attention_backward_ex(ctx, &o, &q, &k, &v, &o, &lse, &q, &k, &v, &bad_off));
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
  test_forward(ctx, 2, 3, 37, 16, 1, 0.f, 0, 0);
  test_forward(ctx, 1, 2, 100, 64, 2, 0.f, 0, 0);
  test_forward(ctx, 1, 1, 1, 8, 3, 0.f, 0, 0);
  test_forward(ctx, 2, 1, 19, 5, 4, 0.f, 0, 0);
  test_forward(ctx, 1, 1, 9, 128, 5, 0.f, 0, 0);
  /* Dropout: T not a multiple of 16 (rows start mid Philox block), a large offset. */
  test_forward(ctx, 2, 3, 37, 16, 6, 0.2f, 1234, 0);
  test_forward(ctx, 1, 2, 64, 32, 7, 0.5f, 42, 4ull << 40);
  test_forward(ctx, 2, 1, 19, 5, 8, 0.1f, 7, 12);
  test_forward(ctx, 1, 1, 1, 8, 9, 0.2f, 3, 4);
  test_backward(ctx, 1, 2, 7, 5, 10, 0.f, 0, 0);
  test_backward(ctx, 2, 1, 11, 8, 11, 0.f, 0, 0);
  test_backward(ctx, 1, 1, 1, 3, 12, 0.f, 0, 0);
  test_backward(ctx, 1, 2, 9, 5, 13, 0.2f, 99, 16);
  test_backward(ctx, 2, 1, 8, 4, 14, 0.5f, 5, 0);
  test_backward(ctx, 1, 1, 13, 6, 15, 0.2f, 0x123456789abull, 1ull << 33);
  test_dropout_fraction(ctx, 0.2f, 2024, 0);
  test_dropout_fraction(ctx, 0.5f, 11, 1ull << 36);
  test_strided(ctx, 2, 3, 11, 8, 0.f);
  test_strided(ctx, 2, 3, 11, 8, 0.2f);
  test_strided(ctx, 1, 2, 5, 3, 0.5f);
  test_overwrite_and_p0(ctx, 0.f);
  test_overwrite_and_p0(ctx, 0.2f);
  test_step_base(ctx);
  test_threshold();
  test_errors(ctx);
  nt_ctx_free(ctx);
  printf("measured: forward vs f32 worst rel err bf16 %.3g (bound 6e-3), f16 %.3g (bound "
         "8e-4)\n", low_worst[0], low_worst[1]);
  return nt_test_finish();
}
