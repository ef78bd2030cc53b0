/* Achieved memory bandwidth of the memory-bound ops next to the device's copy bandwidth:
 * LayerNorm forward and backward, GELU forward and backward, fused cross-entropy (loss +
 * gradient), and a device-to-device copy of 2 GiB as the reference, in one run.
 *
 *   bench_memops [--dtype bf16|f16|f32] [--repeats 20]
 *
 * Bytes are counted once per tensor read and once per tensor written (what the op must move):
 *   ln_fwd  x, y (+ weight, bias, mean, rstd)       ln_bwd  dy, x, dx read, dx written (+=)
 *   gelu_fwd x, y                                   gelu_bwd x, dy, dx read, dx written (+=)
 *   ce_fused logits read, dlogits written (+ targets, losses)      copy  src, dst
 * One line per case: "RESULT name rows cols dtype bytes us GBps"; then a table with the
 * percentage of the copy bandwidth. A repeat times a batch of calls (>= 2 ms) between CUDA
 * events; us is the median per call after warm-up. Calls rotate over copies of the tensors when
 * one call's data fits in 4x a 60 MB L2 bound, so every call reads from HBM. */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROT 16
#define L2_BOUND (60.0 * 1024 * 1024)

typedef enum { COPY, LN_FWD, LN_BWD, GELU_FWD, GELU_BWD, CE_FUSED } kind;
static const char *kind_name[] = {"copy", "ln_fwd", "ln_bwd", "gelu_fwd", "gelu_bwd", "ce_fused"};

typedef struct {
  kind k;
  int64_t rows, cols;
} bench_shape;

typedef struct {
  bench_shape s;
  nt_dtype dt;
  int rot;
  nt_tensor a[MAX_ROT], b[MAX_ROT], c[MAX_ROT], d[MAX_ROT], mean[MAX_ROT], rstd[MAX_ROT];
  nt_tensor w, bias, dw, db;
} bench_case;

static void die(nt_ctx *ctx, nt_status st, const char *what) {
  if (!st) return;
  fprintf(stderr, "bench_memops: %s: %s\n", what, nt_last_error(ctx));
  exit(1);
}

/* Uniform values in (0, scale] of dtype dt, generated on the device. */
static void random_tensor(nt_ctx *ctx, nt_tensor *t, nt_dtype dt, int ndim, const int64_t *shape,
                          float scale, uint64_t seed) {
  nt_tensor f;
  die(ctx, nt_tensor_alloc(ctx, t, dt, ndim, shape), "alloc");
  die(ctx, nt_tensor_alloc(ctx, &f, NT_F32, ndim, shape), "alloc");
  die(ctx, nt_rng_uniform(ctx, &f, seed, 0), "rng");
  die(ctx, nt_scale(ctx, scale, &f), "scale");
  if (dt == NT_F32) die(ctx, nt_tensor_copy(ctx, t, &f), "copy");
  else die(ctx, nt_convert(ctx, t, &f), "convert");
  nt_tensor_free(ctx, &f);
}

static double case_bytes(const bench_case *c) {
  double es = (double)nt_dtype_size(c->dt), T = (double)c->s.rows * (double)c->s.cols * es;
  double R = (double)c->s.rows, C = (double)c->s.cols;
  switch (c->s.k) {
  case COPY: return 2.0 * R * C;
  case LN_FWD: return 2.0 * T + 2.0 * C * es + 8.0 * R;
  case LN_BWD: return 4.0 * T + C * es + 8.0 * R + 16.0 * C;
  case GELU_FWD: return 2.0 * T;
  case GELU_BWD: return 4.0 * T;
  case CE_FUSED: return 2.0 * T + 8.0 * R;
  }
  return 0;
}

static void setup(nt_ctx *ctx, bench_case *c) {
  int64_t R = c->s.rows, C = c->s.cols, shp[2] = {R, C}, wshape[1] = {C}, rshape[1] = {R};
  double work = case_bytes(c);
  c->rot = work >= 4 * L2_BOUND ? 1 : (int)((4 * L2_BOUND + work - 1) / work);
  if (c->rot > MAX_ROT) c->rot = MAX_ROT;
  if (c->s.k == COPY) {
    c->rot = 1;
    random_tensor(ctx, &c->a[0], NT_F32, 2, (int64_t[2]){R, C / 4}, 1.0f, 1);
    die(ctx, nt_tensor_alloc(ctx, &c->b[0], NT_F32, 2, (int64_t[2]){R, C / 4}), "alloc");
    return;
  }
  if (c->s.k == LN_FWD || c->s.k == LN_BWD) {
    random_tensor(ctx, &c->w, c->dt, 1, wshape, 1.5f, 2);
    random_tensor(ctx, &c->bias, c->dt, 1, wshape, 1.0f, 3);
    die(ctx, nt_tensor_alloc(ctx, &c->dw, NT_F32, 1, wshape), "alloc");
    die(ctx, nt_tensor_alloc(ctx, &c->db, NT_F32, 1, wshape), "alloc");
    die(ctx, nt_tensor_zero(ctx, &c->dw), "zero");
    die(ctx, nt_tensor_zero(ctx, &c->db), "zero");
  }
  for (int k = 0; k < c->rot; k++) {
    random_tensor(ctx, &c->a[k], c->dt, 2, shp, 4.0f, 10 + (uint64_t)k); /* x / logits */
    switch (c->s.k) {
    case LN_FWD:
    case LN_BWD:
      die(ctx, nt_tensor_alloc(ctx, &c->b[k], c->dt, 2, shp), "alloc");          /* y */
      die(ctx, nt_tensor_alloc(ctx, &c->mean[k], NT_F32, 1, rshape), "alloc");
      die(ctx, nt_tensor_alloc(ctx, &c->rstd[k], NT_F32, 1, rshape), "alloc");
      die(ctx, nt_layernorm_forward(ctx, &c->a[k], &c->w, &c->bias, &c->b[k], &c->mean[k],
                                    &c->rstd[k]), "layernorm");
      if (c->s.k == LN_BWD) {
        random_tensor(ctx, &c->c[k], c->dt, 2, shp, 1.0f, 100 + (uint64_t)k); /* dy */
        die(ctx, nt_tensor_alloc(ctx, &c->d[k], c->dt, 2, shp), "alloc");      /* dx */
        die(ctx, nt_tensor_zero(ctx, &c->d[k]), "zero");
      }
      break;
    case GELU_FWD:
      die(ctx, nt_tensor_alloc(ctx, &c->b[k], c->dt, 2, shp), "alloc");
      break;
    case GELU_BWD:
      random_tensor(ctx, &c->c[k], c->dt, 2, shp, 1.0f, 100 + (uint64_t)k);
      die(ctx, nt_tensor_alloc(ctx, &c->d[k], c->dt, 2, shp), "alloc");
      die(ctx, nt_tensor_zero(ctx, &c->d[k]), "zero");
      break;
    case CE_FUSED: {
      int32_t *t = malloc((size_t)R * sizeof(int32_t));
      for (int64_t i = 0; i < R; i++) t[i] = (int32_t)((i * 7919 + (int64_t)k) % C);
      nt_tensor h = nt_tensor_view(t, NT_I32, nt_cpu(), 1, rshape);
      die(ctx, nt_tensor_alloc(ctx, &c->c[k], NT_I32, 1, rshape), "alloc");       /* targets */
      die(ctx, nt_tensor_copy(ctx, &c->c[k], &h), "copy");
      free(t);
      die(ctx, nt_tensor_alloc(ctx, &c->b[k], c->dt, 2, shp), "alloc");           /* dlogits */
      die(ctx, nt_tensor_alloc(ctx, &c->mean[k], NT_F32, 1, rshape), "alloc");    /* losses */
      break;
    }
    default: break;
    }
  }
}

static nt_status run(nt_ctx *ctx, bench_case *c, int k) {
  switch (c->s.k) {
  case COPY: return nt_tensor_copy(ctx, &c->b[0], &c->a[0]);
  case LN_FWD:
    return nt_layernorm_forward(ctx, &c->a[k], &c->w, &c->bias, &c->b[k], &c->mean[k], &c->rstd[k]);
  case LN_BWD:
    return nt_layernorm_backward(ctx, &c->c[k], &c->a[k], &c->w, &c->mean[k], &c->rstd[k],
                                 &c->d[k], &c->dw, &c->db);
  case GELU_FWD: return nt_gelu_forward(ctx, &c->a[k], &c->b[k]);
  case GELU_BWD: return nt_gelu_backward(ctx, &c->a[k], &c->c[k], &c->d[k]);
  case CE_FUSED:
    return nt_cross_entropy_fused(ctx, &c->a[k], &c->c[k], NULL, c->s.rows, &c->mean[k], &c->b[k]);
  }
  return NT_OK;
}

static void teardown(nt_ctx *ctx, bench_case *c) {
  for (int k = 0; k < MAX_ROT; k++) {
    nt_tensor *ts[6] = {&c->a[k], &c->b[k], &c->c[k], &c->d[k], &c->mean[k], &c->rstd[k]};
    for (int i = 0; i < 6; i++) nt_tensor_free(ctx, ts[i]);
  }
  nt_tensor_free(ctx, &c->w);
  nt_tensor_free(ctx, &c->bias);
  nt_tensor_free(ctx, &c->dw);
  nt_tensor_free(ctx, &c->db);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median microseconds per call. */
static double time_case(nt_ctx *ctx, bench_case *c, int repeats) {
  nt_event *e0, *e1;
  die(ctx, nt_event_create(ctx, &e0, true), "event");
  die(ctx, nt_event_create(ctx, &e1, true), "event");
  for (int i = 0; i < 3; i++) die(ctx, run(ctx, c, i % c->rot), kind_name[c->s.k]);
  float ms = 0;
  die(ctx, nt_event_record(ctx, e0, NULL), "record");
  for (int i = 0; i < 5; i++) die(ctx, run(ctx, c, i % c->rot), kind_name[c->s.k]);
  die(ctx, nt_event_record(ctx, e1, NULL), "record");
  die(ctx, nt_event_synchronize(ctx, e1), "sync");
  die(ctx, nt_event_elapsed_ms(ctx, e0, e1, &ms), "elapsed");
  int inner = ms > 0 ? (int)(2.0 / (ms / 5)) + 1 : 1;
  if (inner > 2000) inner = 2000;
  float *t = malloc((size_t)repeats * sizeof(float));
  for (int r = 0; r < repeats; r++) {
    die(ctx, nt_event_record(ctx, e0, NULL), "record");
    for (int i = 0; i < inner; i++) die(ctx, run(ctx, c, (r * inner + i) % c->rot), kind_name[c->s.k]);
    die(ctx, nt_event_record(ctx, e1, NULL), "record");
    die(ctx, nt_event_synchronize(ctx, e1), "sync");
    die(ctx, nt_event_elapsed_ms(ctx, e0, e1, &t[r]), "elapsed");
    t[r] /= (float)inner;
  }
  qsort(t, (size_t)repeats, sizeof(float), cmp_float);
  double us = 1000.0 * t[repeats / 2];
  free(t);
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  return us;
}

int main(int argc, char **argv) {
  const char *dtype = "bf16";
  int repeats = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--dtype bf16|f16|f32] [--repeats 20]\n", argv[0]);
      return 2;
    }
  }
  nt_dtype dt;
  if (!nt_dtype_parse(dtype, &dt) || (dt != NT_F32 && dt != NT_F16 && dt != NT_BF16) || repeats < 1) {
    fprintf(stderr, "bench_memops: dtype must be f32, f16 or bf16 and repeats >= 1\n");
    return 2;
  }
  nt_ctx *ctx;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "bench_memops needs a GPU: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  const bench_shape shapes[] = {
      {COPY, 1, (int64_t)2 << 30},
      {LN_FWD, 16384, 768},   {LN_BWD, 16384, 768},   {LN_FWD, 131072, 768}, {LN_BWD, 131072, 768},
      {LN_FWD, 16384, 384},   {LN_BWD, 16384, 384},
      {GELU_FWD, 16384, 3072}, {GELU_BWD, 16384, 3072}, {GELU_FWD, 65536, 3072},
      {GELU_BWD, 65536, 3072}, {CE_FUSED, 16384, 50304}, {CE_FUSED, 16384, 65},
      {CE_FUSED, 131072, 65},
  };
  int n = (int)(sizeof shapes / sizeof shapes[0]);
  double copy_gbps = 0, gbps[32];
  printf("# bench_memops dtype %s, repeats %d (median us per call)\n", dtype, repeats);
  for (int i = 0; i < n; i++) {
    bench_case c;
    memset(&c, 0, sizeof c);
    c.s = shapes[i];
    c.dt = shapes[i].k == COPY ? NT_U8 : dt;
    setup(ctx, &c);
    double us = time_case(ctx, &c, repeats), bytes = case_bytes(&c);
    gbps[i] = bytes / (us * 1e-6) / 1e9;
    if (shapes[i].k == COPY) copy_gbps = gbps[i];
    printf("RESULT %s %lld %lld %s %.0f %.2f %.1f\n", kind_name[shapes[i].k],
           (long long)shapes[i].rows, (long long)shapes[i].cols, nt_dtype_name(c.dt), bytes, us,
           gbps[i]);
    fflush(stdout);
    teardown(ctx, &c);
  }
  printf("\n| op | rows x cols | GB/s | %% of copy |\n|---|---|---|---|\n");
  for (int i = 0; i < n; i++)
    printf("| %s | %lld x %lld | %.0f | %.0f%% |\n", kind_name[shapes[i].k],
           (long long)shapes[i].rows, (long long)shapes[i].cols, gbps[i],
           copy_gbps > 0 ? 100.0 * gbps[i] / copy_gbps : 0.0);
  nt_ctx_free(ctx);
  return 0;
}
