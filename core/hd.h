/* NT_HD marks the functions of the "rule" headers (amp/scaler_rule.h, amp/fp8_rule.h,
 * ops/gelu_rule.h, optim/optim_common.h) as both host and device code under nvcc and as plain C
 * under the host compiler, so a CPU reference and its CUDA kernel compile the same source and
 * run the same arithmetic. Private. */
#ifndef NT_CORE_HD_H
#define NT_CORE_HD_H

#ifdef __CUDACC__
#define NT_HD __host__ __device__
#else
#define NT_HD
#endif

#endif
