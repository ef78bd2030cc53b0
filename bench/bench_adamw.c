/* The fused AdamW step over GPT-2 124M's 124,439,808 parameters, against a device copy measured
 * in the same run.
 *
 *   bench_adamw [--repeats 20] [--steps 10]
 *
 * Layouts: "flat" (one unit of all parameters) and "gpt2" (14 units as the model holds them:
 * embeddings, 12 blocks, final norm; two parameter groups, no weight decay for biases and norms).
 * Per parameter the step reads fp32 master, m, v and fp32 grads (16 B) and writes master, m, v
 * and the bf16 compute copy (14 B): 30 B. The copy baseline is cudaMemcpyAsync of a 498 MB
 * buffer (read + write counted). found_inf is passed (read on the device); a variant adds
 * clipping (sum of squares + clip coefficient in the kernel).
 * Lines: "RESULT name params units ms GBps copy_GBps pct_of_copy"; ms is the median per step
 * over repeats of `steps` steps between CUDA events, after warm-up. */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "optim/adamw.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define C 768
#define V 50257
#define T 1024
#define L 12
#define MAX_RANGES 16

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

typedef struct {
  int n_units;
  int64_t numel[L + 2];
  nt_param_range decay[(L + 2) * MAX_RANGES], nodecay[(L + 2) * MAX_RANGES];
  int n_decay, n_nodecay;
} layout;

static void add(layout *l, int unit, int64_t *off, int64_t n, bool decay) {
  nt_param_range r = {unit, *off, n};
  if (decay) l->decay[l->n_decay++] = r;
  else l->nodecay[l->n_nodecay++] = r;
  *off += n;
}

/* GPT-2 124M: wte, wpe | 12 x (ln1 w,b, c_attn w,b, c_proj w,b, ln2 w,b, c_fc w,b, mlp proj w,b)
 * | ln_f w,b. Matrices decay; vectors do not. */
static void gpt2_layout(layout *l, bool flat) {
  memset(l, 0, sizeof *l);
  int64_t off = 0;
  int u = 0;
  add(l, u, &off, (int64_t)V * C, true);
  add(l, u, &off, (int64_t)T * C, true);
  for (int b = 0; b < L; b++) {
    if (!flat) { l->numel[u++] = off; off = 0; }
    add(l, u, &off, C, false);
    add(l, u, &off, C, false);
    add(l, u, &off, (int64_t)3 * C * C, true);
    add(l, u, &off, 3 * C, false);
    add(l, u, &off, (int64_t)C * C, true);
    add(l, u, &off, C, false);
    add(l, u, &off, C, false);
    add(l, u, &off, C, false);
    add(l, u, &off, (int64_t)4 * C * C, true);
    add(l, u, &off, 4 * C, false);
    add(l, u, &off, (int64_t)4 * C * C, true);
    add(l, u, &off, C, false);
  }
  if (!flat) { l->numel[u++] = off; off = 0; }
  add(l, u, &off, C, false);
  add(l, u, &off, C, false);
  l->numel[u++] = off;
  l->n_units = u;
}

#ifdef NT_HAVE_CUDA
static nt_status time_it(nt_ctx *ctx, int repeats, int steps, nt_status (*fn)(nt_ctx *, void *),
                         void *arg, float *median_ms) {
  nt_event *e0 = NULL, *e1 = NULL;
  float *t = calloc((size_t)repeats, sizeof *t);
  nt_status st = nt_event_create(ctx, &e0, true);
  if (!st) st = nt_event_create(ctx, &e1, true);
  for (int i = 0; !st && i < 3; i++) st = fn(ctx, arg);   /* warm-up */
  for (int r = 0; !st && r < repeats; r++) {
    st = nt_event_record(ctx, e0, NULL);
    for (int i = 0; !st && i < steps; i++) st = fn(ctx, arg);
    if (!st) st = nt_event_record(ctx, e1, NULL);
    if (!st) st = nt_event_synchronize(ctx, e1);
    if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &t[r]);
    t[r] /= (float)steps;
  }
  if (!st) {
    qsort(t, (size_t)repeats, sizeof *t, cmp_float);
    *median_ms = t[repeats / 2];
  }
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  free(t);
  return st;
}

typedef struct { void *dst, *src; size_t bytes; } copy_arg;
static nt_status do_copy(nt_ctx *ctx, void *p) {
  copy_arg *a = p;
  return cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice,
                         (cudaStream_t)nt_ctx_stream(ctx)) == cudaSuccess
             ? NT_OK
             : NT_ERROR(ctx, NT_ERR_CUDA, "cudaMemcpyAsync failed");
}

typedef struct { nt_adamw *opt; nt_optim_step_args args; } step_arg;
static nt_status do_step(nt_ctx *ctx, void *p) {
  step_arg *a = p;
  return nt_adamw_step(ctx, a->opt, &a->args);
}

/* Fills a float buffer with a constant on the device (through a host staging chunk). */
static nt_status fill(nt_ctx *ctx, float *dev, int64_t n, float v) {
  int64_t chunk = 1 << 22;
  float *h = malloc(sizeof(float) * (size_t)chunk);
  nt_status st = h ? NT_OK : NT_ERR_OOM;
  for (int64_t i = 0; i < chunk && h; i++) h[i] = v * (float)((i % 97) - 48) / 48.0f;
  for (int64_t i = 0; !st && i < n; i += chunk) {
    int64_t k = n - i < chunk ? n - i : chunk;
    if (cudaMemcpy(dev + i, h, sizeof(float) * (size_t)k, cudaMemcpyHostToDevice) != cudaSuccess)
      st = NT_ERROR(ctx, NT_ERR_CUDA, "fill failed");
  }
  free(h);
  return st;
}
#endif

int main(int argc, char **argv) {
  int repeats = 20, steps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
  }
  if (repeats < 1) repeats = 1;
  if (steps < 1) steps = 1;
#ifndef NT_HAVE_CUDA
  fprintf(stderr, "bench_adamw: built without CUDA\n");
  return 1;
#else
  nt_ctx *ctx = NULL;
  if (nt_ctx_create_env(&ctx, nt_cuda(0)) != NT_OK) {
    fprintf(stderr, "bench_adamw: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  layout lay;
  gpt2_layout(&lay, true);
  int64_t total = lay.numel[0];
  printf("# bench_adamw: %lld parameters (GPT-2 124M), %d repeats x %d steps, median ms/step\n",
         (long long)total, repeats, steps);
  nt_status st = NT_OK;
  /* Copy baseline: one fp32 buffer of all parameters. */
  float copy_gbps = 0;
  {
    void *a = NULL, *b = NULL;
    size_t bytes = sizeof(float) * (size_t)total;
    float ms = 0;
    st = nt_alloc(ctx, bytes, &a);
    if (!st) st = nt_alloc(ctx, bytes, &b);
    copy_arg ca = {b, a, bytes};
    if (!st) st = time_it(ctx, repeats, steps, do_copy, &ca, &ms);
    if (!st) {
      copy_gbps = (float)(2.0 * (double)bytes / (ms * 1e-3) / 1e9);
      printf("RESULT copy %lld 1 %.4f %.1f %.1f 100.0\n", (long long)total, (double)ms,
             (double)copy_gbps, (double)copy_gbps);
    }
    nt_free(ctx, a);
    nt_free(ctx, b);
  }
  const char *names[3] = {"adamw_flat", "adamw_gpt2_units", "adamw_gpt2_units_clip"};
  for (int c = 0; !st && c < 3; c++) {
    gpt2_layout(&lay, c == 0);
    nt_param_unit units[L + 2];
    nt_tensor found;
    nt_adamw *opt = NULL;
    memset(units, 0, sizeof units);
    memset(&found, 0, sizeof found);
    for (int u = 0; !st && u < lay.n_units; u++) {
      st = nt_tensor_alloc(ctx, &units[u].params, NT_BF16, 1, &lay.numel[u]);
      if (!st) st = nt_tensor_alloc(ctx, &units[u].grads, NT_F32, 1, &lay.numel[u]);
      if (!st) st = nt_tensor_zero(ctx, &units[u].params);
      if (!st) st = fill(ctx, units[u].grads.data, lay.numel[u], 1e-3f);
    }
    if (!st) st = nt_tensor_alloc(ctx, &found, NT_F32, 0, NULL);
    if (!st) st = nt_tensor_zero(ctx, &found);
    nt_param_group groups[2] = {{1.0f, 0.1, lay.decay, lay.n_decay},
                                {1.0f, 0.0, lay.nodecay, lay.n_nodecay}};
    if (!st) st = nt_adamw_create(ctx, NULL, units, lay.n_units, groups, 2, &opt);
    step_arg sa = {opt, nt_optim_args(6e-4)};
    sa.args.found_inf = &found;
    if (c == 2) sa.args.max_norm = 1.0f;
    float ms = 0;
    if (!st) st = time_it(ctx, repeats, steps, do_step, &sa, &ms);
    if (!st) {
      double gbps = 30.0 * (double)total / (ms * 1e-3) / 1e9;
      printf("RESULT %s %lld %d %.4f %.1f %.1f %.1f\n", names[c], (long long)total, lay.n_units,
             (double)ms, gbps, (double)copy_gbps, 100.0 * gbps / copy_gbps);
    }
    nt_adamw_free(ctx, opt);
    for (int u = 0; u < lay.n_units; u++) {
      nt_tensor_free(ctx, &units[u].params);
      nt_tensor_free(ctx, &units[u].grads);
    }
    nt_tensor_free(ctx, &found);
  }
  if (st) fprintf(stderr, "bench_adamw: %s\n", nt_last_error(ctx));
  nt_ctx_free(ctx);
  return st ? 1 : 0;
#endif
}
