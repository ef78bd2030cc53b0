/* gemm_probe: why cuBLAS (torch.matmul's cublasGemmEx) beats nanotrain's cuBLASLt plans on a few
 * bf16 shapes (bench/RESULTS.md "GEMM, bf16"), measured the way a training step runs them:
 * sustained (the GPU power-limited after back-to-back work), not in a quick isolated round.
 *
 *   gemm_probe [--shapes all|NAME[,NAME...]] [--cands 32] [--warm-ms 150] [--no-curve]
 *
 * For each shape, the same row-major product D[M,N] = op(A) op(B) (bf16 in/out, fp32 compute)
 * is posed to cuBLASLt in four formulations:
 *   T.col  D^T = op(B)^T op(A)^T, every matrix column-major (what ops/gemm_cuda.c does)
 *   T.row  the same orientation, A and B described as CUBLASLT_ORDER_ROW (ops flipped)
 *   D.row  D = op(A) op(B) directly, A, B, C and D all CUBLASLT_ORDER_ROW
 *   D.col  D = op(A) op(B), A and B column-major (ops flipped), C and D ORDER_ROW
 * Each formulation's heuristic list (up to --cands, 32 MiB workspace) is printed with every
 * candidate's configuration and the kernel(s) it launches (read from a captured CUDA graph),
 * and each candidate is timed sustained: back-to-back for --warm-ms first, then 3 samples of
 * enough calls for ~10 ms (at least 7), the median per call. cublasGemmEx with torch's
 * arguments (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP, default math mode, 32 MiB
 * workspace) is timed the same way before and after the formulations: the reference, and its
 * output the correctness reference (each formulation's fastest candidate must match it within
 * max|diff| / max|ref| < 1e-2, else the line says WRONG). The first shape also gets a warm-up
 * curve: reference and fastest candidate timed after 1 s idle and 0..400 ms of warm-up, to show
 * how long the clocks take to settle (the library's NT_GEMM_SUSTAINED warm-up budget).
 *
 * Lines: "CAND shape form #i ms tflops cfg kernels", "REF ...", "CURVE ...", and at the end
 * "SUMMARY shape form status ncand best_ms best_tflops ref_ms ref_tflops ratio check cfg".
 * Inputs are random normal, one copy (small shapes may sit in L2, for both sides alike). Tile
 * ids are cublasLtMatmulTile_t values (run_gemm_probe.sh appends their names). */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "core/convert.h"
#include "core/rng.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WS_BYTES ((size_t)32 << 20)
#define MAX_CANDS 64

typedef struct {
  const char *name;
  int64_t M, N, K;
  bool ta, tb;
} shape;

/* As bench_gemm.c names them: dW = dy^T x (trans_a), dx = dy W (NN). */
static const shape SHAPES[] = {
    {"gpt2.lmhead.fwd", 16384, 50304, 768, false, true},
    {"gpt2.lmhead.dW", 50304, 768, 16384, true, false},
    {"gpt2.lmhead.dx", 16384, 768, 50304, false, false},
    {"square.8192", 8192, 8192, 8192, false, false},
    {"small.proj.dx", 16384, 384, 384, false, false},
};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

typedef struct {
  const char *name, *what;
  bool direct;               /* cuBLASLt's D is our D (ORDER_ROW), else our D^T (column-major) */
  cublasLtOrder_t in_order;  /* how A and B are described */
} form;

static const form FORMS[] = {
    {"T.col", "D^T = op(B)^T op(A)^T, all column-major (nanotrain's)", false, CUBLASLT_ORDER_COL},
    {"T.row", "D^T = op(B)^T op(A)^T, A/B ORDER_ROW (ops flipped), D column-major", false,
     CUBLASLT_ORDER_ROW},
    {"D.row", "D = op(A) op(B), A/B/C/D ORDER_ROW", true, CUBLASLT_ORDER_ROW},
    {"D.col", "D = op(A) op(B), A/B column-major (ops flipped), C/D ORDER_ROW", true,
     CUBLASLT_ORDER_COL},
};
enum { NFORMS = sizeof FORMS / sizeof FORMS[0] };

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "gemm_probe: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_),    \
              __FILE__, __LINE__);                                                      \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* ---- launches, as closures so that timing and kernel naming are shared ---- */

typedef struct {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  const void *a, *b;
  void *d;
  const cublasLtMatmulAlgo_t *algo;
  void *ws;
  cudaStream_t s;
} lt_call;

typedef struct {
  cublasHandle_t h;
  cublasOperation_t opa, opb;
  int m, n, k, lda, ldb, ldc;
  const void *a, *b;
  void *c;
} ex_call;

typedef int (*launch_fn)(const void *arg);

static int launch_lt(const void *arg) {
  const lt_call *c = arg;
  float alpha = 1.0f, beta = 0.0f;
  return (int)cublasLtMatmul(c->h, c->desc, &alpha, c->a, c->la, c->b, c->lb, &beta, c->d, c->ld,
                             c->d, c->ld, c->algo, c->ws, WS_BYTES, c->s);
}

static int launch_ex(const void *arg) {
  const ex_call *c = arg;
  float alpha = 1.0f, beta = 0.0f;
  return (int)cublasGemmEx(c->h, c->opa, c->opb, c->m, c->n, c->k, &alpha, c->a, CUDA_R_16BF,
                           c->lda, c->b, CUDA_R_16BF, c->ldb, &beta, c->c, CUDA_R_16BF, c->ldc,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void idle_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  nanosleep(&ts, NULL);
}

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Sustained ms per call: one untimed call (module loading), one timed call to size the rest,
 * warm_ms of back-to-back calls, then 3 samples of enough calls for ~10 ms (>= 7); median.
 * Returns < 0 when a launch fails. *isolated gets the single timed call. */
static float sustained_ms(launch_fn f, const void *arg, cudaStream_t s, double warm_ms,
                          float *isolated) {
  cudaEvent_t ev[4];
  for (int i = 0; i < 4; i++) CK(cudaEventCreate(&ev[i]));
  float out = -1.0f, t1 = 0.0f;
  *isolated = -1.0f;
  if (f(arg) != 0) goto done;
  CK(cudaEventRecord(ev[0], s));
  if (f(arg) != 0) goto done;
  CK(cudaEventRecord(ev[1], s));
  CK(cudaEventSynchronize(ev[1]));
  CK(cudaEventElapsedTime(&t1, ev[0], ev[1]));
  *isolated = t1;
  if (t1 <= 0) t1 = 1e-3f;
  long nw = (long)ceil(warm_ms / t1);
  if (nw > 200000) nw = 200000;
  for (long i = 0; i < nw; i++) (void)f(arg);
  int k = (int)ceil(10.0 / t1);
  if (k < 7) k = 7;
  if (k > 20000) k = 20000;
  float smp[3];
  CK(cudaEventRecord(ev[0], s));
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < k; i++) (void)f(arg);
    CK(cudaEventRecord(ev[r + 1], s));
  }
  CK(cudaEventSynchronize(ev[3]));
  for (int r = 0; r < 3; r++) {
    CK(cudaEventElapsedTime(&smp[r], ev[r], ev[r + 1]));
    smp[r] /= (float)k;
  }
  qsort(smp, 3, sizeof *smp, cmp_f);
  out = smp[1];
done:
  (void)cudaGetLastError();
  for (int i = 0; i < 4; i++) cudaEventDestroy(ev[i]);
  return out;
}

/* The kernels one call launches, by name, from a captured graph ("?" when unknown). */
static void kernel_names(launch_fn f, const void *arg, cudaStream_t s, char *buf, size_t n) {
  snprintf(buf, n, "(capture failed)");
  cudaGraph_t g = NULL;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  int rc = f(arg);
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || rc != 0 || !g) {
    (void)cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    return;
  }
  size_t nn = 0;
  cudaGraphNode_t nodes[16];
  if (cudaGraphGetNodes(g, NULL, &nn) != cudaSuccess) nn = 0;
  if (nn > 16) nn = 16;
  if (nn && cudaGraphGetNodes(g, nodes, &nn) != cudaSuccess) nn = 0;
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < nn; i++) {
    enum cudaGraphNodeType t;
    const char *name = NULL;
    if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) continue;
    if (t == cudaGraphNodeTypeKernel) {
      CUDA_KERNEL_NODE_PARAMS p;
      memset(&p, 0, sizeof p);
      if (cuGraphKernelNodeGetParams((CUgraphNode)nodes[i], &p) == CUDA_SUCCESS) {
        if (p.func) (void)cuFuncGetName(&name, p.func);
        else if (p.kern) (void)cuKernelGetName(&name, p.kern);
      }
      if (!name) name = "?";
    } else if (t == cudaGraphNodeTypeMemset) {
      name = "(memset)";
    } else {
      name = "(other node)";
    }
    int w = snprintf(buf + used, n - used, "%s%s", used ? " + " : "", name);
    if (w < 0 || (size_t)w >= n - used) break;
    used += (size_t)w;
  }
  (void)cudaGetLastError();
  cudaGraphDestroy(g);
}

/* ---- cuBLASLt formulations ---- */

/* A stored row-major matrix S (r x c, row stride ld) given to cuBLASLt so that op(layout) is
 * S (want_t false) or S^T: ORDER_ROW describes S itself, ORDER_COL describes S^T (the same
 * memory read column-major). */
static cublasStatus_t present(cublasLtMatrixLayout_t *l, int64_t r, int64_t c, int64_t ld,
                              bool want_t, cublasLtOrder_t ord, cublasOperation_t *op) {
  bool row = ord == CUBLASLT_ORDER_ROW;
  *op = want_t == row ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t st = cublasLtMatrixLayoutCreate(l, CUDA_R_16BF, (uint64_t)(row ? r : c),
                                                 (uint64_t)(row ? c : r), ld);
  int32_t o = (int32_t)ord;
  if (st == CUBLAS_STATUS_SUCCESS && row)
    st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_ORDER, &o, sizeof o);
  return st;
}

typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  const void *a, *b;
  cublasStatus_t status;  /* of building the descriptors, then of the heuristic */
  cublasLtMatmulHeuristicResult_t res[MAX_CANDS];
  int n;
  int64_t m, nn, k;
  char ops[3];
} formulation;

static void form_free(formulation *F) {
  if (F->desc) cublasLtMatmulDescDestroy(F->desc);
  if (F->la) cublasLtMatrixLayoutDestroy(F->la);
  if (F->lb) cublasLtMatrixLayoutDestroy(F->lb);
  if (F->ld) cublasLtMatrixLayoutDestroy(F->ld);
  memset(F, 0, sizeof *F);
}

static void form_make(cublasLtHandle_t h, const shape *s, const form *fm, const void *A,
                      const void *B, int cands, formulation *F) {
  memset(F, 0, sizeof *F);
  /* Our storage: A is [K, M] (ta) or [M, K], B is [N, K] (tb) or [K, N], D is [M, N]. */
  int64_t ar = s->ta ? s->K : s->M, ac = s->ta ? s->M : s->K;
  int64_t br = s->tb ? s->N : s->K, bc = s->tb ? s->K : s->N;
  cublasOperation_t opa, opb, opd;
  cublasStatus_t st;
  if (fm->direct) {  /* cuBLASLt A = op(A), B = op(B), D = D */
    F->a = A; F->b = B;
    F->m = s->M; F->nn = s->N;
    st = present(&F->la, ar, ac, ac, s->ta, fm->in_order, &opa);
    if (!st) st = present(&F->lb, br, bc, bc, s->tb, fm->in_order, &opb);
    if (!st) st = present(&F->ld, s->M, s->N, s->N, false, CUBLASLT_ORDER_ROW, &opd);
  } else {           /* cuBLASLt A = op(B)^T, B = op(A)^T, D = D^T */
    F->a = B; F->b = A;
    F->m = s->N; F->nn = s->M;
    st = present(&F->la, br, bc, bc, !s->tb, fm->in_order, &opa);
    if (!st) st = present(&F->lb, ar, ac, ac, !s->ta, fm->in_order, &opb);
    if (!st) st = present(&F->ld, s->M, s->N, s->N, true, CUBLASLT_ORDER_COL, &opd);
  }
  F->k = s->K;
  F->ops[0] = opa == CUBLAS_OP_T ? 'T' : 'N';
  F->ops[1] = opb == CUBLAS_OP_T ? 'T' : 'N';
  if (!st && opd != CUBLAS_OP_N) st = CUBLAS_STATUS_INTERNAL_ERROR;  /* D is never transposed */
  if (!st) st = cublasLtMatmulDescCreate(&F->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (!st) st = cublasLtMatmulDescSetAttribute(F->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  if (!st) st = cublasLtMatmulDescSetAttribute(F->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  cublasLtMatmulPreference_t pref = NULL;
  uint64_t ws = WS_BYTES;
  if (!st) st = cublasLtMatmulPreferenceCreate(&pref);
  if (!st) st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ws, sizeof ws);
  if (!st) st = cublasLtMatmulAlgoGetHeuristic(h, F->desc, F->la, F->lb, F->ld, F->ld, pref,
                                               cands, F->res, &F->n);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (st) F->n = 0;
  F->status = st;
}

static void cfg_str(const cublasLtMatmulAlgo_t *a, char *buf, size_t n) {
  int32_t id = 0, splitk = 1;
  uint32_t tile = 0, stages = 0, red = 0, swz = 0, custom = 0;
  uint16_t cluster = 0, inner = 0;
  size_t w;
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof stages, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof splitk, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                             sizeof red, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                             sizeof swz, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                             sizeof custom, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof cluster, &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner,
                                             sizeof inner, &w);
  snprintf(buf, n, "algo %d tile %u stages %u cluster %u custom %u splitK %d red %u swizzle %u "
           "inner %u", id, tile, stages, cluster, custom, splitk, red, swz, inner);
}

/* ---- correctness ---- */

static float bf16_to_f(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* max |got - ref| / max |ref| over n bf16 values; d is on the device. */
static double check_against(const uint16_t *ref, const void *d, size_t n, uint16_t *tmp) {
  CK(cudaMemcpy(tmp, d, n * sizeof *tmp, cudaMemcpyDeviceToHost));
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    double r = bf16_to_f(ref[i]), g = bf16_to_f(tmp[i]);
    double e = fabs(g - r);
    if (!(e <= md)) md = e;  /* NaN counts as the largest */
    if (fabs(r) > mr) mr = fabs(r);
  }
  return mr > 0 ? md / mr : md;
}

/* ---- the probe ---- */

typedef struct {
  int status;  /* 0 ok, 1 rejected by cuBLASLt, 2 nothing launched */
  int ncand, best;
  float best_ms;
  double check;
  char cfg[200];
  cublasLtMatmulAlgo_t best_algo;
} form_result;

static nt_status random_bf16(nt_ctx *ctx, nt_tensor *t, int64_t rows, int64_t cols,
                             uint64_t seed) {
  int64_t shp[2] = {rows, cols};
  nt_tensor f;
  nt_status st = nt_tensor_alloc(ctx, t, NT_BF16, 2, shp);
  if (st) return st;
  if ((st = nt_tensor_alloc(ctx, &f, NT_F32, 2, shp))) return st;
  st = nt_rng_normal(ctx, &f, seed, 0, 0.0f, 1.0f);
  if (!st) st = nt_convert(ctx, t, &f);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &f);
  return st;
}

static double tflops(const shape *s, float ms) {
  return ms > 0 ? 2.0 * (double)s->M * (double)s->N * (double)s->K / ((double)ms * 1e9) : 0.0;
}

static void curve(const char *who, launch_fn f, const void *arg, cudaStream_t s,
                  const shape *sh) {
  static const double warms[] = {0, 10, 30, 60, 150, 400};
  printf("CURVE %s %s (1 s idle, then warm-up ms -> sustained ms):", sh->name, who);
  for (size_t i = 0; i < sizeof warms / sizeof *warms; i++) {
    idle_ms(1000);
    float iso;
    float ms = sustained_ms(f, arg, s, warms[i], &iso);
    printf(" %g:%.4f", warms[i], (double)ms);
  }
  printf("\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *which = "all";
  int cands = 32;
  double warm_ms = 150;
  bool do_curve = true;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--shapes") && i + 1 < argc) which = argv[++i];
    else if (!strcmp(argv[i], "--cands") && i + 1 < argc) cands = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warm-ms") && i + 1 < argc) warm_ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--no-curve")) do_curve = false;
    else {
      fprintf(stderr,
              "usage: gemm_probe [--shapes all|NAME[,NAME...]] [--cands 32] [--warm-ms 150] "
              "[--no-curve]\nshapes:");
      for (int j = 0; j < NSHAPES; j++) fprintf(stderr, " %s", SHAPES[j].name);
      fprintf(stderr, "\n");
      return 2;
    }
  }
  if (cands < 1) cands = 1;
  if (cands > MAX_CANDS) cands = MAX_CANDS;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "gemm_probe: no GPU\n");
    return 77;
  }
  nt_ctx *ctx = NULL;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "gemm_probe: %s\n", nt_last_error(ctx));
    return 1;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("gemm_probe: %s, cuBLASLt %zu, cuBLAS %d, CUDA runtime %zu; candidates %d, warm-up %g ms\n",
         prop.name, cublasLtGetVersion(), CUBLAS_VERSION, cublasLtGetCudartVersion(), cands,
         warm_ms);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  cublasHandle_t cb;
  void *ws_lt, *ws_cb;
  CK(cudaMalloc(&ws_lt, WS_BYTES));
  CK(cudaMalloc(&ws_cb, WS_BYTES));
  if (cublasLtCreate(&lt) || cublasCreate(&cb) || cublasSetStream(cb, s) ||
      cublasSetWorkspace(cb, ws_cb, WS_BYTES) || cublasSetMathMode(cb, CUBLAS_DEFAULT_MATH)) {
    fprintf(stderr, "gemm_probe: cuBLAS / cuBLASLt setup failed\n");
    return 1;
  }
  form_result summary[NSHAPES][NFORMS];
  float ref_ms[NSHAPES][2];
  bool ran[NSHAPES];
  memset(summary, 0, sizeof summary);
  memset(ran, 0, sizeof ran);
  double t_start = now_s();
  bool first = true;
  for (int si = 0; si < NSHAPES; si++) {
    const shape *sh = &SHAPES[si];
    if (strcmp(which, "all") && !strstr(which, sh->name)) continue;
    ran[si] = true;
    nt_tensor A, B, D;
    int64_t dshape[2] = {sh->M, sh->N};
    if (random_bf16(ctx, &A, sh->ta ? sh->K : sh->M, sh->ta ? sh->M : sh->K, 1) ||
        random_bf16(ctx, &B, sh->tb ? sh->N : sh->K, sh->tb ? sh->K : sh->N, 2) ||
        nt_tensor_alloc(ctx, &D, NT_BF16, 2, dshape)) {
      fprintf(stderr, "gemm_probe: %s: %s\n", sh->name, nt_last_error(ctx));
      return 1;
    }
    size_t nd = (size_t)(sh->M * sh->N);
    uint16_t *ref = malloc(nd * sizeof *ref), *tmp = malloc(nd * sizeof *tmp);
    if (!ref || !tmp) {
      fprintf(stderr, "gemm_probe: out of host memory\n");
      return 1;
    }
    printf("\nSHAPE %s M %lld N %lld K %lld op %c%c (row-major: D = %sA %sB)\n", sh->name,
           (long long)sh->M, (long long)sh->N, (long long)sh->K, sh->ta ? 'T' : 'N',
           sh->tb ? 'T' : 'N', sh->ta ? "A^T " : "", sh->tb ? "B^T" : "B");
    /* cublasGemmEx as torch calls it: column-major D^T = op(B)^T op(A)^T. */
    ex_call ex = {cb,
                  sh->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                  sh->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                  (int)sh->N, (int)sh->M, (int)sh->K,
                  (int)(sh->tb ? sh->K : sh->N), (int)(sh->ta ? sh->M : sh->K), (int)sh->N,
                  B.data, A.data, D.data};
    char kn[1024];
    kernel_names(launch_ex, &ex, s, kn, sizeof kn);
    float iso;
    ref_ms[si][0] = sustained_ms(launch_ex, &ex, s, warm_ms, &iso);
    printf("REF %s cublasGemmEx (%c%c m %d n %d k %d) isolated %.4f ms, sustained %.4f ms "
           "%.1f TFLOP/s; kernels: %s\n", sh->name, ex.opa == CUBLAS_OP_T ? 'T' : 'N',
           ex.opb == CUBLAS_OP_T ? 'T' : 'N', ex.m, ex.n, ex.k, (double)iso,
           (double)ref_ms[si][0], tflops(sh, ref_ms[si][0]), kn);
    CK(cudaMemsetAsync(D.data, 0, nd * 2, s));
    if (launch_ex(&ex) != 0) {
      fprintf(stderr, "gemm_probe: cublasGemmEx failed on %s\n", sh->name);
      return 1;
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(ref, D.data, nd * sizeof *ref, cudaMemcpyDeviceToHost));
    formulation best_F;
    memset(&best_F, 0, sizeof best_F);
    float best_all = -1;
    int best_form = -1;
    for (int fi = 0; fi < NFORMS; fi++) {
      const form *fm = &FORMS[fi];
      form_result *R = &summary[si][fi];
      formulation F;
      form_make(lt, sh, fm, A.data, B.data, cands, &F);
      printf("FORM %s %s: %s; cuBLASLt m %lld n %lld k %lld op %c%c; heuristic %s, %d "
             "candidate(s)\n", sh->name, fm->name, fm->what, (long long)F.m, (long long)F.nn,
             (long long)F.k, F.ops[0], F.ops[1], cublasLtGetStatusString(F.status), F.n);
      fflush(stdout);
      R->ncand = F.n;
      R->best = -1;
      R->best_ms = -1;
      R->check = -1;
      R->status = F.status || F.n == 0 ? 1 : 2;
      for (int i = 0; i < F.n; i++) {
        char cfg[200];
        cfg_str(&F.res[i].algo, cfg, sizeof cfg);
        if (F.res[i].state != CUBLAS_STATUS_SUCCESS) {
          printf("CAND %s %s #%-2d state %s [%s]\n", sh->name, fm->name, i,
                 cublasLtGetStatusString(F.res[i].state), cfg);
          continue;
        }
        lt_call c = {lt, F.desc, F.la, F.lb, F.ld, F.a, F.b, D.data, &F.res[i].algo, ws_lt, s};
        kernel_names(launch_lt, &c, s, kn, sizeof kn);
        float ms = sustained_ms(launch_lt, &c, s, warm_ms, &iso);
        if (ms < 0) {
          printf("CAND %s %s #%-2d launch failed [%s] ws %zu\n", sh->name, fm->name, i, cfg,
                 F.res[i].workspaceSize);
          continue;
        }
        printf("CAND %s %s #%-2d isolated %.4f ms, sustained %.4f ms %.1f TFLOP/s [%s] ws %zu "
               "waves %.2f; kernels: %s\n", sh->name, fm->name, i, (double)iso, (double)ms,
               tflops(sh, ms), cfg, F.res[i].workspaceSize, (double)F.res[i].wavesCount, kn);
        fflush(stdout);
        if (R->best < 0 || ms < R->best_ms) {
          R->best = i;
          R->best_ms = ms;
          R->best_algo = F.res[i].algo;
          snprintf(R->cfg, sizeof R->cfg, "%s", cfg);
        }
      }
      if (R->best >= 0) {
        R->status = 0;
        lt_call c = {lt, F.desc, F.la, F.lb, F.ld, F.a, F.b, D.data, &R->best_algo, ws_lt, s};
        CK(cudaMemsetAsync(D.data, 0, nd * 2, s));
        if (launch_lt(&c) == 0) {
          CK(cudaStreamSynchronize(s));
          R->check = check_against(ref, D.data, nd, tmp);
        }
        printf("CHECK %s %s #%d max|diff|/max|ref| %.3g %s\n", sh->name, fm->name, R->best,
               R->check, R->check >= 0 && R->check < 1e-2 ? "ok" : "WRONG");
        if (R->check >= 0 && R->check < 1e-2 && (best_all < 0 || R->best_ms < best_all)) {
          best_all = R->best_ms;
          best_form = fi;
          form_free(&best_F);
          best_F = F;  /* kept for the curve */
          continue;
        }
      }
      form_free(&F);
    }
    float iso2;
    ref_ms[si][1] = sustained_ms(launch_ex, &ex, s, warm_ms, &iso2);
    printf("REF %s cublasGemmEx again: sustained %.4f ms %.1f TFLOP/s\n", sh->name,
           (double)ref_ms[si][1], tflops(sh, ref_ms[si][1]));
    if (first && do_curve) {
      curve("cublasGemmEx", launch_ex, &ex, s, sh);
      if (best_form >= 0) {
        lt_call c = {lt, best_F.desc, best_F.la, best_F.lb, best_F.ld, best_F.a, best_F.b,
                     D.data, &summary[si][best_form].best_algo, ws_lt, s};
        char who[64];
        snprintf(who, sizeof who, "cuBLASLt-%s#%d", FORMS[best_form].name,
                 summary[si][best_form].best);
        curve(who, launch_lt, &c, s, sh);
      }
    }
    first = false;
    form_free(&best_F);
    free(ref);
    free(tmp);
    nt_tensor_free(ctx, &A);
    nt_tensor_free(ctx, &B);
    nt_tensor_free(ctx, &D);
    printf("(%.0f s so far)\n", now_s() - t_start);
  }
  printf("\nSUMMARY shape form status ncand best_ms best_TFLOPs ref_ms ref_TFLOPs ratio check "
         "[best config]\n");
  for (int si = 0; si < NSHAPES; si++) {
    if (!ran[si]) continue;
    const shape *sh = &SHAPES[si];
    /* The reference's better (lower) sustained time of its two measurements. */
    float r0 = ref_ms[si][0], r1 = ref_ms[si][1];
    float rm = r0 > 0 && (r1 <= 0 || r0 < r1) ? r0 : r1;
    for (int fi = 0; fi < NFORMS; fi++) {
      const form_result *R = &summary[si][fi];
      const char *stt = R->status == 0 ? "ok" : R->status == 1 ? "rejected" : "no-launch";
      printf("SUMMARY %-15s %-5s %-9s %2d %8.4f %6.1f %8.4f %6.1f %6.3f %-9.3g [%s]\n", sh->name,
             FORMS[fi].name, stt, R->ncand, (double)R->best_ms, tflops(sh, R->best_ms),
             (double)rm, tflops(sh, rm), R->best_ms > 0 && rm > 0 ? (double)(rm / R->best_ms) : 0.0,
             R->check, R->cfg);
    }
  }
  printf("(ratio = cublasGemmEx ms / best candidate ms: >= 0.95 meets the bar; check must be "
         "< 1e-2)\ntotal %.0f s\n", now_s() - t_start);
  cublasDestroy(cb);
  cublasLtDestroy(lt);
  cudaFree(ws_lt);
  cudaFree(ws_cb);
  cudaStreamDestroy(s);
  nt_ctx_free(ctx);
  return 0;
}
