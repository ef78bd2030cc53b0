/* Helpers shared by the GPU tests that drive the CUDA runtime directly (gpu_test_memory,
 * gpu_test_streams). Header-only (static functions) so each test stays one file; include it
 * inside #ifdef NT_HAVE_CUDA. */
#ifndef NT_TESTS_CUDA_TEST_H
#define NT_TESTS_CUDA_TEST_H
#include <stdatomic.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "tests/testutil.h"

/* A CUDA runtime call that must succeed; returns whether it did. */
static inline int cuda_ok(cudaError_t e, const char *what) {
  CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* A stream gate: a host function (cudaLaunchHostFunc(s, gate_wait, &g)) that blocks the
 * stream until the test opens it (bounded at 20 s so a failing test cannot hang).
 * Deterministic, unlike a "long enough" kernel. */
typedef struct { atomic_int open; } gate;

static inline void gate_wait(void *p) {
  gate *g = p;
  struct timespec ms = {0, 1000000};
  for (int i = 0; i < 20000 && !atomic_load(&g->open); i++) nanosleep(&ms, NULL);
}

#endif
