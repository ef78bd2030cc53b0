/* GEMM throughput of nt_gemm (cuBLASLt) at the linear layers of the small GPT (nanoGPT
 * shakespeare_char: 64 x 256 tokens, C 384, vocab 65) and GPT-2 124M (16 x 1024 tokens, C 768,
 * vocab 50304), forward and both backward products, plus 8192^3.
 *
 *   bench_gemm [--dtype bf16|f16] [--repeats 20] [--shapes all|small|gpt2|square|NAME]
 *              [--no-graph] [--list]
 *
 * One line per shape: "RESULT name M N K ta tb ms tflops inner rot graph", and at the end
 * "TUNE searched N won N timed N verified N rejected N splitk_plans N tune_s S
 * workspace_needed B" (the plan cache's search counters, NT_GEMM_SEARCH). A repeat times a
 * batch of `inner` calls (enough for >= 2 ms) between CUDA events; ms is the median per call
 * after warm-up (which also covers the plan cache's first-use autotuning). The batch is
 * replayed as a CUDA graph (unless --no-graph or capture fails: graph 0), so host overhead
 * per call is out of the measurement, as bench_gemm.py does for torch. Inputs are random
 * normal; when a shape's A + B + D fit in 4x the L2 cache, call i uses copy i % rot, so every
 * call reads from HBM. bench_gemm.py runs this per shape and times torch right after with the
 * same inner, rot and repeats. --list prints the shape names. */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "ops/gemm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct {
  const char *name;
  int64_t M, N, K;
  bool ta, tb;
} shape;

#define MAX_SHAPES 40
#define MAX_ROT 16

/* A linear layer y[R, out] = x[R, in] W^T: forward (TN), dx = dy W (NN), dW = dy^T x (NT in
 * our row-major terms: trans_a). */
static int add_linear(shape *s, int n, const char *model, const char *layer, int64_t R,
                      int64_t in, int64_t out) {
  static char names[MAX_SHAPES][64];
  const char *kinds[3] = {"fwd", "dx", "dW"};
  for (int i = 0; i < 3 && n < MAX_SHAPES; i++) {
    snprintf(names[n], sizeof names[n], "%s.%s.%s", model, layer, kinds[i]);
    if (i == 0) s[n] = (shape){names[n], R, out, in, false, true};
    if (i == 1) s[n] = (shape){names[n], R, in, out, false, false};
    if (i == 2) s[n] = (shape){names[n], out, in, R, true, false};
    n++;
  }
  return n;
}

static int make_shapes(const char *which, shape *s) {
  int n = 0;
  bool all = !strcmp(which, "all");
  if (all || !strcmp(which, "small")) {
    int64_t R = 64 * 256, C = 384;
    n = add_linear(s, n, "small", "qkv", R, C, 3 * C);
    n = add_linear(s, n, "small", "proj", R, C, C);
    n = add_linear(s, n, "small", "fc", R, C, 4 * C);
    n = add_linear(s, n, "small", "fcproj", R, 4 * C, C);
    n = add_linear(s, n, "small", "lmhead", R, C, 65);
  }
  if (all || !strcmp(which, "gpt2")) {
    int64_t R = 16 * 1024, C = 768;
    n = add_linear(s, n, "gpt2", "qkv", R, C, 3 * C);
    n = add_linear(s, n, "gpt2", "proj", R, C, C);
    n = add_linear(s, n, "gpt2", "fc", R, C, 4 * C);
    n = add_linear(s, n, "gpt2", "fcproj", R, 4 * C, C);
    n = add_linear(s, n, "gpt2", "lmhead", R, C, 50304);
  }
  if (all || !strcmp(which, "square")) s[n++] = (shape){"square.8192", 8192, 8192, 8192, 0, 0};
  if (n == 0) {  /* one shape by name */
    shape every[MAX_SHAPES];
    int m = make_shapes("all", every);
    for (int i = 0; i < m; i++)
      if (!strcmp(every[i].name, which)) s[n++] = every[i];
  }
  return n;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static nt_status random_tensor(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int64_t rows,
                               int64_t cols, uint64_t seed) {
  nt_tensor f;
  int64_t shp[2] = {rows, cols};
  nt_status st = nt_tensor_alloc(ctx, t, dt, 2, shp);
  if (st) return st;
  if ((st = nt_tensor_alloc(ctx, &f, NT_F32, 2, shp))) return st;
  st = nt_rng_normal(ctx, &f, seed, 0, 0.0f, 1.0f);
  if (!st) st = nt_convert(ctx, t, &f);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &f);
  return st;
}

typedef struct {
  double ms;
  int inner, rot;
  bool graph;
} bench_result;

#ifdef NT_HAVE_CUDA
/* The batch of `inner` calls captured once into a graph on the context's stream; NULL when
 * capture is not possible (then the caller runs the calls eagerly). */
static cudaGraphExec_t capture_batch(nt_ctx *ctx, nt_tensor *A, nt_tensor *B, nt_tensor *D,
                                     int rot, int inner, const nt_gemm_opts *o) {
  cudaStream_t cs = (cudaStream_t)nt_ctx_stream(ctx);
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  nt_status st = NT_OK;
  for (int i = 0; i < inner && !st; i++) st = nt_gemm(ctx, &A[i % rot], &B[i % rot], &D[i % rot], o);
  cudaError_t ce = cudaStreamEndCapture(cs, &g);
  if (!st && ce == cudaSuccess && g && cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) exec = NULL;
  if (g) cudaGraphDestroy(g);
  if (st || ce != cudaSuccess) {
    fprintf(stderr, "bench_gemm: graph capture failed (%s), timing eagerly\n",
            st ? nt_last_error(ctx) : cudaGetErrorString(ce));
    (void)cudaGetLastError();
  }
  return exec;
}

static nt_status launch_graph(nt_ctx *ctx, cudaGraphExec_t exec) {
  cudaError_t e = cudaGraphLaunch(exec, (cudaStream_t)nt_ctx_stream(ctx));
  if (e == cudaSuccess) return NT_OK;
  fprintf(stderr, "bench_gemm: cudaGraphLaunch: %s\n", cudaGetErrorString(e));
  return NT_ERR_CUDA;
}
#endif

static nt_status bench_one(nt_ctx *ctx, const shape *s, nt_dtype dt, int repeats, size_t l2,
                           bool use_graph, bench_result *out) {
  nt_tensor A[MAX_ROT], B[MAX_ROT], D[MAX_ROT];
  memset(A, 0, sizeof A); memset(B, 0, sizeof B); memset(D, 0, sizeof D);
  nt_event *e0 = NULL, *e1 = NULL;
  float *times = calloc((size_t)repeats, sizeof *times);
  size_t es = nt_dtype_size(dt);
  size_t set = (size_t)(s->M * s->K + s->K * s->N + s->M * s->N) * es;
  int rot = set < 4 * l2 ? (int)((4 * l2 + set - 1) / set) : 1;
  if (rot > MAX_ROT) rot = MAX_ROT;
  nt_status st = times ? NT_OK : NT_ERR_OOM;
  for (int r = 0; r < rot && !st; r++) {
    st = random_tensor(ctx, &A[r], dt, s->ta ? s->K : s->M, s->ta ? s->M : s->K, 1 + 3 * r);
    if (!st) st = random_tensor(ctx, &B[r], dt, s->tb ? s->N : s->K, s->tb ? s->K : s->N, 2 + 3 * r);
    if (!st) st = nt_tensor_alloc(ctx, &D[r], dt, 2, (int64_t[]){s->M, s->N});
  }
  if (!st) st = nt_event_create(ctx, &e0, true);
  if (!st) st = nt_event_create(ctx, &e1, true);
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_a = s->ta;
  o.trans_b = s->tb;
  /* Warm-up (plan creation and autotuning happen here), then the batch size per repeat. */
  for (int i = 0; i < 3 && !st; i++) st = nt_gemm(ctx, &A[i % rot], &B[i % rot], &D[i % rot], &o);
  float ms = 0;
  int inner = 1;
  if (!st) st = nt_event_record(ctx, e0, NULL);
  for (int i = 0; i < 5 && !st; i++) st = nt_gemm(ctx, &A[i % rot], &B[i % rot], &D[i % rot], &o);
  if (!st) st = nt_event_record(ctx, e1, NULL);
  if (!st) st = nt_event_synchronize(ctx, e1);
  if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &ms);
  if (!st && ms > 0) inner = (int)(2.0f / (ms / 5)) + 1;
  if (inner > 2000) inner = 2000;
  bool graph = false;
#ifdef NT_HAVE_CUDA
  cudaGraphExec_t exec = NULL;
  if (!st && use_graph) exec = capture_batch(ctx, A, B, D, rot, inner, &o);
  graph = exec != NULL;
  if (graph) st = launch_graph(ctx, exec);  /* upload and warm */
#else
  (void)use_graph;
#endif
  for (int r = 0; r < repeats && !st; r++) {
    st = nt_event_record(ctx, e0, NULL);
#ifdef NT_HAVE_CUDA
    if (graph && !st) st = launch_graph(ctx, exec);
#endif
    for (int i = 0; i < inner && !st && !graph; i++) {
      int k = i % rot;  /* the same call sequence as the graph's */
      st = nt_gemm(ctx, &A[k], &B[k], &D[k], &o);
    }
    if (!st) st = nt_event_record(ctx, e1, NULL);
    if (!st) st = nt_event_synchronize(ctx, e1);
    if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &times[r]);
    times[r] /= (float)inner;
  }
  if (!st) {
    qsort(times, (size_t)repeats, sizeof *times, cmp_float);
    out->ms = times[repeats / 2];
    out->inner = inner;
    out->rot = rot;
    out->graph = graph;
  }
#ifdef NT_HAVE_CUDA
  if (exec) cudaGraphExecDestroy(exec);
#endif
  for (int r = 0; r < rot; r++) {
    nt_tensor_free(ctx, &A[r]); nt_tensor_free(ctx, &B[r]); nt_tensor_free(ctx, &D[r]);
  }
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  free(times);
  return st;
}

int main(int argc, char **argv) {
  const char *dtype = "bf16", *which = "all";
  int repeats = 20;
  bool use_graph = true, list = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) which = argv[++i];
    else if (!strcmp(argv[i], "--no-graph")) use_graph = false;
    else if (!strcmp(argv[i], "--list")) list = true;
    else {
      fprintf(stderr, "usage: %s [--dtype bf16|f16] [--repeats N] "
              "[--shapes all|small|gpt2|square|NAME] [--no-graph] [--list]\n", argv[0]);
      return 2;
    }
  }
  if (list) {
    shape every[MAX_SHAPES];
    int m = make_shapes(which, every);
    for (int i = 0; i < m; i++) printf("%s\n", every[i].name);
    return 0;
  }
  nt_dtype dt;
  if (!nt_dtype_parse(dtype, &dt) || (dt != NT_BF16 && dt != NT_F16)) {
    fprintf(stderr, "bench_gemm: --dtype must be bf16 or f16\n");
    return 2;
  }
  if (repeats < 1) repeats = 1;
  nt_ctx *ctx;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "bench_gemm: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  size_t l2 = (size_t)50 << 20;
#ifdef NT_HAVE_CUDA
  int l2b = 0;
  if (cudaDeviceGetAttribute(&l2b, cudaDevAttrL2CacheSize, 0) == cudaSuccess && l2b > 0)
    l2 = (size_t)l2b;
#endif
  shape s[MAX_SHAPES];
  int n = make_shapes(which, s);
  if (n == 0) {
    fprintf(stderr, "bench_gemm: no shape named %s (--list prints them)\n", which);
    nt_ctx_free(ctx);
    return 2;
  }
  const nt_ctx_options *opt = nt_ctx_opts(ctx);
  printf("# nt_gemm %s, median of %d repeats, autotune %s, gemm_search %d, L2 %zu MiB\n",
         dtype, repeats, opt->gemm_autotune ? "on" : "off", opt->gemm_search, l2 >> 20);
  printf("%-22s %6s %6s %6s %3s %3s %10s %9s %5s %3s %5s\n", "# shape", "M", "N", "K", "ta",
         "tb", "ms", "TFLOP/s", "inner", "rot", "graph");
  int rc = 0;
  for (int i = 0; i < n; i++) {
    bench_result r = {0};
    nt_status st = bench_one(ctx, &s[i], dt, repeats, l2, use_graph, &r);
    if (st) {
      fprintf(stderr, "bench_gemm: %s: %s\n", s[i].name, nt_last_error(ctx));
      rc = 1;
      continue;
    }
    double tflops = 2.0 * (double)s[i].M * (double)s[i].N * (double)s[i].K / (r.ms * 1e-3) / 1e12;
    printf("RESULT %-15s %6lld %6lld %6lld %3d %3d %10.4f %9.1f %5d %3d %5d\n", s[i].name,
           (long long)s[i].M, (long long)s[i].N, (long long)s[i].K, s[i].ta, s[i].tb, r.ms,
           tflops, r.inner, r.rot, r.graph);
    fflush(stdout);
  }
  nt_gemm_stats gs;
  nt_gemm_get_stats(ctx, &gs);
  printf("# plans %llu, autotuned %llu, descriptors %llu\n", (unsigned long long)gs.plans,
         (unsigned long long)gs.autotuned, (unsigned long long)gs.descriptors);
  /* One machine-readable line for bench_gemm.py: the one-time tuning cost and what it found. */
  printf("TUNE searched %llu won %llu timed %llu verified %llu rejected %llu splitk_plans %llu "
         "tune_s %.3f workspace_needed %llu\n",
         (unsigned long long)gs.searched, (unsigned long long)gs.search_won,
         (unsigned long long)gs.search_timed, (unsigned long long)gs.search_verified,
         (unsigned long long)gs.search_rejected, (unsigned long long)gs.splitk_plans,
         (double)gs.tune_us * 1e-6, (unsigned long long)gs.workspace_needed);
  nt_ctx_free(ctx);
  return rc;
}
