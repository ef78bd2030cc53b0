/* Causal multi-head self-attention, FlashAttention style on the GPU (no T x T matrix in
 * memory): q, k, v, out [B, H, T, D] (F32, F16, BF16; D <= 128), scale = 1/sqrt(D).
 * lse [B, H, T] F32 keeps each row's log-sum-exp for backward. Backward accumulates into
 * dq, dk, dv. Softmax and its statistics in fp32. */
#ifndef NT_OPS_ATTENTION_H
#define NT_OPS_ATTENTION_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_attention_forward(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                               const nt_tensor *v, nt_tensor *out, nt_tensor *lse);
nt_status nt_attention_backward(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                                const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk,
                                nt_tensor *dv);
/* qkv [B, T, 3C] (the fused projection's output, C = H * D) <-> q, k, v [B, H, T, D], and
 * attention output [B, H, T, D] <-> [B, T, C]. Backward of each is the inverse permutation
 * (accumulating). */
nt_status nt_qkv_split(nt_ctx *ctx, const nt_tensor *qkv, int heads, nt_tensor *q, nt_tensor *k,
                       nt_tensor *v);
nt_status nt_qkv_split_backward(nt_ctx *ctx, const nt_tensor *dq, const nt_tensor *dk,
                                const nt_tensor *dv, nt_tensor *dqkv);
nt_status nt_heads_merge(nt_ctx *ctx, const nt_tensor *o, nt_tensor *y);
nt_status nt_heads_merge_backward(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *do_);

NT_EXTERN_C_END
#endif
