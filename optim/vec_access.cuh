// 4-element loads and stores for the fused optimizer kernels: 16-byte accesses for fp32 and
// 8-byte ones for f16/bf16, with conversions to and from fp32. The optimizer touches every byte
// once per step (GBs, far more than L2), so the vector accesses are cache-streaming (evict
// first: __ldcs / __stcs). Private.
#ifndef NT_OPTIM_VEC_ACCESS_CUH
#define NT_OPTIM_VEC_ACCESS_CUH
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace nt_vec {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T> struct raw4;
template <> struct raw4<float> { typedef float4 type; };
template <> struct raw4<__half> { typedef uint2 type; };
template <> struct raw4<__nv_bfloat16> { typedef uint2 type; };

template <typename T>
__device__ __forceinline__ void load4(const T *p, float out[4]) {
  union { typename raw4<T>::type r; T e[4]; } u;
  u.r = __ldcs(reinterpret_cast<const typename raw4<T>::type *>(p));
#pragma unroll
  for (int i = 0; i < 4; i++) out[i] = to_f(u.e[i]);
}

template <typename T>
__device__ __forceinline__ void store4(T *p, const float in[4]) {
  union { typename raw4<T>::type r; T e[4]; } u;
#pragma unroll
  for (int i = 0; i < 4; i++) u.e[i] = from_f<T>(in[i]);
  __stcs(reinterpret_cast<typename raw4<T>::type *>(p), u.r);
}

template <typename T> __host__ __device__ __forceinline__ bool aligned4(const T *p) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0;
}

}  // namespace nt_vec
#endif
