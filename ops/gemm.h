/* GEMM through cuBLASLt (OpenBLAS on the CPU):
 *   D = alpha * op(A) @ op(B) + beta * D      then the epilogue
 * All tensors row-major as nt_tensor views. op(A) is [M, K] (A is [K, M] when trans_a),
 * op(B) is [K, N] (B is [N, K] when trans_b); D is [M, N]. 3-D tensors [batch, ., .] are a
 * batched strided product (A or B may have batch 1 to broadcast). Inputs F32, F16, BF16, or
 * FP8 (E4M3/E5M2, Hopper only; CPU emulates); D is F32, F16 or BF16. Accumulation in fp32;
 * F32 inputs use TF32 when nt_ctx_allow_tf32(ctx). A plan per (shape, dtypes, epilogue) is
 * cached in the context: the hot path creates no descriptors. */
#ifndef NT_OPS_GEMM_H
#define NT_OPS_GEMM_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_EPI_NONE = 0,
  NT_EPI_BIAS,        /* D += bias[N] (broadcast over rows) */
  NT_EPI_GELU_AUX,    /* pre = gemm (+ bias if given); aux = pre; D = gelu_tanh(pre) */
  NT_EPI_RELU,        /* D = relu(gemm (+ bias if given)) */
  NT_EPI_DGELU,       /* D = gemm * gelu_tanh'(aux)  (aux: the saved pre-activation, [M, N]) */
  NT_EPI_BGRADA       /* D as NONE, and bias_grad[M] += sum over k of op(A)[m, k]: the bias
                         gradient of dW = dY^T @ X (A = dY, trans_a) in the same launch */
} nt_gemm_epilogue;

typedef struct {
  bool trans_a, trans_b;
  float alpha;                 /* 0 is read as 1 unless alpha_set (zero-init convenience) */
  bool alpha_set;
  float beta;                  /* 1 accumulates into D */
  nt_gemm_epilogue epilogue;
  const nt_tensor *bias;       /* [N], F32 or D's dtype: BIAS, GELU_AUX, RELU */
  nt_tensor *aux;              /* [M, N] in D's dtype: written by GELU_AUX, read by DGELU */
  nt_tensor *bias_grad;        /* [M] F32, accumulated: BGRADA */
  /* FP8 only: device pointers to fp32 scalars. A and B hold value * scale; the product is
   * multiplied back by scale_inv_a * scale_inv_b. */
  const float *scale_inv_a, *scale_inv_b;
} nt_gemm_opts;

/* Defaults: no transposes, alpha 1, beta 0, no epilogue. */
nt_gemm_opts nt_gemm_defaults(void);

nt_status nt_gemm(nt_ctx *ctx, const nt_tensor *A, const nt_tensor *B, nt_tensor *D,
                  const nt_gemm_opts *opts);

NT_EXTERN_C_END
#endif
