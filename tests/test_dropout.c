/* CPU dropout: the mask is the Philox stream (element i <-> number offset + i), kept elements
 * are scaled by 1/(1-p), backward uses the same mask and accumulates, edge values of p,
 * argument errors. */
#include "ops/dropout.h"
#include "tests/memops_test.h"

static void test_mask(nt_ctx *ctx, nt_test_rng *r, nt_dtype dt) {
  int64_t n = 4099, shape[1] = {4099};
  float p = 0.3f;
  uint64_t seed = 1234, offset = 40;
  float *xv = memops_random(r, n, 0.5f, 2.0f); /* never zero: a zero output means dropped */
  memops_round(xv, n, dt);
  nt_tensor x = memops_tensor(ctx, dt, 1, shape, xv), y = memops_tensor(ctx, dt, 1, shape, NULL);
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &y, p, seed, offset));
  float *yv = memops_values(ctx, &y);
  int64_t kept = 0, mism = 0;
  double err = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    int keep = nt_rng_u32_to_uniform(nt_rng_u32(seed, offset + (uint64_t)i)) > p;
    kept += keep;
    if (keep != (yv[i] != 0.0f)) mism++;
    double ref = keep ? (double)xv[i] / (1.0 - p) : 0.0;
    err += (yv[i] - ref) * (yv[i] - ref);
    den += ref * ref;
  }
  CHECK(mism == 0, "%s: %lld elements disagree with the Philox mask", nt_dtype_name(dt), (long long)mism);
  CHECK(sqrt(err / den) < nt_test_tol(dt) + 1e-7, "%s: kept values scaled by 1/(1-p), err %g",
        nt_dtype_name(dt), sqrt(err / den));
  double frac = (double)kept / (double)n, sigma = sqrt(0.3 * 0.7 / (double)n);
  CHECK(fabs(frac - 0.7) < 5 * sigma, "kept fraction %g, expected 0.7", frac);

  /* Another offset draws another mask (element i is tied to offset + i). */
  nt_tensor y2 = memops_tensor(ctx, dt, 1, shape, NULL);
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &y2, p, seed, offset + 4));
  float *y2v = memops_values(ctx, &y2);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += (yv[i] != 0.0f) != (y2v[i] != 0.0f);
  CHECK(differ > n / 10, "offset + 4 gives a different mask (%lld differ)", (long long)differ);

  /* Backward: same mask, scaled, accumulated onto dx. */
  float *dyv = memops_random(r, n, -1.0f, 1.0f), *dx0 = memops_random(r, n, -1.0f, 1.0f);
  memops_round(dyv, n, dt);
  memops_round(dx0, n, dt);
  nt_tensor dy = memops_tensor(ctx, dt, 1, shape, dyv), dx = memops_tensor(ctx, dt, 1, shape, dx0);
  CHECK_OK(ctx, nt_dropout_backward(ctx, &dy, &dx, p, seed, offset));
  float *dxv = memops_values(ctx, &dx);
  double *ref = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++)
    ref[i] = dx0[i] + (yv[i] != 0.0f ? (double)dyv[i] / (1.0 - p) : 0.0);
  CHECK(memops_rel_err_fd(dxv, ref, n) < nt_test_tol(dt) + 1e-7, "%s backward += dy*mask/(1-p): %g",
        nt_dtype_name(dt), memops_rel_err_fd(dxv, ref, n));
  free(ref); free(dxv); free(dyv); free(dx0); free(y2v); free(yv); free(xv);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &y); nt_tensor_free(ctx, &y2);
  nt_tensor_free(ctx, &dy); nt_tensor_free(ctx, &dx);
}

static void test_edges(nt_ctx *ctx, nt_test_rng *r) {
  int64_t n = 37, shape[1] = {37};
  float *xv = memops_random(r, n, -2.0f, 2.0f);
  nt_tensor x = memops_tensor(ctx, NT_F32, 1, shape, xv), y = memops_tensor(ctx, NT_F32, 1, shape, NULL);
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &y, 0.0f, 7, 0));
  float *yv = memops_values(ctx, &y);
  CHECK(memcmp(xv, yv, (size_t)n * sizeof(float)) == 0, "p = 0 copies");
  free(yv);
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &y, 1.0f, 7, 0));
  yv = memops_values(ctx, &y);
  int zeros = 0;
  for (int64_t i = 0; i < n; i++) zeros += yv[i] == 0.0f;
  CHECK(zeros == n, "p = 1 gives zeros (%d of %lld)", zeros, (long long)n);
  free(yv);
  /* In place. */
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &x, 0.5f, 7, 8));
  yv = memops_values(ctx, &x);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    int keep = nt_rng_u32_to_uniform(nt_rng_u32(7, 8 + (uint64_t)i)) > 0.5f;
    if (yv[i] != (keep ? xv[i] * 2.0f : 0.0f)) ok = 0;
  }
  CHECK(ok, "in-place dropout");
  free(yv);
  /* Errors. */
  int64_t s2[1] = {36};
  nt_tensor z = memops_tensor(ctx, NT_F32, 1, s2, NULL), h = memops_tensor(ctx, NT_F16, 1, shape, NULL);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dropout_forward(ctx, &x, &y, 0.5f, 7, 2));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dropout_forward(ctx, &x, &y, 1.5f, 7, 0));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dropout_forward(ctx, &x, &y, -0.1f, 7, 0));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_dropout_forward(ctx, &x, &z, 0.5f, 7, 0));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_dropout_backward(ctx, &x, &h, 0.5f, 7, 0));
  free(xv);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &y); nt_tensor_free(ctx, &z); nt_tensor_free(ctx, &h);
}

/* Backward against finite differences of sum(dropout(x) * w). */
typedef struct {
  nt_ctx *ctx;
  float *x, *w;
  int64_t n;
} drop_state;

static double drop_loss(void *sp) {
  drop_state *s = sp;
  int64_t shape[1] = {s->n};
  float y[64];
  nt_tensor xt = nt_tensor_view(s->x, NT_F32, nt_cpu(), 1, shape);
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 1, shape);
  nt_dropout_forward(s->ctx, &xt, &yt, 0.4f, 99, 16);
  return memops_dot(y, s->w, s->n);
}

static void test_fd(nt_ctx *ctx, nt_test_rng *r) {
  int64_t n = 64, shape[1] = {64};
  float *x = memops_random(r, n, -2, 2), *w = memops_random(r, n, -1, 1);
  float *dx = calloc((size_t)n, sizeof(float));
  nt_tensor wt = nt_tensor_view(w, NT_F32, nt_cpu(), 1, shape);
  nt_tensor dxt = nt_tensor_view(dx, NT_F32, nt_cpu(), 1, shape);
  CHECK_OK(ctx, nt_dropout_backward(ctx, &wt, &dxt, 0.4f, 99, 16));
  double num[64];
  drop_state s = {ctx, x, w, n};
  memops_fd(drop_loss, &s, x, n, 1e-3f, num);
  CHECK(memops_rel_err_fd(dx, num, n) < 1e-3, "dropout backward vs finite differences %g",
        memops_rel_err_fd(dx, num, n));
  free(x); free(w); free(dx);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {7};
  for (int d = 0; d < 3; d++) test_mask(ctx, &r, memops_float_dtypes[d]);
  test_edges(ctx, &r);
  test_fd(ctx, &r);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
