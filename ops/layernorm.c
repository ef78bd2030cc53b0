#include "ops/layernorm.h"
#include "ops/memops_impl.h"
#include "ops/dropout.h"
#include "ops/gemm.h"
#include <math.h>

/* ---- CPU reference (fp64 statistics and sums) ---- */

static void forward_cpu(int64_t rows, int64_t C, const nt_tensor *x, const nt_tensor *w,
                        const nt_tensor *b, nt_tensor *y, nt_tensor *mean, nt_tensor *rstd) {
  for (int64_t r = 0; r < rows; r++) {
    int64_t o = r * C;
    double s = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; c++) s += nt_load_f32(x->data, x->dtype, o + c);
    double m = s / (double)C;
    for (int64_t c = 0; c < C; c++) {
      double d = nt_load_f32(x->data, x->dtype, o + c) - m;
      v += d * d;
    }
    float rs = (float)(1.0 / sqrt(v / (double)C + (double)NT_LAYERNORM_EPS));
    for (int64_t c = 0; c < C; c++) {
      float xh = (nt_load_f32(x->data, x->dtype, o + c) - (float)m) * rs;
      float out = xh * nt_load_f32(w->data, w->dtype, c) + (b ? nt_load_f32(b->data, b->dtype, c) : 0.0f);
      nt_store_f32(y->data, y->dtype, o + c, out);
    }
    if (mean) ((float *)mean->data)[r] = (float)m;
    if (rstd) ((float *)rstd->data)[r] = rs;
  }
}

static void backward_cpu(int64_t rows, int64_t C, const nt_tensor *dy, const nt_tensor *x,
                         const nt_tensor *w, const float *mean, const float *rstd, nt_tensor *dx,
                         float *dw, float *db) {
  for (int64_t r = 0; r < rows; r++) {
    int64_t o = r * C;
    double m = mean[r], rs = rstd[r], sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < C; c++) {
      double g = (double)nt_load_f32(w->data, w->dtype, c) * nt_load_f32(dy->data, dy->dtype, o + c);
      sum_g += g;
      sum_gx += g * (nt_load_f32(x->data, x->dtype, o + c) - m) * rs;
    }
    sum_g /= (double)C;
    sum_gx /= (double)C;
    for (int64_t c = 0; c < C; c++) {
      double d = nt_load_f32(dy->data, dy->dtype, o + c);
      double xh = (nt_load_f32(x->data, x->dtype, o + c) - m) * rs;
      double g = (double)nt_load_f32(w->data, w->dtype, c) * d;
      double v = nt_load_f32(dx->data, dx->dtype, o + c) + (g - sum_g - xh * sum_gx) * rs;
      nt_store_f32(dx->data, dx->dtype, o + c, (float)v);
    }
  }
  /* Parameter gradients: per column, a fixed row order in fp64, then one += in fp32. */
  for (int64_t c = 0; c < C; c++) {
    double sw = 0.0, sb = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      double d = nt_load_f32(dy->data, dy->dtype, r * C + c);
      sw += d * (nt_load_f32(x->data, x->dtype, r * C + c) - (double)mean[r]) * rstd[r];
      sb += d;
    }
    dw[c] += (float)sw;
    if (db) db[c] += (float)sb;
  }
}

/* ---- checks and dispatch ---- */

/* x [.., C] and a [C] weight/bias of F32 or x's dtype; sets *rows and *C. */
static nt_status check_common(nt_ctx *ctx, const char *name, const nt_tensor *x,
                              const nt_tensor *w, const nt_tensor *b, int64_t *rows, int64_t *C) {
  nt_status st = nt_memops_check_act(ctx, x, name);
  if (!st) st = nt_memops_check_act(ctx, w, name);
  if (!st && b) st = nt_memops_check_act(ctx, b, name);
  if (st) return st;
  if (x->ndim < 1) return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: x must have at least one dim", name);
  *C = x->shape[x->ndim - 1];
  *rows = *C ? nt_tensor_numel(x) / *C : 0;
  if (*C < 1) return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: the normalized dim is empty", name);
  st = nt_check_ndim(ctx, w, 1, "layernorm weight");
  if (!st) st = nt_check_dim(ctx, w, 0, *C, "layernorm weight");
  if (!st && b) st = nt_check_same_shape(ctx, w, b, "layernorm bias");
  if (st) return st;
  if ((w->dtype != NT_F32 && w->dtype != x->dtype) || (b && b->dtype != w->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: weight/bias dtype %s/%s must be f32 or x's (%s)", name,
                    nt_dtype_name(w->dtype), b ? nt_dtype_name(b->dtype) : "-",
                    nt_dtype_name(x->dtype));
  return NT_OK;
}

/* An F32 [rows] statistics tensor. */
static nt_status check_stat(nt_ctx *ctx, const nt_tensor *t, int64_t rows, const char *what) {
  if (!t || !t->data) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor is NULL", what);
  nt_status st = nt_check_device(ctx, t, what);
  if (!st) st = nt_check_dtype(ctx, t, NT_F32, what);
  if (!st) st = nt_check_contiguous(ctx, t, what);
  if (st) return st;
  if (nt_tensor_numel(t) != rows)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: expected %lld elements (one per row), got %lld", what,
                    (long long)rows, (long long)nt_tensor_numel(t));
  return NT_OK;
}

static nt_status check_same(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *t,
                            const char *what) {
  nt_status st = nt_memops_check_act(ctx, t, what);
  if (!st) st = nt_check_same_shape(ctx, x, t, what);
  if (st) return st;
  if (t->dtype != x->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s differs from x's %s", what,
                    nt_dtype_name(t->dtype), nt_dtype_name(x->dtype));
  return NT_OK;
}

nt_status nt_layernorm_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                               const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                               nt_tensor *rstd) {
  int64_t rows = 0, C = 0;
  nt_status st = check_common(ctx, "layernorm_forward", x, weight, bias, &rows, &C);
  if (!st) st = check_same(ctx, x, y, "layernorm_forward y");
  if (!st && mean) st = check_stat(ctx, mean, rows, "layernorm_forward mean");
  if (!st && rstd) st = check_stat(ctx, rstd, rows, "layernorm_forward rstd");
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_layernorm_forward_cuda(ctx, x, weight, bias, y, mean, rstd);
#else
    return nt_memops_no_cuda(ctx, "layernorm_forward");
#endif
  }
  forward_cpu(rows, C, x, weight, bias, y, mean, rstd);
  return NT_OK;
}

/* The backward's extras one op after another (the CPU, and GPU shapes the fused pass does not
 * take): dropped = dropout(dx), colsum = its column sums. */
static nt_status backward_extras(nt_ctx *ctx, int64_t rows, int64_t C, nt_tensor *dx,
                                 const nt_layernorm_bwd_opts *o) {
  nt_status st = NT_OK;
  const nt_tensor *src = dx;
  if (o->dropped) {
    st = nt_dropout_forward(ctx, dx, o->dropped, o->p, o->seed, o->offset);
    src = o->dropped;
  }
  if (st || !o->colsum) return st;
  int64_t shape[2] = {rows, C};
  nt_tensor src2 = nt_tensor_view(src->data, src->dtype, src->device, 2, shape);
  st = nt_tensor_zero(ctx, o->colsum);
  return st ? st : nt_gemm_bias_grad(ctx, &src2, o->colsum);
}

nt_status nt_layernorm_backward_ex(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                   const nt_tensor *weight, const nt_tensor *mean,
                                   const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                   nt_tensor *dbias, const nt_layernorm_bwd_opts *opts) {
  int64_t rows = 0, C = 0;
  nt_status st = check_common(ctx, "layernorm_backward", x, weight, NULL, &rows, &C);
  if (!st) st = check_same(ctx, x, dy, "layernorm_backward dy");
  if (!st) st = check_same(ctx, x, dx, "layernorm_backward dx");
  if (!st) st = check_stat(ctx, mean, rows, "layernorm_backward mean");
  if (!st) st = check_stat(ctx, rstd, rows, "layernorm_backward rstd");
  if (!st) st = check_stat(ctx, dweight, C, "layernorm_backward dweight");
  if (!st && dbias) st = check_stat(ctx, dbias, C, "layernorm_backward dbias");
  bool extras = opts && (opts->dropped || opts->colsum);
  if (!st && extras && opts->dropped) {
    st = check_same(ctx, x, opts->dropped, "layernorm_backward dropped");
    if (!st && opts->dropped->data == dx->data)
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "layernorm_backward: dropped must not be dx itself");
    if (!st && !(opts->p >= 0.0f && opts->p < 1.0f))
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "layernorm_backward: dropout p = %g must be in "
                    "[0, 1)", (double)opts->p);
    if (!st && opts->offset % 4 != 0)
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "layernorm_backward: RNG offset %llu must be a "
                    "multiple of 4", (unsigned long long)opts->offset);
  }
  if (!st && extras && opts->colsum) st = check_stat(ctx, opts->colsum, C, "layernorm_backward colsum");
  if (st) return st;
  bool fused = false;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    if (C > 12800)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "layernorm_backward: C = %lld is above the GPU kernel's 12800", (long long)C);
    st = nt_layernorm_backward_cuda(ctx, dy, x, weight, mean, rstd, dx, dweight, dbias,
                                    extras ? opts : NULL, &fused);
#else
    return nt_memops_no_cuda(ctx, "layernorm_backward");
#endif
  } else {
    backward_cpu(rows, C, dy, x, weight, (const float *)mean->data, (const float *)rstd->data,
                 dx, (float *)dweight->data, dbias ? (float *)dbias->data : NULL);
  }
  if (!st && extras && !fused) st = backward_extras(ctx, rows, C, dx, opts);
  return st;
}

nt_status nt_layernorm_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                const nt_tensor *weight, const nt_tensor *mean,
                                const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                nt_tensor *dbias) {
  return nt_layernorm_backward_ex(ctx, dy, x, weight, mean, rstd, dx, dweight, dbias, NULL);
}
