/* Private to ops/gemm*: the resolved problem handed from nt_gemm's checks to a backend, and the
 * small CUDA kernels the cuBLASLt path uses for epilogues it cannot fuse. */
#ifndef NT_OPS_GEMM_INTERNAL_H
#define NT_OPS_GEMM_INTERNAL_H
#include "ops/gemm.h"
NT_EXTERN_C_BEGIN

/* Strides are in elements and describe the logical matrices: op(A) is [M, K] with element
 * (m, k) at m*a_m + k*a_k (+ batch*a_batch), op(B) is [K, N], D and aux are [M, N]. A batch
 * stride of 0 broadcasts. */
typedef struct {
  const nt_tensor *A, *B;
  nt_tensor *D;
  const nt_gemm_opts *o;
  float alpha;
  int64_t M, N, K, batch;
  int64_t a_m, a_k, a_batch;
  int64_t b_k, b_n, b_batch;
  int64_t d_m, d_n, d_batch;
  int64_t x_m, x_batch;          /* aux (GELU_AUX, DGELU) */
} nt_gemm_problem;

nt_status nt_gemm_cpu(nt_ctx *ctx, const nt_gemm_problem *p);
void nt_gemm_tanh_gelu(float x, float *gelu, float *dgelu);

#ifdef NT_HAVE_CUDA
nt_status nt_gemm_cuda(nt_ctx *ctx, const nt_gemm_problem *p);
void nt_gemm_cuda_stats(nt_ctx *ctx, nt_gemm_stats *out);

/* Split epilogues (gemm_kernels.cu), on the context's stream. act: 0 none, 1 relu, 2 gelu. */
typedef enum { NT_GEMMK_ACT_NONE = 0, NT_GEMMK_ACT_RELU, NT_GEMMK_ACT_GELU } nt_gemmk_act;
/* x = D + bias[n] (bias may be NULL); aux = x (aux may be NULL); D = act(x). */
nt_status nt_gemmk_bias_act(nt_ctx *ctx, nt_dtype dt, void *d, int64_t d_m, int64_t d_batch,
                            void *aux, int64_t x_m, int64_t x_batch, const void *bias,
                            nt_dtype bias_dt, int64_t M, int64_t N, int64_t batch,
                            nt_gemmk_act act);
/* D = D * gelu'(aux). */
nt_status nt_gemmk_dgelu(nt_ctx *ctx, nt_dtype dt, void *d, int64_t d_m, const void *aux,
                         int64_t x_m, int64_t M, int64_t N);
/* out[m] += sum_k a[m*a_m + k*a_k] (a in dtype dt: F32, F16 or BF16). */
nt_status nt_gemmk_rowsum_add(nt_ctx *ctx, nt_dtype dt, const void *a, int64_t a_m, int64_t a_k,
                              int64_t M, int64_t K, float *out);
/* dst[i] += src[i] (src in F32, F16 or BF16). */
nt_status nt_gemmk_add_f32(nt_ctx *ctx, float *dst, const void *src, nt_dtype src_dt, int64_t n);
#endif

NT_EXTERN_C_END
#endif
