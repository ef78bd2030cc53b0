/* RNG on the CPU: Philox4x32-10 known answers (Random123's kat_vectors), the stream layout
 * cuRAND uses, the offset property, and the uniform / normal mappings and statistics. */
#include "tests/testutil.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_kat(void) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    nt_philox4x32_10(kat[t], kat[t] + 4, out);
    CHECK(!memcmp(out, kat[t] + 6, sizeof out), "KAT %d: %08x %08x %08x %08x", t, out[0], out[1],
          out[2], out[3]);
  }
}

/* Number i of the stream is word i % 4 of Philox(counter = i / 4 as a 128-bit number with the
 * low word first, key = seed low word, seed high word). */
static void test_layout(void) {
  uint64_t seeds[3] = {0, 1234, 0xfedcba9876543210ull};
  uint64_t idx[6] = {0, 1, 2, 3, 4 * 0x123456789ull + 2, 0xffffffffffffff07ull};
  int bad = 0;
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < 6; i++) {
      uint64_t b = idx[i] / 4;
      uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
      uint32_t key[2] = {(uint32_t)seeds[s], (uint32_t)(seeds[s] >> 32)};
      uint32_t out[4];
      nt_philox4x32_10(ctr, key, out);
      if (nt_rng_u32(seeds[s], idx[i]) != out[idx[i] % 4]) bad++;
    }
  }
  CHECK(bad == 0, "stream layout: %d mismatches", bad);
  CHECK(nt_rng_u32(1, 0) != nt_rng_u32(2, 0) && nt_rng_u32(1ull << 32, 0) != nt_rng_u32(0, 0),
        "both seed words matter");
}

static void test_uniform_mapping(void) {
  CHECK(nt_rng_u32_to_uniform(0) == 0x1p-33f, "smallest uniform %a", nt_rng_u32_to_uniform(0));
  CHECK(nt_rng_u32_to_uniform(0xffffffffu) == 1.0f, "largest uniform %a",
        nt_rng_u32_to_uniform(0xffffffffu));
  CHECK(nt_rng_u32_to_uniform(1u << 31) == 0.5f + 0x1p-33f ||
        nt_rng_u32_to_uniform(1u << 31) == 0.5f, "middle");
}

/* Drawing n numbers from offset k gives elements k .. k + n - 1 of the draw from offset 0. */
static void test_offsets(nt_ctx *ctx) {
  enum { N = 1031 };
  float *all = malloc(sizeof(float) * (N + 16)), *part = malloc(sizeof(float) * N);
  nt_tensor ta = nt_tensor_view(all, NT_F32, nt_cpu(), 1, (int64_t[]){N + 16});
  uint64_t seed = 0x5eed;
  CHECK_OK(ctx, nt_rng_uniform(ctx, &ta, seed, 0));
  int64_t sizes[4] = {1, 3, 17, N};
  uint64_t offs[6] = {0, 1, 2, 3, 5, 14};
  int bad = 0;
  for (int a = 0; a < 4; a++) {
    for (int b = 0; b < 6; b++) {
      nt_tensor tp = nt_tensor_view(part, NT_F32, nt_cpu(), 1, (int64_t[]){sizes[a]});
      CHECK_OK(ctx, nt_rng_uniform(ctx, &tp, seed, offs[b]));
      for (int64_t i = 0; i < sizes[a]; i++)
        if (part[i] != all[offs[b] + (uint64_t)i] ||
            part[i] != nt_rng_u32_to_uniform(nt_rng_u32(seed, offs[b] + (uint64_t)i)))
          bad++;
    }
  }
  CHECK(bad == 0, "uniform offsets: %d mismatches", bad);
  /* Normals come in pairs: an even shift of the offset shifts the output. */
  CHECK_OK(ctx, nt_rng_normal(ctx, &ta, seed, 0, 0.0f, 1.0f));
  bad = 0;
  for (int b = 0; b < 3; b++) {
    uint64_t off = (uint64_t)b * 2 + (b == 2 ? 8 : 0);
    nt_tensor tp = nt_tensor_view(part, NT_F32, nt_cpu(), 1, (int64_t[]){N});
    CHECK_OK(ctx, nt_rng_normal(ctx, &tp, seed, off, 0.0f, 1.0f));
    for (int64_t i = 0; i < N; i++)
      if (part[i] != all[off + (uint64_t)i]) bad++;
  }
  CHECK(bad == 0, "normal offsets: %d mismatches", bad);
  free(all);
  free(part);
}

/* Box-Muller in double on the same two numbers: element 2k is the sine branch and 2k + 1 the
 * cosine branch of pair (offset + 2k, offset + 2k + 1); then mean + std * z. */
static void test_normal_formula(nt_ctx *ctx) {
  enum { N = 999 };
  float out[N];
  nt_tensor t = nt_tensor_view(out, NT_F32, nt_cpu(), 1, (int64_t[]){N});
  uint64_t seed = 42, off = 6;
  CHECK_OK(ctx, nt_rng_normal(ctx, &t, seed, off, 0.5f, 3.0f));
  double max_err = 0;
  for (int i = 0; i < N; i++) {
    uint64_t p = off + (uint64_t)(i & ~1);
    double u = (double)nt_rng_u32(seed, p) * 0x1p-32 + 0x1p-33;
    double v = ((double)nt_rng_u32(seed, p + 1) * 0x1p-32 + 0x1p-33) * 2 * M_PI;
    double r = sqrt(-2 * log(u));
    double z = (i & 1) ? r * cos(v) : r * sin(v);
    double want = 0.5 + 3.0 * z;
    double err = fabs(out[i] - want) / (1.0 + fabs(want));
    if (err > max_err) max_err = err;
  }
  CHECK(max_err < 1e-5, "normal vs double Box-Muller: max relative error %g", max_err);
}

static void test_statistics(nt_ctx *ctx) {
  enum { N = 1 << 20 };
  float *x = malloc(sizeof(float) * N);
  nt_tensor t = nt_tensor_view(x, NT_F32, nt_cpu(), 2, (int64_t[]){1024, 1024});
  CHECK_OK(ctx, nt_rng_uniform(ctx, &t, 7, 3));
  double s = 0, s2 = 0, lo = 2, hi = -1;
  for (int i = 0; i < N; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  double mean = s / N, var = s2 / N - mean * mean;
  CHECK(lo > 0 && hi <= 1, "uniform range (0, 1]: [%g, %g]", lo, hi);
  CHECK(fabs(mean - 0.5) < 2e-3 && fabs(var - 1.0 / 12) < 1e-3, "uniform mean %g var %g", mean,
        var);
  CHECK_OK(ctx, nt_rng_normal(ctx, &t, 7, 0, -1.0f, 2.0f));
  s = s2 = 0;
  double s4 = 0;
  int finite = 1;
  for (int i = 0; i < N; i++) {
    double d = ((double)x[i] + 1.0) / 2.0;
    finite &= isfinite(x[i]);
    s += d;
    s2 += d * d;
    s4 += d * d * d * d;
  }
  mean = s / N;
  var = s2 / N - mean * mean;
  CHECK(finite, "normals finite");
  CHECK(fabs(mean) < 5e-3 && fabs(var - 1) < 5e-3 && fabs(s4 / N - 3) < 0.05,
        "normal moments: mean %g var %g kurtosis %g", mean, var, s4 / N);
  free(x);
}

static void test_errors(nt_ctx *ctx) {
  uint16_t h[4];
  nt_tensor t = nt_tensor_view(h, NT_F16, nt_cpu(), 1, (int64_t[]){4});
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_rng_uniform(ctx, &t, 1, 0));
  float f[4];
  nt_tensor g = nt_tensor_view(f, NT_F32, nt_cuda(0), 1, (int64_t[]){4});
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_rng_normal(ctx, &g, 1, 0, 0.0f, 1.0f));
  nt_tensor c = nt_tensor_view(f, NT_F32, nt_cpu(), 1, (int64_t[]){4});
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_rng_normal(ctx, &c, 1, 0, 0.0f, NAN));
}

int main(void) {
  test_kat();
  test_layout();
  test_uniform_mapping();
  nt_ctx *ctx;
  if (CHECK_OK(NULL, nt_ctx_create(&ctx, nt_cpu()))) {
    test_offsets(ctx);
    test_normal_formula(ctx);
    test_statistics(ctx);
    test_errors(ctx);
  }
  nt_ctx_free(ctx);
  return nt_test_finish();
}
