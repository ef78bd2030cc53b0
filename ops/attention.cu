/* Causal attention on CUDA: dispatch between the tensor-core kernels (attention_fwd.cu,
 * attention_bwd.cu: F16/BF16 with D 32 or 64) and the simple kernels below (every dtype,
 * D <= 128; also chosen with NT_ATTN_SIMPLE=1 so a fast-path bug can be isolated).
 * The simple kernels give one warp per row and walk the other side's rows with an online
 * softmax: no T x T matrix, fp32 math, each output row owned by one warp (no atomics). */
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "ops/attention.h"
#include "ops/attention_cuda.cuh"
#include "core/cuda_util.h"

namespace {

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

template <typename T>
__device__ __forceinline__ void add_lane(T *row, int D, int lane, const float *x, float mul) {
#pragma unroll
  for (int r = 0; r < kMaxPerLane; r++) {
    const int d = lane + 32 * r;
    if (d < D) row[d] = nt_from_f<T>(nt_to_f(row[d]) + x[r] * mul);
  }
}

template <typename T>
__global__ void simple_forward(const T *q, const T *k, const T *v, T *out, float *lse, int BH,
                               int T_, int D, float scale) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int i = (int)(row % T_);
  const long base = row - i;   /* first row of this (b, h) */
  float qi[kMaxPerLane], o[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f}, kv[kMaxPerLane];
  load_lane(q + row * D, D, lane, qi);
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= i; j++) {
    load_lane(k + (base + j) * D, D, lane, kv);
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) s += qi[r] * kv[r];
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    load_lane(v + (base + j) * D, D, lane, kv);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) o[r] = o[r] * corr + p * kv[r];
    m = m_new;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int r = 0; r < kMaxPerLane; r++) {
    const int d = lane + 32 * r;
    if (d < D) out[row * D + d] = nt_from_f<T>(o[r] * inv);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

/* d_rows[row] = sum_d dO * O: the softmax-backward correction term, shared by both paths. */
template <typename T>
__global__ void row_dot(const T *dout, const T *out, float *d_rows, long rows, int D) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32)
    acc += nt_to_f(dout[row * D + d]) * nt_to_f(out[row * D + d]);
  acc = warp_sum(acc);
  if (lane == 0) d_rows[row] = acc;
}

template <typename T>
__global__ void simple_backward_dq(const T *dout, const T *q, const T *k, const T *v,
                                   const float *lse, const float *d_rows, T *dq, int BH, int T_,
                                   int D, float scale) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int i = (int)(row % T_);
  const long base = row - i;
  float qi[kMaxPerLane], doi[kMaxPerLane], kj[kMaxPerLane], vj[kMaxPerLane];
  float acc[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f};
  load_lane(q + row * D, D, lane, qi);
  load_lane(dout + row * D, D, lane, doi);
  const float L = lse[row], Di = d_rows[row];
  for (int j = 0; j <= i; j++) {
    load_lane(k + (base + j) * D, D, lane, kj);
    load_lane(v + (base + j) * D, D, lane, vj);
    float s = 0.f, dp = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      s += qi[r] * kj[r];
      dp += doi[r] * vj[r];
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    const float ds = __expf(s * scale - L) * (dp - Di);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) acc[r] += ds * kj[r];
  }
  add_lane(dq + row * D, D, lane, acc, scale);
}

template <typename T>
__global__ void simple_backward_dkv(const T *dout, const T *q, const T *k, const T *v,
                                    const float *lse, const float *d_rows, T *dk, T *dv, int BH,
                                    int T_, int D, float scale) {
  const int lane = threadIdx.x & 31;
  const long row = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= (long)BH * T_) return;
  const int j = (int)(row % T_);
  const long base = row - j;
  float kj[kMaxPerLane], vj[kMaxPerLane], qi[kMaxPerLane], doi[kMaxPerLane];
  float gk[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f}, gv[kMaxPerLane] = {0.f, 0.f, 0.f, 0.f};
  load_lane(k + row * D, D, lane, kj);
  load_lane(v + row * D, D, lane, vj);
  for (int i = j; i < T_; i++) {
    load_lane(q + (base + i) * D, D, lane, qi);
    load_lane(dout + (base + i) * D, D, lane, doi);
    float s = 0.f, dp = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      s += qi[r] * kj[r];
      dp += doi[r] * vj[r];
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    const float p = __expf(s * scale - lse[base + i]);
    const float ds = p * (dp - d_rows[base + i]);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; r++) {
      gv[r] += p * doi[r];
      gk[r] += ds * qi[r];
    }
  }
  add_lane(dk + row * D, D, lane, gk, scale);
  add_lane(dv + row * D, D, lane, gv, 1.f);
}

/* Tensor-core path, before the backward kernel: d_rows = rowsum(dO * O) and dq_acc = 0 in
 * one pass of 16-byte pieces (8 elements per thread, D / 8 adjacent lanes per row; D is 32
 * or 64 and every row 16-byte aligned there). */
template <typename T, int D>
__global__ void prep_rows_vec(const T *__restrict__ dout, const T *__restrict__ out,
                              float *__restrict__ d_rows, float *__restrict__ dq_acc,
                              long rows) {
  constexpr int kLanes = D / 8;
  const long piece = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const long row = piece / kLanes;
  float acc = 0.f;
  if (row < rows) {
    const uint4 a = reinterpret_cast<const uint4 *>(dout)[piece];
    const uint4 b = reinterpret_cast<const uint4 *>(out)[piece];
    const T *x = reinterpret_cast<const T *>(&a), *y = reinterpret_cast<const T *>(&b);
#pragma unroll
    for (int e = 0; e < 8; e++) acc += nt_to_f(x[e]) * nt_to_f(y[e]);
    float4 *z = reinterpret_cast<float4 *>(dq_acc) + 2 * piece;
    z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  /* kLanes divides 32 and rows start at multiples of kLanes: the groups never straddle. */
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (row < rows && piece % kLanes == 0) d_rows[row] = acc;
}

/* dq += scale * dq_acc (the tensor-core backward accumulates dQ in fp32 with atomics), eight
 * elements per thread in 16-byte pieces (n is a multiple of 8, dq 16-byte aligned). */
template <typename T>
__global__ void dq_finish(const float *__restrict__ acc, T *__restrict__ dq, long n8,
                          float scale) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 a0 = reinterpret_cast<const float4 *>(acc)[2 * i];
  const float4 a1 = reinterpret_cast<const float4 *>(acc)[2 * i + 1];
  const float add[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  uint4 v = reinterpret_cast<const uint4 *>(dq)[i];
  T *x = reinterpret_cast<T *>(&v);
#pragma unroll
  for (int e = 0; e < 8; e++) x[e] = nt_from_f<T>(nt_to_f(x[e]) + add[e] * scale);
  reinterpret_cast<uint4 *>(dq)[i] = v;
}

/* [B, T, parts * H * D] <-> parts x [B, H, T, D]; one thread per element of the packed side.
 * accumulate: the destination is added to (backward). */
template <typename T>
__global__ void permute_heads(T *packed, T *p0, T *p1, T *p2, int nparts, long B, int T_, int H,
                              int D, bool to_parts, bool accumulate) {
  const long C = (long)H * D, row = nparts * C;
  const long n = B * T_ * row;
  for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += (long)gridDim.x * blockDim.x) {
    const long c = idx % row, bt = idx / row;
    const int t = (int)(bt % T_);
    const long b = bt / T_;
    const int part = (int)(c / C), h = (int)((c % C) / D), d = (int)(c % D);
    T *hp = part == 0 ? p0 : part == 1 ? p1 : p2;
    const long ih = ((b * H + h) * T_ + t) * D + d;
    T *dst = to_parts ? hp + ih : packed + idx;
    const T src = to_parts ? packed[idx] : hp[ih];
    *dst = accumulate ? nt_from_f<T>(nt_to_f(*dst) + nt_to_f(src)) : src;
  }
}

unsigned rows_grid(long rows) { return (unsigned)((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

bool aligned16(const nt_tensor *t) { return ((uintptr_t)t->data & 15) == 0; }

/* The tensor-core kernels move 16-byte pieces: they need aligned rows as well as a
 * supported dtype and D. */
bool use_mma(const nt_tensor *const *ts, int n) {
  const nt_tensor *q = ts[0];
  if (!nt_attention_mma_supported(q->dtype, (int)q->shape[3])) return false;
  for (int i = 0; i < n; i++)
    if (!aligned16(ts[i])) return false;
  const char *e = getenv("NT_ATTN_SIMPLE");
  return !(e && *e && strcmp(e, "0") != 0);
}


template <typename T>
nt_status forward_simple(nt_ctx *ctx, const nt_tensor *q, const nt_tensor *k, const nt_tensor *v,
                         nt_tensor *out, nt_tensor *lse) {
  const int BH = (int)(q->shape[0] * q->shape[1]), T_ = (int)q->shape[2], D = (int)q->shape[3];
  simple_forward<T><<<rows_grid((long)BH * T_), 32 * kWarpsPerBlock, 0, nt_cuda_stream(ctx)>>>(
      (const T *)q->data, (const T *)k->data, (const T *)v->data, (T *)out->data,
      (float *)lse->data, BH, T_, D, 1.f / sqrtf((float)D));
  return NT_CUDA_LAUNCHED(ctx);
}

/* Tensor-core backward (F16/BF16 only): one pass prepares d_rows and the zeroed dQ
 * accumulator, the kernel adds into it, a last pass folds it into dq; all three move 16-byte
 * pieces. */
template <typename T>
nt_status backward_mma_path(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                            const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                            const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                            float *d_rows) {
  if constexpr (sizeof(T) != 2) {
    return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: tensor-core backward needs F16/BF16");
  } else {
    const int BH = (int)(q->shape[0] * q->shape[1]), T_ = (int)q->shape[2];
    const int D = (int)q->shape[3];
    const long rows = (long)BH * T_, n8 = rows * D / 8;
    const unsigned grid = (unsigned)((n8 + 255) / 256);
    cudaStream_t s = nt_cuda_stream(ctx);
    float *dq_acc = NULL;
    nt_status st = nt_alloc(ctx, sizeof(float) * (size_t)rows * (size_t)D, (void **)&dq_acc);
    if (st) return st;
    if (D == 64)
      prep_rows_vec<T, 64><<<grid, 256, 0, s>>>((const T *)dout->data, (const T *)out->data,
                                                d_rows, dq_acc, rows);
    else
      prep_rows_vec<T, 32><<<grid, 256, 0, s>>>((const T *)dout->data, (const T *)out->data,
                                                d_rows, dq_acc, rows);
    if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
    st = nt_attention_backward_mma(ctx, q->dtype, dout->data, q->data, k->data, v->data,
                                   (const float *)lse->data, d_rows, dq_acc, dk->data, dv->data,
                                   BH, T_, D);
    if (st) goto done;
    dq_finish<T><<<grid, 256, 0, s>>>(dq_acc, (T *)dq->data, n8, 1.f / sqrtf((float)D));
    st = NT_CUDA_LAUNCHED(ctx);
  done:
    /* The pool reuses blocks in stream order, so freeing right after queueing is safe. */
    nt_free(ctx, dq_acc);
    return st;
  }
}

template <typename T>
nt_status backward_all(nt_ctx *ctx, const nt_tensor *dout, const nt_tensor *q,
                       const nt_tensor *k, const nt_tensor *v, const nt_tensor *out,
                       const nt_tensor *lse, nt_tensor *dq, nt_tensor *dk, nt_tensor *dv,
                       bool mma) {
  const int BH = (int)(q->shape[0] * q->shape[1]), T_ = (int)q->shape[2], D = (int)q->shape[3];
  const long rows = (long)BH * T_;
  const float scale = 1.f / sqrtf((float)D);
  cudaStream_t s = nt_cuda_stream(ctx);
  float *d_rows = NULL;
  nt_status st = nt_alloc(ctx, sizeof(float) * (size_t)rows, (void **)&d_rows);
  if (st) return st;
  if (mma) {
    st = backward_mma_path<T>(ctx, dout, q, k, v, out, lse, dq, dk, dv, d_rows);
  } else {
    row_dot<T><<<rows_grid(rows), 32 * kWarpsPerBlock, 0, s>>>(
        (const T *)dout->data, (const T *)out->data, d_rows, rows, D);
    if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
    simple_backward_dq<T><<<rows_grid(rows), 32 * kWarpsPerBlock, 0, s>>>(
        (const T *)dout->data, (const T *)q->data, (const T *)k->data, (const T *)v->data,
        (const float *)lse->data, d_rows, (T *)dq->data, BH, T_, D, scale);
    if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
    simple_backward_dkv<T><<<rows_grid(rows), 32 * kWarpsPerBlock, 0, s>>>(
        (const T *)dout->data, (const T *)q->data, (const T *)k->data, (const T *)v->data,
        (const float *)lse->data, d_rows, (T *)dk->data, (T *)dv->data, BH, T_, D, scale);
    st = NT_CUDA_LAUNCHED(ctx);
  }
done:
  /* The pool reuses blocks in stream order, so freeing right after queueing is safe. */
  nt_free(ctx, d_rows);
  return st;
}

template <typename T>
nt_status permute(nt_ctx *ctx, T *packed, T *p0, T *p1, T *p2, int nparts, const nt_tensor *h,
                  bool to_parts, bool accumulate) {
  const long n = nt_tensor_numel(h) * nparts;
  if (n == 0) return NT_OK;
  const long blocks = (n + 255) / 256;
  permute_heads<T><<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, nt_cuda_stream(ctx)>>>(
      packed, p0, p1, p2, nparts, h->shape[0], (int)h->shape[2], (int)h->shape[1],
      (int)h->shape[3], to_parts, accumulate);
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status permute_dispatch(nt_ctx *ctx, const nt_tensor *packed, const nt_tensor *p0,
                           const nt_tensor *p1, const nt_tensor *p2, int nparts, bool to_parts,
                           bool accumulate) {
  void *a = packed->data, *b = p0->data, *c = p1 ? p1->data : NULL, *d = p2 ? p2->data : NULL;
  switch (packed->dtype) {
    case NT_F32: return permute<float>(ctx, (float *)a, (float *)b, (float *)c, (float *)d,
                                       nparts, p0, to_parts, accumulate);
    case NT_F16: return permute<__half>(ctx, (__half *)a, (__half *)b, (__half *)c, (__half *)d,
                                        nparts, p0, to_parts, accumulate);
    case NT_BF16:
      return permute<__nv_bfloat16>(ctx, (__nv_bfloat16 *)a, (__nv_bfloat16 *)b,
                                    (__nv_bfloat16 *)c, (__nv_bfloat16 *)d, nparts, p0, to_parts,
                                    accumulate);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "attention layout: unsupported dtype");
  }
}

}  // namespace

extern "C" nt_status nt_attention_forward_cuda(nt_ctx *ctx, const nt_tensor *q,
                                               const nt_tensor *k, const nt_tensor *v,
                                               nt_tensor *out, nt_tensor *lse) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  const int D = (int)q->shape[3];
  const nt_tensor *ts[4] = {q, k, v, out};
  if (use_mma(ts, 4))
    return nt_attention_forward_mma(ctx, q->dtype, q->data, k->data, v->data, out->data,
                                    (float *)lse->data, (int)(q->shape[0] * q->shape[1]),
                                    (int)q->shape[2], D);
  switch (q->dtype) {
    case NT_F32: return forward_simple<float>(ctx, q, k, v, out, lse);
    case NT_F16: return forward_simple<__half>(ctx, q, k, v, out, lse);
    case NT_BF16: return forward_simple<__nv_bfloat16>(ctx, q, k, v, out, lse);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "attention: unsupported dtype");
  }
}

extern "C" nt_status nt_attention_backward_cuda(nt_ctx *ctx, const nt_tensor *dout,
                                                const nt_tensor *q, const nt_tensor *k,
                                                const nt_tensor *v, const nt_tensor *out,
                                                const nt_tensor *lse, nt_tensor *dq,
                                                nt_tensor *dk, nt_tensor *dv) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  const nt_tensor *ts[8] = {q, k, v, out, dout, dq, dk, dv};
  const bool mma = use_mma(ts, 8);
  switch (q->dtype) {
    case NT_F32: return backward_all<float>(ctx, dout, q, k, v, out, lse, dq, dk, dv, false);
    case NT_F16: return backward_all<__half>(ctx, dout, q, k, v, out, lse, dq, dk, dv, mma);
    case NT_BF16:
      return backward_all<__nv_bfloat16>(ctx, dout, q, k, v, out, lse, dq, dk, dv, mma);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "attention: unsupported dtype");
  }
}

extern "C" nt_status nt_qkv_split_cuda(nt_ctx *ctx, const nt_tensor *qkv, nt_tensor *q,
                                       nt_tensor *k, nt_tensor *v) {
  nt_status st = nt_cuda_set_device(ctx);
  return st ? st : permute_dispatch(ctx, qkv, q, k, v, 3, true, false);
}

extern "C" nt_status nt_qkv_split_backward_cuda(nt_ctx *ctx, const nt_tensor *dq,
                                                const nt_tensor *dk, const nt_tensor *dv,
                                                nt_tensor *dqkv) {
  nt_status st = nt_cuda_set_device(ctx);
  return st ? st : permute_dispatch(ctx, dqkv, dq, dk, dv, 3, false, true);
}

extern "C" nt_status nt_heads_merge_cuda(nt_ctx *ctx, const nt_tensor *o, nt_tensor *y) {
  nt_status st = nt_cuda_set_device(ctx);
  return st ? st : permute_dispatch(ctx, y, o, NULL, NULL, 1, false, false);
}

extern "C" nt_status nt_heads_merge_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                                  nt_tensor *do_) {
  nt_status st = nt_cuda_set_device(ctx);
  return st ? st : permute_dispatch(ctx, dy, do_, NULL, NULL, 1, true, true);
}
