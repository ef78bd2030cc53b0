/* Private to ops/attention*.cu: dtype helpers shared by the simple and the tensor-core
 * attention kernels, and the launchers of the tensor-core (mma.sync) path. */
#ifndef NT_OPS_ATTENTION_CUDA_CUH
#define NT_OPS_ATTENTION_CUDA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "core/nt.h"

__device__ __forceinline__ float nt_attn_to_f32(float x) { return x; }
__device__ __forceinline__ float nt_attn_to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float nt_attn_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T nt_attn_from_f32(float x);
template <> __device__ __forceinline__ float nt_attn_from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half nt_attn_from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 nt_attn_from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/* Tensor-core path (F16/BF16, D in {32, 64}). d_rows [B*H*T] holds rowsum(dO * O) and
 * dq_acc [B*H*T*D] is a zeroed fp32 buffer; both come from the caller. Each returns NT_OK
 * or the launch error. */
bool nt_attention_mma_supported(nt_dtype dt, int D);
nt_status nt_attention_forward_mma(nt_ctx *ctx, nt_dtype dt, const void *q, const void *k,
                                   const void *v, void *out, float *lse, int BH, int T, int D);
nt_status nt_attention_backward_mma(nt_ctx *ctx, nt_dtype dt, const void *dout, const void *q,
                                    const void *k, const void *v, const float *lse,
                                    const float *d_rows, float *dq_acc, void *dk, void *dv,
                                    int BH, int T, int D);

#endif
