/* Softmax cross-entropy over the last dim, fused: logits [.., V] (F32/F16/BF16, contiguous, or
 * a 2-D [N, V] view whose rows are padded: unit stride along V, row stride >= V, e.g. rows
 * aligned for the GEMMs around it; rows N = numel / V), targets I32 [N] (ignore_index -1 skips a row, as torch's ignore_index:
 * its loss and gradient are 0). losses [N] F32 per row; the mean over counted rows is reduced by
 * nt_mean if wanted. Backward writes (not accumulates: the logits have no other consumer)
 * dlogits = (softmax - onehot) * dloss_scale / count, in logits' dtype, computed in fp32
 * (dlogits has logits' shape; it may be row-padded too, with its own row stride).
 * dloss_scale carries the loss scale of AMP. Any vocabulary size (GPT-2's 50304 and 65 alike).
 * A target outside [0, V) other than -1 is NT_ERR_INVALID_ARG on the CPU; on the GPU (no host
 * sync) that row's loss and gradient become NaN, which the loss and the AMP inf check show. */
#ifndef NT_OPS_CROSS_ENTROPY_H
#define NT_OPS_CROSS_ENTROPY_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

#define NT_CE_IGNORE_INDEX (-1)

nt_status nt_cross_entropy_forward(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                   nt_tensor *losses);
/* dloss_scale: device pointer (GPU) or host pointer (CPU) to one fp32 value, or NULL for 1.
 * `count` (> 0) is the number of rows averaged over (the mean loss's denominator). */
nt_status nt_cross_entropy_backward(nt_ctx *ctx, const nt_tensor *logits,
                                    const nt_tensor *targets, const float *dloss_scale,
                                    int64_t count, nt_tensor *dlogits);
/* Both in one pass over the logits; dlogits may alias logits (in-place, as llm.c). */
nt_status nt_cross_entropy_fused(nt_ctx *ctx, const nt_tensor *logits, const nt_tensor *targets,
                                 const float *dloss_scale, int64_t count, nt_tensor *losses,
                                 nt_tensor *dlogits);

NT_EXTERN_C_END
#endif
