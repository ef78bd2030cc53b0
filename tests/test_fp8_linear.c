/* FP8 quantization and the FP8 linear layer on the CPU (its emulation: FP8 operands, fp32
 * GEMMs on their dequantized values).
 *
 * Tolerances. Against the exact (fp64) linear on the unquantized inputs, the error is FP8's
 * rounding: E4M3 keeps 3 mantissa bits, a relative rounding error up to 2^-4 = 6.25% per
 * element (RMS about 2.5% over a uniform mantissa), E5M2 keeps 2 bits (up to 12.5%, RMS about
 * 5%). A product of two rounded values carries both errors (RMS ~3.5% for E4M3 x E4M3, ~5.6%
 * for E5M2 x E4M3); over a K-long dot product with independent errors, error and result both
 * grow like sqrt(K), so ||err||/||ref|| stays near those RMS values: bounds 6e-2 (forward) and
 * 1e-1 (backward's E5M2 x E4M3 products). Against the same computation on the very quantized
 * values (recomputed here per element with core/convert.h), only fp32 accumulation is left:
 * 1e-5. The bias gradient never sees FP8: 1e-6 against fp64. */
#include "tests/testutil.h"
#include "tests/fp8_cases.h"
#include "amp/fp8_linear.h"
#include "ops/quantize.h"
#include "ops/linear.h"
#include "ops/elementwise.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint8_t q8(nt_dtype f, float v) {
  return f == NT_FP8_E4M3 ? nt_f32_to_e4m3(v, true) : nt_f32_to_e5m2(v, true);
}
static float d8(nt_dtype f, uint8_t v) {
  return f == NT_FP8_E4M3 ? nt_e4m3_to_f32(v) : nt_e5m2_to_f32(v);
}

/* ---------------- quantize ---------------- */

/* x [R, C] (row stride ldx) of dtype `in` filled with values in (-3, 3), every 17th times 300
 * (beyond the formats' range once scaled: saturation); returns max |x| as stored. */
static float fill_x(void *xm, nt_dtype in, int64_t R, int64_t C, int64_t ldx, uint64_t seed) {
  nt_test_rng rng = {seed};
  float amax = 0.0f;
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) {
      float v = (float)nt_test_uniform(&rng, -3, 3);
      if ((r * C + c) % 17 == 3) v *= 300.0f;
      nt_store_f32(xm, in, r * ldx + c, v);
      amax = fmaxf(amax, fabsf(nt_load_f32(xm, in, r * ldx + c)));
    }
  return amax;
}

/* y [yr, yc] against the per-element reference q8(x * scale) (transposed or not), padding 0.
 * Returns whether all bytes match; also checks that some bytes saturated. */
static bool check_bytes(const void *xm, nt_dtype in, int64_t R, int64_t C, int64_t ldx,
                        nt_dtype fmt, bool tr, const uint8_t *y, int64_t yr, int64_t yc,
                        float scale, const char *what) {
  int64_t bad = 0, pad_bad = 0, sat = 0;
  for (int64_t i = 0; i < yr; i++)
    for (int64_t j = 0; j < yc; j++) {
      int64_t r = tr ? j : i, c = tr ? i : j;
      uint8_t got = y[i * yc + j];
      if (r < R && c < C) {
        uint8_t want = q8(fmt, nt_load_f32(xm, in, r * ldx + c) * scale);
        bad += got != want;
        sat += fabsf(d8(fmt, got)) == nt_fp8_max(fmt);
      } else {
        pad_bad += got != 0;
      }
    }
  CHECK(bad == 0 && pad_bad == 0,
        "%s %s->%s%s [%lld,%lld] -> [%lld,%lld]: %lld wrong bytes, %lld bad padding", what,
        nt_dtype_name(in), nt_dtype_name(fmt), tr ? " transposed" : "", (long long)R,
        (long long)C, (long long)yr, (long long)yc, (long long)bad, (long long)pad_bad);
  CHECK(sat > 0, "%s: the case has saturated values (%lld)", what, (long long)sat);
  return bad == 0 && pad_bad == 0;
}

static void test_quantize_case(nt_ctx *ctx, nt_dtype in, nt_dtype fmt, bool tr, int64_t R,
                               int64_t C, int64_t ldx, int64_t yr, int64_t yc, float scale) {
  void *xm = calloc((size_t)(R * ldx + 1), 4);
  uint8_t *y = malloc((size_t)(yr * yc));
  memset(y, 0xAB, (size_t)(yr * yc));  /* padding must be overwritten with zeros */
  float expect_amax = fill_x(xm, in, R, C, ldx, (uint64_t)(R * 131 + C * 7 + in + 10 * fmt + tr));
  nt_tensor x = nt_tensor_view(xm, in, nt_cpu(), 2, (int64_t[]){R, C});
  x.stride[0] = ldx;
  nt_tensor yt = nt_tensor_view(y, fmt, nt_cpu(), 2, (int64_t[]){yr, yc});
  float s = scale, amax = 0.5f;
  nt_tensor st = nt_tensor_view(&s, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor at = nt_tensor_view(&amax, NT_F32, nt_cpu(), 0, NULL);
  if (CHECK_OK(ctx, nt_fp8_quantize(ctx, &x, &yt, tr, &st, &at))) {
    check_bytes(xm, in, R, C, ldx, fmt, tr, y, yr, yc, scale, "quantize");
    CHECK(amax == expect_amax, "amax %g, expected %g (max |x|)", amax, expect_amax);
  }
  /* The amax is a max with what is there: a larger recorded value stays. */
  amax = 1e6f;
  if (CHECK_OK(ctx, nt_fp8_quantize(ctx, &x, &yt, tr, &st, &at)))
    CHECK(amax == 1e6f, "amax max-accumulates: %g", amax);
  free(xm);
  free(y);
}

/* The dual form: x [R, C] (row stride ldx) into y_rows [rr, rc] and y_t [tr, tc] at once; each
 * output equal to the reference and to the single-layout call's bytes, one amax update. */
static void test_quantize_dual_case(nt_ctx *ctx, nt_dtype in, nt_dtype fmt, int64_t R, int64_t C,
                                    int64_t ldx, int64_t rr, int64_t rc, int64_t tr, int64_t tc,
                                    float scale) {
  void *xm = calloc((size_t)(R * ldx + 1), 4);
  uint8_t *yr = malloc((size_t)(rr * rc)), *yt = malloc((size_t)(tr * tc));
  uint8_t *sr = malloc((size_t)(rr * rc)), *st1 = malloc((size_t)(tr * tc));
  memset(yr, 0xAB, (size_t)(rr * rc));
  memset(yt, 0xCD, (size_t)(tr * tc));
  float expect_amax = fill_x(xm, in, R, C, ldx, (uint64_t)(R * 977 + C * 13 + in + 10 * fmt));
  nt_tensor x = nt_tensor_view(xm, in, nt_cpu(), 2, (int64_t[]){R, C});
  x.stride[0] = ldx;
  nt_tensor yrt = nt_tensor_view(yr, fmt, nt_cpu(), 2, (int64_t[]){rr, rc});
  nt_tensor ytt = nt_tensor_view(yt, fmt, nt_cpu(), 2, (int64_t[]){tr, tc});
  nt_tensor srt = nt_tensor_view(sr, fmt, nt_cpu(), 2, (int64_t[]){rr, rc});
  nt_tensor stt = nt_tensor_view(st1, fmt, nt_cpu(), 2, (int64_t[]){tr, tc});
  float s = scale, amax = 0.5f;
  nt_tensor sc = nt_tensor_view(&s, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor at = nt_tensor_view(&amax, NT_F32, nt_cpu(), 0, NULL);
  if (CHECK_OK(ctx, nt_fp8_quantize_dual(ctx, &x, &yrt, &ytt, &sc, &at, NULL)) &&
      CHECK_OK(ctx, nt_fp8_quantize(ctx, &x, &srt, false, &sc, NULL)) &&
      CHECK_OK(ctx, nt_fp8_quantize(ctx, &x, &stt, true, &sc, NULL))) {
    check_bytes(xm, in, R, C, ldx, fmt, false, yr, rr, rc, scale, "dual rows");
    check_bytes(xm, in, R, C, ldx, fmt, true, yt, tr, tc, scale, "dual transposed");
    CHECK(memcmp(yr, sr, (size_t)(rr * rc)) == 0 && memcmp(yt, st1, (size_t)(tr * tc)) == 0,
          "dual [%lld,%lld]: the bytes of the single-layout calls", (long long)R, (long long)C);
    CHECK(amax == expect_amax, "dual amax %g, expected %g (max |x|)", amax, expect_amax);
  }
  free(xm); free(yr); free(yt); free(sr); free(st1);
}

static void test_quantize(nt_ctx *ctx) {
  const nt_dtype ins[3] = {NT_F32, NT_BF16, NT_F16};
  for (int i = 0; i < 3; i++)
    for (int f = 0; f < 2; f++) {
      nt_dtype fmt = f ? NT_FP8_E5M2 : NT_FP8_E4M3;
      float scale = f ? 9000.0f : 60.0f;  /* 300 * 3 * scale overflows both formats */
      test_quantize_case(ctx, ins[i], fmt, false, 13, 37, 37, 16, 48, scale);
      test_quantize_case(ctx, ins[i], fmt, false, 13, 37, 41, 13, 37, scale);  /* row stride */
      test_quantize_case(ctx, ins[i], fmt, true, 13, 37, 37, 48, 16, scale);
      test_quantize_case(ctx, ins[i], fmt, true, 70, 5, 8, 5, 70, scale);
      /* dual: padded both ways (as the linear backward pads), unpadded odd, row stride */
      test_quantize_dual_case(ctx, ins[i], fmt, 13, 37, 37, 13, 48, 37, 16, scale);
      test_quantize_dual_case(ctx, ins[i], fmt, 70, 5, 5, 70, 5, 5, 70, scale);
      test_quantize_dual_case(ctx, ins[i], fmt, 19, 33, 41, 32, 48, 48, 32, scale);
    }
  /* NaN: the amax becomes NaN (the scale update then keeps the old scale). */
  float xv[4] = {1, NAN, -2, 0}, s = 1, amax = 0;
  uint8_t y[4];
  nt_tensor x = nt_tensor_view(xv, NT_F32, nt_cpu(), 2, (int64_t[]){1, 4});
  nt_tensor yt = nt_tensor_view(y, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){1, 4});
  nt_tensor st = nt_tensor_view(&s, NT_F32, nt_cpu(), 0, NULL);
  nt_tensor at = nt_tensor_view(&amax, NT_F32, nt_cpu(), 0, NULL);
  if (CHECK_OK(ctx, nt_fp8_quantize(ctx, &x, &yt, false, &st, &at)))
    CHECK(isnan(amax) && y[1] == nt_f32_to_e4m3(NAN, true), "NaN: amax %g, byte 0x%02x", amax,
          y[1]);
  /* Errors name the problem. */
  nt_tensor small = nt_tensor_view(y, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){1, 3});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_quantize(ctx, &x, &small, false, &st, &at));
  nt_tensor wrong = nt_tensor_view(y, NT_U8, nt_cpu(), 2, (int64_t[]){1, 4});
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_fp8_quantize(ctx, &x, &wrong, false, &st, &at));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_fp8_quantize(ctx, &x, &yt, false, NULL, &at));
  uint8_t y2[4 * 16], y3[16];
  nt_tensor yt_t = nt_tensor_view(y2, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){4, 16});
  nt_tensor yt_small = nt_tensor_view(y2, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){3, 16});
  nt_tensor yt_e5 = nt_tensor_view(y2, NT_FP8_E5M2, nt_cpu(), 2, (int64_t[]){4, 16});
  nt_tensor yr16 = nt_tensor_view(y3, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){1, 16});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_quantize_dual(ctx, &x, &yt, &yt_small, &st, &at, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_quantize_dual(ctx, &x, &small, &yt_t, &st, &at, NULL));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_fp8_quantize_dual(ctx, &x, &yr16, &yt_e5, &st, &at, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_fp8_quantize_dual(ctx, &x, &yt, NULL, &st, &at, NULL));
  nt_tensor alias = nt_tensor_view(y2, NT_FP8_E4M3, nt_cpu(), 2, (int64_t[]){1, 16});
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_fp8_quantize_dual(ctx, &x, &alias, &yt_t, &st, &at, NULL));
  /* Dequantize: value * scale_inv. */
  float deq[4], sinv = 0.25f;
  nt_tensor dt = nt_tensor_view(deq, NT_F32, nt_cpu(), 2, (int64_t[]){1, 4});
  nt_tensor sit = nt_tensor_view(&sinv, NT_F32, nt_cpu(), 0, NULL);
  if (CHECK_OK(ctx, nt_fp8_dequantize(ctx, &yt, &sit, &dt)))
    CHECK(deq[0] == 0.25f && deq[2] == -0.5f && deq[3] == 0.0f && isnan(deq[1]),
          "dequantize: %g %g %g %g", deq[0], deq[1], deq[2], deq[3]);
}

/* ---------------- linear ---------------- */

typedef struct {
  int64_t M, K, N;
  nt_dtype dt;        /* x, W, dy, y, dx, dW */
  nt_dtype bias_dt;   /* b and db */
} lcase;

/* The state's current scales of a layer (tensors 0, 1, 2). */
static void scales(nt_ctx *ctx, nt_fp8_state *s, float sc[3], float si[3]) {
  for (int i = 0; i < 3; i++) CHECK_OK(ctx, nt_fp8_read(ctx, s, i, &sc[i], &si[i], NULL));
}

static double rel(const double *a, const double *b, int64_t n) {
  return nt_test_rel_err_d(a, b, n);
}

static void test_linear_case(nt_ctx *ctx, lcase c) {
  nt_test_rng rng = {(uint64_t)(c.M * 1000 + c.K * 10 + c.N + c.dt)};
  int64_t M = c.M, K = c.K, N = c.N;
  size_t es = nt_dtype_size(c.dt), eb = nt_dtype_size(c.bias_dt);
  char *x = malloc((size_t)(M * K) * es), *w = malloc((size_t)(N * K) * es);
  char *dy = malloc((size_t)(M * N) * es), *y = malloc((size_t)(M * N) * es);
  char *dx = calloc((size_t)(M * K), es), *dw = calloc((size_t)(N * K), es);
  char *b = malloc((size_t)N * eb), *db = calloc((size_t)N, eb);
  int64_t S = M * N > M * K ? M * N : M * K;
  if (N * K > S) S = N * K;
  double *ref = malloc(sizeof(double) * (size_t)S * 6);  /* six arrays of S */
  double *got = ref + 4 * S;
  for (int64_t i = 0; i < M * K; i++) nt_store_f32(x, c.dt, i, (float)nt_test_uniform(&rng, -1, 1));
  for (int64_t i = 0; i < N * K; i++)
    nt_store_f32(w, c.dt, i, (float)nt_test_uniform(&rng, -0.3, 0.3));
  for (int64_t i = 0; i < M * N; i++)
    nt_store_f32(dy, c.dt, i, (float)nt_test_uniform(&rng, -1e-3, 1e-3));
  for (int64_t i = 0; i < N; i++)
    nt_store_f32(b, c.bias_dt, i, (float)nt_test_uniform(&rng, -1, 1));
  nt_tensor xt = nt_tensor_view(x, c.dt, nt_cpu(), 2, (int64_t[]){M, K});
  nt_tensor wt = nt_tensor_view(w, c.dt, nt_cpu(), 2, (int64_t[]){N, K});
  nt_tensor dyt = nt_tensor_view(dy, c.dt, nt_cpu(), 2, (int64_t[]){M, N});
  nt_tensor yt = nt_tensor_view(y, c.dt, nt_cpu(), 2, (int64_t[]){M, N});
  nt_tensor dxt = nt_tensor_view(dx, c.dt, nt_cpu(), 2, (int64_t[]){M, K});
  nt_tensor dwt = nt_tensor_view(dw, c.dt, nt_cpu(), 2, (int64_t[]){N, K});
  nt_tensor bt = nt_tensor_view(b, c.bias_dt, nt_cpu(), 1, (int64_t[]){N});
  nt_tensor dbt = nt_tensor_view(db, c.bias_dt, nt_cpu(), 1, (int64_t[]){N});
  nt_fp8_options opt = nt_fp8_defaults();
  opt.history_len = 4;
  nt_fp8_state *s = NULL;
  if (!CHECK_OK(ctx, nt_fp8_linear_state_create(ctx, &opt, 1, &s))) goto done;
  nt_fp8_linear_cfg cfg = {s, 0, false};
  bool fp8 = true;
  CHECK_OK(ctx, nt_fp8_linear_uses_fp8(ctx, &cfg, &fp8));
  CHECK(!fp8, "a CPU context emulates");
  /* Step 1 (scales 1) records the amaxes; the update gives scales from them. */
  if (!CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yt, NT_ACT_NONE, NULL)) ||
      !CHECK_OK(ctx, nt_fp8_linear_backward(ctx, &cfg, &dyt, &xt, &wt, &dxt, &dwt, &dbt)))
    goto done;
  float amax[3] = {0, 0, 0}, hist[4];
  for (int64_t i = 0; i < M * K; i++) amax[0] = fmaxf(amax[0], fabsf(nt_load_f32(x, c.dt, i)));
  for (int64_t i = 0; i < N * K; i++) amax[1] = fmaxf(amax[1], fabsf(nt_load_f32(w, c.dt, i)));
  for (int64_t i = 0; i < M * N; i++) amax[2] = fmaxf(amax[2], fabsf(nt_load_f32(dy, c.dt, i)));
  for (int i = 0; i < 3; i++) {
    CHECK_OK(ctx, nt_fp8_read(ctx, s, i, NULL, NULL, hist));
    CHECK(hist[0] == amax[i], "tensor %d: recorded amax %g, max|.| %g", i, hist[0], amax[i]);
  }
  if (!CHECK_OK(ctx, nt_fp8_update(ctx, s))) goto done;
  float sc[3], si[3];
  scales(ctx, s, sc, si);
  const float fmax3[3] = {448.0f, 448.0f, 57344.0f};
  for (int i = 0; i < 3; i++)
    CHECK(sc[i] == fmax3[i] / amax[i], "tensor %d: scale %g, expected %g", i, sc[i],
          fmax3[i] / amax[i]);

  /* Step 2 with those scales: forward. */
  memset(dx, 0, (size_t)(M * K) * es);
  memset(dw, 0, (size_t)(N * K) * es);
  memset(db, 0, (size_t)N * eb);
  if (!CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yt, NT_ACT_NONE, NULL)))
    goto done;
  double tol_out = nt_test_tol(c.dt); /* rounding of outputs */
  {
    double *exact = ref, *onq = ref + S;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double e = nt_load_f32(b, c.bias_dt, n), q = 0;
        for (int64_t k = 0; k < K; k++) {
          float xv = nt_load_f32(x, c.dt, m * K + k), wv = nt_load_f32(w, c.dt, n * K + k);
          e += (double)xv * wv;
          q += (double)(d8(NT_FP8_E4M3, q8(NT_FP8_E4M3, xv * sc[0])) * si[0]) *
               (double)(d8(NT_FP8_E4M3, q8(NT_FP8_E4M3, wv * sc[1])) * si[1]);
        }
        exact[m * N + n] = e;
        onq[m * N + n] = q + nt_load_f32(b, c.bias_dt, n);
        got[m * N + n] = nt_load_f32(y, c.dt, m * N + n);
      }
    double e1 = rel(got, exact, M * N), e2 = rel(got, onq, M * N);
    printf("  [%lld x %lld] x [%lld x %lld]^T %s: forward vs fp64 %.3g (FP8 bound 6e-2), vs the "
           "quantized values %.3g\n", (long long)M, (long long)K, (long long)N, (long long)K,
           nt_dtype_name(c.dt), e1, e2);
    CHECK(e1 < 6e-2 && e1 > 1e-4, "forward vs fp64: %.3g (FP8 error must show, and stay small)",
          e1);
    CHECK(e2 < tol_out, "forward vs the same quantized values: %.3g", e2);
    if (c.dt == NT_F32) {
      /* The fp32 linear layer (ops/linear.h) on the same inputs: FP8's error, no more. */
      float *y32 = malloc(sizeof(float) * (size_t)(M * N));
      nt_tensor y32t = nt_tensor_view(y32, NT_F32, nt_cpu(), 2, (int64_t[]){M, N});
      if (CHECK_OK(ctx, nt_linear_forward(ctx, &xt, &wt, &bt, &y32t, NT_ACT_NONE, NULL))) {
        double e3 = nt_test_rel_err((const float *)y, y32, M * N);
        printf("  f32 forward vs nt_linear_forward (fp32): %.3g (bound 6e-2)\n", e3);
        CHECK(e3 < 6e-2 && e3 > 1e-4, "fp8 vs fp32 linear forward: %.3g", e3);
      }
      free(y32);
    }
  }
  /* Backward, twice: the second call must add the same amounts again. */
  for (int rep = 0; rep < 2; rep++)
    if (!CHECK_OK(ctx, nt_fp8_linear_backward(ctx, &cfg, &dyt, &xt, &wt, &dxt, &dwt, &dbt)))
      goto done;
  {
    double *ex = ref, *ew = ref + S, *qx = ref + 2 * S;
    double *gx = got, *gw = got + S;
    for (int64_t m = 0; m < M; m++)
      for (int64_t k = 0; k < K; k++) {
        double e = 0, q = 0;
        for (int64_t n = 0; n < N; n++) {
          float g = nt_load_f32(dy, c.dt, m * N + n), wv = nt_load_f32(w, c.dt, n * K + k);
          e += (double)g * wv;
          q += (double)(d8(NT_FP8_E5M2, q8(NT_FP8_E5M2, g * sc[2])) * si[2]) *
               (double)(d8(NT_FP8_E4M3, q8(NT_FP8_E4M3, wv * sc[1])) * si[1]);
        }
        ex[m * K + k] = 2 * e;
        qx[m * K + k] = 2 * q;
        gx[m * K + k] = nt_load_f32(dx, c.dt, m * K + k);
      }
    double e1 = rel(gx, ex, M * K), e2 = rel(gx, qx, M * K);
    printf("  %s dx (accumulated twice) vs fp64 %.3g (bound 1e-1), vs quantized %.3g\n",
           nt_dtype_name(c.dt), e1, e2);
    CHECK(e1 < 1e-1, "dx vs fp64: %.3g", e1);
    CHECK(e2 < tol_out, "dx vs the same quantized values: %.3g", e2);
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < K; k++) {
        double e = 0, q = 0;
        for (int64_t m = 0; m < M; m++) {
          float g = nt_load_f32(dy, c.dt, m * N + n), xv = nt_load_f32(x, c.dt, m * K + k);
          e += (double)g * xv;
          q += (double)(d8(NT_FP8_E5M2, q8(NT_FP8_E5M2, g * sc[2])) * si[2]) *
               (double)(d8(NT_FP8_E4M3, q8(NT_FP8_E4M3, xv * sc[0])) * si[0]);
        }
        ew[n * K + k] = 2 * e;
        qx[n * K + k] = 2 * q;
        gw[n * K + k] = nt_load_f32(dw, c.dt, n * K + k);
      }
    e1 = rel(gw, ew, N * K);
    e2 = rel(gw, qx, N * K);
    printf("  %s dW (accumulated twice) vs fp64 %.3g (bound 1e-1), vs quantized %.3g\n",
           nt_dtype_name(c.dt), e1, e2);
    CHECK(e1 < 1e-1, "dW vs fp64: %.3g", e1);
    CHECK(e2 < tol_out, "dW vs the same quantized values: %.3g", e2);
    if (c.dt == NT_F32) {
      float *dx32 = calloc((size_t)(M * K), 4), *dw32 = calloc((size_t)(N * K), 4);
      nt_tensor dx32t = nt_tensor_view(dx32, NT_F32, nt_cpu(), 2, (int64_t[]){M, K});
      nt_tensor dw32t = nt_tensor_view(dw32, NT_F32, nt_cpu(), 2, (int64_t[]){N, K});
      if (CHECK_OK(ctx, nt_linear_backward(ctx, &dyt, &xt, &wt, &dx32t, &dw32t, NULL)) &&
          CHECK_OK(ctx, nt_linear_backward(ctx, &dyt, &xt, &wt, &dx32t, &dw32t, NULL))) {
        double e3 = nt_test_rel_err((const float *)dx, dx32, M * K);
        double e4 = nt_test_rel_err((const float *)dw, dw32, N * K);
        printf("  f32 dx, dW vs nt_linear_backward (fp32): %.3g, %.3g (bound 1e-1)\n", e3, e4);
        CHECK(e3 < 1e-1 && e4 < 1e-1, "fp8 vs fp32 linear backward: dx %.3g dW %.3g", e3, e4);
      }
      free(dx32);
      free(dw32);
    }
    for (int64_t n = 0; n < N; n++) {
      double e = 0;
      for (int64_t m = 0; m < M; m++) e += nt_load_f32(dy, c.dt, m * N + n);
      ex[n] = 2 * e;
      gx[n] = nt_load_f32(db, c.bias_dt, n);
    }
    e1 = rel(gx, ex, N);
    double tol_b = c.bias_dt == NT_F32 ? 1e-6 : c.bias_dt == NT_F16 ? 2e-3 : 1e-2;
    CHECK(e1 < tol_b, "db (twice) vs fp64: %.3g", e1);
  }
done:
  nt_fp8_state_free(ctx, s);
  free(x); free(w); free(dy); free(y); free(dx); free(dw); free(b); free(db); free(ref);
}

static void test_linear_errors(nt_ctx *ctx) {
  float x[6], w[6], y[4];
  nt_tensor xt = nt_tensor_view(x, NT_F32, nt_cpu(), 2, (int64_t[]){2, 3});
  nt_tensor wt = nt_tensor_view(w, NT_F32, nt_cpu(), 2, (int64_t[]){2, 3});
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 2, (int64_t[]){2, 2});
  nt_tensor bad = nt_tensor_view(y, NT_F32, nt_cpu(), 2, (int64_t[]){1, 4});
  nt_fp8_state *s = NULL;
  if (!CHECK_OK(ctx, nt_fp8_linear_state_create(ctx, NULL, 2, &s))) return;
  CHECK(nt_fp8_state_count(s) == 6, "two layers make six tensors");
  nt_fp8_linear_cfg cfg = {s, 4, false}, none = {NULL, 0, false};
  const nt_activation A0 = NT_ACT_NONE;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, NULL, &yt, A0, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_fp8_linear_forward(ctx, &none, &xt, &wt, NULL, &yt, A0, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_fp8_linear_forward(ctx, &none, &xt, &wt, NULL, &yt, NT_ACT_GELU, NULL));
  cfg.index = 3;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, NULL, &bad, A0, NULL));
  CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, NULL, &yt, A0, NULL));
  nt_tensor xi = xt;
  xi.dtype = NT_I32;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_fp8_linear_forward(ctx, &cfg, &xi, &wt, NULL, &yt, A0, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_fp8_linear_backward(ctx, &cfg, &yt, &xt, &wt, &bad, NULL, NULL));
  nt_fp8_state_free(ctx, s);
}

/* act GELU keeps the pre-activation (the act-NONE output, bit for bit) and applies the tanh
 * GELU; RELU clamps it. Repeated forwards record the same amaxes (a max), so all three calls
 * quantize with the same scales. */
static double gelu_d(double v) {
  return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

static void test_activation(nt_ctx *ctx) {
  enum { M = 15, K = 37, N = 21 };
  nt_test_rng rng = {5};
  float x[M * K], w[N * K], b[N], y0[M * N], y[M * N], pre[M * N], yr[M * N];
  nt_test_fill_uniform(&rng, x, M * K, -2, 2);
  nt_test_fill_uniform(&rng, w, N * K, -0.3f, 0.3f);
  nt_test_fill_uniform(&rng, b, N, -1, 1);
  nt_tensor xt = nt_tensor_view(x, NT_F32, nt_cpu(), 2, (int64_t[]){M, K});
  nt_tensor wt = nt_tensor_view(w, NT_F32, nt_cpu(), 2, (int64_t[]){N, K});
  nt_tensor bt = nt_tensor_view(b, NT_F32, nt_cpu(), 1, (int64_t[]){N});
  nt_tensor y0t = nt_tensor_view(y0, NT_F32, nt_cpu(), 2, (int64_t[]){M, N});
  nt_tensor yt = nt_tensor_view(y, NT_F32, nt_cpu(), 2, (int64_t[]){M, N});
  nt_tensor pt = nt_tensor_view(pre, NT_F32, nt_cpu(), 2, (int64_t[]){M, N});
  nt_tensor yrt = nt_tensor_view(yr, NT_F32, nt_cpu(), 2, (int64_t[]){M, N});
  nt_fp8_state *s = NULL;
  if (!CHECK_OK(ctx, nt_fp8_linear_state_create(ctx, NULL, 1, &s))) return;
  nt_fp8_linear_cfg cfg = {s, 0, false};
  if (CHECK_OK(ctx, nt_fp8_update(ctx, s)) &&
      CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &y0t, NT_ACT_NONE, NULL)) &&
      CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yt, NT_ACT_GELU, &pt)) &&
      CHECK_OK(ctx, nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yrt, NT_ACT_RELU, NULL))) {
    double ref[M * N], got[M * N];
    int relu_bad = 0;
    for (int i = 0; i < M * N; i++) {
      ref[i] = gelu_d(y0[i]);
      got[i] = y[i];
      relu_bad += yr[i] != (y0[i] > 0 ? y0[i] : 0.0f);
    }
    CHECK(memcmp(pre, y0, sizeof pre) == 0, "GELU's pre is the plain output");
    double e = rel(got, ref, M * N);
    CHECK(e < 1e-5, "GELU output vs gelu(pre) in fp64: %.3g", e);
    CHECK(relu_bad == 0, "RELU output: %d values differ from max(y, 0)", relu_bad);
  }
  nt_tensor p16 = pt;
  p16.dtype = NT_BF16;
  CHECK_ERR(ctx, NT_ERR_DTYPE,
            nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yt, NT_ACT_GELU, &p16));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG,
            nt_fp8_linear_forward(ctx, &cfg, &xt, &wt, &bt, &yt, NT_ACT_GELU, NULL));
  nt_fp8_state_free(ctx, s);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_quantize(ctx);
  test_linear_case(ctx, (lcase){15, 37, 21, NT_F32, NT_F32});     /* padded: scratch path */
  test_linear_case(ctx, (lcase){32, 48, 16, NT_F32, NT_F32});     /* multiples of 16: direct */
  test_linear_case(ctx, (lcase){32, 64, 48, NT_BF16, NT_BF16});   /* direct with bf16 bias */
  test_linear_case(ctx, (lcase){19, 33, 40, NT_BF16, NT_F32});    /* bf16, f32 bias, padded */
  test_linear_case(ctx, (lcase){16, 32, 32, NT_F16, NT_F32});     /* f16, f32 bias: scratch */
  test_linear_errors(ctx);
  test_activation(ctx);
  /* The fused GELU backward and column sums: on the CPU the same arithmetic as unfused. */
  fused_dual_case(ctx, NT_BF16, 70, 45, 3, 6e-8);  /* measured 2.73e-8, 2.91e-8 */
  fused_dual_case(ctx, NT_F32, 33, 64, 0, 6e-8);
  fused_backward_case(ctx, NT_BF16, NT_F32, true, 48, 32, 64, true, 0.0);
  fused_backward_case(ctx, NT_F32, NT_F32, true, 19, 37, 21, true, 0.0);
  fused_backward_case(ctx, NT_BF16, NT_BF16, true, 48, 32, 64, true, 0.0);
  fused_backward_case(ctx, NT_BF16, NT_F32, false, 48, 32, 64, true, 0.0);
  fused_errors(ctx);
  double ratio = fp8_mlp_ratio(ctx, 300, true, 48, 72);
  printf("  mlp (emulated fp8): final/initial loss %.3f\n", ratio);
  CHECK(ratio >= 0 && ratio < 0.2, "the fp8 MLP learns: final/initial loss %.3f", ratio);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
