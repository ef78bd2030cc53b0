/* Linear on the GPU against the CPU: forward with each activation (with and without bias), and
 * with a residual added in the GEMM; backward (dx, dW, db; db as column sums, db alone, bf16
 * db), both called twice so the accumulation (+=) is compared too; nt_linear_backward_ex with
 * dx overwritten (NaN-filled before) and with the GELU backward fused into dx (odd sizes: the
 * split epilogue; aligned ones: cuBLASLt's DGELU). Tolerances: docs/semantics.md#test-tolerances. */
#include "tests/testutil.h"
#include "ops/linear.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B0 = 3, T = 37, IN = 45, OUT = 67, R = B0 * T };

typedef struct {
  nt_tensor h, d;   /* host and device tensors of one shape */
} pair;

static nt_ctx *cpu, *gpu;

static bool pair_make(pair *p, nt_dtype dt, int nd, const int64_t *shape, nt_test_rng *r,
                      float init) {
  memset(p, 0, sizeof *p);
  p->h = nt_tensor_view(NULL, dt, nt_cpu(), nd, shape);
  p->h.data = calloc(1, nt_tensor_nbytes(&p->h) + 1);
  for (int64_t i = 0; i < nt_tensor_numel(&p->h); i++)
    nt_store_f32(p->h.data, dt, i, r ? (float)nt_test_uniform(r, -1, 1) : init);
  if (!CHECK_OK(gpu, nt_tensor_alloc(gpu, &p->d, dt, nd, shape))) return false;
  return CHECK_OK(gpu, nt_tensor_copy(gpu, &p->d, &p->h));
}

static void pair_free(pair *p) {
  free(p->h.data);
  nt_tensor_free(gpu, &p->d);
}


/* Compares the GPU tensor with the CPU one (tolerance: the coarser of the input's and the
 * output's dtype, at least `min_tol`). */
static void compare(pair *p, const char *what, nt_dtype in, double min_tol) {
  void *g = malloc(nt_tensor_nbytes(&p->h) + 1);
  nt_tensor gh = p->h;
  gh.data = g;
  if (CHECK_OK(gpu, nt_tensor_copy(gpu, &gh, &p->d))) {
    int64_t n = nt_tensor_numel(&p->h);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
      double a = nt_load_f32(g, p->h.dtype, i), b = nt_load_f32(p->h.data, p->h.dtype, i);
      num += (a - b) * (a - b);
      den += b * b;
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    double tol = fmax(nt_test_tol(in), nt_test_tol(p->h.dtype));
    if (tol < min_tol) tol = min_tol;
    CHECK(nt_test_note(p->h.dtype, e) < tol && isfinite(e), "%s: rel err %.3g (tol %.1g)", what,
          e, tol);
    printf("  %-48s rel err %.2e\n", what, e);
  }
  free(g);
}

static void test_forward(nt_dtype dt) {
  nt_test_rng r = {100 + dt};
  pair x, w, b, y, pre;
  int64_t xs[3] = {B0, T, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {B0, T, OUT};
  if (!pair_make(&x, dt, 3, xs, &r, 0) || !pair_make(&w, dt, 2, ws, &r, 0) ||
      !pair_make(&b, NT_F32, 1, bs, &r, 0) || !pair_make(&y, dt, 3, ys, NULL, 0) ||
      !pair_make(&pre, dt, 3, ys, NULL, 0))
    return;
  char name[96];
  for (int act = NT_ACT_NONE; act <= NT_ACT_RELU; act++)
    for (int wb = 0; wb < 2; wb++) {
      if (!CHECK_OK(cpu, nt_linear_forward(cpu, &x.h, &w.h, wb ? &b.h : NULL, &y.h,
                                           (nt_activation)act, &pre.h)) ||
          !CHECK_OK(gpu, nt_linear_forward(gpu, &x.d, &w.d, wb ? &b.d : NULL, &y.d,
                                           (nt_activation)act, &pre.d)))
        continue;
      snprintf(name, sizeof name, "%s forward act %d bias %d", nt_dtype_name(dt), act, wb);
      /* cuBLASLt's fused GELU may use the hardware tanh approximation (2^-11): 1e-3 there. */
      compare(&y, name, dt, act == NT_ACT_GELU ? 1e-3 : 0);
      if (act == NT_ACT_GELU) {
        snprintf(name, sizeof name, "%s forward gelu pre-activation bias %d", nt_dtype_name(dt), wb);
        compare(&pre, name, dt, 0);
      }
    }
  /* the residual as the GEMM's C: a separate tensor, then y itself (in place) */
  pair res;
  if (pair_make(&res, dt, 3, ys, &r, 0)) {
    for (int inplace = 0; inplace < 2; inplace++) {
      nt_linear_fwd_opts fc = {.residual = inplace ? &y.h : &res.h};
      nt_linear_fwd_opts fg = {.residual = inplace ? &y.d : &res.d};
      if (!CHECK_OK(cpu, nt_linear_forward_ex(cpu, &x.h, &w.h, &b.h, &y.h, NT_ACT_NONE, NULL,
                                              &fc)) ||
          !CHECK_OK(gpu, nt_linear_forward_ex(gpu, &x.d, &w.d, &b.d, &y.d, NT_ACT_NONE, NULL,
                                              &fg)))
        break;
      snprintf(name, sizeof name, "%s forward + residual%s", nt_dtype_name(dt),
               inplace ? " (in place)" : "");
      compare(&y, name, dt, 0);
    }
    pair_free(&res);
  }
  pair_free(&x); pair_free(&w); pair_free(&b); pair_free(&y); pair_free(&pre);
}

/* grad_dt: dtype of dW and db (F32: master-gradient layout with the fused bias gradient). */
static void test_backward(nt_dtype dt, nt_dtype grad_dt) {
  nt_test_rng r = {200 + dt * 10 + grad_dt};
  pair x, w, dy, dx, dw, db, db2;
  int64_t xs[3] = {B0, T, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {B0, T, OUT};
  if (!pair_make(&x, dt, 3, xs, &r, 0) || !pair_make(&w, dt, 2, ws, &r, 0) ||
      !pair_make(&dy, dt, 3, ys, &r, 0) || !pair_make(&dx, dt, 3, xs, NULL, 0.25f) ||
      !pair_make(&dw, grad_dt, 2, ws, NULL, -0.5f) || !pair_make(&db, grad_dt, 1, bs, NULL, 0.125f) ||
      !pair_make(&db2, grad_dt, 1, bs, NULL, 0.0f))
    return;
  char name[96];
  for (int rep = 0; rep < 2; rep++) {
    if (!CHECK_OK(cpu, nt_linear_backward(cpu, &dy.h, &x.h, &w.h, &dx.h, &dw.h, &db.h)) ||
        !CHECK_OK(gpu, nt_linear_backward(gpu, &dy.d, &x.d, &w.d, &dx.d, &dw.d, &db.d)) ||
        !CHECK_OK(cpu, nt_linear_backward(cpu, &dy.h, &x.h, &w.h, NULL, NULL, &db2.h)) ||
        !CHECK_OK(gpu, nt_linear_backward(gpu, &dy.d, &x.d, &w.d, NULL, NULL, &db2.d)))
      break;
    const char *s = rep ? "after 2 calls" : "after 1 call";
    snprintf(name, sizeof name, "%s backward dx (%s)", nt_dtype_name(dt), s);
    compare(&dx, name, dt, 0);
    snprintf(name, sizeof name, "%s backward dW %s (%s)", nt_dtype_name(dt),
             nt_dtype_name(grad_dt), s);
    compare(&dw, name, dt, 0);
    snprintf(name, sizeof name, "%s backward db %s (%s)", nt_dtype_name(dt),
             nt_dtype_name(grad_dt), s);
    compare(&db, name, dt, 0);
    snprintf(name, sizeof name, "%s backward db alone %s (%s)", nt_dtype_name(dt),
             nt_dtype_name(grad_dt), s);
    compare(&db2, name, dt, 0);
  }
  pair_free(&x); pair_free(&w); pair_free(&dy); pair_free(&dx); pair_free(&dw);
  pair_free(&db); pair_free(&db2);
}

/* nt_linear_backward_ex: x = gelu(pre); dx starts as NaN on both sides (an overwrite must not
 * read it); two calls with the fused GELU backward (dx the same, dW and db accumulated), then
 * one overwrite without it. */
static void test_backward_ex(nt_dtype dt, int64_t rows, int64_t in, int64_t out) {
  nt_test_rng r = {300 + dt + rows};
  pair pre, x, w, dy, dx, dw, db;
  int64_t xs[2] = {rows, in}, ws[2] = {out, in}, bs[1] = {out}, ys[2] = {rows, out};
  if (!pair_make(&pre, dt, 2, xs, &r, 0) || !pair_make(&x, dt, 2, xs, NULL, 0) ||
      !pair_make(&w, dt, 2, ws, &r, 0) || !pair_make(&dy, dt, 2, ys, &r, 0) ||
      !pair_make(&dx, dt, 2, xs, NULL, NAN) || !pair_make(&dw, NT_F32, 2, ws, NULL, -0.5f) ||
      !pair_make(&db, NT_F32, 1, bs, NULL, 0.125f))
    return;
  /* pre in [-2, 2] (both branches of the GELU's curve), x = gelu(pre) as the forward gives */
  for (int64_t i = 0; i < rows * in; i++) {
    float p = 2.0f * nt_load_f32(pre.h.data, dt, i);
    nt_store_f32(pre.h.data, dt, i, p);
    double u = 0.7978845608028654 * (p + 0.044715 * (double)p * p * p);
    nt_store_f32(x.h.data, dt, i, (float)(0.5 * p * (1 + tanh(u))));
  }
  if (!CHECK_OK(gpu, nt_tensor_copy(gpu, &pre.d, &pre.h)) ||
      !CHECK_OK(gpu, nt_tensor_copy(gpu, &x.d, &x.h)))
    return;
  char name[96];
  for (int rep = 0; rep < 2; rep++) {
    nt_linear_bwd_opts oc = {.overwrite_dx = true, .dgelu_pre = &pre.h};
    nt_linear_bwd_opts og = {.overwrite_dx = true, .dgelu_pre = &pre.d};
    if (!CHECK_OK(cpu, nt_linear_backward_ex(cpu, &dy.h, &x.h, &w.h, &dx.h, &dw.h, &db.h, &oc)) ||
        !CHECK_OK(gpu, nt_linear_backward_ex(gpu, &dy.d, &x.d, &w.d, &dx.d, &dw.d, &db.d, &og)))
      break;
    snprintf(name, sizeof name, "%s %lldx%lldx%lld gelu-fused dx (call %d)", nt_dtype_name(dt),
             (long long)rows, (long long)in, (long long)out, rep + 1);
    /* cuBLASLt's fused DGELU may use the hardware tanh approximation: 1e-3 there */
    compare(&dx, name, dt, 1e-3);
    snprintf(name, sizeof name, "%s %lldx%lldx%lld ex dW f32 (call %d)", nt_dtype_name(dt),
             (long long)rows, (long long)in, (long long)out, rep + 1);
    compare(&dw, name, dt, 0);
    snprintf(name, sizeof name, "%s %lldx%lldx%lld ex db f32 (call %d)", nt_dtype_name(dt),
             (long long)rows, (long long)in, (long long)out, rep + 1);
    compare(&db, name, dt, 0);
  }
  pair_free(&dx);
  if (pair_make(&dx, dt, 2, xs, NULL, NAN)) {
    nt_linear_bwd_opts o = {.overwrite_dx = true};
    if (CHECK_OK(cpu, nt_linear_backward_ex(cpu, &dy.h, &x.h, &w.h, &dx.h, NULL, NULL, &o)) &&
        CHECK_OK(gpu, nt_linear_backward_ex(gpu, &dy.d, &x.d, &w.d, &dx.d, NULL, NULL, &o))) {
      snprintf(name, sizeof name, "%s %lldx%lldx%lld overwritten dx", nt_dtype_name(dt),
               (long long)rows, (long long)in, (long long)out);
      compare(&dx, name, dt, 0);
    }
  }
  pair_free(&pre); pair_free(&x); pair_free(&w); pair_free(&dy); pair_free(&dx);
  pair_free(&dw); pair_free(&db);
}

int main(void) {
  gpu = nt_test_cuda_ctx();
  if (!gpu) return nt_test_skip("no GPU");
  if (nt_ctx_create(&cpu, nt_cpu())) return 1;
  nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  for (int i = 0; i < 3; i++) {
    test_forward(dts[i]);
    test_backward(dts[i], NT_F32);
    if (dts[i] != NT_F32) test_backward(dts[i], dts[i]);
    test_backward_ex(dts[i], R, IN, OUT);
    test_backward_ex(dts[i], 256, 192, 48);
  }
  nt_ctx_free(cpu);
  nt_ctx_free(gpu);
  return nt_test_finish();
}
