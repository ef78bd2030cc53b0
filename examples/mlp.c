/* The porter's template: a model written only against nanotrain's public headers, as a
 * program outside the repository would be (tests/install.cmake also builds it out of tree
 * against the installed package). A 2 -> 64 -> 64 -> 3 ReLU MLP learns to tell the three arms
 * of a spiral apart, a problem no linear classifier solves: each arm winds once around the
 * origin. docs/porting.md walks through it.
 *
 * What a port writes: parameters in units (models/module.h), activations allocated once, a
 * body (forward, loss times the loss scale, backward into the units' gradients, with the unit
 * hooks around each unit), then the optimizer, scaler and step from train/step.h.
 *
 *   mlp [--steps N] [--lr X] [--precision fp32|bf16|fp16] [--device cpu|cuda] [--trace]
 *       [--expect-loss X]      (exit 1 unless the final loss is below X; tests use it) */
#include "core/nt.h"
#include "amp/policy.h"
#include "models/module.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include "train/step.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 600, IN = 2, HID = 64, OUT = 3, LAYERS = 3 };

typedef struct {
  nt_params p;
  nt_tensor w[LAYERS], b[LAYERS], dw[LAYERS], db[LAYERS];   /* views into the units */
  nt_tensor x, y, h[LAYERS - 1], logits, losses, loss, dh, dpre;
  nt_arena arena;
} mlp;

/* One unit per layer, "fc<l>": weight [out, in] (decayed) and bias [out], torch.nn.Linear's
 * init. Activations in the compute dtype; the loss in fp32. */
static nt_status mlp_create(nt_ctx *ctx, mlp *m, nt_dtype dt) {
  static const int64_t dims[LAYERS + 1] = {IN, HID, HID, OUT};
  memset(m, 0, sizeof *m);
  nt_status st = NT_OK;
  for (int l = 0; l < LAYERS && !st; l++) {
    char name[32];
    int u;
    int64_t ws[2] = {dims[l + 1], dims[l]}, bs[1] = {dims[l + 1]};
    float bound = 1.0f / sqrtf((float)dims[l]);
    snprintf(name, sizeof name, "fc%d", l);
    st = nt_params_add_unit(ctx, &m->p, name, &u);
    snprintf(name, sizeof name, "fc%d.weight", l);
    if (!st) st = nt_params_add(ctx, &m->p, u, name, 2, ws, true, NT_INIT_UNIFORM, bound, NULL);
    snprintf(name, sizeof name, "fc%d.bias", l);
    if (!st) st = nt_params_add(ctx, &m->p, u, name, 1, bs, false, NT_INIT_UNIFORM, bound, NULL);
  }
  if (!st) st = nt_params_alloc(ctx, &m->p, dt);
  if (!st) st = nt_params_init(ctx, &m->p, 1234);
  for (int l = 0; l < LAYERS && !st; l++) {   /* decayed parameters come first in a unit */
    m->w[l] = nt_params_view(&m->p, l, 0, NT_VIEW_COMPUTE);
    m->b[l] = nt_params_view(&m->p, l, 1, NT_VIEW_COMPUTE);
    m->dw[l] = nt_params_view(&m->p, l, 0, NT_VIEW_GRAD);
    m->db[l] = nt_params_view(&m->p, l, 1, NT_VIEW_GRAD);
  }
  int64_t sx[2] = {N, IN}, sh[2] = {N, HID}, so[2] = {N, OUT}, sn[1] = {N};
  nt_arena *a = &m->arena;
  if (!st) st = nt_arena_add(ctx, a, &m->x, dt, 2, sx);
  if (!st) st = nt_arena_add(ctx, a, &m->y, NT_I32, 1, sn);
  for (int l = 0; l < LAYERS - 1 && !st; l++) st = nt_arena_add(ctx, a, &m->h[l], dt, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->dh, dt, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->dpre, dt, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->logits, dt, 2, so);
  if (!st) st = nt_arena_add(ctx, a, &m->losses, NT_F32, 1, sn);
  if (!st) st = nt_arena_add(ctx, a, &m->loss, NT_F32, 0, sn);
  if (!st) st = nt_arena_alloc(ctx, a);
  return st;
}

static void mlp_free(nt_ctx *ctx, mlp *m) {
  nt_arena_free(ctx, &m->arena);
  nt_params_free(ctx, &m->p);
}

/* The step's body: forward (ReLU after every layer but the last), mean cross-entropy, and
 * backward into the units' gradients (the step zeroed them). The fused cross-entropy
 * multiplies the loss gradient by *loss_scale (NULL: 1) and turns the logits into their
 * gradient in place. relu' is read off each layer's output; unit l's gradients are final once
 * its linear backward is enqueued. */
static nt_status mlp_body(nt_ctx *ctx, void *arg, const float *loss_scale,
                          const nt_unit_hooks *hooks) {
  mlp *m = arg;
  nt_linear_bwd_opts ow = {.overwrite_dx = true};
  nt_status st = NT_OK;
  for (int l = 0; l < LAYERS && !st; l++) {
    st = nt_unit_before_forward(ctx, hooks, l);
    if (!st) st = nt_linear_forward(ctx, l ? &m->h[l - 1] : &m->x, &m->w[l], &m->b[l],
                                    l < LAYERS - 1 ? &m->h[l] : &m->logits,
                                    l < LAYERS - 1 ? NT_ACT_RELU : NT_ACT_NONE, NULL);
  }
  if (!st) st = nt_cross_entropy_fused(ctx, &m->logits, &m->y, loss_scale, N, &m->losses,
                                       &m->logits);
  if (!st) st = nt_mean(ctx, &m->losses, &m->loss);
  const nt_tensor *dy = &m->logits;
  for (int l = LAYERS - 1; l >= 0 && !st; l--) {
    st = nt_unit_before_backward(ctx, hooks, l);
    if (!st) st = nt_linear_backward_ex(ctx, dy, l ? &m->h[l - 1] : &m->x, &m->w[l],
                                        l ? &m->dh : NULL, &m->dw[l], &m->db[l], &ow);
    if (!st) st = nt_unit_grads_ready(ctx, hooks, l);
    if (!st && l) st = nt_tensor_zero(ctx, &m->dpre);   /* relu's backward accumulates */
    if (!st && l) st = nt_relu_backward(ctx, &m->h[l - 1], &m->dh, &m->dpre);
    dy = &m->dpre;
  }
  return st;
}

/* Three spiral arms of N / 3 points, one turn each around the origin, with a little noise. */
static void make_spiral(float *x, int32_t *y) {
  uint64_t s = 88172645463325252ULL;
  for (int i = 0; i < N; i++) {
    int k = i % OUT;
    float t = (float)(i / OUT) / (N / OUT);   /* 0..1 along the arm */
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float noise = ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
    float angle = 2.0f * 3.14159265f * (t + (float)k / OUT) + noise;
    x[2 * i] = t * cosf(angle);
    x[2 * i + 1] = t * sinf(angle);
    y[i] = k;
  }
}

/* The data onto ctx's device, the inputs rounded to the compute dtype. */
static nt_status upload(nt_ctx *ctx, mlp *m, const float *hx, int32_t *hy) {
  static uint32_t buf[N * IN];   /* room for N * IN values of any float dtype */
  for (int i = 0; i < N * IN; i++) nt_store_f32(buf, m->x.dtype, i, hx[i]);
  nt_tensor tx = nt_tensor_view(buf, m->x.dtype, nt_cpu(), 2, m->x.shape);
  nt_tensor ty = nt_tensor_view(hy, NT_I32, nt_cpu(), 1, m->y.shape);
  nt_status st = nt_tensor_copy(ctx, &m->x, &tx);
  return st ? st : nt_tensor_copy(ctx, &m->y, &ty);
}

static int usage(void) {
  fprintf(stderr, "usage: mlp [--steps N] [--lr X] [--precision fp32|bf16|fp16] "
                  "[--device cpu|cuda] [--trace] [--expect-loss X]\n");
  return 2;
}

int main(int argc, char **argv) {
  int steps = 1000;
  double lr = 1e-2, expect = -1;
  const char *precision = "fp32";
  bool cuda = false, trace = false;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--trace")) {
      trace = true;
      continue;
    }
    if (!v) return usage();
    if (!strcmp(argv[i], "--steps")) steps = atoi(v);
    else if (!strcmp(argv[i], "--lr")) lr = atof(v);
    else if (!strcmp(argv[i], "--precision")) precision = v;
    else if (!strcmp(argv[i], "--expect-loss")) expect = atof(v);
    else if (!strcmp(argv[i], "--device")) cuda = !strcmp(v, "cuda");
    else return usage();
    i++;
  }
  if (steps < 1 || !(lr > 0)) return usage();
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, cuda ? nt_cuda(0) : nt_cpu())) {
    fprintf(stderr, "mlp: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  static float hx[N * IN];
  static int32_t hy[N];
  make_spiral(hx, hy);
  mlp m;
  nt_precision prec;
  nt_policy pol;
  nt_optimizer opt = {0};
  nt_step *step = NULL;
  float loss = NAN, first = NAN;
  /* the precision policy gives the compute dtype and whether a loss scaler is needed */
  nt_status st = nt_precision_parse(ctx, precision, &prec);
  if (!st) st = nt_policy_make(ctx, prec, &pol);
  if (!st) nt_policy_apply(ctx, &pol);
  if (!st) st = mlp_create(ctx, &m, pol.compute_dtype);
  if (!st) st = upload(ctx, &m, hx, hy);
  nt_optimizer_options oo = nt_optimizer_defaults();
  oo.adamw.lr = lr;
  oo.adamw.weight_decay = 1e-4;
  oo.scaler.enabled = pol.needs_scaler;
  if (!st) st = nt_optimizer_for_params(ctx, &m.p, &oo, &opt);
  nt_step_options so = {.params = &m.p, .body = mlp_body, .body_arg = &m, .optimizer = opt,
                        .max_norm = 1.0f, .cuda_graph = -1, .trace = trace ? stdout : NULL};
  if (!st) st = nt_step_create(ctx, &so, &step);
  nt_tensor hloss = nt_tensor_view(&loss, NT_F32, nt_cpu(), 0, NULL);
  for (int it = 1; it <= steps && !st; it++) {
    st = nt_step_run(ctx, step, lr);
    if (!st && (it == 1 || it % 100 == 0 || it == steps)) {
      st = nt_tensor_copy(ctx, &hloss, &m.loss);   /* synchronizes: only when logging */
      if (it == 1) first = loss;
      printf("step %4d  loss %.4f\n", it, (double)loss);
    }
  }
  int rc = 0;
  if (st) {
    fprintf(stderr, "mlp: %s\n", nt_last_error(ctx));
    rc = 1;
  } else {
    printf("%s: loss %.4f -> %.4f\n", nt_precision_name(prec), (double)first, (double)loss);
    if (expect > 0 && !(loss < expect)) {
      fprintf(stderr, "mlp: final loss %.4f is not below %.4f\n", (double)loss, expect);
      rc = 1;
    }
  }
  nt_step_free(ctx, step);
  nt_optimizer_free(ctx, &opt);
  mlp_free(ctx, &m);
  nt_ctx_free(ctx);
  return rc;
}
