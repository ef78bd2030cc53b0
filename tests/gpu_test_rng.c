/* RNG on the GPU (cuRAND's Philox) against the CPU generator: uniforms bit for bit, normals
 * to the accuracy of the device's fast __sincosf, for several seeds, offsets that are not
 * multiples of 4 and sizes that are not multiples of 4; nothing written past the end. */
#include "tests/testutil.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 12345.0f
#define PAD 8

typedef struct {
  long mismatches, n;
  double max_abs, sum_d2, sum_r2;
} stats;

/* Draws n numbers on the GPU (into a view surrounded by sentinels, starting `shift` elements
 * past a 32-byte boundary: 0 takes the kernels' 16-byte stores, 1 their scalar path) and on the
 * CPU. The GPU numbers end up in gpu[PAD .. PAD + n). */
static int draw(nt_ctx *g, nt_ctx *c, int normal, uint64_t seed, uint64_t off, int64_t n,
                int shift, float *gpu, float *cpu) {
  int64_t tot = n + 2 * PAD;   /* shift < PAD */
  int64_t shp_tot[1] = {tot}, shp_n[1] = {n};
  nt_tensor dev;
  int ok = 0;
  for (int64_t i = 0; i < tot; i++) gpu[i] = SENTINEL;
  if (!CHECK_OK(g, nt_tensor_alloc(g, &dev, NT_F32, 1, shp_tot))) return 0;
  nt_tensor host = nt_tensor_view(gpu, NT_F32, nt_cpu(), 1, shp_tot);
  if (!CHECK_OK(g, nt_tensor_copy(g, &dev, &host))) goto done;
  nt_tensor view = nt_tensor_view((float *)dev.data + PAD + shift, NT_F32, dev.device, 1, shp_n);
  nt_tensor cv = nt_tensor_view(cpu, NT_F32, nt_cpu(), 1, shp_n);
  if (normal) {
    if (!CHECK_OK(g, nt_rng_normal(g, &view, seed, off, 0.25f, 1.5f))) goto done;
    if (!CHECK_OK(c, nt_rng_normal(c, &cv, seed, off, 0.25f, 1.5f))) goto done;
  } else {
    if (!CHECK_OK(g, nt_rng_uniform(g, &view, seed, off))) goto done;
    if (!CHECK_OK(c, nt_rng_uniform(c, &cv, seed, off))) goto done;
  }
  if (!CHECK_OK(g, nt_tensor_copy(g, &host, &dev))) goto done;
  int untouched = 1;
  for (int64_t i = 0; i < tot; i++)
    if (i < PAD + shift || i >= PAD + shift + n) untouched &= gpu[i] == SENTINEL;
  memmove(gpu + PAD, gpu + PAD + shift, sizeof(float) * (size_t)n);
  CHECK(untouched, "%s seed %llu offset %llu n %lld: wrote outside the view",
        normal ? "normal" : "uniform", (unsigned long long)seed, (unsigned long long)off,
        (long long)n);
  ok = 1;
done:
  nt_tensor_free(g, &dev);
  return ok;
}

static void test_uniform(nt_ctx *g, nt_ctx *c, float *gpu, float *cpu) {
  const uint64_t seeds[3] = {0, 42, 0xdeadbeefcafef00dull};
  const uint64_t offs[6] = {0, 1, 2, 3, 4099, (1ull << 40) + 5};
  const int64_t sizes[5] = {1, 3, 5, 1001, (1 << 20) + 3};
  for (int s = 0; s < 3; s++)
    for (int o = 0; o < 6; o++)
      for (int k = 0; k < 5; k++) {
        int64_t n = sizes[k];
        if (!draw(g, c, 0, seeds[s], offs[o], n, (s + k) & 1, gpu, cpu)) return;
        long bad = 0;
        for (int64_t i = 0; i < n; i++)
          if (memcmp(&gpu[PAD + i], &cpu[i], sizeof(float))) {
            if (bad++ < 3)
              fprintf(stderr, "  [%lld] gpu %a cpu %a\n", (long long)i, gpu[PAD + i], cpu[i]);
          }
        CHECK(bad == 0, "uniform seed %llu offset %llu n %lld: %ld of %lld differ",
              (unsigned long long)seeds[s], (unsigned long long)offs[o], (long long)n, bad,
              (long long)n);
      }
}

/* The device's Box-Muller uses __sincosf (absolute error ~1e-6 over [0, 2pi]) where the CPU
 * uses sinf/cosf, scaled by sqrt(-2 log u) <= 6.7 and then by std: per element a small
 * absolute difference is expected, and a mismatched index or pairing would be O(1). */
static void test_normal(nt_ctx *g, nt_ctx *c, float *gpu, float *cpu) {
  const uint64_t seeds[3] = {0, 7, 0x0123456789abcdefull};
  const uint64_t offs[5] = {0, 2, 4, 1002, (1ull << 36) + 6};
  const int64_t sizes[4] = {1, 3, 1001, (1 << 20) + 3};
  double worst_abs = 0, worst_rel = 0;
  for (int s = 0; s < 3; s++)
    for (int o = 0; o < 5; o++)
      for (int k = 0; k < 4; k++) {
        int64_t n = sizes[k];
        if (!draw(g, c, 1, seeds[s], offs[o], n, (s + k) & 1, gpu, cpu)) return;
        long bad = 0;
        double d2 = 0, r2 = 0, mx = 0;
        for (int64_t i = 0; i < n; i++) {
          double d = fabs((double)gpu[PAD + i] - cpu[i]);
          d2 += d * d;
          r2 += (double)(cpu[i] - 0.25f) * (cpu[i] - 0.25f);
          if (d > mx) mx = d;
          if (!(d <= 1e-4)) {
            if (bad++ < 3)
              fprintf(stderr, "  [%lld] gpu %.9g cpu %.9g\n", (long long)i, gpu[PAD + i], cpu[i]);
          }
        }
        double rel = r2 > 0 ? sqrt(d2 / r2) : 0;
        if (mx > worst_abs) worst_abs = mx;
        if (rel > worst_rel) worst_rel = rel;
        CHECK(bad == 0 && rel < 1e-5, "normal seed %llu offset %llu n %lld: %ld elements off "
              "by > 1e-4, max %g, relative norm %g", (unsigned long long)seeds[s],
              (unsigned long long)offs[o], (long long)n, bad, mx, rel);
      }
  printf("normal GPU vs CPU: max abs difference %.3g, worst relative norm %.3g\n", worst_abs,
         worst_rel);
}

/* Odd offsets put the pairs across Philox blocks differently; the CPU defines the layout, the
 * GPU must follow it. */
static void test_normal_odd_offsets(nt_ctx *g, nt_ctx *c, float *gpu, float *cpu) {
  const uint64_t offs[3] = {1, 3, 4097};
  for (int o = 0; o < 3; o++) {
    int64_t n = 4099;
    if (!draw(g, c, 1, 99, offs[o], n, o & 1, gpu, cpu)) return;
    long bad = 0;
    for (int64_t i = 0; i < n; i++)
      if (!(fabs((double)gpu[PAD + i] - cpu[i]) <= 1e-4)) bad++;
    CHECK(bad == 0, "normal offset %llu: %ld of %lld differ", (unsigned long long)offs[o], bad,
          (long long)n);
  }
}

int main(void) {
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  nt_ctx *c = NULL;
  int64_t cap = (1 << 20) + 3 + 2 * PAD;
  float *gpu = malloc(sizeof(float) * cap), *cpu = malloc(sizeof(float) * cap);
  if (CHECK_OK(NULL, nt_ctx_create(&c, nt_cpu())) && gpu && cpu) {
    test_uniform(g, c, gpu, cpu);
    test_normal(g, c, gpu, cpu);
    test_normal_odd_offsets(g, c, gpu, cpu);
  }
  free(gpu);
  free(cpu);
  nt_ctx_free(c);
  nt_ctx_free(g);
  return nt_test_finish();
}
