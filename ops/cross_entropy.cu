/* Fused softmax cross-entropy: one block per row. Pass 1 streams the row once, keeping a running
 * (max, sum of exp) per thread and, when the row fits, a copy of it in shared memory; pass 2
 * writes the gradient from that copy (or re-reads the row from L2 when it is too large), so the
 * fused op moves each logit through DRAM once in each direction. */
#include "ops/memops_cuda.cuh"
#include <math.h>

namespace {

constexpr size_t kSmemRowMax = 112 * 1024; /* two blocks per SM still fit */

__device__ __forceinline__ void online_add(float &m, float &s, float v) {
  if (v == -INFINITY) return;
  if (v > m) {
    s = s * __expf(m - v) + 1.0f;
    m = v;
  } else {
    s += __expf(v - m);
  }
}

template <typename T, bool VEC, bool SMEM>
__global__ void ce_kernel(int V, int64_t ld, int64_t ldd, const T *logits,
                          const int32_t *__restrict__ targets,
                          const float *__restrict__ dloss_scale, float inv_count,
                          float *__restrict__ losses, T *dlogits) {
  extern __shared__ uint4 row_smem4[];
  T *cache = reinterpret_cast<T *>(row_smem4);
  __shared__ float red[32];
  __shared__ float target_logit;
  int64_t row = blockIdx.x;
  const T *x = logits + row * ld;
  int t = targets[row];
  bool bad = t != -1 && (t < 0 || t >= V);
  if (t == -1 || bad) {
    float fill = bad ? __int_as_float(0x7fc00000) : 0.0f;
    if (losses && threadIdx.x == 0) losses[row] = fill;
    if (dlogits)
      for (int c = threadIdx.x; c < V; c += blockDim.x) dlogits[row * ldd + c] = nt_from_f<T>(fill);
    return;
  }
  float m = -INFINITY, s = 0.0f;
  if (VEC) {
#pragma unroll 4
    for (int p = threadIdx.x * NT_PACK; p < V; p += blockDim.x * NT_PACK) {
      nt_raw_pack<T> raw = nt_load_raw<T>(x + p);
      if (SMEM) nt_store_raw<T>(cache + p, raw);
      float v[NT_PACK];
      nt_unpack<T>(raw, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++)
        if (p + i == t) target_logit = v[i];
      float pm = v[0];
#pragma unroll
      for (int i = 1; i < NT_PACK; i++) pm = fmaxf(pm, v[i]);
      if (pm == -INFINITY) continue; /* masked logits add nothing (and no inf - inf) */
      if (pm > m) {
        s *= __expf(m - pm);
        m = pm;
      }
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) s += __expf(v[i] - m);
    }
  } else {
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      T e = x[c];
      if (SMEM) cache[c] = e;
      float v = nt_to_f(e);
      online_add(m, s, v);
      if (c == t) target_logit = v;
    }
  }
  /* Block max, then every thread rescales its sum to it. */
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float bm = nt_warp_max(m);
  if (lane == 0) red[warp] = bm;
  __syncthreads();
  bm = nt_warp_max(lane < nwarps ? red[lane] : -INFINITY);
  float scaled = m == -INFINITY ? 0.0f : s * __expf(m - bm);
  float S = nt_block_sum(scaled, red); /* synchronizes: target_logit and cache are visible */
  float lse = bm + logf(S);
  if (losses && threadIdx.x == 0) losses[row] = lse - target_logit;
  if (!dlogits) return;
  float g = (dloss_scale ? *dloss_scale : 1.0f) * inv_count;
  const T *src = SMEM ? cache : x;
  T *dst = dlogits + row * ldd;
  if (VEC) {
    for (int p = threadIdx.x * NT_PACK; p < V; p += blockDim.x * NT_PACK) {
      float v[NT_PACK];
      nt_load8(src + p, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++)
        v[i] = (__expf(v[i] - lse) - (p + i == t ? 1.0f : 0.0f)) * g;
      nt_store8(dst + p, v);
    }
  } else {
    for (int c = threadIdx.x; c < V; c += blockDim.x)
      dst[c] = nt_from_f<T>((__expf(nt_to_f(src[c]) - lse) - (c == t ? 1.0f : 0.0f)) * g);
  }
}

template <typename T, bool VEC, bool SMEM>
nt_status launch_v(nt_ctx *ctx, int64_t N, int V, int64_t ld, int64_t ldd, const T *logits,
                   const int32_t *tgt, const float *scale, float inv_count, float *losses,
                   T *dlogits) {
  int threads = (V / (2 * NT_PACK) + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  if (threads > 1024) threads = 1024;
  size_t smem = SMEM ? (size_t)V * sizeof(T) : 0;
  auto kernel = ce_kernel<T, VEC, SMEM>;
  if (SMEM && smem > 48 * 1024) {
    nt_status st = NT_CUDA(ctx, cudaFuncSetAttribute(kernel,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)smem));
    if (st) return st;
  }
  kernel<<<(unsigned)N, threads, smem, nt_cuda_stream(ctx)>>>(V, ld, ldd, logits, tgt, scale,
                                                               inv_count, losses, dlogits);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status launch(nt_ctx *ctx, int64_t N, int V, int64_t ld, int64_t ldd, const T *logits,
                 const int32_t *tgt, const float *scale, float inv_count, float *losses,
                 T *dlogits) {
  bool vec = V % NT_PACK == 0 && ld % NT_PACK == 0 && nt_aligned16(logits) &&
             (!dlogits || (ldd % NT_PACK == 0 && nt_aligned16(dlogits)));
  /* Forward alone reads each logit once: no copy needed. */
  bool smem = dlogits && (size_t)V * sizeof(T) <= kSmemRowMax;
  if (vec && smem)
    return launch_v<T, true, true>(ctx, N, V, ld, ldd, logits, tgt, scale, inv_count, losses,
                                   dlogits);
  if (vec)
    return launch_v<T, true, false>(ctx, N, V, ld, ldd, logits, tgt, scale, inv_count, losses,
                                    dlogits);
  if (smem)
    return launch_v<T, false, true>(ctx, N, V, ld, ldd, logits, tgt, scale, inv_count, losses,
                                    dlogits);
  return launch_v<T, false, false>(ctx, N, V, ld, ldd, logits, tgt, scale, inv_count, losses,
                                   dlogits);
}

} // namespace

nt_status nt_cross_entropy_cuda(nt_ctx *ctx, const nt_tensor *logits, int64_t ld,
                                const nt_tensor *targets, const float *dloss_scale, int64_t count,
                                nt_tensor *losses, nt_tensor *dlogits, int64_t ldd) {
  int64_t V = logits->shape[logits->ndim - 1], N = nt_tensor_numel(logits) / V;
  if (N == 0) return NT_OK;
  if (V > INT32_MAX / 2 || N > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "cross_entropy: %lld x %lld logits are too large",
                    (long long)N, (long long)V);
  float inv_count = dlogits ? (float)(1.0 / (double)count) : 0.0f;
  float *lp = losses ? (float *)losses->data : nullptr;
  nt_status st = NT_ERR_INTERNAL;
  NT_DISPATCH_FLOAT(logits->dtype, T,
                    st = launch<T>(ctx, N, (int)V, ld, ldd, (const T *)logits->data,
                                   (const int32_t *)targets->data, dloss_scale, inv_count, lp,
                                   dlogits ? (T *)dlogits->data : (T *)nullptr));
  return st;
}
