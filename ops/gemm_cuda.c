/* nt_gemm_cuda: cuBLASLt with a per-context plan cache.
 *
 * Row-major views are handed to column-major cuBLASLt by computing D^T = op(B)^T op(A)^T:
 * cuBLASLt's "A" is our op(B)^T ([N, K]), its "B" is our op(A)^T ([K, M]) and its D is our D^T
 * ([N, M], leading dim D's row stride). cuBLASLt's m, n, k are therefore our N, M, K.
 *
 * A plan holds the matmul descriptor, the three layouts and the algorithm; it is keyed by
 * everything that shapes those (sizes, strides, transposes, dtypes, epilogue, alpha/beta
 * special values, TF32, pointer alignments), so a cache hit only sets the per-call pointers
 * (bias, aux, FP8 scales) on the cached descriptor and launches. */
#ifdef NT_HAVE_CUDA
#include "core/ctx_internal.h"
#include "core/cuda_util.h"
#include "core/memory.h"
#include "ops/gemm_lt.h"
#include <stdlib.h>
#include <string.h>

nt_status nt_gemm_lt_check(nt_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                           int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return NT_OK;
  return nt_ctx_set_error(ctx, NT_ERR_CUBLAS, file, line, "gemm: %s failed: %s (%d)", what,
                          cublasLtGetStatusString(s), (int)s);
}

static void plan_free(plan *p) {
  if (!p) return;
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  free(p);
}

static void cache_free(nt_ctx *ctx, void *vc) {
  gemm_cache *c = vc;
  if (!c) return;
  for (size_t i = 0; i < c->cap; i++) plan_free(c->slots[i]);
  nt_free(ctx, c->fp8_scales);
  free(c->slots);
  free(c);
}

static nt_status get_cache(nt_ctx *ctx, gemm_cache **out) {
  if (ctx->gemm_cache) {
    *out = ctx->gemm_cache;
    return NT_OK;
  }
  gemm_cache *c = calloc(1, sizeof *c);
  if (!c) return NT_ERROR(ctx, NT_ERR_OOM, "gemm: out of host memory for the plan cache");
  c->cap = 64;
  c->slots = calloc(c->cap, sizeof *c->slots);
  if (!c->slots) {
    free(c);
    return NT_ERROR(ctx, NT_ERR_OOM, "gemm: out of host memory for the plan cache");
  }
  const nt_ctx_options *o = nt_ctx_opts(ctx);
  c->autotune = o->gemm_autotune;
  c->search = o->gemm_search;
  c->verify_all = o->gemm_search_verify;
  c->untuned_flop = o->gemm_untuned_gflop * 1e9;
  int major = 0, minor = 0;
  nt_status st = NT_CUDA(ctx, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                                     ctx->device.index));
  if (!st) st = NT_CUDA(ctx, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                                    ctx->device.index));
  if (st) {
    cache_free(ctx, c);
    return st;
  }
  c->cc = major * 10 + minor;
  ctx->gemm_cache = c;
  ctx->gemm_cache_free = cache_free;
  *out = c;
  return NT_OK;
}

void nt_gemm_cuda_stats(nt_ctx *ctx, nt_gemm_stats *out) {
  gemm_cache *c = ctx->gemm_cache;
  if (!c) return;
  *out = c->stats;
  /* The largest workspace any cached plan's algorithm asks for: what the context's workspace
   * could shrink to without changing a kept algorithm. */
  out->workspace_needed = 0;
  for (size_t i = 0; i < c->cap; i++)
    if (c->slots[i] && c->slots[i]->ws_needed > out->workspace_needed)
      out->workspace_needed = c->slots[i]->ws_needed;
}

static uint64_t key_hash(const plan_key *k) {
  const unsigned char *b = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static plan *cache_find(gemm_cache *c, const plan_key *k) {
  for (size_t i = key_hash(k) & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    plan *p = c->slots[i];
    if (!p) return NULL;
    if (!memcmp(&p->key, k, sizeof *k)) return p;
  }
}

static nt_status cache_insert(nt_ctx *ctx, gemm_cache *c, plan *p) {
  if (2 * (c->n + 1) > c->cap) {
    size_t cap = c->cap * 2;
    plan **slots = calloc(cap, sizeof *slots);
    if (!slots) return NT_ERROR(ctx, NT_ERR_OOM, "gemm: out of host memory growing the cache");
    for (size_t i = 0; i < c->cap; i++) {
      if (!c->slots[i]) continue;
      size_t j = key_hash(&c->slots[i]->key) & (cap - 1);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = slots;
    c->cap = cap;
  }
  size_t j = key_hash(&p->key) & (c->cap - 1);
  while (c->slots[j]) j = (j + 1) & (c->cap - 1);
  c->slots[j] = p;
  c->n++;
  c->stats.plans = c->n;
  return NT_OK;
}

cudaDataType_t nt_gemm_lt_type(nt_dtype t) {
  switch (t) {
    case NT_F16: return CUDA_R_16F;
    case NT_BF16: return CUDA_R_16BF;
    case NT_FP8_E4M3: return CUDA_R_8F_E4M3;
    case NT_FP8_E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

static int32_t align_of(const void *ptr) {
  uintptr_t a = (uintptr_t)ptr;
  int32_t al = 256;
  while (al > 1 && (a % (uintptr_t)al)) al /= 2;
  return ptr ? al : 0;
}

static int32_t align_batched(const void *ptr, int64_t batch_stride, nt_dtype dt, int64_t batch) {
  int32_t a = align_of(ptr);
  if (batch > 1 && batch_stride) {
    int32_t b = align_of((const void *)(uintptr_t)((uint64_t)batch_stride * nt_dtype_size(dt)));
    if (b < a) a = b;
  }
  return a;
}

/* One operand in cuBLASLt terms: a rows x cols column-major matrix, op N when the element
 * (r, c) of the logical matrix sits at r*s_r + c*s_c with s_r == 1, op T when s_c == 1. */
static bool map_operand(int64_t rows, int64_t cols, int64_t s_r, int64_t s_c, int32_t *op,
                        int64_t *ld) {
  if (s_r == 1 || rows == 1) {
    *op = CUBLAS_OP_N;
    *ld = cols == 1 ? rows : s_c;
    if (*ld >= rows && *ld > 0) return true;
  }
  if (s_c == 1 || cols == 1) {
    *op = CUBLAS_OP_T;
    *ld = rows == 1 ? cols : s_r;
    if (*ld >= cols && *ld > 0) return true;
  }
  return false;
}

static bool is_fp8(nt_dtype t) { return t == NT_FP8_E4M3 || t == NT_FP8_E5M2; }

static const char *lt_type_name(int32_t dt) {
  return dt < 0 ? "default" : nt_dtype_name((nt_dtype)dt);
}

/* Everything cuBLASLt was given for the plan, for error messages and the GPU test's log. */
static void describe_plan(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p, char *buf,
                          size_t n) {
  const plan_key *k = &pl->key;
  snprintf(buf, n,
           "cuBLASLt m %lld n %lld k %lld batch %lld; A (our B) %s op %s ld %lld align %d; "
           "B (our A) %s op %s ld %lld align %d; C %s; D %s ld %lld align %d; epilogue %d%s, "
           "bias %s; scale pointers A %s B %s; alpha %g beta %g; heuristic %s, %d candidate(s)%s%s;"
           " workspace %zu bytes",
           (long long)k->m, (long long)k->n, (long long)k->k, (long long)k->batch,
           lt_type_name(k->ta), k->opa == CUBLAS_OP_T ? "T" : "N", (long long)k->lda, k->align_a,
           lt_type_name(k->tb), k->opb == CUBLAS_OP_T ? "T" : "N", (long long)k->ldb, k->align_b,
           pl->c_copy ? "a copy of D (own layout, D's type)"
                      : pl->lc ? "NULL (own layout, D's type)" : "= D (in place, D's layout)",
           lt_type_name(k->td), (long long)k->ldd, k->align_d, k->epi,
           pl->split ? " (split: plain product + kernel)" : "", lt_type_name(k->tbias),
           (k->has_scale & 2) ? "set" : "none", (k->has_scale & 1) ? "set" : "none",
           (double)p->alpha, (double)p->o->beta, cublasLtGetStatusString(pl->heuristic_status),
           pl->n_algos, pl->launch_status != CUBLAS_STATUS_SUCCESS ? ", autotune launch: " : "",
           pl->launch_status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(pl->launch_status)
                                                      : "",
           ctx->workspace_bytes);
}

static const void *bias_ptr(const nt_gemm_problem *p) {
  nt_gemm_epilogue e = p->o->epilogue;
  bool uses = e == NT_EPI_BIAS || e == NT_EPI_GELU_AUX || e == NT_EPI_RELU;
  return (uses && p->o->bias) ? p->o->bias->data : NULL;
}

/* C when it is not D (opts.c at beta != 0), else NULL. */
static const void *c_pointer(const nt_gemm_problem *p) {
  const nt_tensor *c = p->o->c;
  return (c && p->o->beta != 0.0f && c->data != p->D->data) ? c->data : NULL;
}

static nt_status make_key(nt_ctx *ctx, const gemm_cache *c, const nt_gemm_problem *p,
                          plan_key *k) {
  char b1[96], b2[96];
  memset(k, 0, sizeof *k);
  k->m = p->N; k->n = p->M; k->k = p->K; k->batch = p->batch;
  /* cuBLASLt A = op(B)^T: [N, K], element (n, k) at n*b_n + k*b_k. */
  if (!map_operand(p->N, p->K, p->b_n, p->b_k, &k->opa, &k->lda))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "gemm: B %s needs a unit stride in one of its last two dims (strides %lld, "
                    "%lld)", nt_tensor_describe(p->B, b1, sizeof b1),
                    (long long)p->B->stride[p->B->ndim - 2], (long long)p->B->stride[p->B->ndim - 1]);
  /* cuBLASLt B = op(A)^T: [K, M], element (k, m) at k*a_k + m*a_m. */
  if (!map_operand(p->K, p->M, p->a_k, p->a_m, &k->opb, &k->ldb))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "gemm: A %s needs a unit stride in one of its last two dims (strides %lld, "
                    "%lld)", nt_tensor_describe(p->A, b1, sizeof b1),
                    (long long)p->A->stride[p->A->ndim - 2], (long long)p->A->stride[p->A->ndim - 1]);
  int32_t opd;
  if (!map_operand(p->N, p->M, p->d_n, p->d_m, &opd, &k->ldd) || opd != CUBLAS_OP_N)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "gemm: D %s needs unit stride in its last dim",
                    nt_tensor_describe(p->D, b1, sizeof b1));
  k->sa = p->b_batch; k->sb = p->a_batch; k->sd = p->d_batch;
  k->ta = p->B->dtype; k->tb = p->A->dtype; k->td = p->D->dtype;
  k->epi = p->o->epilogue;
  k->beta_zero = p->o->beta == 0.0f;
  const nt_gemm_tf32 tf = p->o->tf32;
  k->tf32 = p->A->dtype == NT_F32 &&
            (tf == NT_TF32_ON || (tf == NT_TF32_DEFAULT && nt_ctx_allow_tf32(ctx)));
  const void *bias = bias_ptr(p);
  k->has_bias = bias != NULL;
  k->tbias = bias ? (int32_t)p->o->bias->dtype : -1;
  k->align_bias = align_of(bias);
  if (p->o->epilogue == NT_EPI_GELU_AUX || p->o->epilogue == NT_EPI_DGELU) {
    k->ldx = p->M == 1 ? p->N : p->x_m;
    k->align_aux = align_of(p->o->aux->data);
  }
  /* Every batch's matrix must meet the alignment promised to the heuristic. */
  k->align_a = align_batched(p->B->data, p->b_batch, p->B->dtype, p->batch);
  k->align_b = align_batched(p->A->data, p->a_batch, p->A->dtype, p->batch);
  k->align_d = align_batched(p->D->data, p->d_batch, p->D->dtype, p->batch);
  const void *cp = c_pointer(p);
  if (cp) {  /* C shares D's layout and alignment promise */
    int32_t ac = align_batched(cp, p->d_batch, p->D->dtype, p->batch);
    if (ac < k->align_d) k->align_d = ac;
  }
  if (is_fp8(p->A->dtype)) {
    k->has_scale = (p->o->scale_inv_a ? 1 : 0) | (p->o->scale_inv_b ? 2 : 0);
    if (c->cc < 89)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "gemm: FP8 inputs need compute capability >= 8.9 (Ada/Hopper); this GPU is "
                      "%d.%d", c->cc / 10, c->cc % 10);
    if (k->opa != CUBLAS_OP_T || k->opb != CUBLAS_OP_N)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "gemm: FP8 needs cuBLASLt's TN layout: A %s as [M, K] with unit stride along "
                      "K and B %s as [N, K] (trans_b) with unit stride along K",
                      nt_tensor_describe(p->A, b1, sizeof b1),
                      nt_tensor_describe(p->B, b2, sizeof b2));
    if (k->lda % 16 || k->ldb % 16 || k->align_a < 16 || k->align_b < 16)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "gemm: FP8 needs 16-byte aligned operands with leading dims multiple of 16 "
                      "(A's %lld, B's %lld)", (long long)k->ldb, (long long)k->lda);
  }
  if (p->K == 0)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "gemm: K = 0 on the GPU");
  return NT_OK;
}

/* The stored matrix is rows x cols column-major for op N, cols x rows for op T. */
static nt_status make_layout(nt_ctx *ctx, gemm_cache *c, cublasLtMatrixLayout_t *l,
                             nt_dtype dt, int32_t op, int64_t rows, int64_t cols, int64_t ld,
                             int64_t batch, int64_t stride) {
  nt_status st = LT(ctx, cublasLtMatrixLayoutCreate(l, nt_gemm_lt_type(dt),
                                                    (uint64_t)(op == CUBLAS_OP_N ? rows : cols),
                                                    (uint64_t)(op == CUBLAS_OP_N ? cols : rows),
                                                    ld));
  if (st) return st;
  c->stats.descriptors++;
  if (batch > 1) {
    int32_t n = (int32_t)batch;
    st = LT(ctx, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                  sizeof n));
    if (!st) st = LT(ctx, cublasLtMatrixLayoutSetAttribute(
                              *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                              sizeof stride));
  }
  return st;
}

nt_status nt_gemm_lt_pref(nt_ctx *ctx, gemm_cache *c, const plan_key *k,
                          cublasLtMatmulPreference_t *out) {
  cublasLtMatmulPreference_t pref = NULL;
  nt_status st = LT(ctx, cublasLtMatmulPreferenceCreate(&pref));
  if (st) return st;
  c->stats.descriptors++;
  uint64_t ws = ctx->workspace_bytes;
  uint32_t al_a = (uint32_t)k->align_a, al_b = (uint32_t)k->align_b, al_d = (uint32_t)k->align_d;
  if ((st = LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))) ||
      (st = LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a))) ||
      (st = LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b))) ||
      (st = LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d))) ||
      (st = LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d)))) {
    cublasLtMatmulPreferenceDestroy(pref);
    return st;
  }
  *out = pref;
  return NT_OK;
}

/* A matmul descriptor for the key with cuBLASLt epilogue `epi` (bias / bias-gradient vector of
 * type bias_t, or -1 for the default), and its heuristic candidates. n_out 0: none offered. */
static nt_status try_desc(nt_ctx *ctx, gemm_cache *c, plan *pl, const nt_gemm_problem *p,
                          cublasLtEpilogue_t epi, int bias_t, void *vec,
                          cublasLtMatmulHeuristicResult_t *res, int *n_out) {
  const plan_key *k = &pl->key;
  *n_out = 0;
  cublasComputeType_t ct = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t d = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  nt_status st = LT(ctx, cublasLtMatmulDescCreate(&d, ct, CUDA_R_32F));
  if (st) return st;
  c->stats.descriptors++;
  cublasOperation_t opa = (cublasOperation_t)k->opa, opb = (cublasOperation_t)k->opb;
  uint32_t e = (uint32_t)epi;
  if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_TRANSA, opa))) goto fail;
  if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_TRANSB, opb))) goto fail;
  if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_EPILOGUE, e))) goto fail;
  if (vec && (st = SET(ctx, d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec))) goto fail;
  if (bias_t >= 0) {
    int32_t bt = bias_t;
    if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt))) goto fail;
  }
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
      epi == CUBLASLT_EPILOGUE_DGELU) {
    void *aux = p->o->aux->data;
    int64_t ldx = k->ldx;
    if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux))) goto fail;
    if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldx))) goto fail;
  }
  if (k->has_scale & 2) {  /* cuBLASLt's A is our B */
    const float *s = p->o->scale_inv_b;
    if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s))) goto fail;
  }
  if (k->has_scale & 1) {
    const float *s = p->o->scale_inv_a;
    if ((st = SET(ctx, d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s))) goto fail;
  }
  if ((st = nt_gemm_lt_pref(ctx, c, k, &pref))) goto fail;
  int n = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      (cublasLtHandle_t)ctx->cublaslt, d, pl->la, pl->lb, nt_gemm_lt_c_layout(pl), pl->ld, pref,
      c->autotune ? NT_GEMM_HEURISTIC_CANDIDATES : 1, res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  pref = NULL;
  pl->heuristic_status = hs;
  pl->n_algos = hs == CUBLAS_STATUS_SUCCESS ? n : 0;
  /* NOT_SUPPORTED (or INVALID_VALUE for an epilogue this build rejects) means "no fused
   * variant": the caller tries the next one. */
  if (hs != CUBLAS_STATUS_SUCCESS || n == 0) {
    cublasLtMatmulDescDestroy(d);
    return NT_OK;
  }
  pl->desc = d;
  pl->lt_epi = epi;
  *n_out = n;
  return NT_OK;
fail:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(d);
  return st;
}

cublasStatus_t nt_gemm_lt_launch(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p,
                                 const cublasLtMatmulAlgo_t *algo, void *d_out, const void *c_in) {
  float alpha = p->alpha, beta = p->o->beta;
  return cublasLtMatmul((cublasLtHandle_t)ctx->cublaslt, pl->desc, &alpha, p->B->data, pl->la,
                        p->A->data, pl->lb, &beta, (pl->lc || c_in) ? c_in : d_out,
                        nt_gemm_lt_c_layout(pl), d_out, pl->ld, algo, ctx->workspace,
                        ctx->workspace_bytes, nt_cuda_stream(ctx));
}

/* FP8 accumulation (beta != 0) runs in place (C = D, one layout), as cuBLAS documents. Should
 * cuBLASLt refuse that (CUDA 13 added checks on C aliasing D for FP8), the plan switches to an
 * out-of-place product that reads C from a copy of D. */
static bool may_copy_c(const plan *pl, cublasStatus_t s) {
  return (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) &&
         is_fp8((nt_dtype)pl->key.tb) && !pl->key.beta_zero && !pl->c_copy;
}

static nt_status use_c_copy(nt_ctx *ctx, gemm_cache *c, plan *pl) {
  const plan_key *k = &pl->key;
  nt_status st = make_layout(ctx, c, &pl->lc, (nt_dtype)k->td, CUBLAS_OP_N, k->m, k->n,
                             k->ldd, k->batch, k->sd);
  if (!st) pl->c_copy = true;
  nt_log(ctx, NT_LOG_DEBUG, "gemm: FP8 accumulation in place refused; C from a copy of D");
  return st;
}

/* A failed launch names the whole configuration; NOT_SUPPORTED is the op's "unsupported". */
static nt_status launch_error(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p,
                              cublasStatus_t s) {
  char desc[640], ba[96], bb[96], bd[96];
  describe_plan(ctx, pl, p, desc, sizeof desc);
  return NT_ERROR(ctx, s == CUBLAS_STATUS_NOT_SUPPORTED ? NT_ERR_UNSUPPORTED : NT_ERR_CUBLAS,
                  "gemm: cublasLtMatmul failed: %s (%d) for A %s x B %s -> D %s [%s]",
                  cublasLtGetStatusString(s), (int)s, nt_tensor_describe(p->A, ba, sizeof ba),
                  nt_tensor_describe(p->B, bb, sizeof bb), nt_tensor_describe(p->D, bd, sizeof bd),
                  desc);
}

/* The real call: D itself, C per the plan (a fresh copy of D for c_copy plans). A plan that
 * may still switch to c_copy does so when refused (nothing was launched) and retries. */
static nt_status run_matmul(nt_ctx *ctx, gemm_cache *c, plan *pl, const nt_gemm_problem *p) {
  void *copy = NULL;
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  nt_status st = NT_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    if (pl->c_copy) {
      size_t bytes = nt_gemm_lt_d_extent(p);
      if ((st = nt_alloc(ctx, bytes, &copy))) return st;
      st = NT_CUDA(ctx, cudaMemcpyAsync(copy, p->D->data, bytes, cudaMemcpyDeviceToDevice,
                                        nt_cuda_stream(ctx)));
      if (st) break;
    }
    s = nt_gemm_lt_launch(ctx, pl, p, &pl->algo, p->D->data, copy ? copy : c_pointer(p));
    if (!may_copy_c(pl, s)) break;
    if ((st = use_c_copy(ctx, c, pl))) break;
  }
  nt_free(ctx, copy);
  if (st) return st;
  return s == CUBLAS_STATUS_SUCCESS ? NT_OK : launch_error(ctx, pl, p, s);
}

/* Log level debug: each new plan with the kernel configuration it runs (to compare with what
 * CUBLASLT_LOG_LEVEL shows for torch). */
static void log_plan(nt_ctx *ctx, const plan *pl, const nt_gemm_problem *p) {
  if (ctx->opts.log < NT_LOG_DEBUG) return;
  char desc[640], algo[160];
  describe_plan(ctx, pl, p, desc, sizeof desc);
  nt_gemm_lt_describe_algo(&pl->algo, algo, sizeof algo);
  nt_log(ctx, NT_LOG_DEBUG, "gemm plan M %lld N %lld K %lld: candidate #%d: %s, workspace %zu [%s]",
         (long long)p->M, (long long)p->N, (long long)p->K, pl->chosen, algo, pl->ws_needed,
         desc);
}

/* Builds the plan for p: layouts, then the fused epilogue variants in order of preference,
 * then the plain product with a split epilogue. */
static nt_status build_plan(nt_ctx *ctx, gemm_cache *c, const plan_key *k,
                            const nt_gemm_problem *p, plan **out) {
  plan *pl = calloc(1, sizeof *pl);
  if (!pl) return NT_ERROR(ctx, NT_ERR_OOM, "gemm: out of host memory for a plan");
  pl->key = *k;
  nt_status st;
  if ((st = make_layout(ctx, c, &pl->la, p->B->dtype, k->opa, k->m, k->k, k->lda,
                        k->batch, k->sa)) ||
      (st = make_layout(ctx, c, &pl->lb, p->A->dtype, k->opb, k->k, k->n, k->ldb,
                        k->batch, k->sb)) ||
      (st = make_layout(ctx, c, &pl->ld, p->D->dtype, CUBLAS_OP_N, k->m, k->n, k->ldd,
                        k->batch, k->sd)))
    goto fail;
  /* FP8, beta 0: C is NULL with a layout of its own (D's type, the C type cuBLAS's FP8 table
   * pairs with a f32 / f16 / bf16 D). */
  if (is_fp8(p->A->dtype) && k->beta_zero &&
      (st = make_layout(ctx, c, &pl->lc, p->D->dtype, CUBLAS_OP_N, k->m, k->n, k->ldd,
                        k->batch, k->sd)))
    goto fail;

  cublasLtMatmulHeuristicResult_t res[NT_GEMM_HEURISTIC_CANDIDATES];
  int n = 0;
  const nt_gemm_opts *o = p->o;
  void *bias = (void *)bias_ptr(p);
  /* Always explicit: the default bias type differs between cases (FP8 kernels with an f32 D
   * expect bf16); a combination cuBLASLt rejects ends in the split epilogue. */
  int bias_t = bias ? (int)nt_gemm_lt_type(o->bias->dtype) : -1;
  switch (o->epilogue) {
    case NT_EPI_BIAS:
      st = try_desc(ctx, c, pl, p, CUBLASLT_EPILOGUE_BIAS, bias_t, bias, res, &n);
      break;
    case NT_EPI_RELU:
      st = try_desc(ctx, c, pl, p, bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU,
                    bias_t, bias, res, &n);
      break;
    case NT_EPI_GELU_AUX:
      if (k->ldx % 8 == 0)
        st = try_desc(ctx, c, pl, p,
                      bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias_t,
                      bias, res, &n);
      break;
    case NT_EPI_DGELU:
      if (k->ldx % 8 == 0) st = try_desc(ctx, c, pl, p, CUBLASLT_EPILOGUE_DGELU, -1, NULL, res, &n);
      break;
    default: break;
  }
  if (st) goto fail;
  bool ran = true;
  if (n > 0) {
    pl->algo = res[0].algo;
    pl->ws_needed = res[0].workspaceSize;
    if (c->autotune && (st = nt_gemm_lt_autotune(ctx, pl, p, res, n, &ran))) goto fail;
    /* The heuristic offered a fused variant but none of its kernels launched: split. */
    if (!ran && o->epilogue != NT_EPI_NONE) {
      cublasLtMatmulDescDestroy(pl->desc);
      pl->desc = NULL;
      n = 0;
    }
  }
  if (n == 0) {
    pl->split = o->epilogue != NT_EPI_NONE;
    if ((st = try_desc(ctx, c, pl, p, CUBLASLT_EPILOGUE_DEFAULT, -1, NULL, res, &n))) goto fail;
    if (n == 0) {
      char ba[96], bb[96], bd[96];
      st = NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "gemm: cuBLASLt offers no algorithm (%s) for A %s, B %s -> D %s (m %lld n "
                    "%lld k %lld batch %lld, leading dims %lld/%lld/%lld, alignments %d/%d/%d "
                    "bytes)", cublasLtGetStatusString(pl->heuristic_status),
                    nt_tensor_describe(p->A, ba, sizeof ba), nt_tensor_describe(p->B, bb, sizeof bb),
                    nt_tensor_describe(p->D, bd, sizeof bd), (long long)p->M, (long long)p->N,
                    (long long)p->K, (long long)p->batch, (long long)k->ldb, (long long)k->lda,
                    (long long)k->ldd, k->align_b, k->align_a, k->align_d);
      goto fail;
    }
    if (pl->split) c->stats.split_epilogues++;
    pl->algo = res[0].algo;
    pl->ws_needed = res[0].workspaceSize;
    if (c->autotune && (st = nt_gemm_lt_autotune(ctx, pl, p, res, n, &ran))) goto fail;
    if (!ran && may_copy_c(pl, pl->launch_status)) {
      if ((st = use_c_copy(ctx, c, pl))) goto fail;
      pl->launch_status = CUBLAS_STATUS_SUCCESS;
      if ((st = nt_gemm_lt_autotune(ctx, pl, p, res, n, &ran))) goto fail;
    }
    if (!ran) {  /* offered, but no candidate launches: name the configuration */
      st = launch_error(ctx, pl, p, pl->launch_status);
      goto fail;
    }
  }
  log_plan(ctx, pl, p);
  *out = pl;
  return NT_OK;
fail:
  plan_free(pl);
  return st;
}

static nt_status split_epilogue(nt_ctx *ctx, const nt_gemm_problem *p) {
  const nt_gemm_opts *o = p->o;
  nt_dtype dt = p->D->dtype;
  const void *bias = bias_ptr(p);
  nt_dtype bias_dt = bias ? o->bias->dtype : dt;
  switch (o->epilogue) {
    case NT_EPI_BIAS:
      return nt_gemmk_bias_act(ctx, dt, p->D->data, p->d_m, p->d_batch, NULL, 0, 0, bias, bias_dt,
                               p->M, p->N, p->batch, NT_GEMMK_ACT_NONE);
    case NT_EPI_RELU:
      return nt_gemmk_bias_act(ctx, dt, p->D->data, p->d_m, p->d_batch, NULL, 0, 0, bias, bias_dt,
                               p->M, p->N, p->batch, NT_GEMMK_ACT_RELU);
    case NT_EPI_GELU_AUX:
      return nt_gemmk_bias_act(ctx, dt, p->D->data, p->d_m, p->d_batch, o->aux->data, p->x_m, 0,
                               bias, bias_dt, p->M, p->N, p->batch, NT_GEMMK_ACT_GELU);
    case NT_EPI_DGELU:
      return nt_gemmk_dgelu(ctx, dt, p->D->data, p->d_m, o->aux->data, p->x_m, p->M, p->N);
    default: return NT_OK;
  }
}

/* Seen on the H200 (cuBLASLt 13.1): FP8 scale pointers that are not 16-byte aligned (e.g.
 * adjacent floats of a scaling-state array) make cublasLtMatmul return NOT_SUPPORTED after the
 * heuristic accepted them. Such scales are copied, on the stream (graph-capturable), into
 * aligned slots of the cache, and the product reads those. */
static nt_status stage_fp8_scales(nt_ctx *ctx, gemm_cache *c, const nt_gemm_problem *p,
                                  nt_gemm_opts *o, nt_gemm_problem *q) {
  *q = *p;
  if (!is_fp8(p->A->dtype) || !(((uintptr_t)o->scale_inv_a | (uintptr_t)o->scale_inv_b) % 16))
    return NT_OK;
  nt_status st = NT_OK;
  if (!c->fp8_scales && (st = nt_alloc(ctx, 8 * sizeof(float), (void **)&c->fp8_scales)))
    return st;
  const float **src[2] = {&o->scale_inv_a, &o->scale_inv_b};
  for (int i = 0; i < 2 && !st; i++) {
    if (!*src[i] || (uintptr_t)*src[i] % 16 == 0) continue;
    float *slot = c->fp8_scales + 4 * i;
    st = NT_CUDA(ctx, cudaMemcpyAsync(slot, *src[i], sizeof(float), cudaMemcpyDeviceToDevice,
                                      nt_cuda_stream(ctx)));
    *src[i] = slot;
  }
  q->o = o;
  return st;
}

nt_status nt_gemm_cuda(nt_ctx *ctx, const nt_gemm_problem *orig) {
  gemm_cache *c = NULL;
  nt_status st = get_cache(ctx, &c);
  if (st) return st;
  nt_gemm_opts staged = *orig->o;
  nt_gemm_problem staged_p;
  if ((st = stage_fp8_scales(ctx, c, orig, &staged, &staged_p))) return st;
  const nt_gemm_problem *p = &staged_p;
  plan_key k;
  if ((st = make_key(ctx, c, p, &k))) return st;
  plan *pl = cache_find(c, &k);
  if (pl) {
    c->stats.hits++;
  } else {
    c->stats.misses++;
    if ((st = build_plan(ctx, c, &k, p, &pl))) return st;
    if ((st = cache_insert(ctx, c, pl))) {
      plan_free(pl);
      return st;
    }
  }
  /* Per-call pointers on the cached descriptor (no descriptor is created here). */
  if (!pl->split) {
    const void *bias = bias_ptr(p);
    if (bias && (st = SET(ctx, pl->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias))) return st;
    if ((p->o->epilogue == NT_EPI_GELU_AUX || p->o->epilogue == NT_EPI_DGELU)) {
      void *aux = p->o->aux->data;
      if ((st = SET(ctx, pl->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux))) return st;
    }
  }
  if (k.has_scale & 2) {
    const float *s = p->o->scale_inv_b;
    if ((st = SET(ctx, pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s))) return st;
  }
  if (k.has_scale & 1) {
    const float *s = p->o->scale_inv_a;
    if ((st = SET(ctx, pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s))) return st;
  }
  if ((st = run_matmul(ctx, c, pl, p))) return st;
  return pl->split ? split_epilogue(ctx, p) : NT_OK;
}

#endif /* NT_HAVE_CUDA */
