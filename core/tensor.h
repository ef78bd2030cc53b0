/* nt_tensor: a non-owning view of memory. Ops never allocate their outputs; callers pass them. */
#ifndef NT_TENSOR_H
#define NT_TENSOR_H
#include <stdint.h>
#include <stdbool.h>
#include "core/dtype.h"
#include "core/status.h"
NT_EXTERN_C_BEGIN

#define NT_MAX_DIMS 4

typedef enum { NT_DEV_CPU = 0, NT_DEV_CUDA = 1 } nt_device_type;

typedef struct {
  nt_device_type type;
  int index;          /* CUDA device ordinal; 0 for the CPU */
} nt_device;

typedef struct nt_ctx nt_ctx;

typedef struct {
  void *data;                     /* first element of the view */
  nt_dtype dtype;
  int ndim;                       /* 0..NT_MAX_DIMS; 0 is a scalar */
  int64_t shape[NT_MAX_DIMS];
  int64_t stride[NT_MAX_DIMS];    /* in elements */
  nt_device device;
  void *owner;                    /* allocation to free (nt_tensor_alloc), or NULL for a view */
} nt_tensor;

static inline nt_device nt_cpu(void) { nt_device d = {NT_DEV_CPU, 0}; return d; }
static inline nt_device nt_cuda(int index) { nt_device d = {NT_DEV_CUDA, index}; return d; }

/* A contiguous (row-major) view of `data`. */
nt_tensor nt_tensor_view(void *data, nt_dtype dt, nt_device dev, int ndim, const int64_t *shape);
int64_t nt_tensor_numel(const nt_tensor *t);
size_t nt_tensor_nbytes(const nt_tensor *t);   /* numel * dtype size (contiguous extent) */
bool nt_tensor_is_contiguous(const nt_tensor *t);
bool nt_tensor_same_shape(const nt_tensor *a, const nt_tensor *b);
/* A view of `t` with new dims (t must be contiguous; numel must match). */
nt_status nt_tensor_reshape(nt_ctx *ctx, const nt_tensor *t, int ndim, const int64_t *shape,
                            nt_tensor *out);
/* Rows [start, start + count) along dim 0. */
nt_tensor nt_tensor_slice0(const nt_tensor *t, int64_t start, int64_t count);
/* Swaps two dims of the view (no copy). */
nt_tensor nt_tensor_transpose(const nt_tensor *t, int d0, int d1);
/* "f32[4, 8] cuda:0" into buf. */
const char *nt_tensor_describe(const nt_tensor *t, char *buf, size_t len);

/* Allocates a contiguous tensor from the context's memory pool (device memory for a CUDA
 * context). Contents are uninitialised. Free with nt_tensor_free. */
nt_status nt_tensor_alloc(nt_ctx *ctx, nt_tensor *out, nt_dtype dt, int ndim,
                          const int64_t *shape);
void nt_tensor_free(nt_ctx *ctx, nt_tensor *t);          /* NULL data is a no-op */
nt_status nt_tensor_zero(nt_ctx *ctx, nt_tensor *t);     /* memset 0 on ctx's stream */
/* Copies between any devices (host<->device included), contiguous tensors of one dtype and
 * numel. Ordered on ctx's compute stream; a device->host copy synchronizes that stream. */
nt_status nt_tensor_copy(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src);

/* Argument checks used by ops: each returns NT_OK or records a message naming `what`. */
nt_status nt_check_dtype(nt_ctx *ctx, const nt_tensor *t, nt_dtype dt, const char *what);
nt_status nt_check_ndim(nt_ctx *ctx, const nt_tensor *t, int ndim, const char *what);
nt_status nt_check_dim(nt_ctx *ctx, const nt_tensor *t, int dim, int64_t size, const char *what);
nt_status nt_check_contiguous(nt_ctx *ctx, const nt_tensor *t, const char *what);
nt_status nt_check_same_shape(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *b,
                              const char *what);
/* The tensor lives where ctx computes (CPU tensors for a CPU context, its GPU otherwise). */
nt_status nt_check_device(nt_ctx *ctx, const nt_tensor *t, const char *what);

NT_EXTERN_C_END
#endif
