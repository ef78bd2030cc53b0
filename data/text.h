/* Text corpora: a file as raw bytes, or as ids in a character vocabulary built from the file
 * (the sorted unique bytes; tiny shakespeare has 65). Split (as nanoGPT): train is the first
 * 90% of the tokens, validation the last 10% (split point floor(0.9 * n)). */
#ifndef NT_DATA_TEXT_H
#define NT_DATA_TEXT_H
#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"
NT_EXTERN_C_BEGIN

typedef struct {
  uint8_t *bytes;
  int64_t n;
} nt_text;

/* Reads the whole file. Errors: NT_ERR_IO (missing/unreadable), NT_ERR_FORMAT (empty). */
nt_status nt_text_load(nt_ctx *ctx, const char *path, nt_text *out);
void nt_text_free(nt_text *t);

/* A character vocabulary: chars[id] is the byte of token id; ids[byte] is its id or -1. */
typedef struct {
  int size;
  uint8_t chars[256];
  int16_t ids[256];
} nt_vocab;

/* The sorted unique bytes of `t`. */
void nt_vocab_build(const nt_text *t, nt_vocab *out);
/* Byte-level vocabulary: 256 ids, id == byte. */
void nt_vocab_bytes(nt_vocab *out);
/* ids[i] = id of bytes[i]; a byte outside the vocabulary is NT_ERR_INVALID_ARG naming it. */
nt_status nt_vocab_encode(nt_ctx *ctx, const nt_vocab *v, const uint8_t *bytes, int64_t n,
                          int32_t *ids);
/* out gets n bytes (no terminator); an id outside [0, size) is NT_ERR_INVALID_ARG. */
nt_status nt_vocab_decode(nt_ctx *ctx, const nt_vocab *v, const int32_t *ids, int64_t n,
                          uint8_t *out);

/* The train / validation split of n tokens: train [0, split), val [split, n). */
int64_t nt_text_split_point(int64_t n);

/* The path of tiny shakespeare in `dir`: dir/tinyshakespeare.txt written into buf, or NULL
 * when dir is NULL or empty. (The programs take dir from --data-dir or NT_DATA_DIR.) */
const char *nt_tinyshakespeare_path(const char *dir, char *buf, size_t len);

NT_EXTERN_C_END
#endif
