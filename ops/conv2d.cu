/* Conv2d on CUDA as im2col + cuBLASLt GEMM (nt_gemm), fp32 accumulation. With P = OH * OW:
 *   col [K = Cin*KH*KW, N*P]           im2col of the whole batch (column n*P + p); Y' and dcol
 *                                      are fp32 so each output is rounded once
 *   forward:  Y' [Cout, N*P] = W [Cout, K] @ col;  y[n, co, p] = Y'[co, n*P + p] + b[co]
 *   backward: dY' [Cout, N*P] = dy permuted;  db += rowsum(dY')
 *             dW += dY' @ col^T (beta 1)      dcol = W^T @ dY';  dx += col2im(dcol)
 * One GEMM per product for the whole batch; col2im gathers (no atomics). Scratch comes from
 * the context's pool and is released in stream order. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops/conv2d.h"
#include "ops/gemm.h"
#include "core/cuda_util.h"

namespace {

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ __half st<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

struct geom {
  int N, Cin, H, W, Cout, KH, KW, OH, OW, stride, pad;
  __host__ __device__ long P() const { return (long)OH * OW; }
  __host__ __device__ long K() const { return (long)Cin * KH * KW; }
};

#define GRID_STRIDE(i, n)                                             \
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long)gridDim.x * blockDim.x)

template <typename T> __global__ void im2col(const T *__restrict__ x, T *__restrict__ col, geom g) {
  const long P = g.P(), NP = g.N * P, total = g.K() * NP;
  GRID_STRIDE(idx, total) {
    const long kk = idx / NP, np = idx % NP;
    const int n = (int)(np / P), p = (int)(np % P);
    const int kw = (int)(kk % g.KW), kh = (int)((kk / g.KW) % g.KH), ci = (int)(kk / (g.KW * g.KH));
    const int ih = (p / g.OW) * g.stride - g.pad + kh, iw = (p % g.OW) * g.stride - g.pad + kw;
    const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
    col[idx] = in ? x[(((long)n * g.Cin + ci) * g.H + ih) * g.W + iw] : st<T>(0.f);
  }
}

/* y[n, co, p] = yp[co, n*P + p] (+ b[co]). */
template <typename T, typename B> __global__ void scatter_bias(const float *__restrict__ yp,
                                                               const B *__restrict__ b,
                                                               T *__restrict__ y, geom g) {
  const long P = g.P(), total = (long)g.N * g.Cout * P;
  GRID_STRIDE(idx, total) {
    const long p = idx % P, co = (idx / P) % g.Cout, n = idx / (P * g.Cout);
    float v = yp[co * g.N * P + n * P + p];
    if (b) v += ld(b[co]);
    y[idx] = st<T>(v);
  }
}

/* dyp[co, n*P + p] = dy[n, co, p]. */
template <typename T>
__global__ void gather_dy(const T *__restrict__ dy, T *__restrict__ dyp, geom g) {
  const long P = g.P(), total = (long)g.N * g.Cout * P;
  GRID_STRIDE(idx, total) {
    const long p = idx % P, co = (idx / P) % g.Cout, n = idx / (P * g.Cout);
    dyp[co * g.N * P + n * P + p] = dy[idx];
  }
}

/* db[co] += sum over n, p of dy[n, co, p]: one block per channel, fp32 sum. */
template <typename T, typename B>
__global__ void bias_grad(const T *__restrict__ dy, B *__restrict__ db, geom g) {
  const long P = g.P();
  const int co = blockIdx.x;
  float acc = 0.f;
  for (long i = threadIdx.x; i < (long)g.N * P; i += blockDim.x) {
    const long n = i / P, p = i % P;
    acc += ld(dy[(n * g.Cout + co) * P + p]);
  }
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) db[co] = st<B>(ld(db[co]) + acc);
  }
}

/* dx[n, ci, ih, iw] += sum over the (kh, kw) whose output position lands on the stride grid. */
template <typename T>
__global__ void col2im_add(const float *__restrict__ dcol, T *__restrict__ dx, geom g) {
  const long P = g.P(), NP = g.N * P, total = (long)g.N * g.Cin * g.H * g.W;
  GRID_STRIDE(idx, total) {
    const int iw = (int)(idx % g.W), ih = (int)((idx / g.W) % g.H);
    const int ci = (int)((idx / ((long)g.W * g.H)) % g.Cin);
    const long n = idx / ((long)g.W * g.H * g.Cin);
    float acc = 0.f;
    for (int kh = 0; kh < g.KH; kh++) {
      const int oh_s = ih + g.pad - kh;
      if (oh_s < 0 || oh_s % g.stride) continue;
      const int oh = oh_s / g.stride;
      if (oh >= g.OH) continue;
      for (int kw = 0; kw < g.KW; kw++) {
        const int ow_s = iw + g.pad - kw;
        if (ow_s < 0 || ow_s % g.stride) continue;
        const int ow = ow_s / g.stride;
        if (ow >= g.OW) continue;
        const long kk = ((long)ci * g.KH + kh) * g.KW + kw;
        acc += dcol[kk * NP + n * P + (long)oh * g.OW + ow];
      }
    }
    dx[idx] = st<T>(ld(dx[idx]) + acc);
  }
}

unsigned grid_for(long n) {
  long b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

geom make_geom(const nt_tensor *x, const nt_tensor *w, nt_conv2d_params p) {
  geom g;
  g.N = (int)x->shape[0];
  g.Cin = (int)x->shape[1];
  g.H = (int)x->shape[2];
  g.W = (int)x->shape[3];
  g.Cout = (int)w->shape[0];
  g.KH = (int)w->shape[2];
  g.KW = (int)w->shape[3];
  g.OH = (g.H + 2 * p.pad - g.KH) / p.stride + 1;
  g.OW = (g.W + 2 * p.pad - g.KW) / p.stride + 1;
  g.stride = p.stride;
  g.pad = p.pad;
  return g;
}

nt_status mat(nt_ctx *ctx, nt_tensor *out, nt_dtype dt, long rows, long cols) {
  const int64_t s[2] = {rows, cols};
  return nt_tensor_alloc(ctx, out, dt, 2, s);
}

template <typename T> nt_status forward_t(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                          const nt_tensor *b, nt_tensor *y, const geom &g) {
  cudaStream_t s = nt_cuda_stream(ctx);
  const long NP = g.N * g.P();
  nt_tensor col = {}, yp = {}, w2;
  const int64_t wshape[2] = {g.Cout, g.K()};
  nt_gemm_opts o = nt_gemm_defaults();
  nt_status st = nt_tensor_reshape(ctx, w, 2, wshape, &w2);
  if (st || (st = mat(ctx, &col, x->dtype, g.K(), NP)) || (st = mat(ctx, &yp, NT_F32, g.Cout, NP)))
    goto done;
  im2col<T><<<grid_for(g.K() * NP), 256, 0, s>>>((const T *)x->data, (T *)col.data, g);
  if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
  if ((st = nt_gemm(ctx, &w2, &col, &yp, &o))) goto done;
  if (b && b->dtype == NT_F32)
    scatter_bias<T, float><<<grid_for((long)g.N * g.Cout * g.P()), 256, 0, s>>>(
        (const float *)yp.data, (const float *)b->data, (T *)y->data, g);
  else
    scatter_bias<T, T><<<grid_for((long)g.N * g.Cout * g.P()), 256, 0, s>>>(
        (const float *)yp.data, b ? (const T *)b->data : (const T *)NULL, (T *)y->data, g);
  st = NT_CUDA_LAUNCHED(ctx);
done:
  nt_tensor_free(ctx, &yp);
  nt_tensor_free(ctx, &col);
  return st;
}

template <typename T> nt_status backward_t(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                           const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                                           nt_tensor *db, const geom &g) {
  cudaStream_t s = nt_cuda_stream(ctx);
  const long NP = g.N * g.P();
  nt_tensor col = {}, dyp = {}, dcol = {}, w2, dw2;
  const int64_t wshape[2] = {g.Cout, g.K()};
  nt_status st = NT_OK;
  if (db) {
    if (db->dtype == NT_F32)
      bias_grad<T, float><<<g.Cout, 256, 0, s>>>((const T *)dy->data, (float *)db->data, g);
    else
      bias_grad<T, T><<<g.Cout, 256, 0, s>>>((const T *)dy->data, (T *)db->data, g);
    if ((st = NT_CUDA_LAUNCHED(ctx))) return st;
  }
  if (!dx && !dw) return NT_OK;
  if ((st = mat(ctx, &dyp, x->dtype, g.Cout, NP))) goto done;
  gather_dy<T>
      <<<grid_for((long)g.N * g.Cout * g.P()), 256, 0, s>>>((const T *)dy->data, (T *)dyp.data, g);
  if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
  if (dw) {
    if ((st = mat(ctx, &col, x->dtype, g.K(), NP))) goto done;
    im2col<T><<<grid_for(g.K() * NP), 256, 0, s>>>((const T *)x->data, (T *)col.data, g);
    if ((st = NT_CUDA_LAUNCHED(ctx))) goto done;
    if ((st = nt_tensor_reshape(ctx, dw, 2, wshape, &dw2))) goto done;
    nt_gemm_opts o = nt_gemm_defaults();
    o.trans_b = true;
    o.beta = 1.f; /* dW accumulates */
    if ((st = nt_gemm(ctx, &dyp, &col, &dw2, &o))) goto done;
  }
  if (dx) {
    if ((st = mat(ctx, &dcol, NT_F32, g.K(), NP))) goto done;
    if ((st = nt_tensor_reshape(ctx, w, 2, wshape, &w2))) goto done;
    nt_gemm_opts o = nt_gemm_defaults();
    o.trans_a = true;
    if ((st = nt_gemm(ctx, &w2, &dyp, &dcol, &o))) goto done;
    col2im_add<T><<<grid_for((long)g.N * g.Cin * g.H * g.W), 256, 0, s>>>((const float *)dcol.data,
                                                                          (T *)dx->data, g);
    st = NT_CUDA_LAUNCHED(ctx);
  }
done:
  nt_tensor_free(ctx, &dcol);
  nt_tensor_free(ctx, &col);
  nt_tensor_free(ctx, &dyp);
  return st;
}

nt_status too_big(nt_ctx *ctx, const geom &g) {
  if ((double)g.K() * g.N * g.P() > 2e9 || (double)g.N * g.Cin * g.H * g.W > 2e9)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "conv2d: problem too large for one im2col "
                    "(K %ld x N*P %ld)",
                    g.K(), (long)g.N * g.P());
  return NT_OK;
}

}  // namespace

extern "C" nt_status nt_conv2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                            const nt_tensor *b, nt_tensor *y, nt_conv2d_params p) {
  const geom g = make_geom(x, w, p);
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, g))) return st;
  switch (x->dtype) {
    case NT_F32:
      return forward_t<float>(ctx, x, w, b, y, g);
    case NT_F16:
      return forward_t<__half>(ctx, x, w, b, y, g);
    case NT_BF16:
      return forward_t<__nv_bfloat16>(ctx, x, w, b, y, g);
    default:
      return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d: unsupported dtype");
  }
}

extern "C" nt_status nt_conv2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                                             nt_tensor *db, nt_conv2d_params p) {
  const geom g = make_geom(x, w, p);
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, g))) return st;
  switch (x->dtype) {
    case NT_F32:
      return backward_t<float>(ctx, dy, x, w, dx, dw, db, g);
    case NT_F16:
      return backward_t<__half>(ctx, dy, x, w, dx, dw, db, g);
    case NT_BF16:
      return backward_t<__nv_bfloat16>(ctx, dy, x, w, dx, dw, db, g);
    default:
      return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d: unsupported dtype");
  }
}
