/* GPU dropout drops exactly the elements the CPU drops for the same seed and offset (vector and
 * scalar paths, offsets that are multiples of 4 but not of 8), same values, backward +=,
 * dropout_add (the residual form) the same; and
 * inside RNG steps, eagerly and as a replayed CUDA graph, with the step base added. */
#include "ops/dropout.h"
#include "train/cuda_graph.h"
#include "tests/memops_test.h"

/* Same mask and same arithmetic as the CPU: the outputs and gradients must be equal (the
 * H200 measured 0 in every dtype, 2026-12-04 03:20). */
static void run_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r, nt_dtype dt, int64_t n, float p,
                     uint64_t seed, uint64_t offset, int misalign) {
  int64_t shape[1] = {n};
  float *xv = memops_random(r, n, 0.5f, 2.0f), *dv = memops_random(r, n, -1, 1);
  memops_pair x = memops_pair_new(cc, gc, dt, 1, shape, xv, misalign);
  memops_pair y = memops_pair_new(cc, gc, dt, 1, shape, NULL, misalign);
  memops_pair d = memops_pair_new(cc, gc, dt, 1, shape, dv, misalign);
  const char *dn = nt_dtype_name(dt);
  if (CHECK_OK(cc, nt_dropout_forward(cc, &x.c, &y.c, p, seed, offset)) &&
      CHECK_OK(gc, nt_dropout_forward(gc, &x.g, &y.g, p, seed, offset))) {
    float *a = memops_values(cc, &y.c), *b = memops_values(gc, &y.g);
    int64_t mism = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
      mism += (a[i] == 0.0f) != (b[i] == 0.0f);
      kept += a[i] != 0.0f;
    }
    CHECK(mism == 0, "%s n %lld p %g offset %llu mis %d: %lld mask elements differ", dn,
          (long long)n, (double)p, (unsigned long long)offset, misalign, (long long)mism);
    CHECK(nt_test_note(dt, nt_test_rel_err(b, a, n)) == 0, "%s forward values differ: %g", dn,
          nt_test_rel_err(b, a, n));
    if (n > 10000 && p > 0 && p < 1)
      CHECK(fabs((double)kept / (double)n - (1.0 - p)) < 0.01, "kept fraction %g",
            (double)kept / (double)n);
    free(a);
    free(b);
  }
  if (CHECK_OK(cc, nt_dropout_backward(cc, &x.c, &d.c, p, seed, offset)) &&
      CHECK_OK(gc, nt_dropout_backward(gc, &x.g, &d.g, p, seed, offset)))
    CHECK(memops_pair_err(cc, gc, &d) == 0, "%s backward (+=) differs: %g", dn,
          memops_pair_err(cc, gc, &d));
  /* y = res + dropout(x), res = d (the backward's result on both sides) */
  if (CHECK_OK(cc, nt_dropout_add(cc, &x.c, &d.c, &y.c, p, seed, offset)) &&
      CHECK_OK(gc, nt_dropout_add(gc, &x.g, &d.g, &y.g, p, seed, offset)))
    CHECK(memops_pair_err(cc, gc, &y) == 0, "%s dropout_add differs: %g", dn,
          memops_pair_err(cc, gc, &y));
  memops_pair_free(cc, gc, &x); memops_pair_free(cc, gc, &y); memops_pair_free(cc, gc, &d);
  free(xv); free(dv);
}

/* Inside an RNG step the kernel adds the step base it reads from device memory: a step on
 * the GPU drops what the CPU drops at the absolute offset, and a CUDA graph of the step,
 * replayed, draws a fresh mask each time (the one the next eager step would draw), because
 * its end-of-step increment advances the base. */
typedef struct {
  const nt_tensor *x;
  nt_tensor *y;
  float p;
  uint64_t seed, off;
} step_arg;

static nt_status dropout_step(nt_ctx *ctx, void *argp) {
  step_arg *a = argp;
  nt_status st = nt_ctx_rng_step_begin(ctx);
  if (st) return st;
  nt_ctx_rng_reserve(ctx, 6);   /* another op's numbers first */
  a->off = nt_ctx_rng_reserve(ctx, (uint64_t)nt_tensor_numel(a->x));
  st = nt_dropout_forward(ctx, a->x, a->y, a->p, a->seed, a->off);
  nt_status end = nt_ctx_rng_step_end(ctx, NULL);
  return st ? st : end;
}

static void check_against_cpu(nt_ctx *cc, nt_ctx *gc, memops_pair *x, memops_pair *y, float p,
                              uint64_t seed, uint64_t offset, const char *what) {
  if (!CHECK_OK(cc, nt_dropout_forward(cc, &x->c, &y->c, p, seed, offset))) return;
  const int64_t n = nt_tensor_numel(&x->c);
  float *a = memops_values(cc, &y->c), *b = memops_values(gc, &y->g);
  CHECK(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "%s: GPU output differs from the CPU's "
        "at absolute offset %llu", what, (unsigned long long)offset);
  free(a);
  free(b);
}

static void step_base_case(nt_ctx *cc, nt_ctx *gc, nt_test_rng *r) {
  const int64_t n = 70001, shape[1] = {n};
  const float p = 0.2f;
  const uint64_t seed = 2024, start = (1ull << 34) + 4;
  float *xv = memops_random(r, n, 0.5f, 2.0f);
  memops_pair x = memops_pair_new(cc, gc, NT_F32, 1, shape, xv, 0);
  memops_pair y = memops_pair_new(cc, gc, NT_F32, 1, shape, NULL, 0);
  step_arg a = {&x.g, &y.g, p, seed, 0};
  nt_ctx_set_rng_offset(gc, start);
  /* Eager: the first step also creates and sets the device base. */
  uint64_t per_step = 0;
  if (CHECK_OK(gc, dropout_step(gc, &a))) {
    per_step = nt_ctx_rng_offset(gc) - start;
    CHECK(a.off == 8 && per_step == 8 + (uint64_t)((n + 3) & ~3), "step offsets %llu, %llu",
          (unsigned long long)a.off, (unsigned long long)per_step);
    check_against_cpu(cc, gc, &x, &y, p, seed, start + 8, "eager step");
  }
  nt_graph *g = NULL;
  uint64_t before = nt_ctx_rng_offset(gc);
  if (CHECK_OK(gc, nt_graph_capture(gc, dropout_step, &a, &g))) {
    CHECK(nt_ctx_rng_offset(gc) == before, "capture leaves the offset alone");
    for (int k = 0; k < 3; k++) {
      const uint64_t base = nt_ctx_rng_offset(gc);
      if (!CHECK_OK(gc, nt_ctx_rng_step_replay(gc, per_step)) ||
          !CHECK_OK(gc, nt_graph_launch(gc, g)))
        break;
      char what[64];
      snprintf(what, sizeof what, "graph replay %d", k);
      check_against_cpu(cc, gc, &x, &y, p, seed, base + 8, what);
      uint64_t dev = 0;
      CHECK_OK(gc, nt_ctx_rng_base_read(gc, &dev));
      CHECK(dev == base + per_step && nt_ctx_rng_offset(gc) == dev,
            "replay %d advanced the device base to %llu (host %llu, want %llu)", k,
            (unsigned long long)dev, (unsigned long long)nt_ctx_rng_offset(gc),
            (unsigned long long)(base + per_step));
    }
    /* After a checkpoint-style reset the next replay rewrites the base first. */
    nt_ctx_set_rng_offset(gc, start);
    if (CHECK_OK(gc, nt_ctx_rng_step_replay(gc, per_step)) && CHECK_OK(gc, nt_graph_launch(gc, g)))
      check_against_cpu(cc, gc, &x, &y, p, seed, start + 8, "replay after set_rng_offset");
    nt_graph_free(g);
  }
  memops_pair_free(cc, gc, &x);
  memops_pair_free(cc, gc, &y);
  free(xv);
}

int main(void) {
  nt_ctx *gc = nt_test_cuda_ctx();
  if (!gc) return nt_test_skip("no GPU");
  nt_ctx *cc;
  if (nt_ctx_create(&cc, nt_cpu())) return 1;
  nt_test_rng r = {202};
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = memops_float_dtypes[d];
    run_case(cc, gc, &r, dt, 4099, 0.1f, 42, 0, 0);
    run_case(cc, gc, &r, dt, 4099, 0.5f, 42, 12, 0);     /* offset 4 mod 8 */
    run_case(cc, gc, &r, dt, 4099, 0.5f, 42, 12, 1);     /* scalar path */
    run_case(cc, gc, &r, dt, 3, 0.5f, 7, 4, 0);          /* tail only */
    run_case(cc, gc, &r, dt, (1 << 20) + 3, 0.2f, 0x123456789abcdefull, 1ull << 33, 0);
    run_case(cc, gc, &r, dt, 1001, 0.0f, 1, 0, 0);
    run_case(cc, gc, &r, dt, 1001, 1.0f, 1, 0, 0);
  }
  step_base_case(cc, gc, &r);
  /* The context's reserve keeps offsets a multiple of 4. */
  uint64_t o1 = nt_ctx_rng_reserve(gc, 37), o2 = nt_ctx_rng_reserve(gc, 5);
  CHECK(o1 % 4 == 0 && o2 % 4 == 0 && o2 >= o1 + 37, "rng_reserve offsets %llu %llu",
        (unsigned long long)o1, (unsigned long long)o2);
  nt_ctx_free(cc);
  nt_ctx_free(gc);
  return nt_test_finish();
}
