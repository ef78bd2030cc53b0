#include "ops/cross_entropy.h"
#include "ops/memops_impl.h"
#include <math.h>

/* Elements from one row of t [.., V] to the next (V unless 2-D with padded rows). */
static int64_t row_stride(const nt_tensor *t) {
  int64_t V = t->shape[t->ndim - 1];
  return t->ndim >= 2 && t->shape[t->ndim - 2] > 1 ? t->stride[t->ndim - 2] : V;
}

/* Logits or dlogits: a float tensor on the context's device, contiguous or a 2-D view with
 * padded rows (unit stride along V, row stride >= V). */
static nt_status check_rows(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  char b[96];
  if (!t || !t->data) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor is NULL", what);
  if (t->ndim != 2 || nt_tensor_is_contiguous(t)) return nt_memops_check_act(ctx, t, what);
  nt_status st = nt_check_device(ctx, t, what);
  if (st) return st;
  if (t->dtype != NT_F32 && t->dtype != NT_F16 && t->dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s not supported (f32, f16 or bf16)", what,
                    nt_dtype_name(t->dtype));
  bool unit = t->shape[1] <= 1 || t->stride[1] == 1;
  if (!unit || (t->shape[0] > 1 && t->stride[0] < t->shape[1]))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s %s: rows need a unit stride along the classes and a "
                    "row stride of at least their length", what, nt_tensor_describe(t, b, sizeof b));
  return NT_OK;
}

/* fp64 per row; losses and dlogits may each be NULL. dlogits may alias logits: a row is fully
 * read (max, sum, target logit) before it is written. ld, ldd: row_stride of logits, dlogits. */
static void ce_cpu(int64_t N, int64_t V, const nt_tensor *logits, int64_t ld,
                   const int32_t *tgt, double grad_scale, nt_tensor *losses, nt_tensor *dlogits,
                   int64_t ldd) {
  const void *x = logits->data;
  nt_dtype dt = logits->dtype;
  for (int64_t r = 0; r < N; r++) {
    int64_t o = r * ld, od = r * ldd;
    int32_t t = tgt[r];
    if (t == NT_CE_IGNORE_INDEX) {
      if (losses) ((float *)losses->data)[r] = 0.0f;
      if (dlogits)
        for (int64_t c = 0; c < V; c++) nt_store_f32(dlogits->data, dt, od + c, 0.0f);
      continue;
    }
    double m = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < V; c++) m = fmax(m, nt_load_f32(x, dt, o + c));
    for (int64_t c = 0; c < V; c++) s += exp(nt_load_f32(x, dt, o + c) - m);
    double lse = m + log(s);
    if (losses) ((float *)losses->data)[r] = (float)(lse - nt_load_f32(x, dt, o + t));
    if (dlogits)
      for (int64_t c = 0; c < V; c++) {
        double p = exp(nt_load_f32(x, dt, o + c) - lse) - (c == t ? 1.0 : 0.0);
        nt_store_f32(dlogits->data, dt, od + c, (float)(p * grad_scale));
      }
  }
}

static nt_status ce(nt_ctx *ctx, const char *name, const nt_tensor *logits,
                    const nt_tensor *targets, const float *dloss_scale, int64_t count,
                    nt_tensor *losses, nt_tensor *dlogits) {
  nt_status st = check_rows(ctx, logits, name);
  if (st) return st;
  if (logits->ndim < 1) return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: logits need a class dim", name);
  int64_t V = logits->shape[logits->ndim - 1];
  if (V < 1) return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: logits have no classes", name);
  int64_t N = nt_tensor_numel(logits) / V;
  if (!targets || !targets->data)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: targets is NULL", name);
  st = nt_check_device(ctx, targets, "cross_entropy targets");
  if (!st) st = nt_check_dtype(ctx, targets, NT_I32, "cross_entropy targets");
  if (!st) st = nt_check_contiguous(ctx, targets, "cross_entropy targets");
  if (st) return st;
  if (nt_tensor_numel(targets) != N)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: %lld targets for %lld rows of logits", name,
                    (long long)nt_tensor_numel(targets), (long long)N);
  if (losses) {
    st = nt_check_device(ctx, losses, "cross_entropy losses");
    if (!st) st = nt_check_dtype(ctx, losses, NT_F32, "cross_entropy losses");
    if (!st) st = nt_check_contiguous(ctx, losses, "cross_entropy losses");
    if (st) return st;
    if (nt_tensor_numel(losses) != N)
      return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: losses hold %lld values for %lld rows", name,
                      (long long)nt_tensor_numel(losses), (long long)N);
  }
  if (dlogits) {
    st = check_rows(ctx, dlogits, "cross_entropy dlogits");
    if (!st) st = nt_check_same_shape(ctx, logits, dlogits, "cross_entropy dlogits");
    if (st) return st;
    if (dlogits->dtype != logits->dtype)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dlogits dtype %s differs from logits' %s", name,
                      nt_dtype_name(dlogits->dtype), nt_dtype_name(logits->dtype));
    if (count < 1)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: count = %lld rows to average over must be > 0",
                      name, (long long)count);
  }
  const int64_t ld = row_stride(logits), ldd = dlogits ? row_stride(dlogits) : V;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_cross_entropy_cuda(ctx, logits, ld, targets, dloss_scale, count, losses, dlogits,
                                 ldd);
#else
    return nt_memops_no_cuda(ctx, name);
#endif
  }
  const int32_t *tgt = (const int32_t *)targets->data;
  for (int64_t r = 0; r < N; r++)
    if (tgt[r] != NT_CE_IGNORE_INDEX && (tgt[r] < 0 || tgt[r] >= V))
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: target %d of row %lld is outside [0, %lld)",
                      name, tgt[r], (long long)r, (long long)V);
  double scale = dlogits ? (dloss_scale ? (double)*dloss_scale : 1.0) / (double)count : 0.0;
  ce_cpu(N, V, logits, ld, tgt, scale, losses, dlogits, ldd);
  return NT_OK;
}

nt_status nt_cross_entropy_forward(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                   nt_tensor *losses) {
  if (!losses) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "cross_entropy_forward: losses is NULL");
  return ce(ctx, "cross_entropy_forward", logits, targets, NULL, 1, losses, NULL);
}

nt_status nt_cross_entropy_backward(nt_ctx *ctx, const nt_tensor *logits,
                                    const nt_tensor *targets, const float *dloss_scale,
                                    int64_t count, nt_tensor *dlogits) {
  if (!dlogits)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "cross_entropy_backward: dlogits is NULL");
  return ce(ctx, "cross_entropy_backward", logits, targets, dloss_scale, count, NULL, dlogits);
}

nt_status nt_cross_entropy_fused(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                 const float *dloss_scale, int64_t count, nt_tensor *losses,
                                 nt_tensor *dlogits) {
  if (!losses || !dlogits)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "cross_entropy_fused: losses and dlogits are needed");
  return ce(ctx, "cross_entropy_fused", logits, targets, dloss_scale, count, losses, dlogits);
}
