/* GPU elementwise ops against the CPU reference, every float dtype, vector and scalar paths
 * (odd sizes, misaligned data), accumulation into non-zero gradients. */
#include "ops/elementwise.h"
#include "tests/memops_test.h"

/* Per dtype, about twice the worst the H200 measured (2026-12-04 03:20 run); relu and add are
 * checked for exact equality. */
static const memops_bounds bound = {
    2e-7,   /* f32: measured 1.04e-7 */
    1.4e-5, /* f16: 7.28e-6 */
    2.1e-5, /* bf16: 1.06e-5 */
};

static void run_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, int64_t rows,
                     int64_t cols, int misalign) {
  int64_t shape[2] = {rows, cols}, n = rows * cols;
  float *xv = memops_random(r, n, -5, 5), *bv = memops_random(r, n, -2, 2);
  float *dv = memops_random(r, n, -1, 1);
  memops_pair x = memops_pair_new(cc, gc, dt, 2, shape, xv, misalign);
  memops_pair b = memops_pair_new(cc, gc, dt, 2, shape, bv, misalign);
  memops_pair y = memops_pair_new(cc, gc, dt, 2, shape, NULL, misalign);
  memops_pair d = memops_pair_new(cc, gc, dt, 2, shape, dv, misalign);
  double tol = memops_bound(&bound, dt);
  const char *dn = nt_dtype_name(dt);
#define BOTH(call_c, call_g) (CHECK_OK(cc, call_c) && CHECK_OK(gc, call_g))
  if (BOTH(nt_gelu_forward(cc, &x.c, &y.c), nt_gelu_forward(gc, &x.g, &y.g)))
    CHECK(memops_pair_err(cc, gc, &y) < tol, "gelu fwd %s %lldx%lld mis %d: %g", dn,
          (long long)rows, (long long)cols, misalign, memops_pair_err(cc, gc, &y));
  if (BOTH(nt_gelu_backward(cc, &x.c, &b.c, &d.c), nt_gelu_backward(gc, &x.g, &b.g, &d.g)))
    CHECK(memops_pair_err(cc, gc, &d) < tol, "gelu bwd (+=) %s: %g", dn, memops_pair_err(cc, gc, &d));
  if (BOTH(nt_relu_forward(cc, &x.c, &y.c), nt_relu_forward(gc, &x.g, &y.g)))
    CHECK(memops_pair_err(cc, gc, &y) == 0, "relu fwd %s exact", dn);
  if (BOTH(nt_relu_backward(cc, &y.c, &b.c, &d.c), nt_relu_backward(gc, &y.g, &b.g, &d.g)))
    CHECK(memops_pair_err(cc, gc, &d) < tol, "relu bwd (+=) %s: %g", dn, memops_pair_err(cc, gc, &d));
  if (BOTH(nt_add(cc, &x.c, &b.c, &y.c), nt_add(gc, &x.g, &b.g, &y.g)))
    CHECK(memops_pair_err(cc, gc, &y) == 0, "add %s exact", dn);
  if (BOTH(nt_axpy(cc, -0.75f, &x.c, &d.c), nt_axpy(gc, -0.75f, &x.g, &d.g)))
    CHECK(memops_pair_err(cc, gc, &d) < tol, "axpy %s: %g", dn, memops_pair_err(cc, gc, &d));
  if (BOTH(nt_scale(cc, 3.5f, &d.c), nt_scale(gc, 3.5f, &d.g)))
    CHECK(memops_pair_err(cc, gc, &d) < tol, "scale %s: %g", dn, memops_pair_err(cc, gc, &d));
  /* In place: y = y + b. */
  if (BOTH(nt_add(cc, &y.c, &b.c, &y.c), nt_add(gc, &y.g, &b.g, &y.g)))
    CHECK(memops_pair_err(cc, gc, &y) == 0, "add in place %s exact", dn);
#undef BOTH
  memops_pair_free(cc, gc, &x); memops_pair_free(cc, gc, &b);
  memops_pair_free(cc, gc, &y); memops_pair_free(cc, gc, &d);
  free(xv); free(bv); free(dv);
}

int main(void) {
  nt_ctx *gc = nt_test_cuda_ctx();
  if (!gc) return nt_test_skip("no GPU");
  nt_ctx *cc;
  if (nt_ctx_create(&cc, nt_cpu())) return 1;
  nt_test_rng r = {101};
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, 37, 383, 0);   /* odd: packs + scalar tail */
    run_case(cc, gc, &r, dt, 64, 768, 0);   /* all packs */
    run_case(cc, gc, &r, dt, 37, 383, 1);   /* misaligned: scalar path */
    run_case(cc, gc, &r, dt, 1, 5, 0);      /* smaller than one pack */
    run_case(cc, gc, &r, dt, 2048, 1031, 0); /* more blocks than the grid cap: grid-stride */
  }
  nt_ctx_free(cc);
  nt_ctx_free(gc);
  return nt_test_finish();
}
