/* Streams and events on the GPU: record / wait / query / elapsed time, copy stream -> compute
 * stream ordering through an event with no host synchronization, pinned and pageable copies. */
#include "tests/testutil.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NT_HAVE_CUDA
int main(void) { return nt_test_skip("built without the CUDA backend"); }
#else
#include "tests/cuda_test.h"

#define MiB ((size_t)1 << 20)

static void test_events(nt_ctx *ctx) {
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  nt_event *start = NULL, *end = NULL, *plain = NULL;
  void *buf = NULL;
  const size_t n = 256 * MiB;
  if (!CHECK_OK(ctx, nt_event_create(ctx, &start, true))) goto done;
  if (!CHECK_OK(ctx, nt_event_create(ctx, &end, true))) goto done;
  if (!CHECK_OK(ctx, nt_event_create(ctx, &plain, false))) goto done;
  if (!CHECK_OK(ctx, nt_alloc(ctx, n, &buf))) goto done;
  CHECK(nt_event_done(ctx, end), "a never-recorded event counts as done");
  CHECK_OK(ctx, nt_event_record(ctx, start, NULL));
  for (int i = 0; i < 20; i++) cuda_ok(cudaMemsetAsync(buf, i, n, s), "memset");
  CHECK_OK(ctx, nt_event_record(ctx, end, NULL));
  CHECK_OK(ctx, nt_event_synchronize(ctx, end));
  CHECK(nt_event_done(ctx, end), "done after synchronize");
  float ms = 0;
  CHECK_OK(ctx, nt_event_elapsed_ms(ctx, start, end, &ms));
  CHECK(ms > 0.0f && ms < 10000.0f, "elapsed %g ms", ms);
  printf("  20 x memset of 256 MiB: %.3f ms (%.0f GB/s)\n", ms, 20.0 * (double)n / (ms * 1e6));
  CHECK_OK(ctx, nt_event_record(ctx, plain, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_event_elapsed_ms(ctx, start, plain, &ms));

  /* Query while the stream is held: not done; done once released. */
  gate g = {0};
  cuda_ok(cudaLaunchHostFunc(s, gate_wait, &g), "gate");
  CHECK_OK(ctx, nt_event_record(ctx, plain, NULL));
  CHECK(!nt_event_done(ctx, plain), "event behind a blocked stream is not done");
  atomic_store(&g.open, 1);
  CHECK_OK(ctx, nt_event_synchronize(ctx, plain));
  CHECK(nt_event_done(ctx, plain), "done after the gate opened");
done:
  cuda_ok(cudaStreamSynchronize(s), "sync");
  nt_free(ctx, buf);
  nt_event_free(ctx, start);
  nt_event_free(ctx, end);
  nt_event_free(ctx, plain);
}

/* The loader's hand-off: the copy stream writes, records an event; the compute stream waits
 * on it and reads. No host synchronization between them. */
static void test_copy_to_compute_ordering(nt_ctx *ctx) {
  cudaStream_t cs = (cudaStream_t)nt_ctx_copy_stream(ctx);
  cudaStream_t s = (cudaStream_t)nt_ctx_stream(ctx);
  const size_t n = 64 * MiB + 3;
  char *a = NULL, *b = NULL;
  unsigned char *host = NULL;
  nt_event *ev = NULL;
  if (!CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&a))) goto done;
  if (!CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&b))) goto done;
  if (!CHECK_OK(ctx, nt_pinned_alloc(ctx, n, (void **)&host))) goto done;
  if (!CHECK_OK(ctx, nt_event_create(ctx, &ev, false))) goto done;
  cuda_ok(cudaMemset(a, 0, n), "clear a");
  cuda_ok(cudaMemset(b, 0, n), "clear b");
  cuda_ok(cudaDeviceSynchronize(), "sync");

  gate g = {0};
  cuda_ok(cudaLaunchHostFunc(cs, gate_wait, &g), "gate");      /* copy stream held */
  cuda_ok(cudaMemsetAsync(a, 0x5A, n, cs), "memset on the copy stream");
  CHECK_OK(ctx, nt_event_record(ctx, ev, cs));
  CHECK_OK(ctx, nt_stream_wait_event(ctx, NULL, ev));
  cuda_ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s), "copy on the compute stream");
  cuda_ok(cudaMemcpyAsync(host, b, n, cudaMemcpyDeviceToHost, s), "to host");
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "compute stream waits for the copy stream");
  (void)cudaGetLastError();
  atomic_store(&g.open, 1);
  CHECK_OK(ctx, nt_stream_synchronize(ctx, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += host[i] != 0x5A;
  CHECK(bad == 0, "%zu bytes read before the copy stream wrote them", bad);
done:
  cuda_ok(cudaDeviceSynchronize(), "sync");
  nt_event_free(ctx, ev);
  nt_pinned_free(ctx, host);
  nt_free(ctx, a);
  nt_free(ctx, b);
}

static float copy_ms(nt_ctx *ctx, void *dst, const void *src, size_t n, cudaStream_t s) {
  nt_event *e0 = NULL, *e1 = NULL;
  float ms = -1;
  if (nt_event_create(ctx, &e0, true) || nt_event_create(ctx, &e1, true)) goto done;
  nt_event_record(ctx, e0, s);
  cuda_ok(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "H2D");
  nt_event_record(ctx, e1, s);
  nt_event_synchronize(ctx, e1);
  nt_event_elapsed_ms(ctx, e0, e1, &ms);
done:
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  return ms;
}

/* Both kinds of host memory copy correctly both ways (odd size); pinned is the fast one. */
static void test_pinned_pageable(nt_ctx *ctx) {
  cudaStream_t cs = (cudaStream_t)nt_ctx_copy_stream(ctx);
  const size_t n = 96 * MiB + 5;
  unsigned char *pageable = malloc(n), *back = malloc(n), *pinned = NULL;
  void *dev = NULL;
  if (!pageable || !back) { CHECK(0, "host malloc"); goto done; }
  if (!CHECK_OK(ctx, nt_pinned_alloc(ctx, n, (void **)&pinned))) goto done;
  if (!CHECK_OK(ctx, nt_alloc(ctx, n, &dev))) goto done;
  nt_test_rng rng = {42};
  for (size_t i = 0; i < n; i++) pageable[i] = (unsigned char)nt_test_uniform(&rng, 0, 256);

  /* pageable -> device -> pinned */
  cuda_ok(cudaMemcpyAsync(dev, pageable, n, cudaMemcpyHostToDevice, cs), "pageable H2D");
  cuda_ok(cudaMemcpyAsync(pinned, dev, n, cudaMemcpyDeviceToHost, cs), "D2H to pinned");
  CHECK_OK(ctx, nt_stream_synchronize(ctx, cs));
  CHECK(memcmp(pinned, pageable, n) == 0, "pageable -> device -> pinned round trip");

  /* pinned (modified) -> device -> pageable */
  for (size_t i = 0; i < n; i += 4093) pinned[i] ^= 0xFF;
  cuda_ok(cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, cs), "pinned H2D");
  cuda_ok(cudaMemcpyAsync(back, dev, n, cudaMemcpyDeviceToHost, cs), "D2H to pageable");
  CHECK_OK(ctx, nt_stream_synchronize(ctx, cs));
  CHECK(memcmp(back, pinned, n) == 0, "pinned -> device -> pageable round trip");

  float best_pinned = 1e30f, best_pageable = 1e30f;
  for (int r = 0; r < 3; r++) {
    float a = copy_ms(ctx, dev, pinned, n, cs), b = copy_ms(ctx, dev, pageable, n, cs);
    if (a > 0 && a < best_pinned) best_pinned = a;
    if (b > 0 && b < best_pageable) best_pageable = b;
  }
  printf("  H2D %zu MiB: pinned %.1f GB/s, pageable %.1f GB/s\n", n >> 20,
         (double)n / (best_pinned * 1e6), (double)n / (best_pageable * 1e6));
  CHECK(best_pinned < 1e29f && best_pageable < 1e29f, "copies timed");
done:
  nt_free(ctx, dev);
  nt_pinned_free(ctx, pinned);
  free(pageable);
  free(back);
}

static void test_stream_create(nt_ctx *ctx) {
  void *st = NULL;
  if (!CHECK_OK(ctx, nt_stream_create(ctx, &st))) return;
  CHECK(st != NULL, "a real stream");
  CHECK_OK(ctx, nt_stream_synchronize(ctx, st));
  nt_stream_free(ctx, st);
}

int main(void) {
  nt_ctx *ctx = nt_test_cuda_ctx();
  if (!ctx) return nt_test_skip("no GPU");
  test_stream_create(ctx);
  test_events(ctx);
  test_copy_to_compute_ordering(ctx);
  test_pinned_pageable(ctx);
  CHECK(cuda_ok(cudaDeviceSynchronize(), "final sync"), "device healthy");
  nt_ctx_free(ctx);
  return nt_test_finish();
}
#endif
