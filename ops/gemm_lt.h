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

/* The same product posed to cuBLASLt in other layouts (NT_GEMM_ROWORDER; bench/gemm_probe.c
 * times them all). TCOL is the plan's own (top of gemm_cuda.c: D^T = op(B)^T op(A)^T, every
 * matrix column-major). TROW: the same with cuBLASLt's A and B described as CUBLASLT_ORDER_ROW
 * (a column-major matrix's memory read row-major is its transpose, so the op flips). DROW:
 * D = op(A) op(B) directly, cuBLASLt's A our A, every matrix ORDER_ROW. DCOL: D = op(A) op(B),
 * A and B column-major (ops flipped), C and D ORDER_ROW. Only plans with no cuBLASLt epilogue
 * and no FP8 (nt_gemm_lt_forms_ok): bias and aux vectors would change orientation. */
enum { NT_GEMM_FORM_TCOL, NT_GEMM_FORM_TROW, NT_GEMM_FORM_DROW, NT_GEMM_FORM_DCOL,
       NT_GEMM_NFORMS };
extern const char *const nt_gemm_form_name[NT_GEMM_NFORMS];

typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;  /* C is D (in place) */
} lt_form;

typedef struct {
  int64_t m, n, k, batch;          /* cuBLASLt's: m = our N, n = our M */
  int64_t lda, ldb, ldd, ldx;
  int64_t sa, sb, sd;              /* batch strides of cuBLASLt's A (our B), B (our A), D */
  int32_t opa, opb;
  int32_t ta, tb, td, tbias;
  int32_t epi, beta_zero, alpha_one, tf32;
  int32_t has_bias, has_scale, align_a, align_b, align_d, align_bias, align_aux, unused;
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
  void *bgrad;         /* fused BGRADA: cuBLASLt writes the bias gradient here (M entries) */
  nt_dtype bgrad_dt;
  cublasStatus_t heuristic_status;   /* of the last heuristic query, for error messages */
  cublasLtEpilogue_t lt_epi;         /* the epilogue on desc */
  int form;                          /* the formulation algo belongs to (NT_GEMM_FORM_*) */
  lt_form forms[NT_GEMM_NFORMS];     /* built on demand; [TCOL] unused (desc, la, lb, ld) */
} plan;

typedef struct {
  plan **slots;        /* open addressing, linear probing */
  size_t cap, n;
  nt_gemm_stats stats;
  bool autotune;
  int search;          /* NT_GEMM_SEARCH: 0 heuristic list only, 1 widened for big shapes, 2 all */
  bool verify_all;     /* NT_GEMM_SEARCH_VERIFY=1: check every searched candidate's result */
  bool pick_splitk;    /* NT_GEMM_SEARCH_PICK=splitk: keep the fastest split-K candidate */
  double untuned_flop; /* NT_GEMM_UNTUNED_GFLOP: products this large keep the heuristic's
                          first choice untimed (default NT_GEMM_UNTUNED_FLOP) */
  int roworder;        /* NT_GEMM_ROWORDER: 1 the other formulations' heuristic lists are
                          timed too, 2 (tests) one of them is kept whenever one verifies */
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

/* One product with `algo` (of formulation `form`, built) into d_out; c_in is C when the plan
 * has a C layout of its own (NULL at beta 0, a copy of D for c_copy), otherwise C is d_out,
 * in place. */
cublasStatus_t nt_gemm_lt_launch(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p, int form,
                                 const cublasLtMatmulAlgo_t *algo, void *d_out, const void *c_in);

/* Whether the plan's product may run in another formulation (no cuBLASLt epilogue, no FP8). */
bool nt_gemm_lt_forms_ok(const plan *pl);

/* Builds formulation `form` of the plan (once) and asks its heuristic for up to `max`
 * candidates into res; *n 0 when cuBLASLt offers none or rejects the layouts. */
nt_status nt_gemm_lt_form_heuristic(nt_ctx *ctx, gemm_cache *c, plan *pl,
                                    const nt_gemm_problem *p, int form,
                                    cublasLtMatmulHeuristicResult_t *res, int max, int *n);

/* Tests: how many cached plans run a formulation other than the plan's own. */
int nt_gemm_lt_plans_in_other_forms(nt_ctx *ctx);

/* Times the heuristic's candidates res[0..n) (and, per NT_GEMM_SEARCH, a widened set of
 * configurations) and keeps the fastest in pl->algo / pl->ws_needed; *ran tells whether any
 * candidate launched. No-op while the stream is being captured (timing needs a host sync). */
nt_status nt_gemm_lt_autotune(nt_ctx *ctx, plan *pl, const nt_gemm_problem *p,
                              const cublasLtMatmulHeuristicResult_t *res, int n, bool *ran);

/* NT_LOG=debug: the algorithm's configuration in words ("algo 66 tile 24 stages 35 ..."). */
void nt_gemm_lt_describe_algo(const cublasLtMatmulAlgo_t *algo, char *buf, size_t n);

#endif
#endif
