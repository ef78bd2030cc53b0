/* FP8 linear layer: quantize (ops/quantize.h) -> FP8 GEMM (ops/gemm.h, TN layout) -> output,
 * with the fp32 emulation of the GEMMs where FP8 GEMMs are not available. Also the two small
 * helpers around the GEMMs: adding an fp32 GEMM result (and bias) into an output of any float
 * dtype, and the bias gradient as fp32 column sums of dy. */
#include "amp/fp8_linear.h"
#include "ops/gemm.h"
#include "ops/quantize.h"
#include "ops/elementwise.h"
#include "amp/policy.h"
#include <math.h>
#include <stdint.h>

#ifdef NT_HAVE_CUDA
nt_status nt_fp8_linear_add_cuda(nt_ctx *ctx, nt_tensor *dst, const float *src, int64_t ld,
                                 const nt_tensor *bias, bool accumulate);
nt_status nt_fp8_linear_colsum_cuda(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *db);
#endif

static bool is_float(nt_dtype t) { return t == NT_F32 || t == NT_F16 || t == NT_BF16; }
static int64_t up16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* ---- the two helpers: CPU references and dispatch ---- */

/* dst[r, c] = (accumulate ? dst[r, c] : 0) + (src[r * ld + c] + bias[c]) */
static void add_cpu(nt_tensor *dst, const float *src, int64_t ld, const nt_tensor *bias,
                    bool accumulate) {
  for (int64_t r = 0; r < dst->shape[0]; r++)
    for (int64_t c = 0; c < dst->shape[1]; c++) {
      int64_t di = r * dst->stride[0] + c;
      float v = src[r * ld + c];
      if (bias) v += nt_load_f32(bias->data, bias->dtype, c);
      if (accumulate) v = nt_load_f32(dst->data, dst->dtype, di) + v;
      nt_store_f32(dst->data, dst->dtype, di, v);
    }
}

static nt_status add_into(nt_ctx *ctx, nt_tensor *dst, const float *src, int64_t ld,
                          const nt_tensor *bias, bool accumulate) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return nt_fp8_linear_add_cuda(ctx, dst, src, ld, bias, accumulate);
#endif
  (void)ctx;
  add_cpu(dst, src, ld, bias, accumulate);
  return NT_OK;
}

/* db[n] += sum over m of dy[m, n], in double on the CPU. */
static nt_status colsum(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *db) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return nt_fp8_linear_colsum_cuda(ctx, dy, db);
#endif
  (void)ctx;
  for (int64_t n = 0; n < dy->shape[1]; n++) {
    double s = 0.0;
    for (int64_t m = 0; m < dy->shape[0]; m++)
      s += nt_load_f32(dy->data, dy->dtype, m * dy->stride[0] + n);
    nt_store_f32(db->data, db->dtype, n * db->stride[0],
                 nt_load_f32(db->data, db->dtype, n * db->stride[0]) + (float)s);
  }
  return NT_OK;
}

/* ---- argument handling ---- */

static nt_status rows_view(nt_ctx *ctx, const nt_tensor *t, int64_t last, const char *what,
                           nt_tensor *out) {
  char b[96];
  nt_status st;
  if ((st = nt_check_device(ctx, t, what))) return st;
  if (!is_float(t->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 linear: %s is %s (f32, f16 or bf16)", what,
                    nt_dtype_name(t->dtype));
  if (t->ndim < 1 || t->shape[t->ndim - 1] != last)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear: %s %s must end in a dim of size %lld", what,
                    nt_tensor_describe(t, b, sizeof b), (long long)last);
  if (t->ndim == 2) {
    *out = *t;
  } else if (t->ndim == 1) {
    *out = *t;
    out->ndim = 2;
    out->shape[0] = 1; out->shape[1] = last;
    out->stride[0] = last; out->stride[1] = t->stride[0];
  } else {
    if (!nt_tensor_is_contiguous(t))
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "fp8 linear: %s %s has %d dims and is not contiguous", what,
                      nt_tensor_describe(t, b, sizeof b), t->ndim);
    int64_t shape[2] = {last ? nt_tensor_numel(t) / last : 0, last};
    *out = nt_tensor_view(t->data, t->dtype, t->device, 2, shape);
  }
  if (out->shape[1] > 1 && out->stride[1] != 1)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "fp8 linear: %s %s needs unit stride along its last "
                    "dim", what, nt_tensor_describe(t, b, sizeof b));
  if (out->shape[1] <= 1) out->stride[1] = 1;
  return NT_OK;
}

static nt_status check_vector(nt_ctx *ctx, const nt_tensor *v, int64_t n, const char *what) {
  char b[96];
  nt_status st;
  if ((st = nt_check_device(ctx, v, what))) return st;
  if (!is_float(v->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 linear: %s is %s (f32, f16 or bf16)", what,
                    nt_dtype_name(v->dtype));
  if (v->ndim != 1 || v->shape[0] != n || (n > 1 && v->stride[0] != 1))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear: %s %s must be [%lld], contiguous", what,
                    nt_tensor_describe(v, b, sizeof b), (long long)n);
  return NT_OK;
}

static nt_status check_weight(nt_ctx *ctx, const nt_tensor *w, const char *what) {
  char b[96];
  nt_status st;
  if ((st = nt_check_device(ctx, w, what))) return st;
  if (!is_float(w->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 linear: %s is %s (f32, f16 or bf16)", what,
                    nt_dtype_name(w->dtype));
  if (w->ndim != 2 || (w->shape[1] > 1 && w->stride[1] != 1) || w->stride[0] < w->shape[1])
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear: %s %s must be 2-D [out, in] with unit "
                    "stride along in", what, nt_tensor_describe(w, b, sizeof b));
  return NT_OK;
}

static nt_status check_cfg(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg) {
  if (!cfg || !cfg->state)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear: no delayed-scaling state");
  int n = nt_fp8_state_count(cfg->state);
  if (cfg->index < 0 || cfg->index + NT_FP8_LINEAR_TENSORS > n)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "fp8 linear: tensors %d..%d are beyond the state's %d", cfg->index,
                    cfg->index + NT_FP8_LINEAR_TENSORS - 1, n);
  return NT_OK;
}

nt_status nt_fp8_linear_state_create(nt_ctx *ctx, const nt_fp8_options *opt, int n_layers,
                                     nt_fp8_state **out) {
  nt_dtype formats[3 * 256];
  *out = NULL;
  if (n_layers < 1 || n_layers > 256)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear state: %d layers (1..256)", n_layers);
  for (int l = 0; l < n_layers; l++) {
    formats[3 * l + NT_FP8_LINEAR_INPUT] = NT_FP8_E4M3;
    formats[3 * l + NT_FP8_LINEAR_WEIGHT] = NT_FP8_E4M3;
    formats[3 * l + NT_FP8_LINEAR_GRAD] = NT_FP8_E5M2;
  }
  return nt_fp8_state_create(ctx, opt, formats, 3 * n_layers, out);
}

nt_status nt_fp8_linear_uses_fp8(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, bool *out) {
  int cc = 0;
  *out = false;
  if (cfg && cfg->emulate) return NT_OK;
  nt_status st = nt_policy_compute_capability(ctx, &cc);
  if (!st) *out = cc >= 90;
  return st;
}

/* ---- the GEMM: FP8 or its emulation ---- */

typedef struct {
  nt_ctx *ctx;
  bool fp8;
  void *bufs[8];
  int nbufs;
} job;

static nt_status job_alloc(job *j, nt_dtype dt, int64_t rows, int64_t cols, nt_tensor *out) {
  void *p = NULL;
  if (j->nbufs == (int)(sizeof j->bufs / sizeof j->bufs[0]))
    return NT_ERROR(j->ctx, NT_ERR_INVALID_ARG, "fp8 linear: too many scratch buffers");
  size_t bytes = (size_t)(rows * cols) * nt_dtype_size(dt);
  nt_status st = nt_alloc(j->ctx, bytes ? bytes : 16, &p);
  if (st) return st;
  j->bufs[j->nbufs++] = p;
  int64_t shape[2] = {rows, cols};
  *out = nt_tensor_view(p, dt, nt_ctx_device(j->ctx), 2, shape);
  return NT_OK;
}

static void job_release(job *j, void *p) {
  for (int i = 0; i < j->nbufs; i++)
    if (j->bufs[i] == p) {
      nt_free(j->ctx, p);
      j->bufs[i] = j->bufs[--j->nbufs];
      return;
    }
}

static void job_free(job *j) {
  for (int i = 0; i < j->nbufs; i++) nt_free(j->ctx, j->bufs[i]);
  j->nbufs = 0;
}

/* D = beta D + (A B^T) * sa * sb (+ bias), A [M, K] and B [N, K] FP8, sa and sb the device
 * scale_inv scalars. Emulation: both operands dequantized to fp32 (value * scale_inv), then an
 * fp32 GEMM, never TF32 whatever the context's default. With aux (FP8 GEMMs only, beta 0): the
 * GELU_AUX epilogue, aux = the product (+ bias) and D = gelu_tanh(aux). */
static nt_status mm(job *j, const nt_tensor *A, const nt_tensor *sa, const nt_tensor *B,
                    const nt_tensor *sb, nt_tensor *D, float beta, const nt_tensor *bias,
                    nt_tensor *aux) {
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  o.beta = beta;
  o.bias = bias;
  o.epilogue = aux ? NT_EPI_GELU_AUX : bias ? NT_EPI_BIAS : NT_EPI_NONE;
  o.aux = aux;
  if (j->fp8) {
    o.scale_inv_a = (const float *)sa->data;
    o.scale_inv_b = (const float *)sb->data;
    return nt_gemm(j->ctx, A, B, D, &o);
  }
  nt_tensor Af, Bf;
  nt_status st;
  if ((st = job_alloc(j, NT_F32, A->shape[0], A->shape[1], &Af)) ||
      (st = job_alloc(j, NT_F32, B->shape[0], B->shape[1], &Bf)) ||
      (st = nt_fp8_dequantize(j->ctx, A, sa, &Af)) || (st = nt_fp8_dequantize(j->ctx, B, sb, &Bf)))
    return st;
  o.tf32 = NT_TF32_OFF;
  st = nt_gemm(j->ctx, &Af, &Bf, D, &o);
  job_release(j, Af.data);
  job_release(j, Bf.data);
  return st;
}

/* The GEMM may write `out` itself: no padding was needed (the product's N and K are the real
 * ones), and out is dense rows, 16-byte aligned (cuBLASLt's FP8 rule for D). */
static bool direct_ok(const nt_tensor *out, bool padded) {
  return !padded && out->stride[1] == 1 && out->stride[0] == out->shape[1] &&
         ((uintptr_t)out->data & 15u) == 0;
}

/* Whether the GEMM A B^T (+ bias) may write `out` itself (else an fp32 scratch and a kernel). */
static bool gemm_writes_out(const job *j, const nt_tensor *B, const nt_tensor *out,
                            const nt_tensor *bias, bool padded) {
  /* A bias rides on the GEMM only in the case the FP8 GEMM tests cover (bf16 bias, bf16 out). */
  bool bias_ok = !bias || (bias->dtype == NT_BF16 && out->dtype == NT_BF16 &&
                           bias->stride[0] == 1);
  /* The emulation's fp32 GEMM writes only F32 outputs. */
  bool dtype_ok = j->fp8 || out->dtype == NT_F32;
  return direct_ok(out, padded) && bias_ok && dtype_ok && B->shape[0] == out->shape[1];
}

/* out (+)= A B^T scaled, through the GEMM directly or an fp32 scratch. A is [M, Kp], B [Np, Kp]
 * with Np >= out's columns; padded says Np or Kp differ from the real dims. */
static nt_status product_into(job *j, const nt_tensor *A, const nt_tensor *sa, const nt_tensor *B,
                              const nt_tensor *sb, nt_tensor *out, bool accumulate,
                              const nt_tensor *bias, bool padded) {
  nt_status st;
  if (gemm_writes_out(j, B, out, bias, padded))
    return mm(j, A, sa, B, sb, out, accumulate ? 1.0f : 0.0f, bias, NULL);
  nt_tensor D;
  if ((st = job_alloc(j, NT_F32, A->shape[0], B->shape[0], &D)) ||
      (st = mm(j, A, sa, B, sb, &D, 0.0f, NULL, NULL)) ||
      (st = add_into(j->ctx, out, (const float *)D.data, B->shape[0], bias, accumulate)))
    return st;
  job_release(j, D.data);
  return NT_OK;
}

/* ---- forward and backward ---- */

/* y = x W^T + b; with pre (act GELU): pre = x W^T + b and y = gelu_tanh(pre), in the FP8 GEMM's
 * GELU_AUX epilogue where the GEMM writes y itself (FP8 GEMMs, no padding, see product_into;
 * nt_gemm splits the epilogue off where cuBLASLt has no fused kernel), else the GEMM into pre
 * and the elementwise GELU. pre and y are then contiguous, of one dtype (checked by the
 * caller). */
static nt_status forward(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, const nt_tensor *x,
                         const nt_tensor *w, const nt_tensor *b, nt_tensor *y, nt_tensor *pre) {
  nt_status st;
  nt_tensor x2, y2, xq, wq, pre2 = {0};
  job j = {ctx, false, {0}, 0};
  if (!x || !w || !y)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear: x, W and y are required");
  if ((st = check_cfg(ctx, cfg)) || (st = check_weight(ctx, w, "W"))) return st;
  int64_t N = w->shape[0], K = w->shape[1];
  if ((st = rows_view(ctx, x, K, "x", &x2)) || (st = rows_view(ctx, y, N, "y", &y2)) ||
      (pre && (st = rows_view(ctx, pre, N, "pre", &pre2))) ||
      (b && (st = check_vector(ctx, b, N, "b"))))
    return st;
  if (x2.shape[0] != y2.shape[0])
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear: x has %lld rows but y %lld",
                    (long long)x2.shape[0], (long long)y2.shape[0]);
  int64_t M = x2.shape[0];
  if (M == 0 || N == 0) return NT_OK;
  if (K == 0) return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "fp8 linear: in_features = 0");
  if ((st = nt_fp8_linear_uses_fp8(ctx, cfg, &j.fp8))) return st;
  const nt_fp8_state *s = cfg->state;
  int ix = cfg->index + NT_FP8_LINEAR_INPUT, iw = cfg->index + NT_FP8_LINEAR_WEIGHT;
  nt_tensor sx = nt_fp8_scale_tensor(s, ix), ax = nt_fp8_amax_tensor(s, ix);
  nt_tensor sw = nt_fp8_scale_tensor(s, iw), aw = nt_fp8_amax_tensor(s, iw);
  nt_tensor six = nt_fp8_scale_inv_tensor(s, ix), siw = nt_fp8_scale_inv_tensor(s, iw);
  int64_t K16 = up16(K), N16 = up16(N);
  if ((st = job_alloc(&j, NT_FP8_E4M3, M, K16, &xq)) ||
      (st = job_alloc(&j, NT_FP8_E4M3, N16, K16, &wq)) ||
      (st = nt_fp8_quantize(ctx, &x2, &xq, false, &sx, &ax)) ||
      (st = nt_fp8_quantize(ctx, w, &wq, false, &sw, &aw)))
    goto done;
  bool padded = K16 != K || N16 != N;
  if (pre && j.fp8 && gemm_writes_out(&j, &wq, &y2, b, padded) &&
      gemm_writes_out(&j, &wq, &pre2, b, padded)) {
    st = mm(&j, &xq, &six, &wq, &siw, &y2, 0.0f, b, &pre2);
  } else {
    st = product_into(&j, &xq, &six, &wq, &siw, pre ? &pre2 : &y2, false, b, padded);
    if (!st && pre) st = nt_gelu_forward(ctx, pre, y);
  }
done:
  job_free(&j);
  return st;
}

nt_status nt_fp8_linear_forward(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, const nt_tensor *x,
                                const nt_tensor *w, const nt_tensor *b, nt_tensor *y,
                                nt_activation act, nt_tensor *pre) {
  nt_status st;
  if (!y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear: x, W and y are required");
  switch (act) {
    case NT_ACT_NONE: return forward(ctx, cfg, x, w, b, y, NULL);
    case NT_ACT_RELU:
      if ((st = nt_check_contiguous(ctx, y, "fp8 linear y (relu)")) ||
          (st = forward(ctx, cfg, x, w, b, y, NULL)))
        return st;
      return nt_relu_forward(ctx, y, y);
    case NT_ACT_GELU:
      if (!pre)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                        "fp8 linear: act GELU needs `pre` (the pre-activation kept for backward)");
      if ((st = nt_check_same_shape(ctx, pre, y, "fp8 linear pre vs y")) ||
          (st = nt_check_contiguous(ctx, y, "fp8 linear y (gelu)")) ||
          (st = nt_check_contiguous(ctx, pre, "fp8 linear pre")))
        return st;
      if (pre->dtype != y->dtype)
        return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 linear: pre is %s but y is %s (one dtype)",
                        nt_dtype_name(pre->dtype), nt_dtype_name(y->dtype));
      return forward(ctx, cfg, x, w, b, y, pre);
    default:
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear: unknown activation %d", (int)act);
  }
}

nt_status nt_fp8_linear_backward(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, const nt_tensor *dy,
                                 const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                 nt_tensor *dw, nt_tensor *db) {
  return nt_fp8_linear_backward_ex(ctx, cfg, dy, x, w, dx, dw, db, NULL);
}

/* dy's GELU backward (opts.dy_gelu_pre) into a scratch g of dy's dtype: g = 0 + dy * gelu'(pre). */
static nt_status gelu_scratch(job *j, const nt_tensor *dy, const nt_tensor *pre, nt_tensor *g) {
  nt_status st;
  if ((st = job_alloc(j, dy->dtype, dy->shape[0], dy->shape[1], g)) ||
      (st = nt_tensor_zero(j->ctx, g)))
    return st;
  return nt_gelu_backward(j->ctx, pre, dy, g);
}

nt_status nt_fp8_linear_backward_ex(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg,
                                    const nt_tensor *dy, const nt_tensor *x, const nt_tensor *w,
                                    nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                                    const nt_fp8_linear_bwd_opts *opts) {
  nt_status st;
  nt_tensor dy2, x2, dx2, pre2;
  job j = {ctx, false, {0}, 0};
  const nt_fp8_linear_bwd_opts none = {0}, *o = opts ? opts : &none;
  const nt_tensor *pre = o->dy_gelu_pre;
  if (!dy || !x || !w)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 linear backward: dy, x and W are required");
  if ((st = check_cfg(ctx, cfg)) || (st = check_weight(ctx, w, "W"))) return st;
  int64_t N = w->shape[0], K = w->shape[1];
  if ((st = rows_view(ctx, dy, N, "dy", &dy2)) || (st = rows_view(ctx, x, K, "x", &x2)) ||
      (dx && (st = rows_view(ctx, dx, K, "dx", &dx2))) ||
      (dw && (st = check_weight(ctx, dw, "dW"))) || (db && (st = check_vector(ctx, db, N, "db"))))
    return st;
  if (pre) {
    if ((st = nt_check_contiguous(ctx, dy, "fp8 linear backward dy (with dy_gelu_pre)")) ||
        (st = nt_check_contiguous(ctx, pre, "fp8 linear backward dy_gelu_pre")) ||
        (st = nt_check_same_shape(ctx, pre, dy, "fp8 linear backward dy_gelu_pre vs dy")) ||
        (st = rows_view(ctx, pre, N, "dy_gelu_pre", &pre2)))
      return st;
    if (pre->dtype != dy->dtype)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 linear backward: dy_gelu_pre is %s but dy %s "
                      "(one dtype)", nt_dtype_name(pre->dtype), nt_dtype_name(dy->dtype));
  }
  int64_t M = dy2.shape[0];
  if (x2.shape[0] != M || (dx && dx2.shape[0] != M))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear backward: dy has %lld rows, x %lld%s",
                    (long long)M, (long long)x2.shape[0], dx ? " (dx must match too)" : "");
  if (dw && (dw->shape[0] != N || dw->shape[1] != K))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 linear backward: dW must be [%lld, %lld] like W",
                    (long long)N, (long long)K);
  if (M == 0 || N == 0 || K == 0) return NT_OK;
  if ((st = nt_fp8_linear_uses_fp8(ctx, cfg, &j.fp8))) return st;
  const nt_fp8_state *s = cfg->state;
  int ix = cfg->index + NT_FP8_LINEAR_INPUT, iw = cfg->index + NT_FP8_LINEAR_WEIGHT;
  int ig = cfg->index + NT_FP8_LINEAR_GRAD;
  nt_tensor sx = nt_fp8_scale_tensor(s, ix), sw = nt_fp8_scale_tensor(s, iw);
  nt_tensor sg = nt_fp8_scale_tensor(s, ig), ag = nt_fp8_amax_tensor(s, ig);
  nt_tensor six = nt_fp8_scale_inv_tensor(s, ix), siw = nt_fp8_scale_inv_tensor(s, iw);
  nt_tensor sig = nt_fp8_scale_inv_tensor(s, ig);
  int64_t K16 = up16(K), N16 = up16(N), M16 = up16(M);
  bool amax_done = false;
  /* dy quantized row-major [M, N16] for dx and transposed [N, M16] for dW; with both wanted,
   * in one pass over dy that also sums an fp32 db and does the GELU backward. Otherwise the
   * GELU backward first goes to a scratch that stands in for dy. */
  nt_tensor gq = {0}, gt = {0}, g;
  const bool both = dx && dw, fused = both && (!db || db->dtype == NT_F32);
  if (pre && !fused) {
    if ((st = gelu_scratch(&j, &dy2, &pre2, &g))) goto done;
    dy2 = g;
  }
  if (both) {
    nt_fp8_dual_opts q = {fused && pre ? &pre2 : NULL, fused ? db : NULL};
    if ((st = job_alloc(&j, NT_FP8_E5M2, M, N16, &gq)) ||
        (st = job_alloc(&j, NT_FP8_E5M2, N, M16, &gt)) ||
        (st = nt_fp8_quantize_dual(ctx, &dy2, &gq, &gt, &sg, &ag, &q)))
      goto done;
    amax_done = true;
    if (fused) db = NULL;
  }
  if (dx) {
    /* dx [M, K] += dyq [M, N16] . (W^T q [K16, N16])^T */
    nt_tensor wt;
    if (!both && ((st = job_alloc(&j, NT_FP8_E5M2, M, N16, &gq)) ||
                  (st = nt_fp8_quantize(ctx, &dy2, &gq, false, &sg, &ag))))
      goto done;
    amax_done = true;
    if ((st = job_alloc(&j, NT_FP8_E4M3, K16, N16, &wt)) ||
        (st = nt_fp8_quantize(ctx, w, &wt, true, &sw, NULL)))
      goto done;
    if ((st = product_into(&j, &gq, &sig, &wt, &siw, &dx2, !o->overwrite_dx, NULL,
                           K16 != K || N16 != N)))
      goto done;
    job_release(&j, gq.data);
    job_release(&j, wt.data);
  }
  if (dw) {
    /* dW [N, K] += (dy^T q [N, M16]) . (x^T q [K16, M16])^T */
    nt_tensor xt;
    if (!both && ((st = job_alloc(&j, NT_FP8_E5M2, N, M16, &gt)) ||
                  (st = nt_fp8_quantize(ctx, &dy2, &gt, true, &sg, &ag))))
      goto done;
    amax_done = true;
    if ((st = job_alloc(&j, NT_FP8_E4M3, K16, M16, &xt)) ||
        (st = nt_fp8_quantize(ctx, &x2, &xt, true, &sx, NULL)))
      goto done;
    /* The GEMM's K is M16 (zeros past M on both sides): only K16 != K forces the scratch. */
    if ((st = product_into(&j, &gt, &sig, &xt, &six, dw, true, NULL, K16 != K))) goto done;
  }
  if (!amax_done) {
    /* Only db wanted: still record dy's amax, so the scale keeps tracking the gradient. */
    if ((st = job_alloc(&j, NT_FP8_E5M2, M, N, &gq)) ||
        (st = nt_fp8_quantize(ctx, &dy2, &gq, false, &sg, &ag)))
      goto done;
  }
  if (db) st = colsum(ctx, &dy2, db);
done:
  job_free(&j);
  return st;
}
