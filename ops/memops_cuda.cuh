/* Private device helpers for the memory-bound kernels: fp32 <-> storage conversions, 8-element
 * packs moved with 16-byte accesses, warp/block reductions, dtype dispatch. */
#ifndef NT_OPS_MEMOPS_CUDA_CUH
#define NT_OPS_MEMOPS_CUDA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "core/cuda_util.h"
#include "ops/cuda_dtype.cuh"
#include "ops/memops_impl.h"
#include "ops/pdl.cuh"

/* Elements per pack: 16 bytes of a 16-bit type, 32 bytes (two accesses) of fp32. */
#define NT_PACK 8

/* Raw storage of one pack: NT_PACK elements of T as 16-byte words. */
template <typename T> struct nt_raw_pack {
  static constexpr int WORDS = NT_PACK * (int)sizeof(T) / 16;
  uint4 w[WORDS];
};

/* p must be 16-byte aligned. */
template <typename T> __device__ __forceinline__ nt_raw_pack<T> nt_load_raw(const T *p) {
  nt_raw_pack<T> r;
  const uint4 *q = reinterpret_cast<const uint4 *>(p);
#pragma unroll
  for (int k = 0; k < nt_raw_pack<T>::WORDS; k++) r.w[k] = q[k];
  return r;
}
template <typename T> __device__ __forceinline__ void nt_store_raw(T *p, const nt_raw_pack<T> &r) {
  uint4 *q = reinterpret_cast<uint4 *>(p);
#pragma unroll
  for (int k = 0; k < nt_raw_pack<T>::WORDS; k++) q[k] = r.w[k];
}
template <typename T>
__device__ __forceinline__ void nt_unpack(const nt_raw_pack<T> &r, float *v) {
  const T *e = reinterpret_cast<const T *>(r.w);
#pragma unroll
  for (int i = 0; i < NT_PACK; i++) v[i] = nt_to_f(e[i]);
}
template <typename T> __device__ __forceinline__ nt_raw_pack<T> nt_pack_from(const float *v) {
  nt_raw_pack<T> r;
  T *e = reinterpret_cast<T *>(r.w);
#pragma unroll
  for (int i = 0; i < NT_PACK; i++) e[i] = nt_from_f<T>(v[i]);
  return r;
}
template <typename T> __device__ __forceinline__ void nt_load8(const T *p, float *v) {
  nt_unpack<T>(nt_load_raw<T>(p), v);
}
template <typename T> __device__ __forceinline__ void nt_store8(T *p, const float *v) {
  nt_store_raw<T>(p, nt_pack_from<T>(v));
}

/* A: float, or double where a sum must stay exact longer (ops/reduce.cu). */
template <typename A> __device__ __forceinline__ A nt_warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float nt_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024), the same on every thread;
 * a fixed tree, so the result is deterministic. `scratch` holds 32 values. */
template <typename A> __device__ __forceinline__ A nt_block_sum(A v, A *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = nt_warp_sum(v);
  __syncthreads(); /* scratch may still be read by a previous call */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : A(0);
  return nt_warp_sum(v);
}

__host__ __device__ static inline bool nt_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Whether the memory-bound kernels launch with programmatic dependent launch (ops/pdl.cuh):
 * the context's option pdl, on sm_90 or newer. */
static inline bool nt_pdl_on(nt_ctx *ctx) {
  int major = 0;
  return nt_ctx_opts(ctx)->pdl &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                nt_ctx_device(ctx).index) == cudaSuccess &&
         major >= 9;
}

/* Number of SMs of the context's device (for grid-stride launches). */
static inline int nt_sm_count(nt_ctx *ctx) {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, nt_ctx_device(ctx).index) !=
          cudaSuccess ||
      n <= 0)
    n = 132;
  return n;
}

/* Runs the statement with T bound to the storage type of a float dtype. */
#define NT_DISPATCH_FLOAT(dt, T, ...)                          \
  switch (dt) {                                                \
  case NT_F32: { typedef float T; __VA_ARGS__; } break;        \
  case NT_F16: { typedef __half T; __VA_ARGS__; } break;       \
  case NT_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break; \
  default: break;                                              \
  }

#endif
