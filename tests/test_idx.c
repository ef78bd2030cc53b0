/* IDX reader: gzip and plain files written to a temp dir, the error cases (missing file, wrong
 * magic, truncated header / data, label out of range, count mismatch, zero items), and with
 * `--fashion` the real Fashion-MNIST files (skipped when absent). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "data/idx.h"
#include "testutil.h"

static char dir[] = "/tmp/nt_test_idx_XXXXXX";

static const char *tmp(const char *name) {
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* An IDX image of unsigned bytes: magic 0x0000080<ndim>, big-endian dims, then data (only
 * `keep` bytes of the whole file are written, to make truncated files). */
static void write_idx(const char *path, bool gz, uint32_t magic, int ndim, const uint32_t *dims,
                      const uint8_t *data, long keep) {
  unsigned char buf[4096];
  size_t n = 0;
  for (int s = 24; s >= 0; s -= 8) buf[n++] = (unsigned char)(magic >> s);
  for (int d = 0; d < ndim; d++)
    for (int s = 24; s >= 0; s -= 8) buf[n++] = (unsigned char)(dims[d] >> s);
  size_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= dims[d];
  memcpy(buf + n, data, numel);
  n += numel;
  if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
  if (gz) {
    gzFile f = gzopen(path, "wb");
    gzwrite(f, buf, (unsigned)n);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
  }
}

static void test_roundtrip(nt_ctx *ctx) {
  uint8_t img[5 * 3 * 7], lab[5] = {2, 0, 1, 2, 2};
  for (int i = 0; i < 5 * 3 * 7; i++) img[i] = (uint8_t)(i * 37 + 1);
  uint32_t idims[3] = {5, 3, 7}, ldims[1] = {5};
  for (int gz = 0; gz < 2; gz++) {
    const char *ip = tmp(gz ? "img.gz" : "img"), *lp = tmp(gz ? "lab.gz" : "lab");
    write_idx(ip, gz, 0x803, 3, idims, img, -1);
    write_idx(lp, gz, 0x801, 1, ldims, lab, -1);
    nt_image_set s;
    if (!CHECK_OK(ctx, nt_image_set_load(ctx, ip, lp, 3, &s))) continue;
    CHECK(s.n == 5 && s.h == 3 && s.w == 7 && s.images.ndim == 3, "gz %d: dims", gz);
    CHECK(memcmp(s.images.data, img, sizeof img) == 0, "gz %d: pixels", gz);
    nt_tensor ti = nt_image_set_images(&s), tl = nt_image_set_labels(&s);
    CHECK(ti.dtype == NT_U8 && ti.ndim == 3 && ti.shape[0] == 5 && ti.shape[2] == 7 &&
              tl.dtype == NT_I32 && tl.shape[0] == 5 && tl.data == s.labels,
          "tensor views U8 [5, 3, 7] and I32 [5]");
    int bad = 0;
    for (int i = 0; i < 5; i++) bad += s.labels[i] != lab[i];
    CHECK(bad == 0, "gz %d: labels", gz);
    nt_image_set_free(&s);
    nt_image_set_free(&s);  /* zeroed: a no-op */
    nt_idx a;
    if (CHECK_OK(ctx, nt_idx_read(ctx, ip, 0, &a)))
      CHECK(a.numel == 105 && a.dims[2] == 7, "generic read");
    nt_idx_free(&a);
  }
}

static void expect(nt_ctx *ctx, nt_status want, nt_status got, const char *path,
                   const char *words) {
  CHECK(got == want, "%s: status %d, want %d", path, got, want);
  fprintf(stderr, "  expected error: %s\n", nt_last_error(ctx));
  CHECK(strstr(nt_last_error(ctx), path) && strstr(nt_last_error(ctx), words),
        "message names the file and says '%s': %s", words, nt_last_error(ctx));
}

static void test_errors(nt_ctx *ctx) {
  uint8_t img[4 * 2 * 2] = {0}, lab[4] = {0, 1, 9, 1};
  uint32_t idims[3] = {4, 2, 2}, ldims[1] = {4}, zero[3] = {0, 2, 2};
  nt_idx a;
  nt_image_set s;
  const char *p = tmp("missing.gz");
  expect(ctx, NT_ERR_IO, nt_idx_read(ctx, p, 3, &a), p, "cannot open");
  for (int gz = 0; gz < 2; gz++) {
    p = tmp(gz ? "magic.gz" : "magic");
    write_idx(p, gz, 0x08030000u, 3, idims, img, -1);  /* little-endian writer's mistake */
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "wrong magic");
    write_idx(p, gz, 0x801, 1, ldims, lab, -1);        /* labels where images are expected */
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "wrong magic");
    p = tmp(gz ? "short_head.gz" : "short_head");
    write_idx(p, gz, 0x803, 3, idims, img, 9);
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "truncated");
    p = tmp(gz ? "short_data.gz" : "short_data");
    write_idx(p, gz, 0x803, 3, idims, img, 16 + 10);
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "truncated");
    p = tmp(gz ? "empty.gz" : "empty");
    write_idx(p, gz, 0x803, 3, zero, img, -1);
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "empty dataset");
    p = tmp(gz ? "nothing.gz" : "nothing");
    write_idx(p, gz, 0x803, 3, idims, img, 0);
    expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, p, 3, &a), p, "truncated");
  }
  /* A gzip stream cut in the middle (not a clean short file). */
  const char *full = tmp("full.gz"), *cut = tmp("cut.gz");
  uint8_t big[4000];
  for (int i = 0; i < 4000; i++) big[i] = (uint8_t)(i * 7919 >> 3);
  uint32_t bdims[3] = {10, 20, 20};
  write_idx(full, true, 0x803, 3, bdims, big, -1);
  FILE *f = fopen(full, "rb");
  unsigned char raw[8192];
  size_t n = fread(raw, 1, sizeof raw, f);
  fclose(f);
  f = fopen(cut, "wb");
  fwrite(raw, 1, n / 2, f);
  fclose(f);
  expect(ctx, NT_ERR_FORMAT, nt_idx_read(ctx, cut, 3, &a), cut, "truncated");

  const char *ip = tmp("e_img"), *lp = tmp("e_lab");
  write_idx(ip, false, 0x803, 3, idims, img, -1);
  write_idx(lp, false, 0x801, 1, ldims, lab, -1);
  expect(ctx, NT_ERR_FORMAT, nt_image_set_load(ctx, ip, lp, 3, &s), lp, "index 2");
  CHECK(strstr(nt_last_error(ctx), "out of range") != NULL, "%s", nt_last_error(ctx));
  CHECK(s.labels == NULL && s.images.data == NULL, "nothing left allocated on failure");
  uint32_t three[1] = {3};
  write_idx(lp, false, 0x801, 1, three, lab, -1);
  expect(ctx, NT_ERR_FORMAT, nt_image_set_load(ctx, ip, lp, 10, &s), lp, "3 labels");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_image_set_load(ctx, ip, lp, 0, &s));
}

static void cleanup(void) {
  const char *names[] = {"img", "img.gz", "lab", "lab.gz", "magic", "magic.gz", "short_head",
                         "short_head.gz", "short_data", "short_data.gz", "empty", "empty.gz",
                         "nothing", "nothing.gz", "full.gz", "cut.gz", "e_img", "e_lab"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(tmp(names[i]));
  rmdir(dir);
}

static int fashion(nt_ctx *ctx) {
  const char *d = nt_test_fashion_dir();
  char probe[4096];
  snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", d);
  if (access(probe, R_OK) != 0) {
    fprintf(stderr, "Fashion-MNIST not found at %s (install dataset-fashion-mnist or set "
                    "NT_FASHION_DIR)\n", d);
    return nt_test_skip("no Fashion-MNIST data");
  }
  nt_image_set tr, te;
  if (CHECK_OK(ctx, nt_fashion_mnist_load(ctx, d, true, &tr))) {
    CHECK(tr.n == 60000 && tr.h == 28 && tr.w == 28, "train: %lld x %lld x %lld", (long long)tr.n,
          (long long)tr.h, (long long)tr.w);
    const int32_t first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    CHECK(memcmp(tr.labels, first, sizeof first) == 0, "first train labels (label[0] = %d)",
          tr.labels[0]);
    int64_t count[10] = {0};
    double sum = 0;
    for (int64_t i = 0; i < tr.n; i++) count[tr.labels[i]]++;
    for (int64_t i = 0; i < tr.images.numel; i++) sum += tr.images.data[i];
    int balanced = 1;
    for (int c = 0; c < 10; c++) balanced &= count[c] == 6000;
    CHECK(balanced, "6000 train images per class");
    double mean = sum / (double)tr.images.numel / 255.0;
    CHECK(mean > 0.2855 && mean < 0.2865, "pixel mean %.5f (Fashion-MNIST's is 0.2860)", mean);
    nt_image_set_free(&tr);
  }
  if (CHECK_OK(ctx, nt_fashion_mnist_load(ctx, d, false, &te))) {
    CHECK(te.n == 10000 && te.num_classes == 10, "test: %lld images", (long long)te.n);
    CHECK(te.labels[0] == 9 && te.labels[1] == 2, "first test labels %d %d", te.labels[0],
          te.labels[1]);
    nt_image_set_free(&te);
  }
  return nt_test_finish();
}

int main(int argc, char **argv) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  int rc;
  if (argc > 1 && strcmp(argv[1], "--fashion") == 0) {
    rc = fashion(ctx);
  } else {
    if (!mkdtemp(dir)) {
      perror("mkdtemp");
      nt_ctx_free(ctx);
      return 1;
    }
    test_roundtrip(ctx);
    test_errors(ctx);
    cleanup();
    rc = nt_test_finish();
  }
  nt_ctx_free(ctx);
  return rc;
}
