/* MaxPool2d (k x k, stride k) on CUDA: one thread per output; backward adds each dy into the
 * input element its argmax names (windows do not overlap: no two threads hit one element). */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops/conv2d.h"
#include "core/cuda_util.h"
#include "ops/cuda_dtype.cuh"
#include <initializer_list>
#include <stdint.h>

namespace {

/* I: the index type, unsigned (32-bit division is much cheaper) when the tensor allows it. */
template <typename T, typename I>
__global__ void pool_fwd(const T *__restrict__ x, T *__restrict__ y, int *__restrict__ am,
                         long planes, int H, int W, int OH, int OW, int k) {
  const I total = (I)(planes * OH * OW);
  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += (I)gridDim.x * blockDim.x) {
    const I r = o / (I)OW, pl = r / (I)OH;
    const int ow = (int)(o - r * OW), oh = (int)(r - pl * OH);
    const T *plane = x + (long)pl * H * W;
    int best_i = oh * k * W + ow * k;
    float best = nt_to_f(plane[best_i]);
    for (int dh = 0; dh < k; dh++)
      for (int dw = 0; dw < k; dw++) {
        const int i = (oh * k + dh) * W + ow * k + dw;
        const float v = nt_to_f(plane[i]);
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_i = i;
        }
      }
    y[o] = nt_from_f<T>(best);
    am[o] = best_i;
  }
}

template <typename T, typename I>
__global__ void pool_bwd(const T *__restrict__ dy, const int *__restrict__ am, T *__restrict__ dx,
                         long planes, long HW, long OHW) {
  const I total = (I)(planes * OHW);
  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += (I)gridDim.x * blockDim.x) {
    const int i = am[o];
    if (i < 0 || i >= HW) continue;   /* a corrupt index is ignored rather than written */
    T *p = dx + (long)(o / (I)OHW) * HW + i;
    *p = nt_from_f<T>(nt_to_f(*p) + nt_to_f(dy[o]));
  }
}

template <typename T>
nt_status fwd(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, nt_tensor *am, int k) {
  const long planes = x->shape[0] * x->shape[1];
  const long n = planes * y->shape[2] * y->shape[3];
  if (n == 0) return NT_OK;
  auto kern = n < (1L << 31) ? pool_fwd<T, unsigned> : pool_fwd<T, long>;
  kern<<<nt_grid_for(n), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)x->data, (T *)y->data, (int *)am->data, planes, (int)x->shape[2],
      (int)x->shape[3], (int)y->shape[2], (int)y->shape[3], k);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status bwd(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *am, nt_tensor *dx) {
  const long planes = dx->shape[0] * dx->shape[1], OHW = dy->shape[2] * dy->shape[3];
  if (planes * OHW == 0) return NT_OK;
  auto kern = planes * OHW < (1L << 31) ? pool_bwd<T, unsigned> : pool_bwd<T, long>;
  kern<<<nt_grid_for(planes * OHW), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)dy->data, (const int *)am->data, (T *)dx->data, planes,
      dx->shape[2] * dx->shape[3], OHW);
  return NT_CUDA_LAUNCHED(ctx);
}

}  // namespace

extern "C" nt_status nt_maxpool2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                               nt_tensor *argmax, int k) {
  nt_status s = nt_cuda_set_device(ctx);
  if (s) return s;
  switch (x->dtype) {
    case NT_F32: return fwd<float>(ctx, x, y, argmax, k);
    case NT_F16: return fwd<__half>(ctx, x, y, argmax, k);
    case NT_BF16: return fwd<__nv_bfloat16>(ctx, x, y, argmax, k);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "maxpool2d: unsupported dtype");
  }
}

extern "C" nt_status nt_maxpool2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                                const nt_tensor *argmax, nt_tensor *dx) {
  nt_status s = nt_cuda_set_device(ctx);
  if (s) return s;
  switch (dx->dtype) {
    case NT_F32: return bwd<float>(ctx, dy, argmax, dx);
    case NT_F16: return bwd<__half>(ctx, dy, argmax, dx);
    case NT_BF16: return bwd<__nv_bfloat16>(ctx, dy, argmax, dx);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "maxpool2d: unsupported dtype");
  }
}

/* ---- NHWC (ops/conv2d_nhwc.h): one thread per output (forward) or per input (backward, a
 * gather: dx is written whole, no zeroing pass and no races). Channels are the fastest index
 * of x and dx, so neighbouring threads touch neighbouring addresses. ---- */
namespace {

__device__ __forceinline__ unsigned y_at(bool nchw, unsigned n, unsigned oh, unsigned ow,
                                         unsigned c, unsigned OH, unsigned OW, unsigned C) {
  return nchw ? ((n * C + c) * OH + oh) * OW + ow : ((n * OH + oh) * OW + ow) * C + c;
}

template <typename T>
__global__ void pool_nhwc_fwd(const T *__restrict__ x, T *__restrict__ y, int *__restrict__ am,
                              unsigned N, int H, int W, unsigned C, int k, bool nchw) {
  const unsigned OH = H / k, OW = W / k, total = N * OH * OW * C;
  for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += gridDim.x * blockDim.x) {
    const unsigned c = o % C, q = o / C, ow = q % OW, r = q / OW, oh = r % OH, n = r / OH;
    int best_i = -1;
    float best = 0.f;
    for (int dh = 0; dh < k; dh++)
      for (int dw = 0; dw < k; dw++) {
        const int ih = (int)oh * k + dh, iw = (int)ow * k + dw;
        const float v = nt_to_f(x[(((long)n * H + ih) * W + iw) * C + c]);
        if (best_i < 0 || v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_i = ih * W + iw;
        }
      }
    const unsigned at = y_at(nchw, n, oh, ow, c, OH, OW, C);
    y[at] = nt_from_f<T>(best);
    am[at] = best_i;
  }
}

template <typename T>
__global__ void pool_nhwc_bwd(const T *__restrict__ dy, const int *__restrict__ am,
                              const T *__restrict__ mask, T *__restrict__ dx, unsigned N, int H,
                              int W, unsigned C, int k, bool nchw) {
  const unsigned OH = H / k, OW = W / k, total = N * H * W * C;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    const unsigned c = i % C, q = i / C, iw = q % W, r = q / W, ih = r % H, n = r / H;
    const unsigned oh = ih / k, ow = iw / k;
    float v = 0.f;
    if (oh < OH && ow < OW) {
      const unsigned o = y_at(nchw, n, oh, ow, c, OH, OW, C);
      if (am[o] == (int)(ih * W + iw) && (!mask || nt_to_f(mask[o]) > 0.f)) v = nt_to_f(dy[o]);
    }
    dx[i] = nt_from_f<T>(v);
  }
}

/* The 2x2 pool with 8 channels per thread (C % 8 == 0, 16-byte aligned tensors): 16-byte loads
 * and stores along the channels, the index arithmetic once per 8 outputs. Forward: one thread
 * per (pooled pixel, 8 channels); backward: one thread per (window, 8 channels) writing the
 * window's 2x2 block of dx whole (windows cut off by an odd H or W write zeros). */
template <typename T> struct alignas(16) vec8 { T v[8]; };

__device__ __forceinline__ unsigned y_at8(bool nchw, unsigned n, unsigned oh, unsigned ow,
                                          unsigned c, unsigned OH, unsigned OW, unsigned C,
                                          int e) {
  return nchw ? y_at(true, n, oh, ow, c + e, OH, OW, C) : y_at(false, n, oh, ow, c, OH, OW, C) + e;
}

template <typename T>
__global__ void pool2_nhwc_fwd_vec(const T *__restrict__ x, T *__restrict__ y,
                                   int *__restrict__ am, unsigned N, int H, int W, unsigned C,
                                   bool nchw) {
  const unsigned OH = H / 2, OW = W / 2, C8 = C / 8, total = N * OH * OW * C8;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    const unsigned c = (i % C8) * 8, q = i / C8, ow = q % OW, r = q / OW, oh = r % OH, n = r / OH;
    float best[8];
    int bi[8];
    for (int d = 0; d < 4; d++) {   /* window order (0,0) (0,1) (1,0) (1,1): first max wins */
      const int ih = 2 * (int)oh + (d >> 1), iw = 2 * (int)ow + (d & 1);
      const vec8<T> v = *reinterpret_cast<const vec8<T> *>(x + (((long)n * H + ih) * W + iw) * C + c);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float f = nt_to_f(v.v[e]);
        if (d == 0 || f > best[e] || (isnan(f) && !isnan(best[e]))) {
          best[e] = f;
          bi[e] = ih * W + iw;
        }
      }
    }
    if (!nchw) {
      vec8<T> o;
#pragma unroll
      for (int e = 0; e < 8; e++) o.v[e] = nt_from_f<T>(best[e]);
      const unsigned at = y_at(false, n, oh, ow, c, OH, OW, C);
      *reinterpret_cast<vec8<T> *>(y + at) = o;
      *reinterpret_cast<int4 *>(am + at) = make_int4(bi[0], bi[1], bi[2], bi[3]);
      *reinterpret_cast<int4 *>(am + at + 4) = make_int4(bi[4], bi[5], bi[6], bi[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const unsigned at = y_at8(true, n, oh, ow, c, OH, OW, C, e);
        y[at] = nt_from_f<T>(best[e]);
        am[at] = bi[e];
      }
    }
  }
}

template <typename T>
__global__ void pool2_nhwc_bwd_vec(const T *__restrict__ dy, const int *__restrict__ am,
                                   const T *__restrict__ mask, T *__restrict__ dx, unsigned N,
                                   int H, int W, unsigned C, bool nchw) {
  const unsigned OH = H / 2, OW = W / 2, HH = (H + 1) / 2, WW = (W + 1) / 2, C8 = C / 8;
  const unsigned total = N * HH * WW * C8;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    const unsigned c = (i % C8) * 8, q = i / C8, ww = q % WW, r = q / WW, hh = r % HH, n = r / HH;
    float g[8];
    int a[8];
    const bool win = hh < OH && ww < OW;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      g[e] = 0.f;
      a[e] = -1;
      if (win) {
        const unsigned at = y_at8(nchw, n, hh, ww, c, OH, OW, C, e);
        a[e] = am[at];
        if (!mask || nt_to_f(mask[at]) > 0.f) g[e] = nt_to_f(dy[at]);
      }
    }
    for (int d = 0; d < 4; d++) {
      const int ih = 2 * (int)hh + (d >> 1), iw = 2 * (int)ww + (d & 1);
      if (ih >= H || iw >= W) continue;
      vec8<T> o;
#pragma unroll
      for (int e = 0; e < 8; e++) o.v[e] = nt_from_f<T>(a[e] == ih * W + iw ? g[e] : 0.f);
      *reinterpret_cast<vec8<T> *>(dx + (((long)n * H + ih) * W + iw) * C + c) = o;
    }
  }
}

bool vec_ok(int k, long C, std::initializer_list<const void *> ps) {
  if (k != 2 || C % 8) return false;
  for (const void *p : ps)
    if (((uintptr_t)p & 15u) != 0) return false;
  return true;
}

template <typename T>
nt_status nhwc_fwd(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, nt_tensor *am, int k,
                   bool nchw) {
  const long n = nt_tensor_numel(y);
  if (n == 0) return NT_OK;
  if (vec_ok(k, x->shape[3], {x->data, y->data, am->data})) {
    pool2_nhwc_fwd_vec<T><<<nt_grid_for(n / 8), 256, 0, nt_cuda_stream(ctx)>>>(
        (const T *)x->data, (T *)y->data, (int *)am->data, (unsigned)x->shape[0],
        (int)x->shape[1], (int)x->shape[2], (unsigned)x->shape[3], nchw);
    return NT_CUDA_LAUNCHED(ctx);
  }
  pool_nhwc_fwd<T><<<nt_grid_for(n), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)x->data, (T *)y->data, (int *)am->data, (unsigned)x->shape[0],
      (int)x->shape[1], (int)x->shape[2], (unsigned)x->shape[3], k, nchw);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status nhwc_bwd(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *am, const nt_tensor *mask,
                   nt_tensor *dx, int k, bool nchw) {
  const long n = nt_tensor_numel(dx);
  if (n == 0) return NT_OK;
  if (vec_ok(k, dx->shape[3], {dy->data, am->data, mask ? mask->data : nullptr, dx->data})) {
    /* one item per (2x2 window, 8 channels), the windows cut off by an odd H or W included */
    const long items = dx->shape[0] * ((dx->shape[1] + 1) / 2) * ((dx->shape[2] + 1) / 2) *
                       (dx->shape[3] / 8);
    pool2_nhwc_bwd_vec<T><<<nt_grid_for(items), 256, 0, nt_cuda_stream(ctx)>>>(
        (const T *)dy->data, (const int *)am->data, mask ? (const T *)mask->data : nullptr,
        (T *)dx->data, (unsigned)dx->shape[0], (int)dx->shape[1], (int)dx->shape[2],
        (unsigned)dx->shape[3], nchw);
    return NT_CUDA_LAUNCHED(ctx);
  }
  pool_nhwc_bwd<T><<<nt_grid_for(n), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)dy->data, (const int *)am->data, mask ? (const T *)mask->data : nullptr,
      (T *)dx->data, (unsigned)dx->shape[0], (int)dx->shape[1], (int)dx->shape[2],
      (unsigned)dx->shape[3], k, nchw);
  return NT_CUDA_LAUNCHED(ctx);
}

}  // namespace

extern "C" nt_status nt_maxpool2d_nhwc_forward_cuda(nt_ctx *ctx, const nt_tensor *x,
                                                    nt_tensor *y, nt_tensor *argmax, int k,
                                                    bool y_nchw) {
  nt_status s = nt_cuda_set_device(ctx);
  if (s) return s;
  if ((double)nt_tensor_numel(x) > 4e9)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "maxpool2d_nhwc: input past 4e9 elements");
  switch (x->dtype) {
    case NT_F32: return nhwc_fwd<float>(ctx, x, y, argmax, k, y_nchw);
    case NT_F16: return nhwc_fwd<__half>(ctx, x, y, argmax, k, y_nchw);
    case NT_BF16: return nhwc_fwd<__nv_bfloat16>(ctx, x, y, argmax, k, y_nchw);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "maxpool2d: unsupported dtype");
  }
}

extern "C" nt_status nt_maxpool2d_nhwc_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                                     const nt_tensor *argmax,
                                                     const nt_tensor *mask, nt_tensor *dx,
                                                     int k, bool y_nchw) {
  nt_status s = nt_cuda_set_device(ctx);
  if (s) return s;
  if ((double)nt_tensor_numel(dx) > 4e9)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "maxpool2d_nhwc: input past 4e9 elements");
  switch (dx->dtype) {
    case NT_F32: return nhwc_bwd<float>(ctx, dy, argmax, mask, dx, k, y_nchw);
    case NT_F16: return nhwc_bwd<__half>(ctx, dy, argmax, mask, dx, k, y_nchw);
    case NT_BF16: return nhwc_bwd<__nv_bfloat16>(ctx, dy, argmax, mask, dx, k, y_nchw);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "maxpool2d: unsupported dtype");
  }
}
