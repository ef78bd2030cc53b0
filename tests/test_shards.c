/* llm.c token shards: write/read round trip and every malformed-file case, in a temp dir. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data/shards.h"
#include "testutil.h"

static char dir[] = "/tmp/nt_test_shards_XXXXXX";

/* A header with the given words and `ntok` tokens of payload (k * 257 & 0xffff). */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                      long ntok, long head_bytes) {
  int32_t head[256] = {0};
  head[0] = magic; head[1] = version; head[2] = count;
  FILE *f = fopen(path, "wb");
  fwrite(head, 1, (size_t)head_bytes, f);
  for (long k = 0; k < ntok; k++) {
    uint16_t t = (uint16_t)(k * 257);
    fwrite(&t, 2, 1, f);
  }
  fclose(f);
}

static void expect(nt_ctx *ctx, nt_status want, const char *path, const char *words) {
  nt_shard s;
  nt_status got = nt_shard_read(ctx, path, &s);
  CHECK(got == want, "%s: status %d want %d", path, got, want);
  CHECK(strstr(nt_last_error(ctx), path) && strstr(nt_last_error(ctx), words),
        "message names the file and says '%s': %s", words, nt_last_error(ctx));
  CHECK(s.tokens == NULL, "nothing allocated on failure");
  fprintf(stderr, "  expected error: %s\n", nt_last_error(ctx));
}

int main(void) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  if (!mkdtemp(dir)) return 1;
  char ok[256], bad[256];
  snprintf(ok, sizeof ok, "%s/ok.bin", dir);
  snprintf(bad, sizeof bad, "%s/bad.bin", dir);

  enum { N = 1001 };
  uint16_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i * 65521u + 13);
  tok[0] = 65535;
  if (CHECK_OK(ctx, nt_shard_write(ctx, ok, tok, N))) {
    nt_shard s;
    if (CHECK_OK(ctx, nt_shard_read(ctx, ok, &s))) {
      CHECK(s.n == N && memcmp(s.tokens, tok, sizeof tok) == 0, "round trip of %d tokens", N);
      nt_shard_free(&s);
    }
    FILE *f = fopen(ok, "rb");
    fseek(f, 0, SEEK_END);
    CHECK(ftell(f) == 1024 + 2 * N, "file size: 1024-byte header + 2 bytes per token");
    unsigned char h[12];
    fseek(f, 0, SEEK_SET);
    CHECK(fread(h, 1, 12, f) == 12, "read header");
    fclose(f);
    CHECK(h[0] == (20240520 & 0xff) && h[4] == 1 && h[8] == (N & 0xff) && h[9] == (N >> 8),
          "little-endian magic, version, count");
  }
  snprintf(bad, sizeof bad, "%s/missing.bin", dir);
  expect(ctx, NT_ERR_IO, bad, "cannot open");
  snprintf(bad, sizeof bad, "%s/bad.bin", dir);
  write_raw(bad, 20240520, 1, 10, 0, 500);
  expect(ctx, NT_ERR_FORMAT, bad, "truncated header");
  write_raw(bad, 20240521, 1, 10, 10, 1024);
  expect(ctx, NT_ERR_FORMAT, bad, "wrong magic");
  write_raw(bad, 20240520, 2, 10, 10, 1024);
  expect(ctx, NT_ERR_FORMAT, bad, "version 2");
  write_raw(bad, 20240520, 1, 10, 9, 1024);
  expect(ctx, NT_ERR_FORMAT, bad, "only 9");
  write_raw(bad, 20240520, 1, 10, 11, 1024);
  expect(ctx, NT_ERR_FORMAT, bad, "more data");
  write_raw(bad, 20240520, 1, 0, 0, 1024);
  expect(ctx, NT_ERR_FORMAT, bad, "empty dataset");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_shard_write(ctx, bad, tok, -1));
  snprintf(bad, sizeof bad, "%s/no/such/dir.bin", dir);
  CHECK_ERR(ctx, NT_ERR_IO, nt_shard_write(ctx, bad, tok, 3));

  unlink(ok);
  snprintf(bad, sizeof bad, "%s/bad.bin", dir);
  unlink(bad);
  rmdir(dir);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
