/* The CNN on the CPU: whole-model gradients against finite differences (every parameter
 * tensor along a random direction), accumulation, torch-style init bounds, layout, the 16-bit
 * paths close to fp32 (conv weight gradients through the compute-dtype scratch), dropout, and
 * clear errors. */
#include "tests/model_testutil.h"
#include "models/cnn.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static nt_cnn_config tiny(void) {
  /* odd widths on purpose; 8x12 images -> 4x6 -> 2x3 */
  nt_cnn_config c = {1, 8, 12, 3, 5, 7, 4, 0.0f};
  return c;
}

static double loss_of(nt_ctx *ctx, nt_cnn *m, const nt_tensor *x, const nt_tensor *y) {
  float l = NAN;
  if (nt_cnn_eval(ctx, m, x, y, NULL)) return NAN;
  memcpy(&l, nt_cnn_loss(m)->data, sizeof l);
  return l;
}

typedef struct {
  nt_ctx *ctx;
  nt_cnn *m;
  const nt_tensor *x, *y;
} cnn_batch;

static double cnn_loss(void *arg) {
  cnn_batch *b = arg;
  return loss_of(b->ctx, b->m, b->x, b->y);
}

static void test_gradcheck(nt_ctx *ctx) {
  nt_cnn_config c = tiny();
  enum { N = 3 };
  nt_cnn *m = NULL;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, N, &m))) return;
  nt_params *p = nt_cnn_params(m);
  CHECK_OK(ctx, nt_params_init(ctx, p, 5));
  nt_test_rng r = {21};
  float xs[N * 8 * 12];
  int32_t ys[N] = {0, 3, 1};
  nt_test_fill_uniform(&r, xs, N * 8 * 12, -1.5f, 1.5f);
  int64_t xsh[4] = {N, 1, 8, 12}, ysh[1] = {N};
  nt_tensor x = nt_tensor_view(xs, NT_F32, nt_cpu(), 4, xsh);
  nt_tensor y = nt_tensor_view(ys, NT_I32, nt_cpu(), 1, ysh);
  CHECK_OK(ctx, nt_params_zero_grad(ctx, p));
  CHECK_OK(ctx, nt_cnn_train_step(ctx, m, &x, &y, NULL, NULL));
  /* small steps: ReLU and max-pool kinks must not be crossed (at 1e-3 some are, and the
   * quotient then disagrees by 5-70%; it converges as the step shrinks) */
  cnn_batch b = {ctx, m, &x, &y};
  double worst;
  int checked = nt_test_gradcheck_params(p, &r, 1e-4, 5e-2, cnn_loss, &b, &worst);
  printf("  gradcheck: %d parameter tensors, worst relative error %.3g\n", checked, worst);
  CHECK(checked == 12, "checked %d tensors", checked);
  /* accumulation */
  nt_tensor g0 = p->units[0].grad;
  int64_t n = nt_tensor_numel(&g0);
  float *before = malloc((size_t)n * sizeof *before);
  memcpy(before, g0.data, (size_t)n * sizeof *before);
  CHECK_OK(ctx, nt_cnn_train_step(ctx, m, &x, &y, NULL, NULL));
  double e = nt_test_scaled_rel_err(g0.data, before, n, 2.0);
  CHECK(e < 1e-5, "gradients accumulate: rel err %g", e);
  free(before);
  /* errors */
  int64_t bad[4] = {N, 1, 8, 8};
  nt_tensor xb = nt_tensor_view(xs, NT_F32, nt_cpu(), 4, bad);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_cnn_train_step(ctx, m, &xb, &y, NULL, NULL));
  int64_t big[4] = {N + 1, 1, 8, 12};
  xb = nt_tensor_view(xs, NT_F32, nt_cpu(), 4, big);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_cnn_eval(ctx, m, &xb, NULL, NULL));
  uint16_t xh[N * 8 * 12];
  nt_tensor x16 = nt_tensor_view(xh, NT_F16, nt_cpu(), 4, xsh);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_cnn_eval(ctx, m, &x16, NULL, NULL));
  nt_cnn_free(ctx, m);
  nt_cnn_config bc = tiny();
  bc.height = 10;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_cnn_create(ctx, &bc, NT_F32, 2, &m));
}

static void test_init_layout(nt_ctx *ctx) {
  nt_cnn_config c = nt_cnn_config_default();
  nt_cnn *m = NULL;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, 4, &m))) return;
  nt_params *p = nt_cnn_params(m);
  CHECK_OK(ctx, nt_params_init(ctx, p, 1));
  int64_t expect = 32 * 9 + 32 + 32 * 32 * 9 + 32 + 64 * 32 * 9 + 64 + 64 * 64 * 9 + 64 +
                   3136 * 256 + 256 + 256 * 10 + 10;
  CHECK(p->n_real == expect, "parameters %lld, expected %lld", (long long)p->n_real,
        (long long)expect);
  CHECK(p->n_units == 3, "units stage1, stage2, head");
  int u, i;
  CHECK(nt_params_find(p, "fc1.weight", &u, &i), "fc1.weight");
  nt_tensor w = nt_params_view(p, u, i, NT_VIEW_MASTER);
  CHECK(w.shape[0] == 256 && w.shape[1] == 3136, "fc1 is [256, 3136]");
  float bound = 1.0f / sqrtf(3136.0f), mx = 0;
  for (int64_t k = 0; k < nt_tensor_numel(&w); k++) mx = fmaxf(mx, fabsf(((float *)w.data)[k]));
  CHECK(mx <= bound && mx > 0.95f * bound, "fc1 init within +-1/sqrt(fan_in): max %g, bound %g",
        mx, bound);
  CHECK(nt_params_find(p, "conv2.bias", &u, &i), "conv2.bias");
  CHECK(!p->units[u].params[i].decay, "biases do not decay");
  nt_model_sizes sz;
  CHECK_OK(ctx, nt_cnn_estimate(ctx, &c, NT_F32, 4, &sz));
  CHECK(sz.n_params == expect && sz.activation_bytes == nt_cnn_activation_bytes(m),
        "estimate matches the built model");
  double f = nt_cnn_flops_per_image(m);
  CHECK(f > 6 * 18e6 && f < 6 * 20e6, "flops per image %g", f);
  nt_cnn_free(ctx, m);
}

/* tol: the loss's relative bound; grad_tol: each unit's (conv1, conv2, fc) gradient bound;
 * about twice the measured gaps (docs/tolerances.md) */
static void test_low_precision(nt_ctx *ctx, nt_dtype dt, bool fp8, double tol,
                               const double grad_tol[3]) {
  nt_cnn_config c = {1, 8, 8, 4, 6, 16, 5, 0.0f};
  enum { N = 4 };
  nt_cnn *a = NULL, *b = NULL;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, N, &a))) return;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, dt, N, &b))) return;
  CHECK_OK(ctx, nt_params_init(ctx, nt_cnn_params(a), 8));
  CHECK_OK(ctx, nt_params_init(ctx, nt_cnn_params(b), 8));
  if (fp8) CHECK_OK(ctx, nt_cnn_enable_fp8(ctx, b, true));
  nt_test_rng r = {4};
  float xs[N * 64];
  uint16_t xl[N * 64];
  nt_test_fill_uniform(&r, xs, N * 64, -1, 1);
  for (int i = 0; i < N * 64; i++) nt_store_f32(xl, dt, i, xs[i]);
  int32_t ys[N] = {4, 0, 2, 1};
  int64_t xsh[4] = {N, 1, 8, 8}, ysh[1] = {N};
  nt_tensor xa = nt_tensor_view(xs, NT_F32, nt_cpu(), 4, xsh);
  nt_tensor xb = nt_tensor_view(xl, dt, nt_cpu(), 4, xsh);
  nt_tensor y = nt_tensor_view(ys, NT_I32, nt_cpu(), 1, ysh);
  CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_cnn_params(a)));
  CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_cnn_params(b)));
  CHECK_OK(ctx, nt_cnn_train_step(ctx, a, &xa, &y, NULL, NULL));
  float scale = 1024.0f;
  CHECK_OK(ctx, nt_cnn_train_step(ctx, b, &xb, &y, &scale, NULL));
  float la, lb;
  memcpy(&la, nt_cnn_loss(a)->data, 4);
  memcpy(&lb, nt_cnn_loss(b)->data, 4);
  CHECK(fabsf(la - lb) < tol * fabsf(la), "%s loss %g vs fp32 %g", nt_dtype_name(dt), lb, la);
  printf("  %s%s vs fp32: loss rel diff %.3g (bound %g)\n", nt_dtype_name(dt), fp8 ? "+fp8" : "",
         fabsf(la - lb) / fabsf(la), tol);
  for (int u = 0; u < 3; u++) {
    nt_tensor ga = nt_cnn_params(a)->units[u].grad, gb = nt_cnn_params(b)->units[u].grad;
    int64_t n = nt_tensor_numel(&ga);
    float *gs = malloc((size_t)n * sizeof *gs);
    for (int64_t k = 0; k < n; k++) gs[k] = ((float *)gb.data)[k] / scale;
    double e = nt_test_rel_err(gs, ga.data, n);
    /* FP8 (E5M2) output gradients of fc1 reach the conv stack: its weight gradients, sums of
     * many cancelling terms, keep the direction but lose digits */
    double lim = grad_tol[u];
    double dot = 0, na = 0, nb = 0;
    for (int64_t k = 0; k < n; k++) {
      double a = ((float *)ga.data)[k];
      dot += a * gs[k];
      na += a * a;
      nb += (double)gs[k] * gs[k];
    }
    double cosine = dot / sqrt(na * nb + 1e-300);
    printf("  %s%s unit %d: gradient rel err %.3g (bound %g), cosine %.4f\n", nt_dtype_name(dt),
           fp8 ? "+fp8" : "", u, e, lim, cosine);
    CHECK(e < lim && cosine > 0.9, "%s%s unit %d: gradients (unscaled) within %g of fp32: %g "
          "(cosine %g)", nt_dtype_name(dt), fp8 ? "+fp8" : "", u, lim, e, cosine);
    free(gs);
  }
  nt_cnn_free(ctx, a);
  nt_cnn_free(ctx, b);
}

static void test_dropout(nt_ctx *ctx) {
  nt_cnn_config c = tiny();
  c.dropout = 0.5f;
  enum { N = 4 };
  nt_cnn *m = NULL;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, N, &m))) return;
  CHECK_OK(ctx, nt_params_init(ctx, nt_cnn_params(m), 2));
  nt_test_rng r = {8};
  float xs[N * 96];
  nt_test_fill_uniform(&r, xs, N * 96, -1, 1);
  int32_t ys[N] = {1, 2, 3, 0};
  int64_t xsh[4] = {N, 1, 8, 12}, ysh[1] = {N};
  nt_tensor x = nt_tensor_view(xs, NT_F32, nt_cpu(), 4, xsh);
  nt_tensor y = nt_tensor_view(ys, NT_I32, nt_cpu(), 1, ysh);
  float l1, l2, l3;
  nt_ctx_set_rng_offset(ctx, 0);
  CHECK_OK(ctx, nt_cnn_train_step(ctx, m, &x, &y, NULL, NULL));
  memcpy(&l1, nt_cnn_loss(m)->data, 4);
  CHECK_OK(ctx, nt_cnn_train_step(ctx, m, &x, &y, NULL, NULL));
  memcpy(&l2, nt_cnn_loss(m)->data, 4);
  nt_ctx_set_rng_offset(ctx, 0);
  CHECK_OK(ctx, nt_cnn_train_step(ctx, m, &x, &y, NULL, NULL));
  memcpy(&l3, nt_cnn_loss(m)->data, 4);
  CHECK(l1 != l2 && l1 == l3, "dropout masks: new per step, reproducible (%g %g %g)", l1, l2, l3);
  nt_cnn_free(ctx, m);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_gradcheck(ctx);
  test_init_layout(ctx);
  test_low_precision(ctx, NT_BF16, false, 1.3e-5, (const double[3]){0.2, 0.1, 1e-2});
  test_low_precision(ctx, NT_F16, false, 1.8e-5, (const double[3]){0.05, 0.025, 7e-4});
  /* fc layers in FP8 (emulated) */
  test_low_precision(ctx, NT_BF16, true, 4e-4, (const double[3]){0.6, 0.6, 0.3});
  test_dropout(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
