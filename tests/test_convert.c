/* Conversions: every 16-bit and 8-bit pattern decoded and re-encoded, exact ties, and a sweep of
 * 2^25 fp32 inputs against a reference written differently: values in double from the format
 * definition, and rounding as a search for the nearest table entry with ties to the even
 * pattern (the library rounds with bit manipulation). */
#include "tests/testutil.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name;
  int ebits, mbits, bias;
  bool ieee;           /* all-ones exponent is inf/NaN; otherwise (E4M3) only S.1111.111 is NaN */
  uint32_t max_pos;    /* largest finite positive pattern */
  uint32_t nan_out;    /* what a NaN input becomes */
  double *table;       /* values of patterns 0 .. max_pos + 1 (the value one step past max) */
} format;

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Value of a positive pattern straight from the definition; for max_pos + 1 this is the next
 * value the format would have with one more exponent (or mantissa) step. */
static double ref_value(const format *f, uint32_t bits) {
  uint32_t e = bits >> f->mbits, m = bits & ((1u << f->mbits) - 1);
  if (e == 0) return ldexp((double)m, 1 - f->bias - f->mbits);
  return ldexp(1.0 + ldexp((double)m, -f->mbits), (int)e - f->bias);
}

static void build_table(format *f) {
  f->table = malloc((f->max_pos + 2) * sizeof(double));
  for (uint32_t b = 0; b <= f->max_pos + 1; b++) f->table[b] = ref_value(f, b);
}

static uint32_t width(const format *f) { return 1u + (uint32_t)f->ebits + (uint32_t)f->mbits; }

/* Reference fp32 -> format: nearest table value, ties to the even pattern, then overflow. */
static uint32_t ref_encode(const format *f, float x, bool saturate) {
  if (isnan(x)) return f->nan_out;
  uint32_t sign = signbit(x) ? 1u << (width(f) - 1) : 0;
  double a = fabs((double)x);
  uint32_t k;
  if (a >= f->table[f->max_pos + 1]) {
    k = f->max_pos + 1;
  } else {
    uint32_t lo = 0, hi = f->max_pos + 1;   /* table[lo] <= a < table[hi] */
    while (hi - lo > 1) {
      uint32_t mid = (lo + hi) / 2;
      if (f->table[mid] <= a) lo = mid; else hi = mid;
    }
    double midpoint = (f->table[lo] + f->table[hi]) / 2;   /* exact: few significant bits */
    if (a > midpoint) k = hi;
    else if (a < midpoint) k = lo;
    else k = (lo & 1) ? hi : lo;
  }
  if (k > f->max_pos) {
    if (saturate && f->ebits + f->mbits == 7) k = f->max_pos;   /* FP8 only */
    else k = f->ieee ? (0xffu >> (8 - f->ebits)) << f->mbits : 0x7f;  /* inf, or E4M3 NaN */
  }
  return sign | k;
}

static format F16 = {"f16", 5, 10, 15, true, 0x7bff, 0x7fff, NULL};
static format BF16 = {"bf16", 8, 7, 127, true, 0x7f7f, 0x7fff, NULL};
static format E4M3 = {"e4m3", 4, 3, 7, false, 0x7e, 0x7f, NULL};
static format E5M2 = {"e5m2", 5, 2, 15, true, 0x7b, 0x7f, NULL};

static uint32_t lib_encode(const format *f, float x, bool saturate) {
  if (f == &F16) return nt_f32_to_f16(x);
  if (f == &BF16) return nt_f32_to_bf16(x);
  if (f == &E4M3) return nt_f32_to_e4m3(x, saturate);
  return nt_f32_to_e5m2(x, saturate);
}
static float lib_decode(const format *f, uint32_t v) {
  if (f == &F16) return nt_f16_to_f32((uint16_t)v);
  if (f == &BF16) return nt_bf16_to_f32((uint16_t)v);
  if (f == &E4M3) return nt_e4m3_to_f32((uint8_t)v);
  return nt_e5m2_to_f32((uint8_t)v);
}
/* fp16 and bf16 have no saturating mode: both modes must give the IEEE result. */
static bool has_sat(const format *f) { return f == &E4M3 || f == &E5M2; }

static bool is_nan_pattern(const format *f, uint32_t v) {
  uint32_t mag = v & ((1u << (width(f) - 1)) - 1);
  uint32_t inf = (0xffu >> (8 - f->ebits)) << f->mbits;
  return f->ieee ? mag > inf : mag == 0x7f;
}

/* Every pattern decodes to its reference value and encodes back to itself. */
static void test_all_patterns(const format *f) {
  uint32_t n = 1u << width(f), bad_dec = 0, bad_enc = 0;
  uint32_t sign_bit = 1u << (width(f) - 1);
  for (uint32_t v = 0; v < n; v++) {
    float d = lib_decode(f, v);
    if (is_nan_pattern(f, v)) {
      /* NaN stays NaN; CUDA's decoders give the canonical 0x7fffffff (bf16 just widens). */
      uint32_t want = f == &BF16 ? v << 16 : 0x7fffffffu;
      if (!isnan(d) || f32_bits(d) != want) bad_dec++;
      if (lib_encode(f, d, true) != f->nan_out || lib_encode(f, d, false) != f->nan_out) bad_enc++;
      continue;
    }
    uint32_t mag = v & (sign_bit - 1);
    double want = mag <= f->max_pos ? f->table[mag] : INFINITY;
    if (v & sign_bit) want = -want;
    if ((double)d != want || (signbit(d) != 0) != ((v & sign_bit) != 0)) {
      if (bad_dec++ < 5) fprintf(stderr, "%s decode 0x%x = %a, want %a\n", f->name, v, d, want);
    }
    uint32_t back = lib_encode(f, d, false);
    uint32_t back_sat = lib_encode(f, d, true);
    bool inf = mag > f->max_pos;
    uint32_t want_sat = inf && has_sat(f) ? (v & sign_bit) | f->max_pos : v;
    if (back != v || back_sat != want_sat) {
      if (bad_enc++ < 5)
        fprintf(stderr, "%s re-encode 0x%x -> 0x%x / sat 0x%x\n", f->name, v, back, back_sat);
    }
  }
  CHECK(bad_dec == 0, "%s: %u of %u patterns decode wrongly", f->name, bad_dec, n);
  CHECK(bad_enc == 0, "%s: %u of %u patterns re-encode wrongly", f->name, bad_enc, n);
}

/* Midpoints between neighbours (subnormal range and the overflow boundary included) round to
 * the even pattern; one fp32 step either side rounds to the nearer one. */
static void test_ties(const format *f) {
  uint32_t bad = 0, checked = 0;
  for (uint32_t k = 0; k <= f->max_pos; k++) {
    double mid = (f->table[k] + f->table[k + 1]) / 2;
    float m = (float)mid;
    if ((double)m != mid) { bad++; continue; }   /* every midpoint here is an fp32 */
    for (int s = 0; s < 2; s++) {
      float x = s ? -m : m;
      float above = nextafterf(x, s ? -INFINITY : INFINITY);
      float below = nextafterf(x, 0.0f);
      for (int sat = 0; sat < 2; sat++) {
        float xs[3] = {below, x, above};
        for (int j = 0; j < 3; j++) {
          uint32_t want = ref_encode(f, xs[j], sat);
          uint32_t got = lib_encode(f, xs[j], sat);
          checked++;
          if (got != want && bad++ < 5)
            fprintf(stderr, "%s tie %a sat=%d: got 0x%x want 0x%x\n", f->name, xs[j], sat, got, want);
        }
        /* The reference itself: the exact tie goes to the even one of k, k + 1. */
        uint32_t even = (k & 1) ? k + 1 : k;
        uint32_t r = ref_encode(f, m, sat);
        if (even <= f->max_pos && r != even) bad++;
      }
    }
  }
  CHECK(bad == 0, "%s: %u tie cases wrong of %u", f->name, bad, checked);
}

/* 2^24 fp32 patterns spaced 256 apart (low bits zero: many exact ties for bf16) and 2^24 with
 * scrambled low bits, covering every exponent, both signs, inf and NaN. */
static void test_sweep(void) {
  const format *fs[4] = {&F16, &BF16, &E4M3, &E5M2};
  uint32_t bad[4] = {0, 0, 0, 0};
  uint64_t n = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < (1u << 24); i++) {
      uint32_t low = pass ? (i * 2654435761u) >> 24 : 0;
      float x = bits_f32((i << 8) | low);
      n++;
      for (int j = 0; j < 4; j++) {
        for (int sat = 0; sat < (has_sat(fs[j]) ? 2 : 1); sat++) {
          uint32_t got = lib_encode(fs[j], x, sat), want = ref_encode(fs[j], x, sat);
          if (got != want && bad[j]++ < 5)
            fprintf(stderr, "%s(%a) sat=%d: got 0x%x want 0x%x\n", fs[j]->name, x, sat, got, want);
        }
      }
    }
  }
  for (int j = 0; j < 4; j++)
    CHECK(bad[j] == 0, "%s: %u of %llu sweep inputs differ from the reference", fs[j]->name,
          bad[j], (unsigned long long)n);
}

/* CUDA's special cases, spelled out. */
static void test_specials(void) {
  float nan = bits_f32(0x7fc00000u), nnan = bits_f32(0xffc00001u);
  CHECK(nt_f32_to_f16(nan) == 0x7fff && nt_f32_to_f16(nnan) == 0x7fff, "f16 NaN");
  CHECK(nt_f32_to_bf16(nan) == 0x7fff && nt_f32_to_bf16(nnan) == 0x7fff, "bf16 NaN");
  CHECK(nt_f32_to_e4m3(nnan, true) == 0x7f && nt_f32_to_e4m3(nnan, false) == 0x7f, "e4m3 NaN");
  CHECK(nt_f32_to_e5m2(nnan, true) == 0x7f && nt_f32_to_e5m2(nan, false) == 0x7f, "e5m2 NaN");
  CHECK(nt_f32_to_f16(-INFINITY) == 0xfc00 && nt_f32_to_bf16(INFINITY) == 0x7f80, "inf");
  CHECK(nt_f32_to_e4m3(INFINITY, true) == 0x7e && nt_f32_to_e4m3(-INFINITY, true) == 0xfe,
        "e4m3 satfinite inf");
  CHECK(nt_f32_to_e4m3(INFINITY, false) == 0x7f && nt_f32_to_e4m3(-INFINITY, false) == 0xff,
        "e4m3 nosat inf is NaN with the sign");
  CHECK(nt_f32_to_e5m2(-INFINITY, true) == 0xfb && nt_f32_to_e5m2(-INFINITY, false) == 0xfc,
        "e5m2 inf");
  CHECK(nt_f32_to_e4m3(448.0f, false) == 0x7e && nt_f32_to_e4m3(464.0f, false) == 0x7e,
        "e4m3 448 and the tie 464 stay finite");
  CHECK(nt_f32_to_e4m3(nextafterf(464.0f, 1e9f), false) == 0x7f &&
        nt_f32_to_e4m3(-nextafterf(464.0f, 1e9f), true) == 0xfe, "e4m3 just past 464");
  CHECK(nt_f32_to_e5m2(61440.0f, false) == 0x7c && nt_f32_to_e5m2(61440.0f, true) == 0x7b &&
        nt_f32_to_e5m2(nextafterf(61440.0f, 0.0f), false) == 0x7b, "e5m2 overflow tie");
  CHECK(nt_f32_to_f16(65504.0f) == 0x7bff && nt_f32_to_f16(65520.0f) == 0x7c00 &&
        nt_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7bff, "f16 overflow tie");
  CHECK(nt_f32_to_bf16(bits_f32(0x7f7f8000u)) == 0x7f80 &&
        nt_f32_to_bf16(bits_f32(0x7f7f7fffu)) == 0x7f7f, "bf16 overflow tie");
  CHECK(nt_f32_to_f16(0x1p-25f) == 0 && nt_f32_to_f16(-0x1p-25f) == 0x8000 &&
        nt_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 1 && nt_f32_to_f16(0x1.8p-24f) == 2,
        "f16 smallest subnormal ties");
  CHECK(nt_f32_to_e4m3(0x1p-10f, true) == 0 && nt_f32_to_e4m3(0x1.8p-9f, true) == 2 &&
        nt_f32_to_e4m3(0x1.4p-9f, true) == 1, "e4m3 subnormal rounding");
  CHECK(nt_f32_to_bf16(bits_f32(0x00018000u)) == 0x0002 && nt_f32_to_bf16(bits_f32(0x00008000u)) == 0,
        "bf16 subnormal ties");
  /* One rounding: 1.0625 + 2^-20 rounds up to 1.125 in E4M3, while rounding to fp16 first
   * would land exactly on the tie 1.0625 and then go to the even 1.0. */
  CHECK(nt_f32_to_e4m3(1.0625f + 0x1p-20f, true) == 0x39, "e4m3 double rounding avoided");
  CHECK(nt_f32_to_e5m2(1.125f + 0x1p-20f, true) == 0x3d, "e5m2 double rounding avoided");
  CHECK(f32_bits(nt_f16_to_f32(0xfe00)) == 0x7fffffffu && f32_bits(nt_e5m2_to_f32(0xfd)) == 0x7fffffffu &&
        f32_bits(nt_e4m3_to_f32(0xff)) == 0x7fffffffu, "decoded NaN is canonical");
  CHECK(nt_e4m3_to_f32(0x7e) == 448.0f && nt_e4m3_to_f32(0x01) == 0x1p-9f &&
        nt_e5m2_to_f32(0x7b) == 57344.0f && nt_e5m2_to_f32(0x01) == 0x1p-16f &&
        nt_e5m2_to_f32(0xfc) == -INFINITY && nt_f16_to_f32(0x0001) == 0x1p-24f, "decode values");
}

static void test_load_store(void) {
  float vals[6] = {1.5f, -2.75f, 3e9f, -3e9f, NAN, 300.7f};
  int32_t i32[6];
  int64_t i64[6];
  uint8_t u8[6];
  for (int i = 0; i < 6; i++) {
    nt_store_f32(i32, NT_I32, i, vals[i]);
    nt_store_f32(i64, NT_I64, i, vals[i]);
    nt_store_f32(u8, NT_U8, i, vals[i]);
  }
  CHECK(i32[0] == 1 && i32[1] == -2 && i32[2] == INT32_MAX && i32[3] == INT32_MIN && i32[4] == 0 &&
        i32[5] == 300, "i32 store truncates and saturates: %d %d %d %d %d", i32[0], i32[1], i32[2],
        i32[3], i32[4]);
  CHECK(i64[2] == 3000000000ll && i64[3] == -3000000000ll && i64[4] == 0, "i64 store");
  nt_store_f32(i64, NT_I64, 0, 1e30f);
  CHECK(i64[0] == INT64_MAX, "i64 saturates");
  CHECK(u8[0] == 1 && u8[1] == 0 && u8[2] == 255 && u8[5] == 255 && u8[4] == 0, "u8 store");
  CHECK(nt_load_f32(i32, NT_I32, 1) == -2.0f && nt_load_f32(i64, NT_I64, 2) == 3e9f &&
        nt_load_f32(u8, NT_U8, 2) == 255.0f, "int loads");
  uint16_t h[2];
  uint8_t q[2];
  nt_store_f32(h, NT_F16, 1, 0.1f);
  CHECK(h[1] == nt_f32_to_f16(0.1f) && nt_load_f32(h, NT_F16, 1) == nt_f16_to_f32(h[1]), "f16");
  nt_store_f32(h, NT_BF16, 0, -0.1f);
  CHECK(h[0] == nt_f32_to_bf16(-0.1f) && nt_load_f32(h, NT_BF16, 0) == nt_bf16_to_f32(h[0]), "bf16");
  nt_store_f32(q, NT_FP8_E4M3, 0, 1000.0f);
  nt_store_f32(q, NT_FP8_E5M2, 1, -1e6f);
  CHECK(q[0] == 0x7e && q[1] == 0xfb, "fp8 stores saturate: 0x%x 0x%x", q[0], q[1]);
  CHECK(nt_load_f32(q, NT_FP8_E4M3, 0) == 448.0f && nt_load_f32(q, NT_FP8_E5M2, 1) == -57344.0f,
        "fp8 loads");
}

static void test_convert_cpu(nt_ctx *ctx) {
  enum { N = 1031 };
  float src[N], back[N];
  nt_test_rng r = {7};
  nt_test_fill_uniform(&r, src, N, -600.0f, 600.0f);
  src[0] = NAN; src[1] = INFINITY; src[2] = 1e-9f; src[3] = -0.0f;
  static uint8_t buf[N * 8];
  nt_tensor s = nt_tensor_view(src, NT_F32, nt_cpu(), 2, (int64_t[]){1, N});
  nt_tensor b = nt_tensor_view(back, NT_F32, nt_cpu(), 1, (int64_t[]){N});
  nt_dtype floats[4] = {NT_F16, NT_BF16, NT_FP8_E4M3, NT_FP8_E5M2};
  for (int k = 0; k < 4; k++) {
    nt_tensor d = nt_tensor_view(buf, floats[k], nt_cpu(), 1, (int64_t[]){N});
    if (!CHECK_OK(ctx, nt_convert(ctx, &d, &s))) continue;
    CHECK_OK(ctx, nt_convert(ctx, &b, &d));
    int bad = 0;
    for (int i = 0; i < N; i++) {
      float want = nt_load_f32(buf, floats[k], i);
      if (f32_bits(back[i]) != f32_bits(want)) bad++;
      float direct;
      switch (floats[k]) {
        case NT_F16: direct = nt_f16_to_f32(nt_f32_to_f16(src[i])); break;
        case NT_BF16: direct = nt_bf16_to_f32(nt_f32_to_bf16(src[i])); break;
        case NT_FP8_E4M3: direct = nt_e4m3_to_f32(nt_f32_to_e4m3(src[i], true)); break;
        default: direct = nt_e5m2_to_f32(nt_f32_to_e5m2(src[i], true)); break;
      }
      if (f32_bits(direct) != f32_bits(back[i])) bad++;
    }
    CHECK(bad == 0, "convert f32 -> %s -> f32: %d mismatches", nt_dtype_name(floats[k]), bad);
  }
  /* Between two narrow formats (through fp32, one rounding): bf16 -> f16 -> e5m2. */
  uint16_t hb[N], hh[N];
  uint8_t q[N];
  nt_tensor tb = nt_tensor_view(hb, NT_BF16, nt_cpu(), 1, (int64_t[]){N});
  nt_tensor th = nt_tensor_view(hh, NT_F16, nt_cpu(), 1, (int64_t[]){N});
  nt_tensor tq = nt_tensor_view(q, NT_FP8_E5M2, nt_cpu(), 1, (int64_t[]){N});
  CHECK_OK(ctx, nt_convert(ctx, &tb, &s));
  CHECK_OK(ctx, nt_convert(ctx, &th, &tb));
  CHECK_OK(ctx, nt_convert(ctx, &tq, &th));
  int bad = 0;
  for (int i = 0; i < N; i++) {
    if (hh[i] != nt_f32_to_f16(nt_bf16_to_f32(hb[i]))) bad++;
    if (q[i] != nt_f32_to_e5m2(nt_f16_to_f32(hh[i]), true)) bad++;
  }
  CHECK(bad == 0, "narrow to narrow: %d mismatches", bad);
  /* Integers to and from f32. */
  int32_t iv[N];
  nt_tensor ti = nt_tensor_view(iv, NT_I32, nt_cpu(), 1, (int64_t[]){N});
  CHECK_OK(ctx, nt_convert(ctx, &ti, &s));
  CHECK(iv[0] == 0 && iv[1] == INT32_MAX && iv[5] == (int32_t)truncf(src[5]), "f32 -> i32: %d %d %d (%g)",
        iv[0], iv[1], iv[5], (double)src[5]);
  CHECK_OK(ctx, nt_convert(ctx, &b, &ti));
  CHECK(back[5] == (float)iv[5], "i32 -> f32");
  /* Errors that name the problem. */
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_convert(ctx, &th, &ti));
  CHECK(strstr(nt_last_error(ctx), "i32") != NULL, "message: %s", nt_last_error(ctx));
  nt_tensor small = nt_tensor_view(hh, NT_F16, nt_cpu(), 1, (int64_t[]){N - 1});
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_convert(ctx, &small, &s));
  nt_tensor s2 = nt_tensor_view(src, NT_F32, nt_cpu(), 2, (int64_t[]){2, 515});
  nt_tensor st = nt_tensor_transpose(&s2, 0, 1);
  nt_tensor d2 = nt_tensor_view(hh, NT_F16, nt_cpu(), 2, (int64_t[]){515, 2});
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_convert(ctx, &d2, &st));
  nt_tensor gpu = th;
  gpu.device = nt_cuda(0);
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_convert(ctx, &gpu, &s));
}

int main(void) {
  format *fs[4] = {&F16, &BF16, &E4M3, &E5M2};
  for (int j = 0; j < 4; j++) build_table(fs[j]);
  for (int j = 0; j < 4; j++) {
    test_all_patterns(fs[j]);
    test_ties(fs[j]);
  }
  test_specials();
  test_load_store();
  test_sweep();
  nt_ctx *ctx;
  if (CHECK_OK(NULL, nt_ctx_create(&ctx, nt_cpu()))) test_convert_cpu(ctx);
  nt_ctx_free(ctx);
  for (int j = 0; j < 4; j++) free(fs[j]->table);
  return nt_test_finish();
}
