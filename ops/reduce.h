/* Reductions for the optimizer and AMP, over many tensors at once. Results stay on the tensors'
 * device (a device pointer on the GPU, host memory on the CPU); nothing syncs with the host.
 * Inputs: F32/F16/BF16 tensors, contiguous, on ctx's device (each list may mix dtypes). */
#ifndef NT_OPS_REDUCE_H
#define NT_OPS_REDUCE_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

/* out (F32, one element) = sum over all tensors of sum(x^2). Deterministic: on the GPU every
 * tensor is cut into fixed chunks, each chunk's fp32 sum is a fixed tree, and a finalize
 * kernel adds the chunk sums in order (in fp64). One launch per 288 tensors plus the finalize.
 * A non-finite input makes the result non-finite. n = 0 gives 0. */
nt_status nt_sum_squares(nt_ctx *ctx, const nt_tensor *const *xs, int n, nt_tensor *out);
/* For every tensor: x *= *inv_scale (an F32 one-element tensor on ctx's device); any
 * non-finite element (before scaling; NaN, +inf, -inf) sets *found_inf = 1.0f (F32, one
 * element; never cleared here: the caller zeroes it once per step). One launch per 288 tensors. */
nt_status nt_unscale_and_check(nt_ctx *ctx, nt_tensor *const *xs, int n,
                               const nt_tensor *inv_scale, nt_tensor *found_inf);
/* out (F32, one element) = mean of x (F32/F16/BF16; fp64 accumulation). An empty x gives NaN,
 * as torch.mean. */
nt_status nt_mean(nt_ctx *ctx, const nt_tensor *x, nt_tensor *out);

NT_EXTERN_C_END
#endif
