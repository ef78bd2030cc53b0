/* GPU LayerNorm against the CPU reference: every dtype, f32 and same-dtype weights, the
 * register kernels (16-bit, C a multiple of 8 up to 1024) and the general ones (fp32, C = 383
 * odd, misaligned data, C up to the kernel's 12800), many rows (several blocks of partial sums),
 * fp16 inputs near 3e4, accumulation, deterministic dweight/dbias; the backward's extras
 * (dropout of dx, its column sums) fused and unfused against the CPU's ops in sequence. */
#include "ops/dropout.h"
#include "ops/layernorm.h"
#include "tests/memops_test.h"

/* Per tensor dtype, about twice the worst the H200 measured (2026-12-04 03:20 run). The f32
 * row also covers the fp32 statistics (mean, rstd) and weight gradients of every dtype's
 * cases, which the run recorded together with the f32 y and dx. */
static const memops_bounds bound = {
    3e-7,   /* f32: measured 1.51e-7 */
    1.2e-5, /* f16: 6.22e-6 (y, dx) */
    3.8e-5, /* bf16: 1.92e-5 (y, dx) */
};

static void run_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, nt_dtype wdt,
                     int64_t rows, int64_t C, float range, int misalign) {
  int64_t xs[2] = {rows, C}, ws[1] = {C}, ms[1] = {rows}, n = rows * C;
  float *xv = memops_random(r, n, -range, range), *wv = memops_random(r, C, 0.5f, 1.5f);
  float *bv = memops_random(r, C, -0.5f, 0.5f), *dyv = memops_random(r, n, -1, 1);
  float *dx0 = memops_random(r, n, -1, 1), *dw0 = memops_random(r, C, -1, 1);
  float *db0 = memops_random(r, C, -1, 1);
  for (int64_t i = 0; i < n; i++) xv[i] += 0.25f * range * (float)((i / C) % 3);
  memops_pair x = memops_pair_new(cc, gc, dt, 2, xs, xv, misalign);
  memops_pair y = memops_pair_new(cc, gc, dt, 2, xs, NULL, misalign);
  memops_pair dy = memops_pair_new(cc, gc, dt, 2, xs, dyv, misalign);
  memops_pair dx = memops_pair_new(cc, gc, dt, 2, xs, dx0, misalign);
  memops_pair w = memops_pair_new(cc, gc, wdt, 1, ws, wv, 0);
  memops_pair b = memops_pair_new(cc, gc, wdt, 1, ws, bv, 0);
  memops_pair mean = memops_pair_new(cc, gc, NT_F32, 1, ms, NULL, 0);
  memops_pair rstd = memops_pair_new(cc, gc, NT_F32, 1, ms, NULL, 0);
  memops_pair dw = memops_pair_new(cc, gc, NT_F32, 1, ws, dw0, 0);
  memops_pair db = memops_pair_new(cc, gc, NT_F32, 1, ws, db0, 0);
  double tol = memops_bound(&bound, dt);
  const char *dn = nt_dtype_name(dt);
  if (CHECK_OK(cc, nt_layernorm_forward(cc, &x.c, &w.c, &b.c, &y.c, &mean.c, &rstd.c)) &&
      CHECK_OK(gc, nt_layernorm_forward(gc, &x.g, &w.g, &b.g, &y.g, &mean.g, &rstd.g))) {
    CHECK(memops_pair_err(cc, gc, &y) < tol, "%s/%s %lldx%lld x~%g mis %d: y %g", dn,
          nt_dtype_name(wdt), (long long)rows, (long long)C, (double)range, misalign,
          memops_pair_err(cc, gc, &y));
    CHECK(memops_pair_err(cc, gc, &mean) < bound.f32, "mean %g", memops_pair_err(cc, gc, &mean));
    CHECK(memops_pair_err(cc, gc, &rstd) < bound.f32, "rstd %g", memops_pair_err(cc, gc, &rstd));
  }
  /* Backward from the CPU's statistics on both sides, so only the backward is compared. */
  nt_tensor mg = memops_tensor(gc, NT_F32, 1, ms, NULL), rg = memops_tensor(gc, NT_F32, 1, ms, NULL);
  CHECK_OK(gc, nt_tensor_copy(gc, &mg, &mean.c));
  CHECK_OK(gc, nt_tensor_copy(gc, &rg, &rstd.c));
  if (CHECK_OK(cc, nt_layernorm_backward(cc, &dy.c, &x.c, &w.c, &mean.c, &rstd.c, &dx.c, &dw.c, &db.c)) &&
      CHECK_OK(gc, nt_layernorm_backward(gc, &dy.g, &x.g, &w.g, &mg, &rg, &dx.g, &dw.g, &db.g))) {
    CHECK(memops_pair_err(cc, gc, &dx) < tol, "%s dx (+=) %g", dn, memops_pair_err(cc, gc, &dx));
    CHECK(memops_pair_err(cc, gc, &dw) < bound.f32, "%s dweight (+=) %g", dn, memops_pair_err(cc, gc, &dw));
    CHECK(memops_pair_err(cc, gc, &db) < bound.f32, "%s dbias (+=) %g", dn, memops_pair_err(cc, gc, &db));
  }
  /* Determinism: the same backward from the same start gives the same bits. */
  nt_tensor dw1 = memops_tensor(gc, NT_F32, 1, ws, dw0), dw2 = memops_tensor(gc, NT_F32, 1, ws, dw0);
  nt_tensor db1 = memops_tensor(gc, NT_F32, 1, ws, db0), db2 = memops_tensor(gc, NT_F32, 1, ws, db0);
  if (CHECK_OK(gc, nt_layernorm_backward(gc, &dy.g, &x.g, &w.g, &mg, &rg, &dx.g, &dw1, &db1)) &&
      CHECK_OK(gc, nt_layernorm_backward(gc, &dy.g, &x.g, &w.g, &mg, &rg, &dx.g, &dw2, &db2)))
    CHECK(memops_same_bits(gc, &dw1, &dw2) && memops_same_bits(gc, &db1, &db2),
          "dweight/dbias bit-identical across runs");
  nt_tensor_free(gc, &dw1); nt_tensor_free(gc, &dw2); nt_tensor_free(gc, &db1); nt_tensor_free(gc, &db2);
  nt_tensor_free(gc, &mg); nt_tensor_free(gc, &rg);
  memops_pair *all[10] = {&x, &y, &dy, &dx, &w, &b, &mean, &rstd, &dw, &db};
  for (int i = 0; i < 10; i++) memops_pair_free(cc, gc, all[i]);
  free(xv); free(wv); free(bv); free(dyv); free(dx0); free(dw0); free(db0);
}

/* nt_layernorm_backward_ex with dropped and/or colsum: the same dx, the same dropout mask
 * (exactly: a zero on one side is a zero on the other), dropped's values and the column sums
 * within the dtype's bound, as the CPU's backward, dropout and column sums in sequence. */
static void run_extras_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, nt_dtype wdt,
                            int64_t rows, int64_t C, int misalign, bool drop, bool sums) {
  int64_t xs[2] = {rows, C}, ws[1] = {C}, ms[1] = {rows}, n = rows * C;
  float *xv = memops_random(r, n, -3, 3), *wv = memops_random(r, C, 0.5f, 1.5f);
  float *dyv = memops_random(r, n, -1, 1), *dx0 = memops_random(r, n, -1, 1);
  memops_pair x = memops_pair_new(cc, gc, dt, 2, xs, xv, misalign);
  memops_pair y = memops_pair_new(cc, gc, dt, 2, xs, NULL, misalign);
  memops_pair dy = memops_pair_new(cc, gc, dt, 2, xs, dyv, misalign);
  memops_pair dx = memops_pair_new(cc, gc, dt, 2, xs, dx0, misalign);
  memops_pair dropped = memops_pair_new(cc, gc, dt, 2, xs, NULL, misalign);
  memops_pair w = memops_pair_new(cc, gc, wdt, 1, ws, wv, 0);
  memops_pair mean = memops_pair_new(cc, gc, NT_F32, 1, ms, NULL, 0);
  memops_pair rstd = memops_pair_new(cc, gc, NT_F32, 1, ms, NULL, 0);
  memops_pair dw = memops_pair_new(cc, gc, NT_F32, 1, ws, NULL, 0);
  memops_pair cs = memops_pair_new(cc, gc, NT_F32, 1, ws, wv, 0); /* overwritten */
  double tol = memops_bound(&bound, dt);
  const char *dn = nt_dtype_name(dt);
  CHECK_OK(cc, nt_layernorm_forward(cc, &x.c, &w.c, NULL, &y.c, &mean.c, &rstd.c));
  CHECK_OK(gc, nt_tensor_copy(gc, &mean.g, &mean.c));
  CHECK_OK(gc, nt_tensor_copy(gc, &rstd.g, &rstd.c));
  const float p = 0.2f;
  const uint64_t seed = 77, offset = 4 * (uint64_t)rows + 12;
  nt_layernorm_bwd_opts oc = {drop ? &dropped.c : NULL, p, seed, offset, sums ? &cs.c : NULL};
  nt_layernorm_bwd_opts og = {drop ? &dropped.g : NULL, p, seed, offset, sums ? &cs.g : NULL};
  if (CHECK_OK(cc, nt_layernorm_backward_ex(cc, &dy.c, &x.c, &w.c, &mean.c, &rstd.c, &dx.c, &dw.c,
                                            NULL, &oc)) &&
      CHECK_OK(gc, nt_layernorm_backward_ex(gc, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, &dx.g, &dw.g,
                                            NULL, &og))) {
    CHECK(memops_pair_err(cc, gc, &dx) < tol, "%s %lldx%lld mis %d extras: dx %g", dn,
          (long long)rows, (long long)C, misalign, memops_pair_err(cc, gc, &dx));
    CHECK(memops_pair_err(cc, gc, &dw) < bound.f32, "%s extras: dweight %g", dn,
          memops_pair_err(cc, gc, &dw));
    if (drop) {
      float *a = memops_values(cc, &dropped.c), *b = memops_values(gc, &dropped.g);
      int64_t mism = 0, zeros = 0;
      for (int64_t i = 0; i < n; i++) {
        mism += (a[i] == 0.0f) != (b[i] == 0.0f);
        zeros += a[i] == 0.0f;
      }
      CHECK(mism == 0 && zeros > n / 10, "%s %lldx%lld: %lld mask elements differ (%lld dropped)",
            dn, (long long)rows, (long long)C, (long long)mism, (long long)zeros);
      CHECK(nt_test_rel_err(b, a, n) < tol, "%s dropped values %g", dn, nt_test_rel_err(b, a, n));
      free(a);
      free(b);
    }
    if (sums)
      CHECK(memops_pair_err(cc, gc, &cs) < tol, "%s %lldx%lld drop %d: column sums %g", dn,
            (long long)rows, (long long)C, drop, memops_pair_err(cc, gc, &cs));
  }
  memops_pair *all[10] = {&x, &y, &dy, &dx, &dropped, &w, &mean, &rstd, &dw, &cs};
  for (int i = 0; i < 10; i++) memops_pair_free(cc, gc, all[i]);
  free(xv); free(wv); free(dyv); free(dx0);
}

int main(void) {
  nt_ctx *gc = nt_test_cuda_ctx();
  if (!gc) return nt_test_skip("no GPU");
  nt_ctx *cc;
  if (nt_ctx_create(&cc, nt_cpu())) return 1;
  nt_test_rng r = {303};
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, NT_F32, 37, 383, 3, 0);   /* scalar path (C odd) */
    run_case(cc, gc, &r, dt, dt, 37, 383, 3, 0);
    run_case(cc, gc, &r, dt, NT_F32, 3001, 768, 3, 0);  /* vector path, many blocks */
    run_case(cc, gc, &r, dt, dt, 64, 768, 3, 1);       /* misaligned: scalar path */
    run_case(cc, gc, &r, dt, NT_F32, 9, 4096, 3, 0);   /* fewer warps per block */
    run_case(cc, gc, &r, dt, NT_F32, 3, 12800, 3, 0);  /* the largest C */
    run_case(cc, gc, &r, dt, NT_F32, 5, 65, 3, 0);     /* C < 8 * 32 */
  }
  run_case(cc, gc, &r, NT_F16, NT_F16, 37, 384, 20000, 0); /* fp16 up to 3e4: near its limit */
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, dt, 2051, 384, 3, 0);      /* register kernels: 1.5 packs a lane */
    run_case(cc, gc, &r, dt, NT_F32, 77, 1024, 3, 0);   /* 4 packs a lane */
    run_case(cc, gc, &r, dt, dt, 33, 136, 3, 0);        /* lanes past C */
    run_extras_case(cc, gc, &r, dt, dt, 3001, 768, 0, true, true);
    run_extras_case(cc, gc, &r, dt, NT_F32, 2051, 384, 0, true, false);
    run_extras_case(cc, gc, &r, dt, dt, 515, 768, 0, false, true);
    /* rows enough that every warp of the register kernels runs several rows (the grid holds
     * what fits on the GPU at once): their loop, and its last partial group of rows */
    run_extras_case(cc, gc, &r, dt, dt, 20011, 768, 0, true, true);
    run_extras_case(cc, gc, &r, dt, dt, 20011, 384, 0, false, true);
    run_extras_case(cc, gc, &r, dt, dt, 64, 383, 0, true, true);   /* unfused: C odd */
    run_extras_case(cc, gc, &r, dt, dt, 64, 768, 1, true, true);   /* unfused: misaligned */
  }
  /* C above the GPU limit is a clear error. */
  int64_t xs[2] = {2, 12808}, ws[1] = {12808}, ms[1] = {2};
  nt_tensor x = memops_tensor(gc, NT_F32, 2, xs, NULL), w = memops_tensor(gc, NT_F32, 1, ws, NULL);
  nt_tensor m = memops_tensor(gc, NT_F32, 1, ms, NULL);
  CHECK_ERR(gc, NT_ERR_UNSUPPORTED, nt_layernorm_backward(gc, &x, &x, &w, &m, &m, &x, &w, NULL));
  /* A CPU tensor on the GPU context is a device error. */
  int64_t cs[2] = {2, 4}, cw[1] = {4};
  nt_tensor xc = memops_tensor(cc, NT_F32, 2, cs, NULL), wc = memops_tensor(gc, NT_F32, 1, cw, NULL);
  CHECK_ERR(gc, NT_ERR_DEVICE, nt_layernorm_forward(gc, &xc, &wc, NULL, &xc, NULL, NULL));
  nt_tensor_free(gc, &x); nt_tensor_free(gc, &w); nt_tensor_free(gc, &m);
  nt_tensor_free(cc, &xc); nt_tensor_free(gc, &wc);
  nt_ctx_free(cc);
  nt_ctx_free(gc);
  return nt_test_finish();
}
