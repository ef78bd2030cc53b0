#include "ops/elementwise.h"
#include "ops/memops_impl.h"
#include "ops/gelu_rule.h"
#include <math.h>

/* ---- checks shared by the memory-bound ops (declared in memops_impl.h) ---- */

nt_status nt_memops_check_act(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  if (!t || !t->data) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor is NULL", what);
  nt_status st = nt_check_device(ctx, t, what);
  if (st) return st;
  if (t->dtype != NT_F32 && t->dtype != NT_F16 && t->dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s not supported (f32, f16 or bf16)", what,
                    nt_dtype_name(t->dtype));
  return nt_check_contiguous(ctx, t, what);
}

nt_status nt_memops_check_scalar(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  if (!t || !t->data) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor is NULL", what);
  nt_status st = nt_check_device(ctx, t, what);
  if (st) return st;
  st = nt_check_dtype(ctx, t, NT_F32, what);
  if (st) return st;
  if (nt_tensor_numel(t) != 1)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: expected one element, got %lld", what,
                    (long long)nt_tensor_numel(t));
  return NT_OK;
}

nt_status nt_memops_no_cuda(nt_ctx *ctx, const char *op) {
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "%s: CUDA tensors need the CUDA backend", op);
}

/* ---- CPU reference ---- */

static void map_cpu(nt_ew_op op, float alpha, const nt_tensor *a, const nt_tensor *b,
                    nt_tensor *out) {
  int64_t n = nt_tensor_numel(out);
  for (int64_t i = 0; i < n; i++) {
    float x = nt_load_f32(a->data, a->dtype, i), r = 0.0f;
    switch (op) {
    case NT_EW_GELU_FWD: r = nt_gelu(x); break;
    case NT_EW_GELU_BWD:
      r = nt_load_f32(out->data, out->dtype, i) + nt_load_f32(b->data, b->dtype, i) * nt_gelu_grad(x);
      break;
    case NT_EW_RELU_FWD: r = x > 0.0f ? x : 0.0f; break;
    case NT_EW_RELU_BWD:
      r = nt_load_f32(out->data, out->dtype, i) + (x > 0.0f ? nt_load_f32(b->data, b->dtype, i) : 0.0f);
      break;
    case NT_EW_ADD: r = x + nt_load_f32(b->data, b->dtype, i); break;
    case NT_EW_AXPY: r = nt_load_f32(out->data, out->dtype, i) + alpha * x; break;
    case NT_EW_SCALE: r = alpha * x; break;
    }
    nt_store_f32(out->data, out->dtype, i, r);
  }
}

/* ---- dispatch ---- */

/* All tensors: float, contiguous, on ctx's device, one shape and one dtype. */
static nt_status map(nt_ctx *ctx, const char *name, nt_ew_op op, float alpha, const nt_tensor *a,
                     const nt_tensor *b, nt_tensor *out) {
  nt_status st = nt_memops_check_act(ctx, a, name);
  if (!st && b) st = nt_memops_check_act(ctx, b, name);
  if (!st) st = nt_memops_check_act(ctx, out, name);
  if (st) return st;
  st = nt_check_same_shape(ctx, a, out, name);
  if (!st && b) st = nt_check_same_shape(ctx, b, out, name);
  if (st) return st;
  if (a->dtype != out->dtype || (b && b->dtype != out->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: all tensors must have one dtype (%s, %s, %s)", name,
                    nt_dtype_name(a->dtype), b ? nt_dtype_name(b->dtype) : "-",
                    nt_dtype_name(out->dtype));
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_elementwise_map_cuda(ctx, op, alpha, a, b, out);
#else
    return nt_memops_no_cuda(ctx, name);
#endif
  }
  map_cpu(op, alpha, a, b, out);
  return NT_OK;
}

nt_status nt_gelu_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y) {
  return map(ctx, "gelu_forward", NT_EW_GELU_FWD, 1.0f, x, NULL, y);
}

nt_status nt_gelu_backward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *dy, nt_tensor *dx) {
  return map(ctx, "gelu_backward", NT_EW_GELU_BWD, 1.0f, x, dy, dx);
}

nt_status nt_relu_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y) {
  return map(ctx, "relu_forward", NT_EW_RELU_FWD, 1.0f, x, NULL, y);
}

nt_status nt_relu_backward(nt_ctx *ctx, const nt_tensor *y, const nt_tensor *dy, nt_tensor *dx) {
  return map(ctx, "relu_backward", NT_EW_RELU_BWD, 1.0f, y, dy, dx);
}

nt_status nt_add(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *b, nt_tensor *out) {
  return map(ctx, "add", NT_EW_ADD, 1.0f, a, b, out);
}

nt_status nt_axpy(nt_ctx *ctx, float alpha, const nt_tensor *x, nt_tensor *y) {
  return map(ctx, "axpy", NT_EW_AXPY, alpha, x, NULL, y);
}

nt_status nt_scale(nt_ctx *ctx, float alpha, nt_tensor *x) {
  return map(ctx, "scale", NT_EW_SCALE, alpha, x, NULL, x);
}
