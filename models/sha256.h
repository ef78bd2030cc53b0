/* SHA-256 (FIPS 180-4), for checkpoint manifests. Incremental: init, update any number of
 * times, final. Digests are 32 bytes; nt_sha256_hex writes 64 lowercase hex digits + NUL. */
#ifndef NT_MODELS_SHA256_H
#define NT_MODELS_SHA256_H
#include <stddef.h>
#include <stdint.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  uint32_t h[8];
  uint64_t bytes;          /* message length so far */
  uint8_t block[64];
  size_t fill;             /* bytes waiting in block */
} nt_sha256;

void nt_sha256_init(nt_sha256 *s);
void nt_sha256_update(nt_sha256 *s, const void *data, size_t len);
void nt_sha256_final(nt_sha256 *s, uint8_t digest[32]);
/* One call over a buffer; hex gets 65 bytes. */
void nt_sha256_hex(const void *data, size_t len, char hex[65]);
void nt_sha256_to_hex(const uint8_t digest[32], char hex[65]);
/* Hashes a whole file; size gets its length. NT_ERR_IO names the file. */
nt_status nt_sha256_file(nt_ctx *ctx, const char *path, char hex[65], uint64_t *size);

NT_EXTERN_C_END
#endif
