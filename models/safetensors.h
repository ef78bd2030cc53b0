/* safetensors files (the format numpy/torch's `safetensors` package reads): 8-byte
 * little-endian header length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {string: string}}, then the raw
 * little-endian data, offsets relative to the end of the header. Written atomically
 * (path.tmp, fsync, rename, fsync of the directory; a failed sync is an error, though the file
 * is in place). Tensors may live on any device.
 *
 * Reading is strict: nt_safetensors_open checks the whole header before anything is read
 * (header length inside the file, a JSON object, every entry with a known dtype, at most
 * NT_SAFETENSORS_MAX_DIMS non-negative integer dims and offsets that match its size, no
 * duplicate names, data ranges that neither overlap nor leave holes, as the format requires)
 * and names the first problem it finds (NT_ERR_FORMAT). Loading by name converts between the
 * float dtypes, takes a row range (a padded vocabulary) and transposes 2-D tensors (Conv1D
 * weights); the file object remembers which tensors were loaded, so a caller can report the
 * ones nothing took. See docs/porting.md. */
#ifndef NT_MODELS_SAFETENSORS_H
#define NT_MODELS_SAFETENSORS_H
#include "core/nt.h"
#include "models/module.h"
NT_EXTERN_C_BEGIN

typedef struct {
  const char *name;
  nt_tensor t;                    /* contiguous, any device */
} nt_named_tensor;

/* metadata: NULL, or pairs key0, value0, key1, value1, ..., NULL (strings). */
nt_status nt_safetensors_save(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                              const char *const *metadata);
/* As nt_safetensors_save, storing every F32/F16/BF16 tensor as `float_dtype` (F32, F16 or
 * BF16; round to nearest even); other dtypes are stored as they are. */
nt_status nt_safetensors_save_as(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                                 const char *const *metadata, nt_dtype float_dtype);
/* Every parameter of p (its master values, under its name) as `float_dtype`. */
nt_status nt_safetensors_save_params(nt_ctx *ctx, const char *path, const nt_params *p,
                                     nt_dtype float_dtype, const char *const *metadata);

typedef struct nt_safetensors nt_safetensors;

/* Reads and checks the header, and reads the data into host memory. NT_ERR_IO / NT_ERR_FORMAT
 * name the file and the problem. */
nt_status nt_safetensors_open(nt_ctx *ctx, const char *path, nt_safetensors **out);
void nt_safetensors_close(nt_safetensors *f);       /* NULL is a no-op */

#define NT_SAFETENSORS_MAX_DIMS 8

/* One tensor of the file, as its header describes it. */
typedef struct {
  const char *name;               /* valid while the file is open */
  const char *dtype_name;         /* the file's dtype: "F32", "BF16", "F64", ... */
  nt_dtype dtype;                 /* NT_DTYPE_COUNT for a dtype nanotrain has no type for
                                     (F64, I8, BOOL, ...): listed, not loadable */
  int ndim;
  int64_t shape[NT_SAFETENSORS_MAX_DIMS];
  int64_t numel;
  size_t nbytes;
} nt_safetensors_info;

/* The tensors in the header's order (the __metadata__ entry is not one). */
int nt_safetensors_count(const nt_safetensors *f);
const nt_safetensors_info *nt_safetensors_info_at(const nt_safetensors *f, int i);
/* NULL when the file has no tensor of that name. */
const nt_safetensors_info *nt_safetensors_find(const nt_safetensors *f, const char *name);
bool nt_safetensors_has(const nt_safetensors *f, const char *name);
/* The metadata value for key, or NULL. */
const char *nt_safetensors_metadata(const nt_safetensors *f, const char *key);

/* How a file tensor S maps onto a destination D (all zero: D has S's shape exactly).
 *   transpose  S must be 2-D; it is read as S^T (a Conv1D weight [in, out] into an
 *              nn.Linear-style [out, in] parameter).
 *   row_begin, rows
 *              rows [row_begin, row_begin + rows) of S (after the transpose) are read, into
 *              D's rows [0, rows); rows 0 means "to the last row".
 *   pad_rows   D may have more rows than that: its extra rows are set to zero (a vocabulary
 *              padded from V to Vp >= V rows). Without it D's row count must match.
 * Every other dim of D must equal S's. */
typedef struct {
  bool transpose;
  int64_t row_begin, rows;
  bool pad_rows;
} nt_safetensors_load_opts;

/* Loads tensor `name` into dst (contiguous, any device, any dtype the file's converts to):
 * float dtypes (F32, F16, BF16, FP8) convert into any float dtype with one round to nearest
 * even, as nt_convert does; other dtypes must match exactly. opts may be NULL. Marks the
 * tensor as loaded. Errors: NT_ERR_FORMAT (no such tensor), NT_ERR_SHAPE (shapes that do not
 * fit, both named), NT_ERR_DTYPE. */
nt_status nt_safetensors_load(nt_ctx *ctx, nt_safetensors *f, const char *name, nt_tensor *dst,
                              const nt_safetensors_load_opts *opts);
/* The strict form checkpoints use: dtype and shape must match exactly (NT_ERR_FORMAT naming
 * both otherwise). */
nt_status nt_safetensors_read(nt_ctx *ctx, nt_safetensors *f, const char *name,
                              nt_tensor *dst);
/* Whether tensor i has been loaded (nt_safetensors_load / nt_safetensors_load_params), or
 * marked with nt_safetensors_mark_loaded (a buffer the caller knowingly skips). */
bool nt_safetensors_loaded(const nt_safetensors *f, int i);
void nt_safetensors_mark_loaded(nt_safetensors *f, const char *name);
/* NT_ERR_FORMAT listing the tensors that were not loaded (or marked), when there are any. */
nt_status nt_safetensors_check_all_loaded(nt_ctx *ctx, const nt_safetensors *f);

/* Loading a whole nt_params. */
typedef struct {
  /* Maps parameter `param` (its nt_params name) to the file's tensor name (written into
   * name[0..len)) and the options to load it with (zeroed before the call). Returns false for
   * a parameter the file does not hold by design (it keeps its value). NULL: the same name,
   * no options. */
  bool (*map)(void *arg, const char *param, char *name, size_t len,
              nt_safetensors_load_opts *opts);
  void *arg;
  /* File tensors that no parameter takes are an error listing them unless allowed here
   * (mark expected ones with nt_safetensors_mark_loaded first to keep the check for others). */
  bool allow_extra;
} nt_safetensors_params_opts;

/* Loads every parameter of p (allocated) into its master view, then refreshes the compute
 * copies. Before anything is written, every mapped name must be in the file (else
 * NT_ERR_FORMAT listing all the missing ones) and, unless allow_extra, every file tensor must
 * be taken or already marked (else NT_ERR_FORMAT listing the extra ones). A shape or dtype
 * error found while loading leaves the parameters loaded so far changed. opts may be NULL. */
nt_status nt_safetensors_load_params(nt_ctx *ctx, nt_safetensors *f, nt_params *p,
                                     const nt_safetensors_params_opts *opts);

/* "F32", "BF16", ... as safetensors names them; NULL for none. */
const char *nt_safetensors_dtype_name(nt_dtype dt);

/* Writes bytes to path atomically (path.tmp, fsync, rename, directory fsync; as above). */
nt_status nt_write_file_atomic(nt_ctx *ctx, const char *path, const void *data, size_t len);
/* Reads a whole file (NUL-terminated; caller frees). */
nt_status nt_read_file(nt_ctx *ctx, const char *path, char **data, size_t *len);

NT_EXTERN_C_END
#endif
