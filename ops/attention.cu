/* Causal attention on CUDA: dispatch between the tensor-core kernels (attention_fwd.cu,
 * attention_bwd.cu: F16/BF16 with D 32 or 64 and 16-byte aligned rows) and the simple kernels
 * below (every dtype, D <= 128, any strides; also chosen with the option attn_simple so a
 * fast-path bug can be isolated). The simple kernels give one warp per row and walk the other side's
 * rows with an online softmax: no T x T matrix, fp32 math, each output row owned by one warp
 * (no atomics). With dropout (kDrop instantiations) they read the keep bits of a row's
 * consecutive keys 512 at a time: one Philox block per lane, one shuffle per key. */
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "ops/attention.h"
#include "ops/attention_cuda.cuh"
#include "ops/attention_dq_pair.h"
#include "ops/pdl.cuh"
#include "ops/wgmma.cuh"
#include "core/cuda_util.h"

namespace {

using nt_attn::head_off;
using nt_attn::philox_block;

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 4;   /* D <= 128 = 32 lanes * 4 */

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename T>
__device__ __forceinline__ void load_lane(const T *row, int D, int lane, float *x) {
#pragma unroll
  for (int r = 0; r < kMaxPerLane; r++) {
    const int d = lane + 32 * r;
    x[r] = d < D ? nt_to_f(row[d]) : 0.f;
  }
}

/* row += x * mul, or row = x * mul with overwrite. */
template <typename T>
__device__ __forceinline__ void add_lane(T *row, int D, int lane, const float *x, float mul,
                                         bool overwrite) {
#pragma unroll
  for (int r = 0; r < kMaxPerLane; r++) {
    const int d = lane + 32 * r;
    if (d < D) row[d] = nt_from_f<T>((overwrite ? 0.f : nt_to_f(row[d])) + x[r] * mul);
  }
}

template <typename T> __device__ __forceinline__ const T *crow(const nt_attn_view &v, long bh,
                                                               int H, long t) {
  return static_cast<const T *>(v.p) + head_off(v, bh, H) + t * v.st;
}
template <typename T> __device__ __forceinline__ T *wrow(const nt_attn_view &v, long bh, int H,
                                                         long t) {
  return static_cast<T *>(v.p) + head_off(v, bh, H) + t * v.st;
}

/* Keep bits of one row's keys j = 0, 1, 2, ... (mask indices first + j) visited in order by
 * a whole warp: every 512 keys the lanes draw 32 consecutive Philox blocks, one each (16 keys'
 * bits per lane), and key j's bit comes from the lane holding it with one shuffle. */
struct keep_run {
  unsigned long long b0;   /* block of key 0 */
  int a;                   /* key 0's byte in it */
  uint32_t bits;           /* this lane's block's 16 keep bits */

  __device__ __forceinline__ void start(unsigned long long first) {
    b0 = first >> 4;
    a = (int)(first & 15);
  }
  /* Warp-uniform j, visited in increasing order from 0. */
  __device__ __forceinline__ bool keep(const nt_attn_drop &dr, int j, int lane) {
    const int r = a + j;   /* position from byte 0 of block b0 */
    if (j == 0 || (r & 511) == 0) {
      const unsigned long long blk = b0 + (unsigned)((r >> 4) & ~31) + (unsigned)lane;
      bits = nt_attn::keep16(philox_block(dr.seed, blk), dr.thr4);
    }
    return (__shfl_sync(0xffffffffu, bits, (r >> 4) & 31) >> (r & 15)) & 1u;
  }
};

/* Keep bits of one key column's queries i0 .. i0 + 31 (mask indices col_first + i * T): lane
 * L draws query i0 + L's block and tests its byte, a ballot spreads the bits. */
__device__ __forceinline__ uint32_t keep_column32(const nt_attn_drop &dr,
                                                  unsigned long long col_first, int i0, int T_,
                                                  int lane) {
  const unsigned long long n = col_first + (unsigned long long)(i0 + lane) * T_;
  const uint4 x = philox_block(dr.seed, n >> 4);
  const int w = (int)((n >> 2) & 3);
  const uint32_t u = w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w;
  return __ballot_sync(0xffffffffu, ((u >> (8 * (n & 3))) & 0xffu) >= (dr.thr4 & 0xffu));
}

template <typename T, bool kDrop>
__global__ void simple_forward(nt_attn_view qv, nt_attn_view kv, nt_attn_view vv,
                               nt_attn_view ov, float *lse, int BH, int H, int T_, int D,
                               float scale, nt_attn_drop dr) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int i = (int)(row % T_);
  const long bh = row / T_;
  float qi[kMaxPerLane], o[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f}, kv_[kMaxPerLane];
  load_lane(crow<T>(qv, bh, H, i), D, lane, qi);
  keep_run kr;
  if (kDrop) kr.start(nt_attn::drop_origin(dr) + (unsigned long long)row * T_);
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= i; j++) {
    load_lane(crow<T>(kv, bh, H, j), D, lane, kv_);
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) s += qi[r] * kv_[r];
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;   /* the normaliser sees every probability, dropped or not */
    const float pk = !kDrop || kr.keep(dr, j, lane) ? p : 0.f;
    load_lane(crow<T>(vv, bh, H, j), D, lane, kv_);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) o[r] = o[r] * corr + pk * kv_[r];
    m = m_new;
  }
  const float inv = (kDrop ? dr.rp : 1.f) / l;
  T *out = wrow<T>(ov, bh, H, i);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; r++) {
    const int d = lane + 32 * r;
    if (d < D) out[d] = nt_from_f<T>(o[r] * inv);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

/* d_rows[row] = sum_d dO * O: the softmax-backward correction term, shared by both paths
 * (O is the dropped output with dropout: see ops/attention.c). */
template <typename T>
__global__ void row_dot(nt_attn_view dov, nt_attn_view ov, float *d_rows, long rows, int H,
                        int T_, int D) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const long bh = row / T_, t = row % T_;
  const T *dout = crow<T>(dov, bh, H, t), *out = crow<T>(ov, bh, H, t);
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += nt_to_f(dout[d]) * nt_to_f(out[d]);
  acc = warp_sum(acc);
  if (lane == 0) d_rows[row] = acc;
}

/* With dropout every probability has a factor mr (0 dropped, 1 / (1 - p_eff) kept):
 * dS = P * (dP * mr - D), dV += P * mr * dO. */
template <typename T, bool kDrop>
__global__ void simple_backward_dq(nt_attn_view dov, nt_attn_view qv, nt_attn_view kv,
                                   nt_attn_view vv, const float *lse, const float *d_rows,
                                   nt_attn_view dqv, int BH, int H, int T_, int D, float scale,
                                   nt_attn_drop dr, bool overwrite) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int i = (int)(row % T_);
  const long bh = row / T_;
  float qi[kMaxPerLane], doi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane];
  float acc[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f};
  load_lane(crow<T>(qv, bh, H, i), D, lane, qi);
  load_lane(crow<T>(dov, bh, H, i), D, lane, doi);
  keep_run kr;
  if (kDrop) kr.start(nt_attn::drop_origin(dr) + (unsigned long long)row * T_);
  const float L = lse[row], Di = d_rows[row];
  for (int j = 0; j <= i; j++) {
    load_lane(crow<T>(kv, bh, H, j), D, lane, kj);
    load_lane(crow<T>(vv, bh, H, j), D, lane, vj);
    float s = 0.f, dp = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      s += qi[r] * kj[r];
      dp += doi[r] * vj[r];
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    if (kDrop) dp *= kr.keep(dr, j, lane) ? dr.rp : 0.f;
    const float ds = __expf(s * scale - L) * (dp - Di);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) acc[r] += ds * kj[r];
  }
  add_lane(wrow<T>(dqv, bh, H, i), D, lane, acc, scale, overwrite);
}

template <typename T, bool kDrop>
__global__ void simple_backward_dkv(nt_attn_view dov, nt_attn_view qv, nt_attn_view kv,
                                    nt_attn_view vv, const float *lse, const float *d_rows,
                                    nt_attn_view dkv, nt_attn_view dvv, int BH, int H, int T_,
                                    int D, float scale, nt_attn_drop dr, bool overwrite) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int j = (int)(row % T_);
  const long bh = row / T_, base = row - j;
  float kj[kMaxPerLane], vj[kMaxPerLane], qi[kMaxPerLane], doi[kMaxPerLane];
  float gk[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f}, gv[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f};
  load_lane(crow<T>(kv, bh, H, j), D, lane, kj);
  load_lane(crow<T>(vv, bh, H, j), D, lane, vj);
  /* Mask index of (query 0, key j); query i is i * T further. */
  const unsigned long long col_first =
      kDrop ? nt_attn::drop_origin(dr) + (unsigned long long)base * T_ + j : 0;
  uint32_t kbits = 0u;
  for (int i = j; i < T_; i++) {
    load_lane(crow<T>(qv, bh, H, i), D, lane, qi);
    load_lane(crow<T>(dov, bh, H, i), D, lane, doi);
    float s = 0.f, dp = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      s += qi[r] * kj[r];
      dp += doi[r] * vj[r];
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    float mr = 1.f;
    if (kDrop) {
      if ((i - j) % 32 == 0) kbits = keep_column32(dr, col_first, i, T_, lane);
      mr = (kbits >> ((i - j) % 32)) & 1u ? dr.rp : 0.f;
    }
    const float p = __expf(s * scale - lse[base + i]);
    const float ds = p * (dp * mr - d_rows[base + i]);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      gv[r] += p * mr * doi[r];
      gk[r] += ds * qi[r];
    }
  }
  add_lane(wrow<T>(dkv, bh, H, j), D, lane, gk, scale, overwrite);
  add_lane(wrow<T>(dvv, bh, H, j), D, lane, gv, 1.f, overwrite);
}

/* Tensor-core path, before the backward kernel: d_rows = rowsum(dO * O) and dq_acc = 0 in
 * one pass of 16-byte pieces (8 elements per thread, D / 8 adjacent lanes per row; D is 32
 * or 64 and every row 16-byte aligned there). Block b also zeroes the 64 bytes per thread of
 * dq_acc from float 4096 b that are below acc_floats (a multiple of 16), each store
 * instruction a contiguous 16 bytes per thread: the L2 then sees whole sectors. kContig:
 * dout and out are contiguous (piece i at element 8 i); otherwise each row is found through
 * the views. */
template <typename T, int D, bool kContig>
__global__ void prep_rows_vec(nt_attn_view dov, nt_attn_view ov, float *__restrict__ d_rows,
                              float *__restrict__ dq_acc, long acc_floats, long rows, int H,
                              int T_) {
  constexpr int kLanes = D / 8;
  const long piece = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const long row = piece / kLanes;
  float acc = 0.f;
  pdl_wait();
  pdl_trigger();
  {
    const long z0 = 4l * blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (4 * (z0 + i * blockDim.x) < acc_floats)
        reinterpret_cast<float4 *>(dq_acc)[z0 + i * blockDim.x] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (row < rows) {
    const T *dout = static_cast<const T *>(dov.p), *out = static_cast<const T *>(ov.p);
    if (kContig) {
      dout += piece * 8;
      out += piece * 8;
    } else {
      const long bh = row / T_, t = row % T_;
      const int col = (int)(piece % kLanes) * 8;
      dout += head_off(dov, bh, H) + t * dov.st + col;
      out += head_off(ov, bh, H) + t * ov.st + col;
    }
    const uint4 a = *reinterpret_cast<const uint4 *>(dout);
    const uint4 b = *reinterpret_cast<const uint4 *>(out);
    const T *x = reinterpret_cast<const T *>(&a), *y = reinterpret_cast<const T *>(&b);
#pragma unroll
    for (int e = 0; e < 8; e++) acc += nt_to_f(x[e]) * nt_to_f(y[e]);
  }
  /* kLanes divides 32 and rows start at multiples of kLanes: the groups never straddle. */
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (row < rows && piece % kLanes == 0) d_rows[row] = acc;
}

/* dq += scale * dq_acc (overwrite: dq = scale * dq_acc); the tensor-core backward accumulates
 * dQ in fp32 with atomics. Eight elements per thread in 16-byte pieces (rows of D elements,
 * 16-byte aligned); kContig: dq contiguous, else its rows are found through the view. */
template <typename T, int D, bool kContig>
__global__ void dq_finish(const float *__restrict__ acc, nt_attn_view dqv, long n8, int H, int T_,
                          float scale, bool overwrite) {
  constexpr int kLanes = D / 8;
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  T *dq = static_cast<T *>(dqv.p);
  if (kContig) {
    dq += i * 8;
  } else {
    const long row = i / kLanes, bh = row / T_, t = row % T_;
    dq += head_off(dqv, bh, H) + t * dqv.st + (int)(i % kLanes) * 8;
  }
  const float4 a0 = reinterpret_cast<const float4 *>(acc)[2 * i];
  const float4 a1 = reinterpret_cast<const float4 *>(acc)[2 * i + 1];
  const float add[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  nt_attn::add_dq8(dq, add, scale, overwrite);
}

unsigned rows_grid(long rows) { return (unsigned)((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

nt_attn_view view_of(const nt_tensor *t) {
  return nt_attn_view{t->data, t->stride[0], t->stride[1], t->stride[2]};
}

/* Every row of the view starts on a 16-byte boundary (the data pointer and the stride of
 * each dim that has more than one index), and the row stride fits the kernels' int. */
bool rows_aligned16(const nt_tensor *t) {
  if ((uintptr_t)t->data & 15) return false;
  const int64_t es = (int64_t)nt_dtype_size(t->dtype);
  for (int d = 0; d < 3; d++)
    if (t->shape[d] > 1 && (t->stride[d] * es) % 16 != 0) return false;
  return t->stride[2] > -INT32_MAX && t->stride[2] < INT32_MAX;
}

/* The tensor-core kernels move 16-byte pieces: they need aligned rows as well as a
 * supported dtype and D, and the context's option attn_simple off. */
bool use_mma(nt_ctx *ctx, const nt_tensor *const *ts, int n) {
  const nt_tensor *q = ts[0];
  if (!nt_attention_mma_supported(q->dtype, (int)q->shape[3])) return false;
  for (int i = 0; i < n; i++)
    if (!rows_aligned16(ts[i])) return false;
  return !nt_ctx_opts(ctx)->attn_simple;
}

/* On top of use_mma: the Hopper (wgmma) kernels for D = 64 where the build and the device
 * have them, unless the option attn_wgmma asks for the mma.sync ones. */
bool use_wgmma(nt_ctx *ctx, int D) {
  if (D != 64 || !nt_ctx_opts(ctx)->attn_wgmma) return false;
  return nt_wgmma_usable(nt_cuda_stream(ctx));
}

/* Inside an RNG step o->offset is relative to the context's step base (core/ctx.h). */
nt_attn_drop drop_of(nt_ctx *ctx, const nt_attention_opts *o) {
  const float p = o->dropout;
  return nt_attn_drop{o->seed, o->offset,
                      reinterpret_cast<const unsigned long long *>(nt_ctx_rng_base(ctx)),
                      p > 0.f ? nt_attention_keep_threshold(p) * 0x01010101u : 0u,
                      p > 0.f ? (float)nt_attention_keep_scale(p) : 1.f};
}

/* Shapes and views every launcher below takes. */
struct problem {
  int BH, H, T, D;
  float scale;
  bool drop, overwrite;
  nt_attn_drop dr;
};

problem problem_of(nt_ctx *ctx, const nt_tensor *q, const nt_attention_opts *o) {
  problem pb;
  pb.H = (int)q->shape[1];
  pb.BH = (int)(q->shape[0] * q->shape[1]);
  pb.T = (int)q->shape[2];
  pb.D = (int)q->shape[3];
  pb.scale = 1.f / sqrtf((float)pb.D);
  pb.drop = o->dropout > 0.f;
  pb.overwrite = o->overwrite;
  pb.dr = drop_of(ctx, o);
  return pb;
}

template <typename T>
nt_status forward_simple(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k, const nt_tensor *v,
                         nt_tensor *out, nt_tensor *lse, const problem &pb) {
  const unsigned grid = rows_grid((long)pb.BH * pb.T);
  cudaStream_t s = nt_cuda_stream(ctx);
  if (pb.drop)
    simple_forward<T, true><<<grid, 32 * kWarpsPerBlock, 0, s>>>(
        view_of(q), view_of(k), view_of(v), view_of(out), (float *)lse->data, pb.BH, pb.H, pb.T,
        pb.D, pb.scale, pb.dr);
  else
    simple_forward<T, false><<<grid, 32 * kWarpsPerBlock, 0, s>>>(
        view_of(q), view_of(k), view_of(v), view_of(out), (float *)lse->data, pb.BH, pb.H, pb.T,
        pb.D, pb.scale, pb.dr);
  return NT_CUDA_LAUNCHED(ctx);
}

/* d_rows and the zeroed dQ accumulator (acc_floats floats; 0: the accumulator is already zero)
 * before a tensor-core backward; pdl: on sm_90 or newer (ops/pdl.cuh). */
template <typename T, int D>
nt_status prep_rows(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *out, float *d_rows,
                    float *dq_acc, long acc_floats, bool pdl, const problem &pb) {
  const long rows = (long)pb.BH * pb.T, n8 = rows * D / 8, z16 = (acc_floats + 15) / 16;
  const unsigned grid = (unsigned)(((n8 > z16 ? n8 : z16) + 255) / 256);
  auto kernel = nt_tensor_is_contiguous(dout) && nt_tensor_is_contiguous(out)
                    ? prep_rows_vec<T, D, true>
                    : prep_rows_vec<T, D, false>;
  return NT_CUDA(ctx, pdl_launch(pdl && nt_ctx_opts(ctx)->pdl, kernel, dim3(grid), dim3(256), 0,
                                 nt_cuda_stream(ctx), view_of(dout), view_of(out), d_rows,
                                 dq_acc, acc_floats, rows, pb.H, pb.T));
}

/* After the mma.sync backward: its row-ordered dQ accumulator folded into dq. */
template <typename T, int D>
nt_status finish_dq(nt_ctx *ctx, nt_tensor *dq, const float *dq_acc, const problem &pb) {
  const long n8 = (long)pb.BH * pb.T * D / 8;
  const unsigned grid = (unsigned)((n8 + 255) / 256);
  cudaStream_t s = nt_cuda_stream(ctx);
  if (nt_tensor_is_contiguous(dq))
    dq_finish<T, D, true><<<grid, 256, 0, s>>>(dq_acc, view_of(dq), n8, pb.H, pb.T, pb.scale,
                                               pb.overwrite);
  else
    dq_finish<T, D, false><<<grid, 256, 0, s>>>(dq_acc, view_of(dq), n8, pb.H, pb.T, pb.scale,
                                                pb.overwrite);
  return NT_CUDA_LAUNCHED(ctx);
}

/* Tensor-core backward (F16/BF16 only): one pass prepares d_rows and the zeroed dQ
 * accumulator, the kernel adds into it, a last pass folds it into dq (the wgmma backward
 * does that itself, from its own order); all move 16-byte pieces. The wgmma backward takes
 * its accumulator from the context's pair when it can (attention_dq_pair.h): already zero,
 * and its kernel zeroes the other one for the next call. */
template <typename T>
nt_status backward_mma_path(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                            const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                            const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                            float *d_rows, const problem &pb) {
  if constexpr (sizeof(T) != 2) {
    return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: tensor-core backward needs F16/BF16");
  } else {
    const bool wg = use_wgmma(ctx, pb.D);
    const size_t acc_floats = wg ? nt_attention_wg_dq_acc_floats(pb.BH, pb.T)
                                 : (size_t)pb.BH * pb.T * pb.D;
    float *dq_acc = NULL, *zero_next = NULL;
    nt_status st = wg ? nt_attn_dq_pair_take(ctx, acc_floats, &dq_acc, &zero_next) : NT_OK;
    const bool pair = dq_acc != NULL;
    if (!st && !pair) st = nt_alloc(ctx, sizeof(float) * acc_floats, (void **)&dq_acc);
    if (st) return st;
    const long zero_floats = pair ? 0 : (long)acc_floats;
    st = pb.D == 64 ? prep_rows<T, 64>(ctx, dout, out, d_rows, dq_acc, zero_floats, wg, pb)
                    : prep_rows<T, 32>(ctx, dout, out, d_rows, dq_acc, zero_floats, wg, pb);
    if (st) goto done;
    if (wg) {
      st = nt_attention_backward_wg(ctx, q->dtype, view_of(dout), view_of(q), view_of(k),
                                    view_of(v), (const float *)lse->data, d_rows, dq_acc,
                                    zero_next, pair ? acc_floats : 0, view_of(dq), view_of(dk),
                                    view_of(dv), pb.BH, pb.H, pb.T, pb.drop ? &pb.dr : NULL,
                                    pb.overwrite);
      goto done;
    }
    st = nt_attention_backward_mma(ctx, q->dtype, view_of(dout), view_of(q), view_of(k),
                                   view_of(v), (const float *)lse->data, d_rows, dq_acc,
                                   view_of(dk), view_of(dv), pb.BH, pb.H, pb.T, pb.D,
                                   pb.drop ? &pb.dr : NULL, pb.overwrite);
    if (st) goto done;
    st = pb.D == 64 ? finish_dq<T, 64>(ctx, dq, dq_acc, pb) : finish_dq<T, 32>(ctx, dq, dq_acc, pb);
  done:
    if (pair) {
      nt_attn_dq_pair_done(ctx, acc_floats, st == NT_OK);
    } else {
      /* The pool reuses blocks in stream order, so freeing right after queueing is safe. */
      nt_free(ctx, dq_acc);
    }
    return st;
  }
}

template <typename T, bool kDrop>
nt_status backward_simple(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                          const nt_tensor *k, const nt_tensor *v, const float *lse,
                          const float *d_rows, nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                          const problem &pb) {
  const unsigned grid = rows_grid((long)pb.BH * pb.T);
  cudaStream_t s = nt_cuda_stream(ctx);
  simple_backward_dq<T, kDrop><<<grid, 32 * kWarpsPerBlock, 0, s>>>(
      view_of(dout), view_of(q), view_of(k), view_of(v), lse, d_rows, view_of(dq), pb.BH, pb.H,
      pb.T, pb.D, pb.scale, pb.dr, pb.overwrite);
  nt_status st = NT_CUDA_LAUNCHED(ctx);
  if (st) return st;
  simple_backward_dkv<T, kDrop><<<grid, 32 * kWarpsPerBlock, 0, s>>>(
      view_of(dout), view_of(q), view_of(k), view_of(v), lse, d_rows, view_of(dk), view_of(dv),
      pb.BH, pb.H, pb.T, pb.D, pb.scale, pb.dr, pb.overwrite);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status backward_all(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                       const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                       const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                       bool mma, const problem &pb) {
  const long rows = (long)pb.BH * pb.T;
  float *d_rows = NULL;
  nt_status st = nt_alloc(ctx, sizeof(float) * (size_t)rows, (void **)&d_rows);
  if (st) return st;
  if (mma) {
    st = backward_mma_path<T>(ctx, dout, q, k, v, out, lse, dq, dk, dv, d_rows, pb);
  } else {
    row_dot<T><<<rows_grid(rows), 32 * kWarpsPerBlock, 0, nt_cuda_stream(ctx)>>>(
        view_of(dout), view_of(out), d_rows, rows, pb.H, pb.T, pb.D);
    st = NT_CUDA_LAUNCHED(ctx);
    if (!st && pb.drop)
      st = backward_simple<T, true>(ctx, dout, q, k, v, (const float *)lse->data, d_rows, dq,
                                    dk, dv, pb);
    else if (!st)
      st = backward_simple<T, false>(ctx, dout, q, k, v, (const float *)lse->data, d_rows, dq,
                                     dk, dv, pb);
  }
  /* The pool reuses blocks in stream order, so freeing right after queueing is safe. */
  nt_free(ctx, d_rows);
  return st;
}

}  // namespace

extern "C" nt_status nt_attention_forward_cuda(nt_ctx *ctx, const nt_tensor *q,
                                               const nt_tensor *k, const nt_tensor *v,
                                               nt_tensor *out, nt_tensor *lse,
                                               const nt_attention_opts *o) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  const problem pb = problem_of(ctx, q, o);
  const nt_tensor *ts[4] = {q, k, v, out};
  const bool mma = use_mma(ctx, ts, 4);
  if (mma && use_wgmma(ctx, pb.D))
    return nt_attention_forward_wg(ctx, q->dtype, view_of(q), view_of(k), view_of(v),
                                   view_of(out), (float *)lse->data, pb.BH, pb.H, pb.T,
                                   pb.drop ? &pb.dr : NULL);
  if (mma)
    return nt_attention_forward_mma(ctx, q->dtype, view_of(q), view_of(k), view_of(v),
                                    view_of(out), (float *)lse->data, pb.BH, pb.H, pb.T, pb.D,
                                    pb.drop ? &pb.dr : NULL);
  switch (q->dtype) {
    case NT_F32: return forward_simple<float>(ctx, q, k, v, out, lse, pb);
    case NT_F16: return forward_simple<__half>(ctx, q, k, v, out, lse, pb);
    case NT_BF16: return forward_simple<__nv_bfloat16>(ctx, q, k, v, out, lse, pb);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "attention: unsupported dtype");
  }
}

extern "C" nt_status nt_attention_backward_cuda(nt_ctx *ctx, const nt_tensor *dout,
                                                const nt_tensor *q, const nt_tensor *k,
                                                const nt_tensor *v, const nt_tensor *out,
                                                const nt_tensor *lse, nt_tensor *dq,
                                                nt_tensor *dk, nt_tensor *dv,
                                                const nt_attention_opts *o) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  const problem pb = problem_of(ctx, q, o);
  const nt_tensor *ts[8] = {q, k, v, out, dout, dq, dk, dv};
  const bool mma = use_mma(ctx, ts, 8);
  switch (q->dtype) {
    case NT_F32: return backward_all<float>(ctx, dout, q, k, v, out, lse, dq, dk, dv, false, pb);
    case NT_F16: return backward_all<__half>(ctx, dout, q, k, v, out, lse, dq, dk, dv, mma, pb);
    case NT_BF16:
      return backward_all<__nv_bfloat16>(ctx, dout, q, k, v, out, lse, dq, dk, dv, mma, pb);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "attention: unsupported dtype");
  }
}
