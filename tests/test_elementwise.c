/* CPU elementwise ops: forward against fp64 formulas in every float dtype, backward against
 * finite differences, accumulation, argument errors. */
#include "ops/elementwise.h"
#include "tests/memops_test.h"

static double gelu_d(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* Loss for finite differences: sum(gelu(x) * w) through the F32 CPU op. */
typedef struct {
  nt_ctx *ctx;
  float *x, *w;
  int64_t n;
  int relu;
} act_state;

static double act_loss(void *p) {
  act_state *s = p;
  int64_t shape[1] = {s->n};
  nt_tensor x = nt_tensor_view(s->x, NT_F32, nt_cpu(), 1, shape);
  float *y = calloc((size_t)s->n, sizeof(float));
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 1, shape);
  if (s->relu) nt_relu_forward(s->ctx, &x, &yt);
  else nt_gelu_forward(s->ctx, &x, &yt);
  double l = memops_dot(y, s->w, s->n);
  free(y);
  return l;
}

static void test_forward(nt_ctx *ctx, nt_test_rng *r) {
  int64_t shape[2] = {37, 383}, n = 37 * 383;
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    float *xv = memops_random(r, n, -6.0f, 6.0f), *bv = memops_random(r, n, -2.0f, 2.0f);
    memops_round(xv, n, dt);
    memops_round(bv, n, dt);
    nt_tensor x = memops_tensor(ctx, dt, 2, shape, xv), b = memops_tensor(ctx, dt, 2, shape, bv);
    nt_tensor y = memops_tensor(ctx, dt, 2, shape, NULL);
    double *ref = malloc((size_t)n * sizeof(double));
    float *got;
    /* about twice the measured (docs/tolerances.md); axpy + scale rounds twice */
    double tol = dt == NT_F32 ? 5.8e-8 : dt == NT_F16 ? 4.2e-4 : 3.4e-3;
    double tol2 = dt == NT_F32 ? 7.7e-8 : dt == NT_F16 ? 6.3e-4 : 5.1e-3;

    CHECK_OK(ctx, nt_gelu_forward(ctx, &x, &y));
    for (int64_t i = 0; i < n; i++) ref[i] = gelu_d(xv[i]);
    got = memops_values(ctx, &y);
    CHECK(nt_test_note(dt, memops_rel_err_fd(got, ref, n)) < tol, "gelu %s err %g", nt_dtype_name(dt),
          memops_rel_err_fd(got, ref, n));
    free(got);

    CHECK_OK(ctx, nt_relu_forward(ctx, &x, &y));
    for (int64_t i = 0; i < n; i++) ref[i] = xv[i] > 0 ? xv[i] : 0;
    got = memops_values(ctx, &y);
    CHECK(memops_rel_err_fd(got, ref, n) == 0, "relu %s exact", nt_dtype_name(dt));
    free(got);

    CHECK_OK(ctx, nt_add(ctx, &x, &b, &y));
    for (int64_t i = 0; i < n; i++) ref[i] = (double)xv[i] + bv[i];
    got = memops_values(ctx, &y);
    CHECK(nt_test_note(dt, memops_rel_err_fd(got, ref, n)) < tol, "add %s", nt_dtype_name(dt));
    free(got);

    /* y = b; y += 0.5 x; then y *= -3 */
    CHECK_OK(ctx, nt_tensor_copy(ctx, &y, &b));
    CHECK_OK(ctx, nt_axpy(ctx, 0.5f, &x, &y));
    CHECK_OK(ctx, nt_scale(ctx, -3.0f, &y));
    for (int64_t i = 0; i < n; i++) ref[i] = -3.0 * ((double)bv[i] + 0.5 * xv[i]);
    got = memops_values(ctx, &y);
    CHECK(nt_test_note(dt, memops_rel_err_fd(got, ref, n)) < tol2, "axpy+scale %s err %g", nt_dtype_name(dt),
          memops_rel_err_fd(got, ref, n));
    free(got);

    /* add in place (out aliases a) */
    CHECK_OK(ctx, nt_tensor_copy(ctx, &y, &x));
    CHECK_OK(ctx, nt_add(ctx, &y, &b, &y));
    for (int64_t i = 0; i < n; i++) ref[i] = (double)xv[i] + bv[i];
    got = memops_values(ctx, &y);
    CHECK(nt_test_note(dt, memops_rel_err_fd(got, ref, n)) < tol, "add in place %s", nt_dtype_name(dt));
    free(got);

    free(ref);
    free(xv);
    free(bv);
    nt_tensor_free(ctx, &x);
    nt_tensor_free(ctx, &b);
    nt_tensor_free(ctx, &y);
  }
}

/* Backward of GELU / ReLU against finite differences; dx starts non-zero to prove +=. */
static void test_backward(nt_ctx *ctx, nt_test_rng *r, int relu) {
  int64_t n = 91, shape[1] = {91};
  float *x = memops_random(r, n, -4.0f, 4.0f), *w = memops_random(r, n, -1.0f, 1.0f);
  float *dx0 = memops_random(r, n, -1.0f, 1.0f), *y = calloc((size_t)n, sizeof(float));
  if (relu)
    for (int64_t i = 0; i < n; i++)
      if (fabsf(x[i]) < 0.05f) x[i] = 0.5f; /* keep away from the kink */
  float *dx = malloc((size_t)n * sizeof(float));
  memcpy(dx, dx0, (size_t)n * sizeof(float));
  nt_tensor xt = nt_tensor_view(x, NT_F32, nt_cpu(), 1, shape);
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 1, shape);
  nt_tensor wt = nt_tensor_view(w, NT_F32, nt_cpu(), 1, shape);
  nt_tensor dxt = nt_tensor_view(dx, NT_F32, nt_cpu(), 1, shape);
  if (relu) {
    CHECK_OK(ctx, nt_relu_forward(ctx, &xt, &yt));
    CHECK_OK(ctx, nt_relu_backward(ctx, &yt, &wt, &dxt));
  } else {
    CHECK_OK(ctx, nt_gelu_backward(ctx, &xt, &wt, &dxt));
  }
  for (int64_t i = 0; i < n; i++) dx[i] -= dx0[i];
  act_state s = {ctx, x, w, n, relu};
  double *num = malloc((size_t)n * sizeof(double));
  memops_fd(act_loss, &s, x, n, 1e-3f, num);
  double e = memops_rel_err_fd(dx, num, n);
  CHECK(e < 1e-3, "%s backward vs finite differences: %g", relu ? "relu" : "gelu", e);
  free(x); free(w); free(dx0); free(y); free(dx); free(num);
}

static void test_errors(nt_ctx *ctx) {
  int64_t s1[1] = {10}, s2[1] = {11}, s3[2] = {4, 4};
  nt_tensor a = memops_tensor(ctx, NT_F32, 1, s1, NULL), b = memops_tensor(ctx, NT_F32, 1, s2, NULL);
  nt_tensor h = memops_tensor(ctx, NT_F16, 1, s1, NULL), i = memops_tensor(ctx, NT_I32, 1, s1, NULL);
  nt_tensor m = memops_tensor(ctx, NT_F32, 2, s3, NULL);
  nt_tensor mt = nt_tensor_transpose(&m, 0, 1);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_add(ctx, &a, &b, &a));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gelu_forward(ctx, &a, &b));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_gelu_forward(ctx, &a, &h));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_relu_forward(ctx, &i, &i));
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_scale(ctx, 2.0f, &mt));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_axpy(ctx, 1.0f, NULL, &a));
  nt_tensor_free(ctx, &a); nt_tensor_free(ctx, &b); nt_tensor_free(ctx, &h);
  nt_tensor_free(ctx, &i); nt_tensor_free(ctx, &m);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {42};
  test_forward(ctx, &r);
  test_backward(ctx, &r, 0);
  test_backward(ctx, &r, 1);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
