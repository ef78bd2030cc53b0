#include "ops/reduce.h"
#include "ops/memops_impl.h"
#include <math.h>

static nt_status check_list(nt_ctx *ctx, const char *name, const nt_tensor *const *xs, int n) {
  if (n < 0) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: %d tensors", name, n);
  if (n > 0 && !xs) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor list is NULL", name);
  for (int i = 0; i < n; i++) {
    if (!xs[i]) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor %d is NULL", name, i);
    if (nt_tensor_numel(xs[i]) == 0) continue;
    nt_status st = nt_memops_check_act(ctx, xs[i], name);
    if (st) return st;
  }
  return NT_OK;
}

nt_status nt_sum_squares(nt_ctx *ctx, const nt_tensor *const *xs, int n, nt_tensor *out) {
  nt_status st = check_list(ctx, "sum_squares", xs, n);
  if (!st) st = nt_memops_check_scalar(ctx, out, "sum_squares out");
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_sum_squares_cuda(ctx, xs, n, out);
#else
    return nt_memops_no_cuda(ctx, "sum_squares");
#endif
  }
  double s = 0.0;
  for (int k = 0; k < n; k++) {
    int64_t m = nt_tensor_numel(xs[k]);
    for (int64_t i = 0; i < m; i++) {
      double v = nt_load_f32(xs[k]->data, xs[k]->dtype, i);
      s += v * v;
    }
  }
  *(float *)out->data = (float)s;
  return NT_OK;
}

nt_status nt_unscale_and_check(nt_ctx *ctx, nt_tensor *const *xs, int n,
                               const nt_tensor *inv_scale, nt_tensor *found_inf) {
  nt_status st = check_list(ctx, "unscale_and_check", (const nt_tensor *const *)xs, n);
  if (!st) st = nt_memops_check_scalar(ctx, inv_scale, "unscale_and_check inv_scale");
  if (!st) st = nt_memops_check_scalar(ctx, found_inf, "unscale_and_check found_inf");
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_unscale_and_check_cuda(ctx, xs, n, inv_scale, found_inf);
#else
    return nt_memops_no_cuda(ctx, "unscale_and_check");
#endif
  }
  float inv = *(const float *)inv_scale->data;
  bool found = false;
  for (int k = 0; k < n; k++) {
    int64_t m = nt_tensor_numel(xs[k]);
    for (int64_t i = 0; i < m; i++) {
      float v = nt_load_f32(xs[k]->data, xs[k]->dtype, i);
      if (!isfinite(v)) found = true;
      nt_store_f32(xs[k]->data, xs[k]->dtype, i, v * inv);
    }
  }
  if (found) *(float *)found_inf->data = 1.0f;
  return NT_OK;
}

nt_status nt_mean(nt_ctx *ctx, const nt_tensor *x, nt_tensor *out) {
  nt_status st = NT_OK;
  if (!x) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "mean: x is NULL");
  if (nt_tensor_numel(x) > 0) st = nt_memops_check_act(ctx, x, "mean");
  if (!st) st = nt_memops_check_scalar(ctx, out, "mean out");
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_mean_cuda(ctx, x, out);
#else
    return nt_memops_no_cuda(ctx, "mean");
#endif
  }
  int64_t m = nt_tensor_numel(x);
  double s = 0.0;
  for (int64_t i = 0; i < m; i++) s += nt_load_f32(x->data, x->dtype, i);
  *(float *)out->data = m ? (float)(s / (double)m) : NAN;
  return NT_OK;
}
