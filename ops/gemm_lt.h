/* Private to ops/gemm_cuda.c (plans, launches) and ops/gemm_search.c (the autotuner): the
 * cuBLASLt plan cache's types and the calls both sides share. */
#ifndef NT_OPS_GEMM_LT_H
#define NT_OPS_GEMM_LT_H
#ifdef NT_HAVE_CUDA
#include "ops/gemm_internal.h"
#include <cublasLt.h>

/* Heuristic candidates asked for when building a plan (the list the autotuner always times);
 * the widened search asks for more (gemm_search.c). */
#define NT_GEMM_HEURISTIC_CANDIDATES 32

typedef struct {
  int64_t m, n, k, batch;          /* cuBLASLt's: m = our N, n = our M */
  int64_t lda, ldb, ldd, ldx;
  int64_t sa, sb, sd;              /* batch strides of cuBLASLt's A (our B), B (our A), D */
  int32_t opa, opb;
  int32_t ta, tb, td, tbias;
  int32_t epi, beta_zero, tf32;
  int32_t has_bias, has_scale, align_a, align_b, align_d, align_bias, align_aux;
} plan_key;

typedef struct {
  plan_key key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  /* FP8 with beta 0: C is passed as NULL with its own layout. Since CUDA 13 cuBLASLt rejects
   * (CUBLAS_STATUS_NOT_SUPPORTED at cublasLtMatmul, after a successful heuristic) an FP8
   * product whose C pointer equals D's, as PyTorch's _scaled_mm and XLA found; C is unused at
   * beta 0, so it is dropped. NULL otherwise: C is D, in place, with D's layout. */
  cublasLtMatrixLayout_t lc;
  bool c_copy;         /* lc set for FP8 with beta != 0: C is read from a copy of D */
  cublasLtMatmulAlgo_t algo;
  size_t ws_needed;                  /* workspace bytes the kept algorithm asks for */
  int n_algos;                       /* heuristic candidates offered, for error messages */
  int chosen;                        /* rank of the algorithm kept (0: the heuristic's first;
                                        -1: from the widened search, outside the list) */
  cublasStatus_t launch_status;      /* first failed launch while autotuning */
  bool split;          /* the epilogue runs as a separate kernel after a plain product */
  cublasStatus_t heuristic_status;   /* of the last heuristic query, for error messages */
  cublasLtEpilogue_t lt_epi;         /* the epilogue on desc */
} plan;

typedef struct {
  plan **slots;        /* open addressing, linear probing */
  size_t cap, n;
  nt_gemm_stats stats;
  bool autotune;
  /* From the context's options (core/ctx.h): */
  int search;          /* gemm_search: 0 heuristic list only, 1 widened for big shapes, 2 all */
  bool verify_all;     /* gemm_search_verify: check every searched candidate's result */
  double untuned_flop; /* gemm_untuned_gflop: products this large keep the heuristic's first
                          choice untimed (gemm_tune.c says why) */
  int cc;              /* compute capability, major * 10 + minor */
  float *fp8_scales;   /* 16-byte aligned device slots for misaligned FP8 scale pointers */
} gemm_cache;

nt_status nt_gemm_lt_check(nt_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                           int line);
#define LT(ctx, call) nt_gemm_lt_check((ctx), (call), #call, __FILE__, __LINE__)
#define SET(ctx, desc, attr, val) \
  LT(ctx, cublasLtMatmulDescSetAttribute((desc), (attr), &(val), sizeof(val)))

static inline cublasLtMatrixLayout_t nt_gemm_lt_c_layout(const plan *pl) {
  return pl->lc ? pl->lc : pl->ld;
}

static inline cublasComputeType_t nt_gemm_lt_compute(const plan_key *k) {
  return k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* Bytes from D's first element to one past its last. */
static inline size_t nt_gemm_lt_d_extent(const nt_gemm_problem *p) {
  return (size_t)((p->batch - 1) * p->d_batch + (p->M - 1) * p->d_m + p->N) *
         nt_dtype_size(p->D->dtype);
}

cudaDataType_t nt_gemm_lt_type(nt_dtype t);

/* A preference for the plan's key: the context's workspace and the operands' alignments. */
nt_status nt_gemm_lt_pref(nt_ctx *ctx, gemm_cache *c, const plan_key *k,
                          cublasLtMatmulPreference_t *out);

/* One product with `algo` into d_out; c_in is C when the plan has a C layout of its own (NULL
 * at beta 0, a copy of D for c_copy), otherwise C is d_out, in place. */
cublasStatus_t nt_gemm_lt_launch(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p,
                                 const cublasLtMatmulAlgo_t *algo, void *d_out, const void *c_in);

/* Times the heuristic's candidates res[0..n) (and, per option gemm_search, a widened set of
 * configurations) and keeps the fastest in pl->algo / pl->ws_needed; *ran tells whether any
 * candidate launched. No-op while the stream is being captured (timing needs a host sync). */
nt_status nt_gemm_lt_autotune(nt_ctx *ctx, plan *pl, const nt_gemm_problem *p,
                              const cublasLtMatmulHeuristicResult_t *res, int n, bool *ran);

/* Log level debug: the algorithm's configuration in words ("algo 66 tile 24 stages 35 ..."). */
void nt_gemm_lt_describe_algo(const cublasLtMatmulAlgo_t *algo, char *buf, size_t n);

#endif
#endif
