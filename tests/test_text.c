/* Text reader and character vocabulary on small temp files; with `--shakespeare` tiny
 * shakespeare from $NT_DATA_DIR (skipped when absent). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data/text.h"
#include "testutil.h"

static void test_small(nt_ctx *ctx, const char *dir) {
  char path[512], empty[512], missing[512];
  snprintf(path, sizeof path, "%s/t.txt", dir);
  snprintf(empty, sizeof empty, "%s/empty.txt", dir);
  snprintf(missing, sizeof missing, "%s/missing.txt", dir);
  const char *body = "hello, world\nzebra!";
  FILE *f = fopen(path, "wb");
  fputs(body, f);
  fclose(f);
  f = fopen(empty, "wb");
  fclose(f);

  nt_text t;
  if (CHECK_OK(ctx, nt_text_load(ctx, path, &t))) {
    CHECK(t.n == (int64_t)strlen(body) && memcmp(t.bytes, body, (size_t)t.n) == 0, "bytes");
    nt_vocab v;
    nt_vocab_build(&t, &v);
    const char *want = "\n !,abdehlorwz";
    CHECK(v.size == (int)strlen(want) && memcmp(v.chars, want, (size_t)v.size) == 0,
          "sorted unique chars (%d)", v.size);
    int32_t ids[64];
    uint8_t back[64];
    CHECK_OK(ctx, nt_vocab_encode(ctx, &v, t.bytes, t.n, ids));
    CHECK(ids[0] == 8 && ids[5] == 3, "h is id 8, ',' is id 3 (%d %d)", ids[0], ids[5]);
    CHECK_OK(ctx, nt_vocab_decode(ctx, &v, ids, t.n, back));
    CHECK(memcmp(back, body, (size_t)t.n) == 0, "decode(encode(x)) == x");
    const uint8_t q = 'q';
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_vocab_encode(ctx, &v, &q, 1, ids));
    ids[0] = v.size;
    CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_vocab_decode(ctx, &v, ids, 1, back));
    nt_vocab_bytes(&v);
    CHECK_OK(ctx, nt_vocab_encode(ctx, &v, t.bytes, t.n, ids));
    CHECK(v.size == 256 && ids[0] == 'h', "byte vocabulary");
    nt_text_free(&t);
  }
  CHECK(nt_text_split_point(10) == 9 && nt_text_split_point(19) == 17 &&
            nt_text_split_point(1) == 0,
        "split floor(0.9 n)");
  CHECK_ERR(ctx, NT_ERR_IO, nt_text_load(ctx, missing, &t));
  CHECK(strstr(nt_last_error(ctx), missing) != NULL, "names the file");
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_text_load(ctx, empty, &t));
  CHECK(strstr(nt_last_error(ctx), "empty") != NULL, "says empty");
  unlink(path);
  unlink(empty);
}

static int shakespeare(nt_ctx *ctx) {
  char buf[4096];
  const char *dir = nt_test_data_dir();
  const char *path = nt_tinyshakespeare_path(dir, buf, sizeof buf);
  if (!path || access(path, R_OK) != 0) {
    fprintf(stderr, "tinyshakespeare.txt not found (NT_DATA_DIR=%s): set NT_DATA_DIR at "
                    "configure time or -DNT_DATA_DIR=<folder>\n",
            dir ? dir : "(unset)");
    return nt_test_skip("no tiny shakespeare");
  }
  nt_text t;
  if (!CHECK_OK(ctx, nt_text_load(ctx, path, &t))) return nt_test_finish();
  CHECK(t.n == 1115394, "%lld bytes", (long long)t.n);
  CHECK(memcmp(t.bytes, "First Citizen:", 14) == 0, "starts with 'First Citizen:'");
  nt_vocab v;
  nt_vocab_build(&t, &v);
  const char *want = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  CHECK(v.size == 65 && memcmp(v.chars, want, 65) == 0, "vocabulary of 65 (%d)", v.size);
  CHECK(nt_text_split_point(t.n) == 1003854, "train 1003854 / val 111540 (nanoGPT's split)");
  int32_t *ids = malloc((size_t)t.n * sizeof *ids);
  uint8_t *back = malloc((size_t)t.n);
  CHECK_OK(ctx, nt_vocab_encode(ctx, &v, t.bytes, t.n, ids));
  CHECK_OK(ctx, nt_vocab_decode(ctx, &v, ids, t.n, back));
  CHECK(memcmp(back, t.bytes, (size_t)t.n) == 0 && ids[0] == 18, "round trip, 'F' is id 18");
  free(ids);
  free(back);
  nt_text_free(&t);
  return nt_test_finish();
}

int main(int argc, char **argv) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  int rc;
  if (argc > 1 && strcmp(argv[1], "--shakespeare") == 0) {
    rc = shakespeare(ctx);
  } else {
    char dir[] = "/tmp/nt_test_text_XXXXXX";
    if (!mkdtemp(dir)) {
      nt_ctx_free(ctx);
      return 1;
    }
    test_small(ctx, dir);
    rmdir(dir);
    rc = nt_test_finish();
  }
  nt_ctx_free(ctx);
  return rc;
}
