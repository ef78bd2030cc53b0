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

/* ---- The autotuner's widened search (gemm_search.c); these parts are plain C, CPU-tested. */

/* Products of at least this many floating-point operations get the widened search in mode 1. */
#define NT_GEMM_SEARCH_MIN_FLOP 1e9
bool nt_gemm_search_wide(int mode, double flop);
/* How far two cuBLASLt kernels' results may differ (relative norm) for inputs `in`, D `out`. */
double nt_gemm_search_tol(nt_dtype in, nt_dtype out, bool tf32);

/* Checksums that compare two kernels' D without a second copy of D (the logits are 1.6 GB):
 * sums[0] = sum of D^2, sums[1 + j] = sum of s_j(i) D[i] over the logical index
 * i = (b * M + m) * N + n, the sign s_j(i) = -1 where bit j of nt_gemm_mix64(i) is set. For
 * two results c and r, (P_j(c) - P_j(r))^2 has expectation ||c - r||^2 over the signs. */
#define NT_GEMM_NPROJ 16
#define NT_GEMM_NSUMS (1 + NT_GEMM_NPROJ)
#ifdef __CUDACC__
#define NT_GEMM_HD __host__ __device__
#else
#define NT_GEMM_HD
#endif
static inline NT_GEMM_HD uint64_t nt_gemm_mix64(uint64_t x) {  /* splitmix64's finaliser */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void nt_gemm_checksum_cpu(nt_dtype dt, const void *d, int64_t d_m, int64_t d_batch, int64_t M,
                          int64_t N, int64_t batch, double sums[NT_GEMM_NSUMS]);
/* ||c - r|| / ||r|| estimated from checksums: the mean of the NT_GEMM_NPROJ squared projection
 * differences, or the norms' difference (a lower bound) where larger. Infinity when a sum is
 * not finite, or when r is zero and c is not. */
double nt_gemm_checksum_rel_diff(const double *cand, const double *ref);

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
/* out[n] += sum over m of a[m*a_m + n] (a in F32, F16 or BF16), two kernels: an order fixed
 * for a given shape and SM count (the chunk count follows the SM count). */
nt_status nt_gemmk_colsum_add(nt_ctx *ctx, nt_dtype dt, const void *a, int64_t a_m, int64_t M,
                              int64_t N, float *out);
/* Its second kernel alone: out[n] += the sum over c < nchunks of partial[c * N + n], added in
 * the order of c (for column sums that another kernel left in partial: ops/quantize.cu). */
nt_status nt_gemmk_colsum_finish(nt_ctx *ctx, const float *partial, int64_t nchunks, int64_t N,
                                 float *out);
/* The checksums of D (F32, F16 or BF16; [batch, M, N], strides d_batch, d_m, 1) into the
 * device array sums[NT_GEMM_NSUMS] (zeroed first), on the stream; as nt_gemm_checksum_cpu. */
nt_status nt_gemmk_checksum(nt_ctx *ctx, nt_dtype dt, const void *d, int64_t d_m,
                            int64_t d_batch, int64_t M, int64_t N, int64_t batch, double *sums);
#endif

NT_EXTERN_C_END
#endif
