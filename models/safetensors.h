/* safetensors files (the format numpy/torch's `safetensors` package reads): 8-byte
 * little-endian header length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {string: string}}, then the raw
 * little-endian data, offsets relative to the end of the header. Written atomically
 * (path.tmp, fsync, rename, fsync of the directory). Tensors may live on any device. */
#ifndef NT_MODELS_SAFETENSORS_H
#define NT_MODELS_SAFETENSORS_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  const char *name;
  nt_tensor t;                    /* contiguous, any device */
} nt_named_tensor;

/* metadata: NULL, or pairs key0, value0, key1, value1, ..., NULL (strings). */
nt_status nt_safetensors_save(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                              const char *const *metadata);

typedef struct nt_safetensors nt_safetensors;

/* Reads the header and the data into host memory. NT_ERR_IO / NT_ERR_FORMAT name the file. */
nt_status nt_safetensors_open(nt_ctx *ctx, const char *path, nt_safetensors **out);
void nt_safetensors_close(nt_safetensors *f);       /* NULL is a no-op */
bool nt_safetensors_has(const nt_safetensors *f, const char *name);
/* Copies tensor `name` into dst (any device): dtype and shape must match exactly, else
 * NT_ERR_FORMAT naming both. */
nt_status nt_safetensors_read(nt_ctx *ctx, const nt_safetensors *f, const char *name,
                              nt_tensor *dst);
/* The metadata value for key, or NULL. */
const char *nt_safetensors_metadata(const nt_safetensors *f, const char *key);

/* "F32", "BF16", ... as safetensors names them; NULL for none. */
const char *nt_safetensors_dtype_name(nt_dtype dt);

/* Writes bytes to path atomically (path.tmp, fsync, rename, directory fsync). */
nt_status nt_write_file_atomic(nt_ctx *ctx, const char *path, const void *data, size_t len);
/* Reads a whole file (NUL-terminated; caller frees). */
nt_status nt_read_file(nt_ctx *ctx, const char *path, char **data, size_t *len);

NT_EXTERN_C_END
#endif
