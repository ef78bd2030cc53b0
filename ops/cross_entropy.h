/* Softmax cross-entropy over the last dim, fused: logits [N, V] (F32/F16/BF16), targets I32
 * [N] (ignore_index -1 skips a row, as torch's ignore_index). losses [N] F32 per row; the mean
 * over counted rows is reduced by nt_mean if wanted. Backward writes (not accumulates: the
 * logits have no other consumer) dlogits = (softmax - onehot) * dloss_scale / count, in
 * logits' dtype, computed in fp32. dloss_scale carries the loss scale of AMP. Forward and
 * backward may be one pass (nt_cross_entropy_fused) so the logits are read once. */
#ifndef NT_OPS_CROSS_ENTROPY_H
#define NT_OPS_CROSS_ENTROPY_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_cross_entropy_forward(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                   nt_tensor *losses);
/* dloss_scale: device pointer (GPU) or host pointer (CPU) to one fp32 value, or NULL for 1.
 * `count` is the number of rows averaged over (the mean loss's denominator). */
nt_status nt_cross_entropy_backward(nt_ctx *ctx, const nt_tensor *logits,
                                    const nt_tensor *targets, const float *dloss_scale,
                                    int64_t count, nt_tensor *dlogits);
/* Both in one pass; dlogits may alias logits (in-place, as llm.c). */
nt_status nt_cross_entropy_fused(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                 const float *dloss_scale, int64_t count, nt_tensor *losses,
                                 nt_tensor *dlogits);

NT_EXTERN_C_END
#endif
