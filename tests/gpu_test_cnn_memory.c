/* GPU memory of the CNN training step and the cuBLASLt workspace setting:
 *  - the context's workspace: 32 MiB by default, the option cublaslt_workspace_bytes at
 *    creation (bad values are a clear error), nt_ctx_set_workspace_bytes (frees/allocates in
 *    the pool, refused during stream capture, a no-op on the CPU);
 *  - the CNN step at batch 128 (fp16): the scratch it takes beyond the model's buffers is
 *    small (the NHWC convolutions have no im2col buffer: packed weights and the weight
 *    gradient's split-K partials); two steps give bit-identical gradients (the split-K sums
 *    in a fixed order); gradients agree with workspaces of 0 and 4 MiB (replanned GEMMs of the
 *    fc layers). Prints each variant's step time, which tells whether the CNN's GEMMs gain
 *    anything from a large workspace. */
#include "tests/testutil.h"
#include "models/cnn.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MIB (1024.0 * 1024.0)

static void test_workspace_api(nt_ctx *g) {
  CHECK(nt_ctx_workspace_bytes(g) == (size_t)32 << 20, "default workspace %zu bytes",
        nt_ctx_workspace_bytes(g));
  nt_ctx *c = NULL;
  nt_ctx_options o = nt_ctx_options_default();
  CHECK_OK(NULL, nt_ctx_options_set(&o, "cublaslt_workspace_mib", "1.5"));
  nt_status st = nt_ctx_create_with(&c, nt_cuda(0), &o);
  CHECK(st == NT_OK, "create: %s", nt_last_error(c));
  if (!st) {
    size_t b = 0;
    void *p = nt_ctx_workspace(c, &b);
    CHECK(b == 1572864 && p && nt_ctx_workspace_bytes(c) == b,
          "cublaslt_workspace_mib 1.5: %zu bytes at %p", b, p);
  }
  nt_ctx_free(c);
  o.cublaslt_workspace_bytes = 0;
  c = NULL;
  st = nt_ctx_create_with(&c, nt_cuda(0), &o);
  CHECK(st == NT_OK, "create: %s", nt_last_error(c));
  if (!st) {
    size_t b = 1;
    CHECK(!nt_ctx_workspace(c, &b) && b == 0, "workspace 0: no workspace");
  }
  nt_ctx_free(c);
  const char *bad[] = {"abc", "-1", "1e9", "4x", "nan"};
  for (int i = 0; i < 5; i++) {
    nt_ctx_options b = nt_ctx_options_default();
    CHECK(nt_ctx_options_set(&b, "cublaslt_workspace_mib", bad[i]) == NT_ERR_INVALID_ARG &&
              b.cublaslt_workspace_bytes == nt_ctx_options_default().cublaslt_workspace_bytes,
          "cublaslt_workspace_mib %s refused, value kept", bad[i]);
  }
  /* Out of range in the struct itself: refused at creation, naming the option. */
  o.cublaslt_workspace_bytes = (size_t)5000 << 20;
  c = NULL;
  st = nt_ctx_create_with(&c, nt_cuda(0), &o);
  CHECK(st == NT_ERR_INVALID_ARG && strstr(nt_last_error(c), "cublaslt_workspace_mib"),
        "a 5000 MiB workspace: status %d, \"%s\"", (int)st, nt_last_error(c));
  nt_ctx_free(c);
  /* The setter moves the bytes in the pool: 32 MiB out, 4 MiB in (a reused block may keep up
   * to 1 MiB of slack), then back. */
  nt_mem_stats m0, m1, m2;
  nt_mem_get_stats(g, &m0);
  CHECK_OK(g, nt_ctx_set_workspace_bytes(g, (size_t)4 << 20));
  nt_mem_get_stats(g, &m1);
  const double freed = ((double)m0.allocated - (double)m1.allocated) / MIB;
  CHECK(nt_ctx_workspace_bytes(g) == (size_t)4 << 20 && freed >= 27 && freed <= 28,
        "4 MiB workspace: %zu bytes, allocated %.2f -> %.2f MiB", nt_ctx_workspace_bytes(g),
        m0.allocated / MIB, m1.allocated / MIB);
  CHECK_OK(g, nt_ctx_set_workspace_bytes(g, 0));
  nt_mem_get_stats(g, &m2);
  CHECK(nt_ctx_workspace_bytes(g) == 0 && !nt_ctx_workspace(g, NULL) &&
        m0.allocated - m2.allocated == 32 << 20, "no workspace: allocated %.2f MiB",
        m2.allocated / MIB);
  CHECK_OK(g, nt_ctx_set_workspace_bytes(g, (size_t)32 << 20));
#ifdef NT_HAVE_CUDA
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(g);
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    CHECK_ERR(g, NT_ERR_STATE, nt_ctx_set_workspace_bytes(g, 0));
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
    if (graph) cudaGraphDestroy(graph);
  }
  CHECK(nt_ctx_workspace_bytes(g) == (size_t)32 << 20, "capture left the workspace alone");
#endif
  nt_ctx *cpu = NULL;
  if (nt_ctx_create(&cpu, nt_cpu()) == NT_OK) {
    CHECK_OK(cpu, nt_ctx_set_workspace_bytes(cpu, (size_t)8 << 20));
    CHECK(nt_ctx_workspace_bytes(cpu) == 0, "a CPU context has no workspace");
  }
  nt_ctx_free(cpu);
}

typedef struct {
  nt_cnn *m;
  nt_tensor x, y, scale;   /* scale: the loss scale (device f32), so no fp16 gradient flushes */
  float *grads[3];
  int64_t n[3];
} cnn_run;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Zeroes the gradients and runs one step; copies the gradients into out (or r->grads). */
static bool step(nt_ctx *g, cnn_run *r, float **out) {
  if (!CHECK_OK(g, nt_params_zero_grad(g, nt_cnn_params(r->m))) ||
      !CHECK_OK(g, nt_cnn_train_step(g, r->m, &r->x, &r->y, (const float *)r->scale.data, NULL)))
    return false;
  for (int u = 0; out && u < 3; u++) {
    nt_tensor h = nt_tensor_view(out[u], NT_F32, nt_cpu(), 1, &r->n[u]);
    if (!CHECK_OK(g, nt_tensor_copy(g, &h, &nt_cnn_params(r->m)->units[u].grad))) return false;
  }
  return CHECK_OK(g, nt_ctx_synchronize(g));
}

/* One variant: a warm-up step (plans, autotuning), then the scratch one step takes beyond
 * what was allocated before it, the worst unit's gradient error against ref (NULL: none), and
 * the median time of 20 steps (ms). */
static bool variant(nt_ctx *g, cnn_run *r, float **ref, const char *what, double *scratch,
                    double *err, double *ms) {
  float *got[3];
  for (int u = 0; u < 3; u++) got[u] = malloc((size_t)r->n[u] * sizeof(float));
  bool ok = step(g, r, NULL);
  nt_mem_stats a, b;
  nt_mem_get_stats(g, &a);
  nt_mem_reset_peak(g);
  ok = ok && step(g, r, ref ? got : r->grads);
  nt_mem_get_stats(g, &b);
  *scratch = (double)(b.peak_allocated - a.allocated);
  *err = 0;
  for (int u = 0; ok && ref && u < 3; u++) {
    double e = nt_test_rel_err(got[u], ref[u], r->n[u]);
    if (!(e <= *err)) *err = e;
  }
  double t[20];
  for (int i = 0; ok && i < 20; i++) {
    double t0 = now_s();
    ok = step(g, r, NULL);
    t[i] = 1e3 * (now_s() - t0);
  }
  for (int i = 1; ok && i < 20; i++)  /* insertion sort for the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      double s = t[j];
      t[j] = t[j - 1];
      t[j - 1] = s;
    }
  *ms = ok ? 0.5 * (t[9] + t[10]) : NAN;
  printf("  cnn f16 batch 128, %-34s scratch beyond the model %7.2f MiB, peak %7.2f MiB, "
         "grads vs the first %.2e, %.3f ms/step (eager)\n",
         what, *scratch / MIB, b.peak_allocated / MIB, *err, *ms);
  for (int u = 0; u < 3; u++) free(got[u]);
  return ok;
}

enum { N = 128 };

/* The CNN (fp16, batch N, weights from seed 5) and one batch on g; false on failure. */
static bool run_make(nt_ctx *g, cnn_run *r, const float *x, const int32_t *y) {
  nt_cnn_config c = nt_cnn_config_default();
  memset(r, 0, sizeof *r);
  if (!CHECK_OK(g, nt_cnn_create(g, &c, NT_F16, N, &r->m))) return false;
  CHECK_OK(g, nt_params_init(g, nt_cnn_params(r->m), 5));
  for (int u = 0; u < 3; u++) {
    r->n[u] = nt_tensor_numel(&nt_cnn_params(r->m)->units[u].grad);
    r->grads[u] = malloc((size_t)r->n[u] * sizeof(float));
  }
  int64_t xs[4] = {N, 1, 28, 28}, ys[1] = {N};
  nt_tensor hx = nt_tensor_view((void *)x, NT_F32, nt_cpu(), 4, xs);
  nt_tensor hy = nt_tensor_view((void *)y, NT_I32, nt_cpu(), 1, ys);
  nt_tensor x32 = {0};
  float scale = 1024.0f;
  nt_tensor hs = nt_tensor_view(&scale, NT_F32, nt_cpu(), 0, NULL);
  bool ok = CHECK_OK(g, nt_tensor_alloc(g, &x32, NT_F32, 4, xs)) &&
            CHECK_OK(g, nt_tensor_alloc(g, &r->scale, NT_F32, 0, NULL)) &&
            CHECK_OK(g, nt_tensor_copy(g, &r->scale, &hs)) &&
            CHECK_OK(g, nt_tensor_alloc(g, &r->x, NT_F16, 4, xs)) &&
            CHECK_OK(g, nt_tensor_alloc(g, &r->y, NT_I32, 1, ys)) &&
            CHECK_OK(g, nt_tensor_copy(g, &x32, &hx)) &&
            CHECK_OK(g, nt_convert(g, &r->x, &x32)) && CHECK_OK(g, nt_tensor_copy(g, &r->y, &hy));
  nt_tensor_free(g, &x32);
  return ok;
}

static void run_free(nt_ctx *g, cnn_run *r) {
  for (int u = 0; u < 3; u++) free(r->grads[u]);
  nt_tensor_free(g, &r->x);
  nt_tensor_free(g, &r->y);
  nt_tensor_free(g, &r->scale);
  nt_cnn_free(g, r->m);
}

static void test_cnn_memory(nt_ctx *g) {
  nt_test_rng rng = {17};
  const int64_t n = N * 28 * 28;
  float *x = malloc((size_t)n * sizeof *x);
  nt_test_fill_uniform(&rng, x, n, -1, 2);
  int32_t y[N];
  for (int i = 0; i < N; i++) y[i] = (i * 7) % 10;
  cnn_run r;
  double scratch, e, ms;
  bool ok = run_make(g, &r, x, y) && variant(g, &r, NULL, "default:", &scratch, &e, &ms);
  if (ok) {
    /* conv2's weight-gradient partials are the largest: about 4 MiB at this batch */
    CHECK(scratch <= 8 * MIB, "CNN step: %.2f MiB of scratch", scratch / MIB);
    ok = variant(g, &r, r.grads, "again:", &scratch, &e, &ms);
    CHECK(!ok || e == 0, "a second step gives the same gradients: rel err %.3g", e);
  }
  const size_t ws[2] = {0, (size_t)4 << 20};
  for (int i = 0; ok && i < 2; i++) {
    char what[64];
    snprintf(what, sizeof what, "%zu MiB cuBLASLt workspace:", ws[i] >> 20);
    ok = CHECK_OK(g, nt_ctx_set_workspace_bytes(g, ws[i])) &&
         variant(g, &r, r.grads, what, &scratch, &e, &ms);
    CHECK(!ok || e < 1e-2, "%s gradients vs the default: %.3g", what, e);
  }
  CHECK_OK(g, nt_ctx_set_workspace_bytes(g, (size_t)32 << 20));
  free(x);
  run_free(g, &r);
}

int main(void) {
  nt_ctx_options o = nt_test_ctx_options();
  o.cublaslt_workspace_bytes = nt_ctx_options_default().cublaslt_workspace_bytes;
  nt_ctx *g = nt_test_cuda_ctx_with(&o);
  if (!g) return nt_test_skip("no GPU");
  test_workspace_api(g);
  test_cnn_memory(g);
  nt_ctx_free(g);
  return nt_test_finish();
}
