/* GEMM through cuBLASLt (OpenBLAS on the CPU):
 *   D = alpha * op(A) @ op(B) + beta * D      then the epilogue
 * All tensors row-major as nt_tensor views. op(A) is [M, K] (A is [K, M] when trans_a),
 * op(B) is [K, N] (B is [N, K] when trans_b); D is [M, N]. 3-D tensors [batch, ., .] are a
 * batched strided product (A or B may have batch 1 to broadcast). Inputs F32, F16, BF16, or
 * FP8 (E4M3/E5M2, Hopper only; CPU emulates); D is F32, F16 or BF16. Accumulation in fp32;
 * F32 inputs use TF32 per the call's option tf32 (below). A plan per (shape, dtypes, epilogue) is
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
  NT_EPI_DGELU        /* D = gemm * gelu_tanh'(aux)  (aux: the saved pre-activation, [M, N]) */
} nt_gemm_epilogue;

/* TF32 tensor ops for F32 inputs on the GPU (10-bit mantissa products, fp32 accumulation):
 * DEFAULT follows the context's default, which the precision policy sets (nt_policy_apply:
 * on under "tf32", off otherwise); OFF and ON decide for this product alone. Other input
 * dtypes and the CPU ignore it. */
typedef enum { NT_TF32_DEFAULT = 0, NT_TF32_OFF, NT_TF32_ON } nt_gemm_tf32;

typedef struct {
  bool trans_a, trans_b;
  float alpha;                 /* 0 is read as 1 unless alpha_set (zero-init convenience) */
  bool alpha_set;
  float beta;                  /* 1 accumulates into D */
  nt_gemm_epilogue epilogue;
  const nt_tensor *bias;       /* [N], F32 or D's dtype: BIAS, GELU_AUX, RELU */
  nt_tensor *aux;              /* [M, N] in D's dtype: written by GELU_AUX, read by DGELU */
  /* With beta != 0, C is read from c instead of D: D = alpha op(A) op(B) + beta c, then the
   * epilogue (e.g. a residual added to a linear layer's output in the same launch). c has D's
   * shape, strides and dtype; it may be D itself. NULL: C is D (accumulation in place). Not
   * with FP8 inputs. */
  const nt_tensor *c;
  /* FP8 only: device pointers to fp32 scalars. A and B hold value * scale; the product is
   * multiplied back by scale_inv_a * scale_inv_b. Pointers that are not 16-byte aligned
   * (cuBLASLt refuses them at launch) are staged into aligned slots on the stream. */
  const float *scale_inv_a, *scale_inv_b;
  nt_gemm_tf32 tf32;
} nt_gemm_opts;

/* Defaults: no transposes, alpha 1, beta 0, no epilogue, TF32 as the context's default. */
nt_gemm_opts nt_gemm_defaults(void);

/* Rules (the same on the CPU and the GPU, so a CPU run rejects what a GPU run would):
 * - A and B share one dtype (F32, F16, BF16), or are FP8 with at most one E5M2 (E5M2 x E5M2
 *   is NT_ERR_UNSUPPORTED: cuBLASLt has no such kernel).
 *   D: F32 inputs -> F32; F16 -> F16 or F32; BF16 -> BF16 or F32; FP8 -> F32, F16 or BF16.
 * - beta == 0: D is not read (NaN in D does not propagate).
 * - GELU_AUX and DGELU need an unbatched product.
 * - On the GPU each matrix needs a unit stride in one of its two last dims (D in its last);
 *   FP8 needs compute capability >= 8.9 and cuBLASLt's "TN" layout: A [M, K] not transposed
 *   and B given as [N, K] with trans_b, both with unit stride along K, and 16-byte aligned
 *   leading dims.
 * GPU: a fused cuBLASLt epilogue when cuBLASLt offers one for the case, otherwise the plain
 * product followed by a small kernel (same results within rounding). Plans (descriptors,
 * layouts and the chosen algorithm) are cached per context; with autotuning (default on for
 * CUDA contexts; the context option gemm_autotune, core/ctx.h) the first call of a new shape
 * times candidate algorithms once each, then those within 1.3x of
 * the fastest (3 samples of 5 runs each, taken round-robin, median), and keeps the fastest.
 * That call waits for the GPU: a one-time cost per shape. While the stream is being captured
 * into a CUDA graph the heuristic's first choice is used instead. The candidates (option
 * gemm_search):
 *   0  cuBLASLt's top 32 heuristic candidates only;
 *   1  (default) the same for products under 1 GFLOP; at or above, a widened search: the
 *      heuristic's top 128, its best configurations per algorithm id, every tile x stages
 *      configuration of the fastest algorithm ids, then split-K / reduction / CTA swizzle /
 *      cluster shape / custom option / stages variants of the fastest few, each validated by
 *      cublasLtMatmulAlgoCheck (at most ~650 configurations timed per shape, at most 6 s of
 *      GPU time: ~0.05-0.5 s for most shapes, a few seconds for a GPT-2 logits product). A kept
 *      configuration from outside the heuristic's list is first checked against the heuristic's
 *      kernel on the same inputs (rejected beyond the dtype's tolerance);
 *   2  the widened search on every shape, with larger limits (diagnosis; can take minutes).
 * Option gemm_search_verify checks every searched candidate's result, not only the kept one.
 * Products of gemm_untuned_gflop (default 100) GFLOP or more keep the heuristic's first choice
 * untimed. Log level debug (option log) logs each new plan: the candidates' times, the
 * configuration kept (algo id, tile, stages, split-K, reduction, swizzle, custom option,
 * cluster) and its time against the heuristic's best.
 * FP8 with beta 0 passes C as NULL (CUDA 13's cuBLASLt refuses FP8 with C aliasing D); FP8
 * with beta != 0 runs in place, or reads C from a copy of D where cuBLASLt refuses that. */
nt_status nt_gemm(nt_ctx *ctx, const nt_tensor *A, const nt_tensor *B, nt_tensor *D,
                  const nt_gemm_opts *opts);

/* A linear layer's bias gradient: db[n] += sum over m of dy[m, n]. dy [M, N] (F32, F16 or
 * BF16) with unit stride along N; db [N] F32 contiguous. Sums in fp32 (CPU: fp64); on the GPU
 * two small kernels that read dy once (per-chunk column sums, then the chunks summed in
 * order). The order is fixed for a given shape and device, so results repeat bit for bit run
 * to run; on the GPU the chunk count follows the SM count, so GPUs with different SM counts
 * (and the CPU) may differ in the last bits. */
nt_status nt_gemm_bias_grad(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *db);

/* Plan cache statistics of a context (all zero for a CPU context). */
typedef struct {
  uint64_t plans;             /* cached plans */
  uint64_t descriptors;       /* cuBLASLt descriptors (matmul desc, layouts, preference) made */
  uint64_t hits, misses;      /* lookups */
  uint64_t autotuned;         /* plans whose algorithm was picked by timing */
  uint64_t split_epilogues;   /* plans that run the epilogue as a separate kernel */
  uint64_t searched;          /* plans tuned with the widened search (gemm_search) */
  uint64_t search_won;        /* of those, plans keeping a configuration outside the heuristic's
                                 top 32 */
  uint64_t search_timed;      /* configurations timed by the widened search, all plans */
  uint64_t search_verified;   /* searched results checked against the heuristic's kernel */
  uint64_t search_rejected;   /* of those, beyond the tolerance (never kept) */
  uint64_t splitk_verified;   /* verified configurations with split-K > 1 */
  uint64_t splitk_plans;      /* plans keeping a split-K > 1 configuration */
  uint64_t tune_us;           /* host time spent autotuning (all plans), microseconds */
  uint64_t workspace_needed;  /* the most workspace any cached plan's algorithm needs (bytes):
                                 the context's cuBLASLt workspace could shrink to this */
} nt_gemm_stats;
void nt_gemm_get_stats(nt_ctx *ctx, nt_gemm_stats *out);

NT_EXTERN_C_END
#endif
