#include "ops/dropout.h"
#include "ops/memops_impl.h"

static void dropout_cpu(const nt_tensor *x, const nt_tensor *res, nt_tensor *y, float p,
                        uint64_t seed, uint64_t offset, bool accumulate) {
  int64_t n = nt_tensor_numel(x);
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for (int64_t i = 0; i < n; i++) {
    float u = nt_rng_u32_to_uniform(nt_rng_u32(seed, offset + (uint64_t)i));
    float v = u > p ? nt_load_f32(x->data, x->dtype, i) * keep_scale : 0.0f;
    if (accumulate) v += nt_load_f32(y->data, y->dtype, i);
    if (res) v += nt_load_f32(res->data, res->dtype, i);
    nt_store_f32(y->data, y->dtype, i, v);
  }
}

static nt_status dropout(nt_ctx *ctx, const char *name, const nt_tensor *x, const nt_tensor *res,
                         nt_tensor *y, float p, uint64_t seed, uint64_t offset, bool accumulate) {
  nt_status st = nt_memops_check_act(ctx, x, name);
  if (!st) st = nt_memops_check_act(ctx, y, name);
  if (!st) st = nt_check_same_shape(ctx, x, y, name);
  if (!st && res) st = nt_memops_check_act(ctx, res, name);
  if (!st && res) st = nt_check_same_shape(ctx, x, res, name);
  if (st) return st;
  if (x->dtype != y->dtype || (res && res->dtype != x->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: input %s, residual %s and output %s must share a dtype",
                    name, nt_dtype_name(x->dtype), res ? nt_dtype_name(res->dtype) : "-",
                    nt_dtype_name(y->dtype));
  if (!(p >= 0.0f && p <= 1.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: p = %g must be in [0, 1]", name, (double)p);
  if (offset % 4 != 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "%s: RNG offset %llu must be a multiple of 4 (take it from nt_ctx_rng_reserve)",
                    name, (unsigned long long)offset);
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_dropout_cuda(ctx, x, res, y, p, seed, offset, accumulate);
#else
    return nt_memops_no_cuda(ctx, name);
#endif
  }
  /* Inside an RNG step the offset is relative to the step base (core/ctx.h). */
  const uint64_t *base = nt_ctx_rng_base(ctx);
  dropout_cpu(x, res, y, p, seed, offset + (base ? *base : 0), accumulate);
  return NT_OK;
}

nt_status nt_dropout_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, float p,
                             uint64_t seed, uint64_t offset) {
  return dropout(ctx, "dropout_forward", x, NULL, y, p, seed, offset, false);
}

nt_status nt_dropout_backward(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *dx, float p,
                              uint64_t seed, uint64_t offset) {
  return dropout(ctx, "dropout_backward", dy, NULL, dx, p, seed, offset, true);
}

nt_status nt_dropout_add(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *res, nt_tensor *y,
                         float p, uint64_t seed, uint64_t offset) {
  if (!res) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "dropout_add: the residual is required");
  return dropout(ctx, "dropout_add", x, res, y, p, seed, offset, false);
}
