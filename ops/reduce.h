/* Reductions for the optimizer and AMP, over many tensors in one launch. Results stay on the
 * tensors' device (a device pointer on the GPU, host memory on the CPU). */
#ifndef NT_OPS_REDUCE_H
#define NT_OPS_REDUCE_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

/* out (F32 scalar tensor) = sum over all tensors of sum(x^2), fp32 partial sums combined in a
 * fixed order (deterministic); a non-finite input makes it non-finite. */
nt_status nt_sum_squares(nt_ctx *ctx, const nt_tensor *const *xs, int n, nt_tensor *out);
/* For every tensor: x *= *inv_scale (device/host fp32 scalar); any non-finite element (before
 * scaling) sets *found_inf = 1.0f (F32 scalar tensor; never cleared here). One launch. */
nt_status nt_unscale_and_check(nt_ctx *ctx, nt_tensor *const *xs, int n,
                               const nt_tensor *inv_scale, nt_tensor *found_inf);
/* out (F32 scalar) = mean of x (F32). */
nt_status nt_mean(nt_ctx *ctx, const nt_tensor *x, nt_tensor *out);

NT_EXTERN_C_END
#endif
