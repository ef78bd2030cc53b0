/* Dropout (inverted, as torch): y = x * mask / (1 - p), mask_i = (u_i > p) where u_i is number
 * (offset + i) of the Philox stream for `seed` (core/rng.h), so CPU and GPU drop the same
 * elements. The caller takes `offset` from nt_ctx_rng_reserve and keeps it for backward.
 * p = 0 copies. Backward: dx += dy * mask / (1 - p). */
#ifndef NT_OPS_DROPOUT_H
#define NT_OPS_DROPOUT_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_dropout_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, float p,
                             uint64_t seed, uint64_t offset);
nt_status nt_dropout_backward(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *dx, float p,
                              uint64_t seed, uint64_t offset);

NT_EXTERN_C_END
#endif
