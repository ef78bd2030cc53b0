/* Causal self-attention: argument checks, dispatch, and the CPU reference (plain loops,
 * fp64 accumulation, strided views, the dropout mask read from the Philox stream). */
#include "ops/attention.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_attention_forward_cuda(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                                    const nt_tensor *v, nt_tensor *out, nt_tensor *lse,
                                    const nt_attention_opts *o);
nt_status nt_attention_backward_cuda(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                     const nt_tensor *k, const nt_tensor *v,
                                     const nt_tensor *out, const nt_tensor *lse, nt_tensor *dq,
                                     nt_tensor *dk, nt_tensor *dv, const nt_attention_opts *o);
#endif

#define ATTN_MAX_D 128

/* Every [B, H, T, D] operand: float dtype shared by all, shaped like q, on ctx's device,
 * unit stride along D (the other strides are free). */
static nt_status check_bhtd(nt_ctx *ctx, const nt_tensor *t, const nt_tensor *ref,
                            const char *what) {
  nt_status st;
  if (!t) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "attention: %s is NULL", what);
  if ((st = nt_check_device(ctx, t, what))) return st;
  if ((st = nt_check_ndim(ctx, t, 4, what))) return st;
  if ((st = nt_check_same_shape(ctx, t, ref, what))) return st;
  if ((st = nt_check_dtype(ctx, t, ref->dtype, what))) return st;
  if (t->stride[3] != 1 && t->shape[3] != 1)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "%s: the head dim D must be contiguous (stride %lld, expected 1)", what,
                    (long long)t->stride[3]);
  return NT_OK;
}

static nt_status check_lse(nt_ctx *ctx, const nt_tensor *lse, const nt_tensor *q) {
  nt_status st;
  if (!lse) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "attention: lse is NULL");
  if ((st = nt_check_device(ctx, lse, "attention lse"))) return st;
  if ((st = nt_check_dtype(ctx, lse, NT_F32, "attention lse"))) return st;
  if ((st = nt_check_ndim(ctx, lse, 3, "attention lse [B, H, T]"))) return st;
  for (int i = 0; i < 3; i++)
    if ((st = nt_check_dim(ctx, lse, i, q->shape[i], "attention lse [B, H, T]"))) return st;
  return nt_check_contiguous(ctx, lse, "attention lse");
}

static nt_status check_q(nt_ctx *ctx, const nt_tensor *q) {
  nt_status st;
  if (!q) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "attention: q is NULL");
  if ((st = nt_check_ndim(ctx, q, 4, "attention q [B, H, T, D]"))) return st;
  if (q->dtype != NT_F32 && q->dtype != NT_F16 && q->dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "attention: dtype %s not supported (f32, f16, bf16)",
                    nt_dtype_name(q->dtype));
  if (q->shape[3] < 1 || q->shape[3] > ATTN_MAX_D)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: head dim D = %lld (1..%d supported)",
                    (long long)q->shape[3], ATTN_MAX_D);
  if (q->shape[0] < 1 || q->shape[1] < 1 || q->shape[2] < 1)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "attention: empty q [%lld, %lld, %lld, %lld]",
                    (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[2],
                    (long long)q->shape[3]);
  if (q->shape[2] > (1 << 24) || q->shape[0] * q->shape[1] > (1 << 30))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: q too large");
  return NT_OK;
}

/* opts NULL becomes the defaults; dropout in [0, 1) and, when on, a Philox-block offset. */
static nt_status check_opts(nt_ctx *ctx, const nt_attention_opts *in, nt_attention_opts *out) {
  static const nt_attention_opts none = {0.f, 0, 0, false};
  *out = in ? *in : none;
  const float p = out->dropout;
  if (!(p >= 0.f && p < 1.f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "attention: dropout p = %g must be in [0, 1)",
                    (double)p);
  if (p > 0.f && out->offset % 4 != 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "attention: dropout RNG offset %llu must be a multiple of 4 (take it from "
                    "nt_ctx_rng_reserve)",
                    (unsigned long long)out->offset);
  return NT_OK;
}

static bool on_cuda(const nt_tensor *t) { return t->device.type == NT_DEV_CUDA; }

/* The CPU reference draws number base + offset + n: inside an RNG step the offset is relative
 * to the context's step base (core/ctx.h; the CUDA kernels read the same word themselves). */
static void add_step_base(nt_ctx *ctx, nt_attention_opts *o) {
  const uint64_t *base = nt_ctx_rng_base(ctx);
  if (base && o->dropout > 0.f) o->offset += *base;
}

#ifndef NT_HAVE_CUDA
static nt_status no_backend(nt_ctx *ctx) {
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "attention: CUDA tensor without the CUDA backend");
}
#endif

uint32_t nt_attention_keep_threshold(float p) {
  /* p * 256 is exact in double; halves round up; 256 (p above 255.5 / 256) would drop all. */
  const double t = floor((double)p * 256.0 + 0.5);
  return !(t > 0.0) ? 0u : t >= 255.0 ? 255u : (uint32_t)t;
}

double nt_attention_keep_scale(float p) {
  return 256.0 / (double)(256u - nt_attention_keep_threshold(p));
}

uint64_t nt_attention_rng_numbers(int64_t B, int64_t H, int64_t T) {
  return ((uint64_t)B * (uint64_t)H * (uint64_t)T * (uint64_t)T + 3) / 4;
}

/* ---- CPU reference ---------------------------------------------------------------------- */

/* Element offset of row i of head bh = b * H + h in a [B, H, T, D] view. */
static int64_t row_at(const nt_tensor *t, int64_t bh, int64_t i) {
  const int64_t H = t->shape[1];
  return (bh / H) * t->stride[0] + (bh % H) * t->stride[1] + i * t->stride[2];
}

static void load_row(const nt_tensor *t, int64_t bh, int64_t i, double *dst) {
  const int64_t at = row_at(t, bh, i), D = t->shape[3];
  for (int64_t d = 0; d < D; d++) dst[d] = nt_load_f32(t->data, t->dtype, at + d * t->stride[3]);
}

/* The dropout mask (ops/attention.h): element index n (counted from byte 0 of the block at
 * stream number offset, so n = 4 * offset + e) is kept iff byte n % 16 of Philox block n / 16
 * is >= thr. Reads one block at a time. */
typedef struct {
  uint32_t thr;
  uint64_t seed, block;   /* block held in w; UINT64_MAX before the first */
  uint32_t w[4];
} keep_reader;

static bool keep_at(keep_reader *r, uint64_t n) {
  if (r->block != n >> 4) {
    r->block = n >> 4;
    const uint32_t ctr[4] = {(uint32_t)r->block, (uint32_t)(r->block >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)r->seed, (uint32_t)(r->seed >> 32)};
    nt_philox4x32_10(ctr, key, r->w);
  }
  return ((r->w[(n >> 2) & 3] >> (8 * (n & 3))) & 0xffu) >= r->thr;
}

static keep_reader keep_reader_of(const nt_attention_opts *o) {
  const keep_reader r = {nt_attention_keep_threshold(o->dropout), o->seed, UINT64_MAX,
                         {0, 0, 0, 0}};
  return r;
}

/* Element index of row i of head bh's key 0: 4 * offset + (bh * T + i) * T. */
static uint64_t mask_row(const nt_attention_opts *o, int64_t bh, int64_t i, int64_t T) {
  return 4 * o->offset + ((uint64_t)bh * (uint64_t)T + (uint64_t)i) * (uint64_t)T;
}

static nt_status attention_forward_cpu(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                                       const nt_tensor *v, nt_tensor *out, nt_tensor *lse,
                                       const nt_attention_opts *opt) {
  const int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
  const double scale = 1.0 / sqrt((double)D);
  const bool drop = opt->dropout > 0.f;
  const double keep_scale = drop ? nt_attention_keep_scale(opt->dropout) : 1.0;
  keep_reader kr = keep_reader_of(opt);
  double *qi = malloc(sizeof(double) * (size_t)D), *o = malloc(sizeof(double) * (size_t)D);
  double *kv = malloc(sizeof(double) * (size_t)D), *s = malloc(sizeof(double) * (size_t)T);
  if (!qi || !o || !kv || !s) {
    free(qi); free(o); free(kv); free(s);
    return NT_ERROR(ctx, NT_ERR_OOM, "attention: out of host memory");
  }
  for (int64_t bh = 0; bh < BH; bh++) {
    for (int64_t i = 0; i < T; i++) {
      load_row(q, bh, i, qi);
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; j++) {
        load_row(k, bh, j, kv);
        double acc = 0;
        for (int64_t d = 0; d < D; d++) acc += qi[d] * kv[d];
        s[j] = acc * scale;
        if (s[j] > m) m = s[j];
      }
      double l = 0;
      memset(o, 0, sizeof(double) * (size_t)D);
      const uint64_t n0 = drop ? mask_row(opt, bh, i, T) : 0;
      for (int64_t j = 0; j <= i; j++) {
        double p = exp(s[j] - m);
        l += p;   /* the normaliser (and lse) see every probability, dropped or not */
        if (drop && !keep_at(&kr, n0 + (uint64_t)j)) continue;
        load_row(v, bh, j, kv);
        for (int64_t d = 0; d < D; d++) o[d] += p * kv[d];
      }
      const int64_t at = row_at(out, bh, i);
      for (int64_t d = 0; d < D; d++)
        nt_store_f32(out->data, out->dtype, at + d * out->stride[3],
                     (float)(o[d] / l * keep_scale));
      ((float *)lse->data)[bh * T + i] = (float)(m + log(l));
    }
  }
  free(qi); free(o); free(kv); free(s);
  return NT_OK;
}

/* Adds (or, overwrite, stores) a double buffer of one head's [T, D] into a gradient view. */
static void write_grad(nt_tensor *g, int64_t bh, const double *src, bool overwrite) {
  const int64_t T = g->shape[2], D = g->shape[3];
  for (int64_t i = 0; i < T; i++) {
    const int64_t at = row_at(g, bh, i);
    for (int64_t d = 0; d < D; d++) {
      const int64_t e = at + d * g->stride[3];
      const double cur = overwrite ? 0.0 : (double)nt_load_f32(g->data, g->dtype, e);
      nt_store_f32(g->data, g->dtype, e, (float)(cur + src[i * D + d]));
    }
  }
}

/* With the kept probabilities Z = P * mask / (1 - p_eff) and O = Z V:
 *   dV = Z^T dO,  dZ = dO V^T,  dP = dZ * mask / (1 - p_eff),
 *   dS = P * (dP - rowsum(P * dP)) and rowsum(P * dP) = rowsum(Z * dZ) = rowsum(dO * O),
 * so FlashAttention's D = rowsum(dO * O) still holds with O the dropped output. */
static nt_status attention_backward_cpu(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                        const nt_tensor *k, const nt_tensor *v,
                                        const nt_tensor *out, const nt_tensor *lse,
                                        nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                                        const nt_attention_opts *opt) {
  const int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
  const double scale = 1.0 / sqrt((double)D);
  const bool drop = opt->dropout > 0.f;
  const double keep_scale = drop ? nt_attention_keep_scale(opt->dropout) : 1.0;
  keep_reader kr = keep_reader_of(opt);
  const size_t n = (size_t)(T * D);
  /* Whole heads in fp64: q, k, v, dO, O and the three gradient accumulators. */
  double *buf = malloc(sizeof(double) * (8 * n + (size_t)T));
  if (!buf) return NT_ERROR(ctx, NT_ERR_OOM, "attention backward: out of host memory");
  double *Q = buf, *K = Q + n, *V = K + n, *dO = V + n, *O = dO + n, *gq = O + n, *gk = gq + n,
         *gv = gk + n, *Di = gv + n;
  for (int64_t bh = 0; bh < BH; bh++) {
    for (int64_t i = 0; i < T; i++) {
      load_row(q, bh, i, Q + i * D);
      load_row(k, bh, i, K + i * D);
      load_row(v, bh, i, V + i * D);
      load_row(dout, bh, i, dO + i * D);
      load_row(out, bh, i, O + i * D);
      double acc = 0;
      for (int64_t d = 0; d < D; d++) acc += dO[i * D + d] * O[i * D + d];
      Di[i] = acc;
    }
    memset(gq, 0, sizeof(double) * 3 * n);
    for (int64_t i = 0; i < T; i++) {
      const double L = ((const float *)lse->data)[bh * T + i];
      const uint64_t n0 = drop ? mask_row(opt, bh, i, T) : 0;
      for (int64_t j = 0; j <= i; j++) {
        double s = 0, dp = 0;
        for (int64_t d = 0; d < D; d++) {
          s += Q[i * D + d] * K[j * D + d];
          dp += dO[i * D + d] * V[j * D + d];
        }
        const double p = exp(s * scale - L);
        /* mr: the dropout factor of this probability (0 dropped, 1 / (1 - p_eff) kept). */
        const double mr = drop ? (keep_at(&kr, n0 + (uint64_t)j) ? keep_scale : 0.0) : 1.0;
        const double z = p * mr, ds = p * (dp * mr - Di[i]) * scale;
        for (int64_t d = 0; d < D; d++) {
          gv[j * D + d] += z * dO[i * D + d];
          gq[i * D + d] += ds * K[j * D + d];
          gk[j * D + d] += ds * Q[i * D + d];
        }
      }
    }
    write_grad(dq, bh, gq, opt->overwrite);
    write_grad(dk, bh, gk, opt->overwrite);
    write_grad(dv, bh, gv, opt->overwrite);
  }
  free(buf);
  return NT_OK;
}

/* q's own checks, then k, v and out shaped and typed like q (forward and backward alike). */
static nt_status check_q_k_v_out(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                                 const nt_tensor *v, const nt_tensor *out) {
  nt_status st;
  if ((st = check_q(ctx, q))) return st;
  if ((st = check_bhtd(ctx, q, q, "attention q"))) return st;
  if ((st = check_bhtd(ctx, k, q, "attention k"))) return st;
  if ((st = check_bhtd(ctx, v, q, "attention v"))) return st;
  if ((st = check_bhtd(ctx, out, q, "attention out"))) return st;
  return NT_OK;
}

/* ---- public entry points ---------------------------------------------------------------- */

nt_status nt_attention_forward_ex(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                                  const nt_tensor *v, nt_tensor *out, nt_tensor *lse,
                                  const nt_attention_opts *opts) {
  nt_status st;
  nt_attention_opts o;
  if ((st = check_opts(ctx, opts, &o))) return st;
  if ((st = check_q_k_v_out(ctx, q, k, v, out))) return st;
  if ((st = check_lse(ctx, lse, q))) return st;
  if (on_cuda(q)) {
#ifdef NT_HAVE_CUDA
    return nt_attention_forward_cuda(ctx, q, k, v, out, lse, &o);
#else
    return no_backend(ctx);
#endif
  }
  add_step_base(ctx, &o);
  return attention_forward_cpu(ctx, q, k, v, out, lse, &o);
}

nt_status nt_attention_backward_ex(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                   const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                                   const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk,
                                   nt_tensor *dv, const nt_attention_opts *opts) {
  nt_status st;
  nt_attention_opts o;
  if ((st = check_opts(ctx, opts, &o))) return st;
  if ((st = check_q_k_v_out(ctx, q, k, v, out))) return st;
  if ((st = check_bhtd(ctx, dout, q, "attention dout"))) return st;
  if ((st = check_bhtd(ctx, dq, q, "attention dq"))) return st;
  if ((st = check_bhtd(ctx, dk, q, "attention dk"))) return st;
  if ((st = check_bhtd(ctx, dv, q, "attention dv"))) return st;
  if ((st = check_lse(ctx, lse, q))) return st;
  if (on_cuda(q)) {
#ifdef NT_HAVE_CUDA
    return nt_attention_backward_cuda(ctx, dout, q, k, v, out, lse, dq, dk, dv, &o);
#else
    return no_backend(ctx);
#endif
  }
  add_step_base(ctx, &o);
  return attention_backward_cpu(ctx, dout, q, k, v, out, lse, dq, dk, dv, &o);
}

nt_status nt_attention_forward(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                               const nt_tensor *v, nt_tensor *out, nt_tensor *lse) {
  return nt_attention_forward_ex(ctx, q, k, v, out, lse, NULL);
}

nt_status nt_attention_backward(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                                const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk,
                                nt_tensor *dv) {
  return nt_attention_backward_ex(ctx, dout, q, k, v, out, lse, dq, dk, dv, NULL);
}
