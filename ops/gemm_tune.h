/* Private to ops/gemm_search.c (which configurations to try) and ops/gemm_tune.c (timing them,
 * checking results, keeping the fastest): the autotuner's state. */
#ifndef NT_OPS_GEMM_TUNE_H
#define NT_OPS_GEMM_TUNE_H
#ifdef NT_HAVE_CUDA
#include "ops/gemm_lt.h"

enum { SRC_HEUR, SRC_ALGO, SRC_ENUM, SRC_VAR, SRC_COMBO, NSRC };
extern const char *const nt_gemm_src_name[NSRC];
enum { ST_NEW, ST_TIMED, ST_FAILED, ST_SKIPPED, ST_REJECTED };
/* The attribute a variant changes (combos merge the best of each). */
enum { G_NONE, G_SWIZZLE, G_CLUSTER, G_SPLITK, G_CUSTOM, G_STAGES, NGROUP };

/* The configurable attributes of an algorithm (32 bytes, no padding: hashed as bytes). */
typedef struct {
  int32_t id, splitk;
  uint32_t tile, stages, reduction, swizzle, custom;
  uint16_t inner, cluster;
} lt_cfg;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  lt_cfg cfg;
  size_t ws;
  float waves;    /* cuBLASLt's wavesCount (CTAs over what the GPU runs at once) */
  float t1;       /* one timed run, ms; < 0 until timed */
  float tm;       /* median ms per call of the final rounds; < 0 if not a finalist */
  int rank;       /* position in the heuristic's list (heur), else -1 */
  int base;       /* var: the candidate it varies; else -1 */
  uint8_t src, state, group, verified;
} cand;

typedef struct {
  int heur;          /* heuristic results asked for */
  int per_algo;      /* results per algorithm id (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID) */
  int algo_max;      /* ... in all */
  int enum_ids;      /* algorithm ids whose tile x stages pairs are enumerated (0: every id) */
  int enum_max;      /* enumerated configurations kept (an even subsample beyond) */
  int var_bases;     /* fastest configurations whose variants are tried */
  int custom_max;    /* highest custom option tried */
  int total_max;     /* configurations timed (the heuristic's top 32 always are) */
  int final_max;     /* finalists timed to the median */
  long check_max;    /* AlgoCheck calls: half for enumeration, the rest for variants */
  double budget_ms;  /* GPU time of the quick rounds (both runs of each configuration) */
} limits;

typedef struct {
  nt_ctx *ctx;
  gemm_cache *c;
  plan *pl;
  const nt_gemm_problem *p;
  const limits *L;
  bool wide, all;
  cublasLtHandle_t h;
  cudaDataType_t ta, tb, td;
  cand *v;
  int n, cap;
  uint64_t *seen;          /* hashes of algorithms (bytes) and configurations, open addressing */
  size_t seen_cap, seen_n;
  void *dout;              /* where candidates write D */
  const void *c_in;
  bool zero_before_verify; /* D is read (beta != 0, in place on scratch): zero it first */
  cudaEvent_t e0, e1;
  double gpu_ms;           /* quick-round GPU time so far */
  long checks;             /* AlgoCheck calls */
  long check_stop;         /* no AlgoCheck past this count (per phase) */
  int nids;                /* algorithm ids cuBLASLt lists for the types */
  float ref_waves;         /* the heuristic's first choice's wavesCount */
  int pruned;              /* built configurations skipped for their wave count */
  int timed, failed, skipped, rejected, verified, splitk_verified;
  int added[NSRC];
  int ref;                 /* candidate whose result is the reference (-1: none yet) */
  double *sums_dev;        /* device: NT_GEMM_NSUMS for D */
  double ref_sums[NT_GEMM_NSUMS];
  bool ref_finite;
  double tol;
} tuner;

/* How much a search may try (gemm_search.c): the heuristic's 32 alone, widened, or all. */
const limits *nt_gemm_search_limits(bool wide, bool all);

/* Candidates (gemm_search.c). The plan's own heuristic list, as returned. */
void nt_gemm_search_add_list(tuner *T, const cublasLtMatmulHeuristicResult_t *res, int n);
/* The widened search: more heuristic results, per-algorithm results, enumerated
 * configurations and variants, each batch timed by nt_gemm_tune_quick_round. */
nt_status nt_gemm_search_widen(tuner *T);
int nt_gemm_search_cfg_str(const lt_cfg *g, char *buf, size_t n);

/* Timing (gemm_tune.c): one untimed and one timed run of every new candidate, within the
 * limits; and the indices of the timed candidates, fastest first (NULL: out of host memory). */
nt_status nt_gemm_tune_quick_round(tuner *T);
int *nt_gemm_tune_by_speed(tuner *T, int *count);

#endif
#endif
