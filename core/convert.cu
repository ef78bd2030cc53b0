/* nt_convert on the GPU: CUDA's own conversion intrinsics (which the CPU code in convert.c
 * reproduces bit for bit), four elements per thread with one vector load and store when both
 * pointers allow it. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include "core/convert.h"
#include "core/cuda_util.h"

namespace {

template <int D> struct dtype_traits;

template <> struct dtype_traits<NT_F32> {
  typedef float T;
  static __device__ float load(T v) { return v; }
  static __device__ T store(float x) { return x; }
};
template <> struct dtype_traits<NT_F16> {
  typedef unsigned short T;
  static __device__ float load(T v) { return __half2float(__ushort_as_half(v)); }
  static __device__ T store(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
template <> struct dtype_traits<NT_BF16> {
  typedef unsigned short T;
  static __device__ float load(T v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ T store(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};
template <> struct dtype_traits<NT_FP8_E4M3> {
  typedef __nv_fp8_storage_t T;
  static __device__ float load(T v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
  }
  static __device__ T store(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
};
template <> struct dtype_traits<NT_FP8_E5M2> {
  typedef __nv_fp8_storage_t T;
  static __device__ float load(T v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E5M2)));
  }
  static __device__ T store(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
};

/* Float to integer as on the CPU (convert.c): truncate, saturate, NaN -> 0, spelled out so
 * the rule does not depend on what cvt.rzi does with NaN. */
__device__ double clamp_trunc(float x, double lo, double hi) {
  if (isnan(x)) return 0.0;
  double d = trunc((double)x);
  return d < lo ? lo : (d > hi ? hi : d);
}

template <> struct dtype_traits<NT_I32> {
  typedef int32_t T;
  static __device__ float load(T v) { return __int2float_rn(v); }
  static __device__ T store(float x) { return (T)clamp_trunc(x, -2147483648.0, 2147483647.0); }
};
template <> struct dtype_traits<NT_I64> {
  typedef long long T;
  static __device__ float load(T v) { return __ll2float_rn(v); }
  static __device__ T store(float x) {
    if (isnan(x)) return 0;
    if (x >= 0x1p63f) return INT64_MAX;
    if (x <= -0x1p63f) return INT64_MIN;
    return (T)x;   /* in range: C++ conversion truncates */
  }
};
template <> struct dtype_traits<NT_U8> {
  typedef uint8_t T;
  static __device__ float load(T v) { return (float)v; }
  static __device__ T store(float x) { return (T)clamp_trunc(x, 0.0, 255.0); }
};

template <typename T> struct alignas(4 * sizeof(T)) vec4 { T v[4]; };

template <int SD, int DD>
__global__ void convert_kernel(const typename dtype_traits<SD>::T *__restrict__ src,
                               typename dtype_traits<DD>::T *__restrict__ dst, int64_t n,
                               bool vectorized) {
  typedef dtype_traits<SD> S;
  typedef dtype_traits<DD> D;
  int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
  for (int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; base < n;
       base += stride) {
    if (vectorized && base + 4 <= n) {
      vec4<typename S::T> in = *reinterpret_cast<const vec4<typename S::T> *>(src + base);
      vec4<typename D::T> out;
#pragma unroll
      for (int k = 0; k < 4; k++) out.v[k] = D::store(S::load(in.v[k]));
      *reinterpret_cast<vec4<typename D::T> *>(dst + base) = out;
    } else {
      int64_t end = base + 4 < n ? base + 4 : n;
      for (int64_t i = base; i < end; i++) dst[i] = D::store(S::load(src[i]));
    }
  }
}

template <int SD, int DD>
nt_status launch(nt_ctx *ctx, void *dst, const void *src, int64_t n) {
  typedef typename dtype_traits<SD>::T ST;
  typedef typename dtype_traits<DD>::T DT;
  bool vectorized = (uintptr_t)src % sizeof(vec4<ST>) == 0 && (uintptr_t)dst % sizeof(vec4<DT>) == 0;
  const int threads = 256;
  int64_t groups = (n + 3) / 4;
  int64_t blocks = (groups + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;   /* grid-stride beyond this */
  convert_kernel<SD, DD><<<(unsigned)blocks, threads, 0, nt_cuda_stream(ctx)>>>(
      (const ST *)src, (DT *)dst, n, vectorized);
  return NT_CUDA_LAUNCHED(ctx);
}

template <int SD>
nt_status launch_to_float(nt_ctx *ctx, void *dst, nt_dtype dd, const void *src, int64_t n) {
  switch (dd) {
    case NT_F32: return launch<SD, NT_F32>(ctx, dst, src, n);
    case NT_F16: return launch<SD, NT_F16>(ctx, dst, src, n);
    case NT_BF16: return launch<SD, NT_BF16>(ctx, dst, src, n);
    case NT_FP8_E4M3: return launch<SD, NT_FP8_E4M3>(ctx, dst, src, n);
    case NT_FP8_E5M2: return launch<SD, NT_FP8_E5M2>(ctx, dst, src, n);
    default: break;
  }
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "convert_cuda: no kernel for dtype %s",
                  nt_dtype_name(dd));
}

}  // namespace

/* Called only by nt_convert (convert.c), which has checked devices, shapes and that the pair
 * is supported: float <-> float, integer <-> f32. */
extern "C" nt_status nt_convert_cuda(nt_ctx *ctx, void *dst, nt_dtype dd, const void *src,
                                     nt_dtype sd, int64_t n) {
  if (dd == sd)
    return NT_CUDA(ctx, cudaMemcpyAsync(dst, src, (size_t)n * nt_dtype_size(dd),
                                        cudaMemcpyDeviceToDevice, nt_cuda_stream(ctx)));
  switch (sd) {
    case NT_F32:
      switch (dd) {
        case NT_I32: return launch<NT_F32, NT_I32>(ctx, dst, src, n);
        case NT_I64: return launch<NT_F32, NT_I64>(ctx, dst, src, n);
        case NT_U8: return launch<NT_F32, NT_U8>(ctx, dst, src, n);
        default: return launch_to_float<NT_F32>(ctx, dst, dd, src, n);
      }
    case NT_F16: return launch_to_float<NT_F16>(ctx, dst, dd, src, n);
    case NT_BF16: return launch_to_float<NT_BF16>(ctx, dst, dd, src, n);
    case NT_FP8_E4M3: return launch_to_float<NT_FP8_E4M3>(ctx, dst, dd, src, n);
    case NT_FP8_E5M2: return launch_to_float<NT_FP8_E5M2>(ctx, dst, dd, src, n);
    case NT_I32: return launch<NT_I32, NT_F32>(ctx, dst, src, n);
    case NT_I64: return launch<NT_I64, NT_F32>(ctx, dst, src, n);
    case NT_U8: return launch<NT_U8, NT_F32>(ctx, dst, src, n);
    default: break;
  }
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "convert_cuda: no kernel for %s -> %s",
                  nt_dtype_name(sd), nt_dtype_name(dd));
}
