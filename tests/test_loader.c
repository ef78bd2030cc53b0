/* The loader on a CPU context: in-order delivery with many workers, identical batches for 0, 1
 * and 4 workers, every sample once per epoch per rank, epochs, errors from workers, shutdown
 * in the middle of an epoch, bad options, and the ready-made datasets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "data/datasets.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "testutil.h"

/* Sample i: field 0 = I32 [3] {i, 7 i + 1, -i}, field 1 = U8 [5] {(i + k) & 255}. */
typedef struct {
  int64_t fail_at;     /* index whose load fails, or -1 */
  int sleep_us;        /* up to this many microseconds per sample (hash of the index) */
} synth;

static nt_status synth_get(void *user, const nt_sample_info *info, void *const *dst) {
  const synth *s = user;
  int64_t i = info->index;
  if (i == s->fail_at) return nt_sample_fail(info, NT_ERR_FORMAT, "bad sample %lld", (long long)i);
  if (s->sleep_us) {
    uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    struct timespec ts = {0, (long)((h >> 40) % (uint64_t)s->sleep_us) * 1000};
    nanosleep(&ts, NULL);
  }
  int32_t *a = dst[0];
  uint8_t *b = dst[1];
  a[0] = (int32_t)i; a[1] = (int32_t)(7 * i + 1); a[2] = (int32_t)-i;
  for (int k = 0; k < 5; k++) b[k] = (uint8_t)((i + k) & 255);
  return NT_OK;
}

static nt_dataset synth_dataset(synth *s, int64_t len) {
  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = len;
  ds.n_fields = 2;
  ds.fields[0].dtype = NT_I32; ds.fields[0].ndim = 1; ds.fields[0].shape[0] = 3;
  ds.fields[1].dtype = NT_U8; ds.fields[1].ndim = 1; ds.fields[1].shape[0] = 5;
  ds.get = synth_get;
  ds.user = s;
  return ds;
}

/* Counts rows whose content does not match their index. */
static int check_batch(const nt_batch *b) {
  int bad = 0;
  const int32_t *a = b->field[0].data;
  const uint8_t *u = b->field[1].data;
  bad += b->field[0].shape[0] != b->size || b->field[0].shape[1] != 3 || b->field[0].ndim != 2;
  for (int64_t r = 0; r < b->size; r++) {
    int64_t i = b->indices[r];
    bad += a[3 * r] != i || a[3 * r + 1] != 7 * i + 1 || a[3 * r + 2] != -i;
    for (int k = 0; k < 5; k++) bad += u[5 * r + k] != (uint8_t)((i + k) & 255);
  }
  return bad;
}

/* Runs one epoch; writes the delivered indices into got (num_samples) and checks contents,
 * order of steps and sizes. Returns the number of batches. */
static int64_t run_epoch(nt_ctx *ctx, nt_loader *l, uint64_t epoch, int64_t *got) {
  CHECK_OK(ctx, nt_loader_set_epoch(l, epoch));
  int64_t n = 0, steps = 0, bad = 0;
  for (;;) {
    nt_batch b;
    bool end;
    if (!CHECK_OK(ctx, nt_loader_next(l, &b, &end))) break;
    if (end) break;
    bad += b.step != steps || b.epoch != epoch || check_batch(&b);
    memcpy(got + n, b.indices, (size_t)b.size * sizeof *got);
    n += b.size;
    steps++;
  }
  CHECK(bad == 0, "epoch %llu: %lld bad batches or rows", (unsigned long long)epoch, (long long)bad);
  return steps;
}

/* Every (len, R, batch, drop_last) layout: the batches of each rank are the sampler's list, in
 * order, cut into batches; drop_last drops the short last batch. */
static void test_layouts(nt_ctx *ctx) {
  synth s = {-1, 0};
  int64_t lens[] = {1, 7, 10, 33, 103};
  int64_t bss[] = {1, 4, 10, 200};
  for (size_t a = 0; a < sizeof lens / sizeof *lens; a++)
    for (int R = 1; R <= 4; R++)
      for (size_t c = 0; c < sizeof bss / sizeof *bss; c++)
        for (int drop = 0; drop < 2; drop++)
          for (int r = 0; r < R; r++) {
            int64_t len = lens[a], bs = bss[c];
            nt_dataset ds = synth_dataset(&s, len);
            nt_loader_opts o = nt_loader_default_opts();
            o.batch_size = bs; o.drop_last = drop; o.shuffle = true; o.seed = 9;
            o.rank = r; o.world_size = R; o.num_workers = 2;
            int64_t ns = nt_sampler_num_samples(len, R, drop);
            nt_loader *l = NULL;
            nt_status st = nt_loader_create(ctx, &ds, &o, &l);
            if (ns <= 0 || (drop && bs > ns)) {
              CHECK(st == NT_ERR_INVALID_ARG, "len %lld R %d bs %lld drop: must be rejected",
                    (long long)len, R, (long long)bs);
              nt_loader_free(l);
              continue;
            }
            if (!CHECK_OK(ctx, st)) continue;
            int64_t *got = calloc((size_t)ns, sizeof *got), *want = calloc((size_t)ns, sizeof *want);
            int64_t steps = run_epoch(ctx, l, 2, got);
            int64_t want_steps = drop ? ns / bs : (ns + bs - 1) / bs;
            CHECK(steps == want_steps && nt_loader_num_batches(l) == want_steps,
                  "len %lld R %d bs %lld drop %d: %lld batches, want %lld", (long long)len, R,
                  (long long)bs, drop, (long long)steps, (long long)want_steps);
            nt_sampler sm;
            CHECK_OK(ctx, nt_sampler_init(ctx, &sm, len, r, R, true, 9, drop));
            nt_sampler_set_epoch(&sm, 2);
            CHECK_OK(ctx, nt_sampler_indices(ctx, &sm, want, NULL));
            int64_t delivered = drop ? want_steps * bs : ns;
            CHECK(memcmp(got, want, (size_t)delivered * sizeof *got) == 0,
                  "len %lld R %d bs %lld drop %d rank %d: order differs from the sampler",
                  (long long)len, R, (long long)bs, drop, r);
            free(got); free(want);
            nt_loader_free(l);
          }
}

/* One epoch of indices and full batch contents for a worker count. */
static void collect(nt_ctx *ctx, const nt_dataset *ds, int workers, int prefetch, uint64_t epoch,
                    unsigned char *bytes, size_t *nbytes) {
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 16; o.shuffle = true; o.seed = 77; o.num_workers = workers;
  o.prefetch_factor = prefetch;
  nt_loader *l = NULL;
  *nbytes = 0;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, ds, &o, &l))) return;
  for (uint64_t e = 0; e <= epoch; e++) {
    CHECK_OK(ctx, nt_loader_set_epoch(l, e));
    for (;;) {
      nt_batch b;
      bool end;
      if (!CHECK_OK(ctx, nt_loader_next(l, &b, &end)) || end) break;
      if (e != epoch) continue;
      for (int f = 0; f < b.n_fields; f++) {
        size_t n = nt_tensor_nbytes(&b.field[f]);
        memcpy(bytes + *nbytes, b.field[f].data, n);
        *nbytes += n;
      }
    }
  }
  nt_loader_free(l);
}

static void test_worker_counts(nt_ctx *ctx) {
  synth s = {-1, 200};
  nt_dataset ds = synth_dataset(&s, 250);
  size_t cap = 250 * (12 + 5) + 64, n0, n1, n4, n16, ne;
  unsigned char *b0 = malloc(cap), *b1 = malloc(cap), *b4 = malloc(cap), *b16 = malloc(cap),
                *be = malloc(cap);
  collect(ctx, &ds, 0, 2, 1, b0, &n0);
  collect(ctx, &ds, 1, 2, 1, b1, &n1);
  collect(ctx, &ds, 4, 2, 1, b4, &n4);
  collect(ctx, &ds, 16, 1, 1, b16, &n16);
  collect(ctx, &ds, 4, 2, 0, be, &ne);
  CHECK(n0 == 250 * 17 && n1 == n0 && n4 == n0 && n16 == n0, "sizes %zu %zu %zu %zu", n0, n1, n4,
        n16);
  CHECK(memcmp(b0, b1, n0) == 0, "1 worker delivers what the synchronous loader does");
  CHECK(memcmp(b0, b4, n0) == 0, "4 workers deliver what the synchronous loader does");
  CHECK(memcmp(b0, b16, n0) == 0, "16 workers (prefetch 1) deliver in order");
  CHECK(ne == n0 && memcmp(b0, be, n0) != 0, "epoch 0 and epoch 1 differ");

  /* Transforms drawn per sample: the same batches whatever the worker count. */
  nt_image_set set = {0};
  set.n = 40; set.h = 9; set.w = 11; set.num_classes = 3;
  set.images.data = malloc(40 * 99);
  set.labels = malloc(40 * sizeof *set.labels);
  for (int i = 0; i < 40 * 99; i++) set.images.data[i] = (uint8_t)(i * 31 + 7);
  for (int i = 0; i < 40; i++) set.labels[i] = i % 3;
  nt_image_source src = {&set, false, {2, true, 0.5f, 0.25f}};
  nt_dataset ids = nt_image_dataset(&src);
  size_t m0, m4;
  unsigned char *c0 = malloc(40 * (99 * 4 + 4)), *c4 = malloc(40 * (99 * 4 + 4));
  collect(ctx, &ids, 0, 2, 3, c0, &m0);
  collect(ctx, &ids, 4, 2, 3, c4, &m4);
  CHECK(m0 == m4 && memcmp(c0, c4, m0) == 0, "augmented batches do not depend on the workers");
  free(c0); free(c4);
  free(set.images.data); free(set.labels);
  free(b0); free(b1); free(b4); free(b16); free(be);
}

static void test_worker_error(nt_ctx *ctx) {
  for (int w = 0; w <= 4; w += 4) {
    synth s = {57, 50};
    nt_dataset ds = synth_dataset(&s, 200);
    nt_loader_opts o = nt_loader_default_opts();
    o.batch_size = 10; o.num_workers = w;
    nt_loader *l = NULL;
    if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) continue;
    int delivered = 0;
    nt_status st = NT_OK;
    for (int k = 0; k < 30; k++) {
      nt_batch b;
      bool end;
      st = nt_loader_next(l, &b, &end);
      if (st || end) break;
      delivered++;
    }
    CHECK(st == NT_ERR_FORMAT, "workers %d: the sample's error reaches the consumer (%d)", w, st);
    CHECK(delivered == 5, "workers %d: batches before the failing one arrive (%d)", w, delivered);
    CHECK(strstr(nt_last_error(ctx), "bad sample 57") && strstr(nt_last_error(ctx), "batch 5"),
          "message: %s", nt_last_error(ctx));
    /* The loader is usable again: the next iteration fails at the same place, no hang. */
    nt_batch b;
    bool end;
    for (int k = 0; k < 5; k++) CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_loader_next(l, &b, &end));
    nt_loader_free(l);
  }
}

static void test_shutdown(nt_ctx *ctx) {
  synth s = {-1, 300};
  nt_dataset ds = synth_dataset(&s, 1000);
  for (int w = 0; w <= 8; w += 4) {
    nt_loader_opts o = nt_loader_default_opts();
    o.batch_size = 7; o.num_workers = w; o.shuffle = true; o.prefetch_factor = 3;
    nt_loader *l = NULL;
    if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) continue;
    nt_batch b;
    bool end;
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    /* Abandon the epoch midway, then a full epoch must still be exact. */
    int64_t *got = calloc(1000, sizeof *got);
    int64_t steps = run_epoch(ctx, l, 4, got);
    CHECK(steps == 143, "143 batches after an abandoned epoch (%lld)", (long long)steps);
    char *seen = calloc(1000, 1);
    int dup = 0;
    for (int i = 0; i < 1000; i++) dup += seen[got[i]]++ != 0;
    CHECK(dup == 0, "every sample once (%d repeats)", dup);
    free(seen); free(got);
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    nt_loader_free(l);  /* mid-epoch, workers busy */
  }
  /* Freed right after create, before any batch; and free(NULL). */
  nt_loader_opts o = nt_loader_default_opts();
  o.num_workers = 3;
  nt_loader *l = NULL;
  CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l));
  nt_loader_free(l);
  nt_loader_free(NULL);
}

static void test_bad_options(nt_ctx *ctx) {
  synth s = {-1, 0};
  nt_dataset ds = synth_dataset(&s, 10);
  nt_loader *l = NULL;
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 0;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &ds, &o, &l));
  CHECK(l == NULL, "no loader on error");
  o = nt_loader_default_opts();
  o.batch_size = 11; o.drop_last = true;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &ds, &o, &l));
  CHECK(strstr(nt_last_error(ctx), "yields no batches") != NULL, "%s", nt_last_error(ctx));
  o = nt_loader_default_opts();
  o.num_workers = 2; o.prefetch_factor = 0;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &ds, &o, &l));
  o = nt_loader_default_opts();
  o.rank = 2; o.world_size = 2;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &ds, &o, &l));
  o = nt_loader_default_opts();
  o.num_workers = -1;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &ds, &o, &l));
  nt_dataset empty = synth_dataset(&s, 0);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_loader_create(ctx, &empty, NULL, &l));
  CHECK(strstr(nt_last_error(ctx), "empty dataset") != NULL, "%s", nt_last_error(ctx));

  /* A batch larger than the dataset without drop_last: one short batch, as torch. */
  o = nt_loader_default_opts();
  o.batch_size = 64; o.num_workers = 2;
  if (CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) {
    nt_batch b;
    bool end;
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    CHECK(!end && b.size == 10 && check_batch(&b) == 0, "one batch of 10 (%lld)", (long long)b.size);
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    CHECK(end && b.size == 0, "then the end");
    nt_loader_stats stats;
    nt_loader_get_stats(l, &stats);
    CHECK(stats.steps == 1 && stats.next_ns_total >= stats.wait_ns_total, "stats %lld",
          (long long)stats.steps);
    nt_loader_free(l);
  }
}

static void test_token_dataset(nt_ctx *ctx) {
  int32_t tok[50];
  for (int i = 0; i < 50; i++) tok[i] = 1000 + i;
  nt_token_source src = {tok, NULL, 50, 8};
  nt_dataset ds = nt_token_dataset(&src);
  CHECK(ds.len == 6, "(50 - 1) / 8 windows (%lld)", (long long)ds.len);
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 4; o.num_workers = 2;
  nt_loader *l = NULL;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, &ds, &o, &l))) return;
  nt_batch b;
  bool end;
  int bad = 0;
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ctx, nt_loader_next(l, &b, &end));
    const int32_t *x = b.field[0].data, *y = b.field[1].data;
    for (int64_t r = 0; r < b.size; r++)
      for (int t = 0; t < 8; t++)
        bad += x[r * 8 + t] != 1000 + b.indices[r] * 8 + t || y[r * 8 + t] != x[r * 8 + t] + 1;
  }
  CHECK(bad == 0 && b.size == 2, "windows and targets (%d bad)", bad);
  nt_loader_free(l);
  nt_token_source tiny = {tok, NULL, 8, 8};
  CHECK(nt_token_dataset(&tiny).len == 0, "fewer than block + 1 tokens: empty");
}

/* The transform against a plain fp64 computation: each output must be the normalized input
 * shifted by some (dy, dx) in [-pad, pad]^2 (zero pixels outside) and maybe mirrored; over many
 * samples all 2 (2 pad + 1)^2 choices occur about equally often. */
static void test_transform(void) {
  enum { H = 7, W = 9, PAD = 2 };
  uint8_t src[H * W];
  for (int i = 0; i < H * W; i++) src[i] = (uint8_t)(i * 53 + 11);
  nt_image_transform t = {PAD, true, 0.3f, 0.7f};
  int hist[2][2 * PAD + 1][2 * PAD + 1];
  memset(hist, 0, sizeof hist);
  int unmatched = 0, draws = 5000;
  for (int n = 0; n < draws; n++) {
    uint64_t rng = nt_sample_seed(3, 1, n);
    float out[H * W];
    nt_image_transform_apply(&t, src, H, W, &rng, out);
    int found = 0;
    for (int flip = 0; flip < 2 && !found; flip++)
      for (int dy = -PAD; dy <= PAD && !found; dy++)
        for (int dx = -PAD; dx <= PAD && !found; dx++) {
          double err = 0;
          for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
              int sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
              double v = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? src[sy * W + sx] : 0.0;
              double want = (v / 255.0 - 0.3) / 0.7;
              double d = out[y * W + x] - want;
              err += d * d;
            }
          if (err < 1e-9) {
            found = 1;
            hist[flip][dy + PAD][dx + PAD]++;
          }
        }
    unmatched += !found;
  }
  CHECK(unmatched == 0, "%d outputs are no crop/flip of the input", unmatched);
  int lo = draws, hi = 0;
  for (int f = 0; f < 2; f++)
    for (int a = 0; a <= 2 * PAD; a++)
      for (int b = 0; b <= 2 * PAD; b++) {
        lo = hist[f][a][b] < lo ? hist[f][a][b] : lo;
        hi = hist[f][a][b] > hi ? hist[f][a][b] : hi;
      }
  CHECK(lo > 60 && hi < 145, "crop/flip choices about uniform (100 expected: %d..%d)", lo, hi);
  /* No augmentation: exactly x / 255 normalized. */
  nt_image_transform none = nt_image_transform_none();
  float out[H * W];
  uint64_t rng = 1;
  nt_image_transform_apply(&none, src, H, W, &rng, out);
  double err = 0;
  for (int i = 0; i < H * W; i++) err += fabs(out[i] - src[i] / 255.0);
  CHECK(err < 1e-5, "identity transform (err %g)", err);
  CHECK(nt_sample_seed(1, 0, 1) != nt_sample_seed(1, 1, 0), "epoch and index do not alias");
}

int main(void) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_layouts(ctx);
  test_worker_counts(ctx);
  test_worker_error(ctx);
  test_shutdown(ctx);
  test_bad_options(ctx);
  test_token_dataset(ctx);
  test_transform();
  nt_ctx_free(ctx);
  return nt_test_finish();
}
