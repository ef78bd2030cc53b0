/* The RNG step base with the models and the trainer, on the CPU (no data needed):
 *  - a GPT (embedding, residual and attention-probability dropout) and a CNN (hidden-layer
 *    dropout) stepped inside nt_ctx_rng_step_begin/end give, bit for bit, the losses and
 *    gradients of the same steps run with absolute offsets (the semantics before the step
 *    base), and the offset advances by the same count;
 *  - the trainer (which brackets every step) ends a run of N steps with the RNG offset at
 *    N x the step's reservations, counted here from the GPT's shapes, and its losses differ
 *    from step to step with fixed weights only through fresh masks. */
#include "tests/testutil.h"
#include "train/train.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float read_loss(nt_ctx *ctx, const nt_tensor *t) {
  float l = NAN;
  nt_tensor h = nt_tensor_view(&l, NT_F32, nt_cpu(), 0, NULL);
  if (nt_tensor_copy(ctx, &h, t)) return NAN;
  return l;
}

static bool same_grads(nt_params *a, nt_params *b) {
  for (int u = 0; u < a->n_units; u++) {
    const nt_tensor *x = &a->units[u].grad, *y = &b->units[u].grad;
    size_t bytes = (size_t)nt_tensor_numel(x) * nt_dtype_size(x->dtype);
    if (memcmp(x->data, y->data, bytes)) return false;
  }
  return true;
}

/* Per step of the GPT's forward: the embedding's and every layer's two residual masks
 * (N * C each) and the attention probabilities (B * H * T * T bytes: a quarter as many
 * numbers, ops/attention.h), each rounded up to 4. */
static uint64_t gpt_step_numbers(const nt_gpt_config *c, int B, int T) {
  const uint64_t nc = ((uint64_t)B * T * c->n_embd + 3) & ~3ull;
  const uint64_t att = (((uint64_t)B * c->n_head * T * T + 3) / 4 + 3) & ~3ull;
  return nc + (uint64_t)c->n_layer * (2 * nc + att);
}

static void gpt_bracket_vs_absolute(nt_ctx *ctx) {
  nt_gpt_config c = {2, 2, 32, 16, 50, 0.2f, 0};
  enum { B = 3, T = 13, STEPS = 3 };
  nt_gpt *a = NULL, *b = NULL;
  if (!CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, 16, &a)) ||
      !CHECK_OK(ctx, nt_gpt_create(ctx, &c, NT_F32, B, 16, &b)))
    goto done;
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(a), 5));
  CHECK_OK(ctx, nt_params_init(ctx, nt_gpt_params(b), 5));
  nt_test_rng r = {3};
  int32_t x[B * T], y[B * T];
  for (int i = 0; i < B * T; i++) {
    x[i] = (int32_t)nt_test_uniform(&r, 0, c.vocab_size - 1e-9);
    y[i] = (int32_t)nt_test_uniform(&r, 0, c.vocab_size - 1e-9);
  }
  int64_t sh[2] = {B, T};
  nt_tensor tx = nt_tensor_view(x, NT_I32, nt_cpu(), 2, sh), ty = nt_tensor_view(y, NT_I32, nt_cpu(), 2, sh);
  const uint64_t start = 1002, base0 = 1004;   /* a step's base is rounded up to 4 */
  nt_ctx_set_rng_offset(ctx, start);
  float la[STEPS], lb[STEPS];
  uint64_t used[STEPS];
  for (int s = 0; s < STEPS; s++) {
    CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx));
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(a)));
    CHECK_OK(ctx, nt_gpt_train_step(ctx, a, &tx, &ty, NULL, NULL));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, &used[s]));
    la[s] = read_loss(ctx, nt_gpt_loss(a));
  }
  const uint64_t after_a = nt_ctx_rng_offset(ctx);
  nt_ctx_set_rng_offset(ctx, base0);
  for (int s = 0; s < STEPS; s++) {
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_gpt_params(b)));
    CHECK_OK(ctx, nt_gpt_train_step(ctx, b, &tx, &ty, NULL, NULL));
    lb[s] = read_loss(ctx, nt_gpt_loss(b));
  }
  const bool grads = same_grads(nt_gpt_params(a), nt_gpt_params(b));
  const uint64_t want = gpt_step_numbers(&c, B, T);
  int same = 0;
  for (int s = 0; s < STEPS; s++) same += memcmp(&la[s], &lb[s], sizeof(float)) == 0;
  printf("  gpt: step losses %.6f %.6f %.6f, %llu numbers per step\n", la[0], la[1], la[2],
         (unsigned long long)used[0]);
  CHECK(same == STEPS, "GPT: losses in steps equal the absolute-offset losses (%d of %d)", same,
        STEPS);
  CHECK(grads, "GPT: the last step's gradients are bit-identical");
  CHECK(used[0] == want && used[1] == want && used[2] == want,
        "GPT: every step reserves %llu numbers (%llu %llu %llu)", (unsigned long long)want,
        (unsigned long long)used[0], (unsigned long long)used[1], (unsigned long long)used[2]);
  CHECK(after_a == base0 + STEPS * want && nt_ctx_rng_offset(ctx) == after_a,
        "GPT: offset after the steps %llu, absolute run %llu", (unsigned long long)after_a,
        (unsigned long long)nt_ctx_rng_offset(ctx));
  CHECK(la[0] != la[1] && la[1] != la[2], "GPT: fixed weights, fresh masks: losses differ");
done:
  nt_gpt_free(ctx, a);
  nt_gpt_free(ctx, b);
}

static void cnn_bracket_vs_absolute(nt_ctx *ctx) {
  nt_cnn_config c = nt_cnn_config_default();
  c.c1 = 2;
  c.c2 = 4;
  c.hidden = 30;
  c.dropout = 0.3f;
  enum { N = 5, STEPS = 2 };
  nt_cnn *a = NULL, *b = NULL;
  float *img = NULL;
  if (!CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, N, &a)) ||
      !CHECK_OK(ctx, nt_cnn_create(ctx, &c, NT_F32, N, &b)))
    goto done;
  CHECK_OK(ctx, nt_params_init(ctx, nt_cnn_params(a), 9));
  CHECK_OK(ctx, nt_params_init(ctx, nt_cnn_params(b), 9));
  nt_test_rng r = {8};
  int64_t xs[4] = {N, 1, 28, 28}, ys[1] = {N};
  img = malloc(sizeof(float) * N * 28 * 28);
  nt_test_fill_uniform(&r, img, N * 28 * 28, -1, 2);
  int32_t y[N] = {1, 7, 3, 0, 9};
  nt_tensor tx = nt_tensor_view(img, NT_F32, nt_cpu(), 4, xs);
  nt_tensor ty = nt_tensor_view(y, NT_I32, nt_cpu(), 1, ys);
  nt_ctx_set_rng_offset(ctx, 64);
  float la[STEPS], lb[STEPS];
  uint64_t used = 0;
  for (int s = 0; s < STEPS; s++) {
    CHECK_OK(ctx, nt_ctx_rng_step_begin(ctx));
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_cnn_params(a)));
    CHECK_OK(ctx, nt_cnn_train_step(ctx, a, &tx, &ty, NULL, NULL));
    CHECK_OK(ctx, nt_ctx_rng_step_end(ctx, &used));
    la[s] = read_loss(ctx, nt_cnn_loss(a));
  }
  const uint64_t after_a = nt_ctx_rng_offset(ctx);
  nt_ctx_set_rng_offset(ctx, 64);
  for (int s = 0; s < STEPS; s++) {
    CHECK_OK(ctx, nt_params_zero_grad(ctx, nt_cnn_params(b)));
    CHECK_OK(ctx, nt_cnn_train_step(ctx, b, &tx, &ty, NULL, NULL));
    lb[s] = read_loss(ctx, nt_cnn_loss(b));
  }
  CHECK(memcmp(la, lb, sizeof la) == 0 && same_grads(nt_cnn_params(a), nt_cnn_params(b)),
        "CNN: losses %.7f %.7f and gradients in steps equal the absolute-offset ones (%.7f %.7f)",
        la[0], la[1], lb[0], lb[1]);
  const uint64_t want = ((uint64_t)N * c.hidden + 3) & ~3ull;
  CHECK(used == want && after_a == 64 + STEPS * used && nt_ctx_rng_offset(ctx) == after_a,
        "CNN: %llu numbers per step (want %llu), offset %llu", (unsigned long long)used,
        (unsigned long long)want, (unsigned long long)after_a);
done:
  free(img);
  nt_cnn_free(ctx, a);
  nt_cnn_free(ctx, b);
}

/* The trainer brackets every step: after N steps the offset is N x the step's count. */
static void trainer_offset(nt_ctx *ctx) {
  nt_train_options o = nt_train_defaults(NT_MODEL_GPT);
  o.gpt_data = "synthetic";
  o.gpt.n_layer = 2;
  o.gpt.n_head = 2;
  o.gpt.n_embd = 32;
  o.gpt.block_size = 16;
  o.gpt.vocab_size = 50;
  o.gpt.dropout = 0.2f;
  o.batch_size = 4;
  o.max_iters = 5;
  o.warmup_iters = 1;
  o.lr_decay_iters = 5;
  o.eval_interval = 0;
  o.log_interval = 0;
  o.quiet = true;
  o.record_losses = true;
  nt_train_result res;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &res))) return;
  const uint64_t want = 5 * gpt_step_numbers(&o.gpt, 4, 16);
  printf("  trainer: 5 steps, rng offset %llu (want %llu), losses %.5f .. %.5f\n",
         (unsigned long long)nt_ctx_rng_offset(ctx), (unsigned long long)want, res.losses[0],
         res.last_loss);
  CHECK(nt_ctx_rng_offset(ctx) == want, "trainer: offset after 5 steps %llu, want %llu",
        (unsigned long long)nt_ctx_rng_offset(ctx), (unsigned long long)want);
  uint64_t base = 0;
  CHECK_OK(ctx, nt_ctx_rng_base_read(ctx, &base));
  CHECK(base == want, "trainer: the step base %llu equals the offset", (unsigned long long)base);
  CHECK(!nt_ctx_rng_in_step(ctx), "trainer: no step left open");
  CHECK(res.n_losses == 5 && !res.used_cuda_graph, "trainer: 5 eager CPU steps");
  nt_train_result_free(&res);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  gpt_bracket_vs_absolute(ctx);
  cnn_bracket_vs_absolute(ctx);
  trainer_offset(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
