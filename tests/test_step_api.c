/* A porter's program against train/step.h only: a two-layer MLP regression built from
 * parameter units, its forward and backward written by hand (the CPU context's tensors are host
 * memory), AdamW + the loss scaler from nt_optimizer_for_params, and nt_step_run per
 * iteration. The loss must fall by 10x; the loss scaler must have run (its growth tracker
 * advanced), and clipping must have seen the gradient norm. */
#include "train/step.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { N = 32, IN = 4, HID = 16 };

typedef struct {
  nt_params params;
  int u1, u2;                     /* units: hidden layer, output layer */
  int w1, b1, w2, b2;             /* parameter indices within their units */
  float x[N][IN], y[N];
  float h[N][HID];                /* saved activations (after ReLU) */
  float loss;
} mlp;

static float *val(mlp *m, int unit, int idx, nt_param_view which) {
  return (float *)nt_params_view(&m->params, unit, idx, which).data;
}

/* One micro-step: mean squared error, gradients of loss * scale accumulated into the units. */
static nt_status mlp_body(nt_ctx *ctx, void *arg, const float *loss_scale,
                          const nt_unit_hooks *hooks) {
  mlp *m = arg;
  float scale = loss_scale ? *loss_scale : 1.0f;
  const float *w1 = val(m, m->u1, m->w1, NT_VIEW_COMPUTE), *b1 = val(m, m->u1, m->b1, NT_VIEW_COMPUTE);
  const float *w2 = val(m, m->u2, m->w2, NT_VIEW_COMPUTE), *b2 = val(m, m->u2, m->b2, NT_VIEW_COMPUTE);
  float *gw1 = val(m, m->u1, m->w1, NT_VIEW_GRAD), *gb1 = val(m, m->u1, m->b1, NT_VIEW_GRAD);
  float *gw2 = val(m, m->u2, m->w2, NT_VIEW_GRAD), *gb2 = val(m, m->u2, m->b2, NT_VIEW_GRAD);
  nt_status st = nt_unit_before_forward(ctx, hooks, m->u1);
  if (!st) st = nt_unit_before_forward(ctx, hooks, m->u2);
  if (st) return st;
  float dy[N];
  double loss = 0;
  for (int i = 0; i < N; i++) {
    float out = b2[0];
    for (int j = 0; j < HID; j++) {
      float a = b1[j];
      for (int k = 0; k < IN; k++) a += w1[j * IN + k] * m->x[i][k];
      m->h[i][j] = a > 0 ? a : 0;
      out += w2[j] * m->h[i][j];
    }
    float d = out - m->y[i];
    loss += (double)d * d;
    dy[i] = 2.0f * d / N * scale;
  }
  m->loss = (float)(loss / N);
  st = nt_unit_before_backward(ctx, hooks, m->u2);
  if (st) return st;
  for (int i = 0; i < N; i++) {
    gb2[0] += dy[i];
    for (int j = 0; j < HID; j++) gw2[j] += dy[i] * m->h[i][j];
  }
  st = nt_unit_grads_ready(ctx, hooks, m->u2);
  if (!st) st = nt_unit_before_backward(ctx, hooks, m->u1);
  if (st) return st;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < HID; j++) {
      if (m->h[i][j] <= 0) continue;
      float dh = dy[i] * w2[j];
      gb1[j] += dh;
      for (int k = 0; k < IN; k++) gw1[j * IN + k] += dh * m->x[i][k];
    }
  return nt_unit_grads_ready(ctx, hooks, m->u1);
}

static int build(nt_ctx *ctx, mlp *m) {
  const int64_t sw1[2] = {HID, IN}, sb1[1] = {HID}, sw2[2] = {1, HID}, sb2[1] = {1};
  nt_params *p = &m->params;
  if (nt_params_add_unit(ctx, p, "hidden", &m->u1) ||
      nt_params_add(ctx, p, m->u1, "fc1.weight", 2, sw1, true, NT_INIT_UNIFORM, 0.5f, &m->w1) ||
      nt_params_add(ctx, p, m->u1, "fc1.bias", 1, sb1, false, NT_INIT_ZEROS, 0, &m->b1) ||
      nt_params_add_unit(ctx, p, "out", &m->u2) ||
      nt_params_add(ctx, p, m->u2, "fc2.weight", 2, sw2, true, NT_INIT_UNIFORM, 0.25f, &m->w2) ||
      nt_params_add(ctx, p, m->u2, "fc2.bias", 1, sb2, false, NT_INIT_ZEROS, 0, &m->b2) ||
      nt_params_alloc(ctx, p, NT_F32) || nt_params_init(ctx, p, 7))
    return 1;
  /* y = sin(x0) + x1 * x2 - 0.5 x3 on a fixed grid of inputs */
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < IN; k++) m->x[i][k] = sinf(0.7f * (float)(i * IN + k));
    m->y[i] = sinf(m->x[i][0]) + m->x[i][1] * m->x[i][2] - 0.5f * m->x[i][3];
  }
  return 0;
}

int main(void) {
  nt_ctx *ctx = NULL;
  static mlp m;
  nt_optimizer opt = {0};
  nt_step *step = NULL;
  int rc = 1;
  if (nt_ctx_create(&ctx, nt_cpu()) || build(ctx, &m)) goto done;
  nt_optimizer_options oo = nt_optimizer_defaults();
  oo.adamw.lr = 1e-2;
  oo.adamw.weight_decay = 1e-4;
  oo.scaler.enabled = true;       /* exercised even in fp32: scale, unscale, inf check */
  oo.scaler.init_scale = 256.0f;
  oo.scaler.growth_interval = 1000;
  if (nt_optimizer_for_params(ctx, &m.params, &oo, &opt)) goto done;
  nt_step_options so;
  memset(&so, 0, sizeof so);
  so.params = &m.params;
  so.body = mlp_body;
  so.body_arg = &m;
  so.optimizer = opt;
  so.max_norm = 5.0f;
  so.cuda_graph = -1;             /* captured on a GPU context; eager here */
  if (nt_step_create(ctx, &so, &step)) goto done;
  float first = NAN;
  for (int it = 0; it < 300; it++) {
    if (nt_step_run(ctx, step, 1e-2)) goto done;
    if (it == 0) first = m.loss;
  }
  nt_scaler_values v;
  float norm = 0;
  if (nt_scaler_read(ctx, opt.scaler, &v) || nt_adamw_last_grad_norm(ctx, opt.adamw, &norm))
    goto done;
  printf("MLP from units: loss %.4f -> %.4f, scale %g, growth tracker %d, grad norm %.4f\n",
         (double)first, (double)m.loss, (double)v.scale, (int)v.growth_tracker, (double)norm);
  if (!(m.loss < first / 10)) fprintf(stderr, "FAIL: the loss did not fall by 10x\n");
  else if (v.growth_tracker != 300 || v.scale != 256.0f)
    fprintf(stderr, "FAIL: the scaler did not run every step (tracker %d)\n", (int)v.growth_tracker);
  else if (!(norm > 0)) fprintf(stderr, "FAIL: clipping saw no gradient norm\n");
  else rc = 0;
done:
  if (rc && ctx && nt_last_error(ctx)[0]) fprintf(stderr, "error: %s\n", nt_last_error(ctx));
  nt_step_free(ctx, step);
  nt_optimizer_free(ctx, &opt);
  nt_params_free(ctx, &m.params);
  nt_ctx_free(ctx);
  printf(rc ? "FAILED\n" : "passed\n");
  return rc;
}
