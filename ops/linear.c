/* Linear layer on top of nt_gemm (both devices): the forward fuses bias, activation and a
 * residual into the GEMM's epilogue; the backward is two GEMMs accumulating (beta 1; the dx one
 * writes with beta 0 when asked to overwrite, and applies a preceding GELU's derivative in its
 * epilogue), and the bias gradient as column sums of dy. The bias gradient is not fused into the
 * weight-gradient GEMM (cuBLASLt's BGRADB): for that epilogue the H200 profile showed cuBLASLt
 * running sm80 CUTLASS kernels at a third of the plain GEMM's rate, or its plain kernel plus a
 * reduction of its own, both costlier than a separate read of dy. */
#include "ops/linear.h"
#include "ops/gemm.h"
#include <string.h>

/* t as a 2-D [rows, last] matrix: leading dims flattened (they must be contiguous). */
static nt_status rows_view(nt_ctx *ctx, const nt_tensor *t, int64_t last, const char *what,
                           nt_tensor *out) {
  char b[96];
  if (t->ndim < 1 || t->shape[t->ndim - 1] != last)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "linear: %s %s must end in a dim of size %lld", what,
                    nt_tensor_describe(t, b, sizeof b), (long long)last);
  if (t->ndim == 2) {
    *out = *t;
    return NT_OK;
  }
  if (t->ndim == 1) {
    *out = *t;
    out->ndim = 2;
    out->shape[0] = 1; out->shape[1] = last;
    out->stride[0] = last; out->stride[1] = t->stride[0];
    return NT_OK;
  }
  if (!nt_tensor_is_contiguous(t))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "linear: %s %s has %d dims and is not contiguous (its leading dims are "
                    "flattened into rows)", what, nt_tensor_describe(t, b, sizeof b), t->ndim);
  int64_t shape[2] = {last ? nt_tensor_numel(t) / last : 0, last};
  *out = nt_tensor_view(t->data, t->dtype, t->device, 2, shape);
  return NT_OK;
}

static nt_status same_rows(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *b, const char *wa,
                           const char *wb) {
  char ba[96], bb[96];
  bool ok = a->ndim == b->ndim;
  for (int i = 0; ok && i < a->ndim - 1; i++) ok = a->shape[i] == b->shape[i];
  if (ok) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_SHAPE, "linear: %s %s and %s %s must share their leading dims", wa,
                  nt_tensor_describe(a, ba, sizeof ba), wb, nt_tensor_describe(b, bb, sizeof bb));
}

static nt_status check_weight(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w) {
  char b[96];
  if (w->ndim != 2)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "linear: W must be 2-D [out, in], got %s",
                    nt_tensor_describe(w, b, sizeof b));
  if (x->dtype != w->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "linear: x is %s but W is %s (they share one dtype)",
                    nt_dtype_name(x->dtype), nt_dtype_name(w->dtype));
  return NT_OK;
}

nt_status nt_linear_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                            const nt_tensor *b, nt_tensor *y, nt_activation act, nt_tensor *pre) {
  return nt_linear_forward_ex(ctx, x, w, b, y, act, pre, NULL);
}

nt_status nt_linear_forward_ex(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                               const nt_tensor *b, nt_tensor *y, nt_activation act,
                               nt_tensor *pre, const nt_linear_fwd_opts *opts) {
  nt_status st;
  if (!x || !w || !y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: x, W and y are required");
  if ((st = check_weight(ctx, x, w))) return st;
  int64_t out = w->shape[0], in = w->shape[1];
  nt_tensor x2, y2, pre2, r2;
  if ((st = rows_view(ctx, x, in, "x", &x2)) || (st = rows_view(ctx, y, out, "y", &y2)) ||
      (st = same_rows(ctx, x, y, "x", "y")))
    return st;
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  o.bias = b;
  if (opts && opts->residual) {
    if ((st = nt_check_same_shape(ctx, opts->residual, y, "linear residual vs y")) ||
        (st = rows_view(ctx, opts->residual, out, "residual", &r2)))
      return st;
    o.beta = 1.0f;
    o.c = &r2;
  }
  switch (act) {
    case NT_ACT_NONE: o.epilogue = b ? NT_EPI_BIAS : NT_EPI_NONE; break;
    case NT_ACT_RELU: o.epilogue = NT_EPI_RELU; break;
    case NT_ACT_GELU:
      if (!pre)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                        "linear: act GELU needs `pre` (the pre-activation kept for backward)");
      if ((st = nt_check_same_shape(ctx, pre, y, "linear pre vs y")) ||
          (st = rows_view(ctx, pre, out, "pre", &pre2)))
        return st;
      o.epilogue = NT_EPI_GELU_AUX;
      o.aux = &pre2;
      break;
    default: return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: unknown activation %d", (int)act);
  }
  return nt_gemm(ctx, &x2, w, &y2, &o);
}

/* db[out] += column sums of dy[R, out], as the GEMM db = dy^T @ ones[R] (for a db that is not
 * F32, which nt_gemm_bias_grad does not take). */
static nt_status bias_grad_gemm(nt_ctx *ctx, const nt_tensor *dy2, nt_tensor *db) {
  int64_t R = dy2->shape[0], out = dy2->shape[1];
  nt_tensor ones, ones_host;
  memset(&ones_host, 0, sizeof ones_host);
  nt_status st = nt_tensor_alloc(ctx, &ones, dy2->dtype, 2, (int64_t[]){R, 1});
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
    void *h = NULL;
    if ((st = nt_pinned_alloc(ctx, nt_tensor_nbytes(&ones), &h))) goto done;
    for (int64_t i = 0; i < R; i++) nt_store_f32(h, dy2->dtype, i, 1.0f);
    ones_host = nt_tensor_view(h, dy2->dtype, nt_cpu(), 2, (int64_t[]){R, 1});
    st = nt_tensor_copy(ctx, &ones, &ones_host);
    /* The copy is asynchronous: the host buffer stays until it has been read. */
    nt_status s2 = nt_stream_synchronize(ctx, NULL);
    nt_pinned_free(ctx, h);
    if (!st) st = s2;
    if (st) goto done;
  } else {
    for (int64_t i = 0; i < R; i++) nt_store_f32(ones.data, dy2->dtype, i, 1.0f);
  }
  nt_tensor db2 = *db;
  db2.ndim = 2;
  db2.shape[0] = out; db2.shape[1] = 1;
  db2.stride[0] = db->stride[0]; db2.stride[1] = 1;
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_a = true;
  o.beta = 1.0f;
  st = nt_gemm(ctx, dy2, &ones, &db2, &o);
done:
  nt_tensor_free(ctx, &ones);
  return st;
}

/* Bytes [lo, hi) a tensor's elements span. */
static void byte_span(const nt_tensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t last = 0;
  for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->stride[i];
  size_t es = nt_dtype_size(t->dtype);
  *lo = (uintptr_t)t->data;
  *hi = *lo + (uintptr_t)((size_t)(last + 1) * es);
}

static nt_status check_dgelu(nt_ctx *ctx, const nt_linear_bwd_opts *o, const nt_tensor *dx,
                             const nt_tensor *x) {
  const nt_tensor *pre = o->dgelu_pre;
  char b1[96], b2[96];
  if (!dx)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: dgelu_pre is given but dx is NULL");
  if (!o->overwrite_dx)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "linear: dgelu_pre needs overwrite_dx (the fused GELU backward scales the "
                    "whole product and cannot accumulate into dx)");
  nt_status st = nt_check_same_shape(ctx, pre, x, "linear dgelu_pre vs x");
  if (st) return st;
  if (pre->dtype != dx->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "linear: dgelu_pre is %s but dx is %s (they share one "
                    "dtype)", nt_dtype_name(pre->dtype), nt_dtype_name(dx->dtype));
  if (!nt_tensor_numel(pre)) return NT_OK;
  uintptr_t plo, phi, dlo, dhi;
  byte_span(pre, &plo, &phi);
  byte_span(dx, &dlo, &dhi);
  if (plo < dhi && dlo < phi)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: dgelu_pre %s overlaps dx %s",
                    nt_tensor_describe(pre, b1, sizeof b1), nt_tensor_describe(dx, b2, sizeof b2));
  return NT_OK;
}

nt_status nt_linear_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db) {
  return nt_linear_backward_ex(ctx, dy, x, w, dx, dw, db, NULL);
}

nt_status nt_linear_backward_ex(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                                const nt_linear_bwd_opts *opts) {
  nt_status st;
  char b1[96];
  if (!dy || !x || !w) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: dy, x and W are required");
  if ((st = check_weight(ctx, x, w))) return st;
  int64_t out = w->shape[0], in = w->shape[1];
  nt_tensor dy2, x2, dx2;
  if ((st = rows_view(ctx, dy, out, "dy", &dy2)) || (st = rows_view(ctx, x, in, "x", &x2)) ||
      (st = same_rows(ctx, dy, x, "dy", "x")))
    return st;
  if (dy->dtype != x->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "linear: dy is %s but x is %s (they share one dtype)",
                    nt_dtype_name(dy->dtype), nt_dtype_name(x->dtype));
  if (db && (db->ndim != 1 || db->shape[0] != out))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "linear: db must be [%lld], got %s", (long long)out,
                    nt_tensor_describe(db, b1, sizeof b1));
  if (opts && opts->dgelu_pre && (st = check_dgelu(ctx, opts, dx, x))) return st;
  if (dx) {
    if ((st = nt_check_same_shape(ctx, dx, x, "linear dx vs x")) ||
        (st = rows_view(ctx, dx, in, "dx", &dx2)))
      return st;
    nt_gemm_opts o = nt_gemm_defaults();
    o.beta = opts && opts->overwrite_dx ? 0.0f : 1.0f;
    nt_tensor pre2;
    if (opts && opts->dgelu_pre) {
      if ((st = rows_view(ctx, opts->dgelu_pre, in, "dgelu_pre", &pre2))) return st;
      o.epilogue = NT_EPI_DGELU;
      o.aux = &pre2;
    }
    if ((st = nt_gemm(ctx, &dy2, w, &dx2, &o))) return st;
  }
  if (dw) {
    if ((st = nt_check_same_shape(ctx, dw, w, "linear dW vs W"))) return st;
    nt_gemm_opts o = nt_gemm_defaults();
    o.trans_a = true;
    o.beta = 1.0f;
    if ((st = nt_gemm(ctx, &dy2, &x2, dw, &o))) return st;
  }
  if (!db) return NT_OK;
  bool sums = db->dtype == NT_F32 && (dy->dtype == NT_F32 || dy->dtype == NT_F16 ||
                                      dy->dtype == NT_BF16);
  return sums ? nt_gemm_bias_grad(ctx, &dy2, db) : bias_grad_gemm(ctx, &dy2, db);
}
