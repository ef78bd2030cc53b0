/* The GPT on the CPU: whole-model gradients against finite differences (every parameter
 * tensor, along a random direction), gradients accumulate, GPT-2 init statistics, parameter
 * count and layout, dropout determinism, evaluation at smaller sizes, bf16 close to fp32,
 * and clear errors for bad configs and inputs. */
#include "tests/model_testutil.h"
#include "models/gpt.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static nt_gpt_config tiny(void) {
  nt_gpt_config c = {2, 2, 16, 8, 11, 0.0f, 0};
  return c;
}

static void fill_tokens(nt_test_rng *r, int32_t *x, int n, int vocab) {
  for (int i = 0; i < n; i++) x[i] = (int32_t)nt_test_uniform(r, 0, vocab - 1e-9);
}

/* Random inputs and targets in xs and ys, viewed as [B, T] tensors x and y. */
static void token_batch(nt_test_rng *r, int vocab, int64_t B, int64_t T, int32_t *xs,
                        int32_t *ys, nt_tensor *x, nt_tensor *y) {
  fill_tokens(r, xs, (int)(B * T), vocab);
  fill_tokens(r, ys, (int)(B * T), vocab);
  int64_t sh[2] = {B, T};
  *x = nt_tensor_view(xs, NT_I32, nt_cpu(), 2, sh);
  *y = nt_tensor_view(ys, NT_I32, nt_cpu(), 2, sh);
}

static double loss_of(nt_ctx *ctx, nt_gpt *g, const nt_tensor *x, const nt_tensor *y) {
  float l = NAN;
  if (nt_gpt_eval_loss(ctx, g, x, y)) return NAN;
  memcpy(&l, nt_gpt_loss(g)->data, sizeof l);
  return l;
}

typedef struct {
  nt_ctx *ctx;
  nt_gpt *g;
  const nt_tensor *x, *y;
} gpt_batch;

static double gpt_loss(void *arg) {
  gpt_batch *b = arg;
  return loss_of(b->ctx, b->g, b->x, b->y);
}

/* head_rows: the head's rows at once (10 of 21: groups of 10, 10 and 1). */
static void test_gradcheck(nt_ctx *ctx, int vocab, int head_rows) {
  nt_gpt_config c = tiny();
  c.vocab_size = vocab;
  c.head_rows = head_rows;
  enum { B = 3, T = 7 };
  nt_gpt *g = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, T, &g))) return;
  nt_params *p = nt_gpt_params(g);
  CHECK_OK(ctx, nt_params_init(ctx, p, 42));
  nt_test_rng r = {7};
  int32_t xs[B * T], ys[B * T];
  nt_tensor x, y;
  token_batch(&r, c.vocab_size, B, T, xs, ys, &x, &y);
  CHECK_OK(ctx, nt_params_zero_grad(ctx, p));
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
  float l0;
  memcpy(&l0, nt_gpt_loss(g)->data, sizeof l0);
  CHECK(fabs(l0 - log((double)vocab)) < 0.2, "initial loss %g should be near ln(%d) = %g", l0,
        vocab, log((double)vocab));
  int Vp = nt_gpt_padded_vocab(&c);
  CHECK(Vp == (vocab >= 1024 ? (vocab + 63) / 64 * 64 : vocab), "padded vocab %d", Vp);
  if (Vp != vocab) {
    /* the padded rows of the tied embedding never get a gradient */
    float *gw = p->units[0].grad.data;
    double pad = 0;
    for (int64_t k = (int64_t)vocab * c.n_embd; k < (int64_t)Vp * c.n_embd; k++) pad += fabs(gw[k]);
    CHECK(pad == 0.0, "padded wte rows have zero gradient (%g)", pad);
  }
  gpt_batch b = {ctx, g, &x, &y};
  double worst;
  int checked = nt_test_gradcheck_params(p, &r, 1e-3, 3e-2, gpt_loss, &b, &worst);
  printf("  gradcheck (vocab %d, head rows %lld): %d parameter tensors, worst relative error "
         "%.3g\n", vocab, (long long)nt_gpt_head_rows(g), checked, worst);
  CHECK(checked == 2 + 12 * 2 + 2, "checked %d tensors", checked);
  /* gradients accumulate: a second step without zeroing doubles them */
  nt_tensor g0 = p->units[1].grad;
  int64_t n = nt_tensor_numel(&g0);
  float *before = malloc((size_t)n * sizeof *before);
  memcpy(before, g0.data, (size_t)n * sizeof *before);
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
  double e = nt_test_scaled_rel_err(g0.data, before, n, 2.0);
  CHECK(e < 1e-5, "second backward adds: rel err %g", e);
  /* a loss scale multiplies the gradients */
  float scale = 8.0f;
  CHECK_OK(ctx, nt_params_zero_grad(ctx, p));
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, &scale, NULL));
  e = nt_test_scaled_rel_err(g0.data, before, n, 8.0);
  CHECK(e < 1e-5, "loss scale 8 scales the grads: rel err %g", e);
  free(before);
  nt_gpt_free(ctx, g);
}

/* The head in groups of rows (head_rows) against the whole batch at once: the same losses,
 * the same gradients up to the order of the tied embedding's sums; the rows used; logits of
 * more rows than a group are refused; the automatic choice halves the rows of large logits. */
static void test_head_rows(nt_ctx *ctx) {
  enum { B = 3, T = 7, N = B * T };
  const int asked[] = {0, 10, 7, 3, 100}, used[] = {N, 10, 7, 7, N};
  nt_test_rng r = {11};
  int32_t xs[N], ys[N];
  nt_tensor x, y;
  nt_gpt_config c = tiny();
  token_batch(&r, c.vocab_size, B, T, xs, ys, &x, &y);
  nt_gpt *whole = NULL;
  float lw = 0, lg = 0;
  for (int i = 0; i < 5; i++) {
    c.head_rows = asked[i];
    nt_gpt *g = NULL;
    if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, T, &g))) break;
    CHECK(nt_gpt_head_rows(g) == used[i], "head_rows %d: %lld rows at once, expected %d",
          asked[i], (long long)nt_gpt_head_rows(g), used[i]);
    nt_params *p = nt_gpt_params(g);
    CHECK_OK(ctx, nt_params_init(ctx, p, 5));
    CHECK_OK(ctx, nt_params_zero_grad(ctx, p));
    CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
    memcpy(&lg, nt_gpt_loss(g)->data, sizeof lg);
    double ev = loss_of(ctx, g, &x, &y);
    if (!whole) {
      whole = g;
      lw = lg;
      continue;
    }
    CHECK(lg == lw && ev == lg, "head_rows %d: train loss %.9g, eval %.9g, whole batch %.9g",
          asked[i], lg, ev, lw);
    nt_params *pw = nt_gpt_params(whole);
    double worst = 0;
    for (int u = 0; u < p->n_units; u++) {
      double e = nt_test_rel_err(p->units[u].grad.data, pw->units[u].grad.data,
                                 nt_tensor_numel(&p->units[u].grad));
      if (e > worst) worst = e;
    }
    printf("  head_rows %d: %lld rows at once, losses equal, gradients' worst rel err %.3g\n",
           asked[i], (long long)nt_gpt_head_rows(g), worst);
    CHECK(worst < 2e-7, "head_rows %d: gradients within 2e-7 of the whole batch's (%g)",
          asked[i], worst);
    nt_tensor logits;
    nt_status st = nt_gpt_logits(ctx, g, &x, &logits);
    if (nt_gpt_head_rows(g) < N) {
      CHECK(st == NT_ERR_SHAPE, "logits of %d rows with %lld at once: a shape error", N,
            (long long)nt_gpt_head_rows(g));
      int64_t one[2] = {1, T};
      nt_tensor x1 = nt_tensor_view(xs, NT_I32, nt_cpu(), 2, one);
      CHECK_OK(ctx, nt_gpt_logits(ctx, g, &x1, &logits));
    } else {
      CHECK_OK(ctx, st);
    }
    nt_gpt_free(ctx, g);
  }
  nt_gpt_free(ctx, whole);
  c.head_rows = -1;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gpt_create(ctx, &c, NT_F32, B, T, &whole));
  /* automatic: GPT-2's vocabulary at 16 x 1024 in fp32 (3.1 GiB of logits) is halved to 4096
   * rows (786 MiB, at most NT_GPT_HEAD_BYTES) */
  nt_gpt_config g2 = {1, 1, 8, 1024, 50257, 0.0f, 0};
  nt_model_sizes a, w;
  CHECK_OK(ctx, nt_gpt_estimate(ctx, &g2, NT_F32, 16, 1024, &a));
  g2.head_rows = 16 * 1024;
  CHECK_OK(ctx, nt_gpt_estimate(ctx, &g2, NT_F32, 16, 1024, &w));
  CHECK(w.activation_bytes - a.activation_bytes == (size_t)(16 * 1024 - 4096) * 50304 * 4,
        "automatic head rows: %zu fewer activation bytes", w.activation_bytes - a.activation_bytes);
}

static void test_init_and_layout(nt_ctx *ctx) {
  nt_gpt_config c = {4, 4, 64, 32, 65, 0.0f, 0};
  nt_gpt *g = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, 2, 32, &g))) return;
  nt_params *p = nt_gpt_params(g);
  CHECK_OK(ctx, nt_params_init(ctx, p, 1));
  int64_t C = 64, L = 4, V = 65, T = 32;
  int64_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  CHECK(p->n_real == expect, "parameter count %lld, expected %lld", (long long)p->n_real,
        (long long)expect);
  CHECK(nt_gpt_num_params(g, true) == expect - T * C, "non-embedding count");
  CHECK(p->n_units == L + 2, "units: embeddings, %lld blocks, ln_f", (long long)L);
  int u, i;
  CHECK(nt_params_find(p, "transformer.h.3.attn.c_proj.weight", &u, &i), "find c_proj");
  nt_tensor w = nt_params_view(p, u, i, NT_VIEW_MASTER);
  double s = 0, s2 = 0;
  int64_t n = nt_tensor_numel(&w);
  for (int64_t k = 0; k < n; k++) {
    s += ((float *)w.data)[k];
    s2 += (double)((float *)w.data)[k] * ((float *)w.data)[k];
  }
  double std = sqrt(s2 / n - (s / n) * (s / n)), want = 0.02 / sqrt(2.0 * L);
  CHECK(fabs(std - want) < 0.1 * want, "c_proj std %g, expected %g", std, want);
  CHECK(p->units[u].params[i].decay, "2-D weights decay");
  CHECK(nt_params_find(p, "transformer.h.0.mlp.c_fc.weight", &u, &i), "find c_fc");
  w = nt_params_view(p, u, i, NT_VIEW_MASTER);
  s = s2 = 0;
  n = nt_tensor_numel(&w);
  for (int64_t k = 0; k < n; k++) s2 += (double)((float *)w.data)[k] * ((float *)w.data)[k];
  CHECK(fabs(sqrt(s2 / n) - 0.02) < 0.002, "c_fc std %g, expected 0.02", sqrt(s2 / n));
  CHECK(nt_params_find(p, "transformer.h.1.ln_2.weight", &u, &i), "find ln_2");
  w = nt_params_view(p, u, i, NT_VIEW_MASTER);
  CHECK(((float *)w.data)[0] == 1.0f && ((float *)w.data)[63] == 1.0f, "LN weight 1");
  CHECK(!p->units[u].params[i].decay, "LN weights do not decay");
  CHECK(p->units[u].params[i].offset >= p->units[u].n_decay, "no-decay after decay range");
  CHECK(nt_params_find(p, "transformer.h.1.attn.c_attn.bias", &u, &i), "find bias");
  w = nt_params_view(p, u, i, NT_VIEW_MASTER);
  CHECK(((float *)w.data)[0] == 0.0f && ((float *)w.data)[191] == 0.0f, "biases 0");
  for (int k = 0; k < p->n_units; k++)
    for (int j = 0; j < p->units[k].n_params; j++)
      CHECK(p->units[k].params[j].offset % NT_PARAM_ALIGN == 0, "offset aligned");
  /* the same seed gives the same weights; another seed others */
  nt_gpt *g2 = NULL;
  CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, 2, 32, &g2));
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(g2), 1));
  nt_tensor a = p->units[2].master, b = nt_gpt_params(g2)->units[2].master;
  CHECK(!memcmp(a.data, b.data, nt_tensor_nbytes(&a)), "init is deterministic");
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(g2), 2));
  CHECK(memcmp(a.data, b.data, nt_tensor_nbytes(&a)), "another seed differs");
  /* the estimate without allocation agrees with the real model */
  nt_model_sizes sz;
  CHECK_OK(ctx, nt_gpt_estimate(ctx, &c, NT_F32, 2, 32, &sz));
  CHECK(sz.n_params == p->n_real && sz.activation_bytes == nt_gpt_activation_bytes(g),
        "estimate %lld params %zu bytes", (long long)sz.n_params, sz.activation_bytes);
  /* What a block saves (ln1, q, k, v, att, ym, x1, ln2, fc_pre, its GELU output act, x2:
   * 18 C per token) plus the model's buffers (x0, lnf, logits) and scratch (3 C, and 4 C
   * shared by the forward and the two backward branches), each rounded up to 256 bytes. */
  {
    size_t N = 2 * 32, es = 4, H = 4;
    size_t bound = es * (N * C * (18 * L + 2 + 3 + 4) + N * V) +
                   4 * (N * (4 * L + 2 + 1) + L * 2 * H * T + 1) + 256 * (17 * L + 20);
    CHECK(nt_gpt_activation_bytes(g) <= bound, "activations %zu bytes, at most %zu",
          nt_gpt_activation_bytes(g), bound);
  }
  nt_gpt_free(ctx, g2);
  nt_gpt_free(ctx, g);
}

static void test_dropout_and_sizes(nt_ctx *ctx) {
  nt_gpt_config c = tiny();
  c.dropout = 0.3f;
  enum { B = 2, T = 8 };
  nt_gpt *g = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, T, &g))) return;
  nt_params *p = nt_gpt_params(g);
  CHECK_OK(ctx, nt_params_init(ctx, p, 3));
  nt_test_rng r = {11};
  int32_t xs[B * T], ys[B * T];
  nt_tensor x, y;
  token_batch(&r, c.vocab_size, B, T, xs, ys, &x, &y);
  nt_ctx_manual_seed(ctx, 5);
  nt_ctx_set_rng_offset(ctx, 0);
  float l1, l2, l3, le1, le2;
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
  memcpy(&l1, nt_gpt_loss(g)->data, 4);
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
  memcpy(&l2, nt_gpt_loss(g)->data, 4);
  nt_ctx_set_rng_offset(ctx, 0);
  CHECK_OK(ctx, nt_gpt_train_step(ctx, g, &x, &y, NULL, NULL));
  memcpy(&l3, nt_gpt_loss(g)->data, 4);
  CHECK(l1 != l2, "dropout draws new masks each step (%g vs %g)", l1, l2);
  CHECK(l1 == l3, "the same RNG offset gives the same loss (%g vs %g)", l1, l3);
  CHECK(nt_ctx_rng_offset(ctx) > 0, "training consumes random numbers");
  uint64_t off = nt_ctx_rng_offset(ctx);
  le1 = (float)loss_of(ctx, g, &x, &y);
  le2 = (float)loss_of(ctx, g, &x, &y);
  CHECK(le1 == le2 && nt_ctx_rng_offset(ctx) == off, "evaluation is deterministic, no RNG");
  /* a smaller batch / shorter sequence: the first row's logits are causal, so a prefix of
   * row 0 gives the same logits as the full row's first positions */
  nt_tensor logits;
  CHECK_OK(ctx, nt_gpt_logits(ctx, g, &x, &logits));
  float full[5 * 11];
  memcpy(full, logits.data, sizeof full);
  int64_t sh2[2] = {1, 5};
  nt_tensor x2 = nt_tensor_view(xs, NT_I32, nt_cpu(), 2, sh2);
  CHECK_OK(ctx, nt_gpt_logits(ctx, g, &x2, &logits));
  CHECK(logits.shape[0] == 5 && logits.shape[1] == 11, "logits [5, 11]");
  CHECK(nt_test_rel_err(logits.data, full, 5 * 11) < 1e-6, "prefix logits match (%g)",
        nt_test_rel_err(logits.data, full, 5 * 11));
  /* errors */
  int64_t big[2] = {B, T + 1};
  int32_t xb[B * (T + 1)];
  memset(xb, 0, sizeof xb);
  nt_tensor xl = nt_tensor_view(xb, NT_I32, nt_cpu(), 2, big);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gpt_logits(ctx, g, &xl, &logits));
  xs[3] = 11;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gpt_logits(ctx, g, &x, &logits));
  nt_gpt_free(ctx, g);
  nt_gpt_config bad = tiny();
  bad.n_head = 3;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gpt_create(ctx, &bad, NT_F32, 1, 4, &g));
  bad = tiny();
  bad.dropout = 1.0f;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gpt_create(ctx, &bad, NT_F32, 1, 4, &g));
  bad = tiny();
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gpt_create(ctx, &bad, NT_F32, 1, 9, &g));
}

static void test_bf16_close_to_fp32(nt_ctx *ctx) {
  nt_gpt_config c = {2, 2, 32, 16, 13, 0.0f, 0};
  enum { B = 2, T = 16 };
  nt_gpt *a = NULL, *b = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, T, &a))) return;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_BF16, B, T, &b))) return;
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(a), 9));
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(b), 9));
  nt_test_rng r = {3};
  int32_t xs[B * T], ys[B * T];
  nt_tensor x, y;
  token_batch(&r, c.vocab_size, B, T, xs, ys, &x, &y);
  double la = loss_of(ctx, a, &x, &y), lb = loss_of(ctx, b, &x, &y);
  /* bounds: about twice the measured gaps (docs/tolerances.md) */
  CHECK(fabs(la - lb) < 1.1e-4 * fabs(la), "bf16 loss %g vs fp32 %g", lb, la);
  double worst = 0;
  CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(a)));
  CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(b)));
  CHECK_OK(ctx, nt_gpt_train_step(ctx, a, &x, &y, NULL, NULL));
  CHECK_OK(ctx, nt_gpt_train_step(ctx, b, &x, &y, NULL, NULL));
  for (int u = 0; u < nt_gpt_params(a)->n_units; u++) {
    nt_tensor ga = nt_gpt_params(a)->units[u].grad, gb = nt_gpt_params(b)->units[u].grad;
    double e = nt_test_rel_err(gb.data, ga.data, nt_tensor_numel(&ga));
    CHECK(e < 1e-2, "unit %d: bf16 gradients within 1%% of fp32 (%g)", u, e);
    if (e > worst) worst = e;
  }
  printf("  bf16 vs fp32: loss rel diff %.3g (bound 1.1e-4), worst unit gradient rel err %.3g "
         "(bound 1e-2)\n", fabs(la - lb) / fabs(la), worst);
  nt_gpt_free(ctx, a);
  nt_gpt_free(ctx, b);
}

/* FP8 linear layers (emulated on the CPU: the same quantization, fp32 GEMMs): the loss and
 * gradients stay close to fp32's, and the delayed scales move off 1 after the first step. */
static void test_fp8_emulated(nt_ctx *ctx) {
  nt_gpt_config c = {2, 2, 32, 16, 13, 0.0f, 0};
  enum { B = 2, T = 16 };
  nt_gpt *a = NULL, *b = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, T, &a))) return;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_BF16, B, T, &b))) return;
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(a), 9));
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(b), 9));
  CHECK_OK(ctx, nt_gpt_enable_fp8(ctx, b, true));
  nt_test_rng r = {5};
  int32_t xs[B * T], ys[B * T];
  nt_tensor x, y;
  token_batch(&r, c.vocab_size, B, T, xs, ys, &x, &y);
  for (int step = 0; step < 2; step++) {
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(a)));
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(b)));
    CHECK_OK(ctx, nt_gpt_train_step(ctx, a, &x, &y, NULL, NULL));
    CHECK_OK(ctx, nt_gpt_train_step(ctx, b, &x, &y, NULL, NULL));
    float la, lb;
    memcpy(&la, nt_gpt_loss(a)->data, 4);
    memcpy(&lb, nt_gpt_loss(b)->data, 4);
    CHECK(fabsf(la - lb) < 2e-4f * la, "step %d: fp8 loss %g vs fp32 %g", step, lb, la);
    double worst = 0;
    for (int u = 0; u < nt_gpt_params(a)->n_units; u++) {
      nt_tensor ga = nt_gpt_params(a)->units[u].grad, gb = nt_gpt_params(b)->units[u].grad;
      double e = nt_test_rel_err(gb.data, ga.data, nt_tensor_numel(&ga));
      if (e > worst) worst = e;
    }
    printf("  fp8 (emulated) step %d: loss %.5f vs fp32 %.5f (rel %.3g, bound 2e-4), worst unit "
           "gradient rel err %.3g (bound 0.13)\n", step, lb, la, fabsf(la - lb) / la, worst);
    CHECK(worst < 0.13, "step %d: fp8 gradients within 13%% of fp32 (%g)", step, worst);
  }
  nt_gpt_free(ctx, a);
  nt_gpt_free(ctx, b);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_gradcheck(ctx, 11, 0);
  test_gradcheck(ctx, 1030, 0);   /* padded to 1088 for the head's GEMMs */
  test_gradcheck(ctx, 1030, 10);
  test_head_rows(ctx);
  test_init_and_layout(ctx);
  test_dropout_and_sizes(ctx);
  test_bf16_close_to_fp32(ctx);
  test_fp8_emulated(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
