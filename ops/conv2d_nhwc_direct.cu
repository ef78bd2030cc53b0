/* Direct NHWC Conv2d kernels (ops/conv2d_nhwc_cuda.cuh): the CPU reference's loops on the GPU,
 * any stride and padding, fp32 sums in a fixed order. F32 runs here; F16 / BF16 only for the
 * gradients the tensor-core kernels of ops/conv2d_nhwc.cu leave out. Not tuned. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops/conv2d_nhwc_cuda.cuh"
#include "core/cuda_util.h"
#include "ops/cuda_dtype.cuh"

namespace {

/* x [N, H, W, C], y [N, OH, OW, R], w [R, C, KH, KW] */
struct dgeom {
  int N, H, W, C, OH, OW, R, KH, KW, stride, pad;
};

dgeom geom_of(const nt_tensor *x, const nt_tensor *y, const nt_tensor *w, nt_conv2d_params p) {
  return {(int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
          (int)y->shape[1], (int)y->shape[2], (int)y->shape[3], (int)w->shape[2],
          (int)w->shape[3], p.stride, p.pad};
}

/* An element of a tensor that is either F32 or T. */
template <typename T> __device__ __forceinline__ float ld(const void *p, bool f32, long i) {
  return f32 ? ((const float *)p)[i] : nt_to_f(((const T *)p)[i]);
}
template <typename T> __device__ __forceinline__ void add_to(void *p, bool f32, long i, float v) {
  if (f32) ((float *)p)[i] += v;
  else ((T *)p)[i] = nt_from_f<T>(nt_to_f(((T *)p)[i]) + v);
}

#define GRID_STRIDE(i, n)                                                         \
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)(n); \
       i += gridDim.x * blockDim.x)

/* One thread per y[n, oh, ow, co]. */
template <typename T>
__global__ void fwd_direct(const T *__restrict__ x, const T *__restrict__ w, const void *bias,
                           bool bias_f32, bool relu, T *__restrict__ y, dgeom g) {
  GRID_STRIDE(i, (long)g.N * g.OH * g.OW * g.R) {
    const int co = (int)(i % (unsigned)g.R), m = (int)(i / (unsigned)g.R);
    const int n = m / (g.OH * g.OW), r = m - n * g.OH * g.OW, oh = r / g.OW, ow = r - oh * g.OW;
    float acc = bias ? ld<T>(bias, bias_f32, co) : 0.f;
    for (int kh = 0; kh < g.KH; kh++) {
      const int ih = oh * g.stride - g.pad + kh;
      if (ih < 0 || ih >= g.H) continue;
      for (int kw = 0; kw < g.KW; kw++) {
        const int iw = ow * g.stride - g.pad + kw;
        if (iw < 0 || iw >= g.W) continue;
        const T *xp = x + ((long)(n * g.H + ih) * g.W + iw) * g.C;
        const T *wq = w + ((long)co * g.C * g.KH + kh) * g.KW + kw;
        for (int ci = 0; ci < g.C; ci++)
          acc += nt_to_f(xp[ci]) * nt_to_f(wq[(long)ci * g.KH * g.KW]);
      }
    }
    if (relu && !(acc > 0.f) && acc == acc) acc = 0.f;
    y[i] = nt_from_f<T>(acc);
  }
}

/* One thread per dx[n, ih, iw, ci]: the outputs whose window covers it on the stride grid. */
template <typename T>
__global__ void dgrad_direct(const T *__restrict__ dy, const T *__restrict__ mask,
                             const T *__restrict__ w, T *__restrict__ dx,
                             const T *__restrict__ dx_mask, dgeom g) {
  GRID_STRIDE(i, (long)g.N * g.H * g.W * g.C) {
    const int ci = (int)(i % (unsigned)g.C), q = (int)(i / (unsigned)g.C);
    const int n = q / (g.H * g.W), r = q - n * g.H * g.W, ih = r / g.W, iw = r - ih * g.W;
    float acc = 0.f;
    for (int kh = 0; kh < g.KH; kh++) {
      const int os = ih + g.pad - kh;
      if (os < 0 || os % g.stride) continue;
      const int oh = os / g.stride;
      if (oh >= g.OH) continue;
      for (int kw = 0; kw < g.KW; kw++) {
        const int ws = iw + g.pad - kw;
        if (ws < 0 || ws % g.stride) continue;
        const int ow = ws / g.stride;
        if (ow >= g.OW) continue;
        const long at = ((long)(n * g.OH + oh) * g.OW + ow) * g.R;
        for (int co = 0; co < g.R; co++) {
          if (mask && !(nt_to_f(mask[at + co]) > 0.f)) continue;
          acc += nt_to_f(dy[at + co]) *
                 nt_to_f(w[(((long)co * g.C + ci) * g.KH + kh) * g.KW + kw]);
        }
      }
    }
    if (dx_mask && !(nt_to_f(dx_mask[i]) > 0.f)) acc = 0.f;
    dx[i] = nt_from_f<T>(acc);
  }
}

/* One block per dw element (blocks [0, nw)) or db element (the next R blocks): 256 threads
 * stride over the output pixels, then a fixed-shape tree sums their parts. */
template <typename T>
__global__ void wgrad_direct(const T *__restrict__ dy, const T *__restrict__ mask,
                             const T *__restrict__ x, void *dw, bool dw_f32, void *db,
                             bool db_f32, int nw, dgeom g) {
  const int e = blockIdx.x, M = g.N * g.OH * g.OW;
  const bool is_w = e < nw;
  int co, ci = 0, kh = 0, kw = 0;
  if (is_w) {
    kw = e % g.KW;
    kh = (e / g.KW) % g.KH;
    ci = (e / (g.KW * g.KH)) % g.C;
    co = e / (g.KW * g.KH * g.C);
  } else {
    co = e - nw;
  }
  float acc = 0.f;
  for (int m = threadIdx.x; m < M; m += blockDim.x) {
    const long at = (long)m * g.R + co;
    if (mask && !(nt_to_f(mask[at]) > 0.f)) continue;
    float v = nt_to_f(dy[at]);
    if (is_w) {
      const int n = m / (g.OH * g.OW), r = m - n * g.OH * g.OW, oh = r / g.OW, ow = r - oh * g.OW;
      const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
      if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
      v *= nt_to_f(x[((long)(n * g.H + ih) * g.W + iw) * g.C + ci]);
    }
    acc += v;
  }
  __shared__ float part[256];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (is_w) add_to<T>(dw, dw_f32, e, part[0]);
    else add_to<T>(db, db_f32, co, part[0]);
  }
}

template <typename T>
nt_status fwd_t(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w, const nt_tensor *b,
                nt_tensor *y, nt_conv2d_params p, bool relu) {
  fwd_direct<T><<<nt_grid_for(nt_tensor_numel(y)), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)x->data, (const T *)w->data, b ? b->data : nullptr, b && b->dtype == NT_F32,
      relu, (T *)y->data, geom_of(x, y, w, p));
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status dgrad_t(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *mask, const nt_tensor *w,
                  nt_tensor *dx, const nt_tensor *dx_mask, nt_conv2d_params p) {
  dgrad_direct<T><<<nt_grid_for(nt_tensor_numel(dx)), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)dy->data, mask ? (const T *)mask->data : nullptr, (const T *)w->data,
      (T *)dx->data, dx_mask ? (const T *)dx_mask->data : nullptr, geom_of(dx, dy, w, p));
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status wgrad_t(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *mask, const nt_tensor *x,
                  const nt_tensor *w_shape, nt_tensor *dw, nt_tensor *db, nt_conv2d_params p) {
  const dgeom g = geom_of(x, dy, w_shape, p);
  const int nw = dw ? (int)nt_tensor_numel(dw) : 0, blocks = nw + (db ? g.R : 0);
  if (blocks == 0) return NT_OK;
  wgrad_direct<T><<<blocks, 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)dy->data, mask ? (const T *)mask->data : nullptr, (const T *)x->data,
      dw ? dw->data : nullptr, dw && dw->dtype == NT_F32, db ? db->data : nullptr,
      db && db->dtype == NT_F32, nw, g);
  return NT_CUDA_LAUNCHED(ctx);
}

}  // namespace

nt_status nt_conv2d_nhwc_forward_direct(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                        const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                        bool relu) {
  if (x->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc: the direct forward takes f32 only");
  return fwd_t<float>(ctx, x, w, b, y, p, relu);
}

nt_status nt_conv2d_nhwc_dgrad_direct(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                      const nt_tensor *w, nt_tensor *dx, const nt_tensor *dx_mask,
                                      nt_conv2d_params p) {
  switch (dx->dtype) {
    case NT_F32: return dgrad_t<float>(ctx, dy, relu_y, w, dx, dx_mask, p);
    case NT_F16: return dgrad_t<__half>(ctx, dy, relu_y, w, dx, dx_mask, p);
    case NT_BF16: return dgrad_t<__nv_bfloat16>(ctx, dy, relu_y, w, dx, dx_mask, p);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc: unsupported dtype");
  }
}

nt_status nt_conv2d_nhwc_wgrad_direct(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                      const nt_tensor *x, nt_tensor *dw, nt_tensor *db,
                                      nt_conv2d_params p) {
  /* the weight's shape comes from dw, or (db only) any [Cout, C, 1, 1]-like stand-in */
  int64_t ws[4] = {dy->shape[3], x->shape[3], 1, 1};
  nt_tensor shape = dw ? *dw : nt_tensor_view(nullptr, x->dtype, x->device, 4, ws);
  switch (x->dtype) {
    case NT_F32: return wgrad_t<float>(ctx, dy, relu_y, x, &shape, dw, db, p);
    case NT_F16: return wgrad_t<__half>(ctx, dy, relu_y, x, &shape, dw, db, p);
    case NT_BF16: return wgrad_t<__nv_bfloat16>(ctx, dy, relu_y, x, &shape, dw, db, p);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc: unsupported dtype");
  }
}
