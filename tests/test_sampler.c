/* DistributedSampler arithmetic (docs/semantics.md): vectors, padding / drop_last layouts, the
 * seeded shuffle and argument errors. */
#include <stdlib.h>
#include <string.h>
#include "data/sampler.h"
#include "testutil.h"

static void check_vec(nt_ctx *ctx, int64_t len, int R, bool drop, int rank, const int64_t *want,
                      int64_t n) {
  nt_sampler s;
  if (!CHECK_OK(ctx, nt_sampler_init(ctx, &s, len, rank, R, false, 0, drop))) return;
  CHECK(s.num_samples == n, "len %lld R %d drop %d: num_samples %lld want %lld", (long long)len, R,
        drop, (long long)s.num_samples, (long long)n);
  int64_t got[16] = {0};
  CHECK_OK(ctx, nt_sampler_indices(ctx, &s, got, NULL));
  CHECK(memcmp(got, want, (size_t)n * sizeof *got) == 0, "rank %d drop %d: got [%lld,%lld,%lld]",
        rank, drop, (long long)got[0], (long long)got[1], (long long)got[2]);
}

static void test_semantics_vectors(nt_ctx *ctx) {
  const int64_t keep[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  const int64_t drop[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; r++) {
    check_vec(ctx, 10, 4, false, r, keep[r], 3);
    check_vec(ctx, 10, 4, true, r, drop[r], 2);
  }
}

/* torch's formula, written independently of the library's. */
static int64_t torch_num_samples(int64_t len, int R, bool drop) {
  if (drop && len % R != 0) return (int64_t)__builtin_ceil((double)(len - R) / R);
  return (int64_t)__builtin_ceil((double)len / R);
}

/* For one (len, R, drop, shuffle) layout: the ranks together take the shuffled list padded by
 * repeating from its start (or cut), every sample exactly once in the first len entries. */
static void check_layout(nt_ctx *ctx, int64_t len, int R, bool drop, bool shuffle) {
  int64_t ns = torch_num_samples(len, R, drop), total = ns * R;
  int64_t *all = calloc((size_t)total, sizeof *all), *mine = calloc((size_t)ns + 1, sizeof *mine);
  int64_t *perm = malloc((size_t)len * sizeof *perm), *count = calloc((size_t)len, sizeof *count);
  int bad = 0;
  for (int r = 0; r < R; r++) {
    nt_sampler s;
    if (!CHECK_OK(ctx, nt_sampler_init(ctx, &s, len, r, R, shuffle, 1234, drop))) goto done;
    nt_sampler_set_epoch(&s, 3);
    bad += s.num_samples != ns || s.total != total;
    CHECK_OK(ctx, nt_sampler_indices(ctx, &s, mine, NULL));
    for (int64_t i = 0; i < ns; i++) all[r + i * R] = mine[i];
  }
  /* Rebuild the epoch's list: positions 0..len-1 must be a permutation. */
  if (shuffle) {
    nt_randperm(len, 1234 + 3, perm);
  } else {
    for (int64_t i = 0; i < len; i++) perm[i] = i;
  }
  for (int64_t k = 0; k < total; k++) {
    bad += all[k] != perm[k % len];
    if (all[k] >= 0 && all[k] < len) count[all[k]]++;
  }
  int64_t first = drop ? total : len;  /* entries before the padding */
  /* Each sample: exactly once among the first `first` entries; padding repeats the start. */
  memset(count, 0, (size_t)len * sizeof *count);
  for (int64_t k = 0; k < first; k++) count[all[k]]++;
  for (int64_t i = 0; i < len; i++) bad += drop ? count[i] > 1 : count[i] != 1;
  if (drop) bad += total > len || total < len - R + 1;
  else bad += total < len || total >= len + R;
  CHECK(bad == 0, "len %lld R %d drop %d shuffle %d: %d mismatches", (long long)len, R, drop,
        shuffle, bad);
done:
  free(all); free(mine); free(perm); free(count);
}

static void test_layouts(nt_ctx *ctx) {
  int64_t lens[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 13, 16, 100, 101, 1000, 1001};
  for (size_t a = 0; a < sizeof lens / sizeof *lens; a++)
    for (int R = 1; R <= 8; R++)
      for (int drop = 0; drop < 2; drop++)
        for (int sh = 0; sh < 2; sh++) {
          if (drop && lens[a] < R) continue;  /* an error, tested below */
          check_layout(ctx, lens[a], R, drop, sh);
        }
  /* Padding longer than the list repeats it cyclically: len 2, R 5 -> [0,1,0,1,0]. */
  const int64_t want[5] = {0, 1, 0, 1, 0};
  for (int r = 0; r < 5; r++) check_vec(ctx, 2, 5, false, r, &want[r], 1);
}

static void test_shuffle(nt_ctx *ctx) {
  enum { N = 100 };
  int64_t a[N], b[N], c[N];
  nt_sampler s;
  if (!CHECK_OK(ctx, nt_sampler_init(ctx, &s, N, 0, 1, true, 42, false))) return;
  nt_sampler_set_epoch(&s, 5);
  CHECK_OK(ctx, nt_sampler_indices(ctx, &s, a, NULL));
  CHECK_OK(ctx, nt_sampler_indices(ctx, &s, b, NULL));
  CHECK(memcmp(a, b, sizeof a) == 0, "same seed and epoch: same order");
  nt_sampler_set_epoch(&s, 6);
  CHECK_OK(ctx, nt_sampler_indices(ctx, &s, c, NULL));
  CHECK(memcmp(a, c, sizeof a) != 0, "another epoch: another order");
  int fixed = 0;
  for (int i = 0; i < N; i++) fixed += a[i] == i;
  CHECK(fixed < 10, "a shuffle leaves few fixed points (%d)", fixed);
  /* seed + epoch: (seed 41, epoch 6) is the same generator as (seed 42, epoch 5). */
  nt_sampler t;
  CHECK_OK(ctx, nt_sampler_init(ctx, &t, N, 0, 1, true, 41, false));
  nt_sampler_set_epoch(&t, 6);
  CHECK_OK(ctx, nt_sampler_indices(ctx, &t, c, NULL));
  CHECK(memcmp(a, c, sizeof a) == 0, "the generator is seeded with seed + epoch");
  /* Uniformity: the 6 permutations of 3 items, 60000 seeds, each about 10000 times. */
  int hist[6] = {0};
  for (uint64_t seed = 0; seed < 60000; seed++) {
    int64_t p[3];
    nt_randperm(3, seed, p);
    int code = (int)(p[0] * 2 + (p[1] > p[2] ? 1 : 0));
    hist[code]++;
  }
  for (int k = 0; k < 6; k++) CHECK(hist[k] > 9500 && hist[k] < 10500, "perm %d: %d", k, hist[k]);
  uint64_t st = 7;
  int below[7] = {0};
  for (int i = 0; i < 70000; i++) below[nt_splitmix64_below(&st, 7)]++;
  for (int k = 0; k < 7; k++) CHECK(below[k] > 9500 && below[k] < 10500, "below %d: %d", k, below[k]);
}

static void test_errors(nt_ctx *ctx) {
  nt_sampler s;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sampler_init(ctx, &s, 0, 0, 1, false, 0, false));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sampler_init(ctx, &s, 10, 4, 4, false, 0, false));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sampler_init(ctx, &s, 10, -1, 4, false, 0, false));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sampler_init(ctx, &s, 10, 0, 0, false, 0, false));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sampler_init(ctx, &s, 3, 0, 4, false, 0, true));
  CHECK(nt_sampler_num_samples(3, 4, false) == 1, "len 3 over 4 ranks pads to 1 each");
}

int main(void) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_semantics_vectors(ctx);
  test_layouts(ctx);
  test_shuffle(ctx);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
