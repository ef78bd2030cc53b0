#include "tests/testutil.h"
#include "data/idx.h"
#include "tools/ctx_env.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int nt_test_passed, nt_test_failed;

int nt_test_check_ok(nt_ctx *ctx, nt_status st, const char *expr, const char *file, int line) {
  if (st == NT_OK) {
    nt_test_passed++;
    return 1;
  }
  nt_test_failed++;
  fprintf(stderr, "FAIL %s:%d: %s returned %s: %s\n", file, line, expr, nt_status_str(st),
          nt_last_error(ctx));
  return 0;
}

int nt_test_check_err(nt_ctx *ctx, nt_status expected, nt_status st, const char *expr,
                      const char *file, int line) {
  if (st == expected) {
    nt_test_passed++;
    printf("  expected error from %s: %s\n", expr, nt_last_error(ctx));
    return 1;
  }
  nt_test_failed++;
  fprintf(stderr, "FAIL %s:%d: %s returned %s, expected %s (%s)\n", file, line, expr,
          nt_status_str(st), nt_status_str(expected), nt_last_error(ctx));
  return 0;
}

static const nt_dtype noted_dtypes[3] = {NT_F32, NT_F16, NT_BF16};
static double noted_worst[3] = {-1, -1, -1};

double nt_test_note(nt_dtype dt, double err) {
  for (int i = 0; i < 3; i++)
    if (dt == noted_dtypes[i] && err > noted_worst[i]) noted_worst[i] = err;
  return err;
}

int nt_test_finish(void) {
  for (int i = 0; i < 3; i++)
    if (noted_worst[i] >= 0)
      printf("measured: worst %s rel err %.3g\n", nt_dtype_name(noted_dtypes[i]),
             noted_worst[i]);
  printf("%d passed, %d failed\n", nt_test_passed, nt_test_failed);
  return nt_test_failed ? 1 : 0;
}

nt_ctx_options nt_test_ctx_options(void) {
  nt_ctx_options o = nt_ctx_options_default();
  if (nt_ctx_options_from_env(&o)) exit(2);
  return o;
}

const char *nt_test_data_dir(void) {
  const char *d = getenv("NT_DATA_DIR");
  return d && *d ? d : NULL;
}

const char *nt_test_fashion_dir(void) {
  const char *d = getenv("NT_FASHION_DIR");
  return d && *d ? d : NT_FASHION_DEFAULT_DIR;
}

int nt_test_main_on_device(bool gpu, void (*run)(nt_ctx *ctx, nt_ctx *cpu)) {
  nt_ctx *cpu = NULL;
  if (nt_ctx_create(&cpu, nt_cpu()) != NT_OK) return 1;
  if (gpu) {
    nt_ctx *ctx = nt_test_cuda_ctx();
    if (!ctx) {
      nt_ctx_free(cpu);
      return nt_test_skip("no GPU");
    }
    run(ctx, cpu);
    nt_ctx_free(ctx);
  } else {
    run(cpu, NULL);
  }
  nt_ctx_free(cpu);
  return nt_test_finish();
}

bool nt_test_quick_arg(int argc, char **argv, bool *quick) {
  *quick = argc == 2 && strcmp(argv[1], "--quick") == 0;
  if (argc == 1 || *quick) return true;
  fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
  return false;
}

nt_ctx *nt_test_cuda_ctx(void) {
  const nt_ctx_options o = nt_test_ctx_options();
  return nt_test_cuda_ctx_with(&o);
}

#ifdef NT_HAVE_CUDA
/* Whether this machine should run the GPU tests: NT_TEST_REQUIRE_GPU=1/0 decides; otherwise
 * an NVIDIA device node (/dev/nvidia0) says a GPU is there. */
static bool gpu_expected(void) {
  const char *req = getenv("NT_TEST_REQUIRE_GPU");
  if (req && *req) return strcmp(req, "0") != 0;
  return access("/dev/nvidia0", F_OK) == 0;
}
#endif

nt_ctx *nt_test_cuda_ctx_with(const nt_ctx_options *opts) {
#ifndef NT_HAVE_CUDA
  (void)opts;
  return NULL;   /* built without the CUDA backend: the GPU tests skip */
#else
  int n = nt_cuda_device_count();
  bool expected = gpu_expected();
  if (n == 0 && !expected) return NULL;
  nt_ctx *ctx = NULL;
  if (n == 0 || nt_ctx_create_with(&ctx, nt_cuda(0), opts)) {
    /* a GPU is there but unusable: a failure, not a skip */
    fprintf(stderr,
            "FAIL: this machine has a GPU (/dev/nvidia0 or NT_TEST_REQUIRE_GPU) but %s%s\n"
            "(set NT_TEST_REQUIRE_GPU=0 to report the GPU tests skipped instead)\n",
            n == 0 ? "CUDA reports no device" : "creating a CUDA context failed: ",
            n == 0 ? "" : nt_last_error(ctx));
    nt_ctx_free(ctx);
    exit(1);
  }
  return ctx;
#endif
}

int nt_test_skip(const char *why) {
  printf("skipped: %s\n", why);
  return NT_TEST_SKIP;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double nt_test_uniform(nt_test_rng *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(splitmix64(&r->s) >> 11) * 0x1.0p-53);
}

double nt_test_normal(nt_test_rng *r) {
  double u1 = nt_test_uniform(r, 1e-12, 1.0), u2 = nt_test_uniform(r, 0.0, 1.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void nt_test_fill_uniform(nt_test_rng *r, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)nt_test_uniform(r, lo, hi);
}

double nt_test_rel_err(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  if (isnan(num)) return INFINITY;
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

double nt_test_rel_err_d(const double *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (isnan(num)) return INFINITY;
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

bool nt_test_upload(nt_ctx *ctx, nt_tensor *t, const float *h) {
  int64_t n = nt_tensor_numel(t);
  void *tmp = malloc((size_t)n * 4);
  if (!tmp) return false;
  for (int64_t i = 0; i < n; i++) nt_store_f32(tmp, t->dtype, i, h[i]);
  nt_tensor src = nt_tensor_view(tmp, t->dtype, nt_cpu(), 1, &n);
  nt_tensor dst = nt_tensor_view(t->data, t->dtype, t->device, 1, &n);
  bool ok = CHECK_OK(ctx, nt_tensor_copy(ctx, &dst, &src));
  free(tmp);
  return ok;
}

bool nt_test_download(nt_ctx *ctx, const nt_tensor *t, float *h) {
  int64_t n = nt_tensor_numel(t);
  void *tmp = malloc((size_t)n * 4);
  if (!tmp) return false;
  nt_tensor dst = nt_tensor_view(tmp, t->dtype, nt_cpu(), 1, &n);
  nt_tensor src = nt_tensor_view(t->data, t->dtype, t->device, 1, &n);
  bool ok = CHECK_OK(ctx, nt_tensor_copy(ctx, &dst, &src));
  for (int64_t i = 0; ok && i < n; i++) h[i] = nt_load_f32(tmp, t->dtype, i);
  free(tmp);
  return ok;
}

double nt_test_tol(nt_dtype dt) { return dt == NT_F32 ? 1e-5 : dt == NT_F16 ? 2e-3 : 1e-2; }

void *nt_test_to_dtype(float *x, size_t n, nt_dtype dt) {
  void *b = malloc(n * nt_dtype_size(dt) + 64);
  for (size_t i = 0; b && i < n; i++) {
    nt_store_f32(b, dt, (int64_t)i, x[i]);
    x[i] = nt_load_f32(b, dt, (int64_t)i);
  }
  return b;
}

nt_status nt_test_scaled_step(nt_ctx *ctx, nt_adamw *opt, nt_scaler *sc, nt_tensor *grads,
                              const nt_optim_step_args *args) {
  nt_optim_step_args a = args ? *args : nt_optim_args(-1.0);
  nt_tensor *list[1] = {grads};
  const nt_tensor *found = NULL;
  nt_status st = nt_scaler_step(ctx, sc, list, 1, &found);
  if (st) return st;
  a.found_inf = found;
  return nt_adamw_step(ctx, opt, &a);
}
