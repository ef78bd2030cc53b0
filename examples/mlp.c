/* The porter's template: a model written only against nanotrain's public headers, as a
 * program outside the repository would be (it is also built out of tree against the installed
 * package, tests/install.cmake). A 2 -> 64 -> 64 -> 3 ReLU MLP learns to tell the three arms
 * of a spiral apart (a problem no linear classifier solves: each arm winds once around the
 * origin, so a half-plane split cannot separate them).
 *
 * The pieces a port needs, in order: parameters in units (models/module.h), activations the
 * program allocates once, a forward and a backward from ops/, an optimizer over the units
 * (optim/adamw.h), and a loop. docs/porting.md walks through it.
 *
 *   mlp [--steps N] [--lr X] [--device cpu|cuda] [--expect-loss X]
 * --expect-loss: exit 1 unless the final loss is below X (tests use it). */
#include "core/nt.h"
#include "models/module.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include "optim/adamw.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 600, IN = 2, HID = 64, OUT = 3 };

typedef struct {
  nt_params p;
  nt_tensor w[3], b[3], dw[3], db[3];     /* views into the units' buffers */
  nt_tensor x, y, h[2], logits, losses, loss, dh, dpre;
  nt_arena arena;
} mlp;

/* One unit per layer: weight [out, in] (decayed) and bias [out]. */
static nt_status mlp_create(nt_ctx *ctx, mlp *m) {
  static const int64_t dims[4] = {IN, HID, HID, OUT};
  memset(m, 0, sizeof *m);
  nt_status st = NT_OK;
  for (int l = 0; l < 3 && !st; l++) {
    char name[32];
    int u;
    int64_t ws[2] = {dims[l + 1], dims[l]}, bs[1] = {dims[l + 1]};
    float bound = 1.0f / sqrtf((float)dims[l]);   /* torch.nn.Linear's init */
    snprintf(name, sizeof name, "fc%d", l);
    st = nt_params_add_unit(ctx, &m->p, name, &u);
    snprintf(name, sizeof name, "fc%d.weight", l);
    if (!st) st = nt_params_add(ctx, &m->p, u, name, 2, ws, true, NT_INIT_UNIFORM, bound, NULL);
    snprintf(name, sizeof name, "fc%d.bias", l);
    if (!st) st = nt_params_add(ctx, &m->p, u, name, 1, bs, false, NT_INIT_UNIFORM, bound, NULL);
  }
  if (!st) st = nt_params_alloc(ctx, &m->p, NT_F32);
  if (!st) st = nt_params_init(ctx, &m->p, 1234);
  for (int l = 0; l < 3 && !st; l++) {
    /* nt_params_alloc put decayed parameters first: index 0 is the weight, 1 the bias */
    m->w[l] = nt_params_view(&m->p, l, 0, NT_VIEW_COMPUTE);
    m->b[l] = nt_params_view(&m->p, l, 1, NT_VIEW_COMPUTE);
    m->dw[l] = nt_params_view(&m->p, l, 0, NT_VIEW_GRAD);
    m->db[l] = nt_params_view(&m->p, l, 1, NT_VIEW_GRAD);
  }
  int64_t sx[2] = {N, IN}, sh[2] = {N, HID}, so[2] = {N, OUT}, sn[1] = {N};
  nt_arena *a = &m->arena;
  if (!st) st = nt_arena_add(ctx, a, &m->x, NT_F32, 2, sx);
  if (!st) st = nt_arena_add(ctx, a, &m->y, NT_I32, 1, sn);
  if (!st) st = nt_arena_add(ctx, a, &m->h[0], NT_F32, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->h[1], NT_F32, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->dh, NT_F32, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->dpre, NT_F32, 2, sh);
  if (!st) st = nt_arena_add(ctx, a, &m->logits, NT_F32, 2, so);
  if (!st) st = nt_arena_add(ctx, a, &m->losses, NT_F32, 1, sn);
  if (!st) st = nt_arena_add(ctx, a, &m->loss, NT_F32, 0, sn);
  if (!st) st = nt_arena_alloc(ctx, a);
  return st;
}

static void mlp_free(nt_ctx *ctx, mlp *m) {
  nt_arena_free(ctx, &m->arena);
  nt_params_free(ctx, &m->p);
}

static nt_status mlp_forward(nt_ctx *ctx, mlp *m) {
  nt_status st = nt_linear_forward(ctx, &m->x, &m->w[0], &m->b[0], &m->h[0], NT_ACT_RELU, NULL);
  if (!st) st = nt_linear_forward(ctx, &m->h[0], &m->w[1], &m->b[1], &m->h[1], NT_ACT_RELU, NULL);
  if (!st) st = nt_linear_forward(ctx, &m->h[1], &m->w[2], &m->b[2], &m->logits, NT_ACT_NONE, NULL);
  return st;
}

/* Forward, mean cross-entropy loss, and backward accumulating into the parameter gradients.
 * The logits become their own gradient (in place); relu' is read off each layer's output. */
static nt_status mlp_train_step(nt_ctx *ctx, mlp *m) {
  nt_linear_bwd_opts ow = {.overwrite_dx = true};
  nt_status st = mlp_forward(ctx, m);
  if (!st) st = nt_cross_entropy_fused(ctx, &m->logits, &m->y, NULL, N, &m->losses, &m->logits);
  if (!st) st = nt_mean(ctx, &m->losses, &m->loss);
  const nt_tensor *dy = &m->logits;
  for (int l = 2; l >= 0 && !st; l--) {
    const nt_tensor *x = l ? &m->h[l - 1] : &m->x;
    st = nt_linear_backward_ex(ctx, dy, x, &m->w[l], l ? &m->dh : NULL, &m->dw[l], &m->db[l], &ow);
    if (!st && l) st = nt_tensor_zero(ctx, &m->dpre);   /* relu backward accumulates */
    if (!st && l) st = nt_relu_backward(ctx, &m->h[l - 1], &m->dh, &m->dpre);
    dy = &m->dpre;
  }
  return st;
}

/* Three spiral arms of N / 3 points each, one turn around the origin, with a little noise. */
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

/* An AdamW over the units, with weight decay on the 2-D weights only ([0, n_decay) of each
 * unit, as nanoGPT's groups). */
static nt_status make_optimizer(nt_ctx *ctx, mlp *m, double lr, nt_adamw **opt) {
  nt_param_unit units[3];
  nt_param_range dec[3], nodec[3];
  for (int u = 0; u < 3; u++) {
    nt_unit *un = &m->p.units[u];
    nt_param_unit pu = {un->compute, un->grad, NULL};
    nt_param_range d = {u, 0, un->n_decay}, n = {u, un->n_decay, un->numel - un->n_decay};
    units[u] = pu;
    dec[u] = d;
    nodec[u] = n;
  }
  nt_param_group groups[2] = {{1.0f, 1e-4, dec, 3}, {1.0f, 0.0, nodec, 3}};
  nt_adamw_options o = nt_adamw_defaults();
  o.lr = lr;
  return nt_adamw_create(ctx, &o, units, 3, groups, 2, opt);
}

static int usage(void) {
  fprintf(stderr, "usage: mlp [--steps N] [--lr X] [--device cpu|cuda] [--expect-loss X]\n");
  return 2;
}

int main(int argc, char **argv) {
  int steps = 1000;
  double lr = 1e-2, expect = -1;
  bool cuda = false;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (!strcmp(argv[i], "--steps")) steps = atoi(v);
    else if (!strcmp(argv[i], "--lr")) lr = atof(v);
    else if (!strcmp(argv[i], "--expect-loss")) expect = atof(v);
    else if (!strcmp(argv[i], "--device")) cuda = !strcmp(v, "cuda");
    else return usage();
    i++;
  }
  if (steps < 1 || lr <= 0) return usage();
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, cuda ? nt_cuda(0) : nt_cpu())) {
    fprintf(stderr, "mlp: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  mlp m;
  nt_adamw *opt = NULL;
  static float hx[N * IN], hl[N * OUT];
  static int32_t hy[N];
  float loss = NAN, first = NAN;
  make_spiral(hx, hy);
  nt_status st = mlp_create(ctx, &m);
  if (!st) {
    nt_tensor tx = nt_tensor_view(hx, NT_F32, nt_cpu(), 2, m.x.shape);
    nt_tensor ty = nt_tensor_view(hy, NT_I32, nt_cpu(), 1, m.y.shape);
    st = nt_tensor_copy(ctx, &m.x, &tx);
    if (!st) st = nt_tensor_copy(ctx, &m.y, &ty);
  }
  if (!st) st = make_optimizer(ctx, &m, lr, &opt);
  nt_tensor hloss = nt_tensor_view(&loss, NT_F32, nt_cpu(), 0, NULL);
  for (int it = 1; it <= steps && !st; it++) {
    st = nt_params_zero_grad(ctx, &m.p);
    if (!st) st = mlp_train_step(ctx, &m);
    if (!st) st = nt_adamw_step(ctx, opt, NULL);
    if (!st && (it == 1 || it % 200 == 0 || it == steps)) {
      st = nt_tensor_copy(ctx, &hloss, &m.loss);   /* synchronizes */
      if (it == 1) first = loss;
      printf("step %4d  loss %.4f\n", it, (double)loss);
    }
  }
  int correct = 0;
  if (!st) st = mlp_forward(ctx, &m);
  nt_tensor tl = nt_tensor_view(hl, NT_F32, nt_cpu(), 2, m.logits.shape);
  if (!st) st = nt_tensor_copy(ctx, &tl, &m.logits);
  for (int i = 0; i < N && !st; i++) {
    int best = 0;
    for (int k = 1; k < OUT; k++)
      if (hl[i * OUT + k] > hl[i * OUT + best]) best = k;
    correct += best == hy[i];
  }
  int rc = 0;
  if (st) {
    fprintf(stderr, "mlp: %s\n", nt_last_error(ctx));
    rc = 1;
  } else {
    printf("loss %.4f -> %.4f, accuracy %.1f%% (%d points)\n", (double)first, (double)loss,
           100.0 * correct / N, N);
    if (expect > 0 && !(loss < expect)) {
      fprintf(stderr, "mlp: final loss %.4f is not below %.4f\n", (double)loss, expect);
      rc = 1;
    }
  }
  nt_adamw_free(ctx, opt);
  mlp_free(ctx, &m);
  nt_ctx_free(ctx);
  return rc;
}
