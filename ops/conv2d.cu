/* Conv2d on CUDA as im2col + cuBLASLt GEMM (nt_gemm), fp32 accumulation, results written once
 * in the output dtype. With P = OH * OW and K = Cin*KH*KW:
 *   col [n, P, Kp]   im2col of n images in the compute dtype, one row of Kp contiguous values
 *                    per output position. Kp = K (+1 for a bias) rounded up to 8 so every row is 16-byte
 *                    aligned for tensor cores (conv1 of the CNN: K 9 -> 16). With a bias the
 *                    column K holds 1 and the packed weight's column K holds b: the GEMM adds
 *                    the bias itself (and dW's column K is db), so there is no bias pass.
 *   forward:  y[n] [Cout, P] = Wp [Cout, Kp] @ col[n]^T   one batched GEMM straight into y
 *             (A broadcast over the batch; nt_gemm's RELU epilogue for the fused variant)
 *   dW, db:   dyp [Cout, n*P] = dy permuted;  dWp [Cout, Kp] (f32) += dyp @ col;
 *             dw += dWp[:, :K], db += dWp[:, K] once the whole batch is in
 *   dx (stride 1, pad < kernel): the forward conv of dy with the flipped, transposed weight
 *             (pad KH-1-pad, KW-1-pad), accumulated into dx by the GEMM (beta 1).
 *   dx (other strides): dcol [K, n*P] (f32) = W^T @ dyp, then col2im gathers into dx.
 *   relu backward: relu'(y) masks dy as the permute (dyp), the dx unfold and the db-only sum
 *             read it, so dz is never stored.
 * Every product works through the batch in chunks of n images (nt_conv2d_chunk_images: about
 * 8 MiB of scratch or 16k GEMM rows, at most 16 MiB; the option conv_l2_mb overrides): one im2col /
 * permute and one GEMM per chunk into scratch reused by the next chunk, dWp accumulating over
 * the chunks (beta 1), so the scratch no longer grows with the batch (the CNN's 32->32 conv at
 * batch 128 took a 58 MB col buffer). Scratch comes from the context's pool and is released
 * in stream order. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops/conv2d.h"
#include "ops/conv2d_internal.h"
#include "ops/gemm.h"
#include "core/cuda_util.h"
#include "ops/memops_cuda.cuh"
#include <stdlib.h>

extern "C" {
nt_status nt_conv2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p, bool relu);
nt_status nt_conv2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  nt_tensor *dw, nt_tensor *db, nt_conv2d_params p);
}

namespace {

/* The geometry of one convolution as im2col sees it: input [N, C, H, W], kernel KH x KW,
 * output OH x OW; K = C*KH*KW real columns, Kp padded columns (column K is 1 when ones). */
struct geom {
  int N, C, H, W, KH, KW, OH, OW, stride, padh, padw, K, Kp;
  bool ones;
  __host__ __device__ long P() const { return (long)OH * OW; }
};

/* 32-bit indices: too_big() keeps every loop below 2e9, and 64-bit division costs ~5x more. */
#define GRID_STRIDE(i, n)                                                           \
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)(n); \
       i += gridDim.x * blockDim.x)

template <typename T> struct alignas(16) pack8 { T v[8]; };

/* col[(n*P + p)*Kp + k]: one thread per 8 consecutive columns, written as one 16-byte (F32:
 * two) store. The input is small next to col and mostly L2-resident, so the gathers are cheap;
 * (ci, kh, kw) is decomposed once per thread and then stepped (integer division is slow). */
/* mask (or NULL): an input-shaped tensor; x counts only where mask > 0 (the ReLU backward). */
template <typename T> __global__ void im2col_rows(const T *__restrict__ x,
                                                  const T *__restrict__ mask, T *__restrict__ col,
                                                  geom g) {
  const unsigned chunks = (unsigned)g.Kp / 8, P = (unsigned)g.P();
  const int khw = g.KH * g.KW;
  GRID_STRIDE(idx, (long)g.N * P * chunks) {
    const unsigned row = idx / chunks;
    const int k0 = (int)(idx - row * chunks) * 8;
    const int n = (int)(row / P), p = (int)(row - n * P);
    const int oh = p / g.OW, ow = p - oh * g.OW;
    const int ih0 = oh * g.stride - g.padh, iw0 = ow * g.stride - g.padw;
    const long img = (long)n * g.C * g.H * g.W;
    const T *xn = x + img, *mn = mask ? mask + img : NULL;
    int ci = k0 / khw, r = k0 - ci * khw, kh = r / g.KW, kw = r - kh * g.KW;
    pack8<T> out;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int k = k0 + j;
      T v = nt_from_f<T>(0.f);
      if (k < g.K) {
        const int ih = ih0 + kh, iw = iw0 + kw;
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
          const long at = ((long)ci * g.H + ih) * g.W + iw;
          if (!mn || nt_to_f(mn[at]) > 0.f) v = xn[at];
        }
      } else if (k == g.K && g.ones) {
        v = nt_from_f<T>(1.f);
      }
      out.v[j] = v;
      if (++kw == g.KW) {
        kw = 0;
        if (++kh == g.KH) {
          kh = 0;
          ci++;
        }
      }
    }
    *reinterpret_cast<pack8<T> *>(col + (long)row * g.Kp + k0) = out;
  }
}

/* wp[co, k] = w[co, k] for k < K, b[co] at k == K (when b), 0 after. */
template <typename T, typename B>
__global__ void pack_weight(const T *__restrict__ w, const B *__restrict__ b, T *__restrict__ wp,
                            int Cout, int K, int Kp) {
  GRID_STRIDE(i, (long)Cout * Kp) {
    const int co = (int)(i / (unsigned)Kp), k = (int)(i % (unsigned)Kp);
    wp[i] = k < K ? w[(long)co * K + k]
                  : (k == K && b) ? nt_from_f<T>(nt_to_f(b[co])) : nt_from_f<T>(0.f);
  }
}

/* wt[ci, (co*KH + kh)*KW + kw] = w[co, ci, KH-1-kh, KW-1-kw]: the weight of dx as a conv of dy. */
template <typename T>
__global__ void pack_weight_flipped(const T *__restrict__ w, T *__restrict__ wt, int Cout, int Cin,
                                    int KH, int KW, int Kp) {
  const int K = Cout * KH * KW;
  GRID_STRIDE(i, (long)Cin * Kp) {
    const int ci = (int)(i / (unsigned)Kp), k = (int)(i % (unsigned)Kp);
    T v = nt_from_f<T>(0.f);
    if (k < K) {
      const int co = k / (KH * KW), r = k % (KH * KW), kh = r / KW, kw = r % KW;
      v = w[(((long)co * Cin + ci) * KH + (KH - 1 - kh)) * KW + (KW - 1 - kw)];
    }
    wt[i] = v;
  }
}

/* dw[co, k] += dwp[co, k] (k < K); db[co] += dwp[co, K]. */
template <typename W, typename B>
__global__ void add_weight_grad(const float *__restrict__ dwp, W *__restrict__ dw,
                                B *__restrict__ db, int Cout, int K, int Kp) {
  GRID_STRIDE(i, (long)Cout * (K + 1)) {
    const int co = (int)(i / (unsigned)(K + 1)), k = (int)(i % (unsigned)(K + 1));
    const float g = dwp[(long)co * Kp + k];
    if (k < K) {
      if (dw) dw[(long)co * K + k] = nt_from_f<W>(nt_to_f(dw[(long)co * K + k]) + g);
    } else if (db) {
      db[co] = nt_from_f<B>(nt_to_f(db[co]) + g);
    }
  }
}

/* dyp[co, n*P + p] = dy[n, co, p]: one block per (n, co) plane, a contiguous copy (no index
 * division). */
template <typename T>
__global__ void gather_dy(const T *__restrict__ dy, const T *__restrict__ mask,
                          T *__restrict__ dyp, int N, int Cout, long P) {
  const unsigned plane = blockIdx.x, n = plane / (unsigned)Cout, co = plane - n * Cout;
  const T *src = dy + (long)plane * P, *m = mask ? mask + (long)plane * P : NULL;
  T *dst = dyp + ((long)co * N + n) * P;
  for (long p = threadIdx.x; p < P; p += blockDim.x)
    dst[p] = (!m || nt_to_f(m[p]) > 0.f) ? src[p] : nt_from_f<T>(0.f);
}

/* db[co] += sum over n, p of dy[n, co, p]: one block per channel, fp32 sum (used when there is
 * no dW GEMM to carry it). */
template <typename T, typename B>
__global__ void bias_grad(const T *__restrict__ dy, const T *__restrict__ mask,
                          B *__restrict__ db, int N, int Cout, long P) {
  const int co = blockIdx.x;
  float acc = 0.f;
  const unsigned Pu = (unsigned)P;
  for (unsigned i = threadIdx.x; i < (unsigned)(N * P); i += blockDim.x) {
    const unsigned n = i / Pu, p = i - n * Pu;
    const long at = ((long)n * Cout + co) * P + p;
    if (!mask || nt_to_f(mask[at]) > 0.f) acc += nt_to_f(dy[at]);
  }
  __shared__ float part[32];
  acc = nt_block_sum(acc, part);
  if (threadIdx.x == 0) db[co] = nt_from_f<B>(nt_to_f(db[co]) + acc);
}

/* dx[n, ci, ih, iw] += sum over the (kh, kw) whose output position lands on the stride grid;
 * dcol is [K, N*P] (f32). g describes the forward conv (C = Cin). */
template <typename T>
__global__ void col2im_add(const float *__restrict__ dcol, T *__restrict__ dx, geom g) {
  const long P = g.P(), NP = g.N * P;
  GRID_STRIDE(idx, (long)g.N * g.C * g.H * g.W) {
    const unsigned r1 = idx / (unsigned)g.W, r2 = r1 / (unsigned)g.H;
    const int iw = (int)(idx - r1 * g.W), ih = (int)(r1 - r2 * g.H);
    const int ci = (int)(r2 % (unsigned)g.C);
    const long n = r2 / (unsigned)g.C;
    float acc = 0.f;
    for (int kh = 0; kh < g.KH; kh++) {
      const int oh_s = ih + g.padh - kh;
      if (oh_s < 0 || oh_s % g.stride) continue;
      const int oh = oh_s / g.stride;
      if (oh >= g.OH) continue;
      for (int kw = 0; kw < g.KW; kw++) {
        const int ow_s = iw + g.padw - kw;
        if (ow_s < 0 || ow_s % g.stride) continue;
        const int ow = ow_s / g.stride;
        if (ow >= g.OW) continue;
        const long kk = ((long)ci * g.KH + kh) * g.KW + kw;
        acc += dcol[kk * NP + n * P + (long)oh * g.OW + ow];
      }
    }
    dx[idx] = nt_from_f<T>(nt_to_f(dx[idx]) + acc);
  }
}

int round8(int k) { return (k + 7) / 8 * 8; }

/* The forward conv's geometry (input x, weight w), with a ones column when `ones`. */
geom fwd_geom(const nt_tensor *x, const nt_tensor *w, nt_conv2d_params p, bool ones) {
  geom g;
  g.N = (int)x->shape[0];
  g.C = (int)x->shape[1];
  g.H = (int)x->shape[2];
  g.W = (int)x->shape[3];
  g.KH = (int)w->shape[2];
  g.KW = (int)w->shape[3];
  g.OH = (g.H + 2 * p.pad - g.KH) / p.stride + 1;
  g.OW = (g.W + 2 * p.pad - g.KW) / p.stride + 1;
  g.stride = p.stride;
  g.padh = g.padw = p.pad;
  g.K = g.C * g.KH * g.KW;
  g.ones = ones;
  g.Kp = round8(g.K + (ones ? 1 : 0));
  return g;
}

/* dx as a stride-1 conv of dy ([N, Cout, OH, OW]) back onto [H, W]. */
geom dx_geom(const geom &f, int Cout) {
  geom g = f;
  g.C = Cout;
  g.H = f.OH;
  g.W = f.OW;
  g.OH = f.H;
  g.OW = f.W;
  g.stride = 1;
  g.padh = f.KH - 1 - f.padh;
  g.padw = f.KW - 1 - f.padw;
  g.K = Cout * f.KH * f.KW;
  g.ones = false;
  g.Kp = round8(g.K);
  return g;
}

nt_status alloc(nt_ctx *ctx, nt_tensor *out, nt_dtype dt, int ndim, long a, long b, long c = 0) {
  const int64_t s[3] = {a, b, c};
  return nt_tensor_alloc(ctx, out, dt, ndim, s);
}

template <typename T> T *at(const void *p, long off) { return (T *)p + off; }

template <typename T>
nt_status launch_im2col(nt_ctx *ctx, const T *x, const T *mask, T *col, const geom &g) {
  im2col_rows<T><<<nt_grid_for((long)g.N * g.P() * (g.Kp / 8)), 256, 0, nt_cuda_stream(ctx)>>>(
      x, mask, col, g);
  return NT_CUDA_LAUNCHED(ctx);
}

/* D[n] [M, P] (beta 0 or 1) = Wp [M, Kp] @ col[n]^T for the g.N images of col [g.N, P, Kp]. */
nt_status batched_conv_gemm(nt_ctx *ctx, const nt_tensor *wp, void *col, void *D, const geom &g,
                            float beta, bool relu) {
  const int64_t sa[3] = {1, wp->shape[0], g.Kp}, sb[3] = {g.N, g.P(), g.Kp},
                sd[3] = {g.N, wp->shape[0], g.P()};
  nt_tensor a = nt_tensor_view(wp->data, wp->dtype, wp->device, 3, sa);
  nt_tensor b = nt_tensor_view(col, wp->dtype, wp->device, 3, sb);
  nt_tensor d = nt_tensor_view(D, wp->dtype, wp->device, 3, sd);
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  o.beta = beta;
  if (relu) o.epilogue = NT_EPI_RELU;
  return nt_gemm(ctx, &a, &b, &d, &o);
}

/* out[n] (+)= conv(in[n]) with the packed weight wp, chunk by chunk (one im2col and one
 * batched GEMM per chunk into one reused col buffer): in [N, C, H, W] as g describes it,
 * out [N, M, OH, OW]. */
template <typename T>
nt_status conv_chunks(nt_ctx *ctx, const nt_tensor *wp, const T *in, const T *mask, T *out,
                      const geom &g, float beta, bool relu) {
  const int nc = nt_conv2d_chunk_images(g.N, g.P(), (double)g.P() * g.Kp * sizeof(T),
                                        nt_ctx_opts(ctx)->conv_l2_mb);
  const long in_img = (long)g.C * g.H * g.W, out_img = (long)wp->shape[0] * g.P();
  nt_tensor col = {};
  nt_status st = alloc(ctx, &col, wp->dtype, 2, (long)nc * g.P(), g.Kp);
  for (int n0 = 0; !st && n0 < g.N; n0 += nc) {
    geom c = g;
    c.N = g.N - n0 < nc ? g.N - n0 : nc;
    st = launch_im2col<T>(ctx, in + n0 * in_img, mask ? mask + n0 * in_img : NULL,
                          (T *)col.data, c);
    if (!st) st = batched_conv_gemm(ctx, wp, col.data, out + n0 * out_img, c, beta, relu);
  }
  nt_tensor_free(ctx, &col);
  return st;
}

template <typename T> nt_status forward_t(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                          const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                          bool relu) {
  cudaStream_t s = nt_cuda_stream(ctx);
  const geom g = fwd_geom(x, w, p, b != NULL);
  const int Cout = (int)w->shape[0];
  nt_tensor wp = {};
  nt_status st = alloc(ctx, &wp, x->dtype, 2, Cout, g.Kp);
  if (st) return st;
  if (b && b->dtype == NT_F32 && x->dtype != NT_F32)
    pack_weight<T, float><<<nt_grid_for((long)Cout * g.Kp), 256, 0, s>>>(
        (const T *)w->data, (const float *)b->data, (T *)wp.data, Cout, g.K, g.Kp);
  else
    pack_weight<T, T><<<nt_grid_for((long)Cout * g.Kp), 256, 0, s>>>(
        (const T *)w->data, b ? (const T *)b->data : (const T *)NULL, (T *)wp.data, Cout, g.K,
        g.Kp);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st) st = conv_chunks<T>(ctx, &wp, (const T *)x->data, NULL, (T *)y->data, g, 0.f, relu);
  nt_tensor_free(ctx, &wp);
  return st;
}

template <typename T, typename W, typename B>
nt_status launch_add_weight_grad(nt_ctx *ctx, const nt_tensor *dwp, nt_tensor *dw, nt_tensor *db,
                                 int Cout, int K, int Kp) {
  add_weight_grad<W, B><<<nt_grid_for((long)Cout * (K + 1)), 256, 0, nt_cuda_stream(ctx)>>>(
      (const float *)dwp->data, dw ? (W *)dw->data : (W *)NULL, db ? (B *)db->data : (B *)NULL,
      Cout, K, Kp);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename T>
nt_status add_weight_grads(nt_ctx *ctx, const nt_tensor *dwp, nt_tensor *dw, nt_tensor *db,
                           int Cout, int K, int Kp) {
  const bool w32 = dw->dtype == NT_F32, b32 = !db || db->dtype == NT_F32;
  if (w32 && b32) return launch_add_weight_grad<T, float, float>(ctx, dwp, dw, db, Cout, K, Kp);
  if (w32) return launch_add_weight_grad<T, float, T>(ctx, dwp, dw, db, Cout, K, Kp);
  if (b32) return launch_add_weight_grad<T, T, float>(ctx, dwp, dw, db, Cout, K, Kp);
  return launch_add_weight_grad<T, T, T>(ctx, dwp, dw, db, Cout, K, Kp);
}

/* The gradients that need dy permuted to dyp [Cout, n*P], chunk by chunk over the batch: dw
 * (db through the ones column) as dWp [Cout, Kp] (f32, accumulated over the chunks by the
 * GEMM's beta) = dyp @ im2col(x), and dx when it is not a conv of dy (dx_col2im non-NULL) as
 * col2im of dcol [K, n*P] (f32) = W^T @ dyp. The im2col columns and dcol take turns in one
 * scratch buffer. */
template <typename T>
nt_status grad_chunks(nt_ctx *ctx, const nt_tensor *dy, const T *mask, const nt_tensor *x,
                      const nt_tensor *w, nt_tensor *dw, nt_tensor *db, nt_tensor *dx_col2im,
                      const geom &f, int Cout) {
  cudaStream_t s = nt_cuda_stream(ctx);
  const long P = f.P(), in_img = (long)f.C * f.H * f.W, out_img = (long)Cout * P;
  const double col_img = dw ? (double)P * f.Kp * sizeof(T) : 0.0,
               dcol_img = dx_col2im ? (double)P * f.K * sizeof(float) : 0.0;
  const double buf_img = col_img > dcol_img ? col_img : dcol_img;
  const int nc = nt_conv2d_chunk_images(f.N, P, (double)out_img * sizeof(T) + buf_img,
                                        nt_ctx_opts(ctx)->conv_l2_mb);
  const size_t buf_bytes = (size_t)(buf_img * nc);
  nt_tensor dyp = {}, buf = {}, dwp = {}, w2;
  nt_status st = alloc(ctx, &dyp, x->dtype, 2, Cout, (long)nc * P);
  if (!st) st = alloc(ctx, &buf, NT_U8, 1, (long)buf_bytes, 0);
  if (!st && dw) st = alloc(ctx, &dwp, NT_F32, 2, Cout, f.Kp);
  const int64_t wshape[2] = {Cout, f.K};
  if (!st && dx_col2im) st = nt_tensor_reshape(ctx, w, 2, wshape, &w2);
  for (int n0 = 0; !st && n0 < f.N; n0 += nc) {
    geom c = f;
    c.N = f.N - n0 < nc ? f.N - n0 : nc;
    const long rows = (long)c.N * P;
    const int64_t sdyp[2] = {Cout, rows};
    nt_tensor dyp_c = nt_tensor_view(dyp.data, x->dtype, x->device, 2, sdyp);
    gather_dy<T><<<(unsigned)(c.N * Cout), P >= 256 ? 256 : 128, 0, s>>>(
        at<T>(dy->data, n0 * out_img), mask ? mask + n0 * out_img : NULL, (T *)dyp.data, c.N,
        Cout, P);
    if ((st = NT_CUDA_LAUNCHED(ctx))) break;
    if (dw) {
      const int64_t scol[2] = {rows, f.Kp};
      nt_tensor col = nt_tensor_view(buf.data, x->dtype, x->device, 2, scol);
      nt_gemm_opts o = nt_gemm_defaults();
      o.beta = n0 ? 1.f : 0.f;
      st = launch_im2col<T>(ctx, at<T>(x->data, n0 * in_img), NULL, (T *)col.data, c);
      if (!st) st = nt_gemm(ctx, &dyp_c, &col, &dwp, &o);
      if (st) break;
    }
    if (dx_col2im) {
      const int64_t sdcol[2] = {f.K, rows};
      nt_tensor dcol = nt_tensor_view(buf.data, NT_F32, x->device, 2, sdcol);
      nt_gemm_opts o = nt_gemm_defaults();
      o.trans_a = true;
      if ((st = nt_gemm(ctx, &w2, &dyp_c, &dcol, &o))) break;
      col2im_add<T><<<nt_grid_for((long)c.N * c.C * c.H * c.W), 256, 0, s>>>(
          (const float *)dcol.data, at<T>(dx_col2im->data, n0 * in_img), c);
      if ((st = NT_CUDA_LAUNCHED(ctx))) break;
    }
  }
  if (!st && dw) st = add_weight_grads<T>(ctx, &dwp, dw, db, Cout, f.K, f.Kp);
  nt_tensor_free(ctx, &dwp);
  nt_tensor_free(ctx, &buf);
  nt_tensor_free(ctx, &dyp);
  return st;
}

/* dx += conv(dy, flipped w^T): stride 1 and pad < kernel only. */
template <typename T>
nt_status data_grad_conv(nt_ctx *ctx, const nt_tensor *dy, const T *mask, const nt_tensor *w,
                         nt_tensor *dx, const geom &f, int Cout) {
  const geom g = dx_geom(f, Cout);
  nt_tensor wt = {};
  nt_status st = alloc(ctx, &wt, w->dtype, 2, f.C, g.Kp);
  if (st) return st;
  pack_weight_flipped<T><<<nt_grid_for((long)f.C * g.Kp), 256, 0, nt_cuda_stream(ctx)>>>(
      (const T *)w->data, (T *)wt.data, Cout, f.C, f.KH, f.KW, g.Kp);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st)
    st = conv_chunks<T>(ctx, &wt, (const T *)dy->data, mask, (T *)dx->data, g, 1.f, false);
  nt_tensor_free(ctx, &wt);
  return st;
}

template <typename T>
nt_status backward_t(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                     const nt_tensor *x, const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                     nt_tensor *db, nt_conv2d_params p) {
  const T *mask = relu_y ? (const T *)relu_y->data : NULL;
  cudaStream_t s = nt_cuda_stream(ctx);
  const int Cout = (int)w->shape[0];
  const geom f = fwd_geom(x, w, p, dw && db);
  const bool dx_as_conv = p.stride == 1 && p.pad < f.KH && p.pad < f.KW;
  nt_status st = NT_OK;
  if (db && !dw) {
    if (db->dtype == NT_F32)
      bias_grad<T, float><<<Cout, 256, 0, s>>>((const T *)dy->data, mask, (float *)db->data,
                                               f.N, Cout, f.P());
    else
      bias_grad<T, T><<<Cout, 256, 0, s>>>((const T *)dy->data, mask, (T *)db->data, f.N, Cout,
                                           f.P());
    if ((st = NT_CUDA_LAUNCHED(ctx))) return st;
  }
  if (dw || (dx && !dx_as_conv))
    st = grad_chunks<T>(ctx, dy, mask, x, w, dw, db, dx && !dx_as_conv ? dx : NULL, f, Cout);
  if (!st && dx && dx_as_conv) st = data_grad_conv<T>(ctx, dy, mask, w, dx, f, Cout);
  return st;
}

nt_status too_big(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w, nt_conv2d_params p) {
  const geom g = fwd_geom(x, w, p, true), gx = dx_geom(g, (int)w->shape[0]);
  const double rows = (double)g.N * g.P();
  if (rows * g.Kp > 2e9 || (double)g.N * gx.P() * gx.Kp > 2e9 ||
      (double)g.N * g.C * g.H * g.W > 2e9 || (double)g.N * w->shape[0] * g.P() > 2e9)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "conv2d: problem too large for one im2col (K %d x N*P %.0f)", g.Kp, rows);
  return NT_OK;
}

}  // namespace

extern "C" nt_status nt_conv2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p, bool relu) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, x, w, p))) return st;
  if (nt_tensor_numel(y) == 0) return NT_OK;
  switch (x->dtype) {
    case NT_F32: return forward_t<float>(ctx, x, w, b, y, p, relu);
    case NT_F16: return forward_t<__half>(ctx, x, w, b, y, p, relu);
    case NT_BF16: return forward_t<__nv_bfloat16>(ctx, x, w, b, y, p, relu);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d: unsupported dtype");
  }
}

extern "C" nt_status nt_conv2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                             const nt_tensor *relu_y, const nt_tensor *x,
                                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                                             nt_tensor *db, nt_conv2d_params p) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, x, w, p))) return st;
  if (nt_tensor_numel(dy) == 0) return NT_OK;
  switch (x->dtype) {
    case NT_F32: return backward_t<float>(ctx, dy, relu_y, x, w, dx, dw, db, p);
    case NT_F16: return backward_t<__half>(ctx, dy, relu_y, x, w, dx, dw, db, p);
    case NT_BF16: return backward_t<__nv_bfloat16>(ctx, dy, relu_y, x, w, dx, dw, db, p);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d: unsupported dtype");
  }
}
