/* Private to ops/attention*.cu: the launchers of the tensor-core (mma.sync) path, and (through
 * ops/cuda_dtype.cuh) the dtype conversions the simple and the tensor-core kernels share. */
#ifndef NT_OPS_ATTENTION_CUDA_CUH
#define NT_OPS_ATTENTION_CUDA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "core/nt.h"
#include "ops/cuda_dtype.cuh"

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
