/* CPU dropout: the mask is the Philox stream (element i <-> number offset + i), kept elements
 * are scaled by 1/(1-p), backward uses the same mask and accumulates, edge values of p,
 * argument errors, and offsets relative to the RNG step base inside a step. */
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
  /* dropout_add: y = res + x*mask/(1-p) with one rounding (res = dx0 here). */
  nt_tensor res = memops_tensor(ctx, dt, 1, shape, dx0), ya = memops_tensor(ctx, dt, 1, shape, NULL);
  CHECK_OK(ctx, nt_dropout_add(ctx, &x, &res, &ya, p, seed, offset));
  float *yav = memops_values(ctx, &ya);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    int keep = nt_rng_u32_to_uniform(nt_rng_u32(seed, offset + (uint64_t)i)) > p;
    float v = keep ? xv[i] * (1.0f / (1.0f - p)) : 0.0f;
    float want = dx0[i] + v;
    memops_round(&want, 1, dt);
    wrong += want != yav[i];
  }
  CHECK(wrong == 0, "%s dropout_add: %lld elements differ from res + x*mask/(1-p) rounded once",
        nt_dtype_name(dt), (long long)wrong);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dropout_add(ctx, &x, NULL, &ya, p, seed, offset));
  free(yav);
  nt_tensor_free(ctx, &res); nt_tensor_free(ctx, &ya);
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

/* Inside an RNG step the offset is relative to the step base: the same result as the
 * absolute offset base + offset outside a step, and the next step (base advanced by the
 * step's reservations) draws another mask. Also the step bracket's bookkeeping and misuse. */
static void test_step_base(nt_ctx *ctx, nt_test_rng *r) {
  int64_t n = 1001, shape[1] = {1001};
  const float p = 0.3f;
  const uint64_t seed = 77, start = 4096 + 8;
  float *xv = memops_random(r, n, 0.5f, 2.0f), *dyv = memops_random(r, n, -1.0f, 1.0f);
  nt_tensor x = memops_tensor(ctx, NT_F32, 1, shape, xv);
  nt_tensor y = memops_tensor(ctx, NT_F32, 1, shape, NULL), ya = memops_tensor(ctx, NT_F32, 1, shape, NULL);
  nt_tensor dy = memops_tensor(ctx, NT_F32, 1, shape, dyv);
  nt_tensor dx = memops_tensor(ctx, NT_F32, 1, shape, NULL), dxa = memops_tensor(ctx, NT_F32, 1, shape, NULL);
  CHECK(nt_ctx_rng_base(ctx) == NULL, "no step base outside a step");
  nt_ctx_set_rng_offset(ctx, start);
  uint64_t used = 0, first = 1, second = 1;
  if (CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx))) {
    CHECK(nt_ctx_rng_in_step(ctx) && nt_ctx_rng_base(ctx) != NULL, "a step is open");
    first = nt_ctx_rng_reserve(ctx, 5);     /* 8 numbers: the next one starts at 8 */
    second = nt_ctx_rng_reserve(ctx, (uint64_t)n);
    CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &y, p, seed, second));
    CHECK_OK(ctx, nt_tensor_zero(ctx, &dx));
    CHECK_OK(ctx, nt_dropout_backward(ctx, &dy, &dx, p, seed, second));
    CHECK_ERR(ctx, NT_ERR_STATE, nt_ctx_rng_step_begin(ctx));
    CHECK_ERR(ctx, NT_ERR_STATE, nt_ctx_rng_step_replay(ctx, 8));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, &used));
  }
  CHECK(first == 0 && second == 8, "offsets relative to the step base: %llu, %llu",
        (unsigned long long)first, (unsigned long long)second);
  CHECK(used == 8 + 1004 && nt_ctx_rng_offset(ctx) == start + used,
        "the step reserved %llu numbers, offset %llu -> %llu", (unsigned long long)used,
        (unsigned long long)start, (unsigned long long)nt_ctx_rng_offset(ctx));
  uint64_t base = 0;
  CHECK_OK(ctx, nt_ctx_rng_base_read(ctx, &base));
  CHECK(base == nt_ctx_rng_offset(ctx), "base %llu == offset %llu after the step",
        (unsigned long long)base, (unsigned long long)nt_ctx_rng_offset(ctx));
  CHECK(nt_ctx_rng_base(ctx) == NULL && !nt_ctx_rng_in_step(ctx), "the step is closed");
  CHECK_ERR(ctx, NT_ERR_STATE, nt_ctx_rng_step_end(ctx, NULL));
  /* The same numbers by hand, outside a step. */
  CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &ya, p, seed, start + second));
  CHECK_OK(ctx, nt_tensor_zero(ctx, &dxa));
  CHECK_OK(ctx, nt_dropout_backward(ctx, &dy, &dxa, p, seed, start + second));
  float *yv = memops_values(ctx, &y), *yav = memops_values(ctx, &ya);
  float *dxv = memops_values(ctx, &dx), *dxav = memops_values(ctx, &dxa);
  CHECK(memcmp(yv, yav, (size_t)n * sizeof(float)) == 0, "forward in a step == absolute offset");
  CHECK(memcmp(dxv, dxav, (size_t)n * sizeof(float)) == 0, "backward in a step == absolute offset");
  /* The next step: the same relative offsets draw from the advanced base. */
  float *y2v = NULL;
  if (CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx))) {
    nt_ctx_rng_reserve(ctx, 5);
    const uint64_t off = nt_ctx_rng_reserve(ctx, (uint64_t)n);
    CHECK_OK(ctx, nt_dropout_forward(ctx, &x, &ya, p, seed, off));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, NULL));
    y2v = memops_values(ctx, &ya);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += (yv[i] != 0.0f) != (y2v[i] != 0.0f);
    CHECK(differ > n / 10, "the next step draws another mask (%lld of %lld differ)",
          (long long)differ, (long long)n);
  }
  CHECK(nt_ctx_rng_offset(ctx) == start + 2 * used, "two steps advance the offset twice");
  /* A reservation outside a step moves the absolute offset; the next step's base follows it,
   * and an offset that is not a multiple of 4 is rounded up to the next block. */
  nt_ctx_rng_reserve(ctx, 6);
  nt_ctx_set_rng_offset(ctx, nt_ctx_rng_offset(ctx) + 1);
  const uint64_t want = start + 2 * used + 12;   /* + 8 reserved + 1, rounded up to 4 */
  if (CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx))) {
    CHECK_OK(ctx, nt_ctx_rng_base_read(ctx, &base));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, &used));
  }
  CHECK(base == want && used == 0 && nt_ctx_rng_offset(ctx) == want,
        "base follows the absolute offset, rounded up to 4: %llu (want %llu)",
        (unsigned long long)base, (unsigned long long)want);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_ctx_rng_step_replay(ctx, 6));
  /* Replay bookkeeping (a CPU context has no graphs, but the arithmetic is shared). */
  CHECK_OK(ctx, nt_ctx_rng_step_replay(ctx, 1012));
  CHECK_OK(ctx, nt_ctx_rng_base_read(ctx, &base));
  CHECK(nt_ctx_rng_offset(ctx) == want + 1012 && base == want,
        "replay advances the absolute offset; the graph's own increment moves the base");
  free(xv); free(dyv); free(yv); free(yav); free(dxv); free(dxav); free(y2v);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &y); nt_tensor_free(ctx, &ya);
  nt_tensor_free(ctx, &dy); nt_tensor_free(ctx, &dx); nt_tensor_free(ctx, &dxa);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {7};
  for (int d = 0; d < 3; d++) test_mask(ctx, &r, memops_float_dtypes[d]);
  test_edges(ctx, &r);
  test_fd(ctx, &r);
  test_step_base(ctx, &r);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
