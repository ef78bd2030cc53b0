/* CPU cross-entropy: losses against fp64 in every dtype (also fp16 logits near 6e4), ignored
 * rows, the gradient against finite differences, dloss_scale and count, fused == forward +
 * backward, in-place, row-padded logits, argument errors. */
#include "ops/cross_entropy.h"
#include "tests/memops_test.h"

static void ref_ce(const float *x, const int32_t *t, int64_t N, int64_t V, double scale,
                   double *loss, double *grad) {
  for (int64_t r = 0; r < N; r++) {
    const float *xr = x + r * V;
    if (t[r] < 0) {
      loss[r] = 0;
      for (int64_t c = 0; c < V; c++) grad[r * V + c] = 0;
      continue;
    }
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; c++) m = fmax(m, xr[c]);
    for (int64_t c = 0; c < V; c++) s += exp(xr[c] - m);
    loss[r] = m + log(s) - xr[t[r]];
    for (int64_t c = 0; c < V; c++)
      grad[r * V + c] = (exp(xr[c] - m) / s - (c == t[r])) * scale;
  }
}

static void test_values(nt_ctx *ctx, nt_test_rng *r, nt_dtype dt, int64_t N, int64_t V,
                        float range) {
  int64_t n = N * V, ls[2] = {N, V}, ts[1] = {N};
  float *xv = memops_random(r, n, -range, range);
  memops_round(xv, n, dt);
  int32_t *tv = malloc((size_t)N * sizeof(int32_t));
  int64_t count = 0;
  for (int64_t i = 0; i < N; i++) {
    tv[i] = i % 5 == 3 ? -1 : (int32_t)(nt_test_uniform(r, 0, (double)V));
    count += tv[i] >= 0;
  }
  float dscale = 1024.0f;
  nt_tensor x = memops_tensor(ctx, dt, 2, ls, xv), t = memops_ints(ctx, 1, ts, tv);
  nt_tensor loss = memops_tensor(ctx, NT_F32, 1, ts, NULL), dx = memops_tensor(ctx, dt, 2, ls, NULL);
  double *lr = malloc((size_t)N * sizeof(double)), *gr = malloc((size_t)n * sizeof(double));
  ref_ce(xv, tv, N, V, dscale / (double)count, lr, gr);
  /* about twice the measured (docs/tolerances.md) */
  double gtol = dt == NT_F32 ? 6e-8 : dt == NT_F16 ? 6e-4 : 6e-3;

  CHECK_OK(ctx, nt_cross_entropy_forward(ctx, &x, &t, &loss));
  float *lv = memops_values(ctx, &loss);
  CHECK(memops_rel_err_fd(lv, lr, N) < 1e-5, "%s %lldx%lld range %g: loss err %g",
        nt_dtype_name(dt), (long long)N, (long long)V, (double)range, memops_rel_err_fd(lv, lr, N));
  CHECK(lv[3] == 0.0f, "ignored row has loss 0");
  free(lv);

  CHECK_OK(ctx, nt_cross_entropy_backward(ctx, &x, &t, &dscale, count, &dx));
  float *gv = memops_values(ctx, &dx);
  CHECK(nt_test_note(dt, memops_rel_err_fd(gv, gr, n)) < gtol, "%s backward err %g", nt_dtype_name(dt),
        memops_rel_err_fd(gv, gr, n));
  free(gv);

  /* Fused, in place: dlogits aliases logits. */
  CHECK_OK(ctx, nt_tensor_zero(ctx, &loss));
  CHECK_OK(ctx, nt_cross_entropy_fused(ctx, &x, &t, &dscale, count, &loss, &x));
  lv = memops_values(ctx, &loss);
  gv = memops_values(ctx, &x);
  CHECK(memops_rel_err_fd(lv, lr, N) < 1e-5, "fused in place: loss err %g", memops_rel_err_fd(lv, lr, N));
  CHECK(nt_test_note(dt, memops_rel_err_fd(gv, gr, n)) < gtol, "fused in place: grad err %g", memops_rel_err_fd(gv, gr, n));
  int zero_row = 1;
  for (int64_t c = 0; c < V; c++) zero_row &= gv[3 * V + c] == 0.0f;
  CHECK(zero_row, "ignored row has zero gradient");
  free(lv); free(gv); free(lr); free(gr); free(xv); free(tv);
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &t); nt_tensor_free(ctx, &loss); nt_tensor_free(ctx, &dx);
}

typedef struct {
  nt_ctx *ctx;
  float *x;
  int32_t *t;
  int64_t N, V, count;
} ce_state;

/* The mean loss over counted rows. */
static double ce_loss(void *sp) {
  ce_state *s = sp;
  int64_t ls[2] = {s->N, s->V}, ts[1] = {s->N};
  float loss[16];
  nt_tensor x = nt_tensor_view(s->x, NT_F32, nt_cpu(), 2, ls), t = nt_tensor_view(s->t, NT_I32, nt_cpu(), 1, ts);
  nt_tensor l = nt_tensor_view(loss, NT_F32, nt_cpu(), 1, ts);
  nt_cross_entropy_forward(s->ctx, &x, &t, &l);
  double sum = 0;
  for (int64_t i = 0; i < s->N; i++) sum += loss[i];
  return sum / (double)s->count;
}

static void test_fd(nt_ctx *ctx, nt_test_rng *r) {
  int64_t N = 5, V = 11, n = N * V, ls[2] = {N, V}, ts[1] = {N};
  float *x = memops_random(r, n, -3.0f, 3.0f), *g = calloc((size_t)n, sizeof(float));
  int32_t t[5] = {0, 10, -1, 4, 7};
  nt_tensor xt = nt_tensor_view(x, NT_F32, nt_cpu(), 2, ls), tt = nt_tensor_view(t, NT_I32, nt_cpu(), 1, ts);
  nt_tensor gt = nt_tensor_view(g, NT_F32, nt_cpu(), 2, ls);
  CHECK_OK(ctx, nt_cross_entropy_backward(ctx, &xt, &tt, NULL, 4, &gt));
  double num[55];
  ce_state s = {ctx, x, t, N, V, 4};
  memops_fd(ce_loss, &s, x, n, 1e-3f, num);
  CHECK(memops_rel_err_fd(g, num, n) < 1e-3, "dlogits vs finite differences %g",
        memops_rel_err_fd(g, num, n));
  free(x);
  free(g);
}

/* Row-padded logits: the same losses and gradients as contiguous ones (bitwise: the same
 * code), the padding untouched; a view without unit stride along V is refused. */
static void test_padded_rows(nt_ctx *ctx, nt_test_rng *r) {
  enum { N = 9, V = 65, LD = 72 };
  int64_t ls[2] = {N, V}, ps[2] = {N, LD}, ts[1] = {N};
  float *xv = memops_random(r, N * V, -4, 4), xp[N * LD];
  int32_t tv[N];
  for (int64_t i = 0; i < N; i++) {
    tv[i] = (int32_t)nt_test_uniform(r, 0, V);
    for (int64_t c = 0; c < LD; c++) xp[i * LD + c] = c < V ? xv[i * V + c] : 7.0f;
  }
  nt_tensor x = memops_tensor(ctx, NT_F32, 2, ls, xv), xpad = memops_tensor(ctx, NT_F32, 2, ps, xp);
  nt_tensor t = memops_ints(ctx, 1, ts, tv);
  nt_tensor l1 = memops_tensor(ctx, NT_F32, 1, ts, NULL), l2 = memops_tensor(ctx, NT_F32, 1, ts, NULL);
  nt_tensor view = xpad;
  view.shape[1] = V;
  if (CHECK_OK(ctx, nt_cross_entropy_fused(ctx, &x, &t, NULL, N, &l1, &x)) &&
      CHECK_OK(ctx, nt_cross_entropy_fused(ctx, &view, &t, NULL, N, &l2, &view))) {
    const float *a = x.data, *b = xpad.data;
    int same = !memcmp(l1.data, l2.data, N * sizeof(float)), kept = 1;
    for (int64_t i = 0; i < N; i++)
      for (int64_t c = 0; c < LD; c++) {
        if (c < V) same &= a[i * V + c] == b[i * LD + c];
        else kept &= b[i * LD + c] == 7.0f;
      }
    CHECK(same, "padded rows give the contiguous results");
    CHECK(kept, "the padding is not written");
  }
  nt_tensor bad = xpad;
  bad.shape[0] = V; bad.shape[1] = N; bad.stride[0] = 1; bad.stride[1] = LD;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_cross_entropy_forward(ctx, &bad, &t, &l1));
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &xpad); nt_tensor_free(ctx, &t);
  nt_tensor_free(ctx, &l1); nt_tensor_free(ctx, &l2);
  free(xv);
}

static void test_errors(nt_ctx *ctx) {
  int64_t ls[2] = {3, 5}, ts[1] = {3}, t2[1] = {2};
  int32_t bad[3] = {0, 5, 1}, neg[3] = {0, -2, 1}, ok[3] = {0, 1, 2};
  nt_tensor x = memops_tensor(ctx, NT_F32, 2, ls, NULL), l = memops_tensor(ctx, NT_F32, 1, ts, NULL);
  nt_tensor tb = memops_ints(ctx, 1, ts, bad), tn = memops_ints(ctx, 1, ts, neg), to = memops_ints(ctx, 1, ts, ok);
  nt_tensor tf = memops_tensor(ctx, NT_F32, 1, ts, NULL), l2 = memops_tensor(ctx, NT_F32, 1, t2, NULL);
  nt_tensor dh = memops_tensor(ctx, NT_F16, 2, ls, NULL);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_cross_entropy_forward(ctx, &x, &tb, &l));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_cross_entropy_forward(ctx, &x, &tn, &l));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_cross_entropy_forward(ctx, &x, &tf, &l));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_cross_entropy_forward(ctx, &x, &to, &l2));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_cross_entropy_backward(ctx, &x, &to, NULL, 0, &x));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_cross_entropy_backward(ctx, &x, &to, NULL, 3, &dh));
  nt_tensor_free(ctx, &x); nt_tensor_free(ctx, &l); nt_tensor_free(ctx, &tb); nt_tensor_free(ctx, &tn);
  nt_tensor_free(ctx, &to); nt_tensor_free(ctx, &tf); nt_tensor_free(ctx, &l2); nt_tensor_free(ctx, &dh);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {5};
  for (int d = 0; d < 3; d++) {
    test_values(ctx, &r, memops_float_dtypes[d], 37, 383, 4.0f);
    test_values(ctx, &r, memops_float_dtypes[d], 16, 65, 4.0f);
  }
  test_values(ctx, &r, NT_F16, 13, 1001, 60000.0f); /* logits near fp16's limit */
  test_fd(ctx, &r);
  test_padded_rows(ctx, &r);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
