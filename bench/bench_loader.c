/* Data loader benchmark (GPU). Two measurements, each the median of repeats after warm-up:
 *  1. host-to-device throughput of batches coming from the loader's pinned slots, against a
 *     plain cudaMemcpyAsync from one pinned buffer in the same run (bar: >= 90%);
 *  2. a CNN-sized loop: Fashion-MNIST batches of 256 normalized F32 images [1, 28, 28] plus
 *     labels, a synthetic ~3 ms compute step on the compute stream (memsets, calibrated), 4
 *     workers; data wait = (loop time with the loader - compute alone) / loop time (bar: < 1%).
 *     Synthetic images stand in when Fashion-MNIST is not installed (said in the output).
 * Prints a table and "RESULT <key> <value>" lines for bench/run_loader.sh.
 * Usage: bench_loader [--steps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "data/datasets.h"
#include "data/idx.h"
#include "data/loader.h"
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define REPEATS 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static int die(nt_ctx *ctx, const char *what) {
  fprintf(stderr, "bench_loader: %s: %s\n", what, ctx ? nt_last_error(ctx) : "");
  return 1;
}

/* 1 MiB samples whose contents do not matter: only the copy is measured. */
static nt_status blank_get(void *user, const nt_sample_info *info, void *const *dst) {
  (void)user;
  *(int64_t *)dst[0] = info->index;
  return NT_OK;
}

static int h2d(nt_ctx *ctx, double *plain_gbs, double *loader_gbs) {
  const int64_t row = (int64_t)1 << 20, bs = 64, nb = 100;
  const size_t bytes = (size_t)(row * bs);
  void *pinned = NULL, *dev = NULL;
  cudaStream_t s;
  if (cudaMallocHost(&pinned, bytes) || cudaMalloc(&dev, bytes) ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))
    return die(NULL, "cuda allocation");
  memset(pinned, 1, bytes);
  double tp[REPEATS], tl[REPEATS];
  for (int r = -1; r < REPEATS; r++) {  /* r = -1: warm-up */
    double t = now_s();
    for (int64_t b = 0; b < nb; b++)
      cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    if (r >= 0) tp[r] = now_s() - t;
  }
  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = bs * nb;
  ds.n_fields = 1;
  ds.fields[0].dtype = NT_U8;
  ds.fields[0].ndim = 1;
  ds.fields[0].shape[0] = row;
  ds.get = blank_get;
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = bs; o.num_workers = 4; o.prefetch_factor = 2;
  nt_loader *l = NULL;
  if (nt_loader_create(ctx, &ds, &o, &l)) return die(ctx, "loader");
  for (int r = -1; r < REPEATS; r++) {
    nt_batch b;
    bool end;
    nt_ctx_synchronize(ctx);
    double t = now_s();
    for (;;) {
      if (nt_loader_next(l, &b, &end)) return die(ctx, "next");
      if (end) break;
    }
    nt_ctx_synchronize(ctx);
    if (r >= 0) tl[r] = now_s() - t;
  }
  nt_loader_free(l);
  *plain_gbs = (double)bytes * nb / median(tp, REPEATS) / 1e9;
  *loader_gbs = (double)bytes * nb / median(tl, REPEATS) / 1e9;
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(s);
  return 0;
}

static void busy(cudaStream_t s, void *scratch, size_t bytes, int n) {
  for (int k = 0; k < n; k++) cudaMemsetAsync(scratch, k & 0xff, bytes, s);
}

static int cnn(nt_ctx *ctx, int steps, bool *synthetic, double *compute_ms, double *loop_ms,
               double *wait_pct, double *host_wait_ms, int *memsets) {
  nt_image_set set;
  *synthetic = false;
  if (nt_fashion_mnist_load(ctx, getenv("NT_FASHION_DIR"), true, &set)) {
    *synthetic = true;
    memset(&set, 0, sizeof set);
    set.n = 60000; set.h = 28; set.w = 28; set.num_classes = 10;
    set.images.data = malloc(60000 * 784);
    set.labels = malloc(60000 * sizeof *set.labels);
    uint64_t st = 1;
    for (int64_t i = 0; i < 60000 * 784; i++)
      set.images.data[i] = (uint8_t)((st = st * 6364136223846793005ull + 1) >> 56);
    for (int i = 0; i < 60000; i++) set.labels[i] = i % 10;
  }
  nt_image_source src = {&set, false, {0, false, 0.2860f, 0.3530f}};
  nt_dataset ds = nt_image_dataset(&src);
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 256; o.shuffle = true; o.drop_last = true; o.num_workers = 4;
  o.prefetch_factor = 2; o.seed = 0;
  cudaStream_t cs = (cudaStream_t)nt_ctx_stream(ctx);
  size_t scratch_bytes = (size_t)256 << 20;
  void *scratch = NULL, *sink = NULL;
  if (cudaMalloc(&scratch, scratch_bytes) || cudaMalloc(&sink, 256 * 784 * 4))
    return die(NULL, "cuda allocation");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  busy(cs, scratch, scratch_bytes, 8);
  cudaEventRecord(e0, cs);
  busy(cs, scratch, scratch_bytes, 40);
  cudaEventRecord(e1, cs);
  cudaEventSynchronize(e1);
  float ms40 = 0;
  cudaEventElapsedTime(&ms40, e0, e1);
  *memsets = (int)(3.0 / (ms40 / 40) + 0.5);
  if (*memsets < 1) *memsets = 1;

  nt_loader *l = NULL;
  if (nt_loader_create(ctx, &ds, &o, &l)) return die(ctx, "loader");
  double tc[REPEATS], tl[REPEATS], hw[REPEATS];
  uint64_t epoch = 0;
  for (int r = -1; r < REPEATS; r++) {
    nt_ctx_synchronize(ctx);
    double t = now_s();
    for (int k = 0; k < steps; k++) busy(cs, scratch, scratch_bytes, *memsets);
    nt_ctx_synchronize(ctx);
    if (r >= 0) tc[r] = now_s() - t;

    nt_loader_reset_stats(l);
    t = now_s();
    for (int k = 0; k < steps;) {
      nt_batch b;
      bool end;
      if (nt_loader_next(l, &b, &end)) return die(ctx, "next");
      if (end) {
        nt_loader_set_epoch(l, ++epoch);
        continue;
      }
      /* The step reads its batch, then computes. */
      cudaMemcpyAsync(sink, b.field[0].data, nt_tensor_nbytes(&b.field[0]),
                      cudaMemcpyDeviceToDevice, cs);
      busy(cs, scratch, scratch_bytes, *memsets);
      k++;
    }
    nt_ctx_synchronize(ctx);
    if (r >= 0) {
      tl[r] = now_s() - t;
      nt_loader_stats s;
      nt_loader_get_stats(l, &s);
      hw[r] = 1e-6 * (double)s.wait_ns_total / steps;
    }
  }
  nt_loader_free(l);
  *compute_ms = 1e3 * median(tc, REPEATS) / steps;
  *loop_ms = 1e3 * median(tl, REPEATS) / steps;
  double w = (*loop_ms - *compute_ms) / *loop_ms * 100.0;
  *wait_pct = w < 0 ? 0 : w;
  *host_wait_ms = median(hw, REPEATS);
  cudaFree(scratch);
  cudaFree(sink);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  nt_image_set_free(&set);
  return 0;
}
#endif

int main(int argc, char **argv) {
#ifndef NT_HAVE_CUDA
  (void)argc; (void)argv;
  fprintf(stderr, "bench_loader: built without CUDA\n");
  return 77;
#else
  int steps = 300;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
  nt_ctx *ctx = NULL;
  if (nt_ctx_create_env(&ctx, nt_cuda(0))) {
    fprintf(stderr, "bench_loader: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 77;
  }
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  double plain = 0, slots = 0, cms = 0, lms = 1, wpct = 0, hwms = 0;
  bool synth = false;
  int memsets = 0;
  if (h2d(ctx, &plain, &slots)) return 1;
  if (cnn(ctx, steps, &synth, &cms, &lms, &wpct, &hwms, &memsets)) return 1;
  printf("nanotrain data loader on %s (median of %d repeats)\n", prop.name, REPEATS);
  printf("%-44s %12s %10s\n", "measure", "value", "bar");
  printf("%-44s %9.2f GB/s\n", "H2D plain pinned cudaMemcpyAsync (64 MiB)", plain);
  printf("%-44s %9.2f GB/s %6.1f%% %s\n", "H2D from loader slots (64 x 1 MiB, 4 workers)", slots,
         100 * slots / plain, slots >= 0.9 * plain ? ">=90% PASS" : ">=90% FAIL");
  printf("%-44s %9.3f ms   (%d memsets)\n", "CNN step: compute alone", cms, memsets);
  printf("%-44s %9.3f ms\n", "CNN step: with the loader (bs 256, 4 workers)", lms);
  printf("%-44s %9.3f %%    %s\n", "data wait / step time", wpct,
         wpct < 1.0 ? "<1% PASS" : "<1% FAIL");
  printf("%-44s %9.3f ms\n", "host time blocked in nt_loader_next / step", hwms);
  printf("%-44s %9.0f\n", "images / s with the loader", 256.0 / (lms * 1e-3));
  if (synth) printf("(Fashion-MNIST not found: synthetic images of the same shape)\n");
  printf("RESULT h2d_plain_gbs %.3f\nRESULT h2d_loader_gbs %.3f\nRESULT compute_ms %.4f\n"
         "RESULT loop_ms %.4f\nRESULT wait_pct %.3f\nRESULT images_per_s %.0f\n",
         plain, slots, cms, lms, wpct, 256.0 / (lms * 1e-3));
  nt_ctx_free(ctx);
  return 0;
#endif
}
