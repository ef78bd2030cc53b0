/* A/B of the GPT step's layer-level alternatives at the exact shapes of shakespeare_char
 * (64 x 256 tokens, C 384) and GPT-2 124M (16 x 1024 tokens, C 768), bf16, through the
 * library's own calls (issue 22):
 *   - a linear layer's weight + bias gradient: the plain dW GEMM plus nt_gemm_bias_grad
 *     (column sums of dy), and each part alone; the dW GEMM with the bias gradient fused
 *     (cuBLASLt's BGRADB, the path before session 12) measured slower at every layer
 *     (bench/RESULTS.md, session 12) and was removed from the library;
 *   - mlp.c_proj's dx GEMM through GELU: DGELU, DGELU + the column sums (c_fc's bias
 *     gradient), and the plain product (what the epilogue costs); cuBLASLt's DGELU_BGRAD
 *     (the bias gradient from the same epilogue) measured 245 us against DGELU + column sums'
 *     177 us at GPT-2's shape on the H200 (session 12) and was dropped;
 *   - a projection followed by the residual add: BIAS epilogue + nt_add against the residual
 *     as the GEMM's C operand (one launch);
 *   - the GELU recompute the backward no longer does (nt_gelu_forward at [R, 4C]), and the
 *     LayerNorm backward (its dweight/dbias finalize included);
 *   - shakespeare_char's head (vocabulary 65): its three GEMMs with the logits' rows 65
 *     elements apart (130 bytes: no aligned tensor-core kernel) against 72 (the padded row
 *     stride the GPU model now uses).
 * A weight gradient split along K (the tokens) by hand, as S batched products into fp32
 * partials summed afterwards, was slower than cuBLASLt's choice for every layer of both
 * models at S = 4, 8 and 16 (bench/RESULTS.md, session 17) and was removed from this bench.
 *
 *   bench_gpt_layers [--model small|gpt2|all] [--windows 9] [--cases SUBSTRING]
 *
 * Each case is captured into a CUDA graph of `inner` calls (inputs rotated over copies that
 * together exceed the L2 cache, so operands come from HBM as in the step), replayed `windows`
 * times between CUDA events after warm-up (which also builds and autotunes the GEMM plans);
 * the table gives the median microseconds per call, one line per case:
 *   "CASE model name us". */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define ROT 4

/* Buffers of one rotation: a [R, 4C] activation, gradient, pre-activation and output, a
 * [R, C] residual, weights [4C, 4C]-sized, fp32 weight and bias gradients, LN statistics. */
typedef struct {
  nt_tensor x, dy, pre, out, res, w, dw, db, mean, rstd, lnw;
} bufs;

typedef struct {
  int64_t R, C;
  bufs b[ROT];
} setup;

/* Views [rows, cols] at the start of a buffer. */
static nt_tensor v2(const nt_tensor *t, int64_t rows, int64_t cols) {
  return nt_tensor_view(t->data, t->dtype, t->device, 2, (int64_t[]){rows, cols});
}
static nt_tensor v1(const nt_tensor *t, int64_t n) {
  return nt_tensor_view(t->data, t->dtype, t->device, 1, &n);
}

typedef struct {
  const char *name;
  int in_mul, out_mul; /* the layer: in = in_mul * C, out = out_mul * C */
  int kind;
} bench_case;

enum {
  K_WGRAD_SPLIT,   /* plain dW GEMM + nt_gemm_bias_grad */
  K_WGRAD_PLAIN,   /* plain dW GEMM alone */
  K_COLSUM,        /* nt_gemm_bias_grad alone */
  K_DGELU,         /* dx GEMM, DGELU epilogue */
  K_DGELU_COLSUM,  /* DGELU + nt_gemm_bias_grad of dx */
  K_DX_PLAIN,      /* the same dx GEMM without an epilogue (what the epilogue costs) */
  K_FWD_ADD,       /* BIAS epilogue into scratch + nt_add */
  K_FWD_RES,       /* BIAS epilogue with the residual as C */
  K_GELU,          /* nt_gelu_forward [R, 4C] */
  K_LN_BWD,        /* nt_layernorm_backward [R, C] */
  K_HEAD65,        /* the char head's forward, dx and dW GEMMs, logits rows 65 apart */
  K_HEAD72         /* the same, rows 72 apart */
};

static const bench_case cases[] = {
    {"qkv.dW+db.plain+colsum", 1, 3, K_WGRAD_SPLIT},
    {"qkv.dW.plain", 1, 3, K_WGRAD_PLAIN},
    {"qkv.db.colsum", 1, 3, K_COLSUM},
    {"proj.dW+db.plain+colsum", 1, 1, K_WGRAD_SPLIT},
    {"proj.dW.plain", 1, 1, K_WGRAD_PLAIN},
    {"proj.db.colsum", 1, 1, K_COLSUM},
    {"fc.dW+db.plain+colsum", 1, 4, K_WGRAD_SPLIT},
    {"fc.dW.plain", 1, 4, K_WGRAD_PLAIN},
    {"fc.db.colsum", 1, 4, K_COLSUM},
    {"fcproj.dW+db.plain+colsum", 4, 1, K_WGRAD_SPLIT},
    {"fcproj.dW.plain", 4, 1, K_WGRAD_PLAIN},
    {"fcproj.db.colsum", 4, 1, K_COLSUM},
    {"fcproj.dx.dgelu", 4, 1, K_DGELU},
    {"fcproj.dx.dgelu+colsum", 4, 1, K_DGELU_COLSUM},
    {"fcproj.dx.plain", 4, 1, K_DX_PLAIN},
    {"proj.fwd.bias+add", 1, 1, K_FWD_ADD},
    {"proj.fwd.bias+residual_c", 1, 1, K_FWD_RES},
    {"fcproj.fwd.bias+add", 4, 1, K_FWD_ADD},
    {"fcproj.fwd.bias+residual_c", 4, 1, K_FWD_RES},
    {"mlp.gelu_recompute", 1, 4, K_GELU},
    {"ln.backward", 1, 1, K_LN_BWD},
    {"head65.fwd+dx+dW.ld65", 0, 0, K_HEAD65},
    {"head65.fwd+dx+dW.ld72", 0, 0, K_HEAD72},
};

/* One call of case c on rotation r. */
static nt_status run_case(nt_ctx *ctx, setup *s, const bench_case *c, int r) {
  bufs *b = &s->b[r];
  int64_t R = s->R, in = c->in_mul * s->C, out = c->out_mul * s->C;
  nt_tensor x = v2(&b->x, R, in), dy = v2(&b->dy, R, out), w = v2(&b->w, out, in);
  nt_tensor dw = v2(&b->dw, out, in), db = v1(&b->db, out), dbin = v1(&b->db, in);
  nt_tensor dx = v2(&b->out, R, in), pre = v2(&b->pre, R, in);
  nt_gemm_opts o = nt_gemm_defaults();
  nt_status st = NT_OK;
  switch (c->kind) {
    case K_WGRAD_SPLIT:
    case K_WGRAD_PLAIN:
      o.trans_a = true;
      o.beta = 1.0f;
      st = nt_gemm(ctx, &dy, &x, &dw, &o);
      if (!st && c->kind == K_WGRAD_SPLIT) st = nt_gemm_bias_grad(ctx, &dy, &db);
      return st;
    case K_COLSUM: return nt_gemm_bias_grad(ctx, &dy, &db);
    case K_DX_PLAIN: return nt_gemm(ctx, &dy, &w, &dx, &o);
    case K_DGELU:
    case K_DGELU_COLSUM:
      o.aux = &pre;
      o.epilogue = NT_EPI_DGELU;
      st = nt_gemm(ctx, &dy, &w, &dx, &o);
      if (!st && c->kind == K_DGELU_COLSUM) st = nt_gemm_bias_grad(ctx, &dx, &dbin);
      return st;
    case K_FWD_ADD:
    case K_FWD_RES: {
      nt_tensor y = v2(&b->out, R, out), res = v2(&b->res, R, out), bias = v1(&b->lnw, out);
      nt_tensor yo = v2(&b->dy, R, out);
      if (c->kind == K_FWD_RES) {
        nt_linear_fwd_opts fo = {.residual = &res};
        return nt_linear_forward_ex(ctx, &x, &w, &bias, &yo, NT_ACT_NONE, NULL, &fo);
      }
      st = nt_linear_forward(ctx, &x, &w, &bias, &y, NT_ACT_NONE, NULL);
      if (!st) st = nt_add(ctx, &res, &y, &yo);
      return st;
    }
    case K_GELU: {
      nt_tensor a = v2(&b->pre, R, out), g = v2(&b->out, R, out);
      return nt_gelu_forward(ctx, &a, &g);
    }
    case K_LN_BWD: {
      nt_tensor lx = v2(&b->x, R, in), ly = v2(&b->dy, R, in), ldx = v2(&b->out, R, in);
      nt_tensor lw = v1(&b->lnw, in), ldw = v1(&b->dw, in), ldb = v1(&b->db, in);
      nt_tensor m = v1(&b->mean, R), rs = v1(&b->rstd, R);
      return nt_layernorm_backward(ctx, &ly, &lx, &lw, &m, &rs, &ldx, &ldw, &ldb);
    }
    case K_HEAD65:
    case K_HEAD72: {
      const int64_t V = 65, C = s->C;
      nt_tensor lnf = v2(&b->x, R, C), wte = v2(&b->w, V, C), dlnf = v2(&b->dy, R, C);
      nt_tensor dwte = v2(&b->dw, V, C), logits = v2(&b->out, R, V);
      logits.stride[0] = c->kind == K_HEAD72 ? 72 : V;
      o.trans_b = true;
      st = nt_gemm(ctx, &lnf, &wte, &logits, &o);
      o = nt_gemm_defaults();
      if (!st) st = nt_gemm(ctx, &logits, &wte, &dlnf, &o);
      o.trans_a = true;
      o.beta = 1.0f;
      if (!st) st = nt_gemm(ctx, &logits, &lnf, &dwte, &o);
      return st;
    }
  }
  return NT_ERR_INVALID_ARG;
}

static nt_status rand_fill(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int nd, const int64_t *shape,
                           uint64_t seed, float std) {
  nt_tensor f;
  nt_status st = nt_tensor_alloc(ctx, t, dt, nd, shape);
  if (st) return st;
  if ((st = nt_tensor_alloc(ctx, &f, NT_F32, nd, shape))) return st;
  st = nt_rng_normal(ctx, &f, seed, 0, 0.0f, std);
  if (!st) st = nt_convert(ctx, t, &f);
  if (!st) st = nt_ctx_synchronize(ctx);
  nt_tensor_free(ctx, &f);
  return st;
}

static nt_status setup_alloc(nt_ctx *ctx, setup *s, int64_t R, int64_t C) {
  memset(s, 0, sizeof *s);
  s->R = R;
  s->C = C;
  nt_status st = NT_OK;
  int64_t big[2] = {R, 4 * C}, small[2] = {R, C}, wsh[2] = {4 * C, 4 * C}, v[1] = {4 * C},
          rows[1] = {R};
  for (int r = 0; r < ROT && !st; r++) {
    bufs *b = &s->b[r];
    uint64_t k = 100 * (uint64_t)r;
    if (!st) st = rand_fill(ctx, &b->x, NT_BF16, 2, big, k + 1, 1.0f);
    if (!st) st = rand_fill(ctx, &b->dy, NT_BF16, 2, big, k + 2, 1.0f);
    if (!st) st = rand_fill(ctx, &b->pre, NT_BF16, 2, big, k + 3, 1.0f);
    if (!st) st = rand_fill(ctx, &b->out, NT_BF16, 2, big, k + 4, 1.0f);
    if (!st) st = rand_fill(ctx, &b->res, NT_BF16, 2, small, k + 5, 1.0f);
    if (!st) st = rand_fill(ctx, &b->w, NT_BF16, 2, wsh, k + 6, 0.02f);
    if (!st) st = rand_fill(ctx, &b->dw, NT_F32, 2, wsh, k + 7, 1.0f);
    if (!st) st = rand_fill(ctx, &b->db, NT_F32, 1, v, k + 8, 1.0f);
    if (!st) st = rand_fill(ctx, &b->lnw, NT_BF16, 1, v, k + 9, 1.0f);
    if (!st) st = rand_fill(ctx, &b->mean, NT_F32, 1, rows, k + 10, 0.1f);
    if (!st) st = rand_fill(ctx, &b->rstd, NT_F32, 1, rows, k + 11, 0.1f);
  }
  return st;
}

static void setup_free(nt_ctx *ctx, setup *s) {
  for (int r = 0; r < ROT; r++) {
    bufs *b = &s->b[r];
    nt_tensor *all[] = {&b->x, &b->dy, &b->pre, &b->out, &b->res, &b->w, &b->dw, &b->db,
                        &b->mean, &b->rstd, &b->lnw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) nt_tensor_free(ctx, all[i]);
  }
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

#ifdef NT_HAVE_CUDA
/* Median microseconds per call of case c: `inner` calls captured into a graph, `windows`
 * replays timed. */
static nt_status time_case(nt_ctx *ctx, setup *s, const bench_case *c, int windows,
                           double *us) {
  cudaStream_t cs = (cudaStream_t)nt_ctx_stream(ctx);
  nt_event *e0 = NULL, *e1 = NULL;
  nt_status st = nt_event_create(ctx, &e0, true);
  if (!st) st = nt_event_create(ctx, &e1, true);
  /* Warm-up: plans, autotuning, the memory pool's blocks. */
  for (int i = 0; i < 2 * ROT && !st; i++) st = run_case(ctx, s, c, i % ROT);
  float ms = 0;
  if (!st) st = nt_event_record(ctx, e0, NULL);
  for (int i = 0; i < 2 * ROT && !st; i++) st = run_case(ctx, s, c, i % ROT);
  if (!st) st = nt_event_record(ctx, e1, NULL);
  if (!st) st = nt_event_synchronize(ctx, e1);
  if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &ms);
  if (st) goto out;
  int inner = (int)(2.0f / (ms / (2 * ROT) + 1e-4f)) / ROT * ROT + ROT;
  if (inner > 2000) inner = 2000;
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    st = NT_ERR_CUDA;
    goto out;
  }
  for (int i = 0; i < inner && !st; i++) st = run_case(ctx, s, c, i % ROT);
  cudaError_t ce = cudaStreamEndCapture(cs, &g);
  if (!st && ce == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) exec = NULL;
  if (g) cudaGraphDestroy(g);
  if (st || !exec) {
    fprintf(stderr, "bench_gpt_layers: %s: capture failed (%s)\n", c->name,
            st ? nt_last_error(ctx) : cudaGetErrorString(ce));
    if (!st) st = NT_ERR_CUDA;
    goto out;
  }
  float *t = calloc((size_t)windows, sizeof *t);
  if (cudaGraphLaunch(exec, cs) != cudaSuccess) st = NT_ERR_CUDA;  /* upload, warm */
  for (int w = 0; w < windows && !st && t; w++) {
    st = nt_event_record(ctx, e0, NULL);
    if (!st && cudaGraphLaunch(exec, cs) != cudaSuccess) st = NT_ERR_CUDA;
    if (!st) st = nt_event_record(ctx, e1, NULL);
    if (!st) st = nt_event_synchronize(ctx, e1);
    if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &t[w]);
  }
  if (!st && t) {
    qsort(t, (size_t)windows, sizeof *t, cmp_float);
    *us = 1e3 * (double)t[windows / 2] / inner;
  }
  free(t);
  cudaGraphExecDestroy(exec);
out:
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  return st;
}
#endif

int main(int argc, char **argv) {
  const char *model = "all", *only = "";
  int windows = 9;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
    else if (!strcmp(argv[i], "--windows") && i + 1 < argc) windows = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--model small|gpt2|all] [--windows N] [--cases SUBSTRING]\n",
              argv[0]);
      return 2;
    }
  }
  if (windows < 1) windows = 1;
#ifndef NT_HAVE_CUDA
  fprintf(stderr, "bench_gpt_layers: needs the CUDA backend\n");
  return 77;
#else
  nt_ctx *ctx;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "bench_gpt_layers: %s\n", ctx ? nt_last_error(ctx) : "no context");
    nt_ctx_free(ctx);
    return 1;
  }
  struct { const char *name; int64_t R, C; } models[] = {{"small", 64 * 256, 384},
                                                         {"gpt2", 16 * 1024, 768}};
  printf("# bf16, median of %d graph replays, microseconds per call\n", windows);
  printf("%-6s %-6s %-30s %10s\n", "#", "model", "case", "us");
  int rc = 0;
  for (int m = 0; m < 2; m++) {
    if (strcmp(model, "all") && strcmp(model, models[m].name)) continue;
    setup s;
    nt_status st = setup_alloc(ctx, &s, models[m].R, models[m].C);
    for (size_t i = 0; !st && i < sizeof cases / sizeof cases[0]; i++) {
      double us = 0;
      bool head = cases[i].kind == K_HEAD65 || cases[i].kind == K_HEAD72;
      if (head && m != 0) continue;   /* GPT-2's vocabulary (50304) is aligned already */
      if (!strstr(cases[i].name, only)) continue;
      nt_status cst = time_case(ctx, &s, &cases[i], windows, &us);
      if (cst) {
        fprintf(stderr, "bench_gpt_layers: %s %s: %s\n", models[m].name, cases[i].name,
                nt_last_error(ctx));
        nt_clear_error(ctx);
        rc = 1;
        continue;
      }
      printf("CASE   %-6s %-30s %10.2f\n", models[m].name, cases[i].name, us);
      fflush(stdout);
    }
    if (st) {
      fprintf(stderr, "bench_gpt_layers: %s: %s\n", models[m].name, nt_last_error(ctx));
      rc = 1;
    }
    setup_free(ctx, &s);
  }
  nt_ctx_free(ctx);
  return rc;
#endif
}
