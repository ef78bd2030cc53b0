/* GEMM on the CPU against a plain fp64 triple loop: every transpose (flags and transposed
 * views), odd shapes, padded leading dims, batched and broadcast batches, alpha/beta, each
 * epilogue, F16/BF16/FP8 inputs and the rounding of low-precision outputs; argument errors.
 * Also the autotuner's plain-C parts: NT_GEMM_SEARCH parsing, the widened-search threshold and
 * the result checksums that compare two kernels. */
#include "tests/testutil.h"
#include "ops/gemm.h"
#include "ops/gemm_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  nt_dtype in_a, in_b, out;
  int64_t M, N, K;
  int64_t batch_a, batch_b, batch_d;   /* 0: a 2-D tensor */
  bool ta, tb;
  bool view_a, view_b;                 /* transposed views of physically transposed storage */
  int64_t pad;                         /* extra elements per row of A and B */
  float alpha, beta;
  nt_gemm_epilogue epi;
  bool bias;
  nt_dtype bias_dt;
  float lo, hi;                        /* input range when hi > lo */
  bool sep_c;                          /* beta != 0 reads C from opts.c (D is NaN-filled) */
} gcase;

/* A stored operand: tensor view over host memory, and the rounded values of op(X) as doubles
 * [batch][rows_op][cols_op]. */
typedef struct {
  nt_tensor t;
  double *op;
  int64_t nb;
} operand;

static double gelu_d(double x, double *dg) {
  double s = 0.7978845608028654, c = 0.044715, t = tanh(s * (x + c * x * x * x));
  if (dg) *dg = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
  return 0.5 * x * (1 + t);
}

/* op(X) is [R, C]; stored as [R, C] (or [C, R] when trans); `view` stores the opposite
 * physically and takes a transposed view. */
static operand make_operand(nt_test_rng *r, nt_dtype dt, int64_t batch, int64_t R, int64_t C,
                            bool trans, bool view, int64_t pad, float lo, float hi) {
  operand o;
  int64_t nb = batch ? batch : 1;
  int64_t rows = trans ? C : R, cols = trans ? R : C;    /* logical stored shape */
  int64_t prow = view ? cols : rows, pcol = (view ? rows : cols) + pad;  /* physical */
  size_t es = nt_dtype_size(dt);
  void *mem = calloc((size_t)(nb * prow * pcol), es);
  o.op = malloc(sizeof(double) * (size_t)(nb * R * C));
  o.nb = nb;
  int64_t s_r = view ? 1 : pcol, s_c = view ? pcol : 1;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < R; i++)
      for (int64_t j = 0; j < C; j++) {
        int64_t rr = trans ? j : i, cc = trans ? i : j;
        int64_t off = b * prow * pcol + rr * s_r + cc * s_c;
        nt_store_f32(mem, dt, off, (float)nt_test_uniform(r, lo, hi));
        o.op[(b * R + i) * C + j] = nt_load_f32(mem, dt, off);
      }
  nt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = mem; t.dtype = dt; t.device = nt_cpu();
  int d = 0;
  if (batch) { t.shape[0] = batch; t.stride[0] = prow * pcol; d = 1; }
  t.ndim = d + 2;
  t.shape[d] = rows; t.shape[d + 1] = cols;
  t.stride[d] = s_r; t.stride[d + 1] = s_c;
  o.t = t;
  return o;
}

/* The worst D error per output dtype (f32, f16, bf16; others not kept), printed at the end. */
static double worst_d[3];

static double tol_for(nt_dtype out) {
  /* about twice the measured (docs/tolerances.md); the exact check is rounding_violations */
  return out == NT_F32 ? 2.5e-7 : out == NT_F16 ? 4e-4 : 3.3e-3;
}

/* Elements farther than half an ulp of `out` (plus slack[i], a bound on the fp32 accumulation
 * error) from the exact value: the output must be the correctly rounded fp32 result. */
static int64_t rounding_violations(const float *got, const double *ref, const double *slack,
                                   int64_t n, nt_dtype out) {
  if (out == NT_F32) return 0;
  int mant = out == NT_F16 ? 10 : 7;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = fabs(ref[i]);
    if (a < 1e-3) continue;  /* subnormal territory of f16 and cancellation noise */
    double ulp = ldexp(1.0, ilogb(a) - mant);
    if (fabs(got[i] - ref[i]) > 0.5 * ulp * 1.001 + slack[i]) bad++;
  }
  return bad;
}

static void run_case(nt_ctx *ctx, const gcase *c, const char *name) {
  nt_test_rng r = {(uint64_t)(c->M * 131 + c->N * 7 + c->K + c->epi * 1000 + c->out * 17)};
  bool fp8 = c->in_a == NT_FP8_E4M3 || c->in_a == NT_FP8_E5M2;
  float lo = fp8 ? -4.0f : -1.0f, hi = -lo;
  if (c->hi > c->lo) { lo = c->lo; hi = c->hi; }
  operand A = make_operand(&r, c->in_a, c->batch_a, c->M, c->K, c->ta, c->view_a, c->pad, lo, hi);
  operand B = make_operand(&r, c->in_b, c->batch_b, c->K, c->N, c->tb, c->view_b, c->pad, lo, hi);
  int64_t nb = c->batch_d ? c->batch_d : 1, MN = c->M * c->N, n = nb * MN;
  int64_t dshape[3] = {c->batch_d, c->M, c->N};
  void *dmem = calloc((size_t)n, nt_dtype_size(c->out));
  void *xmem = calloc((size_t)n, nt_dtype_size(c->out));
  void *cmem = calloc((size_t)n, nt_dtype_size(c->out));
  nt_tensor D = c->batch_d ? nt_tensor_view(dmem, c->out, nt_cpu(), 3, dshape)
                           : nt_tensor_view(dmem, c->out, nt_cpu(), 2, dshape + 1);
  nt_tensor X = D, Cm = D;
  X.data = xmem;
  Cm.data = cmem;
  double *d0 = malloc(sizeof(double) * (size_t)n), *x0 = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    nt_store_f32(dmem, c->out, i, c->beta != 0.0f ? (float)nt_test_uniform(&r, -1, 1) : NAN);
    d0[i] = nt_load_f32(dmem, c->out, i);
    if (c->sep_c) {  /* C from its own tensor; D must not be read */
      nt_store_f32(cmem, c->out, i, (float)d0[i]);
      nt_store_f32(dmem, c->out, i, NAN);
    }
    nt_store_f32(xmem, c->out, i, (float)nt_test_uniform(&r, -2, 2));
    x0[i] = nt_load_f32(xmem, c->out, i);
  }
  void *bmem = calloc((size_t)c->N, 4);
  double *bias = calloc((size_t)c->N, sizeof(double));
  nt_tensor Bias = nt_tensor_view(bmem, c->bias_dt, nt_cpu(), 1, (int64_t[]){c->N});
  for (int64_t j = 0; c->bias && j < c->N; j++) {
    nt_store_f32(bmem, c->bias_dt, j, (float)nt_test_uniform(&r, -1, 1));
    bias[j] = nt_load_f32(bmem, c->bias_dt, j);
  }
  float sa = 0.5f, sb = 0.25f;

  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_a = c->ta; o.trans_b = c->tb;
  o.alpha = c->alpha; o.beta = c->beta;
  o.epilogue = c->epi;
  o.bias = c->bias ? &Bias : NULL;
  o.aux = &X;
  if (c->sep_c) o.c = &Cm;
  if (fp8) { o.scale_inv_a = &sa; o.scale_inv_b = &sb; }
  if (!CHECK_OK(ctx, nt_gemm(ctx, &A.t, &B.t, &D, &o))) goto done;

  double *ref = malloc(sizeof(double) * (size_t)n), *pre = malloc(sizeof(double) * (size_t)n);
  double *slack = malloc(sizeof(double) * (size_t)n);
  float *got = malloc(sizeof(float) * (size_t)n), *gx = malloc(sizeof(float) * (size_t)n);
  double scale = fp8 ? (double)sa * sb : 1.0;
  for (int64_t b = 0; b < nb; b++) {
    const double *pa = A.op + (A.nb > 1 ? b : 0) * c->M * c->K;
    const double *pb = B.op + (B.nb > 1 ? b : 0) * c->K * c->N;
    for (int64_t m = 0; m < c->M; m++)
      for (int64_t j = 0; j < c->N; j++) {
        double s = 0, sabs = 0;
        for (int64_t k = 0; k < c->K; k++) {
          s += pa[m * c->K + k] * pb[k * c->N + j];
          sabs += fabs(pa[m * c->K + k] * pb[k * c->N + j]);
        }
        int64_t i = b * MN + m * c->N + j;
        slack[i] = 2.0 * (double)c->K * 0x1p-24 * sabs * fabs(c->alpha * scale) + 0x1p-24 * fabs(s);
        double v = c->alpha * scale * s + (c->beta != 0.0f ? c->beta * d0[i] : 0.0) + bias[j];
        pre[i] = v;
        double dg;
        if (c->epi == NT_EPI_GELU_AUX) v = gelu_d(v, NULL);
        if (c->epi == NT_EPI_RELU) v = v > 0 ? v : 0;
        if (c->epi == NT_EPI_DGELU) { gelu_d(x0[i], &dg); v *= dg; }
        ref[i] = v;
        got[i] = nt_load_f32(dmem, c->out, i);
        gx[i] = nt_load_f32(xmem, c->out, i);
      }
  }
  double *gotd = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) gotd[i] = got[i];
  double e = nt_test_rel_err_d(gotd, ref, n);
  CHECK(e < tol_for(c->out), "%s: D rel err %.3g (tol %.1g)", name, e, tol_for(c->out));
  int k = c->out == NT_F32 ? 0 : c->out == NT_F16 ? 1 : c->out == NT_BF16 ? 2 : -1;
  if (k >= 0 && e > worst_d[k]) worst_d[k] = e;
  if (c->epi == NT_EPI_NONE || c->epi == NT_EPI_BIAS) {
    int64_t bad = rounding_violations(got, ref, slack, n, c->out);
    CHECK(bad == 0, "%s: %lld elements not correctly rounded to %s", name, (long long)bad,
          nt_dtype_name(c->out));
  }
  if (c->epi == NT_EPI_GELU_AUX) {
    for (int64_t i = 0; i < n; i++) gotd[i] = gx[i];
    double ex = nt_test_rel_err_d(gotd, pre, n);
    CHECK(ex < tol_for(c->out), "%s: aux (pre-activation) rel err %.3g", name, ex);
  }
  free(ref); free(pre); free(slack); free(got); free(gx); free(gotd);
done:
  free(A.t.data); free(A.op); free(B.t.data); free(B.op);
  free(dmem); free(xmem); free(cmem); free(d0); free(x0); free(bmem); free(bias);
}

static gcase base(nt_dtype in, nt_dtype out) {
  gcase c;
  memset(&c, 0, sizeof c);
  c.in_a = c.in_b = in; c.out = out;
  c.M = 37; c.N = 53; c.K = 29;
  c.alpha = 1.0f;
  c.bias_dt = NT_F32;
  return c;
}

static void test_transposes(nt_ctx *ctx) {
  char name[96];
  for (int v = 0; v < 2; v++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        gcase c = base(NT_F32, NT_F32);
        c.ta = ta; c.tb = tb; c.view_a = v; c.view_b = v;
        c.pad = v ? 0 : 3;
        snprintf(name, sizeof name, "f32 ta%d tb%d %s", ta, tb, v ? "views" : "padded");
        run_case(ctx, &c, name);
      }
  gcase c = base(NT_F32, NT_F32);
  c.M = 1; c.N = 7; c.K = 1;
  run_case(ctx, &c, "1x7x1");
}

static void test_batched(nt_ctx *ctx) {
  gcase c = base(NT_F32, NT_F32);
  c.M = 11; c.N = 13; c.K = 9;
  c.batch_a = c.batch_b = c.batch_d = 3;
  run_case(ctx, &c, "batched 3");
  c.batch_b = 1;
  c.tb = true;
  run_case(ctx, &c, "batched, B broadcast (batch 1)");
  c.batch_b = 0;
  c.batch_a = 1;
  c.ta = true;
  run_case(ctx, &c, "batched, A batch 1 and B 2-D");
  c = base(NT_BF16, NT_BF16);
  c.batch_a = c.batch_b = c.batch_d = 2;
  c.epi = NT_EPI_RELU; c.bias = true;
  run_case(ctx, &c, "batched bf16 relu+bias");
}

static void test_alpha_beta(nt_ctx *ctx) {
  gcase c = base(NT_F32, NT_F32);
  c.alpha = 0.5f; c.beta = 0.75f;
  run_case(ctx, &c, "alpha 0.5 beta 0.75");
  c.beta = 1.0f; c.alpha = -2.0f;
  run_case(ctx, &c, "alpha -2 beta 1");
  c.sep_c = true;
  run_case(ctx, &c, "alpha -2 beta 1, C separate");
  c = base(NT_BF16, NT_BF16);
  c.beta = 1.0f; c.sep_c = true; c.epi = NT_EPI_BIAS; c.bias = true; c.tb = true;
  run_case(ctx, &c, "bf16 bias + residual C (a projection and its residual add)");
  /* beta 0 leaves D unread: run_case fills D with NaN then. */
  c = base(NT_F16, NT_F16);
  run_case(ctx, &c, "beta 0 ignores NaN in D");
  /* alpha 0 without alpha_set means 1 (zero-initialised options). */
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, d[4];
  nt_tensor A = nt_tensor_view(a, NT_F32, nt_cpu(), 2, (int64_t[]){2, 2});
  nt_tensor B = nt_tensor_view(b, NT_F32, nt_cpu(), 2, (int64_t[]){2, 2});
  nt_tensor D = nt_tensor_view(d, NT_F32, nt_cpu(), 2, (int64_t[]){2, 2});
  nt_gemm_opts o;
  memset(&o, 0, sizeof o);
  CHECK_OK(ctx, nt_gemm(ctx, &A, &B, &D, &o));
  CHECK(d[0] == 1 && d[1] == 2 && d[2] == 3 && d[3] == 4, "zeroed opts: alpha 1");
  o.alpha_set = true;
  CHECK_OK(ctx, nt_gemm(ctx, &A, &B, &D, &o));
  CHECK(d[0] == 0 && d[3] == 0, "alpha_set with alpha 0 gives 0");
  CHECK_OK(ctx, nt_gemm(ctx, &A, &B, &D, NULL));
  CHECK(d[1] == 2, "NULL opts: defaults");
}

static void test_epilogues(nt_ctx *ctx) {
  nt_dtype outs[3][2] = {{NT_F32, NT_F32}, {NT_F16, NT_F16}, {NT_BF16, NT_BF16}};
  char name[96];
  for (int i = 0; i < 3; i++) {
    nt_dtype in = outs[i][0], out = outs[i][1];
    for (int e = NT_EPI_BIAS; e <= NT_EPI_DGELU; e++) {
      for (int withb = 0; withb < 2; withb++) {
        gcase c = base(in, out);
        c.epi = (nt_gemm_epilogue)e;
        c.bias = e == NT_EPI_BIAS || (withb && (e == NT_EPI_GELU_AUX || e == NT_EPI_RELU));
        if (!withb && e == NT_EPI_BIAS) c.bias_dt = out;  /* bias in D's dtype */
        if (withb && !(e == NT_EPI_BIAS || e == NT_EPI_GELU_AUX || e == NT_EPI_RELU)) continue;
        snprintf(name, sizeof name, "%s epilogue %d bias %d(%s)", nt_dtype_name(in), e, c.bias,
                 nt_dtype_name(c.bias_dt));
        run_case(ctx, &c, name);
      }
    }
  }
}

static void test_low_precision(nt_ctx *ctx) {
  nt_dtype pairs[4][2] = {{NT_F16, NT_F16}, {NT_F16, NT_F32}, {NT_BF16, NT_BF16},
                          {NT_BF16, NT_F32}};
  char name[96];
  for (int i = 0; i < 4; i++)
    for (int t = 0; t < 2; t++) {
      gcase c = base(pairs[i][0], pairs[i][1]);
      c.ta = t; c.tb = !t;
      c.M = 45; c.N = 67; c.K = 83;
      snprintf(name, sizeof name, "%s->%s t%d", nt_dtype_name(c.in_a), nt_dtype_name(c.out), t);
      run_case(ctx, &c, name);
    }
  /* Products summing to ~58000, near fp16's max 65504: no overflow, correct rounding. */
  gcase r = base(NT_F16, NT_F16);
  r.M = 33; r.N = 41; r.K = 64;
  r.lo = 29.0f; r.hi = 31.0f;
  r.tb = true;
  run_case(ctx, &r, "f16 sums near 60000");
  r.epi = NT_EPI_BIAS; r.bias = true; r.bias_dt = NT_F16;
  run_case(ctx, &r, "f16 sums near 60000 + f16 bias");
  gcase c = base(NT_FP8_E4M3, NT_BF16);
  c.tb = true;
  c.M = 32; c.N = 48; c.K = 64;
  run_case(ctx, &c, "fp8 e4m3 x e4m3 -> bf16 (scaled)");
  c.in_b = NT_FP8_E5M2; c.out = NT_F32;
  run_case(ctx, &c, "fp8 e4m3 x e5m2 -> f32 (scaled)");
}

static void test_errors(nt_ctx *ctx) {
  float buf[4096];
  nt_tensor A = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 5});
  nt_tensor B = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){6, 7});
  nt_tensor D = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 7});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A, &B, &D, NULL));
  CHECK(strstr(nt_last_error(ctx), "op(A) is [4, 5]") != NULL, "names shapes: %s",
        nt_last_error(ctx));
  B = nt_tensor_view(buf, NT_F16, nt_cpu(), 2, (int64_t[]){5, 7});
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_gemm(ctx, &A, &B, &D, NULL));
  CHECK(strstr(nt_last_error(ctx), "f16") != NULL, "names dtypes: %s", nt_last_error(ctx));
  A.dtype = NT_F32; B.dtype = NT_F32; D.dtype = NT_BF16;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_gemm(ctx, &A, &B, &D, NULL));
  A.dtype = B.dtype = NT_FP8_E5M2;
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_gemm(ctx, &A, &B, &D, NULL));
  CHECK(strstr(nt_last_error(ctx), "e5m2 x e5m2") != NULL, "names the FP8 pair: %s",
        nt_last_error(ctx));
  A.dtype = B.dtype = D.dtype = NT_F32;
  nt_tensor bias = nt_tensor_view(buf, NT_F32, nt_cpu(), 1, (int64_t[]){6});
  nt_gemm_opts o = nt_gemm_defaults();
  o.epilogue = NT_EPI_BIAS;
  o.bias = &bias;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A, &B, &D, &o));
  bias.shape[0] = 7;
  bias.dtype = NT_F16;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_gemm(ctx, &A, &B, &D, &o));
  o.bias = NULL;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gemm(ctx, &A, &B, &D, &o));
  o.epilogue = NT_EPI_GELU_AUX;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_gemm(ctx, &A, &B, &D, &o));
  nt_tensor aux = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 6});
  o.aux = &aux;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A, &B, &D, &o));
  /* a separate C must look like D (read only at beta != 0) */
  nt_tensor Cw = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){7, 4});
  o = nt_gemm_defaults();
  o.c = &Cw;
  CHECK_OK(ctx, nt_gemm(ctx, &A, &B, &D, &o));
  o.beta = 1.0f;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A, &B, &D, &o));
  Cw = nt_tensor_view(buf, NT_F16, nt_cpu(), 2, (int64_t[]){4, 7});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A, &B, &D, &o));
  o = nt_gemm_defaults();
  nt_tensor A3 = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){2, 4, 5});
  nt_tensor B3 = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){3, 5, 7});
  nt_tensor D3 = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){3, 4, 7});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A3, &B3, &D3, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &B3, &B3, &D, NULL));
  nt_tensor A4 = nt_tensor_view(buf, NT_F32, nt_cpu(), 4, (int64_t[]){1, 1, 4, 5});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm(ctx, &A4, &B, &D, NULL));
  A3.shape[0] = 3;
  nt_tensor X3 = D3;
  o = nt_gemm_defaults();
  o.epilogue = NT_EPI_GELU_AUX;
  o.aux = &X3;
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_gemm(ctx, &A3, &B3, &D3, &o));
  nt_tensor G = D;
  G.device = nt_cuda(0);
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_gemm(ctx, &A, &B, &G, NULL));
  nt_gemm_stats s;
  nt_gemm_get_stats(ctx, &s);
  CHECK(s.plans == 0 && s.descriptors == 0, "CPU context has no plans");
}

/* nt_gemm_bias_grad: column sums accumulated into db, any row stride, against fp64. */
static void test_bias_grad(nt_ctx *ctx) {
  nt_test_rng r = {77};
  enum { M = 67, N = 40, LD = 48 };
  nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  for (int d = 0; d < 3; d++) {
    void *mem = calloc(M * LD, 4);
    float db[N];
    double want[N], have[N];
    for (int n = 0; n < N; n++) want[n] = 0.0;
    for (int m = 0; m < M; m++)
      for (int n = 0; n < LD; n++) {
        nt_store_f32(mem, dts[d], m * LD + n, (float)nt_test_uniform(&r, -1, 1));
        if (n < N) want[n] += nt_load_f32(mem, dts[d], m * LD + n);
      }
    for (int n = 0; n < N; n++) db[n] = 0.5f * (float)n;
    nt_tensor dy = nt_tensor_view(mem, dts[d], nt_cpu(), 2, (int64_t[]){M, N});
    dy.stride[0] = LD;
    nt_tensor t = nt_tensor_view(db, NT_F32, nt_cpu(), 1, (int64_t[]){N});
    if (CHECK_OK(ctx, nt_gemm_bias_grad(ctx, &dy, &t))) {
      for (int n = 0; n < N; n++) have[n] = db[n] - 0.5 * n;
      double e = nt_test_rel_err_d(have, want, N);
      /* measured 7.81e-8 (f32; f16 and bf16 exactly 0): about twice that */
      printf("  bias_grad %s (row stride %d): rel err %.3g\n", nt_dtype_name(dts[d]), LD, e);
      CHECK(e < 1.5e-7, "bias_grad %s (row stride %d) rel err %.3g", nt_dtype_name(dts[d]), LD, e);
    }
    free(mem);
  }
  float buf[64];
  nt_tensor dy = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){4, 8});
  nt_tensor db = nt_tensor_view(buf + 40, NT_F32, nt_cpu(), 1, (int64_t[]){7});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm_bias_grad(ctx, &dy, &db));
  db.shape[0] = 8;
  db.dtype = NT_BF16;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_gemm_bias_grad(ctx, &dy, &db));
  db.dtype = NT_F32;
  dy = nt_tensor_view(buf, NT_F32, nt_cpu(), 2, (int64_t[]){8, 4});
  dy.stride[0] = 1; dy.stride[1] = 8;   /* a transposed view: no unit stride along N */
  db.shape[0] = 4;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_gemm_bias_grad(ctx, &dy, &db));
}

static void test_search_knobs(void) {
  nt_ctx_options o = nt_ctx_options_default();
  CHECK(o.gemm_search == 1 && o.gemm_autotune && o.gemm_untuned_gflop == 100.0,
        "GEMM defaults: search 1, autotune on, untuned from 100 GFLOP");
  CHECK(nt_ctx_options_set(&o, "gemm_search", "0") == NT_OK && o.gemm_search == 0, "0 (%d)",
        o.gemm_search);
  CHECK(nt_ctx_options_set(&o, "gemm_search", "2") == NT_OK && o.gemm_search == 2, "2 (%d)",
        o.gemm_search);
  CHECK(nt_ctx_options_set(&o, "gemm_search", "3") == NT_ERR_INVALID_ARG && o.gemm_search == 2,
        "3 refused, value kept (%d)", o.gemm_search);
  CHECK(nt_ctx_options_set(&o, "gemm_search", "1x") == NT_ERR_INVALID_ARG, "1x refused");
  /* 16384 x 384 x 384 (the small GPT's projection, 4.8 GFLOP) is searched by default; a
   * 64-row product is not; mode 2 searches everything, mode 0 nothing. */
  double big = 2.0 * 16384 * 384 * 384, small = 2.0 * 64 * 384 * 384;
  CHECK(nt_gemm_search_wide(1, big) && !nt_gemm_search_wide(1, small), "mode 1 threshold");
  CHECK(nt_gemm_search_wide(2, small) && !nt_gemm_search_wide(0, big), "modes 0 and 2");
  CHECK(nt_gemm_search_tol(NT_BF16, NT_BF16, false) == 1e-2 &&
            nt_gemm_search_tol(NT_F16, NT_F16, false) == 2e-3 &&
            nt_gemm_search_tol(NT_F32, NT_F32, false) == 1e-5 &&
            nt_gemm_search_tol(NT_F32, NT_F32, true) == 2e-3 &&
            nt_gemm_search_tol(NT_FP8_E4M3, NT_BF16, false) == 2e-2,
        "kernel-vs-kernel tolerances follow DESIGN's per dtype");
}

/* The checksums estimate ||c - r|| / ||r|| within a small factor for a spread error, catch a
 * missing tile, a NaN and a zero/non-zero mismatch, and ignore the padding between rows. */
static void test_checksums(void) {
  enum { B = 2, M = 37, N = 53, LD = 61 };
  int64_t n = B * M * LD;
  float *r = calloc((size_t)n, sizeof *r), *c = calloc((size_t)n, sizeof *c);
  double sr[NT_GEMM_NSUMS], sc[NT_GEMM_NSUMS];
  nt_test_rng g = {42};
  for (int64_t i = 0; i < n; i++) r[i] = (float)nt_test_uniform(&g, -1, 1);
  nt_gemm_checksum_cpu(NT_F32, r, LD, M * LD, M, N, B, sr);
  double norm2 = 0;
  for (int b = 0; b < B; b++)
    for (int m = 0; m < M; m++)
      for (int j = 0; j < N; j++) norm2 += (double)r[(b * M + m) * LD + j] * r[(b * M + m) * LD + j];
  CHECK(fabs(sr[0] - norm2) <= 1e-9 * norm2, "sums[0] is the sum of squares (%g vs %g)", sr[0],
        norm2);
  CHECK(nt_gemm_checksum_rel_diff(sr, sr) == 0.0, "identical results differ by 0");
  /* Padding (outside the logical matrix) does not count. */
  memcpy(c, r, (size_t)n * sizeof *c);
  for (int b = 0; b < B; b++)
    for (int m = 0; m < M; m++) c[(b * M + m) * LD + N + 3] = 1e6f;
  nt_gemm_checksum_cpu(NT_F32, c, LD, M * LD, M, N, B, sc);
  CHECK(nt_gemm_checksum_rel_diff(sc, sr) == 0.0, "padding ignored");
  /* Spread errors of known size: the estimate within [0.4, 1.8]x of the truth, 50 trials. */
  double lo = 1e9, hi = 0;
  for (int t = 0; t < 50; t++) {
    double e2 = 0;
    memcpy(c, r, (size_t)n * sizeof *c);
    for (int b = 0; b < B; b++)
      for (int m = 0; m < M; m++)
        for (int j = 0; j < N; j++) {
          int64_t i = (b * M + m) * LD + j;
          float d = (float)(1e-3 * nt_test_normal(&g));
          c[i] = r[i] + d;
          e2 += ((double)c[i] - r[i]) * ((double)c[i] - r[i]);
        }
    nt_gemm_checksum_cpu(NT_F32, c, LD, M * LD, M, N, B, sc);
    double q = nt_gemm_checksum_rel_diff(sc, sr) / sqrt(e2 / norm2);
    if (q < lo) lo = q;
    if (q > hi) hi = q;
  }
  CHECK(lo > 0.4 && hi < 1.8, "estimate / true relative error in [%.2f, %.2f]", lo, hi);
  /* A kernel that skipped one 8 x 8 tile: 64 of 3922 values zero (true error ~0.13). */
  memcpy(c, r, (size_t)n * sizeof *c);
  for (int m = 8; m < 16; m++)
    for (int j = 16; j < 24; j++) c[(M + m) * LD + j] = 0.0f;
  nt_gemm_checksum_cpu(NT_F32, c, LD, M * LD, M, N, B, sc);
  double e = nt_gemm_checksum_rel_diff(sc, sr);
  CHECK(e > 0.05, "a missing tile shows (%.3g)", e);
  /* bf16 storage read as stored: rounding to bf16 (rel 2^-9 per value) stays under 1e-2. */
  void *rb = nt_test_to_dtype(memcpy(c, r, (size_t)n * sizeof *c), (size_t)n, NT_BF16);
  nt_gemm_checksum_cpu(NT_BF16, rb, LD, M * LD, M, N, B, sc);
  e = nt_gemm_checksum_rel_diff(sc, sr);
  CHECK(e > 1e-4 && e < 1e-2, "bf16 rounding: %.3g", e);
  free(rb);
  memcpy(c, r, (size_t)n * sizeof *c);
  c[5] = NAN;
  nt_gemm_checksum_cpu(NT_F32, c, LD, M * LD, M, N, B, sc);
  CHECK(isinf(nt_gemm_checksum_rel_diff(sc, sr)), "NaN in the candidate: infinite difference");
  double z[NT_GEMM_NSUMS] = {0};
  CHECK(nt_gemm_checksum_rel_diff(z, z) == 0.0 && isinf(nt_gemm_checksum_rel_diff(sr, z)),
        "zero vs zero, non-zero vs zero");
  free(r);
  free(c);
}

int main(void) {
  nt_ctx *ctx;
  test_search_knobs();
  test_checksums();
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_transposes(ctx);
  test_batched(ctx);
  test_alpha_beta(ctx);
  test_epilogues(ctx);
  test_low_precision(ctx);
  test_errors(ctx);
  test_bias_grad(ctx);
  nt_ctx_free(ctx);
  printf("measured: worst D rel err f32 %.3g (bound %g), f16 %.3g (bound %g), bf16 %.3g "
         "(bound %g)\n", worst_d[0], tol_for(NT_F32), worst_d[1], tol_for(NT_F16), worst_d[2],
         tol_for(NT_BF16));
  return nt_test_finish();
}
