/* CPU reductions: sum of squares over mixed-dtype tensor lists against fp64, unscale + the
 * non-finite check (NaN, +inf, -inf in each dtype; the flag is only ever set), mean, errors. */
#include "ops/reduce.h"
#include "tests/memops_test.h"

static void test_sum_squares(nt_ctx *ctx, nt_test_rng *r) {
  int64_t sizes[3] = {383, 1, 5001};
  nt_tensor ts[3];
  const nt_tensor *list[3];
  double ref = 0;
  for (int k = 0; k < 3; k++) {
    float *v = memops_random(r, sizes[k], -2, 2);
    memops_round(v, sizes[k], memops_float_dtypes[k]);
    for (int64_t i = 0; i < sizes[k]; i++) ref += (double)v[i] * v[i];
    ts[k] = memops_tensor(ctx, memops_float_dtypes[k], 1, &sizes[k], v);
    list[k] = &ts[k];
    free(v);
  }
  int64_t one[1] = {1};
  nt_tensor out = memops_tensor(ctx, NT_F32, 1, one, NULL);
  CHECK_OK(ctx, nt_sum_squares(ctx, list, 3, &out));
  float *o = memops_values(ctx, &out);
  CHECK(fabs(o[0] - ref) / ref < 1e-6, "sum of squares %g vs %g", (double)o[0], ref);
  free(o);
  CHECK_OK(ctx, nt_sum_squares(ctx, NULL, 0, &out));
  o = memops_values(ctx, &out);
  CHECK(o[0] == 0.0f, "empty list gives 0");
  free(o);
  for (int k = 0; k < 3; k++) nt_tensor_free(ctx, &ts[k]);
  nt_tensor_free(ctx, &out);
}

static void test_unscale(nt_ctx *ctx, nt_test_rng *r) {
  int64_t sizes[3] = {37, 1000, 9}, one[1] = {1};
  float inv = 0.125f, zero = 0.0f;
  nt_tensor invt = memops_tensor(ctx, NT_F32, 1, one, &inv), found = memops_tensor(ctx, NT_F32, 1, one, &zero);
  for (int bad = -1; bad < 3; bad++) {        /* -1: all finite; else the kind of bad value */
    for (int where = 0; where < 3; where++) { /* which tensor (and dtype) holds it */
      if (bad < 0 && where > 0) continue;
      nt_tensor ts[3], *list[3];
      float *vals[3];
      for (int k = 0; k < 3; k++) {
        vals[k] = memops_random(r, sizes[k], -100, 100);
        memops_round(vals[k], sizes[k], memops_float_dtypes[k]);
        if (bad >= 0 && k == where)
          vals[k][sizes[k] - 1] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
        ts[k] = memops_tensor(ctx, memops_float_dtypes[k], 1, &sizes[k], vals[k]);
        list[k] = &ts[k];
      }
      float z = 0.0f;
      nt_tensor zt = nt_tensor_view(&z, NT_F32, nt_cpu(), 1, one);
      CHECK_OK(ctx, nt_tensor_copy(ctx, &found, &zt));
      CHECK_OK(ctx, nt_unscale_and_check(ctx, list, 3, &invt, &found));
      float *f = memops_values(ctx, &found);
      CHECK(f[0] == (bad >= 0 ? 1.0f : 0.0f), "found_inf %g for bad kind %d in %s", (double)f[0],
            bad, nt_dtype_name(memops_float_dtypes[where]));
      free(f);
      int exact = 1;
      for (int k = 0; k < 3; k++) {
        float *v = memops_values(ctx, &ts[k]);
        for (int64_t i = 0; i < sizes[k]; i++)
          if (isfinite(vals[k][i])) exact &= v[i] == vals[k][i] * inv; /* power of two: exact */
        free(v);
        free(vals[k]);
        nt_tensor_free(ctx, &ts[k]);
      }
      CHECK(exact, "finite values multiplied by inv_scale");
    }
  }
  /* Never cleared: a finite pass leaves a set flag set. */
  float one_v = 1.0f, small[4] = {1, 2, 3, 4};
  int64_t s4[1] = {4};
  nt_tensor ft = nt_tensor_view(&one_v, NT_F32, nt_cpu(), 1, one);
  CHECK_OK(ctx, nt_tensor_copy(ctx, &found, &ft));
  nt_tensor fin = memops_tensor(ctx, NT_F32, 1, s4, small), *l1[1] = {&fin};
  CHECK_OK(ctx, nt_unscale_and_check(ctx, l1, 1, &invt, &found));
  float *f = memops_values(ctx, &found);
  CHECK(f[0] == 1.0f, "found_inf stays set");
  free(f);
  nt_tensor_free(ctx, &fin);
  nt_tensor_free(ctx, &invt);
  nt_tensor_free(ctx, &found);
}

static void test_mean_and_errors(nt_ctx *ctx, nt_test_rng *r) {
  int64_t n[1] = {1001}, one[1] = {1}, two[1] = {2};
  float *v = memops_random(r, n[0], -1, 3);
  double ref = 0;
  for (int64_t i = 0; i < n[0]; i++) ref += v[i];
  ref /= (double)n[0];
  nt_tensor x = memops_tensor(ctx, NT_F32, 1, n, v), out = memops_tensor(ctx, NT_F32, 1, one, NULL);
  CHECK_OK(ctx, nt_mean(ctx, &x, &out));
  float *o = memops_values(ctx, &out);
  CHECK(fabs(o[0] - ref) < 1e-6 * fabs(ref), "mean %g vs %g", (double)o[0], ref);
  free(o);
  nt_tensor oh = memops_tensor(ctx, NT_F16, 1, one, NULL), o2 = memops_tensor(ctx, NT_F32, 1, two, NULL);
  nt_tensor xi = memops_tensor(ctx, NT_I32, 1, n, NULL);
  const nt_tensor *l[1] = {&x}, *li[1] = {&xi};
  nt_tensor *lm[1] = {&x};
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_mean(ctx, &x, &oh));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_sum_squares(ctx, l, 1, &o2));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_sum_squares(ctx, li, 1, &out));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sum_squares(ctx, l, -1, &out));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_unscale_and_check(ctx, lm, 1, &o2, &out));
  free(v);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &out); nt_tensor_free(ctx, &oh);
  nt_tensor_free(ctx, &o2); nt_tensor_free(ctx, &xi);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {9};
  test_sum_squares(ctx, &r);
  test_unscale(ctx, &r);
  test_mean_and_errors(ctx, &r);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
