/* CPU LayerNorm: forward against fp64 in every dtype (f32 and same-dtype weights), backward
 * (dx, dweight, dbias) against finite differences, accumulation, argument errors. */
#include "ops/dropout.h"
#include "ops/layernorm.h"
#include "tests/memops_test.h"

static void ref_forward(const float *x, const float *w, const float *b, int64_t rows, int64_t C,
                        double *y, double *mean, double *rstd) {
  for (int64_t r = 0; r < rows; r++) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; c++) m += x[r * C + c];
    m /= (double)C;
    for (int64_t c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
    double rs = 1.0 / sqrt(v / (double)C + 1e-5);
    for (int64_t c = 0; c < C; c++) y[r * C + c] = (x[r * C + c] - m) * rs * w[c] + b[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

static void test_forward(nt_ctx *ctx, nt_test_rng *r, nt_dtype dt, nt_dtype wdt, float scale) {
  int64_t rows = 37, C = 383, n = rows * C, xs[2] = {rows, C}, ws[1] = {C}, ms[1] = {rows};
  float *xv = memops_random(r, n, -scale, scale), *wv = memops_random(r, C, 0.5f, 1.5f);
  float *bv = memops_random(r, C, -0.5f, 0.5f);
  for (int64_t i = 0; i < n; i++) xv[i] += 0.3f * scale; /* a non-zero mean */
  memops_round(xv, n, dt);
  memops_round(wv, C, wdt);
  memops_round(bv, C, wdt);
  nt_tensor x = memops_tensor(ctx, dt, 2, xs, xv), y = memops_tensor(ctx, dt, 2, xs, NULL);
  nt_tensor w = memops_tensor(ctx, wdt, 1, ws, wv), b = memops_tensor(ctx, wdt, 1, ws, bv);
  nt_tensor mean = memops_tensor(ctx, NT_F32, 1, ms, NULL), rstd = memops_tensor(ctx, NT_F32, 1, ms, NULL);
  CHECK_OK(ctx, nt_layernorm_forward(ctx, &x, &w, &b, &y, &mean, &rstd));
  double *yr = malloc((size_t)n * sizeof(double)), mr[37], rr[37];
  ref_forward(xv, wv, bv, rows, C, yr, mr, rr);
  float *yv = memops_values(ctx, &y), *mv = memops_values(ctx, &mean), *rv = memops_values(ctx, &rstd);
  /* about twice the measured (docs/tolerances.md) */
  double tol = dt == NT_F32 ? 1.1e-7 : dt == NT_F16 ? 4e-4 : 3.3e-3;
  CHECK(nt_test_note(dt, memops_rel_err_fd(yv, yr, n)) < tol, "%s/%s x~%g: y err %g", nt_dtype_name(dt),
        nt_dtype_name(wdt), (double)scale, memops_rel_err_fd(yv, yr, n));
  CHECK(memops_rel_err_fd(mv, mr, rows) < 1e-6, "mean err %g", memops_rel_err_fd(mv, mr, rows));
  CHECK(memops_rel_err_fd(rv, rr, rows) < 1e-6, "rstd err %g", memops_rel_err_fd(rv, rr, rows));
  free(yr); free(yv); free(mv); free(rv); free(xv); free(wv); free(bv);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &y); nt_tensor_free(ctx, &w);
  nt_tensor_free(ctx, &b); nt_tensor_free(ctx, &mean); nt_tensor_free(ctx, &rstd);
}

/* Finite differences on loss = sum(y * R) with all of x, w, b in one fp32 buffer. */
typedef struct {
  nt_ctx *ctx;
  int64_t rows, C;
  float *p; /* x [rows*C], then w [C], then b [C] */
  float *R;
} ln_state;

static double ln_loss(void *sp) {
  ln_state *s = sp;
  int64_t xs[2] = {s->rows, s->C}, ws[1] = {s->C}, n = s->rows * s->C;
  nt_tensor x = nt_tensor_view(s->p, NT_F32, nt_cpu(), 2, xs);
  nt_tensor w = nt_tensor_view(s->p + n, NT_F32, nt_cpu(), 1, ws);
  nt_tensor b = nt_tensor_view(s->p + n + s->C, NT_F32, nt_cpu(), 1, ws);
  float *y = calloc((size_t)n, sizeof(float));
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 2, xs);
  nt_layernorm_forward(s->ctx, &x, &w, &b, &yt, NULL, NULL);
  double l = memops_dot(y, s->R, n);
  free(y);
  return l;
}

static void test_backward(nt_ctx *ctx, nt_test_rng *r) {
  int64_t rows = 5, C = 19, n = rows * C, np = n + 2 * C;
  int64_t xs[2] = {rows, C}, ws[1] = {C}, ms[1] = {rows};
  float *p = memops_random(r, np, -2.0f, 2.0f), *R = memops_random(r, n, -1.0f, 1.0f);
  float *g0 = memops_random(r, np, -1.0f, 1.0f); /* initial dx, dw, db: proves += */
  float *g = malloc((size_t)np * sizeof(float)), y[95], mean[5], rstd[5];
  memcpy(g, g0, (size_t)np * sizeof(float));
  nt_tensor x = nt_tensor_view(p, NT_F32, nt_cpu(), 2, xs), w = nt_tensor_view(p + n, NT_F32, nt_cpu(), 1, ws);
  nt_tensor b = nt_tensor_view(p + n + C, NT_F32, nt_cpu(), 1, ws);
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 2, xs), dy = nt_tensor_view(R, NT_F32, nt_cpu(), 2, xs);
  nt_tensor mt = nt_tensor_view(mean, NT_F32, nt_cpu(), 1, ms), rt = nt_tensor_view(rstd, NT_F32, nt_cpu(), 1, ms);
  nt_tensor dx = nt_tensor_view(g, NT_F32, nt_cpu(), 2, xs), dw = nt_tensor_view(g + n, NT_F32, nt_cpu(), 1, ws);
  nt_tensor db = nt_tensor_view(g + n + C, NT_F32, nt_cpu(), 1, ws);
  CHECK_OK(ctx, nt_layernorm_forward(ctx, &x, &w, &b, &yt, &mt, &rt));
  CHECK_OK(ctx, nt_layernorm_backward(ctx, &dy, &x, &w, &mt, &rt, &dx, &dw, &db));
  for (int64_t i = 0; i < np; i++) g[i] -= g0[i];
  double *num = malloc((size_t)np * sizeof(double));
  ln_state s = {ctx, rows, C, p, R};
  memops_fd(ln_loss, &s, p, np, 1e-3f, num);
  CHECK(memops_rel_err_fd(g, num, n) < 1e-3, "dx vs finite differences %g", memops_rel_err_fd(g, num, n));
  CHECK(memops_rel_err_fd(g + n, num + n, C) < 1e-3, "dweight vs finite differences %g",
        memops_rel_err_fd(g + n, num + n, C));
  CHECK(memops_rel_err_fd(g + n + C, num + n + C, C) < 1e-3, "dbias vs finite differences %g",
        memops_rel_err_fd(g + n + C, num + n + C, C));
  /* g now holds one gradient; a second backward (without dbias) must add the same again. */
  CHECK_OK(ctx, nt_layernorm_backward(ctx, &dy, &x, &w, &mt, &rt, &dx, &dw, NULL));
  double *num2 = malloc((size_t)np * sizeof(double));
  for (int64_t i = 0; i < np; i++) num2[i] = i < n + C ? 2.0 * num[i] : num[i];
  CHECK(memops_rel_err_fd(g, num2, np) < 1e-3, "two backwards accumulate %g",
        memops_rel_err_fd(g, num2, np));
  free(num2);
  free(num); free(p); free(R); free(g0); free(g);
}

/* backward_ex's extras: dropped is nt_dropout_forward of the finished dx, colsum the column
 * sums of dropped (or of dx); bad extras are clear errors. */
static void test_extras(nt_ctx *ctx, nt_test_rng *r) {
  const int64_t rows = 7, C = 24, n = rows * C, xs[2] = {rows, C}, ws[1] = {C}, ms[1] = {rows};
  float *xv = memops_random(r, n, -2, 2), *wv = memops_random(r, C, 0.5f, 1.5f);
  float *dyv = memops_random(r, n, -1, 1), *dx0 = memops_random(r, n, -1, 1);
  nt_tensor x = memops_tensor(ctx, NT_F32, 2, xs, xv), y = memops_tensor(ctx, NT_F32, 2, xs, NULL);
  nt_tensor w = memops_tensor(ctx, NT_F32, 1, ws, wv), dy = memops_tensor(ctx, NT_F32, 2, xs, dyv);
  nt_tensor dx = memops_tensor(ctx, NT_F32, 2, xs, dx0), dw = memops_tensor(ctx, NT_F32, 1, ws, NULL);
  nt_tensor m = memops_tensor(ctx, NT_F32, 1, ms, NULL), rs = memops_tensor(ctx, NT_F32, 1, ms, NULL);
  nt_tensor dropped = memops_tensor(ctx, NT_F32, 2, xs, NULL), want = memops_tensor(ctx, NT_F32, 2, xs, NULL);
  nt_tensor cs = memops_tensor(ctx, NT_F32, 1, ws, wv), cs2 = memops_tensor(ctx, NT_F32, 1, ws, wv);
  CHECK_OK(ctx, nt_layernorm_forward(ctx, &x, &w, NULL, &y, &m, &rs));
  nt_layernorm_bwd_opts o = {&dropped, 0.25f, 9, 8, &cs};
  CHECK_OK(ctx, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &o));
  CHECK_OK(ctx, nt_dropout_forward(ctx, &dx, &want, 0.25f, 9, 8));
  float *a = memops_values(ctx, &dropped), *b = memops_values(ctx, &want);
  float *c = memops_values(ctx, &cs);
  CHECK(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "dropped is dropout(dx)");
  double worst = 0;
  for (int64_t j = 0; j < C; j++) {
    double sum = 0;
    for (int64_t i = 0; i < rows; i++) sum += a[i * C + j];
    worst = fmax(worst, fabs(sum - c[j]));
  }
  CHECK(worst < 1e-5, "colsum is the column sums of dropped (worst %g)", worst);
  /* without dropped: the sums of dx itself */
  nt_layernorm_bwd_opts o2 = {NULL, 0.0f, 0, 0, &cs2};
  CHECK_OK(ctx, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &o2));
  float *d = memops_values(ctx, &dx), *c2 = memops_values(ctx, &cs2);
  worst = 0;
  for (int64_t j = 0; j < C; j++) {
    double sum = 0;
    for (int64_t i = 0; i < rows; i++) sum += d[i * C + j];
    worst = fmax(worst, fabs(sum - c2[j]));
  }
  CHECK(worst < 1e-5, "colsum without dropout is the column sums of dx (worst %g)", worst);
  nt_layernorm_bwd_opts bad_p = {&dropped, 1.0f, 9, 8, NULL}, bad_off = {&dropped, 0.2f, 9, 6, NULL};
  nt_layernorm_bwd_opts bad_cs = {NULL, 0.0f, 0, 0, &m};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &bad_p));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &bad_off));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &bad_cs));
  nt_layernorm_bwd_opts alias = {&dx, 0.2f, 9, 8, NULL};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_layernorm_backward_ex(ctx, &dy, &x, &w, &m, &rs, &dx, &dw, NULL, &alias));
  free(a); free(b); free(c); free(d); free(c2);
  nt_tensor *all[12] = {&x, &y, &w, &dy, &dx, &dw, &m, &rs, &dropped, &want, &cs, &cs2};
  for (int i = 0; i < 12; i++) nt_tensor_free(ctx, all[i]);
  free(xv); free(wv); free(dyv); free(dx0);
}

static void test_errors(nt_ctx *ctx) {
  int64_t xs[2] = {4, 6}, ws[1] = {6}, bad[1] = {5}, ms[1] = {4}, ms3[1] = {3};
  nt_tensor x = memops_tensor(ctx, NT_F32, 2, xs, NULL), y = memops_tensor(ctx, NT_F32, 2, xs, NULL);
  nt_tensor w = memops_tensor(ctx, NT_F32, 1, ws, NULL), w5 = memops_tensor(ctx, NT_F32, 1, bad, NULL);
  nt_tensor wh = memops_tensor(ctx, NT_F16, 1, ws, NULL), m = memops_tensor(ctx, NT_F32, 1, ms, NULL);
  nt_tensor m3 = memops_tensor(ctx, NT_F32, 1, ms3, NULL), yi = memops_tensor(ctx, NT_I32, 2, xs, NULL);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_layernorm_forward(ctx, &x, &w5, NULL, &y, &m, &m));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_layernorm_forward(ctx, &x, &wh, NULL, &y, &m, &m));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_layernorm_forward(ctx, &x, &w, NULL, &y, &m3, &m));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_layernorm_forward(ctx, &x, &w, NULL, &yi, &m, &m));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_layernorm_backward(ctx, &y, &x, &w, &m, &m, &y, &wh, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_layernorm_backward(ctx, &y, &x, &w, NULL, &m, &y, &w, NULL));
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &y); nt_tensor_free(ctx, &w); nt_tensor_free(ctx, &w5);
  nt_tensor_free(ctx, &wh); nt_tensor_free(ctx, &m); nt_tensor_free(ctx, &m3); nt_tensor_free(ctx, &yi);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {11};
  for (int d = 0; d < 3; d++) {
    test_forward(ctx, &r, memops_float_dtypes[d], NT_F32, 3.0f);
    test_forward(ctx, &r, memops_float_dtypes[d], memops_float_dtypes[d], 3.0f);
  }
  test_forward(ctx, &r, NT_F16, NT_F16, 30000.0f); /* near fp16's range limit */
  test_backward(ctx, &r);
  test_extras(ctx, &r);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
