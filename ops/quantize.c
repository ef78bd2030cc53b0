/* FP8 quantization: argument checks, dispatch, and the CPU reference (per-element conversion
 * through core/convert.h, so the CPU bytes are the GPU's). */
#include "ops/quantize.h"
#include "ops/gelu_rule.h"
#include <math.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_fp8_quantize_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, bool transpose,
                               const float *scale, float *amax);
nt_status nt_fp8_quantize_dual_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y_rows,
                                    nt_tensor *y_t, const float *scale, float *amax,
                                    const nt_tensor *gelu_pre, float *colsum);
nt_status nt_fp8_dequantize_cuda(nt_ctx *ctx, const nt_tensor *x, const float *scale_inv,
                                 nt_tensor *y);
#endif

static bool is_fp8(nt_dtype t) { return t == NT_FP8_E4M3 || t == NT_FP8_E5M2; }
static bool is_float(nt_dtype t) { return t == NT_F32 || t == NT_F16 || t == NT_BF16; }

static nt_status check_scalar(nt_ctx *ctx, const nt_tensor *s, const char *what) {
  nt_status st;
  if (!s || !s->data) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 quantize: %s is NULL", what);
  if ((st = nt_check_dtype(ctx, s, NT_F32, what)) || (st = nt_check_device(ctx, s, what)))
    return st;
  if (nt_tensor_numel(s) != 1)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 quantize: %s must be one F32 value", what);
  return NT_OK;
}

/* NaN wins, as in the delayed-scaling update. */
static float nan_max(float m, float v) {
  if (m != m) return m;
  return (v != v || v > m) ? v : m;
}

static uint8_t to_fp8(nt_dtype dt, float v) {
  return dt == NT_FP8_E4M3 ? nt_f32_to_e4m3(v, true) : nt_f32_to_e5m2(v, true);
}

static nt_status quantize_cpu(const nt_tensor *x, nt_tensor *y, bool transpose, float scale,
                              float *amax) {
  int64_t R = x->shape[0], C = x->shape[1];
  int64_t yr = y->shape[0], yc = y->shape[1];
  uint8_t *out = (uint8_t *)y->data;
  float m = amax ? *amax : 0.0f;
  memset(out, 0, (size_t)(yr * yc));
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) {
      float v = nt_load_f32(x->data, x->dtype, r * x->stride[0] + c);
      m = nan_max(m, fabsf(v));
      int64_t o = transpose ? c * yc + r : r * yc + c;
      out[o] = to_fp8(y->dtype, v * scale);
    }
  if (amax) *amax = m;
  return NT_OK;
}

/* The checks of x and of the scalars, shared by both entry points. */
static nt_status check_input(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *scale,
                             const nt_tensor *amax) {
  char b[96];
  nt_status st;
  if ((st = check_scalar(ctx, scale, "fp8 quantize scale")) ||
      (amax && (st = check_scalar(ctx, amax, "fp8 quantize amax"))) ||
      (st = nt_check_device(ctx, x, "fp8 quantize x")))
    return st;
  if (x->ndim != 2)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 quantize: x %s must be 2-D",
                    nt_tensor_describe(x, b, sizeof b));
  if (!is_float(x->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 quantize: x is %s (f32, f16 or bf16)",
                    nt_dtype_name(x->dtype));
  if ((x->stride[1] != 1 && x->shape[1] > 1) || x->stride[0] < x->shape[1])
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "fp8 quantize: x %s needs unit stride along its last dim and rows that do "
                    "not overlap", nt_tensor_describe(x, b, sizeof b));
  return NT_OK;
}

/* y: 2-D, FP8, contiguous, on ctx's device, large enough for x (transposed or not). */
static nt_status check_output(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *y,
                              bool transpose) {
  char b1[96], b2[96];
  nt_status st;
  if ((st = nt_check_device(ctx, y, "fp8 quantize y"))) return st;
  if (y->ndim != 2)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 quantize: y %s must be 2-D",
                    nt_tensor_describe(y, b1, sizeof b1));
  if (!is_fp8(y->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 quantize: y is %s (e4m3 or e5m2)",
                    nt_dtype_name(y->dtype));
  if ((st = nt_check_contiguous(ctx, y, "fp8 quantize y"))) return st;
  int64_t need_r = transpose ? x->shape[1] : x->shape[0];
  int64_t need_c = transpose ? x->shape[0] : x->shape[1];
  if (y->shape[0] < need_r || y->shape[1] < need_c)
    return NT_ERROR(ctx, NT_ERR_SHAPE,
                    "fp8 quantize: y %s is too small for x %s%s (needs at least [%lld, %lld])",
                    nt_tensor_describe(y, b1, sizeof b1), nt_tensor_describe(x, b2, sizeof b2),
                    transpose ? " transposed" : "", (long long)need_r, (long long)need_c);
  return NT_OK;
}

nt_status nt_fp8_quantize(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, bool transpose,
                          const nt_tensor *scale, nt_tensor *amax) {
  nt_status st;
  if (!x || !y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 quantize: x and y are required");
  if ((st = check_input(ctx, x, scale, amax)) || (st = check_output(ctx, x, y, transpose)))
    return st;
  if (nt_tensor_numel(y) == 0) return NT_OK;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx))
    return nt_fp8_quantize_cuda(ctx, x, y, transpose, (const float *)scale->data,
                                amax ? (float *)amax->data : NULL);
#endif
  if (nt_ctx_is_cuda(ctx))
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "fp8 quantize: CUDA tensors without the CUDA backend");
  return quantize_cpu(x, y, transpose, *(const float *)scale->data,
                      amax ? (float *)amax->data : NULL);
}

/* The dual form's options: gelu_pre like x, colsum an F32 [C] vector. */
static nt_status check_dual_opts(nt_ctx *ctx, const nt_tensor *x, const nt_fp8_dual_opts *o) {
  char b1[96], b2[96];
  nt_status st;
  const nt_tensor *p = o->gelu_pre, *cs = o->colsum;
  if (p) {
    if ((st = nt_check_device(ctx, p, "fp8 quantize dual gelu_pre"))) return st;
    if (p->dtype != x->dtype || p->ndim != 2 || p->shape[0] != x->shape[0] ||
        p->shape[1] != x->shape[1] || p->stride[0] != x->stride[0] ||
        (x->shape[1] > 1 && p->stride[1] != x->stride[1]))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 quantize dual: gelu_pre %s must have x's shape, "
                      "dtype and strides (x %s)", nt_tensor_describe(p, b1, sizeof b1),
                      nt_tensor_describe(x, b2, sizeof b2));
  }
  if (cs) {
    if ((st = nt_check_device(ctx, cs, "fp8 quantize dual colsum")) ||
        (st = nt_check_dtype(ctx, cs, NT_F32, "fp8 quantize dual colsum")))
      return st;
    if (cs->ndim != 1 || cs->shape[0] != x->shape[1] || (cs->shape[0] > 1 && cs->stride[0] != 1))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "fp8 quantize dual: colsum %s must be a contiguous "
                      "[%lld]", nt_tensor_describe(cs, b1, sizeof b1), (long long)x->shape[1]);
  }
  return NT_OK;
}

/* CPU: x' (x itself, or the GELU backward into a contiguous copy of x's dtype), quantized
 * twice, its column sums in double. */
static nt_status dual_cpu(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y_rows, nt_tensor *y_t,
                          float s, float *amax, const nt_fp8_dual_opts *o) {
  int64_t R = x->shape[0], C = x->shape[1];
  nt_tensor g = *x;
  if (o->gelu_pre) {
    nt_status st = nt_tensor_alloc(ctx, &g, x->dtype, 2, x->shape);
    if (st) return st;
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        int64_t i = r * x->stride[0] + c;
        float v = nt_load_f32(x->data, x->dtype, i);
        float p = nt_load_f32(o->gelu_pre->data, x->dtype, i);
        nt_store_f32(g.data, g.dtype, r * C + c, 0.0f + v * nt_gelu_grad(p));
      }
  }
  quantize_cpu(&g, y_rows, false, s, amax);
  quantize_cpu(&g, y_t, true, s, NULL);
  if (o->colsum) {
    float *cs = (float *)o->colsum->data;
    for (int64_t c = 0; c < C; c++) {
      double sum = 0.0;
      for (int64_t r = 0; r < R; r++) sum += nt_load_f32(g.data, g.dtype, r * g.stride[0] + c);
      cs[c] += (float)sum;
    }
  }
  if (o->gelu_pre) nt_tensor_free(ctx, &g);
  return NT_OK;
}

nt_status nt_fp8_quantize_dual(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y_rows,
                               nt_tensor *y_t, const nt_tensor *scale, nt_tensor *amax,
                               const nt_fp8_dual_opts *opts) {
  nt_status st;
  const nt_fp8_dual_opts none = {0}, *o = opts ? opts : &none;
  if (!x || !y_rows || !y_t)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 quantize dual: x, y_rows and y_t are required");
  if ((st = check_input(ctx, x, scale, amax)) || (st = check_output(ctx, x, y_rows, false)) ||
      (st = check_output(ctx, x, y_t, true)) || (st = check_dual_opts(ctx, x, o)))
    return st;
  if (y_rows->dtype != y_t->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 quantize dual: y_rows is %s but y_t %s (one format)",
                    nt_dtype_name(y_rows->dtype), nt_dtype_name(y_t->dtype));
  int64_t nr = nt_tensor_numel(y_rows), nt = nt_tensor_numel(y_t);
  if (nr && nt && y_rows->data == y_t->data)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 quantize dual: y_rows and y_t share a buffer");
  /* An empty output leaves the single-layout form: x is then empty (R or C is 0), so the
   * options have nothing to add. */
  if (nr == 0) return nt_fp8_quantize(ctx, x, y_t, true, scale, amax);
  if (nt == 0) return nt_fp8_quantize(ctx, x, y_rows, false, scale, amax);
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx))
    return nt_fp8_quantize_dual_cuda(ctx, x, y_rows, y_t, (const float *)scale->data,
                                     amax ? (float *)amax->data : NULL, o->gelu_pre,
                                     o->colsum ? (float *)o->colsum->data : NULL);
#endif
  if (nt_ctx_is_cuda(ctx))
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "fp8 quantize: CUDA tensors without the CUDA backend");
  return dual_cpu(ctx, x, y_rows, y_t, *(const float *)scale->data,
                  amax ? (float *)amax->data : NULL, o);
}

nt_status nt_fp8_dequantize(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *scale_inv,
                            nt_tensor *y) {
  nt_status st;
  if (!x || !y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 dequantize: x and y are required");
  if ((st = check_scalar(ctx, scale_inv, "fp8 dequantize scale_inv")) ||
      (st = nt_check_device(ctx, x, "fp8 dequantize x")) ||
      (st = nt_check_device(ctx, y, "fp8 dequantize y")) ||
      (st = nt_check_contiguous(ctx, x, "fp8 dequantize x")) ||
      (st = nt_check_contiguous(ctx, y, "fp8 dequantize y")) ||
      (st = nt_check_dtype(ctx, y, NT_F32, "fp8 dequantize y")) ||
      (st = nt_check_same_shape(ctx, x, y, "fp8 dequantize x vs y")))
    return st;
  if (!is_fp8(x->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 dequantize: x is %s (e4m3 or e5m2)",
                    nt_dtype_name(x->dtype));
  int64_t n = nt_tensor_numel(x);
  if (n == 0) return NT_OK;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx))
    return nt_fp8_dequantize_cuda(ctx, x, (const float *)scale_inv->data, y);
#endif
  if (nt_ctx_is_cuda(ctx))
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "fp8 dequantize: CUDA tensors without the CUDA backend");
  float s = *(const float *)scale_inv->data;
  float *out = (float *)y->data;
  for (int64_t i = 0; i < n; i++) out[i] = nt_load_f32(x->data, x->dtype, i) * s;
  return NT_OK;
}
