/* GPU dropout drops exactly the elements the CPU drops for the same seed and offset (vector and
 * scalar paths, offsets that are multiples of 4 but not of 8), same values, backward +=. */
#include "ops/dropout.h"
#include "tests/memops_test.h"

static void run_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, int64_t n, float p,
                     uint64_t seed, uint64_t offset, int misalign) {
  int64_t shape[1] = {n};
  float *xv = memops_random(r, n, 0.5f, 2.0f), *dv = memops_random(r, n, -1, 1);
  memops_pair x = memops_pair_new(cc, gc, dt, 1, shape, xv, misalign);
  memops_pair y = memops_pair_new(cc, gc, dt, 1, shape, NULL, misalign);
  memops_pair d = memops_pair_new(cc, gc, dt, 1, shape, dv, misalign);
  const char *dn = nt_dtype_name(dt);
  if (CHECK_OK(cc, nt_dropout_forward(cc, &x.c, &y.c, p, seed, offset)) &&
      CHECK_OK(gc, nt_dropout_forward(gc, &x.g, &y.g, p, seed, offset))) {
    float *a = memops_values(cc, &y.c), *b = memops_values(gc, &y.g);
    int64_t mism = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
      mism += (a[i] == 0.0f) != (b[i] == 0.0f);
      kept += a[i] != 0.0f;
    }
    CHECK(mism == 0, "%s n %lld p %g offset %llu mis %d: %lld mask elements differ", dn,
          (long long)n, (double)p, (unsigned long long)offset, misalign, (long long)mism);
    CHECK(nt_test_rel_err(b, a, n) < nt_test_tol(dt), "%s forward values %g", dn,
          nt_test_rel_err(b, a, n));
    if (n > 10000 && p > 0 && p < 1)
      CHECK(fabs((double)kept / (double)n - (1.0 - p)) < 0.01, "kept fraction %g",
            (double)kept / (double)n);
    free(a);
    free(b);
  }
  if (CHECK_OK(cc, nt_dropout_backward(cc, &x.c, &d.c, p, seed, offset)) &&
      CHECK_OK(gc, nt_dropout_backward(gc, &x.g, &d.g, p, seed, offset)))
    CHECK(memops_pair_err(cc, gc, &d) < nt_test_tol(dt), "%s backward (+=) %g", dn,
          memops_pair_err(cc, gc, &d));
  memops_pair_free(cc, gc, &x); memops_pair_free(cc, gc, &y); memops_pair_free(cc, gc, &d);
  free(xv); free(dv);
}

int main(void) {
  nt_ctx *gc = nt_test_cuda_ctx();
  if (!gc) return nt_test_skip("no GPU");
  nt_ctx *cc;
  if (nt_ctx_create(&cc, nt_cpu())) return 1;
  nt_test_rng r = {202};
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, 4099, 0.1f, 42, 0, 0);
    run_case(cc, gc, &r, dt, 4099, 0.5f, 42, 12, 0);     /* offset 4 mod 8 */
    run_case(cc, gc, &r, dt, 4099, 0.5f, 42, 12, 1);     /* scalar path */
    run_case(cc, gc, &r, dt, 3, 0.5f, 7, 4, 0);          /* tail only */
    run_case(cc, gc, &r, dt, (1 << 20) + 3, 0.2f, 0x123456789abcdefull, 1ull << 33, 0);
    run_case(cc, gc, &r, dt, 1001, 0.0f, 1, 0, 0);
    run_case(cc, gc, &r, dt, 1001, 1.0f, 1, 0, 0);
  }
  /* The context's reserve keeps offsets a multiple of 4. */
  uint64_t o1 = nt_ctx_rng_reserve(gc, 37), o2 = nt_ctx_rng_reserve(gc, 5);
  CHECK(o1 % 4 == 0 && o2 % 4 == 0 && o2 >= o1 + 37, "rng_reserve offsets %llu %llu",
        (unsigned long long)o1, (unsigned long long)o2);
  nt_ctx_free(cc);
  nt_ctx_free(gc);
  return nt_test_finish();
}
