// 4-element loads and stores for the fused optimizer kernels: 16-byte accesses for fp32 and
// 8-byte ones for f16/bf16, with the conversions of ops/cuda_dtype.cuh. The optimizer touches
// every byte once per step (GBs, far more than L2), so the vector accesses are cache-streaming (evict
// first: __ldcs / __stcs). Private.
#ifndef NT_OPTIM_VEC_ACCESS_CUH
#define NT_OPTIM_VEC_ACCESS_CUH
#include <stdint.h>
#include "ops/cuda_dtype.cuh"

namespace nt_vec {

template <typename T> struct raw4;
template <> struct raw4<float> { typedef float4 type; };
template <> struct raw4<__half> { typedef uint2 type; };
template <> struct raw4<__nv_bfloat16> { typedef uint2 type; };

template <typename T>
__device__ __forceinline__ void load4(const T *p, float out[4]) {
  union { typename raw4<T>::type r; T e[4]; } u;
  u.r = __ldcs(reinterpret_cast<const typename raw4<T>::type *>(p));
#pragma unroll
  for (int i = 0; i < 4; i++) out[i] = nt_to_f(u.e[i]);
}

template <typename T>
__device__ __forceinline__ void store4(T *p, const float in[4]) {
  union { typename raw4<T>::type r; T e[4]; } u;
#pragma unroll
  for (int i = 0; i < 4; i++) u.e[i] = nt_from_f<T>(in[i]);
  __stcs(reinterpret_cast<typename raw4<T>::type *>(p), u.r);
}

template <typename T> __host__ __device__ __forceinline__ bool aligned4(const T *p) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0;
}

}  // namespace nt_vec
#endif
