/* Standalone clipping by global norm: sum of squares (ops/reduce), then an in-place scale by
 * the coefficient computed where the data lives. */
#include "optim/clip.h"
#include "optim/optim_common.h"
#include "ops/reduce.h"
#include <math.h>

#ifdef NT_HAVE_CUDA
nt_status nt_clip_scale_cuda(nt_ctx *ctx, float *g, int64_t n, const float *sumsq, float max_norm,
                             float *total_norm);
#endif

static inline NT_HD float clip_rule(float sumsq, float max_norm) {
  float total = sqrtf(sumsq);
  float c = max_norm / (total + 1e-6f);
  if (!(c < 1.0f) && c == c) c = 1.0f;
  return c;
}

float nt_clip_coef(float sumsq, float max_norm) { return clip_rule(sumsq, max_norm); }

nt_status nt_clip_grad_norm(nt_ctx *ctx, nt_tensor *const *grads, int n, float max_norm,
                            nt_tensor *total_norm) {
  nt_status st;
  float *sumsq = NULL;
  if (n < 1 || !grads) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "clip_grad_norm of %d tensors", n);
  if (!(max_norm > 0.0f) || !isfinite(max_norm))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "clip_grad_norm: max_norm %g must be > 0",
                    (double)max_norm);
  for (int i = 0; i < n; i++)
    if ((st = nt_check_dtype(ctx, grads[i], NT_F32, "clip_grad_norm grads")) ||
        (st = nt_check_contiguous(ctx, grads[i], "clip_grad_norm grads")) ||
        (st = nt_check_device(ctx, grads[i], "clip_grad_norm grads")))
      return st;
  if (total_norm && ((st = nt_check_dtype(ctx, total_norm, NT_F32, "total_norm")) ||
                     (st = nt_check_device(ctx, total_norm, "total_norm"))))
    return st;
  if ((st = nt_alloc(ctx, sizeof(float), (void **)&sumsq))) return st;
  nt_tensor out = nt_tensor_view(sumsq, NT_F32, nt_ctx_device(ctx), 0, NULL);
  if ((st = nt_sum_squares(ctx, (const nt_tensor *const *)grads, n, &out))) goto done;
  for (int i = 0; i < n; i++) {
    float *g = (float *)grads[i]->data;
    int64_t numel = nt_tensor_numel(grads[i]);
    float *tn = (i == 0 && total_norm) ? (float *)total_norm->data : NULL;
#ifdef NT_HAVE_CUDA
    if (nt_ctx_is_cuda(ctx)) {
      if ((st = nt_clip_scale_cuda(ctx, g, numel, sumsq, max_norm, tn))) goto done;
      continue;
    }
#endif
    float c = clip_rule(*sumsq, max_norm);
    if (tn) *tn = sqrtf(*sumsq);
    for (int64_t j = 0; j < numel; j++) g[j] *= c;
  }
done:
  nt_free(ctx, sumsq);
  return st;
}
