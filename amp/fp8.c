/* FP8 delayed scaling: state allocation, the host rule and dispatch to the device. */
#include "amp/fp8.h"
#include "amp/fp8_rule.h"
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_fp8_update_cuda(nt_ctx *ctx, float *base, int n, int64_t stride);
nt_status nt_fp8_record_amax_cuda(nt_ctx *ctx, float *amax, const float *x, int64_t n);
#endif

struct nt_fp8_state {
  int n;
  int32_t len;
  int64_t stride;        /* floats between records */
  float *base;           /* n records with their histories, on ctx's device */
  nt_device device;
};

nt_fp8_options nt_fp8_defaults(void) {
  nt_fp8_options o = {1024, 0};
  return o;
}

float nt_fp8_max(nt_dtype format) {
  if (format == NT_FP8_E4M3) return 448.0f;
  if (format == NT_FP8_E5M2) return 57344.0f;
  return 0.0f;
}

static nt_fp8_record *record(const nt_fp8_state *s, int i) {
  return (nt_fp8_record *)(s->base + s->stride * i);
}

static nt_status copy_bytes(nt_ctx *ctx, nt_fp8_state *s, void *host, void *dev, size_t bytes,
                            bool to_host) {
  int64_t n = (int64_t)bytes;
  nt_tensor d = nt_tensor_view(dev, NT_U8, s->device, 1, &n);
  nt_tensor h = nt_tensor_view(host, NT_U8, nt_cpu(), 1, &n);
  return to_host ? nt_tensor_copy(ctx, &h, &d) : nt_tensor_copy(ctx, &d, &h);
}

nt_status nt_fp8_state_create(nt_ctx *ctx, const nt_fp8_options *opt, const nt_dtype *formats,
                              int n, nt_fp8_state **out) {
  nt_fp8_options o = opt ? *opt : nt_fp8_defaults();
  nt_status st;
  float *host = NULL;
  *out = NULL;
  if (n < 1 || !formats) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 state of %d tensors", n);
  if (o.history_len < 1 || o.history_len > (1 << 20) || o.margin < 0 || o.margin > 64)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "fp8: history_len %d must be in [1, 2^20] and margin %d in [0, 64]",
                    (int)o.history_len, (int)o.margin);
  for (int i = 0; i < n; i++)
    if (formats[i] != NT_FP8_E4M3 && formats[i] != NT_FP8_E5M2)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "fp8 tensor %d: format %s (expected e4m3 or e5m2)", i,
                      nt_dtype_name(formats[i]));
  nt_fp8_state *s = calloc(1, sizeof *s);
  if (!s) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for fp8 state");
  s->n = n;
  s->len = o.history_len;
  s->stride = nt_fp8_stride(o.history_len);
  s->device = nt_ctx_device(ctx);
  size_t bytes = sizeof(float) * (size_t)(s->stride * n);
  if ((st = nt_alloc(ctx, bytes, (void **)&s->base))) goto fail;
  host = calloc(1, bytes);
  if (!host) { st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for fp8 state"); goto fail; }
  for (int i = 0; i < n; i++) {
    nt_fp8_record *r = (nt_fp8_record *)(host + s->stride * i);
    r->scale = 1.0f;
    r->scale_inv = 1.0f;
    r->fp8_max = nt_fp8_max(formats[i]);
    r->len = o.history_len;
    r->margin = o.margin;
  }
  if ((st = copy_bytes(ctx, s, host, s->base, bytes, false))) goto fail;
  free(host);
  *out = s;
  return NT_OK;
fail:
  free(host);
  nt_fp8_state_free(ctx, s);
  return st;
}

void nt_fp8_state_free(nt_ctx *ctx, nt_fp8_state *s) {
  if (!s) return;
  nt_free(ctx, s->base);
  free(s);
}

int nt_fp8_state_count(const nt_fp8_state *s) { return s ? s->n : 0; }

static nt_tensor scalar(const nt_fp8_state *s, float *p) {
  return nt_tensor_view(p, NT_F32, s->device, 0, NULL);
}
nt_tensor nt_fp8_scale_tensor(const nt_fp8_state *s, int i) { return scalar(s, &record(s, i)->scale); }
nt_tensor nt_fp8_scale_inv_tensor(const nt_fp8_state *s, int i) {
  return scalar(s, &record(s, i)->scale_inv);
}
nt_tensor nt_fp8_amax_tensor(const nt_fp8_state *s, int i) { return scalar(s, &record(s, i)->amax); }

static nt_status check_index(nt_ctx *ctx, const nt_fp8_state *s, int i) {
  if (!s || i < 0 || i >= s->n)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 state: no tensor %d (%d tensors)", i,
                    s ? s->n : 0);
  return NT_OK;
}

nt_status nt_fp8_record_amax(nt_ctx *ctx, nt_fp8_state *s, int i, const nt_tensor *x) {
  nt_status st = check_index(ctx, s, i);
  if (st || (st = nt_check_dtype(ctx, x, NT_F32, "fp8 amax input")) ||
      (st = nt_check_contiguous(ctx, x, "fp8 amax input")) ||
      (st = nt_check_device(ctx, x, "fp8 amax input")))
    return st;
  int64_t n = nt_tensor_numel(x);
  nt_fp8_record *r = record(s, i);
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return nt_fp8_record_amax_cuda(ctx, &r->amax, (const float *)x->data, n);
#endif
  const float *p = (const float *)x->data;
  float a = r->amax;
  for (int64_t j = 0; j < n; j++) a = nt_fp8_nanmax(a, fabsf(p[j]));
  r->amax = a;
  return NT_OK;
}

nt_status nt_fp8_update(nt_ctx *ctx, nt_fp8_state *s) {
  if (!s) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "fp8 state is NULL");
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return nt_fp8_update_cuda(ctx, s->base, s->n, s->stride);
#endif
  if (s->device.type != NT_DEV_CPU)
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "fp8 state on a CUDA device without the backend");
  for (int i = 0; i < s->n; i++) {
    nt_fp8_record *r = record(s, i);
    float *hist = (float *)(r + 1);
    hist[r->pos] = r->amax;
    float amax = 0.0f;
    for (int32_t j = 0; j < r->len; j++) amax = nt_fp8_nanmax(amax, hist[j]);
    nt_fp8_finish(r, hist, amax);
  }
  return NT_OK;
}

nt_status nt_fp8_read(nt_ctx *ctx, nt_fp8_state *s, int i, float *scale, float *scale_inv,
                      float *history) {
  nt_status st = check_index(ctx, s, i);
  if (st) return st;
  size_t bytes = sizeof(float) * (size_t)s->stride;
  float *host = malloc(bytes);
  if (!host) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory reading fp8 state");
  st = copy_bytes(ctx, s, host, record(s, i), bytes, true);
  if (!st) {
    nt_fp8_record *r = (nt_fp8_record *)host;
    const float *hist = (const float *)(r + 1);
    if (scale) *scale = r->scale;
    if (scale_inv) *scale_inv = r->scale_inv;
    if (history) {
      /* Newest first: the current amax slot, then older ones. */
      for (int32_t j = 0; j < r->len; j++) history[j] = hist[((r->pos - j) % r->len + r->len) % r->len];
      history[0] = r->amax;
    }
  }
  free(host);
  return st;
}
