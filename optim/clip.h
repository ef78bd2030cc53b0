/* Clipping by global norm, torch.nn.utils.clip_grad_norm_'s arithmetic:
 *   total = sqrt(sum over all grads of g^2)      (fp32, after unscale)
 *   coef  = min(1, max_norm / (total + 1e-6))    (a NaN total gives a NaN coef, as torch)
 *   g *= coef
 * The fused optimizers apply coef inside their kernel (nt_optim_step_args.max_norm), which is
 * the fast path; nt_clip_grad_norm modifies the gradients in place for other uses. Everything
 * stays on the device: no host sync. */
#ifndef NT_OPTIM_CLIP_H
#define NT_OPTIM_CLIP_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

/* The coefficient as the kernels compute it (host helper, for tests and logging). */
float nt_clip_coef(float sumsq, float max_norm);

/* grads: F32 tensors on ctx's device (contiguous). total_norm: optional F32 scalar that
 * receives sqrt(sumsq) (on ctx's device). */
nt_status nt_clip_grad_norm(nt_ctx *ctx, nt_tensor *const *grads, int n, float max_norm,
                            nt_tensor *total_norm);

NT_EXTERN_C_END
#endif
