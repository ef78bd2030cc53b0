/* Private to ops/attention*.cu: the launchers of the tensor-core (mma.sync) path, the strided
 * view and dropout descriptions the kernels take, the dropout mask's Philox helpers, and
 * (through ops/cuda_dtype.cuh) the dtype conversions the simple and the tensor-core kernels
 * share. */
#ifndef NT_OPS_ATTENTION_CUDA_CUH
#define NT_OPS_ATTENTION_CUDA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <curand_philox4x32_x.h>
#include <stdint.h>
#include "core/nt.h"
#include "ops/cuda_dtype.cuh"

/* A [B, H, T, D] operand: its first element and the element strides of B, H and T (D is
 * contiguous). Row t of head bh = b * H + h starts at p + b * sb + h * sh + t * st. */
struct nt_attn_view {
  void *p;
  long long sb, sh, st;
};

/* Attention dropout for the kernels (ops/attention.h): probability (bh, i, j) has mask index
 * n = 4 * (*base + offset) + (bh * T + i) * T + j and is kept iff byte n % 16 of Philox block
 * n / 16 of the stream `seed` is >= the byte threshold (nt_attention_keep_threshold), which
 * thr4 holds in each of its four bytes; kept values are scaled by rp = 256 / (256 - thr).
 * base: the context's RNG step word in device memory (core/ctx.h), read by the dropout
 * kernels when they run (nt_attn::drop_origin: once per thread, once per key tile in the
 * forward), so a replayed CUDA graph sees the base its step advanced; NULL outside a step
 * (base 0). The kernels without dropout never read it. */
struct nt_attn_drop {
  unsigned long long seed, offset;
  const unsigned long long *base;
  uint32_t thr4;
  float rp;
};

/* Tensor-core path (F16/BF16, D in {32, 64}, 16-byte aligned rows). H splits bh into (b, h)
 * for the views; lse [B*H*T], d_rows [B*H*T] (rowsum(dO * O)) and dq_acc [B*H*T*D] (zeroed
 * fp32) are contiguous buffers from the caller. drop NULL: no dropout. overwrite: dk, dv
 * are stored instead of added to. Each returns NT_OK or the launch error. */
bool nt_attention_mma_supported(nt_dtype dt, int D);
nt_status nt_attention_forward_mma(nt_ctx *ctx, nt_dtype dt, nt_attn_view q, nt_attn_view k,
                                   nt_attn_view v, nt_attn_view out, float *lse, int BH, int H,
                                   int T, int D, const nt_attn_drop *drop);
nt_status nt_attention_backward_mma(nt_ctx *ctx, nt_dtype dt, nt_attn_view dout, nt_attn_view q,
                                    nt_attn_view k, nt_attn_view v, const float *lse,
                                    const float *d_rows, float *dq_acc, nt_attn_view dk,
                                    nt_attn_view dv, int BH, int H, int T, int D,
                                    const nt_attn_drop *drop, bool overwrite);

/* The wgmma forward (attention_fwd_wg.cu): D = 64, F16/BF16, 16-byte aligned rows, on a device
 * where nt_wgmma_usable (ops/wgmma.cuh); otherwise as nt_attention_forward_mma. */
nt_status nt_attention_forward_wg(nt_ctx *ctx, nt_dtype dt, nt_attn_view q, nt_attn_view k,
                                  nt_attn_view v, nt_attn_view out, float *lse, int BH, int H,
                                  int T, const nt_attn_drop *drop);
/* The wgmma backward (attention_bwd_wg.cu), under the same conditions; otherwise as
 * nt_attention_backward_mma, except that dq_acc (zeroed, nt_attention_wg_dq_acc_floats floats:
 * whole 64-row query tiles in the kernel's own order) is folded into dq here, and that the
 * kernel zeroes zero_floats floats (a multiple of 4) at zero_next (16-byte aligned; NULL and 0:
 * none) for the next call (attention_dq_pair.h). */
size_t nt_attention_wg_dq_acc_floats(int BH, int T);
nt_status nt_attention_backward_wg(nt_ctx *ctx, nt_dtype dt, nt_attn_view dout, nt_attn_view q,
                                   nt_attn_view k, nt_attn_view v, const float *lse,
                                   const float *d_rows, float *dq_acc, float *zero_next,
                                   size_t zero_floats, nt_attn_view dq, nt_attn_view dk,
                                   nt_attn_view dv, int BH, int H, int T,
                                   const nt_attn_drop *drop, bool overwrite);

namespace nt_attn {

constexpr float kLog2e = 1.4426950408889634f;   /* exp(x) = exp2(x * kLog2e) */

/* Element offset of head bh's first row in a view. */
__device__ __forceinline__ long long head_off(const nt_attn_view &v, long long bh, int H) {
  return (bh / H) * v.sb + (bh % H) * v.sh;
}

/* The mask index of probability (0, 0, 0): four per stream number of the call's offset plus
 * the step base (both multiples of 4, so it is a multiple of 16: a block boundary). Dropout
 * instantiations only. */
__device__ __forceinline__ unsigned long long drop_origin(const nt_attn_drop &dr) {
  return 4ull * (dr.offset + (dr.base ? *dr.base : 0ull));
}

/* Words 4 * blk .. 4 * blk + 3 of the stream `seed`: Philox4x32-10 of counter blk, as
 * ops/dropout.cu and core/rng.c draw them. */
__device__ __forceinline__ uint4 philox_block(unsigned long long seed, unsigned long long blk) {
  return curand_Philox4x32_10(make_uint4((unsigned)blk, (unsigned)(blk >> 32), 0u, 0u),
                              make_uint2((unsigned)seed, (unsigned)(seed >> 32)));
}

/* Keep bits of a word's four bytes (bit k: byte k >= the threshold): the per-byte compare
 * gives 0xff or 0 per byte, the mask leaves bit k set in byte k, and the multiply adds the
 * four bytes (no carries: at most 15) into the top byte. */
__device__ __forceinline__ uint32_t keep4(uint32_t x, uint32_t thr4) {
  return ((__vcmpgeu4(x, thr4) & 0x08040201u) * 0x01010101u) >> 24;
}

/* Keep bits of a block's 16 mask elements: bit k for byte k (byte k % 4 of word k / 4). */
__device__ __forceinline__ uint32_t keep16(uint4 x, uint32_t thr4) {
  return keep4(x.x, thr4) | keep4(x.y, thr4) << 4 | keep4(x.z, thr4) << 8 |
         keep4(x.w, thr4) << 12;
}

/* Keep bits of the N (16 or 32) consecutive mask elements first .. first + N - 1: bit i for
 * element first + i. N / 16 Philox blocks when first is a multiple of 16 (every row when T
 * is), one more otherwise. */
template <int N>
__device__ __forceinline__ uint32_t keep_bits(const nt_attn_drop &dr, unsigned long long first) {
  static_assert(N == 16 || N == 32, "16 or 32 keep bits");
  const unsigned long long b0 = first >> 4;
  const int a = (int)(first & 15);
  uint32_t bits = keep16(philox_block(dr.seed, b0), dr.thr4);
  if (N == 32) bits |= keep16(philox_block(dr.seed, b0 + 1), dr.thr4) << 16;
  if (a) bits = (bits >> a) | keep16(philox_block(dr.seed, b0 + N / 16), dr.thr4) << (N - a);
  return N == 32 ? bits : bits & 0xffffu;
}

/* The tensor-core backwards' last step: 8 elements of dq at p (16-byte aligned) += scale * add
 * from the fp32 dQ accumulator (overwrite: = scale * add, dq not read). */
template <typename T>
__device__ __forceinline__ void add_dq8(T *p, const float (&add)[8], float scale,
                                        bool overwrite) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (!overwrite) v = *reinterpret_cast<const uint4 *>(p);
  T *x = reinterpret_cast<T *>(&v);
#pragma unroll
  for (int e = 0; e < 8; e++) x[e] = nt_from_f<T>(nt_to_f(x[e]) + add[e] * scale);
  *reinterpret_cast<uint4 *>(p) = v;
}

}  // namespace nt_attn

#endif
