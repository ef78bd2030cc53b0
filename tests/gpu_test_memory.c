/* The caching allocator on the GPU: a training-step pattern reaches a steady state with no
 * cudaMalloc; blocks do not overlap; a block recorded on another stream is held back until
 * that stream's work is done; out of memory is a clear error after which the pool still works;
 * frees from worker threads; pinned buffers are page-locked; a request that needs a new
 * segment during a CUDA graph capture is a clear error. */
#include "tests/testutil.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NT_HAVE_CUDA
int main(void) { return nt_test_skip("built without the CUDA backend"); }
#else
#include "tests/cuda_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static nt_mem_stats stats(nt_ctx *ctx) {
  nt_mem_stats s;
  nt_mem_get_stats(ctx, &s);
  return s;
}

static const size_t act_sizes[] = {4 * MiB, 12345, 1536 * KiB + 7, 777, 3 * MiB,
                                   48 * MiB + 3, 64 * KiB, 1, 11 * MiB + 511, 200 * KiB};
#define N_ACT (sizeof act_sizes / sizeof act_sizes[0])
#define N_LAYERS 6

/* Forward allocates and writes activations, backward frees them in reverse order. With
 * `verify`, every block gets its own byte and its first and last bytes are read back. */
static void training_step(nt_ctx *ctx, int verify) {
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  void *acts[N_LAYERS][N_ACT];
  for (int l = 0; l < N_LAYERS; l++)
    for (size_t i = 0; i < N_ACT; i++) {
      size_t n = act_sizes[(i + (size_t)l) % N_ACT];
      if (!CHECK_OK(ctx, nt_alloc(ctx, n, &acts[l][i]))) return;
      cuda_ok(cudaMemsetAsync(acts[l][i], (int)(l * N_ACT + i + 1), n, s), "memset activation");
    }
  if (verify) {
    int bad = 0;
    for (int l = 0; l < N_LAYERS; l++)
      for (size_t i = 0; i < N_ACT; i++) {
        size_t n = act_sizes[(i + (size_t)l) % N_ACT];
        unsigned char head = 0, tail = 0;
        cuda_ok(cudaMemcpyAsync(&head, acts[l][i], 1, cudaMemcpyDeviceToHost, s), "copy");
        cuda_ok(cudaMemcpyAsync(&tail, (char *)acts[l][i] + n - 1, 1, cudaMemcpyDeviceToHost, s),
                "copy");
        cuda_ok(cudaStreamSynchronize(s), "sync");
        unsigned char want = (unsigned char)(l * N_ACT + i + 1);
        bad += head != want || tail != want;
      }
    CHECK(bad == 0, "%d live activations were overwritten by another block", bad);
  }
  for (int l = N_LAYERS - 1; l >= 0; l--) {
    void *grad_tmp;
    CHECK_OK(ctx, nt_alloc(ctx, act_sizes[(size_t)l % N_ACT] + 13, &grad_tmp));
    cuda_ok(cudaMemsetAsync(grad_tmp, 0, act_sizes[(size_t)l % N_ACT] + 13, s), "memset grad");
    for (int i = (int)N_ACT - 1; i >= 0; i--) nt_free(ctx, acts[l][i]);
    nt_free(ctx, grad_tmp);
  }
}

static void test_training_pattern(nt_ctx *ctx) {
  void *weights;
  CHECK_OK(ctx, nt_alloc(ctx, 30 * MiB + 5, &weights));
  size_t base = stats(ctx).allocated;
  training_step(ctx, 1);
  nt_mem_stats first = stats(ctx);
  int steady = 1;
  for (int step = 2; step <= 100 && steady; step++) {
    training_step(ctx, step == 2 || step == 100);
    nt_mem_stats s = stats(ctx);
    if (s.n_system_allocs != first.n_system_allocs || s.reserved != first.reserved ||
        s.allocated != base) {
      steady = 0;
      fprintf(stderr, "step %d: cudaMalloc calls %llu (after step 1: %llu), reserved %zu (%zu)\n",
              step, (unsigned long long)s.n_system_allocs,
              (unsigned long long)first.n_system_allocs, s.reserved, first.reserved);
    }
  }
  CHECK(steady, "steady state: no cudaMalloc and constant reserved after the first step");
  CHECK(cuda_ok(cudaStreamSynchronize((cudaStream_t)nt_ctx_stream(ctx)), "sync"), "steps ran");
  char line[256];
  printf("  training pattern on the GPU: %s\n", nt_mem_describe(ctx, line, sizeof line));
  nt_free(ctx, weights);
}

/* Freed on the compute stream and allocated again on it: the same block, no sync needed. */
static void test_same_stream_reuse(nt_ctx *ctx) {
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  void *a, *b;
  CHECK_OK(ctx, nt_alloc(ctx, 5 * MiB, &a));
  cuda_ok(cudaMemsetAsync(a, 1, 5 * MiB, s), "memset");
  nt_free(ctx, a);
  uint64_t sys = stats(ctx).n_system_allocs;
  CHECK_OK(ctx, nt_alloc(ctx, 5 * MiB, &b));
  CHECK(a == b && stats(ctx).pending == 0 && stats(ctx).n_system_allocs == sys,
        "same-stream reuse at once");
  nt_free(ctx, b);
}

static void test_record_stream(nt_ctx *ctx) {
  void *other = NULL;
  if (!CHECK_OK(ctx, nt_stream_create(ctx, &other))) return;
  cudaStream_t os = (cudaStream_t)other;
  gate g = {0};
  const size_t n = 6 * MiB;
  char *x, *y, *z;
  CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&x));
  cuda_ok(cudaLaunchHostFunc(os, gate_wait, &g), "gate");
  cuda_ok(cudaMemsetAsync(x, 0xAB, n, os), "memset on the other stream");
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, x, other));
  nt_free(ctx, x);
  nt_mem_stats s = stats(ctx);
  CHECK(s.pending == n, "held back while the other stream works: pending %zu", s.pending);

  CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&y));
  CHECK(y + n <= x || x + n <= y, "a block still in use on another stream was handed out");
  CHECK(cudaStreamQuery(os) == cudaErrorNotReady, "the other stream is still blocked (test "
        "meaningful)");
  (void)cudaGetLastError();
  CHECK(stats(ctx).pending == n, "still pending");

  atomic_store(&g.open, 1);
  cuda_ok(cudaStreamSynchronize(os), "sync other");
  nt_free(ctx, y);
  uint64_t sys = stats(ctx).n_system_allocs;
  CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&z));   /* the event has completed: released */
  s = stats(ctx);
  CHECK(s.pending == 0 && s.n_system_allocs == sys, "released after the other stream: pending "
        "%zu", s.pending);
  nt_free(ctx, z);
  nt_stream_free(ctx, other);
}

static void test_oom(nt_ctx *ctx) {
  void *a, *c;
  CHECK_OK(ctx, nt_alloc(ctx, 256 * MiB, &a));
  nt_free(ctx, a);                                  /* cached */
  nt_mem_stats before = stats(ctx);
  const size_t ten_tb = (size_t)10000000000000ull;
  CHECK_ERR(ctx, NT_ERR_OOM, nt_alloc(ctx, ten_tb, &c));
  const char *msg = nt_last_error(ctx);
  CHECK(strstr(msg, "out of device memory") && strstr(msg, "requested 10000000000000 bytes") &&
        strstr(msg, "allocated") && strstr(msg, "reserved"), "message: %s", msg);
  nt_mem_stats s = stats(ctx);
  CHECK(s.n_cache_flushes == before.n_cache_flushes + 1, "cache flushed before the retry");
  CHECK(s.reserved + 256 * MiB <= before.reserved, "cached segments returned: reserved %zu -> "
        "%zu", before.reserved, s.reserved);
  CHECK(s.allocated == before.allocated, "failed alloc changes nothing");
  CHECK(cudaGetLastError() == cudaSuccess, "no lingering CUDA error");
  /* The pool and the device still work. */
  if (CHECK_OK(ctx, nt_alloc(ctx, 64 * MiB, &c))) {
    cuda_ok(cudaMemsetAsync(c, 3, 64 * MiB, (cudaStream_t)nt_ctx_stream(ctx)), "memset");
    unsigned char v = 0;
    cuda_ok(cudaStreamSynchronize((cudaStream_t)nt_ctx_stream(ctx)), "sync");  /* non-blocking */
    cuda_ok(cudaMemcpy(&v, (char *)c + 64 * MiB - 1, 1, cudaMemcpyDeviceToHost), "copy");
    CHECK(v == 3, "memory after OOM works");
    nt_free(ctx, c);
  }
}

typedef struct { nt_ctx *ctx; void **ptrs; int n; } free_job;

static void *free_worker(void *p) {
  free_job *j = p;
  for (int i = 0; i < j->n; i++) nt_free(j->ctx, j->ptrs[i]);
  return NULL;
}

typedef struct { nt_ctx *ctx; int id, bad; } alloc_job;

/* A fresh thread (no current device set) whose allocation needs a new segment: it must land
 * on the context's device. */
static void *alloc_worker(void *p) {
  alloc_job *j = p;
  void *a = NULL;
  if (nt_alloc(j->ctx, (size_t)(300 + j->id) * MiB, &a)) { j->bad++; return NULL; }
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, a) != cudaSuccess || attr.type != cudaMemoryTypeDevice ||
      attr.device != nt_ctx_device(j->ctx).index)
    j->bad++;
  nt_free(j->ctx, a);
  return NULL;
}

/* The loader's pattern: blocks allocated on the main thread, freed by worker threads. */
static void test_worker_frees(nt_ctx *ctx) {
  enum { N = 200, T = 4 };
  void *ptrs[N];
  size_t base = stats(ctx).allocated;
  for (int i = 0; i < N; i++) CHECK_OK(ctx, nt_alloc(ctx, (size_t)(i * 37 + 1) * KiB, &ptrs[i]));
  cuda_ok(cudaStreamSynchronize((cudaStream_t)nt_ctx_stream(ctx)), "sync");
  pthread_t th[T];
  free_job jobs[T];
  for (int t = 0; t < T; t++) {
    jobs[t] = (free_job){ctx, ptrs + t * (N / T), N / T};
    pthread_create(&th[t], NULL, free_worker, &jobs[t]);
  }
  for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
  CHECK(stats(ctx).allocated == base, "all freed by workers");

  alloc_job ajobs[T];
  uint64_t sys = stats(ctx).n_system_allocs;
  for (int t = 0; t < T; t++) {
    ajobs[t] = (alloc_job){ctx, t, 0};
    pthread_create(&th[t], NULL, alloc_worker, &ajobs[t]);
  }
  int bad = 0;
  for (int t = 0; t < T; t++) {
    pthread_join(th[t], NULL);
    bad += ajobs[t].bad;
  }
  CHECK(bad == 0, "%d worker allocations failed or landed on the wrong device", bad);
  CHECK(stats(ctx).n_system_allocs > sys && stats(ctx).allocated == base,
        "workers' segments came from cudaMalloc and were freed");
}

static void test_pinned_and_empty_cache(nt_ctx *ctx) {
  void *h;
  if (CHECK_OK(ctx, nt_pinned_alloc(ctx, 3 * MiB + 1, &h))) {
    struct cudaPointerAttributes attr;
    cuda_ok(cudaPointerGetAttributes(&attr, h), "attributes");
    CHECK(attr.type == cudaMemoryTypeHost, "pinned buffer is page-locked host memory");
    CHECK(stats(ctx).pinned >= 3 * MiB + 1, "pinned bytes counted");
    nt_pinned_free(ctx, h);
    CHECK(stats(ctx).pinned == 0, "pinned freed");
  }
  size_t free0 = 0, free1 = 0, total = 0;
  cuda_ok(cudaMemGetInfo(&free0, &total), "meminfo");
  nt_mem_stats s0 = stats(ctx);
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  nt_mem_stats s = stats(ctx);
  cuda_ok(cudaMemGetInfo(&free1, &total), "meminfo");
  /* Only the cuBLASLt workspace (its own segment) is still allocated. */
  CHECK(s.reserved == s.allocated, "empty_cache: reserved %zu, allocated %zu", s.reserved,
        s.allocated);
  CHECK(free1 >= free0 + (s0.reserved - s.reserved) / 2, "device memory returned: free %zu -> "
        "%zu", free0, free1);
  CHECK(s.fragmentation == 0.0, "nothing cached: fragmentation %g", s.fragmentation);
}

/* A request that needs a new segment while the stream is being captured is a clear error (a
 * cudaMalloc would invalidate the capture and fail some later launch instead); a cached block
 * is still handed out during the capture. */
static void test_alloc_in_capture(nt_ctx *ctx) {
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  void *warm = NULL, *a = NULL, *b = NULL;
  CHECK_OK(ctx, nt_alloc(ctx, 2 * MiB, &warm));
  nt_free(ctx, warm);
  cuda_ok(cudaStreamSynchronize(s), "sync");
  nt_mem_stats before = stats(ctx);
  if (!cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture"))
    return;
  bool cached_ok = CHECK_OK(ctx, nt_alloc(ctx, 2 * MiB, &a));
  nt_status st = nt_alloc(ctx, (size_t)3 << 30, &b);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", nt_last_error(ctx));
  cudaGraph_t graph = NULL;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  CHECK(end == cudaSuccess, "the capture stays valid: %s", cudaGetErrorString(end));
  CHECK(st == NT_ERR_STATE && b == NULL, "new segment during capture: status %d", (int)st);
  CHECK(strstr(msg, "captured into a CUDA graph") && strstr(msg, "3221225472 bytes"),
        "message: %s", msg);
  CHECK(stats(ctx).n_system_allocs == before.n_system_allocs, "no cudaMalloc during capture");
  if (cached_ok) nt_free(ctx, a);
  CHECK(cudaGetLastError() == cudaSuccess, "no lingering CUDA error");
}

int main(void) {
  nt_ctx *ctx = nt_test_cuda_ctx();
  if (!ctx) return nt_test_skip("no GPU");
  test_same_stream_reuse(ctx);
  test_training_pattern(ctx);
  test_record_stream(ctx);
  test_worker_frees(ctx);
  test_oom(ctx);
  test_alloc_in_capture(ctx);
  test_pinned_and_empty_cache(ctx);
  nt_mem_stats s = stats(ctx);
  CHECK(s.fragmentation >= 0.0 && s.fragmentation <= 1.0, "fragmentation %g", s.fragmentation);
  CHECK(cuda_ok(cudaDeviceSynchronize(), "final sync"), "device healthy");
  nt_ctx_free(ctx);
  return nt_test_finish();
}
#endif
