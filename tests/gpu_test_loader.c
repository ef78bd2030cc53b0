/* The loader on a GPU:
 *  1. integrity: every device batch, as the compute stream sees it, holds exactly the samples
 *     the loader says, while copies are slow (4 MiB batches), the compute stream is busy for
 *     an irregular time each step (so copies back up behind the device ring), workers are many
 *     and prefetch small. A slot refilled before its copy completed, or a device buffer
 *     overwritten while compute still reads it, shows up as wrong bytes. Each batch is copied
 *     device-to-device on the compute stream into an archive, checked after one final sync.
 *  2. overlap: with 32 MiB batches and a ~2 ms compute step, every batch arrives complete;
 *     the step times with and without the loader are printed (bench/run_loader.sh measures
 *     the overlap against its bars). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data/loader.h"
#include "testutil.h"
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define WORDS 65536  /* 256 KiB per sample */

static uint32_t word(int64_t i, uint64_t epoch, int k) {
  return (uint32_t)i * 0x9E3779B1u ^ (uint32_t)k * 0x85EBCA77u ^ (uint32_t)(epoch * 0x27d4eb2fu);
}

static nt_status big_get(void *user, const nt_sample_info *info, void *const *dst) {
  (void)user;
  uint32_t *w = dst[0];
  for (int k = 0; k < WORDS; k++) w[k] = word(info->index, info->epoch, k);
  *(int32_t *)dst[1] = (int32_t)info->index;
  return NT_OK;
}

static nt_dataset big_dataset(int64_t len) {
  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = len;
  ds.n_fields = 2;
  ds.fields[0].dtype = NT_I32;
  ds.fields[0].ndim = 1;
  ds.fields[0].shape[0] = WORDS;
  ds.fields[1].dtype = NT_I32;
  ds.fields[1].ndim = 0;
  ds.get = big_get;
  return ds;
}

static int cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  CHECK(e == cudaSuccess, "%s", what);
  return e == cudaSuccess;
}

/* Keeps the compute stream busy: n memsets of a large scratch buffer. */
static void busy(cudaStream_t s, void *scratch, size_t bytes, int n) {
  for (int k = 0; k < n; k++) (void)cudaMemsetAsync(scratch, k & 0xff, bytes, s);
}

static void integrity(nt_ctx *ctx, int workers, int prefetch, bool pin, int epochs) {
  const int64_t len = 997, bs = 16;
  const size_t batch_bytes = (size_t)bs * WORDS * 4;
  const int64_t per_epoch = (len + bs - 1) / bs, steps = per_epoch * epochs;
  cudaStream_t cs = (cudaStream_t)nt_ctx_stream(ctx);
  size_t scratch_bytes = (size_t)256 << 20;
  void *scratch = NULL, *arch = NULL, *arch_lab = NULL;
  uint32_t *host = NULL;
  int32_t *host_lab = NULL;
  int64_t *idx = calloc((size_t)(steps * bs), sizeof *idx), *sizes = calloc((size_t)steps, 8);
  uint64_t *ep = calloc((size_t)steps, sizeof *ep);
  nt_loader *l = NULL;
  if (!cuda_ok(cudaMalloc(&scratch, scratch_bytes), "scratch") ||
      !cuda_ok(cudaMalloc(&arch, batch_bytes * (size_t)steps), "archive") ||
      !cuda_ok(cudaMalloc(&arch_lab, (size_t)(steps * bs) * 4), "label archive"))
    goto done;
  nt_dataset ds = big_dataset(len);
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = bs; o.shuffle = true; o.seed = 5; o.num_workers = workers;
  o.prefetch_factor = prefetch; o.pin_memory = pin;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) goto done;
  int64_t step = 0;
  for (int e = 0; e < epochs; e++) {
    CHECK_OK(ctx, nt_loader_set_epoch(l, (uint64_t)e));
    for (;;) {
      nt_batch b;
      bool end;
      if (!CHECK_OK(ctx, nt_loader_next(l, &b, &end)) || end) break;
      CHECK(b.field[0].device.type == NT_DEV_CUDA, "batch on the GPU");
      /* Irregular compute before reading the batch: 0..15 memsets of 256 MiB (up to ~1 ms),
       * on average slower than the workers, so copies queue behind the device ring. */
      busy(cs, scratch, scratch_bytes, (int)((step * 5 + 3) % 16));
      cudaMemcpyAsync((char *)arch + (size_t)step * batch_bytes, b.field[0].data,
                      (size_t)b.size * WORDS * 4, cudaMemcpyDeviceToDevice, cs);
      cudaMemcpyAsync((int32_t *)arch_lab + step * bs, b.field[1].data, (size_t)b.size * 4,
                      cudaMemcpyDeviceToDevice, cs);
      memcpy(idx + step * bs, b.indices, (size_t)b.size * sizeof *idx);
      sizes[step] = b.size;
      ep[step] = b.epoch;
      step++;
    }
  }
  CHECK(step == steps, "%lld steps, want %lld", (long long)step, (long long)steps);
  if (!CHECK_OK(ctx, nt_ctx_synchronize(ctx))) goto done;
  host = malloc(batch_bytes);
  host_lab = malloc((size_t)(steps * bs) * 4);
  if (!cuda_ok(cudaMemcpy(host_lab, arch_lab, (size_t)(steps * bs) * 4, cudaMemcpyDeviceToHost),
               "labels back"))
    goto done;
  int64_t bad_rows = 0, first_bad = -1;
  for (int64_t s = 0; s < step; s++) {
    if (!cuda_ok(cudaMemcpy(host, (char *)arch + (size_t)s * batch_bytes,
                            (size_t)sizes[s] * WORDS * 4, cudaMemcpyDeviceToHost), "batch back"))
      goto done;
    for (int64_t r = 0; r < sizes[s]; r++) {
      int64_t i = idx[s * bs + r];
      int bad = host_lab[s * bs + r] != (int32_t)i;
      for (int k = 0; k < WORDS && !bad; k++) bad = host[r * WORDS + k] != word(i, ep[s], k);
      if (bad && first_bad < 0) first_bad = s;
      bad_rows += bad;
    }
  }
  CHECK(bad_rows == 0, "workers %d prefetch %d pin %d: %lld corrupt rows (first in step %lld)",
        workers, prefetch, pin, (long long)bad_rows, (long long)first_bad);
  /* Each epoch covers every sample exactly once. */
  char *seen = calloc((size_t)len, 1);
  int64_t dup = 0;
  for (int e = 0; e < epochs; e++) {
    memset(seen, 0, (size_t)len);
    for (int64_t s = e * per_epoch; s < (e + 1) * per_epoch && s < step; s++)
      for (int64_t r = 0; r < sizes[s]; r++) dup += seen[idx[s * bs + r]]++ != 0;
  }
  CHECK(dup == 0, "every sample once per epoch (%lld repeats)", (long long)dup);
  free(seen);
  printf("integrity: workers %d prefetch %d pin %d: %lld batches of %zu bytes verified\n",
         workers, prefetch, pin, (long long)step, batch_bytes);
done:
  nt_loader_free(l);
  cudaFree(scratch); cudaFree(arch); cudaFree(arch_lab);
  free(host); free(host_lab); free(idx); free(sizes); free(ep);
}

/* Cheap samples of 1 MiB: only a header word is written, so the copy dominates. */
static nt_status cheap_get(void *user, const nt_sample_info *info, void *const *dst) {
  (void)user;
  *(int32_t *)dst[0] = (int32_t)info->index;
  return NT_OK;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void overlap(nt_ctx *ctx) {
  const int64_t bs = 32, row = (int64_t)1 << 20, steps = 100, warm = 10;
  cudaStream_t cs = (cudaStream_t)nt_ctx_stream(ctx);
  size_t scratch_bytes = (size_t)256 << 20;
  void *scratch = NULL, *dst = NULL, *pinned = NULL;
  nt_loader *l = NULL;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  if (!cuda_ok(cudaMalloc(&scratch, scratch_bytes), "scratch") ||
      !cuda_ok(cudaMalloc(&dst, (size_t)(bs * row)), "dst") ||
      !cuda_ok(cudaMallocHost(&pinned, (size_t)(bs * row)), "pinned"))
    goto done;
  /* Calibrate: memsets per ~2 ms step. */
  busy(cs, scratch, scratch_bytes, 4);
  cudaEventRecord(e0, cs);
  busy(cs, scratch, scratch_bytes, 20);
  cudaEventRecord(e1, cs);
  cudaEventSynchronize(e1);
  float ms20 = 0;
  cudaEventElapsedTime(&ms20, e0, e1);
  int per_step = (int)(2.0 / (ms20 / 20) + 0.5);
  if (per_step < 1) per_step = 1;

  /* Compute alone. */
  cudaStreamSynchronize(cs);
  double t = now_s();
  for (int64_t s = 0; s < steps; s++) busy(cs, scratch, scratch_bytes, per_step);
  cudaStreamSynchronize(cs);
  double t_compute = now_s() - t;
  /* Copy then compute, serialized on one stream. */
  t = now_s();
  for (int64_t s = 0; s < steps; s++) {
    cudaMemcpyAsync(dst, pinned, (size_t)(bs * row), cudaMemcpyHostToDevice, cs);
    busy(cs, scratch, scratch_bytes, per_step);
  }
  cudaStreamSynchronize(cs);
  double t_serial = now_s() - t;

  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = 4096;
  ds.n_fields = 1;
  ds.fields[0].dtype = NT_U8;
  ds.fields[0].ndim = 1;
  ds.fields[0].shape[0] = row;
  ds.get = cheap_get;
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = bs; o.shuffle = true; o.num_workers = 4; o.prefetch_factor = 2;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) goto done;
  nt_batch b;
  bool end;
  for (int64_t s = 0; s < warm; s++) {
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    busy(cs, scratch, scratch_bytes, per_step);
  }
  cudaStreamSynchronize(cs);
  nt_loader_reset_stats(l);
  t = now_s();
  int bad = 0;
  for (int64_t s = 0; s < steps; s++) {
    if (!CHECK_OK(ctx, nt_loader_next(l, &b, &end)) || end) break;
    /* Compute reads the batch (its first sample's header) then works. */
    cudaMemcpyAsync(dst, b.field[0].data, 4, cudaMemcpyDeviceToDevice, cs);
    busy(cs, scratch, scratch_bytes, per_step);
    bad += b.size != bs;
  }
  cudaStreamSynchronize(cs);
  double t_loader = now_s() - t;
  nt_loader_stats st;
  nt_loader_get_stats(l, &st);
  printf("overlap: %d memsets/step; compute alone %.2f ms/step, copy+compute serial %.2f, "
         "with the loader %.2f (%.3f x compute); host wait %.3f ms/step\n",
         per_step, 1e3 * t_compute / steps, 1e3 * t_serial / steps, 1e3 * t_loader / steps,
         t_loader / t_compute, 1e-6 * (double)st.wait_ns_total / (double)steps);
  CHECK(bad == 0, "full batches");
  /* The times are reported, not asserted: on a shared GPU they move with other processes
   * (a run beside three training jobs once measured copies that did not look overlapped).
   * bench/run_loader.sh holds the speed bars (H2D from the slots vs plain pinned copies;
   * data wait as a share of the step). */
done:
  nt_loader_free(l);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(scratch); cudaFree(dst); cudaFreeHost(pinned);
}

/* A failing sample on a CUDA context: the error arrives, free leaves nothing in flight. */
static nt_status fail_get(void *user, const nt_sample_info *info, void *const *dst) {
  (void)user;
  if (info->index == 40) return nt_sample_fail(info, NT_ERR_IO, "disk gone at %lld",
                                               (long long)info->index);
  return big_get(user, info, dst);
}

static void worker_error(nt_ctx *ctx) {
  nt_dataset ds = big_dataset(100);
  ds.get = fail_get;
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 8; o.num_workers = 4;
  nt_loader *l = NULL;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) return;
  nt_batch b;
  bool end;
  nt_status st = NT_OK;
  int n = 0;
  while (!(st = nt_loader_next(l, &b, &end)) && !end) n++;
  CHECK(st == NT_ERR_IO && n == 5, "error at batch 5 (%d batches, status %d)", n, st);
  CHECK(strstr(nt_last_error(ctx), "disk gone at 40") != NULL, "%s", nt_last_error(ctx));
  CHECK_OK(ctx, nt_loader_next(l, &b, &end));  /* a new iteration starts, mid-epoch free */
  nt_loader_free(l);
  CHECK_OK(ctx, nt_ctx_synchronize(ctx));
}
#endif

int main(void) {
#ifndef NT_HAVE_CUDA
  return nt_test_skip("built without CUDA");
#else
  nt_ctx *ctx = nt_test_cuda_ctx();
  if (!ctx) return nt_test_skip("no GPU");
  integrity(ctx, 8, 1, true, 2);
  integrity(ctx, 16, 2, true, 1);
  integrity(ctx, 0, 2, true, 1);
  integrity(ctx, 4, 1, false, 1);
  overlap(ctx);
  worker_error(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
#endif
}
