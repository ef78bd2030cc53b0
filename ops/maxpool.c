/* MaxPool2d (kernel k, stride k, no padding): checks, dispatch and the CPU reference. The
 * first maximum of a window wins; a NaN is the maximum (as torch propagates it). Windows do
 * not overlap, so backward scatters each dy to one input element without races. */
#include "ops/conv2d.h"

#ifdef NT_HAVE_CUDA
nt_status nt_maxpool2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                    nt_tensor *argmax, int k);
nt_status nt_maxpool2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                     nt_tensor *dx);
#endif

static nt_status check_t(nt_ctx *ctx, const nt_tensor *t, nt_dtype dt, const char *what) {
  nt_status st;
  if (!t) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s is NULL", what);
  if ((st = nt_check_device(ctx, t, what))) return st;
  if ((st = nt_check_ndim(ctx, t, 4, what))) return st;
  if ((st = nt_check_dtype(ctx, t, dt, what))) return st;
  return nt_check_contiguous(ctx, t, what);
}

static nt_status check_float(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  if (!t) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s is NULL", what);
  if (t->dtype == NT_F32 || t->dtype == NT_F16 || t->dtype == NT_BF16) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16)", what,
                  nt_dtype_name(t->dtype));
}

/* y and argmax [N, C, H/k, W/k] against x (or dx) [N, C, H, W]. */
static nt_status check_pool(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *y,
                            const nt_tensor *argmax, int k, const char *what) {
  nt_status st;
  if ((st = check_float(ctx, x, what))) return st;
  if ((st = check_t(ctx, x, x->dtype, "maxpool2d x [N, C, H, W]"))) return st;
  if ((st = check_t(ctx, y, x->dtype, "maxpool2d y [N, C, H/k, W/k]"))) return st;
  if ((st = check_t(ctx, argmax, NT_I32, "maxpool2d argmax (i32, shape of y)"))) return st;
  if (k < 1) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: kernel size %d must be >= 1", what, k);
  if (x->shape[2] < k || x->shape[3] < k)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: input %lldx%lld is smaller than the %dx%d window",
                    what, (long long)x->shape[2], (long long)x->shape[3], k, k);
  if (x->shape[2] * x->shape[3] > 0x7fffffffLL)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "%s: input plane too large for i32 argmax", what);
  const int64_t want[4] = {x->shape[0], x->shape[1], x->shape[2] / k, x->shape[3] / k};
  for (int i = 0; i < 4; i++)
    if ((st = nt_check_dim(ctx, y, i, want[i], "maxpool2d y [N, C, H/k, W/k]"))) return st;
  return nt_check_same_shape(ctx, argmax, y, "maxpool2d argmax vs y");
}

nt_status nt_maxpool2d_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, nt_tensor *argmax,
                               int k) {
  nt_status st = check_pool(ctx, x, y, argmax, k, "maxpool2d_forward");
  if (st) return st;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_maxpool2d_forward_cuda(ctx, x, y, argmax, k);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "maxpool2d: CUDA tensor without the CUDA backend");
#endif
  }
  const int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
  const int64_t OH = y->shape[2], OW = y->shape[3];
  int32_t *am = argmax->data;
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t best_i = (oh * k) * W + ow * k;
        float best = nt_load_f32(x->data, x->dtype, pl * H * W + best_i);
        for (int64_t dh = 0; dh < k; dh++)
          for (int64_t dw = 0; dw < k; dw++) {
            const int64_t i = (oh * k + dh) * W + ow * k + dw;
            const float v = nt_load_f32(x->data, x->dtype, pl * H * W + i);
            if (v > best || (v != v && best == best)) {
              best = v;
              best_i = i;
            }
          }
        const int64_t o = (pl * OH + oh) * OW + ow;
        nt_store_f32(y->data, y->dtype, o, best);
        am[o] = (int32_t)best_i;
      }
  return NT_OK;
}

nt_status nt_maxpool2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                nt_tensor *dx) {
  nt_status st;
  if ((st = check_float(ctx, dx, "maxpool2d_backward dx"))) return st;
  if ((st = check_t(ctx, dx, dx->dtype, "maxpool2d dx [N, C, H, W]"))) return st;
  if ((st = check_t(ctx, dy, dx->dtype, "maxpool2d dy [N, C, OH, OW]"))) return st;
  if ((st = check_t(ctx, argmax, NT_I32, "maxpool2d argmax"))) return st;
  if ((st = nt_check_same_shape(ctx, argmax, dy, "maxpool2d argmax vs dy"))) return st;
  for (int i = 0; i < 2; i++)
    if ((st = nt_check_dim(ctx, dy, i, dx->shape[i], "maxpool2d dy [N, C, OH, OW]"))) return st;
  if (dy->shape[2] > dx->shape[2] || dy->shape[3] > dx->shape[3])
    return NT_ERROR(ctx, NT_ERR_SHAPE, "maxpool2d_backward: dy plane %lldx%lld is larger than dx "
                    "plane %lldx%lld", (long long)dy->shape[2], (long long)dy->shape[3],
                    (long long)dx->shape[2], (long long)dx->shape[3]);
  if (dx->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_maxpool2d_backward_cuda(ctx, dy, argmax, dx);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "maxpool2d: CUDA tensor without the CUDA backend");
#endif
  }
  const int64_t planes = dx->shape[0] * dx->shape[1], HW = dx->shape[2] * dx->shape[3];
  const int64_t OHW = dy->shape[2] * dy->shape[3];
  const int32_t *am = argmax->data;
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t o = 0; o < OHW; o++) {
      const int32_t i = am[pl * OHW + o];
      if (i < 0 || i >= HW)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "maxpool2d_backward: argmax %d outside the "
                        "%lld-element plane", i, (long long)HW);
      const int64_t xi = pl * HW + i;
      nt_store_f32(dx->data, dx->dtype, xi,
                   nt_load_f32(dx->data, dx->dtype, xi) +
                       nt_load_f32(dy->data, dy->dtype, pl * OHW + o));
    }
  return NT_OK;
}
