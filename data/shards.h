/* Token shards in llm.c's format: a 1024-byte header of 256 little-endian int32 (word 0 the
 * magic 20240520, word 1 the version 1, word 2 the token count), then the tokens as uint16. */
#ifndef NT_DATA_SHARDS_H
#define NT_DATA_SHARDS_H
#include <stdint.h>
#include "core/ctx.h"
NT_EXTERN_C_BEGIN

#define NT_SHARD_MAGIC 20240520
#define NT_SHARD_VERSION 1
#define NT_SHARD_HEADER_BYTES 1024

typedef struct {
  uint16_t *tokens;
  int64_t n;
} nt_shard;

/* Errors: NT_ERR_IO (missing file), NT_ERR_FORMAT (a short header, wrong magic or version,
 * fewer tokens than the header declares, zero tokens), each naming the file. Extra bytes after
 * the declared tokens are also NT_ERR_FORMAT (a foreign or corrupt file). */
nt_status nt_shard_read(nt_ctx *ctx, const char *path, nt_shard *out);
void nt_shard_free(nt_shard *s);
/* Writes n tokens (n < 2^31) as a shard. */
nt_status nt_shard_write(nt_ctx *ctx, const char *path, const uint16_t *tokens, int64_t n);

NT_EXTERN_C_END
#endif
