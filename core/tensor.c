#include "core/tensor.h"
#include "core/ctx.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdio.h>
#include <string.h>

nt_tensor nt_tensor_view(void *data, nt_dtype dt, nt_device dev, int ndim, const int64_t *shape) {
  nt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = ndim;
  t.device = dev;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

int64_t nt_tensor_numel(const nt_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t nt_tensor_nbytes(const nt_tensor *t) {
  return (size_t)nt_tensor_numel(t) * nt_dtype_size(t->dtype);
}

bool nt_tensor_is_contiguous(const nt_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

bool nt_tensor_same_shape(const nt_tensor *a, const nt_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

const char *nt_tensor_describe(const nt_tensor *t, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s[", nt_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && n > 0 && (size_t)n < len; i++)
    n += snprintf(buf + n, len - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  if (n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, "] %s:%d", t->device.type == NT_DEV_CUDA ? "cuda" : "cpu",
             t->device.index);
  return buf;
}

nt_status nt_tensor_reshape(nt_ctx *ctx, const nt_tensor *t, int ndim, const int64_t *shape,
                            nt_tensor *out) {
  if (!nt_tensor_is_contiguous(t))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "reshape of a non-contiguous tensor");
  if (ndim < 0 || ndim > NT_MAX_DIMS)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "reshape to %d dims (at most %d)", ndim, NT_MAX_DIMS);
  nt_tensor r = nt_tensor_view(t->data, t->dtype, t->device, ndim, shape);
  if (nt_tensor_numel(&r) != nt_tensor_numel(t))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "reshape changes the element count (%lld -> %lld)",
                    (long long)nt_tensor_numel(t), (long long)nt_tensor_numel(&r));
  r.owner = NULL;
  *out = r;
  return NT_OK;
}

nt_tensor nt_tensor_slice0(const nt_tensor *t, int64_t start, int64_t count) {
  nt_tensor r = *t;
  r.owner = NULL;
  r.data = (char *)t->data + (size_t)(start * t->stride[0]) * nt_dtype_size(t->dtype);
  r.shape[0] = count;
  return r;
}

nt_tensor nt_tensor_transpose(const nt_tensor *t, int d0, int d1) {
  nt_tensor r = *t;
  r.owner = NULL;
  r.shape[d0] = t->shape[d1];
  r.shape[d1] = t->shape[d0];
  r.stride[d0] = t->stride[d1];
  r.stride[d1] = t->stride[d0];
  return r;
}

nt_status nt_tensor_alloc(nt_ctx *ctx, nt_tensor *out, nt_dtype dt, int ndim,
                          const int64_t *shape) {
  memset(out, 0, sizeof *out);
  if (ndim < 0 || ndim > NT_MAX_DIMS)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "tensor with %d dims (at most %d)", ndim, NT_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return NT_ERROR(ctx, NT_ERR_SHAPE, "negative size %lld in dim %d", (long long)shape[i], i);
  nt_tensor t = nt_tensor_view(NULL, dt, nt_ctx_device(ctx), ndim, shape);
  size_t bytes = nt_tensor_nbytes(&t);
  nt_status st = nt_alloc(ctx, bytes ? bytes : 1, &t.data);
  if (st) return st;
  t.owner = t.data;
  *out = t;
  return NT_OK;
}

void nt_tensor_free(nt_ctx *ctx, nt_tensor *t) {
  if (!t || !t->owner) return;
  nt_free(ctx, t->owner);
  t->owner = NULL;
  t->data = NULL;
}

nt_status nt_tensor_zero(nt_ctx *ctx, nt_tensor *t) {
  nt_status st = nt_check_contiguous(ctx, t, "zero");
  if (st) return st;
  if (t->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return NT_CUDA(ctx, cudaMemsetAsync(t->data, 0, nt_tensor_nbytes(t), nt_cuda_stream(ctx)));
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "CUDA tensor without the CUDA backend");
#endif
  }
  memset(t->data, 0, nt_tensor_nbytes(t));
  return NT_OK;
}

nt_status nt_tensor_copy(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src) {
  if (dst->dtype != src->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "copy from %s to %s (use nt_convert)",
                    nt_dtype_name(src->dtype), nt_dtype_name(dst->dtype));
  if (nt_tensor_numel(dst) != nt_tensor_numel(src))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "copy of %lld elements into %lld",
                    (long long)nt_tensor_numel(src), (long long)nt_tensor_numel(dst));
  if (!nt_tensor_is_contiguous(dst) || !nt_tensor_is_contiguous(src))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "copy of non-contiguous tensors");
  size_t bytes = nt_tensor_nbytes(src);
  if (dst->device.type == NT_DEV_CPU && src->device.type == NT_DEV_CPU) {
    memmove(dst->data, src->data, bytes);
    return NT_OK;
  }
#ifdef NT_HAVE_CUDA
  if (!nt_ctx_is_cuda(ctx))
    return NT_ERROR(ctx, NT_ERR_DEVICE, "copy involving a CUDA tensor needs a CUDA context");
  cudaStream_t s = nt_cuda_stream(ctx);
  nt_status st = NT_CUDA(ctx, cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyDefault, s));
  if (st) return st;
  if (dst->device.type == NT_DEV_CPU) return NT_CUDA(ctx, cudaStreamSynchronize(s));
  return NT_OK;
#else
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "CUDA tensor without the CUDA backend");
#endif
}

static const char *describe(const nt_tensor *t, char *buf) { return nt_tensor_describe(t, buf, 96); }

nt_status nt_check_dtype(nt_ctx *ctx, const nt_tensor *t, nt_dtype dt, const char *what) {
  if (t->dtype == dt) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: expected dtype %s, got %s", what, nt_dtype_name(dt),
                  nt_dtype_name(t->dtype));
}

nt_status nt_check_ndim(nt_ctx *ctx, const nt_tensor *t, int ndim, const char *what) {
  char b[96];
  if (t->ndim == ndim) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: expected %d dims, got %s", what, ndim, describe(t, b));
}

nt_status nt_check_dim(nt_ctx *ctx, const nt_tensor *t, int dim, int64_t size, const char *what) {
  char b[96];
  if (dim < t->ndim && t->shape[dim] == size) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: expected size %lld in dim %d, got %s", what,
                  (long long)size, dim, describe(t, b));
}

nt_status nt_check_contiguous(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  char b[96];
  if (nt_tensor_is_contiguous(t)) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "%s: tensor %s must be contiguous", what,
                  describe(t, b));
}

nt_status nt_check_same_shape(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *b,
                              const char *what) {
  char ba[96], bb[96];
  if (nt_tensor_same_shape(a, b)) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: shapes differ: %s vs %s", what, describe(a, ba),
                  describe(b, bb));
}

nt_status nt_check_device(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  char b[96];
  nt_device d = nt_ctx_device(ctx);
  if (t->device.type == d.type && (d.type == NT_DEV_CPU || t->device.index == d.index))
    return NT_OK;
  return NT_ERROR(ctx, NT_ERR_DEVICE, "%s: tensor %s is not on the context's device %s:%d", what,
                  describe(t, b), d.type == NT_DEV_CUDA ? "cuda" : "cpu", d.index);
}
