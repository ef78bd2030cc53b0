/* Causal attention forward, backward and forward+backward timed with CUDA events (median of
 * repeats after warm-up) in bf16 at the small GPT's (B 64, H 6, T 256, D 64) and GPT-2's
 * (B 16, H 12, T 1024, D 64) shapes, then the small GPT's shape with attention dropout 0.2
 * (the Philox mask regenerated in forward and backward) and with q, k, v read straight from a
 * [B, T, 3C] projection output (out into [B, T, C], gradients written into [B, T, 3C] with
 * overwrite: what the model runs), and GPT-2's shape with its original dropout 0.1. Prints a
 * table and "RESULT nt <row> <fwd> <bwd> <total>" lines (ms) for run_attention.sh. Usage:
 * bench_attention [repeats] [row index 0..4, -1 (the default) all] [calls per timed sample,
 * default 1] (NT_ATTN_SIMPLE=1 times the fallback kernels; NT_ATTN_BENCH_ACCUMULATE=1 the
 * backward in its += form). With one call per sample the host's launch latency is inside each
 * timing; with several back to back (each sample's ms divided by the count) the GPU runs them
 * queued, as in a training step, and the figure is GPU time per call. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "ops/attention.h"

typedef struct {
  int B, H, T, D;
  float p;      /* attention dropout */
  bool packed;  /* q, k, v / dq, dk, dv as views of [B, T, 3C]; out, dout of [B, T, C] */
} shape;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

static void die(nt_ctx *ctx, const char *what) {
  fprintf(stderr, "bench_attention: %s: %s\n", what, nt_last_error(ctx));
  exit(1);
}

/* which: 0 forward, 1 backward, 2 both. Returns the median over `reps` samples of the ms per
 * call of `calls` calls in a row. */
static float time_it(nt_ctx *ctx, int which, int reps, int calls, nt_tensor *t, nt_tensor *lse,
                     const nt_attention_opts *o) {
  nt_event *e0, *e1;
  float *ms = malloc(sizeof(float) * (size_t)reps);
  if (nt_event_create(ctx, &e0, true) || nt_event_create(ctx, &e1, true)) die(ctx, "events");
  for (int r = -3; r < reps; r++) {   /* three untimed warm-up calls */
    if (nt_event_record(ctx, e0, NULL)) die(ctx, "record");
    for (int c = 0; c < calls; c++) {
      if (which != 1 && nt_attention_forward_ex(ctx, &t[0], &t[1], &t[2], &t[3], lse, o))
        die(ctx, "forward");
      if (which != 0 && nt_attention_backward_ex(ctx, &t[4], &t[0], &t[1], &t[2], &t[3], lse,
                                                 &t[5], &t[6], &t[7], o))
        die(ctx, "backward");
    }
    if (nt_event_record(ctx, e1, NULL) || nt_event_synchronize(ctx, e1)) die(ctx, "sync");
    if (r >= 0 && nt_event_elapsed_ms(ctx, e0, e1, &ms[r])) die(ctx, "elapsed");
    if (r >= 0) ms[r] /= (float)calls;
  }
  qsort(ms, (size_t)reps, sizeof(float), cmp_float);
  float med = ms[reps / 2];
  free(ms);
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  return med;
}

/* A [B, H, T, D] view of buffer `buf` ([B, T, parts * C]) at element offset off. */
static nt_tensor heads_view(const nt_tensor *buf, int64_t off, shape sh, int parts) {
  int64_t dims[4] = {sh.B, sh.H, sh.T, sh.D};
  nt_tensor t = nt_tensor_view((char *)buf->data + off * 2, NT_BF16, buf->device, 4, dims);
  const int64_t row = (int64_t)parts * sh.H * sh.D;
  t.stride[0] = sh.T * row;
  t.stride[1] = sh.D;
  t.stride[2] = row;
  t.stride[3] = 1;
  return t;
}

int main(int argc, char **argv) {
  const shape shapes[5] = {{64, 6, 256, 64, 0.f, false},
                           {16, 12, 1024, 64, 0.f, false},
                           {64, 6, 256, 64, 0.2f, false},
                           {64, 6, 256, 64, 0.f, true},
                           {16, 12, 1024, 64, 0.1f, false}};
  const int nshapes = 5;
  const int reps = argc > 1 ? atoi(argv[1]) : 30;
  const int only = argc > 2 ? atoi(argv[2]) : -1;
  const int calls = argc > 3 ? atoi(argv[3]) : 1;
  if (reps < 1 || only < -1 || only >= nshapes || calls < 1 || calls > 1000) {
    fprintf(stderr, "usage: bench_attention [repeats >= 1] [row 0..%d or -1] [calls 1..1000]\n",
            nshapes - 1);
    return 2;
  }
  nt_ctx *ctx;
  if (nt_cuda_device_count() == 0) {
    fprintf(stderr, "bench_attention: no GPU\n");
    return 1;
  }
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) die(ctx, "context");
  const char *accumulate = getenv("NT_ATTN_BENCH_ACCUMULATE");
  printf("nanotrain causal attention, bf16, %s kernels, median of %d samples of %d call%s\n",
         nt_ctx_opts(ctx)->attn_simple ? "simple" : "tensor-core", reps, calls,
         calls > 1 ? "s each" : "");
  printf("%-26s %10s %10s %10s %12s\n", "B,H,T,D", "fwd ms", "bwd ms", "fwd+bwd ms", "TFLOP/s");
  for (int s = 0; s < nshapes; s++) {
    if (only >= 0 && s != only) continue;
    const shape sh = shapes[s];
    int64_t dims[4] = {sh.B, sh.H, sh.T, sh.D}, ldims[3] = {sh.B, sh.H, sh.T};
    const int64_t C = (int64_t)sh.H * sh.D;
    const size_t n = (size_t)sh.B * sh.H * sh.T * sh.D;
    /* Buffers: contiguous q k v out dout dq dk dv, or packed qkv dout out dqkv. */
    int64_t lens[8];
    const int nbuf = sh.packed ? 4 : 8;
    for (int i = 0; i < nbuf; i++)
      lens[i] = sh.packed ? (int64_t)n * (i == 0 || i == 3 ? 3 : 1) : (int64_t)n;
    nt_tensor buf[8], t[8], lse;   /* t: q k v out dout dq dk dv */
    uint16_t *host = malloc(2 * 3 * n);
    uint64_t st = 0x9e3779b97f4a7c15ull * (uint64_t)(s % 2 + 1);
    for (int i = 0; i < nbuf; i++) {
      if (nt_tensor_alloc(ctx, &buf[i], NT_BF16, 1, &lens[i])) die(ctx, "alloc");
      const bool input = sh.packed ? i < 2 : i < 5;
      if (input) {
        for (int64_t j = 0; j < lens[i]; j++) {
          st = st * 6364136223846793005ull + 1442695040888963407ull;
          host[j] = nt_f32_to_bf16((float)((double)(st >> 40) / (double)(1u << 24) * 2.0 - 1.0));
        }
        nt_tensor h = nt_tensor_view(host, NT_BF16, nt_cpu(), 1, &lens[i]);
        if (nt_tensor_copy(ctx, &buf[i], &h)) die(ctx, "upload");
      } else if (nt_tensor_zero(ctx, &buf[i])) {
        die(ctx, "zero");
      }
    }
    if (sh.packed) {
      t[0] = heads_view(&buf[0], 0, sh, 3);
      t[1] = heads_view(&buf[0], C, sh, 3);
      t[2] = heads_view(&buf[0], 2 * C, sh, 3);
      t[3] = heads_view(&buf[2], 0, sh, 1);
      t[4] = heads_view(&buf[1], 0, sh, 1);
      t[5] = heads_view(&buf[3], 0, sh, 3);
      t[6] = heads_view(&buf[3], C, sh, 3);
      t[7] = heads_view(&buf[3], 2 * C, sh, 3);
    } else {
      for (int i = 0; i < 8; i++)
        t[i] = nt_tensor_view(buf[i].data, NT_BF16, buf[i].device, 4, dims);
    }
    if (nt_tensor_alloc(ctx, &lse, NT_F32, 3, ldims)) die(ctx, "alloc lse");
    /* The model reserves a fresh stream per step; the cost does not depend on it. The
     * backward writes fresh gradients (overwrite), the work torch.autograd.grad does;
     * NT_ATTN_BENCH_ACCUMULATE=1 times the += form, which also reads the old gradients. */
    const nt_attention_opts opts = {sh.p, 1234, 0, !(accumulate && *accumulate == '1')};
    const float f = time_it(ctx, 0, reps, calls, t, &lse, &opts);
    const float b = time_it(ctx, 1, reps, calls, t, &lse, &opts);
    const float fb = time_it(ctx, 2, reps, calls, t, &lse, &opts);
    /* Causal FLOPs as FlashAttention counts them: forward 2 matmuls of B*H*T*T*D/2 MACs,
     * backward 2.5x the forward. */
    const double flops = 3.5 * 4.0 * sh.B * sh.H * (double)sh.T * sh.T * sh.D / 2.0;
    char name[64];
    if (sh.p > 0.f)
      snprintf(name, sizeof name, "%d,%d,%d,%d,p=%.1f", sh.B, sh.H, sh.T, sh.D, sh.p);
    else
      snprintf(name, sizeof name, "%d,%d,%d,%d%s", sh.B, sh.H, sh.T, sh.D,
               sh.packed ? ",qkv-views" : "");
    printf("%-26s %10.3f %10.3f %10.3f %12.1f\n", name, f, b, fb, flops / (fb * 1e-3) / 1e12);
    printf("RESULT nt %s %.4f %.4f %.4f\n", name, f, b, fb);
    for (int i = 0; i < nbuf; i++) nt_tensor_free(ctx, &buf[i]);
    nt_tensor_free(ctx, &lse);
    free(host);
  }
  nt_ctx_free(ctx);
  return 0;
}
