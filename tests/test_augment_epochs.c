/* CNN augmentation (random crop + flip through the loader) differs across epochs: the same
 * image, unshuffled, comes out differently in epochs 0, 1 and 2 for most samples, while without
 * augmentation every epoch delivers the same bytes; and an epoch replayed gives the same bytes
 * again (what a resume relies on). */
#include "tests/testutil.h"
#include "data/datasets.h"
#include "data/loader.h"
#include <stdlib.h>
#include <string.h>

enum { N = 48, H = 12, W = 10, ROW = H * W };

/* Every image of one epoch, in dataset order, into out[N * ROW]. */
static bool epoch_images(nt_ctx *ctx, const nt_dataset *ds, uint64_t epoch, int workers,
                         float *out) {
  nt_loader_opts o = nt_loader_default_opts();
  o.batch_size = 16;
  o.seed = 5;
  o.num_workers = workers;
  nt_loader *l = NULL;
  if (!CHECK_OK(ctx, nt_loader_create(ctx, ds, &o, &l))) return false;
  bool ok = CHECK_OK(ctx, nt_loader_set_epoch(l, epoch));
  int64_t got = 0;
  while (ok) {
    nt_batch b;
    bool end;
    if (!CHECK_OK(ctx, nt_loader_next(l, &b, &end))) ok = false;
    if (!ok || end) break;
    for (int64_t r = 0; r < b.size; r++)
      memcpy(out + b.indices[r] * ROW, (const float *)b.field[0].data + r * ROW,
             ROW * sizeof(float));
    got += b.size;
  }
  nt_loader_free(l);
  CHECK(got == N, "epoch %llu delivered %lld of %d", (unsigned long long)epoch, (long long)got,
        N);
  return ok && got == N;
}

static int differing(const float *a, const float *b) {
  int n = 0;
  for (int i = 0; i < N; i++) n += memcmp(a + i * ROW, b + i * ROW, ROW * sizeof(float)) != 0;
  return n;
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_image_set set = {0};
  set.n = N;
  set.h = H;
  set.w = W;
  set.num_classes = 2;
  set.images.data = malloc(N * ROW);
  set.labels = malloc(N * sizeof *set.labels);
  /* asymmetric, non-constant images so every crop offset and flip changes the bytes */
  for (int i = 0; i < N * ROW; i++)
    set.images.data[i] = (uint8_t)((i * 37 + (i / W) * 11) % 251 + 1);
  for (int i = 0; i < N; i++) set.labels[i] = i % 2;
  float *e[4];
  for (int k = 0; k < 4; k++) e[k] = malloc(N * ROW * sizeof(float));
  nt_image_source aug = {&set, false, {2, true, 0.5f, 0.25f}};
  nt_dataset ds = nt_image_dataset(&aug);
  if (epoch_images(ctx, &ds, 0, 0, e[0]) && epoch_images(ctx, &ds, 1, 2, e[1]) &&
      epoch_images(ctx, &ds, 2, 0, e[2]) && epoch_images(ctx, &ds, 1, 0, e[3])) {
    int d01 = differing(e[0], e[1]), d12 = differing(e[1], e[2]);
    printf("augmented: %d of %d images differ between epochs 0 and 1, %d between 1 and 2\n",
           d01, N, d12);
    /* a crop offset pair (25 choices) and a flip (2): the same draw has odds 1/50 per image */
    CHECK(d01 >= N * 3 / 4 && d12 >= N * 3 / 4, "epochs differ (%d, %d of %d)", d01, d12, N);
    CHECK(differing(e[1], e[3]) == 0, "epoch 1 replayed (other worker count) is identical");
  }
  nt_image_source plain = {&set, false, {0, false, 0.5f, 0.25f}};
  ds = nt_image_dataset(&plain);
  if (epoch_images(ctx, &ds, 0, 0, e[0]) && epoch_images(ctx, &ds, 1, 0, e[1]))
    CHECK(differing(e[0], e[1]) == 0, "without augmentation every epoch is the same");
  for (int k = 0; k < 4; k++) free(e[k]);
  free(set.images.data);
  free(set.labels);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
