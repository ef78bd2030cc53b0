/* Helpers shared by the tests of the memory-bound ops (elementwise, embedding, layernorm,
 * dropout, cross_entropy, reduce): tensors filled from float arrays, device round trips,
 * finite differences. Header-only (static functions) so each test stays one file. */
#ifndef NT_TESTS_MEMOPS_TEST_H
#define NT_TESTS_MEMOPS_TEST_H
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tests/testutil.h"

static const nt_dtype memops_float_dtypes[3] = {NT_F32, NT_F16, NT_BF16};

/* A tensor on ctx's device (CPU or GPU) of dtype dt holding vals (rounded to dt); NULL vals
 * leaves it zeroed. Aborts the test on allocation failure (a test bug, not an op error). */
static inline nt_tensor memops_tensor(nt_ctx *ctx, nt_dtype dt, int ndim, const int64_t *shape,
                                      const float *vals) {
  nt_tensor host = nt_tensor_view(NULL, dt, nt_cpu(), ndim, shape);
  int64_t n = nt_tensor_numel(&host);
  size_t bytes = nt_tensor_nbytes(&host);
  host.data = calloc(1, bytes ? bytes : 1);
  if (vals && dt == NT_I32) memcpy(host.data, vals, bytes);
  else if (vals)
    for (int64_t i = 0; i < n; i++) nt_store_f32(host.data, dt, i, vals[i]);
  nt_tensor t;
  if (nt_tensor_alloc(ctx, &t, dt, ndim, shape) || nt_tensor_copy(ctx, &t, &host)) {
    fprintf(stderr, "test setup failed: %s\n", nt_last_error(ctx));
    exit(1);
  }
  free(host.data);
  return t;
}

/* As memops_tensor, but the data starts `misalign` elements into its allocation, so a 16-bit
 * tensor with misalign 1 is not 16-byte aligned (exercises the kernels' scalar paths). */
static inline nt_tensor memops_tensor_at(nt_ctx *ctx, nt_dtype dt, int ndim, const int64_t *shape,
                                         const float *vals, int misalign) {
  nt_tensor v = nt_tensor_view(NULL, dt, nt_ctx_device(ctx), ndim, shape);
  int64_t total = nt_tensor_numel(&v) + misalign;
  nt_tensor whole;
  if (nt_tensor_alloc(ctx, &whole, dt, 1, &total)) {
    fprintf(stderr, "test setup failed: %s\n", nt_last_error(ctx));
    exit(1);
  }
  v.data = (char *)whole.data + (size_t)misalign * nt_dtype_size(dt);
  v.owner = whole.owner;
  nt_tensor h = nt_tensor_view(NULL, dt, nt_cpu(), ndim, shape);
  h.data = calloc(1, nt_tensor_nbytes(&h) ? nt_tensor_nbytes(&h) : 1);
  if (vals)
    for (int64_t i = 0; i < nt_tensor_numel(&h); i++) nt_store_f32(h.data, dt, i, vals[i]);
  if (nt_tensor_copy(ctx, &v, &h)) {
    fprintf(stderr, "test setup failed: %s\n", nt_last_error(ctx));
    exit(1);
  }
  free(h.data);
  return v;
}

/* An I32 tensor from ints. */
static inline nt_tensor memops_ints(nt_ctx *ctx, int ndim, const int64_t *shape,
                                    const int32_t *vals) {
  return memops_tensor(ctx, NT_I32, ndim, shape, (const float *)(const void *)vals);
}

/* The tensor's values as fp32 (malloc'd; the caller frees). Works for CPU and GPU tensors. */
static inline float *memops_values(nt_ctx *ctx, const nt_tensor *t) {
  int64_t n = nt_tensor_numel(t);
  nt_tensor host = nt_tensor_view(NULL, t->dtype, nt_cpu(), t->ndim, t->shape);
  host.data = malloc(nt_tensor_nbytes(t) ? nt_tensor_nbytes(t) : 1);
  float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
  if (nt_tensor_copy(ctx, &host, t)) {
    fprintf(stderr, "test readback failed: %s\n", nt_last_error(ctx));
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) out[i] = nt_load_f32(host.data, t->dtype, i);
  free(host.data);
  return out;
}

static inline float *memops_random(nt_test_rng *r, int64_t n, float lo, float hi) {
  float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
  nt_test_fill_uniform(r, x, n, lo, hi);
  return x;
}

/* Values rounded through a storage dtype (what the op sees). */
static inline void memops_round(float *x, int64_t n, nt_dtype dt) {
  uint32_t buf;
  for (int64_t i = 0; i < n; i++) {
    nt_store_f32(&buf, dt, 0, x[i]);
    x[i] = nt_load_f32(&buf, dt, 0);
  }
}

/* Relative error between two tensors (any devices), as fp32 values. */
static inline double memops_rel_err_t(nt_ctx *ca, const nt_tensor *a, nt_ctx *cb,
                                      const nt_tensor *b) {
  float *va = memops_values(ca, a), *vb = memops_values(cb, b);
  double e = nt_test_rel_err(va, vb, nt_tensor_numel(a));
  free(va);
  free(vb);
  return e;
}

/* Central differences of a scalar loss f(state) with respect to x[0..n) (x is the fp32 buffer
 * the loss reads); fills num[i]. The step is taken on the actually representable values. */
typedef double (*memops_loss_fn)(void *state);
static inline void memops_fd(memops_loss_fn f, void *state, float *x, int64_t n, float h,
                             double *num) {
  for (int64_t i = 0; i < n; i++) {
    float x0 = x[i];
    float xp = x0 + h * fmaxf(1.0f, fabsf(x0)), xm = x0 - h * fmaxf(1.0f, fabsf(x0));
    x[i] = xp;
    double fp = f(state);
    x[i] = xm;
    double fm = f(state);
    x[i] = x0;
    num[i] = (fp - fm) / ((double)xp - (double)xm);
  }
}

/* ||a - b|| / ||b|| with a in fp32 and b in fp64. */
static inline double memops_rel_err_fd(const float *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (isnan(num)) return INFINITY;
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

static inline double memops_dot(const float *a, const float *w, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * w[i];
  return s;
}

/* One input on both contexts: the same values on the CPU and on the GPU. */
typedef struct {
  nt_tensor c, g;
} memops_pair;

static inline memops_pair memops_pair_new(nt_ctx *cc, nt_ctx *gc, nt_dtype dt, int ndim,
                                          const int64_t *shape, const float *vals, int misalign) {
  memops_pair p;
  p.c = memops_tensor_at(cc, dt, ndim, shape, vals, 0);
  p.g = memops_tensor_at(gc, dt, ndim, shape, vals, misalign);
  return p;
}

static inline void memops_pair_free(nt_ctx *cc, nt_ctx *gc, memops_pair *p) {
  nt_tensor_free(cc, &p->c);
  nt_tensor_free(gc, &p->g);
}

/* ||gpu - cpu|| / ||cpu||, recorded as a measured error of its dtype (nt_test_note). */
static inline double memops_pair_err(nt_ctx *cc, nt_ctx *gc, const memops_pair *p) {
  return nt_test_note(p->g.dtype, memops_rel_err_t(gc, &p->g, cc, &p->c));
}

/* A GPU test's bounds on ||gpu - cpu|| / ||cpu||, one per tensor dtype, set from the worst
 * error the H200 measured in each (the `measured:` lines; docs/tolerances.md). */
typedef struct {
  double f32, f16, bf16;
} memops_bounds;

static inline double memops_bound(const memops_bounds *b, nt_dtype dt) {
  return dt == NT_F32 ? b->f32 : dt == NT_F16 ? b->f16 : b->bf16;
}

/* Bitwise equality of two GPU tensors' contents. */
static inline int memops_same_bits(nt_ctx *gc, const nt_tensor *a, const nt_tensor *b) {
  float *va = memops_values(gc, a), *vb = memops_values(gc, b);
  int same = memcmp(va, vb, (size_t)nt_tensor_numel(a) * sizeof(float)) == 0;
  free(va);
  free(vb);
  return same;
}

#endif
