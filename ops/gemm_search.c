/* The GEMM autotuner's candidates: which cuBLASLt configurations a new plan times (gemm_tune.c
 * times them, checks results and keeps the fastest).
 *
 * Candidates, in the order they are timed (option gemm_search, see gemm.h):
 *   heur   cuBLASLt's heuristic list: the top 32 (the plan's), then up to 128 / 512 when widened
 *   algo   per algorithm id (cublasLtMatmulAlgoGetIds), the heuristic limited to that id
 *          (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID): the library's own best configurations of
 *          algorithms its overall list ranks low
 *   enum   for the algorithm ids of the fastest candidates so far (every id when exhaustive):
 *          each tile x stages pair the id's capabilities list, validated by AlgoCheck
 *   var    around the fastest few: split-K (with each reduction scheme the algorithm supports),
 *          CTA swizzle, cluster shape (sm_90+), custom option and stages variants, one attribute
 *          at a time
 *   combo  per base, the best value of every attribute that helped, combined
 * Every built configuration must pass cublasLtMatmulAlgoCheck with a workspace need within the
 * context's workspace (and, below mode 2, a wave count within WAVES_MAX x the heuristic first
 * choice's). Each is run once untimed (lazy module loading; whether it launches at
 * all) and once timed; the fastest few (within PRUNE of the fastest, at most final_max, always
 * with the heuristic list's fastest) then get TUNE_ROUNDS samples of REPS runs each, taken
 * round-robin so clock changes hit every candidate alike, and the median decides; another
 * configuration must beat the heuristic's first choice by 3% to replace it, and products of
 * >= 100 GFLOP keep the first choice untimed (gemm_tune.c).
 * Configurations built from ids and attributes are not the heuristic's vetted choices: a kept
 * one is first compared with the heuristic's kernel on the same inputs (checksums of D, see
 * gemm_internal.h) and dropped beyond the dtype's tolerance.
 *
 * Cost, by design (to be measured on the H200): per timed configuration two runs of the product
 * plus one host sync (~20 us). Mode 1 times at most ~650 configurations per shape (heuristic
 * 128 + per-id 160 + enumerated 192 + variants and combos up to the 640 cap), so about
 * 1300 product runs: ~0.05 s for the small GPT's 16384x384x384 products, ~0.3-0.5 s for
 * GPT-2's 16384x768x3072 ones, capped at 6 s of quick-round GPU time per shape (products of
 * >= 100 GFLOP, such as GPT-2's logits, are not timed in mode 1); AlgoCheck calls (<= 20000)
 * add up to tens of ms of host time. A GPT-2 training run has ~15 distinct shapes: a few s
 * once. Under 1 GFLOP nothing changes (the heuristic's 32, as before). Mode 2
 * (diagnosis) times up to 8192 configurations, up to 60 s of GPU time per shape. Once per shape
 * and context. */
#include "ops/gemm_internal.h"
#include <math.h>
#include <string.h>

bool nt_gemm_search_wide(int mode, double flop) {
  return mode == 2 || (mode == 1 && flop >= NT_GEMM_SEARCH_MIN_FLOP);
}

double nt_gemm_search_tol(nt_dtype in, nt_dtype out, bool tf32) {
  if (in == NT_FP8_E4M3 || in == NT_FP8_E5M2) return 2e-2;
  if (out == NT_BF16) return 1e-2;
  if (out == NT_F16) return 2e-3;
  if (in == NT_F32) return tf32 ? 2e-3 : 1e-5;
  return 1e-3;  /* 16-bit inputs, f32 out: kernels differ only in the order of accumulation */
}

void nt_gemm_checksum_cpu(nt_dtype dt, const void *d, int64_t d_m, int64_t d_batch, int64_t M,
                          int64_t N, int64_t batch, double sums[NT_GEMM_NSUMS]) {
  memset(sums, 0, NT_GEMM_NSUMS * sizeof *sums);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double x = nt_load_f32(d, dt, b * d_batch + m * d_m + n);
        uint64_t h = nt_gemm_mix64((uint64_t)((b * M + m) * N + n));
        sums[0] += x * x;
        for (int j = 0; j < NT_GEMM_NPROJ; j++) sums[1 + j] += ((h >> j) & 1) ? -x : x;
      }
}

double nt_gemm_checksum_rel_diff(const double *cand, const double *ref) {
  for (int i = 0; i < NT_GEMM_NSUMS; i++)
    if (!isfinite(cand[i]) || !isfinite(ref[i])) return INFINITY;
  double e2 = 0;
  for (int j = 1; j < NT_GEMM_NSUMS; j++) e2 += (cand[j] - ref[j]) * (cand[j] - ref[j]);
  double e = sqrt(e2 / NT_GEMM_NPROJ), nr = sqrt(ref[0]), dn = fabs(sqrt(cand[0]) - nr);
  if (dn > e) e = dn;  /* | ||c|| - ||r|| | <= ||c - r|| */
  if (nr > 0) return e / nr;
  return e > 0 ? INFINITY : 0.0;
}

#ifdef NT_HAVE_CUDA
#include "ops/gemm_tune.h"
#include "core/ctx_internal.h"
#include <stdlib.h>

const char *const nt_gemm_src_name[NSRC] = {"heur", "algo", "enum", "var", "combo"};

#define WAVES_MAX 8.0f

/* gemm_search 0 (and 1 under 1 GFLOP): the heuristic's 32, as before the search existed. */
static const limits LIM_HEUR = {NT_GEMM_HEURISTIC_CANDIDATES, 0, 0, 0, 0, 0, 0,
                                NT_GEMM_HEURISTIC_CANDIDATES, NT_GEMM_HEURISTIC_CANDIDATES, 0, 1e30};
static const limits LIM_WIDE = {128, 8, 160, 3, 192, 4, 3, 640, 8, 20000, 6000.0};
static const limits LIM_ALL = {512, 64, 2048, 0, 4096, 8, 15, 8192, 16, 200000, 60000.0};

static const int32_t splitk_wide[] = {2, 3, 4, 6, 8, 16};
static const int32_t splitk_all[] = {2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
enum { NSPLITK_WIDE = 6, NSPLITK_ALL = 11 };
_Static_assert(sizeof splitk_wide / sizeof *splitk_wide == NSPLITK_WIDE, "split-K list size");
_Static_assert(sizeof splitk_all / sizeof *splitk_all == NSPLITK_ALL, "split-K list size");
static const uint16_t cluster_list[] = {
    CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
    CUBLASLT_CLUSTER_SHAPE_1x4x1, CUBLASLT_CLUSTER_SHAPE_4x2x1, CUBLASLT_CLUSTER_SHAPE_2x4x1,
    CUBLASLT_CLUSTER_SHAPE_8x1x1, CUBLASLT_CLUSTER_SHAPE_1x8x1};
enum { CLUSTERS_WIDE = 7, CLUSTERS_ALL = 11 };
_Static_assert(sizeof cluster_list / sizeof *cluster_list == CLUSTERS_ALL, "cluster list size");

static uint64_t fnv(const void *p, size_t n, uint64_t salt) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull ^ salt;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h ? h : 1;  /* 0 marks an empty slot */
}

/* Inserts h; false when it was already there. Out of host memory the table stops growing and,
 * once full, everything counts as new (duplicates are only timed twice). */
static bool seen_add(tuner *T, uint64_t h) {
  if (2 * (T->seen_n + 1) > T->seen_cap) {
    size_t cap = T->seen_cap ? 2 * T->seen_cap : 1024;
    uint64_t *s = calloc(cap, sizeof *s);
    if (s) {
      for (size_t i = 0; i < T->seen_cap; i++) {
        if (!T->seen[i]) continue;
        size_t j = T->seen[i] & (cap - 1);
        while (s[j]) j = (j + 1) & (cap - 1);
        s[j] = T->seen[i];
      }
      free(T->seen);
      T->seen = s;
      T->seen_cap = cap;
    } else if (T->seen_n + 1 >= T->seen_cap) {
      return true;
    }
  }
  size_t j = h & (T->seen_cap - 1);
  while (T->seen[j]) {
    if (T->seen[j] == h) return false;
    j = (j + 1) & (T->seen_cap - 1);
  }
  T->seen[j] = h;
  T->seen_n++;
  return true;
}

static void cfg_read(const cublasLtMatmulAlgo_t *a, lt_cfg *g) {
  memset(g, 0, sizeof *g);
  size_t w;
  g->splitk = 1;
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &g->id, sizeof g->id, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &g->tile,
                                             sizeof g->tile, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &g->stages,
                                             sizeof g->stages, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &g->splitk,
                                             sizeof g->splitk, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                             &g->reduction, sizeof g->reduction, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &g->swizzle,
                                             sizeof g->swizzle, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &g->custom,
                                             sizeof g->custom, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &g->inner,
                                             sizeof g->inner, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                             &g->cluster, sizeof g->cluster, &w);
}

int nt_gemm_search_cfg_str(const lt_cfg *g, char *buf, size_t n) {
  return snprintf(buf, n,
                  "algo %d tile %u stages %u splitK %d reduction %u swizzle %u custom %u "
                  "cluster %u inner %u",
                  g->id, g->tile, g->stages, g->splitk, g->reduction, g->swizzle, g->custom,
                  g->cluster, g->inner);
}

void nt_gemm_lt_describe_algo(const cublasLtMatmulAlgo_t *algo, char *buf, size_t n) {
  lt_cfg g;
  cfg_read(algo, &g);
  nt_gemm_search_cfg_str(&g, buf, n);
}

const limits *nt_gemm_search_limits(bool wide, bool all) {
  return all ? &LIM_ALL : wide ? &LIM_WIDE : &LIM_HEUR;
}

static cand *push(tuner *T, const cublasLtMatmulAlgo_t *a, size_t ws, float waves, int src,
                  int rank) {
  if (T->n == T->cap) {
    int cap = T->cap ? 2 * T->cap : 256;
    cand *v = realloc(T->v, (size_t)cap * sizeof *v);
    if (!v) return NULL;
    T->v = v;
    T->cap = cap;
  }
  cand *x = &T->v[T->n++];
  memset(x, 0, sizeof *x);
  x->algo = *a;
  cfg_read(a, &x->cfg);
  x->ws = ws;
  x->waves = waves;
  x->t1 = x->tm = -1.0f;
  x->rank = rank;
  x->base = -1;
  x->src = (uint8_t)src;
  T->added[src]++;
  return x;
}

/* A candidate cuBLASLt returned (heuristic): new unless the same algorithm bytes were seen. Its
 * configuration is remembered too, so that enumeration does not rebuild it. */
static void add_returned(tuner *T, const cublasLtMatmulHeuristicResult_t *r, int src, int rank) {
  if (r->state != CUBLAS_STATUS_SUCCESS || r->workspaceSize > T->ctx->workspace_bytes) return;
  if (!seen_add(T, fnv(&r->algo, sizeof r->algo, 1))) return;
  cand *x = push(T, &r->algo, r->workspaceSize, r->wavesCount, src, rank);
  if (x) (void)seen_add(T, fnv(&x->cfg, sizeof x->cfg, 2));
}

void nt_gemm_search_add_list(tuner *T, const cublasLtMatmulHeuristicResult_t *res, int n) {
  for (int i = 0; i < n; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    /* Taken as returned (it met the preference); remembered so the search does not redo it. */
    (void)seen_add(T, fnv(&res[i].algo, sizeof res[i].algo, 1));
    cand *x = push(T, &res[i].algo, res[i].workspaceSize, res[i].wavesCount, SRC_HEUR, i);
    if (x) (void)seen_add(T, fnv(&x->cfg, sizeof x->cfg, 2));
    if (T->ref_waves <= 0) T->ref_waves = res[i].wavesCount;
  }
}

/* A configuration built from attributes: validated by AlgoCheck, new unless its attributes were
 * seen (a returned candidate with the same ones included). Below the exhaustive mode, one whose
 * wave count is over WAVES_MAX x the heuristic first choice's is skipped: tiny tiles (or a
 * large split-K) on a big product run many times slower and would eat the time budget. */
static cand *add_built(tuner *T, const cublasLtMatmulAlgo_t *a, int src) {
  if (T->checks >= T->check_stop) return NULL;
  lt_cfg g;
  cfg_read(a, &g);
  /* Seen (returned, built, or refused before): no second AlgoCheck. */
  if (!seen_add(T, fnv(&g, sizeof g, 2))) return NULL;
  T->checks++;
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  plan *pl = T->pl;
  if (cublasLtMatmulAlgoCheck(T->h, pl->desc, pl->la, pl->lb, nt_gemm_lt_c_layout(pl), pl->ld, a,
                              &r) != CUBLAS_STATUS_SUCCESS ||
      r.workspaceSize > T->ctx->workspace_bytes)
    return NULL;
  if (!T->all && T->ref_waves > 0 && r.wavesCount > WAVES_MAX * T->ref_waves) {
    T->pruned++;
    return NULL;
  }
  return push(T, a, r.workspaceSize, r.wavesCount, src, -1);
}

static bool set_u32(cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at, uint32_t v) {
  return cublasLtMatmulAlgoConfigSetAttribute(a, at, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

static bool set_i32(cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at, int32_t v) {
  return cublasLtMatmulAlgoConfigSetAttribute(a, at, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

static bool set_u16(cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at, uint16_t v) {
  return cublasLtMatmulAlgoConfigSetAttribute(a, at, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

/* An array capability (tile or stages ids): the count first, then the values. 0 if none. */
static int cap_array(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t at,
                     uint32_t **out) {
  size_t bytes = 0;
  *out = NULL;
  if (cublasLtMatmulAlgoCapGetAttribute(a, at, NULL, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
      bytes < sizeof(uint32_t))
    return 0;
  uint32_t *v = malloc(bytes);
  size_t w = 0;
  if (!v || cublasLtMatmulAlgoCapGetAttribute(a, at, v, bytes, &w) != CUBLAS_STATUS_SUCCESS) {
    free(v);
    return 0;
  }
  *out = v;
  return (int)(w / sizeof(uint32_t));
}

static int32_t cap_i32(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t at) {
  int32_t v = 0;
  size_t w;
  return cublasLtMatmulAlgoCapGetAttribute(a, at, &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS ? v : 0;
}

static uint32_t cap_u32(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t at,
                        uint32_t dflt) {
  uint32_t v = 0;
  size_t w;
  return cublasLtMatmulAlgoCapGetAttribute(a, at, &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS ? v
                                                                                             : dflt;
}

/* Heuristic limited to each algorithm id: cuBLASLt's best configurations per algorithm. */
static void add_per_algo(tuner *T, const int *ids, int nids) {
  cublasLtMatmulPreference_t pref = NULL;
  if (nt_gemm_lt_pref(T->ctx, T->c, &T->pl->key, &pref)) {
    nt_clear_error(T->ctx);
    return;
  }
  uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
  cublasLtMatmulHeuristicResult_t *r = calloc((size_t)T->L->per_algo, sizeof *r);
  plan *pl = T->pl;
  cublasComputeType_t ct = nt_gemm_lt_compute(&pl->key);
  if (r && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode,
                                                sizeof mode) == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < nids && T->added[SRC_ALGO] < T->L->algo_max; i++) {
      cublasLtMatmulAlgo_t a;
      if (cublasLtMatmulAlgoInit(T->h, ct, CUDA_R_32F, T->ta, T->tb, T->td, T->td, ids[i], &a) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      for (int j = 0; j < T->L->per_algo; j++) r[j].algo = a;
      int got = 0;
      if (cublasLtMatmulAlgoGetHeuristic(T->h, pl->desc, pl->la, pl->lb, nt_gemm_lt_c_layout(pl),
                                         pl->ld, pref, T->L->per_algo, r, &got) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      for (int j = 0; j < got && T->added[SRC_ALGO] < T->L->algo_max; j++)
        add_returned(T, &r[j], SRC_ALGO, -1);
    }
  free(r);
  cublasLtMatmulPreferenceDestroy(pref);
}

/* More of the overall heuristic list than the plan asked for. */
static void add_more_heuristic(tuner *T) {
  cublasLtMatmulPreference_t pref = NULL;
  if (nt_gemm_lt_pref(T->ctx, T->c, &T->pl->key, &pref)) {
    nt_clear_error(T->ctx);
    return;
  }
  cublasLtMatmulHeuristicResult_t *r = calloc((size_t)T->L->heur, sizeof *r);
  int got = 0;
  plan *pl = T->pl;
  if (r && cublasLtMatmulAlgoGetHeuristic(T->h, pl->desc, pl->la, pl->lb,
                                          nt_gemm_lt_c_layout(pl), pl->ld, pref, T->L->heur, r,
                                          &got) == CUBLAS_STATUS_SUCCESS)
    for (int j = 0; j < got; j++) add_returned(T, &r[j], SRC_HEUR, j);
  free(r);
  cublasLtMatmulPreferenceDestroy(pref);
}

/* Every tile x stages configuration of the given algorithm ids that AlgoCheck accepts; when
 * more than enum_max pass, an even subsample of them (ids in order, so each keeps its share). */
static void add_enumerated(tuner *T, const int *ids, int nids) {
  plan *pl = T->pl;
  cublasComputeType_t ct = nt_gemm_lt_compute(&pl->key);
  int first = T->n;
  long limit = T->L->check_max / 2;  /* the other half is the variants' */
  for (int i = 0; i < nids && T->checks < limit; i++) {
    T->check_stop = T->checks + (limit - T->checks) / (nids - i);  /* each id its share */
    cublasLtMatmulAlgo_t a;
    if (cublasLtMatmulAlgoInit(T->h, ct, CUDA_R_32F, T->ta, T->tb, T->td, T->td, ids[i], &a) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    uint32_t epi_mask = cap_u32(&a, CUBLASLT_ALGO_CAP_EPILOGUE_MASK, 0xffffffffu);
    if ((epi_mask & (uint32_t)pl->lt_epi) != (uint32_t)pl->lt_epi) continue;
    uint32_t *tiles, *stages;
    int nt = cap_array(&a, CUBLASLT_ALGO_CAP_TILE_IDS, &tiles);
    int ns = cap_array(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, &stages);
    uint32_t undef = 0;  /* CUBLASLT_MATMUL_TILE_UNDEFINED / CUBLASLT_MATMUL_STAGES_UNDEFINED */
    for (int t = 0; t < (nt ? nt : 1); t++)
      for (int s = 0; s < (ns ? ns : 1); s++) {
        cublasLtMatmulAlgo_t b = a;
        if (!set_u32(&b, CUBLASLT_ALGO_CONFIG_TILE_ID, nt ? tiles[t] : undef) ||
            !set_u32(&b, CUBLASLT_ALGO_CONFIG_STAGES_ID, ns ? stages[s] : undef))
          continue;
        (void)add_built(T, &b, SRC_ENUM);
      }
    free(tiles);
    free(stages);
  }
  T->check_stop = T->L->check_max;
  int got = T->n - first;
  if (got <= T->L->enum_max) return;
  /* Keep an even subsample: entry k of the kept ones is entry k * got / enum_max. */
  for (int k = 0; k < T->L->enum_max; k++)
    T->v[first + k] = T->v[first + (int)((int64_t)k * got / T->L->enum_max)];
  T->n = first + T->L->enum_max;
  T->added[SRC_ENUM] -= got - T->L->enum_max;
}

static void add_variant(tuner *T, const cublasLtMatmulAlgo_t *a, int base, int group) {
  cand *x = add_built(T, a, SRC_VAR);
  if (!x) return;
  x->base = base;
  x->group = (uint8_t)group;
}

/* One attribute at a time around base candidate bi. */
static void add_variants(tuner *T, int bi) {
  cublasLtMatmulAlgo_t a = T->v[bi].algo;
  lt_cfg g = T->v[bi].cfg;
  cublasLtMatmulAlgo_t b;
  if (cap_u32(&a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, 0)) {
    b = a;
    if (set_u32(&b, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, g.swizzle ? 0u : 1u))
      add_variant(T, &b, bi, G_SWIZZLE);
  }
  if (T->c->cc >= 90) {
    int nc = T->all ? CLUSTERS_ALL : CLUSTERS_WIDE;
    for (int i = 0; i < nc; i++) {
      if (cluster_list[i] == g.cluster) continue;
      b = a;
      if (set_u16(&b, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster_list[i]))
        add_variant(T, &b, bi, G_CLUSTER);
    }
  }
  if (cap_i32(&a, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT)) {
    uint32_t red = cap_u32(&a, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, 0);
    const int32_t *sk = T->all ? splitk_all : splitk_wide;
    int nsk = T->all ? NSPLITK_ALL : NSPLITK_WIDE;
    if (g.splitk > 1) {  /* and without split-K */
      b = a;
      if (set_i32(&b, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1) &&
          set_u32(&b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_REDUCTION_SCHEME_NONE))
        add_variant(T, &b, bi, G_SPLITK);
    }
    for (int i = 0; i < nsk; i++)
      for (uint32_t r = 1; r < CUBLASLT_REDUCTION_SCHEME_MASK; r <<= 1) {
        if (!(red & r) || (sk[i] == g.splitk && r == g.reduction)) continue;
        b = a;
        if (set_i32(&b, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sk[i]) &&
            set_u32(&b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, r))
          add_variant(T, &b, bi, G_SPLITK);
      }
  }
  int32_t cmax = cap_i32(&a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
  if (cmax > T->L->custom_max) cmax = T->L->custom_max;
  for (int32_t o = 0; o <= cmax; o++) {
    if ((uint32_t)o == g.custom) continue;
    b = a;
    if (set_u32(&b, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, (uint32_t)o))
      add_variant(T, &b, bi, G_CUSTOM);
  }
  uint32_t *stages;
  int ns = cap_array(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, &stages);
  for (int i = 0; i < ns; i++) {
    if (stages[i] == g.stages) continue;
    b = a;
    if (set_u32(&b, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages[i])) add_variant(T, &b, bi, G_STAGES);
  }
  free(stages);
}

/* Per base, the best variant of each attribute that beat the base, all applied at once. */
static void add_combo(tuner *T, int bi) {
  int best[NGROUP];
  for (int g = 0; g < NGROUP; g++) best[g] = -1;
  for (int i = 0; i < T->n; i++) {
    const cand *x = &T->v[i];
    if (x->base != bi || x->state != ST_TIMED || x->t1 >= T->v[bi].t1) continue;
    if (best[x->group] < 0 || x->t1 < T->v[best[x->group]].t1) best[x->group] = i;
  }
  int improved = 0;
  cublasLtMatmulAlgo_t a = T->v[bi].algo;
  for (int g = 1; g < NGROUP; g++) {
    if (best[g] < 0) continue;
    const lt_cfg *c = &T->v[best[g]].cfg;
    bool ok = true;
    switch (g) {
      case G_SWIZZLE: ok = set_u32(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c->swizzle); break;
      case G_CLUSTER: ok = set_u16(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c->cluster); break;
      case G_SPLITK:
        ok = set_i32(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c->splitk) &&
             set_u32(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c->reduction);
        break;
      case G_CUSTOM: ok = set_u32(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c->custom); break;
      case G_STAGES: ok = set_u32(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, c->stages); break;
      default: break;
    }
    if (!ok) return;
    improved++;
  }
  if (improved >= 2) (void)add_built(T, &a, SRC_COMBO);
}

/* Algorithm ids of the fastest timed candidates, distinct, at most `max` (0: every id the
 * library lists). */
static int pick_ids(tuner *T, const int *all_ids, int n_all, int max, int *out) {
  if (max == 0) {
    memcpy(out, all_ids, (size_t)n_all * sizeof *out);
    return n_all;
  }
  int k = 0, cnt = 0;
  int *ix = nt_gemm_tune_by_speed(T, &cnt);
  for (int i = 0; i < cnt && k < max; i++) {
    int id = T->v[ix[i]].cfg.id;
    bool dup = false;
    for (int j = 0; j < k; j++) dup = dup || out[j] == id;
    if (!dup) out[k++] = id;
  }
  free(ix);
  return k;
}

/* The widened search after the heuristic list's quick round. */
nt_status nt_gemm_search_widen(tuner *T) {
  nt_status st = NT_OK;
  enum { MAX_IDS = 1024 };
  int *ids = malloc(2 * MAX_IDS * sizeof *ids), nids = 0;
  if (!ids) return NT_OK;  /* no host memory: the heuristic's list alone */
  plan *pl = T->pl;
  if (cublasLtMatmulAlgoGetIds(T->h, nt_gemm_lt_compute(&pl->key), CUDA_R_32F, T->ta, T->tb,
                               T->td, T->td, MAX_IDS, ids, &nids) != CUBLAS_STATUS_SUCCESS)
    nids = 0;
  T->nids = nids;
  add_more_heuristic(T);
  add_per_algo(T, ids, nids);
  if ((st = nt_gemm_tune_quick_round(T))) goto done;
  int *sel = ids + MAX_IDS;
  int nsel = pick_ids(T, ids, nids, T->L->enum_ids, sel);
  add_enumerated(T, sel, nsel);
  if ((st = nt_gemm_tune_quick_round(T))) goto done;
  /* Variants around the fastest distinct configurations. */
  int cnt = 0, nb = 0;
  int *ix = nt_gemm_tune_by_speed(T, &cnt);
  int *bases = malloc((size_t)(T->L->var_bases > 0 ? T->L->var_bases : 1) * sizeof *bases);
  for (int i = 0; ix && bases && i < cnt && nb < T->L->var_bases; i++) {
    bool dup = false;
    for (int j = 0; j < nb; j++)
      dup = dup || !memcmp(&T->v[bases[j]].cfg, &T->v[ix[i]].cfg, sizeof(lt_cfg));
    if (!dup) bases[nb++] = ix[i];
  }
  free(ix);
  for (int i = 0; i < nb; i++) add_variants(T, bases[i]);
  if (!(st = nt_gemm_tune_quick_round(T))) {
    for (int i = 0; i < nb; i++) add_combo(T, bases[i]);
    st = nt_gemm_tune_quick_round(T);
  }
  free(bases);
done:
  free(ids);
  return st;
}

#endif /* NT_HAVE_CUDA */
