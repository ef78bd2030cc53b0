/* Small test harness: checks that count failures, a closing "N passed, N failed" line, GPU
 * skip handling (exit 77, which CTest reports as skipped), seeded random data and error norms. */
#ifndef NT_TESTUTIL_H
#define NT_TESTUTIL_H
#include <stdint.h>
#include <stdio.h>
#include "core/nt.h"
#include "amp/scaler.h"
#include "optim/adamw.h"

#define NT_TEST_SKIP 77

extern int nt_test_passed, nt_test_failed;

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (cond) {                                                            \
      nt_test_passed++;                                                    \
    } else {                                                               \
      nt_test_failed++;                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
    }                                                                      \
  } while (0)

/* A call that must succeed; on failure prints the context's message. Evaluates to true on
 * success so tests can stop early: if (!CHECK_OK(ctx, f(...))) goto done; */
#define CHECK_OK(ctx, call) nt_test_check_ok((ctx), (call), #call, __FILE__, __LINE__)
/* A call that must fail with `expected`; prints the message it gave (to show it is clear). */
#define CHECK_ERR(ctx, expected, call) \
  nt_test_check_err((ctx), (expected), (call), #call, __FILE__, __LINE__)

int nt_test_check_ok(nt_ctx *ctx, nt_status st, const char *expr, const char *file, int line);
int nt_test_check_err(nt_ctx *ctx, nt_status expected, nt_status st, const char *expr,
                      const char *file, int line);

/* Prints "N passed, N failed" and returns the exit code. */
int nt_test_finish(void);

/* The context options a test starts from: the defaults with the environment's NT_* names
 * mapped on top (tools/ctx_env.h), so ctest's ENVIRONMENT can set them. Exits on a bad value. */
nt_ctx_options nt_test_ctx_options(void);
/* A CUDA context on device 0 with nt_test_ctx_options() (or `opts`), or NULL when there is no
 * GPU (the test should then `return nt_test_skip("reason")`). On a machine that has a GPU
 * (/dev/nvidia0, or NT_TEST_REQUIRE_GPU=1) a CUDA build that cannot use it fails the test
 * (exit 1) instead: a broken driver or context must not pass as "skipped".
 * NT_TEST_REQUIRE_GPU=0 skips. */
nt_ctx *nt_test_cuda_ctx(void);
nt_ctx *nt_test_cuda_ctx_with(const nt_ctx_options *opts);
/* Data folders for tests: NT_DATA_DIR (NULL when unset) and NT_FASHION_DIR (else
 * NT_FASHION_DEFAULT_DIR). */
const char *nt_test_data_dir(void);
const char *nt_test_fashion_dir(void);
int nt_test_skip(const char *why);
/* Reads a test's optional `--quick` argument into *quick (quick: a subset of its cases that
 * still reaches every kernel, for slow runners such as compute-sanitizer, see
 * scripts/gpu_sanitize.sh). Any other argument: false, with the usage on stderr (the caller
 * returns 2). */
bool nt_test_quick_arg(int argc, char **argv, bool *quick);
/* main() of a test file built twice, as test_X.c and as gpu_test_X.c (which defines NT_TEST_GPU
 * and includes test_X.c): run(ctx, cpu) on a CUDA context with a CPU context beside it for
 * comparisons, or run(cpu, NULL) in the CPU build; skips without a GPU; returns
 * nt_test_finish(). */
int nt_test_main_on_device(bool gpu, void (*run)(nt_ctx *ctx, nt_ctx *cpu));
#ifdef NT_TEST_GPU
#define NT_TEST_ON_GPU true
#else
#define NT_TEST_ON_GPU false
#endif

/* Deterministic uniform numbers in [lo, hi) (splitmix64 on a test-local state). */
typedef struct { uint64_t s; } nt_test_rng;
double nt_test_uniform(nt_test_rng *r, double lo, double hi);
double nt_test_normal(nt_test_rng *r);
void nt_test_fill_uniform(nt_test_rng *r, float *x, int64_t n, float lo, float hi);

/* ||a - b|| / ||b|| in double (0 when both are zero). */
double nt_test_rel_err(const float *a, const float *b, int64_t n);
double nt_test_rel_err_d(const double *a, const double *b, int64_t n);

/* The docs/semantics.md tolerance ||out - ref|| / ||ref|| of a storage dtype: fp32 1e-5, fp16 2e-3,
 * bf16 1e-2. */
double nt_test_tol(nt_dtype dt);
/* Records err as a measured error of a result in dtype dt and returns it; nt_test_finish prints
 * the worst of each dtype ("measured: ..."), the record the bounds are set from
 * (docs/tolerances.md). */
double nt_test_note(nt_dtype dt, double err);
/* A malloc'd host buffer of dtype dt holding x[0..n) rounded to dt; x is replaced by the
 * rounded values (so a reference computed from x sees what the op sees). Caller frees. */
void *nt_test_to_dtype(float *x, size_t n, nt_dtype dt);

/* Float arrays to and from a contiguous tensor of any dtype on any device, through a host
 * buffer in the tensor's dtype (rounded on the way in); the copy is a CHECK_OK. Returns false
 * on failure. */
bool nt_test_upload(nt_ctx *ctx, nt_tensor *t, const float *h);
bool nt_test_download(nt_ctx *ctx, const nt_tensor *t, float *h);

/* An AMP optimizer step over one gradient tensor, as the trainer's step stages do it:
 * nt_scaler_step (unscale + inf check unless already unscaled), then nt_adamw_step skipping on
 * the scaler's found_inf. The caller still calls nt_scaler_update. args may be NULL. */
nt_status nt_test_scaled_step(nt_ctx *ctx, nt_adamw *opt, nt_scaler *sc, nt_tensor *grads,
                              const nt_optim_step_args *args);

#endif
