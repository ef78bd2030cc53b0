/* The CNN's conv / maxpool ops at its training shapes (batch 256 by default, Fashion-MNIST
 * 28x28), each timed alone, and the whole model's forward + backward as a sequence of op calls
 * (no loss, no optimizer): how far the ops are from the training step time.
 *
 *   bench_cnn_ops [--dtype f16|bf16|f32|all] [--batch 256] [--repeats 20] [--steps 20]
 *
 * Model: conv3x3 1->32, ReLU, conv 32->32, ReLU, maxpool 2, conv 32->64, ReLU, conv 64->64,
 * ReLU, maxpool 2, linear 3136->256, ReLU, linear 256->10. Weights and activations in the
 * dtype, biases F32, weight/bias gradients F32 (the fp32 master gradients; TF32 allowed for
 * f32, as cuDNN's default). Each op runs `steps` times per sample between CUDA events; the
 * median over `repeats` samples, per call, after warm-up. "graph": the `steps` calls captured
 * in one CUDA graph and replayed (launch overhead excluded); "eager": launched from the host.
 * Lines: "RESULT nt dtype op mode ms". The ops are the model's, channels last (ops/conv2d_nhwc.h:
 * implicit-GEMM tensor-core kernels): convI fwd, convI fwd_relu, conv2 / conv4 fwd_relu_pool
 * (the pool fused into the conv, the model's call), convI dx (conv2 / conv4 write it masked by
 * their input, as the model), convI dw_db, poolI fwd (pool2 writes NCHW), poolI bwd (masked by
 * the pool's output), model fwd_bwd (models/cnn.c's sequence of calls). The NCHW im2col path
 * this replaced measured 1.81 ms for model fwd_bwd at batch 256 (f16, graph) against 0.72 ms
 * (H200, session 12). */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "ops/conv2d_nhwc.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

static int NB = 256;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

typedef nt_status (*op_fn)(nt_ctx *, void *);

/* Median ms per call of fn: `steps` calls per sample, eagerly or replayed as one CUDA graph. */
static nt_status time_op(nt_ctx *ctx, op_fn fn, void *arg, bool graph, int repeats, int steps,
                         float *ms) {
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  cudaGraph_t g = NULL;
  cudaGraphExec_t ge = NULL;
  nt_event *e0 = NULL, *e1 = NULL;
  float *t = calloc((size_t)repeats, sizeof *t);
  nt_status st = t ? nt_event_create(ctx, &e0, true) : NT_ERR_OOM;
  if (!st) st = nt_event_create(ctx, &e1, true);
  for (int i = 0; !st && i < 3; i++) st = fn(ctx, arg);   /* warm-up: plans, pool blocks */
  if (!st) st = nt_ctx_synchronize(ctx);
  if (!st && graph) {
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      st = NT_ERROR(ctx, NT_ERR_CUDA, "cudaStreamBeginCapture failed");
    for (int i = 0; !st && i < steps; i++) st = fn(ctx, arg);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (!st && (e != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess))
      st = NT_ERROR(ctx, NT_ERR_CUDA, "graph capture failed: %s", cudaGetErrorString(e));
    (void)cudaGetLastError();
    if (!st && cudaGraphLaunch(ge, s) != cudaSuccess)  /* warm-up replay */
      st = NT_ERROR(ctx, NT_ERR_CUDA, "graph launch failed");
  }
  for (int r = 0; !st && r < repeats; r++) {
    st = nt_event_record(ctx, e0, NULL);
    if (graph) {
      if (!st && cudaGraphLaunch(ge, s) != cudaSuccess)
        st = NT_ERROR(ctx, NT_ERR_CUDA, "graph launch failed");
    } else {
      for (int i = 0; !st && i < steps; i++) st = fn(ctx, arg);
    }
    if (!st) st = nt_event_record(ctx, e1, NULL);
    if (!st) st = nt_event_synchronize(ctx, e1);
    if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &t[r]);
    t[r] /= (float)steps;
  }
  if (!st) {
    qsort(t, (size_t)repeats, sizeof *t, cmp_float);
    *ms = t[repeats / 2];
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  free(t);
  return st;
}

/* Every tensor of the model: activations, their gradients, parameters and gradients. */
typedef struct {
  nt_dtype dt;
  nt_tensor x, a1, a2, p1, a3, a4, p2, h, logits;
  nt_tensor arg1, arg2;
  nt_tensor w[4], b[4], dw[4], db[4];                  /* convolutions */
  nt_tensor fw1, fb1, fw2, fb2, dfw1, dfb1, dfw2, dfb2; /* linear layers */
  nt_tensor dlogits, dh, dpre, dflat, da4, da3, dp1, da2, da1;
} model;

static const int CIN[4] = {1, 32, 32, 64}, COUT[4] = {32, 32, 64, 64}, HW[4] = {28, 28, 14, 14};

static nt_status mk(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int ndim, int64_t a, int64_t b,
                    int64_t c, int64_t d, uint64_t seed, float std) {
  const int64_t s[4] = {a, b, c, d};
  nt_tensor f = {0};
  nt_status st = nt_tensor_alloc(ctx, t, dt, ndim, s);
  if (st || std == 0.0f) return st ? st : nt_tensor_zero(ctx, t);
  if ((st = nt_tensor_alloc(ctx, &f, NT_F32, ndim, s))) return st;
  st = nt_rng_normal(ctx, &f, seed, 0, 0.0f, std);
  if (!st) st = nt_convert(ctx, t, &f);
  nt_tensor_free(ctx, &f);
  return st;
}

static nt_status model_init(nt_ctx *ctx, model *m, nt_dtype dt) {
  memset(m, 0, sizeof *m);
  m->dt = dt;
  nt_status st = mk(ctx, &m->x, dt, 4, NB, 1, 28, 28, 1, 1.0f);
  nt_tensor *acts[4] = {&m->a1, &m->a2, &m->a3, &m->a4};
  for (int i = 0; !st && i < 4; i++) {
    st = mk(ctx, acts[i], dt, 4, NB, COUT[i], HW[i], HW[i], 10 + i, 1.0f);
    if (!st) st = mk(ctx, &m->w[i], dt, 4, COUT[i], CIN[i], 3, 3, 20 + i, 0.1f);
    if (!st) st = mk(ctx, &m->b[i], NT_F32, 1, COUT[i], 0, 0, 0, 30 + i, 0.1f);
    if (!st) st = mk(ctx, &m->dw[i], NT_F32, 4, COUT[i], CIN[i], 3, 3, 0, 0.0f);
    if (!st) st = mk(ctx, &m->db[i], NT_F32, 1, COUT[i], 0, 0, 0, 0, 0.0f);
  }
  if (!st) st = mk(ctx, &m->p1, dt, 4, NB, 32, 14, 14, 40, 1.0f);
  if (!st) st = mk(ctx, &m->p2, dt, 4, NB, 64, 7, 7, 41, 1.0f);
  if (!st) st = mk(ctx, &m->arg1, NT_I32, 4, NB, 32, 14, 14, 0, 0.0f);
  if (!st) st = mk(ctx, &m->arg2, NT_I32, 4, NB, 64, 7, 7, 0, 0.0f);
  if (!st) st = mk(ctx, &m->h, dt, 2, NB, 256, 0, 0, 42, 1.0f);
  if (!st) st = mk(ctx, &m->logits, dt, 2, NB, 10, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->fw1, dt, 2, 256, 3136, 0, 0, 43, 0.02f);
  if (!st) st = mk(ctx, &m->fb1, NT_F32, 1, 256, 0, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->fw2, dt, 2, 10, 256, 0, 0, 44, 0.05f);
  if (!st) st = mk(ctx, &m->fb2, NT_F32, 1, 10, 0, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dfw1, NT_F32, 2, 256, 3136, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dfb1, NT_F32, 1, 256, 0, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dfw2, NT_F32, 2, 10, 256, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dfb2, NT_F32, 1, 10, 0, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dlogits, dt, 2, NB, 10, 0, 0, 45, 0.01f);
  if (!st) st = mk(ctx, &m->dh, dt, 2, NB, 256, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dpre, dt, 2, NB, 256, 0, 0, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dflat, dt, 4, NB, 64, 7, 7, 0, 0.0f);
  if (!st) st = mk(ctx, &m->da4, dt, 4, NB, 64, 14, 14, 0, 0.0f);
  if (!st) st = mk(ctx, &m->da3, dt, 4, NB, 64, 14, 14, 0, 0.0f);
  if (!st) st = mk(ctx, &m->dp1, dt, 4, NB, 32, 14, 14, 0, 0.0f);
  if (!st) st = mk(ctx, &m->da2, dt, 4, NB, 32, 28, 28, 0, 0.0f);
  if (!st) st = mk(ctx, &m->da1, dt, 4, NB, 32, 28, 28, 0, 0.0f);
  /* argmax for the pool backward ops timed alone (channels-last views, as lay() below) */
  const int64_t s2[4] = {NB, 28, 28, 32}, s1[4] = {NB, 14, 14, 32}, s4[4] = {NB, 14, 14, 64};
  nt_tensor a2 = nt_tensor_view(m->a2.data, dt, m->a2.device, 4, s2),
            p1 = nt_tensor_view(m->p1.data, dt, m->p1.device, 4, s1),
            g1 = nt_tensor_view(m->arg1.data, NT_I32, m->arg1.device, 4, s1),
            a4 = nt_tensor_view(m->a4.data, dt, m->a4.device, 4, s4);
  if (!st) st = nt_maxpool2d_nhwc_forward(ctx, &a2, &p1, &g1, 2, false);
  if (!st) st = nt_maxpool2d_nhwc_forward(ctx, &a4, &m->p2, &m->arg2, 2, true);
  return st;
}

static void model_free(nt_ctx *ctx, model *m) {
  nt_tensor *all[] = {&m->x, &m->a1, &m->a2, &m->p1, &m->a3, &m->a4, &m->p2, &m->h, &m->logits,
                      &m->arg1, &m->arg2, &m->fw1, &m->fb1, &m->fw2, &m->fb2, &m->dfw1,
                      &m->dfb1, &m->dfw2, &m->dfb2, &m->dlogits, &m->dh, &m->dpre, &m->dflat,
                      &m->da4, &m->da3, &m->dp1, &m->da2, &m->da1};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) nt_tensor_free(ctx, all[i]);
  for (int i = 0; i < 4; i++) {
    nt_tensor_free(ctx, &m->w[i]);
    nt_tensor_free(ctx, &m->b[i]);
    nt_tensor_free(ctx, &m->dw[i]);
    nt_tensor_free(ctx, &m->db[i]);
  }
}

/* t ([N, C, H, W] as allocated) viewed as [N, H, W, C]: the same buffer, channels last. p2 and
 * its gradient stay NCHW (the last pool writes it). */
static nt_tensor lay(const nt_tensor *t) {
  if (t->ndim != 4) return *t;
  const int64_t s[4] = {t->shape[0], t->shape[2], t->shape[3], t->shape[1]};
  return nt_tensor_view(t->data, t->dtype, t->device, 4, s);
}

/* The input and output activation of conv i, and the input's gradient (NULL for conv 0). */
static void conv_io(model *m, int i, nt_tensor *in, nt_tensor *out, nt_tensor *din) {
  nt_tensor *ins[4] = {&m->x, &m->a1, &m->p1, &m->a3}, *outs[4] = {&m->a1, &m->a2, &m->a3, &m->a4};
  nt_tensor *dins[4] = {NULL, &m->da1, &m->dp1, &m->da3};
  *in = lay(ins[i]);
  *out = lay(outs[i]);
  *din = dins[i] ? lay(dins[i]) : (nt_tensor){0};
}

static nt_status conv_fwd(nt_ctx *ctx, model *m, int i, bool relu) {
  nt_tensor in, out, din;
  conv_io(m, i, &in, &out, &din);
  nt_conv2d_params p = {1, 1};
  return nt_conv2d_nhwc_forward(ctx, &in, &m->w[i], &m->b[i], &out, p, relu);
}

/* The conv's backward from dout into dx (i > 0 and want_dx), dw and db (want_dw), as the model
 * calls it: dy already masked (by the pool's backward for conv2 / conv4, by the next conv's dx
 * write for conv1 / conv3), conv2 / conv4 write dx masked by their input a1 / a3. */
static nt_status conv_bwd(nt_ctx *ctx, model *m, int i, const nt_tensor *dout, bool want_dx,
                          bool want_dw) {
  nt_tensor in, out, din, dy = lay(dout);
  conv_io(m, i, &in, &out, &din);
  nt_conv2d_params p = {1, 1};
  nt_tensor *dx = want_dx && i > 0 ? &din : NULL, *dw = want_dw ? &m->dw[i] : NULL,
            *db = want_dw ? &m->db[i] : NULL;
  return nt_conv2d_nhwc_backward(ctx, &dy, NULL, &in, &m->w[i], dx, i % 2 ? &in : NULL, dw, db,
                                 p);
}

static nt_status pool_fwd(nt_ctx *ctx, model *m, int i) {
  nt_tensor *x = i ? &m->a4 : &m->a2, *y = i ? &m->p2 : &m->p1, *am = i ? &m->arg2 : &m->arg1;
  nt_tensor xh = lay(x), yh = i ? *y : lay(y), amh = i ? *am : lay(am);
  return nt_maxpool2d_nhwc_forward(ctx, &xh, &yh, &amh, 2, i == 1);
}

/* Conv i (1 or 3) + ReLU + pool (i / 2) in one op, as the model runs them. */
static nt_status conv_pool_fwd(nt_ctx *ctx, model *m, int i) {
  nt_tensor in, out, din;
  conv_io(m, i, &in, &out, &din);
  nt_conv2d_params p = {1, 1};
  const int k = i / 2;
  nt_tensor *y = k ? &m->p2 : &m->p1, *am = k ? &m->arg2 : &m->arg1;
  nt_tensor yh = k ? *y : lay(y), amh = k ? *am : lay(am);
  return nt_conv2d_nhwc_pool_forward(ctx, &in, &m->w[i], &m->b[i], &yh, &amh, p, true, k == 1,
                                     NULL);
}

/* dy (p's gradient) -> dx (the pooled map's), masked by p > 0, dx overwritten. */
static nt_status pool_bwd(nt_ctx *ctx, model *m, int i) {
  nt_tensor *dy = i ? &m->dflat : &m->dp1, *dx = i ? &m->da4 : &m->da2;
  nt_tensor *y = i ? &m->p2 : &m->p1, *am = i ? &m->arg2 : &m->arg1;
  nt_tensor dyh = i ? *dy : lay(dy), yh = i ? *y : lay(y), amh = i ? *am : lay(am);
  nt_tensor dxh = lay(dx);
  return nt_maxpool2d_nhwc_backward(ctx, &dyh, &amh, &yh, &dxh, 2, i == 1);
}

static nt_status linear(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *w, const nt_tensor *b,
                        nt_tensor *d, nt_gemm_epilogue e) {
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  o.epilogue = e;
  o.bias = b;
  return nt_gemm(ctx, a, w, d, &o);
}

/* dW += dY^T @ X, db += colsum(dY) (nt_gemm_bias_grad, as nt_linear_backward); dX = dY @ W. */
static nt_status linear_bwd(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                            const nt_tensor *w, nt_tensor *dw, nt_tensor *db, nt_tensor *dx) {
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_a = true;
  o.beta = 1.0f;
  nt_status st = nt_gemm(ctx, dy, x, dw, &o);
  if (!st) st = nt_gemm_bias_grad(ctx, dy, db);
  if (st || !dx) return st;
  nt_gemm_opts o2 = nt_gemm_defaults();
  return nt_gemm(ctx, dy, w, dx, &o2);
}

static nt_status model_step(nt_ctx *ctx, void *arg) {
  model *m = arg;
  const int64_t flat_s[2] = {NB, 3136};
  nt_tensor flat, dflat;
  nt_status st = NT_OK;
  /* conv2 and conv4 with their pools fused, as models/cnn.c */
  for (int k = 0; !st && k < 2; k++) {
    st = conv_fwd(ctx, m, 2 * k, true);
    if (!st) st = conv_pool_fwd(ctx, m, 2 * k + 1);
  }
  if (!st) st = nt_tensor_reshape(ctx, &m->p2, 2, flat_s, &flat);
  if (!st) st = nt_tensor_reshape(ctx, &m->dflat, 2, flat_s, &dflat);
  if (!st) st = linear(ctx, &flat, &m->fw1, &m->fb1, &m->h, NT_EPI_RELU);
  if (!st) st = linear(ctx, &m->h, &m->fw2, &m->fb2, &m->logits, NT_EPI_BIAS);
  /* backward from a fixed dlogits (the loss is not part of this benchmark) */
  if (!st) st = linear_bwd(ctx, &m->dlogits, &m->h, &m->fw2, &m->dfw2, &m->dfb2, &m->dh);
  if (!st) st = nt_tensor_zero(ctx, &m->dpre);
  if (!st) st = nt_relu_backward(ctx, &m->h, &m->dh, &m->dpre);
  if (!st) st = linear_bwd(ctx, &m->dpre, &flat, &m->fw1, &m->dfw1, &m->dfb1, &dflat);
  if (!st) st = pool_bwd(ctx, m, 1);
  if (!st) st = conv_bwd(ctx, m, 3, &m->da4, true, true);
  if (!st) st = conv_bwd(ctx, m, 2, &m->da3, true, true);
  if (!st) st = pool_bwd(ctx, m, 0);
  if (!st) st = conv_bwd(ctx, m, 1, &m->da2, true, true);
  if (!st) st = conv_bwd(ctx, m, 0, &m->da1, false, true);
  return st;
}

typedef struct { model *m; int i; } op_arg;
static nt_status op_fwd(nt_ctx *c, void *a) {
  op_arg *o = a;
  return conv_fwd(c, o->m, o->i, false);
}
static nt_status op_fwd_relu(nt_ctx *c, void *a) {
  op_arg *o = a;
  return conv_fwd(c, o->m, o->i, true);
}
static nt_status op_dx(nt_ctx *c, void *a) {
  op_arg *o = a;
  nt_tensor *outs[4] = {&o->m->a1, &o->m->a2, &o->m->a3, &o->m->a4};
  return conv_bwd(c, o->m, o->i, outs[o->i], true, false);
}
static nt_status op_dw(nt_ctx *c, void *a) {
  op_arg *o = a;
  nt_tensor *outs[4] = {&o->m->a1, &o->m->a2, &o->m->a3, &o->m->a4};
  return conv_bwd(c, o->m, o->i, outs[o->i], false, true);
}
static nt_status op_conv_pool(nt_ctx *c, void *a) {
  op_arg *o = a;
  return conv_pool_fwd(c, o->m, o->i);
}
static nt_status op_pool_fwd(nt_ctx *c, void *a) {
  op_arg *o = a;
  return pool_fwd(c, o->m, o->i);
}
static nt_status op_pool_bwd(nt_ctx *c, void *a) {
  op_arg *o = a;
  return pool_bwd(c, o->m, o->i);
}

static nt_status report(nt_ctx *ctx, const char *dt, const char *op, op_fn fn, void *arg,
                        int repeats, int steps) {
  for (int g = 1; g >= 0; g--) {
    float ms = 0;
    nt_status st = time_op(ctx, fn, arg, g == 1, repeats, steps, &ms);
    if (st) {
      fprintf(stderr, "%s %s %s: %s\n", dt, op, g ? "graph" : "eager", nt_status_str(st));
      return st;
    }
    printf("RESULT nt %s %s %s %.4f\n", dt, op, g ? "graph" : "eager", ms);
    fflush(stdout);
  }
  return NT_OK;
}

static nt_status run_dtype(nt_ctx *ctx, nt_dtype dt, int repeats, int steps) {
  model m;
  const char *dn = nt_dtype_name(dt);
  char name[64];
  nt_status st = model_init(ctx, &m, dt);
  for (int i = 0; !st && i < 4; i++) {
    op_arg a = {&m, i};
    snprintf(name, sizeof name, "conv%d_fwd", i + 1);
    st = report(ctx, dn, name, op_fwd, &a, repeats, steps);
    snprintf(name, sizeof name, "conv%d_fwd_relu", i + 1);
    if (!st) st = report(ctx, dn, name, op_fwd_relu, &a, repeats, steps);
    snprintf(name, sizeof name, "conv%d_fwd_relu_pool", i + 1);
    if (!st && i % 2) st = report(ctx, dn, name, op_conv_pool, &a, repeats, steps);
    snprintf(name, sizeof name, "conv%d_dx", i + 1);
    if (!st && i > 0) st = report(ctx, dn, name, op_dx, &a, repeats, steps);
    snprintf(name, sizeof name, "conv%d_dw_db", i + 1);
    if (!st) st = report(ctx, dn, name, op_dw, &a, repeats, steps);
  }
  for (int i = 0; !st && i < 2; i++) {
    op_arg a = {&m, i};
    snprintf(name, sizeof name, "pool%d_fwd", i + 1);
    st = report(ctx, dn, name, op_pool_fwd, &a, repeats, steps);
    snprintf(name, sizeof name, "pool%d_bwd", i + 1);
    if (!st) st = report(ctx, dn, name, op_pool_bwd, &a, repeats, steps);
  }
  if (!st) st = report(ctx, dn, "model_fwd_bwd", model_step, &m, repeats, steps);
  model_free(ctx, &m);
  return st;
}

int main(int argc, char **argv) {
  int repeats = 20, steps = 20;
  const char *dts = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--dtype")) dts = argv[i + 1];
    else if (!strcmp(argv[i], "--batch")) NB = atoi(argv[i + 1]);
  }
  if (repeats < 1 || steps < 1 || NB < 1) {
    fprintf(stderr, "bench_cnn_ops: --repeats, --steps and --batch must be >= 1\n");
    return 2;
  }
  nt_ctx *ctx = NULL;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "bench_cnn_ops: no CUDA context: %s\n", ctx ? nt_last_error(ctx) : "");
    nt_ctx_free(ctx);
    return 1;
  }
  nt_ctx_set_allow_tf32(ctx, true);
  const nt_dtype all[3] = {NT_F16, NT_BF16, NT_F32};
  nt_status st = NT_OK;
  for (int d = 0; d < 3 && !st; d++) {
    if (strcmp(dts, "all") && strcmp(dts, nt_dtype_name(all[d]))) continue;
    st = run_dtype(ctx, all[d], repeats, steps);
    if (st) fprintf(stderr, "bench_cnn_ops: %s\n", nt_last_error(ctx));
  }
  nt_ctx_free(ctx);
  return st ? 1 : 0;
}
