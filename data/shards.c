#include "data/shards.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The format is little-endian; decode byte by byte so a big-endian host reads it too. */
static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                   ((uint32_t)p[3] << 24));
}

nt_status nt_shard_read(nt_ctx *ctx, const char *path, nt_shard *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open the shard: %s", path, strerror(errno));
  nt_status st = NT_OK;
  unsigned char head[NT_SHARD_HEADER_BYTES];
  size_t got = fread(head, 1, sizeof head, f);
  if (got != sizeof head) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: truncated header (%zu of %d bytes)", path, got,
                  NT_SHARD_HEADER_BYTES);
    goto done;
  }
  int32_t magic = le32(head), version = le32(head + 4), count = le32(head + 8);
  if (magic != NT_SHARD_MAGIC) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: wrong magic %d (expected %d: an llm.c token shard)",
                  path, magic, NT_SHARD_MAGIC);
    goto done;
  }
  if (version != NT_SHARD_VERSION) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: unsupported shard version %d (expected %d)", path,
                  version, NT_SHARD_VERSION);
    goto done;
  }
  if (count <= 0) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: empty dataset (header declares %d tokens)", path,
                  count);
    goto done;
  }
  /* the file must hold exactly the declared tokens: checked before allocating for them */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) &&
      (uint64_t)sb.st_size != NT_SHARD_HEADER_BYTES + 2 * (uint64_t)count) {
    st = (uint64_t)sb.st_size < NT_SHARD_HEADER_BYTES + 2 * (uint64_t)count
             ? NT_ERROR(ctx, NT_ERR_FORMAT,
                        "%s: truncated file: the header declares %d tokens but only %lld are "
                        "present", path, count,
                        (long long)((sb.st_size - NT_SHARD_HEADER_BYTES) / 2))
             : NT_ERROR(ctx, NT_ERR_FORMAT, "%s: more data than the %d tokens the header declares",
                        path, count);
    goto done;
  }
  unsigned char *raw = malloc((size_t)count * 2);
  out->tokens = malloc((size_t)count * sizeof *out->tokens);
  if (!raw || !out->tokens) {
    free(raw);
    st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory for %d tokens", path, count);
    goto done;
  }
  got = fread(raw, 2, (size_t)count, f);
  if (got != (size_t)count) {
    free(raw);
    st = NT_ERROR(ctx, NT_ERR_FORMAT,
                  "%s: truncated file: the header declares %d tokens but only %zu are present",
                  path, count, got);
    goto done;
  }
  for (int32_t i = 0; i < count; i++)
    out->tokens[i] = (uint16_t)(raw[2 * i] | (raw[2 * i + 1] << 8));
  free(raw);
  if (fgetc(f) != EOF) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: more data than the %d tokens the header declares",
                  path, count);
    goto done;
  }
  out->n = count;
done:
  fclose(f);
  if (st) nt_shard_free(out);
  return st;
}

void nt_shard_free(nt_shard *s) {
  if (!s) return;
  free(s->tokens);
  memset(s, 0, sizeof *s);
}

static void put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

nt_status nt_shard_write(nt_ctx *ctx, const char *path, const uint16_t *tokens, int64_t n) {
  if (n < 0 || n > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: token count %lld outside [0, 2^31)", path,
                    (long long)n);
  unsigned char head[NT_SHARD_HEADER_BYTES] = {0};
  put_le32(head, NT_SHARD_MAGIC);
  put_le32(head + 4, NT_SHARD_VERSION);
  put_le32(head + 8, (uint32_t)n);
  FILE *f = fopen(path, "wb");
  if (!f) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot create the shard: %s", path, strerror(errno));
  nt_status st = NT_OK;
  bool ok = fwrite(head, 1, sizeof head, f) == sizeof head;
  unsigned char buf[8192];
  for (int64_t i = 0; ok && i < n;) {
    int64_t m = n - i < (int64_t)sizeof buf / 2 ? n - i : (int64_t)sizeof buf / 2;
    for (int64_t j = 0; j < m; j++) {
      buf[2 * j] = (unsigned char)(tokens[i + j] & 0xff);
      buf[2 * j + 1] = (unsigned char)(tokens[i + j] >> 8);
    }
    ok = fwrite(buf, 2, (size_t)m, f) == (size_t)m;
    i += m;
  }
  if (fclose(f) != 0) ok = false;
  if (!ok) st = NT_ERROR(ctx, NT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  return st;
}
