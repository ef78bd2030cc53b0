/* Linear layer on top of nt_gemm (both devices): the forward fuses bias and activation into the
 * GEMM's epilogue; the backward is two GEMMs accumulating (beta 1), the bias gradient fused
 * into the weight-gradient GEMM (BGRADA) when db is F32. */
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
  nt_status st;
  if (!x || !w || !y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "linear: x, W and y are required");
  if ((st = check_weight(ctx, x, w))) return st;
  int64_t out = w->shape[0], in = w->shape[1];
  nt_tensor x2, y2, pre2;
  if ((st = rows_view(ctx, x, in, "x", &x2)) || (st = rows_view(ctx, y, out, "y", &y2)) ||
      (st = same_rows(ctx, x, y, "x", "y")))
    return st;
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  o.bias = b;
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

/* db[out] += column sums of dy[R, out], as the GEMM db = dy^T @ ones[R] (used when the bias
 * gradient cannot ride on the weight-gradient GEMM: no dW wanted, or db not F32). */
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

nt_status nt_linear_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db) {
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
  if (dx) {
    if ((st = nt_check_same_shape(ctx, dx, x, "linear dx vs x")) ||
        (st = rows_view(ctx, dx, in, "dx", &dx2)))
      return st;
    nt_gemm_opts o = nt_gemm_defaults();
    o.beta = 1.0f;
    if ((st = nt_gemm(ctx, &dy2, w, &dx2, &o))) return st;
  }
  bool fused_db = db && dw && db->dtype == NT_F32 && nt_dtype_size(dy->dtype) > 1;
  if (dw) {
    if ((st = nt_check_same_shape(ctx, dw, w, "linear dW vs W"))) return st;
    nt_gemm_opts o = nt_gemm_defaults();
    o.trans_a = true;
    o.beta = 1.0f;
    if (fused_db) {
      o.epilogue = NT_EPI_BGRADA;
      o.bias_grad = db;
    }
    if ((st = nt_gemm(ctx, &dy2, &x2, dw, &o))) return st;
  }
  if (db && !fused_db) return bias_grad_gemm(ctx, &dy2, db);
  return NT_OK;
}
