#include "models/cnn.h"
#include "ops/conv2d_nhwc.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "amp/fp8_linear.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W1, B1, W2, B2, W3, B3, W4, B4, F1W, F1B, F2W, F2B, NPARAM };

struct nt_cnn {
  nt_cnn_config cfg;
  int N;
  nt_params params;
  nt_tensor w[NPARAM], g[NPARAM];   /* compute and gradient views */
  int unit[3];                      /* nt_params units: stage1, stage2, head */
  nt_arena arena;
  /* saved activations (conv2's and conv4's ReLU outputs are not: see the forward) */
  nt_tensor a1, p1, arg1, a3, p2, arg2, h, hd, logits, losses, loss;
  /* scratch: two of the largest feature map (the unsaved conv outputs in the forward where
   * the pool is not fused into the conv, the gradient maps in the backward), and the head's */
  nt_tensor sa, sb, dh, dh2;
  uint64_t drop_off;
  nt_fp8_state *fp8;              /* FP8 delayed scaling for fc1, fc2, or NULL */
  bool fp8_emulate;
  int n;
};

/* fc1 (k = 0) and fc2 (k = 1), in FP8 when the model has an FP8 state. */
static nt_status lin_fwd(nt_ctx *ctx, const nt_cnn *m, int k, const nt_tensor *x,
                         const nt_tensor *w, const nt_tensor *b, nt_tensor *y, nt_activation act) {
  if (!m->fp8) return nt_linear_forward(ctx, x, w, b, y, act, NULL);
  nt_fp8_linear_cfg c = {m->fp8, k * NT_FP8_LINEAR_TENSORS, m->fp8_emulate};
  return nt_fp8_linear_forward(ctx, &c, x, w, b, y, act, NULL);
}

/* dx is overwritten (dw, db accumulate). */
static nt_status lin_bwd(nt_ctx *ctx, const nt_cnn *m, int k, const nt_tensor *dy,
                         const nt_tensor *x, const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                         nt_tensor *db) {
  if (!m->fp8) {
    const nt_linear_bwd_opts o = {.overwrite_dx = true};
    return nt_linear_backward_ex(ctx, dy, x, w, dx, dw, db, &o);
  }
  nt_fp8_linear_cfg c = {m->fp8, k * NT_FP8_LINEAR_TENSORS, m->fp8_emulate};
  const nt_fp8_linear_bwd_opts o = {.overwrite_dx = true};
  return nt_fp8_linear_backward_ex(ctx, &c, dy, x, w, dx, dw, db, &o);
}

nt_status nt_cnn_enable_fp8(nt_ctx *ctx, nt_cnn *m, bool emulate) {
  if (m->fp8) return NT_OK;
  m->fp8_emulate = emulate;
  return nt_fp8_linear_state_create(ctx, NULL, 2, &m->fp8);
}

nt_cnn_config nt_cnn_config_default(void) {
  nt_cnn_config c = {1, 28, 28, 32, 64, 256, 10, 0.0f};
  return c;
}

nt_status nt_cnn_config_check(nt_ctx *ctx, const nt_cnn_config *c) {
  if (c->in_channels < 1 || c->c1 < 1 || c->c2 < 1 || c->hidden < 1 || c->classes < 2)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "CNN config: in %d, widths %d/%d, hidden %d, classes %d must be positive "
                    "(classes >= 2)",
                    c->in_channels, c->c1, c->c2, c->hidden, c->classes);
  if (c->height < 4 || c->width < 4 || c->height % 4 || c->width % 4)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "CNN config: image %dx%d must be a multiple of 4 (two 2x2 poolings)",
                    c->height, c->width);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "CNN config: dropout %g must be in [0, 1)",
                    (double)c->dropout);
  return NT_OK;
}

static int64_t feat(const nt_cnn_config *c) {
  return (int64_t)c->c2 * (c->height / 4) * (c->width / 4);
}

/* The parameter views, taken again: data parallelism (dist/fsdp.h) moves a unit's buffers
 * while training, so the views are refreshed before every forward and after every unit hook.
 * Unit s holds parameters 4s .. 4s+3 as its parameters 0 .. 3. */
static void refresh_views(nt_cnn *m) {
  for (int j = 0; j < NPARAM; j++) {
    m->w[j] = nt_params_view(&m->params, m->unit[j / 4], j % 4, NT_VIEW_COMPUTE);
    m->g[j] = nt_params_view(&m->params, m->unit[j / 4], j % 4, NT_VIEW_GRAD);
  }
}

static nt_status build_params(nt_ctx *ctx, nt_cnn *m, nt_dtype dt, bool alloc) {
  const nt_cnn_config *c = &m->cfg;
  static const char *const names[NPARAM] = {
      "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "conv3.weight", "conv3.bias",
      "conv4.weight", "conv4.bias", "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
  int64_t shapes[NPARAM][4] = {
      {c->c1, c->in_channels, 3, 3}, {c->c1}, {c->c1, c->c1, 3, 3}, {c->c1},
      {c->c2, c->c1, 3, 3},          {c->c2}, {c->c2, c->c2, 3, 3}, {c->c2},
      {c->hidden, feat(c)},          {c->hidden}, {c->classes, c->hidden}, {c->classes}};
  const int ndims[NPARAM] = {4, 1, 4, 1, 4, 1, 4, 1, 2, 1, 2, 1};
  const char *units[3] = {"stage1", "stage2", "head"};
  int *uidx = m->unit, idx[NPARAM];
  nt_status st = NT_OK;
  for (int s = 0; s < 3 && !st; s++) {
    st = nt_params_add_unit(ctx, &m->params, units[s], &uidx[s]);
    for (int j = 4 * s; j < 4 * s + 4 && !st; j++) {
      const int64_t *w = shapes[j & ~1];   /* the layer's weight gives fan_in */
      int64_t fan_in = w[1] * (ndims[j & ~1] == 4 ? w[2] * w[3] : 1);
      float bound = 1.0f / sqrtf((float)fan_in);
      st = nt_params_add(ctx, &m->params, uidx[s], names[j], ndims[j], shapes[j], ndims[j] >= 2,
                         NT_INIT_UNIFORM, bound, &idx[j]);
    }
  }
  if (!st && !alloc) nt_params_layout(&m->params);
  if (!st && alloc) st = nt_params_alloc(ctx, &m->params, dt);
  if (st || !alloc) return st;
  for (int j = 0; j < NPARAM; j++)
    if (idx[j] != j % 4) return NT_ERROR(ctx, NT_ERR_STATE, "cnn: unexpected parameter order");
  refresh_views(m);
  return NT_OK;
}

static nt_status unit_hook(nt_ctx *ctx, nt_cnn *m, const nt_unit_hooks *h, int unit,
                           nt_status (*call)(nt_ctx *, const nt_unit_hooks *, int)) {
  nt_status st = call(ctx, h, unit);
  if (h) refresh_views(m);
  return st;
}

static nt_status build_activations(nt_ctx *ctx, nt_cnn *m, nt_dtype dt, bool alloc) {
  const nt_cnn_config *c = &m->cfg;
  int64_t N = m->N, H = c->height, W = c->width;
  /* channels last (NHWC), except p2: the last pool writes PyTorch's NCHW flatten order */
  int64_t s1[4] = {N, H, W, c->c1}, sp1[4] = {N, H / 2, W / 2, c->c1};
  int64_t s3[4] = {N, H / 2, W / 2, c->c2}, sp2[4] = {N, c->c2, H / 4, W / 4};
  int64_t sh[2] = {N, c->hidden}, sl[2] = {N, c->classes}, sn[1] = {N};
  /* the scratch holds the largest map of any layer (conv1/2 out, or conv3/4 out) */
  int64_t m1 = (int64_t)c->c1 * H * W, m2 = (int64_t)c->c2 * (H / 2) * (W / 2);
  int64_t big = N * (m1 > m2 ? m1 : m2);
  int64_t sbig[1] = {big};
  nt_arena *a = &m->arena;
  nt_status st = NT_OK;
#define ADD(t, dtype, nd, shp) \
  if (!st) st = nt_arena_add(ctx, a, &(m->t), (dtype), (nd), (shp))
  ADD(a1, dt, 4, s1);
  ADD(p1, dt, 4, sp1);
  ADD(arg1, NT_I32, 4, sp1);
  ADD(a3, dt, 4, s3);
  ADD(p2, dt, 4, sp2);
  ADD(arg2, NT_I32, 4, sp2);
  ADD(h, dt, 2, sh);
  ADD(hd, dt, 2, sh);
  ADD(logits, dt, 2, sl);
  ADD(losses, NT_F32, 1, sn);
  ADD(loss, NT_F32, 0, sn);
  ADD(sa, dt, 1, sbig);
  ADD(sb, dt, 1, sbig);
  ADD(dh, dt, 2, sh);
  ADD(dh2, dt, 2, sh);
#undef ADD
  if (!st && alloc) st = nt_arena_alloc(ctx, a);
  return st;
}

nt_status nt_cnn_create(nt_ctx *ctx, const nt_cnn_config *cfg, nt_dtype compute_dtype, int batch,
                        nt_cnn **out) {
  *out = NULL;
  nt_status st = nt_cnn_config_check(ctx, cfg);
  if (st) return st;
  if (batch < 1) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "CNN batch %d must be >= 1", batch);
  nt_cnn *m = calloc(1, sizeof *m);
  if (!m) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the CNN");
  m->cfg = *cfg;
  m->N = batch;
  st = build_params(ctx, m, compute_dtype, true);
  if (!st) st = build_activations(ctx, m, compute_dtype, true);
  if (st) {
    nt_cnn_free(ctx, m);
    return st;
  }
  *out = m;
  return NT_OK;
}

void nt_cnn_free(nt_ctx *ctx, nt_cnn *m) {
  if (!m) return;
  nt_fp8_state_free(ctx, m->fp8);
  nt_arena_free(ctx, &m->arena);
  nt_params_free(ctx, &m->params);
  free(m);
}

nt_status nt_cnn_estimate(nt_ctx *ctx, const nt_cnn_config *cfg, nt_dtype compute_dtype,
                          int batch, nt_model_sizes *out) {
  nt_status st = nt_cnn_config_check(ctx, cfg);
  if (st) return st;
  nt_cnn m;
  memset(&m, 0, sizeof m);
  m.cfg = *cfg;
  m.N = batch;
  st = build_params(ctx, &m, compute_dtype, false);
  if (!st) st = build_activations(ctx, &m, compute_dtype, false);
  if (!st) nt_model_sizes_of(&m.params, m.arena.bytes, out);
  nt_arena_free(ctx, &m.arena);
  nt_params_free(ctx, &m.params);
  return st;
}

nt_params *nt_cnn_params(nt_cnn *m) { return &m->params; }
const nt_cnn_config *nt_cnn_get_config(const nt_cnn *m) { return &m->cfg; }
const nt_tensor *nt_cnn_loss(const nt_cnn *m) { return &m->loss; }
size_t nt_cnn_activation_bytes(const nt_cnn *m) { return m->arena.bytes; }

double nt_cnn_flops_per_image(const nt_cnn *m) {
  const nt_cnn_config *c = &m->cfg;
  double hw = (double)c->height * c->width, q = hw / 4;
  double macs = hw * c->c1 * 9.0 * c->in_channels + hw * c->c1 * 9.0 * c->c1 +
                q * c->c2 * 9.0 * c->c1 + q * c->c2 * 9.0 * c->c2 +
                (double)feat(c) * c->hidden + (double)c->hidden * c->classes;
  return 6.0 * macs;
}

static nt_tensor v4(const nt_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  int64_t s[4] = {n, c, h, w};
  return nt_prefix_view(t, 4, s);
}
static nt_tensor v2(const nt_tensor *t, int64_t n, int64_t c) {
  int64_t s[2] = {n, c};
  return nt_prefix_view(t, 2, s);
}

typedef struct {
  nt_tensor x, a1, p1, arg1, a3, p2, arg2, p2f, h, hd, logits;
} views;

/* Feature maps are channels last ([n, H, W, C]): the layout the tensor-core convolutions
 * gather from. p2 (and arg2) is [n, C, H/4, W/4], written so by the last pool, so that the
 * flatten before fc1 is PyTorch's (fc1.weight columns c*49 + h*7 + w, checkpoints unchanged).
 * conv2's and conv4's ReLU outputs (a2, a4) are never stored: the pool is fused into those
 * convolutions, and backward does not need them. Their pooling is a max, so at each window's
 * argmax a2 equals p1: relu'(a2) there is p1 > 0, and every other position gets no gradient.
 * The max-pool backward masks dp1 with p1 > 0 as it routes it, which gives conv2 exactly the
 * ReLU-masked gradient a2 would have given (likewise a4 with p2). */

static views make_views(const nt_cnn *m, const nt_tensor *x, int64_t n) {
  const nt_cnn_config *c = &m->cfg;
  int64_t H = c->height, W = c->width;
  views v;
  int64_t xs[4] = {n, H, W, c->in_channels};
  v.x = nt_tensor_view(x->data, x->dtype, x->device, 4, xs);
  v.a1 = v4(&m->a1, n, H, W, c->c1);
  v.p1 = v4(&m->p1, n, H / 2, W / 2, c->c1);
  v.arg1 = v4(&m->arg1, n, H / 2, W / 2, c->c1);
  v.a3 = v4(&m->a3, n, H / 2, W / 2, c->c2);
  v.p2 = v4(&m->p2, n, c->c2, H / 4, W / 4);
  v.arg2 = v4(&m->arg2, n, c->c2, H / 4, W / 4);
  v.p2f = v2(&m->p2, n, feat(c));
  v.h = v2(&m->h, n, c->hidden);
  v.hd = v2(&m->hd, n, c->hidden);
  v.logits = v2(&m->logits, n, c->classes);
  return v;
}

static nt_status forward(nt_ctx *ctx, nt_cnn *m, const nt_tensor *x, bool train, views *v,
                         const nt_unit_hooks *hooks) {
  const nt_cnn_config *c = &m->cfg;
  /* [n, H, W, in]; with one channel [n, 1, H, W] is the same memory */
  const bool nhwc = x->ndim == 4 && x->shape[1] == c->height && x->shape[2] == c->width &&
                    x->shape[3] == c->in_channels;
  const bool one = x->ndim == 4 && c->in_channels == 1 && x->shape[1] == 1 &&
                   x->shape[2] == c->height && x->shape[3] == c->width;
  if ((!nhwc && !one) || x->shape[0] < 1 || x->shape[0] > m->N || !nt_tensor_is_contiguous(x))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "CNN images must be contiguous [n <= %d, %d, %d, %d] "
                    "(channels last; [n, 1, H, W] for one channel)", m->N, c->height, c->width,
                    c->in_channels);
  if (x->dtype != m->params.compute_dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "CNN images are %s, the model computes in %s",
                    nt_dtype_name(x->dtype), nt_dtype_name(m->params.compute_dtype));
  int64_t n = x->shape[0];
  m->n = (int)n;
  refresh_views(m);
  *v = make_views(m, x, n);
  nt_conv2d_params cp = {1, 1};
  /* conv + bias + ReLU in one op (the ReLU rides in the GEMM epilogue on the GPU) */
  nt_status st = unit_hook(ctx, m, hooks, m->unit[0], nt_unit_before_forward);
  if (!st) st = nt_conv2d_nhwc_forward(ctx, &v->x, &m->w[W1], &m->w[B1], &v->a1, cp, true);
  /* conv + bias + ReLU + 2x2 max-pool in one op (on the GPU the pool is in the epilogue) */
  if (!st) st = nt_conv2d_nhwc_pool_forward(ctx, &v->a1, &m->w[W2], &m->w[B2], &v->p1, &v->arg1,
                                            cp, true, false, &m->sa);
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[1], nt_unit_before_forward);
  if (!st) st = nt_conv2d_nhwc_forward(ctx, &v->p1, &m->w[W3], &m->w[B3], &v->a3, cp, true);
  if (!st) st = nt_conv2d_nhwc_pool_forward(ctx, &v->a3, &m->w[W4], &m->w[B4], &v->p2, &v->arg2,
                                            cp, true, true, &m->sa);
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[2], nt_unit_before_forward);
  if (!st) st = lin_fwd(ctx, m, 0, &v->p2f, &m->w[F1W], &m->w[F1B], &v->h, NT_ACT_RELU);
  const nt_tensor *hin = &v->h;
  if (train && c->dropout > 0.0f) {
    m->drop_off = nt_ctx_rng_reserve(ctx, (uint64_t)n * (uint64_t)c->hidden);
    if (!st) st = nt_dropout_forward(ctx, &v->h, &v->hd, c->dropout, nt_ctx_seed(ctx),
                                     m->drop_off);
    hin = &v->hd;
  }
  if (!st) st = lin_fwd(ctx, m, 1, hin, &m->w[F2W], &m->w[F2B], &v->logits, NT_ACT_NONE);
  return st;
}

static nt_status check_labels(nt_ctx *ctx, const nt_cnn *m, const nt_tensor *labels) {
  if (labels->ndim != 1 || labels->dtype != NT_I32 || labels->shape[0] != m->n)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "CNN labels must be I32 [%d]", m->n);
  return NT_OK;
}

nt_status nt_cnn_eval(nt_ctx *ctx, nt_cnn *m, const nt_tensor *images, const nt_tensor *labels,
                      nt_tensor *logits) {
  views v;
  nt_status st = forward(ctx, m, images, false, &v, NULL);
  if (!st && labels) {
    nt_tensor losses = nt_prefix_view(&m->losses, 1, v.logits.shape);
    st = check_labels(ctx, m, labels);
    if (!st) st = nt_cross_entropy_forward(ctx, &v.logits, labels, &losses);
    if (!st) st = nt_mean(ctx, &losses, &m->loss);
  }
  if (!st && logits) *logits = v.logits;
  return st;
}

/* The conv's backward: dx overwritten (it must not alias dy or x; NULL: not needed), the fp32
 * weight and bias gradients accumulated. relu_x: x is the previous layer's ReLU output, and dx
 * is written masked by x > 0, the gradient of that ReLU's input, so the previous layer's
 * backward reads its dy as it is (no mask pass, no mask tile in its kernels). */
static nt_status conv_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                               const nt_tensor *w, nt_tensor *dx, bool relu_x, nt_tensor *dw,
                               nt_tensor *db) {
  nt_conv2d_params cp = {1, 1};
  return nt_conv2d_nhwc_backward(ctx, dy, NULL, x, w, dx, relu_x ? x : NULL, dw, db, cp);
}

/* out = dy where y > 0, else 0 (out must not alias dy). */
static nt_status relu_mask(nt_ctx *ctx, const nt_tensor *y, const nt_tensor *dy, nt_tensor *out) {
  nt_status st = nt_tensor_zero(ctx, out);
  return st ? st : nt_relu_backward(ctx, y, dy, out);
}

nt_status nt_cnn_train_step(nt_ctx *ctx, nt_cnn *m, const nt_tensor *images,
                            const nt_tensor *labels, const float *dloss_scale,
                            const nt_unit_hooks *hooks) {
  views v;
  nt_status st = forward(ctx, m, images, true, &v, hooks);
  if (!st) st = check_labels(ctx, m, labels);
  if (st) return st;
  const nt_cnn_config *c = &m->cfg;
  int64_t n = m->n, H = c->height, W = c->width;
  nt_tensor losses = nt_prefix_view(&m->losses, 1, &n);
  st = nt_cross_entropy_fused(ctx, &v.logits, labels, dloss_scale, n, &losses, &v.logits);
  if (!st) st = nt_mean(ctx, &losses, &m->loss);
  bool drop = c->dropout > 0.0f;
  nt_tensor dh = v2(&m->dh, n, c->hidden), dh2 = v2(&m->dh2, n, c->hidden);
  /* The gradient maps alternate between the scratch buffers sa and sb: each op reads one and
   * writes the other (views of both at each stage's shapes; dp2 is NCHW like p2). */
  nt_tensor dp2f = v2(&m->sa, n, feat(c)), dp2 = v4(&m->sa, n, c->c2, H / 4, W / 4);
  nt_tensor sA2 = v4(&m->sa, n, H / 2, W / 2, c->c2), sB2 = v4(&m->sb, n, H / 2, W / 2, c->c2);
  nt_tensor sA1 = v4(&m->sa, n, H, W, c->c1), sB1 = v4(&m->sb, n, H, W, c->c1);
  nt_tensor sBp = v4(&m->sb, n, H / 2, W / 2, c->c1);
  /* head */
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[2], nt_unit_before_backward);
  if (!st) st = lin_bwd(ctx, m, 1, &v.logits, drop ? &v.hd : &v.h, &m->w[F2W], &dh,
                                   &m->g[F2W], &m->g[F2B]);
  nt_tensor *dhr = &dh;
  if (drop) {
    if (!st) st = nt_tensor_zero(ctx, &dh2);
    if (!st) st = nt_dropout_backward(ctx, &dh, &dh2, c->dropout, nt_ctx_seed(ctx), m->drop_off);
    dhr = &dh2;
  }
  nt_tensor dpre = drop ? dh : dh2;   /* the buffer not holding d(h) */
  if (!st) st = relu_mask(ctx, &v.h, dhr, &dpre);
  if (!st) st = lin_bwd(ctx, m, 0, &dpre, &v.p2f, &m->w[F1W], &dp2f, &m->g[F1W],
                                   &m->g[F1B]);                                    /* d p2 */
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[2], nt_unit_grads_ready);
  /* stage 2, then stage 1 */
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[1], nt_unit_before_backward);
  /* d z4 = pool backward of dp2 masked by p2 > 0 (relu' of the unsaved a4) */
  if (!st) st = nt_maxpool2d_nhwc_backward(ctx, &dp2, &v.arg2, &v.p2, &sB2, 2, true);
  if (!st) st = conv_backward(ctx, &sB2, &v.a3, &m->w[W4], &sA2, true, &m->g[W4],
                              &m->g[B4]);                                          /* d z3 */
  if (!st) st = conv_backward(ctx, &sA2, &v.p1, &m->w[W3], &sBp, false, &m->g[W3],
                              &m->g[B3]);                                          /* d p1 */
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[1], nt_unit_grads_ready);
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[0], nt_unit_before_backward);
  if (!st) st = nt_maxpool2d_nhwc_backward(ctx, &sBp, &v.arg1, &v.p1, &sA1, 2, false); /* d z2 */
  if (!st) st = conv_backward(ctx, &sA1, &v.a1, &m->w[W2], &sB1, true, &m->g[W2],
                              &m->g[B2]);                                          /* d z1 */
  if (!st) st = conv_backward(ctx, &sB1, &v.x, &m->w[W1], NULL, false, &m->g[W1],
                              &m->g[B1]);
  if (!st) st = unit_hook(ctx, m, hooks, m->unit[0], nt_unit_grads_ready);
  if (!st && m->fp8) st = nt_fp8_update(ctx, m->fp8);
  return st;
}
