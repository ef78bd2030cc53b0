/* Causal multi-head self-attention, FlashAttention style on the GPU (no T x T matrix in
 * memory): q, k, v, out [B, H, T, D] (F32, F16, BF16; D <= 128), scale = 1/sqrt(D),
 *   out = dropout(softmax(scale * q k^T + causal mask)) v.
 * lse [B, H, T] F32 keeps each row's natural log-sum-exp of the scaled scores (before any
 * dropout) for backward. One dtype, on the context's device; any T >= 1.
 * Backward accumulates (+=) into dq, dk, dv unless opts->overwrite. Softmax and its
 * statistics in fp32.
 *
 * Layout: q, k, v, out, dout, dq, dk, dv are [B, H, T, D] views with a contiguous last dim
 * (stride 1) and any B, H, T strides (in elements), e.g. q, k, v straight out of the fused
 * QKV projection [B, T, 3C] as strides (T*3C, D, 3C, 1) at element offsets 0, C, 2C, and out
 * straight into [B, T, C]. Outputs must not overlap each other or the inputs. lse is
 * contiguous.
 *
 * Dropout (opts->dropout = p in [0, 1)), as PyTorch's scaled_dot_product_attention(dropout_p)
 * but with 8 random bits per probability (as FlashAttention draws them): the keep threshold
 * is thr = nt_attention_keep_threshold(p) = round(p * 256) (halves up, at most 255), element
 * (b, h, i, j) (query i, key j) has index e = ((b * H + h) * T + i) * T + j and random byte
 *   x_e = byte (e % 4) (bits 8 (e % 4) .. 8 (e % 4) + 7) of number offset + e / 4
 * of the Philox stream `seed` (core/rng.h), i.e. byte e % 16 of the Philox4x32-10 block
 * offset / 4 + e / 16 (the block's words in order, each word's bytes from the least
 * significant), and the element is kept iff x_e >= thr. The effective drop probability is
 * therefore exactly p_eff = thr / 256 (0.19921875 for p = 0.2; 0 below p = 1/512, where
 * nothing is dropped), and kept values are scaled by 1 / (1 - p_eff) = 256 / (256 - thr)
 * (nt_attention_keep_scale), so the expectation of the output is exactly the undropped one.
 * One Philox block serves 16 consecutive keys of a row. CPU and GPU drop the same elements.
 * The caller reserves nt_attention_rng_numbers(B, H, T) = ceil(B*H*T*T / 4) numbers with
 * nt_ctx_rng_reserve (offset a multiple of 4) and passes the same (seed, offset) to
 * backward. Inside an RNG step (nt_ctx_rng_step_begin) the offset is relative: the number
 * becomes base + offset + e / 4, the base read from the context's step word when the op
 * runs (the kernels read it from device memory, so a replayed CUDA graph draws a fresh mask
 * every step); backward must run in the same step as its forward. No mask is stored (the GPU
 * regenerates it in forward and again in backward: one Philox4x32-10 block per 16
 * probabilities). p = 0 is exactly the no-dropout computation (pass it in evaluation).
 *
 * CPU: plain loops, fp64 sums. CUDA: F16/BF16 with D 32 or 64 and 16-byte aligned rows (data
 * pointer and every B, H, T stride a multiple of 16 bytes, the T stride below 2^31) run
 * tensor-core FlashAttention-2
 * kernels (mma.sync m16n8k16, fp32 accumulation; backward recomputes P from lse and adds dQ
 * with fp32 atomics into pool scratch of B*H*T*D floats); everything else, or any call on a
 * context created with the option attn_simple (core/ctx.h), runs simple fp32 kernels (one
 * warp per row, online softmax) — the fallback that isolates a fast-path problem. Backward
 * also takes B*H*T floats of scratch for rowsum(dO * O). The mma.sync backward runs blocks of
 * 64 keys (4 warps) below T = 512 and of 128 keys (8 warps) from there on. On Hopper, with an
 * sm_90a pass in the build, D = 64 runs the same algorithm on warpgroup MMA (wgmma,
 * ops/attention_{fwd,bwd}_wg.cu) instead; the option attn_wgmma = false keeps the mma.sync
 * kernels; the wgmma backward's dQ scratch is B*H*ceil(T/64)*64*D floats. The options
 * attn_tma, attn_bwd_keys, attn_bwd_group and attn_dq_pair choose among the wgmma kernels'
 * variants (core/ctx.h says which is the default where). */
#ifndef NT_OPS_ATTENTION_H
#define NT_OPS_ATTENTION_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  float dropout;          /* probability of zeroing an attention probability, [0, 1) */
  uint64_t seed, offset;  /* Philox stream of the mask; offset a multiple of 4, reserved by the
                             caller with nt_ctx_rng_reserve(ctx, nt_attention_rng_numbers(B, H,
                             T)) (relative to the step base inside an RNG step); unused when
                             dropout = 0 */
  bool overwrite;         /* backward: dq, dk, dv = result instead of += */
} nt_attention_opts;

/* opts NULL: no dropout, backward accumulates. Backward takes the forward's opts (same
 * dropout, seed, offset) and its out and lse. */
nt_status nt_attention_forward_ex(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                                  const nt_tensor *v, nt_tensor *out, nt_tensor *lse,
                                  const nt_attention_opts *opts);
nt_status nt_attention_backward_ex(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                   const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                                   const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk,
                                   nt_tensor *dv, const nt_attention_opts *opts);
/* The same with opts NULL. */
nt_status nt_attention_forward(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k,
                               const nt_tensor *v, nt_tensor *out, nt_tensor *lse);
nt_status nt_attention_backward(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                                const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                                const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk,
                                nt_tensor *dv);
/* The dropout mask's byte threshold round(p * 256), at most 255 (0 <= p < 1): a probability
 * is kept iff its random byte is >= it, so p_eff = threshold / 256. */
uint32_t nt_attention_keep_threshold(float p);
/* The factor of the kept probabilities, 1 / (1 - p_eff) = 256 / (256 - threshold). */
double nt_attention_keep_scale(float p);
/* The stream numbers a dropout mask of [B, H, T, T] probabilities takes: ceil(B*H*T*T / 4). */
uint64_t nt_attention_rng_numbers(int64_t B, int64_t H, int64_t T);

NT_EXTERN_C_END
#endif
