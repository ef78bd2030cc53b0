/* Private to the CUDA kernels of ops/: storage dtype <-> fp32 conversions (fp32 arithmetic,
 * results rounded once, to nearest even). */
#ifndef NT_OPS_CUDA_DTYPE_CUH
#define NT_OPS_CUDA_DTYPE_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float nt_to_f(float x) { return x; }
__device__ __forceinline__ float nt_to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float nt_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T nt_from_f(float x);
template <> __device__ __forceinline__ float nt_from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half nt_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 nt_from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

#endif
