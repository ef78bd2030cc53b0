/* MaxPool2d (kernel k, stride k, no padding): checks, dispatch and the CPU reference. The
 * first maximum of a window wins; a NaN is the maximum (as torch propagates it). Windows do
 * not overlap, so backward scatters each dy to one input element without races. */
#include "ops/conv2d.h"
#include "ops/conv2d_nhwc.h"

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

/* ---- NHWC (ops/conv2d_nhwc.h) ---- */

#ifdef NT_HAVE_CUDA
nt_status nt_maxpool2d_nhwc_forward_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                         nt_tensor *argmax, int k, bool y_nchw);
nt_status nt_maxpool2d_nhwc_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                          const nt_tensor *argmax, const nt_tensor *mask,
                                          nt_tensor *dx, int k, bool y_nchw);
#endif

/* The index of y[n, oh, ow, c] in y's layout. */
static int64_t y_at(bool nchw, int64_t n, int64_t oh, int64_t ow, int64_t c, int64_t OH,
                    int64_t OW, int64_t C) {
  return nchw ? ((n * C + c) * OH + oh) * OW + ow : ((n * OH + oh) * OW + ow) * C + c;
}

/* y and argmax against x (or dx) [N, H, W, C]: [N, H/k, W/k, C] or, y_nchw, [N, C, H/k, W/k]. */
static nt_status check_pool_nhwc(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *y,
                                 const nt_tensor *argmax, int k, bool y_nchw, const char *what) {
  nt_status st;
  if ((st = check_float(ctx, x, what))) return st;
  if ((st = check_t(ctx, x, x->dtype, "maxpool2d_nhwc x [N, H, W, C]"))) return st;
  if ((st = check_t(ctx, y, x->dtype, "maxpool2d_nhwc y"))) return st;
  if ((st = check_t(ctx, argmax, NT_I32, "maxpool2d_nhwc argmax (i32, shape of y)"))) return st;
  if (k < 1) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: kernel size %d must be >= 1", what, k);
  if (x->shape[1] < k || x->shape[2] < k)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: input %lldx%lld is smaller than the %dx%d window",
                    what, (long long)x->shape[1], (long long)x->shape[2], k, k);
  if (x->shape[1] * x->shape[2] > 0x7fffffffLL)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "%s: input plane too large for i32 argmax", what);
  const int64_t OH = x->shape[1] / k, OW = x->shape[2] / k, C = x->shape[3];
  const int64_t nhwc[4] = {x->shape[0], OH, OW, C}, nchw[4] = {x->shape[0], C, OH, OW};
  const int64_t *want = y_nchw ? nchw : nhwc;
  for (int i = 0; i < 4; i++)
    if ((st = nt_check_dim(ctx, y, i, want[i], y_nchw ? "maxpool2d_nhwc y [N, C, H/k, W/k]"
                                                      : "maxpool2d_nhwc y [N, H/k, W/k, C]")))
      return st;
  return nt_check_same_shape(ctx, argmax, y, "maxpool2d_nhwc argmax vs y");
}

nt_status nt_maxpool2d_nhwc_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                    nt_tensor *argmax, int k, bool y_nchw) {
  nt_status st = check_pool_nhwc(ctx, x, y, argmax, k, y_nchw, "maxpool2d_nhwc_forward");
  if (st) return st;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_maxpool2d_nhwc_forward_cuda(ctx, x, y, argmax, k, y_nchw);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "maxpool2d: CUDA tensor without the CUDA backend");
#endif
  }
  const int64_t N = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
  const int64_t OH = H / k, OW = W / k;
  int32_t *am = argmax->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++)
        for (int64_t c = 0; c < C; c++) {
          int64_t best_i = -1;
          float best = 0.0f;
          for (int64_t dh = 0; dh < k; dh++)
            for (int64_t dw = 0; dw < k; dw++) {
              const int64_t ih = oh * k + dh, iw = ow * k + dw;
              const float v = nt_load_f32(x->data, x->dtype, ((n * H + ih) * W + iw) * C + c);
              if (best_i < 0 || v > best || (v != v && best == best)) {
                best = v;
                best_i = ih * W + iw;
              }
            }
          const int64_t o = y_at(y_nchw, n, oh, ow, c, OH, OW, C);
          nt_store_f32(y->data, y->dtype, o, best);
          am[o] = (int32_t)best_i;
        }
  return NT_OK;
}

nt_status nt_maxpool2d_nhwc_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                     const nt_tensor *mask, nt_tensor *dx, int k, bool y_nchw) {
  nt_status st;
  if ((st = check_pool_nhwc(ctx, dx, dy, argmax, k, y_nchw, "maxpool2d_nhwc_backward")))
    return st;
  if (mask && ((st = check_t(ctx, mask, dx->dtype, "maxpool2d_nhwc mask")) ||
               (st = nt_check_same_shape(ctx, mask, dy, "maxpool2d_nhwc mask vs dy"))))
    return st;
  if (dx->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_maxpool2d_nhwc_backward_cuda(ctx, dy, argmax, mask, dx, k, y_nchw);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "maxpool2d: CUDA tensor without the CUDA backend");
#endif
  }
  const int64_t N = dx->shape[0], H = dx->shape[1], W = dx->shape[2], C = dx->shape[3];
  const int64_t OH = H / k, OW = W / k;
  const int32_t *am = argmax->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t ih = 0; ih < H; ih++)
      for (int64_t iw = 0; iw < W; iw++)
        for (int64_t c = 0; c < C; c++) {
          float v = 0.0f;
          const int64_t oh = ih / k, ow = iw / k;
          if (oh < OH && ow < OW) {
            const int64_t o = y_at(y_nchw, n, oh, ow, c, OH, OW, C);
            if (am[o] == ih * W + iw && (!mask || nt_load_f32(mask->data, mask->dtype, o) > 0.0f))
              v = nt_load_f32(dy->data, dy->dtype, o);
          }
          nt_store_f32(dx->data, dx->dtype, ((n * H + ih) * W + iw) * C + c, v);
        }
  return NT_OK;
}
