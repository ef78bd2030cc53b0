/* GPU cross-entropy against the CPU reference: every dtype; V = 65, 383 (scalar path), 1000,
 * 50304 (vector path; the row cached in shared memory for 16-bit, re-read for fp32); ignored
 * rows; dloss_scale as a device pointer; forward, backward and fused (also in place); fp16
 * logits near 6e4; row-padded logits (an [N, V] view with row stride > V); a bad target gives
 * NaN for its row only. */
#include "ops/cross_entropy.h"
#include "tests/memops_test.h"

/* Per tensor dtype, about twice the worst the H200 measured (2026-12-04 03:20 run). The f32
 * row also covers the fp32 losses of every dtype's cases, recorded with the f32 gradients. */
static const memops_bounds bound = {
    1.9e-7, /* f32: measured 9.56e-8 */
    6.5e-4, /* f16: 3.29e-4 (gradients) */
    4.9e-6, /* bf16: 2.46e-6 (gradients) */
};

static void run_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, int64_t N, int64_t V,
                     float range, int misalign) {
  int64_t ls[2] = {N, V}, ts[1] = {N}, one[1] = {1}, n = N * V;
  float *xv = memops_random(r, n, -range, range);
  int32_t *tv = malloc((size_t)N * sizeof(int32_t));
  int64_t count = 0;
  for (int64_t i = 0; i < N; i++) {
    tv[i] = i % 7 == 2 ? -1 : (int32_t)nt_test_uniform(r, 0, (double)V);
    count += tv[i] >= 0;
  }
  tv[0] = (int32_t)(V - 1); /* the last class, in the last pack */
  float scale_h = 4096.0f;
  nt_tensor scale_g = memops_tensor(gc, NT_F32, 1, one, &scale_h);
  memops_pair x = memops_pair_new(cc, gc, dt, 2, ls, xv, misalign);
  memops_pair dx = memops_pair_new(cc, gc, dt, 2, ls, NULL, misalign);
  memops_pair loss = memops_pair_new(cc, gc, NT_F32, 1, ts, NULL, 0);
  nt_tensor tc = memops_ints(cc, 1, ts, tv), tg = memops_ints(gc, 1, ts, tv);
  double tol = memops_bound(&bound, dt), tol_loss = bound.f32; /* losses are fp32 */
  const char *dn = nt_dtype_name(dt);
  if (CHECK_OK(cc, nt_cross_entropy_forward(cc, &x.c, &tc, &loss.c)) &&
      CHECK_OK(gc, nt_cross_entropy_forward(gc, &x.g, &tg, &loss.g)))
    CHECK(memops_pair_err(cc, gc, &loss) < tol_loss, "%s %lldx%lld x~%g mis %d: forward loss %g", dn,
          (long long)N, (long long)V, (double)range, misalign, memops_pair_err(cc, gc, &loss));
  if (CHECK_OK(cc, nt_cross_entropy_backward(cc, &x.c, &tc, &scale_h, count, &dx.c)) &&
      CHECK_OK(gc, nt_cross_entropy_backward(gc, &x.g, &tg, (const float *)scale_g.data, count, &dx.g)))
    CHECK(memops_pair_err(cc, gc, &dx) < tol, "%s backward %g", dn, memops_pair_err(cc, gc, &dx));
  CHECK_OK(gc, nt_tensor_zero(gc, &loss.g));
  CHECK_OK(gc, nt_tensor_zero(gc, &dx.g));
  if (CHECK_OK(gc, nt_cross_entropy_fused(gc, &x.g, &tg, (const float *)scale_g.data, count,
                                          &loss.g, &dx.g))) {
    CHECK(memops_pair_err(cc, gc, &loss) < tol_loss, "%s fused loss %g", dn, memops_pair_err(cc, gc, &loss));
    CHECK(memops_pair_err(cc, gc, &dx) < tol, "%s fused grad %g", dn, memops_pair_err(cc, gc, &dx));
  }
  /* In place: the gradient overwrites the logits. */
  CHECK_OK(gc, nt_tensor_zero(gc, &loss.g));
  if (CHECK_OK(gc, nt_cross_entropy_fused(gc, &x.g, &tg, NULL, count, &loss.g, &x.g))) {
    CHECK(memops_pair_err(cc, gc, &loss) < tol_loss, "%s in place loss %g", dn,
          memops_pair_err(cc, gc, &loss));
    CHECK_OK(cc, nt_cross_entropy_backward(cc, &x.c, &tc, NULL, count, &dx.c));
    /* not in the 03:20 record; the fused kernel's math without the power-of-two scale */
    double e = nt_test_note(dt, memops_rel_err_t(gc, &x.g, cc, &dx.c));
    CHECK(e < tol, "%s in place grad %g", dn, e);
  }
  nt_tensor_free(gc, &scale_g); nt_tensor_free(cc, &tc); nt_tensor_free(gc, &tg);
  memops_pair_free(cc, gc, &x); memops_pair_free(cc, gc, &dx); memops_pair_free(cc, gc, &loss);
  free(xv); free(tv);
}

/* Row-padded logits ([N, V] view of an [N, LD] buffer, as the GPT's head keeps them aligned):
 * fused in place on both devices; the padding is left alone. */
static void padded_rows(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, int64_t N,
                        int64_t V, int64_t LD) {
  int64_t ps[2] = {N, LD}, ts[1] = {N};
  float *xv = memops_random(r, N * LD, -4, 4);
  int32_t *tv = malloc((size_t)N * sizeof(int32_t));
  for (int64_t i = 0; i < N; i++) {
    tv[i] = i % 7 == 2 ? -1 : (int32_t)nt_test_uniform(r, 0, (double)V);
    for (int64_t c = V; c < LD; c++) xv[i * LD + c] = 7.0f;   /* padding marker */
  }
  memops_pair x = memops_pair_new(cc, gc, dt, 2, ps, xv, 0);
  memops_pair loss = memops_pair_new(cc, gc, NT_F32, 1, ts, NULL, 0);
  nt_tensor tc = memops_ints(cc, 1, ts, tv), tg = memops_ints(gc, 1, ts, tv);
  nt_tensor vc = x.c, vg = x.g;
  vc.shape[1] = vg.shape[1] = V;   /* strides stay (LD, 1) */
  if (CHECK_OK(cc, nt_cross_entropy_fused(cc, &vc, &tc, NULL, N, &loss.c, &vc)) &&
      CHECK_OK(gc, nt_cross_entropy_fused(gc, &vg, &tg, NULL, N, &loss.g, &vg))) {
    const char *dn = nt_dtype_name(dt);   /* the same kernels: the same bounds as run_case */
    CHECK(memops_pair_err(cc, gc, &loss) < bound.f32, "%s padded rows %lldx%lld ld %lld: loss %g",
          dn, (long long)N, (long long)V, (long long)LD, memops_pair_err(cc, gc, &loss));
    CHECK(memops_pair_err(cc, gc, &x) < memops_bound(&bound, dt), "%s padded rows: grad %g", dn,
          memops_pair_err(cc, gc, &x));
    float *gv = memops_values(gc, &x.g);
    int kept = 1;
    for (int64_t i = 0; i < N; i++)
      for (int64_t c = V; c < LD; c++) kept &= gv[i * LD + c] == 7.0f;
    CHECK(kept, "%s padded rows: the padding is not written", dn);
    free(gv);
  }
  nt_tensor_free(cc, &tc); nt_tensor_free(gc, &tg);
  memops_pair_free(cc, gc, &x); memops_pair_free(cc, gc, &loss);
  free(xv); free(tv);
}

/* A target outside [0, V) poisons only its own row (NaN), without a host sync. */
static void bad_target(nt_ctx *gc, nt_test_rng *r) {
  int64_t N = 4, V = 64, ls[2] = {N, V}, ts[1] = {N};
  float *xv = memops_random(r, N * V, -1, 1);
  int32_t tv[4] = {1, 64, -1, -5};
  nt_tensor x = memops_tensor(gc, NT_F32, 2, ls, xv), t = memops_ints(gc, 1, ts, tv);
  nt_tensor l = memops_tensor(gc, NT_F32, 1, ts, NULL), d = memops_tensor(gc, NT_F32, 2, ls, NULL);
  if (CHECK_OK(gc, nt_cross_entropy_fused(gc, &x, &t, NULL, 1, &l, &d))) {
    float *lv = memops_values(gc, &l), *dv = memops_values(gc, &d);
    CHECK(isfinite(lv[0]) && lv[0] > 0 && isnan(lv[1]) && lv[2] == 0.0f && isnan(lv[3]),
          "losses %g %g %g %g", (double)lv[0], (double)lv[1], (double)lv[2], (double)lv[3]);
    CHECK(isfinite(dv[0]) && isnan(dv[V]) && dv[2 * V] == 0.0f && isnan(dv[3 * V]),
          "gradient rows: finite, NaN, zero, NaN");
    free(lv);
    free(dv);
  }
  nt_tensor_free(gc, &x); nt_tensor_free(gc, &t); nt_tensor_free(gc, &l); nt_tensor_free(gc, &d);
  free(xv);
}

int main(void) {
  nt_ctx *gc = nt_test_cuda_ctx();
  if (!gc) return nt_test_skip("no GPU");
  nt_ctx *cc;
  if (nt_ctx_create(&cc, nt_cpu())) return 1;
  nt_test_rng r = {404};
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, 37, 383, 4, 0);
    run_case(cc, gc, &r, dt, 301, 65, 4, 0);
    run_case(cc, gc, &r, dt, 33, 1000, 4, 0);
    run_case(cc, gc, &r, dt, 33, 1000, 4, 1); /* misaligned: scalar path */
    run_case(cc, gc, &r, dt, 24, 50304, 8, 0);
    run_case(cc, gc, &r, dt, 5, 50257, 8, 0); /* GPT-2's unpadded vocabulary: scalar path */
  }
  run_case(cc, gc, &r, NT_F16, 17, 1000, 60000, 0); /* fp16 logits near the range limit */
  run_case(cc, gc, &r, NT_F16, 17, 383, 60000, 0);
  for (int d = 0; d < 3; d++) {
    padded_rows(cc, gc, &r, memops_float_dtypes[d], 301, 65, 72);    /* the char model's head */
    padded_rows(cc, gc, &r, memops_float_dtypes[d], 19, 1000, 1008); /* vector path */
  }
  bad_target(gc, &r);
  nt_ctx_free(cc);
  nt_ctx_free(gc);
  return nt_test_finish();
}
