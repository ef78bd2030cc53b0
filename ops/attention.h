/* Causal multi-head self-attention, FlashAttention style on the GPU (no T x T matrix in
 * memory): q, k, v, out [B, H, T, D] (F32, F16, BF16; D <= 128), scale = 1/sqrt(D).
 * lse [B, H, T] F32 keeps each row's natural log-sum-exp of the scaled scores for backward.
 * All operands contiguous, one dtype, on the context's device; any T >= 1.
 * Backward accumulates (+=) into dq, dk, dv. Softmax and its statistics in fp32.
 *
 * CPU: plain loops, fp64 sums. CUDA: F16/BF16 with D 32 or 64 (16-byte aligned data) run
 * tensor-core FlashAttention-2 kernels (mma.sync m16n8k16, fp32 accumulation; backward
 * recomputes P from lse and adds dQ with fp32 atomics into pool scratch of B*H*T*D floats);
 * everything else, or any call while the environment has NT_ATTN_SIMPLE=1, runs simple
 * fp32 kernels (one warp per row, online softmax) — the fallback that isolates a fast-path
 * problem. Backward also takes B*H*T floats of scratch for rowsum(dO * O).
 * NT_ATTN_BWD_WARPS=4|8 forces the tensor-core backward's block shape (64 or 128 keys; by
 * default 128 from T = 512 on); NT_ATTN_FWD_BLOCKS=3 builds the forward for 3 blocks per SM
 * instead of 2 and NT_ATTN_FWD_KEYS=128 gives it 128-key tiles instead of 64: variants for
 * benchmarks and tests. */
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
