#include "data/text.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

nt_status nt_text_load(nt_ctx *ctx, const char *path, nt_text *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f)
    return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open the text file: %s", path, strerror(errno));
  nt_status st = NT_OK;
  if (fseek(f, 0, SEEK_END) != 0) {
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
    goto done;
  }
  long size = ftell(f);
  if (size < 0) {
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: cannot tell its size: %s", path, strerror(errno));
    goto done;
  }
  if (size == 0) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: empty dataset (the file has no bytes)", path);
    goto done;
  }
  rewind(f);
  out->bytes = malloc((size_t)size);
  if (!out->bytes) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory for %ld bytes", path, size);
    goto done;
  }
  if (fread(out->bytes, 1, (size_t)size, f) != (size_t)size) {
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: short read of %ld bytes", path, size);
    goto done;
  }
  out->n = size;
done:
  fclose(f);
  if (st) nt_text_free(out);
  return st;
}

void nt_text_free(nt_text *t) {
  if (!t) return;
  free(t->bytes);
  memset(t, 0, sizeof *t);
}

void nt_vocab_build(const nt_text *t, nt_vocab *out) {
  bool seen[256] = {false};
  for (int64_t i = 0; i < t->n; i++) seen[t->bytes[i]] = true;
  memset(out, 0, sizeof *out);
  for (int c = 0; c < 256; c++) {
    out->ids[c] = -1;
    if (seen[c]) {
      out->ids[c] = (int16_t)out->size;
      out->chars[out->size++] = (uint8_t)c;
    }
  }
}

void nt_vocab_bytes(nt_vocab *out) {
  out->size = 256;
  for (int c = 0; c < 256; c++) {
    out->chars[c] = (uint8_t)c;
    out->ids[c] = (int16_t)c;
  }
}

nt_status nt_vocab_encode(nt_ctx *ctx, const nt_vocab *v, const uint8_t *bytes, int64_t n,
                          int32_t *ids) {
  for (int64_t i = 0; i < n; i++) {
    int id = v->ids[bytes[i]];
    if (id < 0)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                      "byte 0x%02x at position %lld is not in the vocabulary", bytes[i],
                      (long long)i);
    ids[i] = id;
  }
  return NT_OK;
}

nt_status nt_vocab_decode(nt_ctx *ctx, const nt_vocab *v, const int32_t *ids, int64_t n,
                          uint8_t *out) {
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= v->size)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "token id %d at position %lld is outside [0, %d)",
                      ids[i], (long long)i, v->size);
    out[i] = v->chars[ids[i]];
  }
  return NT_OK;
}

int64_t nt_text_split_point(int64_t n) {
  return n * 9 / 10;  /* floor(0.9 n), as nanoGPT int(n * 0.9) */
}

const char *nt_tinyshakespeare_path(const char *dir, char *buf, size_t len) {
  if (!dir || !*dir) return NULL;
  snprintf(buf, len, "%s/tinyshakespeare.txt", dir);
  return buf;
}
