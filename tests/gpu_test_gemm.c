/* GEMM on the GPU (cuBLASLt) against the CPU reference run on the same rounded inputs: every
 * dtype (F32, TF32, F16, BF16, FP8 where the GPU has it), every epilogue (fused and split
 * paths), transposes by flag and by view, padded leading dims, batches, alpha/beta, fp16
 * values near the range limit, the plan cache and autotuning. Tolerances ||gpu-cpu||/||cpu||:
 * fp32 1e-5, tf32 1e-3, fp16 2e-3, bf16 1e-2 (docs/semantics.md); fp8 2e-2: both sides multiply the
 * same quantised values and accumulate in fp32, so what is left is the order of accumulation,
 * Hopper's FP8 accumulator (partial sums held with fewer mantissa bits between promotions) and
 * the rounding of D, each well under 1e-2. */
#include "tests/testutil.h"
#include "ops/gemm.h"
#include "ops/gemm_internal.h"
#include <math.h>
#include <stdlib.h>
#ifdef NT_HAVE_CUDA
#include "ops/gemm_lt.h"
#include <cuda_runtime_api.h>
#endif
#include <string.h>

typedef struct {
  nt_dtype in_a, in_b, out;
  int64_t M, N, K;
  int64_t batch_a, batch_b, batch_d;
  bool ta, tb, view_a, view_b, tf32;
  int64_t pad;
  float alpha, beta;
  nt_gemm_epilogue epi;
  bool bias;
  nt_dtype bias_dt;
  float lo, hi;              /* input range */
  bool tf32_exact;           /* inputs representable in TF32 (10-bit mantissa) */
  bool tf32_default_on;      /* the context's TF32 default is on during the call */
  bool tf32_via_default;     /* the call leaves tf32 at NT_TF32_DEFAULT (else ON / OFF per tf32) */
  double tol;                /* 0: the dtype's tolerance */
  int scale_b_at;            /* FP8: B's scale at this float index of the scale buffer (0: 4,
                                16-byte aligned; 1 puts it 4 bytes after A's, as views into one
                                scale array do) */
  bool sep_c;                /* beta != 0 reads C from opts.c (D is NaN-filled) */
} gcase;

typedef struct { nt_ctx *cpu, *gpu; } ctxs;

/* A host buffer and a device copy with the same layout. */
typedef struct {
  void *h, *d;
  size_t bytes;
} buf;

static bool buf_make(ctxs *c, buf *b, size_t bytes) {
  b->bytes = bytes ? bytes : 1;
  b->h = calloc(1, b->bytes);
  b->d = NULL;
  return b->h && CHECK_OK(c->gpu, nt_alloc(c->gpu, b->bytes, &b->d));
}

static bool buf_copy(ctxs *c, buf *b, bool to_device) {
  int64_t n = (int64_t)b->bytes;
  nt_tensor h = nt_tensor_view(b->h, NT_U8, nt_cpu(), 1, &n);
  nt_tensor d = nt_tensor_view(b->d, NT_U8, nt_cuda(0), 1, &n);
  return CHECK_OK(c->gpu, to_device ? nt_tensor_copy(c->gpu, &d, &h) : nt_tensor_copy(c->gpu, &h, &d));
}

static void buf_free(ctxs *c, buf *b) {
  free(b->h);
  nt_free(c->gpu, b->d);
}

static float tf32_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u &= 0xffffe000u;
  memcpy(&x, &u, 4);
  return x;
}

/* Stored operand for op(X) [R, C]: physical storage, the view's shape and strides. */
static bool make_operand(ctxs *c, nt_test_rng *r, const gcase *g, nt_dtype dt, int64_t batch,
                         int64_t R, int64_t C, bool trans, bool view, buf *b, nt_tensor *t) {
  int64_t nb = batch ? batch : 1;
  int64_t rows = trans ? C : R, cols = trans ? R : C;
  int64_t prow = view ? cols : rows, pcol = (view ? rows : cols) + g->pad;
  int64_t n = nb * prow * pcol;
  if (!buf_make(c, b, (size_t)n * nt_dtype_size(dt))) return false;
  for (int64_t i = 0; i < n; i++) {
    float v = (float)nt_test_uniform(r, g->lo, g->hi);
    nt_store_f32(b->h, dt, i, g->tf32_exact ? tf32_round(v) : v);
  }
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  int d = batch ? 1 : 0;
  if (batch) { t->shape[0] = batch; t->stride[0] = prow * pcol; }
  t->ndim = d + 2;
  t->shape[d] = rows; t->shape[d + 1] = cols;
  t->stride[d] = view ? 1 : pcol; t->stride[d + 1] = view ? pcol : 1;
  return buf_copy(c, b, true);
}

static double tol_of(const gcase *g) {
  if (g->tol > 0) return g->tol;
  if (g->in_a == NT_FP8_E4M3 || g->in_a == NT_FP8_E5M2) return 2e-2;
  if (g->tf32) return 1e-3;
  if (g->in_a == NT_F32) return 1e-5;
  if (g->in_a == NT_F16 && g->out != NT_BF16) return 2e-3;
  return 1e-2;
}

static double rel_err(const void *got, const void *ref, nt_dtype dt, int64_t n, bool *finite) {
  double num = 0, den = 0;
  *finite = true;
  for (int64_t i = 0; i < n; i++) {
    double a = nt_load_f32(got, dt, i), b = nt_load_f32(ref, dt, i);
    if (!isfinite(a)) *finite = false;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

/* Runs one case on both devices; returns the D error (or -1 when it could not run). */
static double run_case(ctxs *c, const gcase *g, const char *name) {
  nt_test_rng r = {(uint64_t)(g->M * 131 + g->N * 7 + g->K + g->epi * 1000 + g->out * 17)};
  bool fp8 = g->in_a == NT_FP8_E4M3 || g->in_a == NT_FP8_E5M2;
  buf A, B, D, X, Bias, S, Cb;
  memset(&A, 0, sizeof A); B = X = Bias = S = D = Cb = A;
  nt_tensor ta, tb;
  double err = -1;
  int64_t nb = g->batch_d ? g->batch_d : 1, n = nb * g->M * g->N;
  size_t ed = nt_dtype_size(g->out);
  if (!make_operand(c, &r, g, g->in_a, g->batch_a, g->M, g->K, g->ta, g->view_a, &A, &ta) ||
      !make_operand(c, &r, g, g->in_b, g->batch_b, g->K, g->N, g->tb, g->view_b, &B, &tb) ||
      !buf_make(c, &D, (size_t)n * ed) || !buf_make(c, &X, (size_t)n * ed) ||
      !buf_make(c, &Bias, (size_t)g->N * 4) || !buf_make(c, &S, 64) ||
      !buf_make(c, &Cb, (size_t)n * ed))
    goto done;
  for (int64_t i = 0; i < n; i++) {
    nt_store_f32(D.h, g->out, i, g->beta != 0.0f ? (float)nt_test_uniform(&r, -1, 1) : NAN);
    nt_store_f32(X.h, g->out, i, (float)nt_test_uniform(&r, -2, 2));
    nt_store_f32(Cb.h, g->out, i, (float)nt_test_uniform(&r, -1, 1));
    if (g->sep_c) nt_store_f32(D.h, g->out, i, NAN);   /* C comes from Cb; D is not read */
  }
  for (int64_t j = 0; j < g->N; j++)
    nt_store_f32(Bias.h, g->bias_dt, j, (float)nt_test_uniform(&r, -1, 1));
  int sb = g->scale_b_at ? g->scale_b_at : 4;
  ((float *)S.h)[0] = 0.5f;
  ((float *)S.h)[sb] = 0.25f;
  if (!buf_copy(c, &D, true) || !buf_copy(c, &X, true) || !buf_copy(c, &Bias, true) ||
      !buf_copy(c, &S, true) || !buf_copy(c, &Cb, true))
    goto done;

  int64_t dshape[3] = {g->batch_d, g->M, g->N};
  int dn = g->batch_d ? 3 : 2;
  const int64_t *ds = g->batch_d ? dshape : dshape + 1;
  nt_tensor hA = ta, hB = tb, dA = ta, dB = tb;
  hA.data = A.h; hA.device = nt_cpu(); dA.data = A.d; dA.device = nt_cuda(0);
  hB.data = B.h; hB.device = nt_cpu(); dB.data = B.d; dB.device = nt_cuda(0);
  nt_tensor hD = nt_tensor_view(D.h, g->out, nt_cpu(), dn, ds);
  nt_tensor dD = nt_tensor_view(D.d, g->out, nt_cuda(0), dn, ds);
  nt_tensor hX = nt_tensor_view(X.h, g->out, nt_cpu(), dn, ds);
  nt_tensor dX = nt_tensor_view(X.d, g->out, nt_cuda(0), dn, ds);
  int64_t N = g->N;
  nt_tensor hC = nt_tensor_view(Cb.h, g->out, nt_cpu(), dn, ds);
  nt_tensor dC = nt_tensor_view(Cb.d, g->out, nt_cuda(0), dn, ds);
  nt_tensor hBias = nt_tensor_view(Bias.h, g->bias_dt, nt_cpu(), 1, &N);
  nt_tensor dBias = nt_tensor_view(Bias.d, g->bias_dt, nt_cuda(0), 1, &N);

  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_a = g->ta; o.trans_b = g->tb;
  o.alpha = g->alpha; o.beta = g->beta;
  o.epilogue = g->epi;
  o.bias = g->bias ? &dBias : NULL;
  o.aux = &dX;
  o.c = g->sep_c ? &dC : NULL;
  if (fp8) { o.scale_inv_a = (float *)S.d; o.scale_inv_b = (float *)S.d + sb; }
  o.tf32 = g->tf32_via_default ? NT_TF32_DEFAULT : g->tf32 ? NT_TF32_ON : NT_TF32_OFF;
  nt_ctx_set_allow_tf32(c->gpu, g->tf32_default_on);
  nt_status st = nt_gemm(c->gpu, &dA, &dB, &dD, &o);
  nt_ctx_set_allow_tf32(c->gpu, false);
  if (!CHECK_OK(c->gpu, st)) {
    fprintf(stderr, "  in case %s\n", name);
    goto done;
  }
  o.bias = g->bias ? &hBias : NULL;
  o.aux = &hX;
  o.c = g->sep_c ? &hC : NULL;
  if (fp8) { o.scale_inv_a = (float *)S.h; o.scale_inv_b = (float *)S.h + sb; }
  if (!CHECK_OK(c->cpu, nt_gemm(c->cpu, &hA, &hB, &hD, &o))) goto done;
  /* The GPU results come back into the device buffers' host twins, in fresh memory. */
  buf gD = D, gX = X;
  gD.h = malloc(D.bytes); gX.h = malloc(X.bytes);
  if (buf_copy(c, &gD, false) && buf_copy(c, &gX, false)) {
    bool fin;
    double tol = tol_of(g), tol_d = tol;
    /* cuBLASLt's fused GELU may evaluate tanh with the hardware approximation (relative error
     * up to 2^-11): D after GELU / DGELU is held to 1e-3 where the dtype asks for less; the
     * pre-activation (aux) keeps the dtype's tolerance. */
    if ((g->epi == NT_EPI_GELU_AUX || g->epi == NT_EPI_DGELU) && tol_d < 1e-3) tol_d = 1e-3;
    err = rel_err(gD.h, D.h, g->out, n, &fin);
    CHECK(err < tol_d && fin, "%s: D rel err %.3g (tol %.1g)%s", name, err, tol_d,
          fin ? "" : ", non-finite values");
    if (g->epi == NT_EPI_GELU_AUX) {
      double ex = rel_err(gX.h, X.h, g->out, n, &fin);
      CHECK(ex < tol && fin, "%s: aux rel err %.3g", name, ex);
    }
    printf("  %-44s rel err %.2e\n", name, err);
  }
  free(gD.h); free(gX.h);
done:
  buf_free(c, &A); buf_free(c, &B); buf_free(c, &D); buf_free(c, &X);
  buf_free(c, &Bias); buf_free(c, &S); buf_free(c, &Cb);
  return err;
}

static gcase base(nt_dtype in, nt_dtype out) {
  gcase g;
  memset(&g, 0, sizeof g);
  g.in_a = g.in_b = in; g.out = out;
  g.M = 37; g.N = 53; g.K = 29;
  g.alpha = 1.0f;
  g.bias_dt = NT_F32;
  g.lo = -1.0f; g.hi = 1.0f;
  return g;
}

static const struct { nt_dtype in, out; bool tf32; const char *name; } kinds[] = {
    {NT_F32, NT_F32, false, "f32"},   {NT_F32, NT_F32, true, "tf32"},
    {NT_F16, NT_F16, false, "f16"},   {NT_F16, NT_F32, false, "f16->f32"},
    {NT_BF16, NT_BF16, false, "bf16"}, {NT_BF16, NT_F32, false, "bf16->f32"}};
enum { NKINDS = sizeof kinds / sizeof kinds[0] };

static void test_transposes(ctxs *c) {
  char name[96];
  for (int i = 0; i < NKINDS; i++)
    for (int v = 0; v < 2; v++)
      for (int t = 0; t < 4; t++) {
        gcase g = base(kinds[i].in, kinds[i].out);
        g.tf32 = g.tf32_exact = kinds[i].tf32;
        g.ta = t & 1; g.tb = t >> 1; g.view_a = g.view_b = v;
        g.pad = v ? 0 : 3;
        snprintf(name, sizeof name, "%s ta%d tb%d %s", kinds[i].name, g.ta, g.tb,
                 v ? "views" : "padded ld");
        run_case(c, &g, name);
      }
  /* TF32 on full fp32 inputs: it must differ from fp32 (TF32 really on) by about TF32's
   * input rounding. Where the tensor cores truncate the 13 low mantissa bits instead of
   * rounding, every product shrinks by ~7e-4 on average, so this case (and only this one, the
   * others use TF32-exact inputs and 1e-3) allows 2e-3. */
  gcase g = base(NT_F32, NT_F32);
  g.M = 128; g.N = 96; g.K = 256;
  g.tf32 = true;
  g.tol = 2e-3;
  double e = run_case(c, &g, "tf32 on full-precision inputs");
  CHECK(e > 1e-5, "tf32 differs from fp32 (%.3g): TF32 is in effect", e);
  /* The same through the context's default (the precision policy's path), and a call that
   * turns TF32 off while the default is on: fp32's tolerance. */
  g.tf32_via_default = g.tf32_default_on = true;
  e = run_case(c, &g, "tf32 from the context's default");
  CHECK(e > 1e-5, "the context's TF32 default is in effect (%.3g)", e);
  g.tf32_via_default = g.tf32 = false;
  g.tol = 0;
  e = run_case(c, &g, "fp32: TF32 off for the call, the context's default on");
  CHECK(e <= 1e-5, "a call's NT_TF32_OFF wins over the context's default (%.3g)", e);
}

static void test_epilogues(ctxs *c) {
  char name[128];
  for (int i = 0; i < NKINDS; i++) {
    if (kinds[i].in != kinds[i].out) continue;
    for (int aligned = 0; aligned < 2; aligned++)
      for (int e = NT_EPI_BIAS; e <= NT_EPI_DGELU; e++)
        for (int variant = 0; variant < 2; variant++) {
          gcase g = base(kinds[i].in, kinds[i].out);
          g.tf32 = g.tf32_exact = kinds[i].tf32;
          if (aligned) { g.M = 64; g.N = 96; g.K = 80; }
          g.epi = (nt_gemm_epilogue)e;
          bool biasable = e == NT_EPI_BIAS || e == NT_EPI_GELU_AUX || e == NT_EPI_RELU;
          if (variant && !biasable) continue;
          g.bias = e == NT_EPI_BIAS || (variant && biasable);
          if (e == NT_EPI_BIAS && variant) g.bias_dt = g.out;
          if (e == NT_EPI_DGELU) g.tb = true;
          snprintf(name, sizeof name, "%s %s epi %d bias %s beta %g", kinds[i].name,
                   aligned ? "64x96x80" : "37x53x29", e,
                   g.bias ? nt_dtype_name(g.bias_dt) : "none", (double)g.beta);
          run_case(c, &g, name);
        }
  }
  /* A separate C: the projection + residual add of a transformer block, one launch. */
  for (int i = 0; i < NKINDS; i++) {
    if (kinds[i].in != kinds[i].out || kinds[i].tf32) continue;
    gcase g = base(kinds[i].in, kinds[i].out);
    g.M = 64; g.N = 96; g.K = 80; g.tb = true;
    g.beta = 1.0f; g.sep_c = true; g.epi = NT_EPI_BIAS; g.bias = true;
    snprintf(name, sizeof name, "%s bias + separate C (residual)", kinds[i].name);
    run_case(c, &g, name);
    g.epi = NT_EPI_NONE; g.bias = false; g.beta = 0.5f; g.M = 37; g.N = 53; g.K = 29;
    snprintf(name, sizeof name, "%s beta 0.5 separate C 37x53x29", kinds[i].name);
    run_case(c, &g, name);
  }
}

/* nt_gemm_bias_grad on the GPU against the CPU (fp64 sums): GPT shapes, an odd width and a
 * padded row stride (the scalar path), each dtype; two GPU runs are bitwise equal (a fixed
 * summation order). */
static void test_bias_grad(ctxs *c) {
  static const struct { int64_t M, N, ld; } sh[] = {
      {16384, 768, 768}, {16384, 2304, 2304}, {4096, 3072, 3072}, {1000, 65, 65},
      {777, 384, 392}, {3, 8, 8}};
  nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++)
    for (int d = 0; d < 3; d++) {
      int64_t M = sh[k].M, N = sh[k].N, ld = sh[k].ld;
      size_t es = nt_dtype_size(dts[d]);
      nt_test_rng r = {(uint64_t)(M + N + d)};
      buf Y, G;
      memset(&Y, 0, sizeof Y);
      G = Y;
      float *g1 = malloc((size_t)N * 4), *g2 = malloc((size_t)N * 4), *gc = malloc((size_t)N * 4);
      if (!g1 || !g2 || !gc || !buf_make(c, &Y, (size_t)(M * ld) * es) ||
          !buf_make(c, &G, (size_t)N * 4))
        goto next;
      for (int64_t i = 0; i < M * ld; i++)
        nt_store_f32(Y.h, dts[d], i, (float)nt_test_uniform(&r, -0.5, 1.0));
      for (int64_t j = 0; j < N; j++) ((float *)G.h)[j] = 0.25f * (float)(j % 5);
      memcpy(gc, G.h, (size_t)N * 4);
      if (!buf_copy(c, &Y, true)) goto next;
      nt_tensor hy = nt_tensor_view(Y.h, dts[d], nt_cpu(), 2, (int64_t[]){M, N});
      nt_tensor dy = nt_tensor_view(Y.d, dts[d], nt_cuda(0), 2, (int64_t[]){M, N});
      hy.stride[0] = dy.stride[0] = ld;
      nt_tensor hg = nt_tensor_view(gc, NT_F32, nt_cpu(), 1, &N);
      nt_tensor dg = nt_tensor_view(G.d, NT_F32, nt_cuda(0), 1, &N);
      bool ok = CHECK_OK(c->cpu, nt_gemm_bias_grad(c->cpu, &hy, &hg));
      for (int run = 0; run < 2 && ok; run++) {
        ok = buf_copy(c, &G, true) && CHECK_OK(c->gpu, nt_gemm_bias_grad(c->gpu, &dy, &dg));
        buf out = G;
        out.h = run ? g2 : g1;
        ok = ok && buf_copy(c, &out, false);
      }
      if (ok) {
        bool fin;
        double e = rel_err(g1, gc, NT_F32, N, &fin);
        /* the H200 measured at most 6.71e-8 (2026-12-04 03:20): about twice that */
        CHECK(e < 1.3e-7 && fin, "bias_grad %s %lldx%lld ld %lld: rel err %.3g",
              nt_dtype_name(dts[d]), (long long)M, (long long)N, (long long)ld, e);
        CHECK(!memcmp(g1, g2, (size_t)N * 4), "bias_grad %s %lldx%lld: two runs bitwise equal",
              nt_dtype_name(dts[d]), (long long)M, (long long)N);
        printf("  bias_grad %-5s %6lld x %5lld ld %5lld  rel err %.2e\n", nt_dtype_name(dts[d]),
               (long long)M, (long long)N, (long long)ld, e);
      }
    next:
      buf_free(c, &Y); buf_free(c, &G);
      free(g1); free(g2); free(gc);
    }
}

static void test_batched_alpha_beta(ctxs *c) {
  for (int i = 0; i < NKINDS; i++) {
    char name[96];
    gcase g = base(kinds[i].in, kinds[i].out);
    g.tf32 = g.tf32_exact = kinds[i].tf32;
    g.M = 19; g.N = 23; g.K = 17;
    g.batch_a = g.batch_b = g.batch_d = 3;
    snprintf(name, sizeof name, "%s batched 3", kinds[i].name);
    run_case(c, &g, name);
    g.batch_b = 1; g.tb = true;
    snprintf(name, sizeof name, "%s batched, B broadcast", kinds[i].name);
    run_case(c, &g, name);
    g.batch_a = 0; g.ta = true; g.batch_b = 3;
    g.epi = NT_EPI_BIAS; g.bias = true;
    snprintf(name, sizeof name, "%s batched, A 2-D, bias", kinds[i].name);
    run_case(c, &g, name);
    g = base(kinds[i].in, kinds[i].out);
    g.tf32 = g.tf32_exact = kinds[i].tf32;
    g.alpha = 0.5f; g.beta = 0.75f;
    snprintf(name, sizeof name, "%s alpha 0.5 beta 0.75", kinds[i].name);
    run_case(c, &g, name);
    g.alpha = -2.0f; g.beta = 1.0f;
    snprintf(name, sizeof name, "%s alpha -2 beta 1", kinds[i].name);
    run_case(c, &g, name);
  }
}

/* Products summing to ~58000 (fp16's max is 65504): no overflow in the fp32 accumulation or
 * the epilogue, and the fp16 output rounded like the CPU's. */
static void test_fp16_range(ctxs *c) {
  gcase g = base(NT_F16, NT_F16);
  g.M = 33; g.N = 41; g.K = 64;
  g.lo = 29.0f; g.hi = 31.0f;
  run_case(c, &g, "f16 sums near 60000");
  g.epi = NT_EPI_BIAS; g.bias = true; g.bias_dt = NT_F16;
  run_case(c, &g, "f16 sums near 60000 + bias");
  g.epi = NT_EPI_NONE; g.bias = false; g.tb = true; g.out = NT_F32;
  run_case(c, &g, "f16 sums near 60000 -> f32");
  g = base(NT_F16, NT_F16);
  g.lo = -1e-3f; g.hi = 1e-3f;  /* products (1e-6) far below fp16's normal range */
  g.out = NT_F32;
  run_case(c, &g, "f16 tiny inputs -> f32");
}

static void test_fp8(ctxs *c, int cc) {
  gcase g = base(NT_FP8_E4M3, NT_BF16);
  g.M = 64; g.N = 128; g.K = 96;
  g.tb = true;
  g.lo = -4.0f; g.hi = 4.0f;
  if (cc < 89) {
    buf T, Dm;
    if (!buf_make(c, &T, 256) || !buf_make(c, &Dm, 1024)) return;
    nt_tensor t = nt_tensor_view(T.d, NT_FP8_E4M3, nt_cuda(0), 2, (int64_t[]){16, 16});
    nt_tensor d = nt_tensor_view(Dm.d, NT_F32, nt_cuda(0), 2, (int64_t[]){16, 16});
    nt_gemm_opts o = nt_gemm_defaults();
    o.trans_b = true;
    CHECK_ERR(c->gpu, NT_ERR_UNSUPPORTED, nt_gemm(c->gpu, &t, &t, &d, &o));
    buf_free(c, &T); buf_free(c, &Dm);
    printf("  fp8: compute capability %d.%d < 8.9, checked the error only\n", cc / 10, cc % 10);
    return;
  }
  run_case(c, &g, "fp8 e4m3 x e4m3 -> bf16");
  g.out = NT_F16;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> f16");
  g.in_b = NT_FP8_E5M2; g.out = NT_F32;
  run_case(c, &g, "fp8 e4m3 x e5m2 -> f32");
  g.in_a = NT_FP8_E5M2; g.in_b = NT_FP8_E4M3; g.out = NT_BF16;
  run_case(c, &g, "fp8 e5m2 x e4m3 -> bf16");
  g.in_a = NT_FP8_E4M3;
  g.epi = NT_EPI_BIAS; g.bias = true; g.bias_dt = NT_BF16;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> bf16 + bf16 bias");
  /* Accumulation (beta != 0): C is D, in place or through a copy (see gemm.h). */
  g.epi = NT_EPI_NONE; g.bias = false;
  g.beta = 1.0f; g.out = NT_F32;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> f32, beta 1");
  g.beta = 0.5f; g.alpha = 2.0f; g.out = NT_BF16;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> bf16, alpha 2 beta 0.5");
  g.beta = 0.0f; g.alpha = 1.0f;
  /* Odd M (rows of D need not be a multiple of 16: only the leading dims do). */
  g.M = 37; g.out = NT_F16;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> f16, M 37");
  g.M = 64;
  /* Scale pointers only 4-byte aligned (adjacent floats of one array). */
  g.scale_b_at = 1; g.out = NT_BF16;
  run_case(c, &g, "fp8 e4m3 x e4m3 -> bf16, scales 4 bytes apart (staged)");
  g.scale_b_at = 0;
  /* Layouts other than TN are refused with a clear message. */
  buf A, B, D;
  if (!buf_make(c, &A, 64 * 96) || !buf_make(c, &B, 128 * 96) || !buf_make(c, &D, 64 * 128 * 2))
    return;
  nt_tensor ta = nt_tensor_view(A.d, NT_FP8_E4M3, nt_cuda(0), 2, (int64_t[]){64, 96});
  nt_tensor tb = nt_tensor_view(B.d, NT_FP8_E4M3, nt_cuda(0), 2, (int64_t[]){96, 128});
  nt_tensor td = nt_tensor_view(D.d, NT_BF16, nt_cuda(0), 2, (int64_t[]){64, 128});
  CHECK_ERR(c->gpu, NT_ERR_UNSUPPORTED, nt_gemm(c->gpu, &ta, &tb, &td, NULL));
  printf("  fp8 NN refused: %s\n", nt_last_error(c->gpu));
  /* e5m2 x e5m2 has no cuBLASLt kernel: refused by name. */
  nt_tensor tbt = nt_tensor_view(B.d, NT_FP8_E5M2, nt_cuda(0), 2, (int64_t[]){128, 96});
  ta.dtype = NT_FP8_E5M2;
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  CHECK_ERR(c->gpu, NT_ERR_UNSUPPORTED, nt_gemm(c->gpu, &ta, &tbt, &td, &o));
  CHECK(strstr(nt_last_error(c->gpu), "e5m2 x e5m2") != NULL, "names the pair: %s",
        nt_last_error(c->gpu));
  buf_free(c, &A); buf_free(c, &B); buf_free(c, &D);
}

/* The second identical call creates no descriptor; a new shape does. */
static void test_plan_cache(ctxs *c) {
  gcase g = base(NT_BF16, NT_BF16);
  g.M = 40; g.N = 24; g.K = 56;
  nt_gemm_stats s0, s1, s2;
  run_case(c, &g, "cache: first call");
  nt_gemm_get_stats(c->gpu, &s0);
  run_case(c, &g, "cache: same shape again");
  nt_gemm_get_stats(c->gpu, &s1);
  CHECK(s1.descriptors == s0.descriptors, "no descriptors on a cache hit (%llu -> %llu)",
        (unsigned long long)s0.descriptors, (unsigned long long)s1.descriptors);
  CHECK(s1.hits == s0.hits + 1 && s1.misses == s0.misses, "one hit, no miss");
  g.K = 57;
  run_case(c, &g, "cache: new shape");
  nt_gemm_get_stats(c->gpu, &s2);
  CHECK(s2.descriptors > s1.descriptors && s2.misses == s1.misses + 1, "a new shape is a miss");
  CHECK(s2.plans == s1.plans + 1, "one more plan (%llu)", (unsigned long long)s2.plans);
  printf("  plans %llu, descriptors %llu, hits %llu, misses %llu, autotuned %llu, split %llu\n",
         (unsigned long long)s2.plans, (unsigned long long)s2.descriptors,
         (unsigned long long)s2.hits, (unsigned long long)s2.misses,
         (unsigned long long)s2.autotuned, (unsigned long long)s2.split_epilogues);
  if (nt_ctx_opts(c->gpu)->gemm_autotune)
    CHECK(s2.autotuned > 0, "autotuning picked some algorithms by timing");
}

static void test_gpu_errors(ctxs *c) {
  buf A;
  if (!buf_make(c, &A, 4096)) return;
  /* Neither of A's last two strides is 1. */
  nt_tensor a = nt_tensor_view(A.d, NT_F32, nt_cuda(0), 2, (int64_t[]){4, 4});
  a.stride[0] = 8; a.stride[1] = 2;
  nt_tensor b = nt_tensor_view(A.d, NT_F32, nt_cuda(0), 2, (int64_t[]){4, 4});
  nt_tensor d = nt_tensor_view((float *)A.d + 512, NT_F32, nt_cuda(0), 2, (int64_t[]){4, 4});
  CHECK_ERR(c->gpu, NT_ERR_UNSUPPORTED, nt_gemm(c->gpu, &a, &b, &d, NULL));
  nt_tensor h = b;
  h.device = nt_cpu();
  CHECK_ERR(c->gpu, NT_ERR_DEVICE, nt_gemm(c->gpu, &h, &b, &d, NULL));
  buf_free(c, &A);
}

/* The autotuner's result checksum on the GPU against its CPU twin: f32, f16, bf16, padded rows,
 * a batch of 2. Both sum the same values in fp64, in different orders. */
static void test_checksum_kernel(ctxs *c) {
#ifdef NT_HAVE_CUDA
  enum { B = 2, M = 37, N = 53, LD = 61 };
  const nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  nt_test_rng r = {7};
  for (int t = 0; t < 3; t++) {
    buf D, S;
    memset(&D, 0, sizeof D);
    S = D;
    if (!buf_make(c, &D, (size_t)B * M * LD * nt_dtype_size(dts[t])) ||
        !buf_make(c, &S, NT_GEMM_NSUMS * sizeof(double)))
      goto next;
    for (int64_t i = 0; i < (int64_t)B * M * LD; i++)
      nt_store_f32(D.h, dts[t], i, (float)nt_test_uniform(&r, -2, 2));
    if (!buf_copy(c, &D, true)) goto next;
    double cpu[NT_GEMM_NSUMS], gpu[NT_GEMM_NSUMS];
    nt_gemm_checksum_cpu(dts[t], D.h, LD, (int64_t)M * LD, M, N, B, cpu);
    if (!CHECK_OK(c->gpu, nt_gemmk_checksum(c->gpu, dts[t], D.d, LD, (int64_t)M * LD, M, N, B,
                                            (double *)S.d)) ||
        !buf_copy(c, &S, false))
      goto next;
    memcpy(gpu, S.h, sizeof gpu);
    double worst = 0;
    for (int j = 0; j < NT_GEMM_NSUMS; j++) {
      double d = fabs(gpu[j] - cpu[j]) / sqrt(cpu[0]);
      if (d > worst) worst = d;
    }
    CHECK(worst < 1e-9 && nt_gemm_checksum_rel_diff(gpu, cpu) < 1e-9,
          "%s checksum kernel vs CPU: worst sum difference %.3g (relative to ||D||)",
          nt_dtype_name(dts[t]), worst);
    printf("  checksum kernel %-4s vs CPU: %.2e\n", nt_dtype_name(dts[t]), worst);
  next:
    buf_free(c, &D);
    buf_free(c, &S);
  }
#else
  (void)c;
#endif
}

static void print_stats(const char *what, nt_ctx *ctx, nt_gemm_stats *s) {
  nt_gemm_get_stats(ctx, s);
  printf("  %s: plans %llu, autotuned %llu, searched %llu (won %llu), timed %llu, verified %llu "
         "(split-K %llu), rejected %llu, split-K plans %llu, tuning %.3f s, workspace needed "
         "%llu bytes\n",
         what, (unsigned long long)s->plans, (unsigned long long)s->autotuned,
         (unsigned long long)s->searched, (unsigned long long)s->search_won,
         (unsigned long long)s->search_timed, (unsigned long long)s->search_verified,
         (unsigned long long)s->splitk_verified, (unsigned long long)s->search_rejected,
         (unsigned long long)s->splitk_plans, (double)s->tune_us * 1e-6,
         (unsigned long long)s->workspace_needed);
}

/* A context with the given GEMM search options (the rest from the environment). */
static nt_ctx *ctx_with(int search, bool verify) {
  nt_ctx_options o = nt_test_ctx_options();
  o.gemm_search = search;
  o.gemm_search_verify = verify;
  return nt_test_cuda_ctx_with(&o);
}

/* Odd shapes, long K (split-K territory), every dtype, beta != 0 (timing on scratch), batches,
 * fused epilogues and the fused bias gradient; each searched plan's result against the CPU. */
static void search_cases(ctxs *c, int cc) {
  gcase g = base(NT_BF16, NT_BF16);
  g.M = 72; g.N = 40; g.K = 8200; g.pad = 8;
  run_case(c, &g, "search bf16 72x40x8200, padded ld");
  g = base(NT_F16, NT_F16);
  g.M = 65; g.N = 33; g.K = 4097; g.ta = true; g.alpha = 2.0f; g.beta = 0.5f;
  run_case(c, &g, "search f16 ta 65x33x4097 alpha 2 beta 0.5");
  g = base(NT_F32, NT_F32);
  g.M = 45; g.N = 51; g.K = 3001; g.tb = true;
  run_case(c, &g, "search f32 tb 45x51x3001");
  g = base(NT_F32, NT_F32);
  g.tf32 = g.tf32_exact = true;
  g.M = 40; g.N = 24; g.K = 2048;
  run_case(c, &g, "search tf32 40x24x2048");
  g = base(NT_BF16, NT_F32);
  g.M = 19; g.N = 23; g.K = 1500; g.ta = true;
  g.batch_a = g.batch_b = g.batch_d = 3;
  run_case(c, &g, "search bf16->f32 batched 3, ta, 19x23x1500");
  g = base(NT_BF16, NT_BF16);
  g.M = 64; g.N = 96; g.K = 2048; g.epi = NT_EPI_GELU_AUX; g.bias = true;
  run_case(c, &g, "search bf16 GELU_AUX + bias 64x96x2048");
  g = base(NT_F16, NT_F16);
  g.M = 37; g.N = 53; g.K = 2999; g.epi = NT_EPI_BIAS; g.bias = true; g.bias_dt = NT_F16;
  run_case(c, &g, "search f16 + f16 bias 37x53x2999");
  if (cc >= 89) {
    g = base(NT_FP8_E4M3, NT_BF16);
    g.M = 64; g.N = 128; g.K = 4096; g.tb = true; g.lo = -4.0f; g.hi = 4.0f;
    run_case(c, &g, "search fp8 e4m3 -> bf16 64x128x4096");
  }
}

/* "gpu_test_gemm search": the widened autotuning search. Every candidate is compared with the
 * heuristic's kernel (option gemm_search_verify) and every kept plan with the CPU; split-K
 * candidates must be among those verified. Then mode 1's threshold and mode 0. */
static void test_search(ctxs *c, int cc) {
  nt_gemm_stats s;
  nt_ctx *gpu0 = c->gpu;
  printf("gemm_search 2, every candidate verified:\n");
  if ((c->gpu = ctx_with(2, true))) {
    search_cases(c, cc);
    print_stats("search 2", c->gpu, &s);
    CHECK(s.searched >= s.plans && s.plans > 0, "every plan searched in mode 2");
    CHECK(s.search_timed > s.plans * 32, "the search timed more than the heuristic's lists");
    CHECK(s.search_verified > 0 && s.splitk_verified > 0,
          "searched candidates, split-K ones among them, were verified (%llu, %llu)",
          (unsigned long long)s.search_verified, (unsigned long long)s.splitk_verified);
    if (s.search_rejected)
      printf("  NOTE: %llu configurations differed from the heuristic's kernel and were dropped "
             "(see the WARN lines)\n", (unsigned long long)s.search_rejected);
    nt_ctx_free(c->gpu);
  }
  /* Mode 1: 1024 x 1024 x 512 is 1.07 GFLOP (searched), 37 x 53 x 29 is not. */
  for (int mode = 1; mode >= 0; mode--) {
    printf("gemm_search %d:\n", mode);
    if (!(c->gpu = ctx_with(mode, false))) continue;
    gcase g = base(NT_BF16, NT_BF16);
    g.M = 1024; g.N = 1024; g.K = 512;
    run_case(c, &g, "bf16 1024x1024x512 (1.07 GFLOP)");
    nt_gemm_get_stats(c->gpu, &s);
    CHECK(s.searched == (uint64_t)mode, "mode %d: searched %llu", mode,
          (unsigned long long)s.searched);
    g = base(NT_BF16, NT_BF16);
    run_case(c, &g, "bf16 37x53x29");
    print_stats(mode ? "search 1" : "search 0", c->gpu, &s);
    CHECK(s.searched == (uint64_t)mode && s.plans == 2, "a small product is not searched");
    nt_ctx_free(c->gpu);
  }
  c->gpu = gpu0;
}

static int compute_capability(void) {
  int major = 0, minor = 0;
#ifdef NT_HAVE_CUDA
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return 0;
#endif
  return major * 10 + minor;
}

/* "gpu_test_gemm fp8" runs the FP8 cases only (tests/gemm.cmake runs it with NT_LOG=debug, so
 * the log shows each FP8 plan: layouts, types, heuristic status and count, kernel kept).
 * "gpu_test_gemm search" runs the autotuner's search tests (test_search; it makes contexts
 * with the search options it needs). */
int main(int argc, char **argv) {
  ctxs c;
  bool fp8_only = argc > 1 && !strcmp(argv[1], "fp8");
  bool search = argc > 1 && !strcmp(argv[1], "search");
  c.gpu = nt_test_cuda_ctx();
  if (!c.gpu) return nt_test_skip("no GPU");
  if (nt_ctx_create(&c.cpu, nt_cpu())) return 1;
  if (fp8_only || search) {
    if (fp8_only) test_fp8(&c, compute_capability());
    if (search) {
      test_checksum_kernel(&c);
      test_search(&c, compute_capability());
    }
    nt_ctx_free(c.cpu);
    nt_ctx_free(c.gpu);
    return nt_test_finish();
  }
  test_checksum_kernel(&c);
  test_transposes(&c);
  test_epilogues(&c);
  test_bias_grad(&c);
  test_batched_alpha_beta(&c);
  test_fp16_range(&c);
  test_fp8(&c, compute_capability());
  test_plan_cache(&c);
  test_gpu_errors(&c);
  nt_ctx_free(c.cpu);
  nt_ctx_free(c.gpu);
  return nt_test_finish();
}
