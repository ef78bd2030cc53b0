/* Dropout (inverted, as torch): y = x * mask / (1 - p), mask_i = (u_i > p) where u_i is number
 * (offset + i) of the Philox stream for `seed` (core/rng.h, mapped to (0, 1] by
 * nt_rng_u32_to_uniform), so CPU and GPU drop the same elements. The caller takes `offset` from
 * nt_ctx_rng_reserve (numel numbers) and keeps it for backward (in the same RNG step, if
 * any); `offset` must be a multiple of 4 (one Philox block; nt_ctx_rng_reserve guarantees it).
 * Inside an RNG step (nt_ctx_rng_step_begin) `offset` is relative: element i uses number
 * base + offset + i, the base read from the context's step word when the op runs (so a
 * replayed CUDA graph draws a fresh mask every step). 0 <= p <= 1; p = 0 copies, p = 1 gives
 * zeros. x, y (dy, dx) F32/F16/BF16 of one dtype and shape, contiguous; math in fp32.
 * Backward: dx += dy * mask / (1 - p).
 * nt_dropout_add: y = res + x * mask / (1 - p), a residual branch's dropout and add in one pass
 * (one rounding; res like x). */
#ifndef NT_OPS_DROPOUT_H
#define NT_OPS_DROPOUT_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_dropout_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, float p,
                             uint64_t seed, uint64_t offset);
nt_status nt_dropout_backward(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *dx, float p,
                              uint64_t seed, uint64_t offset);
nt_status nt_dropout_add(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *res, nt_tensor *y,
                         float p, uint64_t seed, uint64_t offset);

NT_EXTERN_C_END
#endif
