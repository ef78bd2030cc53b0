/* LayerNorm on the GPU: one warp per row. The row is read from DRAM once; the second and third
 * passes over it (variance, output) hit L1. Backward: dx per row as in forward, and dweight /
 * dbias summed deterministically in two stages: every warp adds its rows into its own slice of
 * shared memory (a lane always owns the same columns, so no races), the block sums its warps'
 * slices in order into a per-block partial, and a finalize kernel sums the partials in a fixed
 * order and adds them to dweight / dbias. */
#include "ops/memops_cuda.cuh"

namespace {

constexpr int kWarps = 8; /* rows per block in forward */

template <typename T, typename W, bool VEC>
__global__ void ln_forward_kernel(int64_t rows, int C, const T *__restrict__ x,
                                  const W *__restrict__ w, const W *__restrict__ b,
                                  T *__restrict__ y, float *__restrict__ mean,
                                  float *__restrict__ rstd) {
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int64_t row = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T *xr = x + row * C;
  T *yr = y + row * C;
  float s = 0.0f;
  if (VEC) {
#pragma unroll 4
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK];
      nt_load8(xr + p, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) s += v[i];
    }
  } else {
    for (int c = lane; c < C; c += 32) s += nt_to_f(xr[c]);
  }
  float m = nt_warp_sum(s) / (float)C, q = 0.0f;
  if (VEC) {
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK];
      nt_load8(xr + p, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) q += (v[i] - m) * (v[i] - m);
    }
  } else {
    for (int c = lane; c < C; c += 32) q += (nt_to_f(xr[c]) - m) * (nt_to_f(xr[c]) - m);
  }
  float r = rsqrtf(nt_warp_sum(q) / (float)C + 1e-5f);
  if (VEC) {
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK], wv[NT_PACK], bv[NT_PACK];
      nt_load8(xr + p, v);
      nt_load8(w + p, wv);
      if (b) nt_load8(b + p, bv);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) v[i] = (v[i] - m) * r * wv[i] + (b ? bv[i] : 0.0f);
      nt_store8(yr + p, v);
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      float o = (nt_to_f(xr[c]) - m) * r * nt_to_f(w[c]) + (b ? nt_to_f(b[c]) : 0.0f);
      yr[c] = nt_from_f<T>(o);
    }
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

/* Dynamic shared memory: nw slices of 2*C floats (dweight part, dbias part). Block b's partial
 * goes to partial[b * 2C ..]. */
template <typename T, typename W, bool VEC>
__global__ void ln_backward_kernel(int64_t rows, int C, const T *__restrict__ dy,
                                   const T *__restrict__ x, const W *__restrict__ w,
                                   const float *__restrict__ mean, const float *__restrict__ rstd,
                                   T *dx, float *__restrict__ partial) {
  extern __shared__ float4 smem4[];
  float *smem = reinterpret_cast<float *>(smem4);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float *sw = smem + (size_t)warp * 2 * C, *sb = sw + C;
  for (int i = threadIdx.x; i < nw * 2 * C; i += blockDim.x) smem[i] = 0.0f;
  __syncthreads();
  for (int64_t row = (int64_t)blockIdx.x * nw + warp; row < rows; row += (int64_t)gridDim.x * nw) {
    const T *xr = x + row * C, *dyr = dy + row * C;
    T *dxr = dx + row * C;
    float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
    if (VEC) {
#pragma unroll 4
      for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
        float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK];
        nt_load8(xr + p, xv);
        nt_load8(dyr + p, dv);
        nt_load8(w + p, wv);
#pragma unroll
        for (int i = 0; i < NT_PACK; i++) {
          float g = wv[i] * dv[i];
          sg += g;
          sgx += g * (xv[i] - m) * r;
        }
      }
    } else {
      for (int c = lane; c < C; c += 32) {
        float g = nt_to_f(w[c]) * nt_to_f(dyr[c]);
        sg += g;
        sgx += g * (nt_to_f(xr[c]) - m) * r;
      }
    }
    sg = nt_warp_sum(sg) / (float)C;
    sgx = nt_warp_sum(sgx) / (float)C;
    if (VEC) {
      for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
        float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK], ov[NT_PACK];
        nt_load8(xr + p, xv);
        nt_load8(dyr + p, dv);
        nt_load8(w + p, wv);
        nt_load8(dxr + p, ov);
        float4 *w4 = reinterpret_cast<float4 *>(sw + p), *b4 = reinterpret_cast<float4 *>(sb + p);
        float4 wa = w4[0], wb = w4[1], ba = b4[0], bb = b4[1];
        float *wacc[NT_PACK] = {&wa.x, &wa.y, &wa.z, &wa.w, &wb.x, &wb.y, &wb.z, &wb.w};
        float *bacc[NT_PACK] = {&ba.x, &ba.y, &ba.z, &ba.w, &bb.x, &bb.y, &bb.z, &bb.w};
#pragma unroll
        for (int i = 0; i < NT_PACK; i++) {
          float xh = (xv[i] - m) * r;
          ov[i] += (wv[i] * dv[i] - sg - xh * sgx) * r;
          *wacc[i] += dv[i] * xh;
          *bacc[i] += dv[i];
        }
        w4[0] = wa; w4[1] = wb; b4[0] = ba; b4[1] = bb;
        nt_store8(dxr + p, ov);
      }
    } else {
      for (int c = lane; c < C; c += 32) {
        float d = nt_to_f(dyr[c]), xh = (nt_to_f(xr[c]) - m) * r;
        float o = nt_to_f(dxr[c]) + (nt_to_f(w[c]) * d - sg - xh * sgx) * r;
        dxr[c] = nt_from_f<T>(o);
        sw[c] += d * xh;
        sb[c] += d;
      }
    }
  }
  __syncthreads();
  float *out = partial + (size_t)blockIdx.x * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < nw; k++) s += smem[(size_t)k * 2 * C + i];
    out[i] = s;
  }
}

/* dweight[c] += sum over k of partial[k][0][c], dbias likewise from partial[k][1][c]. A block
 * owns 32 columns; its 16 warps each sum every 16th partial row (coalesced 32-float reads, many
 * in flight), then warp 0 adds the 16 warp sums in order: fixed order, bit-reproducible, and
 * 16x shorter dependent chains than one thread per column walking all the partials. */
constexpr int kFinWarps = 16;

__global__ void __launch_bounds__(32 * kFinWarps)
    ln_finalize_kernel(int C, int nblocks, const float *__restrict__ partial, float *dweight,
                       float *dbias) {
  __shared__ float sw_s[kFinWarps][32], sb_s[kFinWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * 32 + lane;
  float sw = 0.0f, sb = 0.0f;
  /* Unrolled so that several partial rows' loads are in flight at once (the sums still run in
   * k order): the loop is a chain of memory round trips otherwise. */
  if (c < C)
#pragma unroll 8
    for (int k = warp; k < nblocks; k += kFinWarps) {
      sw += partial[(size_t)k * 2 * C + c];
      sb += partial[(size_t)k * 2 * C + C + c];
    }
  sw_s[warp][lane] = sw;
  sb_s[warp][lane] = sb;
  __syncthreads();
  if (warp || c >= C) return;
  sw = sb = 0.0f;
#pragma unroll
  for (int w = 0; w < kFinWarps; w++) {
    sw += sw_s[w][lane];
    sb += sb_s[w][lane];
  }
  dweight[c] += sw;
  if (dbias) dbias[c] += sb;
}

template <typename T, typename W>
void launch_forward(nt_ctx *ctx, int64_t rows, int C, const nt_tensor *x, const nt_tensor *w,
                    const nt_tensor *b, nt_tensor *y, nt_tensor *mean, nt_tensor *rstd) {
  const T *xp = (const T *)x->data;
  const W *wp = (const W *)w->data, *bp = b ? (const W *)b->data : nullptr;
  T *yp = (T *)y->data;
  float *mp = mean ? (float *)mean->data : nullptr, *rp = rstd ? (float *)rstd->data : nullptr;
  bool vec = C % NT_PACK == 0 && nt_aligned16(xp) && nt_aligned16(yp) && nt_aligned16(wp) &&
             (!bp || nt_aligned16(bp));
  unsigned blocks = (unsigned)((rows + kWarps - 1) / kWarps);
  cudaStream_t s = nt_cuda_stream(ctx);
  if (vec)
    ln_forward_kernel<T, W, true><<<blocks, kWarps * 32, 0, s>>>(rows, C, xp, wp, bp, yp, mp, rp);
  else
    ln_forward_kernel<T, W, false><<<blocks, kWarps * 32, 0, s>>>(rows, C, xp, wp, bp, yp, mp, rp);
}

template <typename T, typename W, bool VEC>
nt_status launch_backward_v(nt_ctx *ctx, int64_t rows, int C, const T *dy, const T *x,
                            const W *w, const float *mean, const float *rstd, T *dx, float *dw,
                            float *db) {
  /* Warps per block: as many as fit 96 KiB of shared memory, at most 8. */
  int nw = (int)(96 * 1024 / ((size_t)8 * C));
  if (nw > 8) nw = 8;
  if (nw < 1) nw = 1;
  size_t smem = (size_t)nw * 2 * C * sizeof(float);
  auto kernel = ln_backward_kernel<T, W, VEC>;
  nt_status st = NT_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)smem));
  if (st) return st;
  int per_sm = 0;
  st = NT_CUDA(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, nw * 32, smem));
  if (st) return st;
  if (per_sm < 1) per_sm = 1;
  int64_t want = (rows + nw - 1) / nw, grid = (int64_t)per_sm * nt_sm_count(ctx);
  if (grid > want) grid = want;
  if (grid < 1) grid = 1;
  float *partial = nullptr;
  st = nt_alloc(ctx, (size_t)grid * 2 * C * sizeof(float), (void **)&partial);
  if (st) return st;
  cudaStream_t s = nt_cuda_stream(ctx);
  kernel<<<(unsigned)grid, nw * 32, smem, s>>>(rows, C, dy, x, w, mean, rstd, dx, partial);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st) {
    ln_finalize_kernel<<<(C + 31) / 32, 32 * kFinWarps, 0, s>>>(C, (int)grid, partial, dw, db);
    st = NT_CUDA_LAUNCHED(ctx);
  }
  nt_free(ctx, partial); /* stream-ordered: reused only by later work on this stream */
  return st;
}

template <typename T, typename W>
nt_status launch_backward(nt_ctx *ctx, int64_t rows, int C, const nt_tensor *dy,
                          const nt_tensor *x, const nt_tensor *w, const nt_tensor *mean,
                          const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dw, nt_tensor *db) {
  const T *dyp = (const T *)dy->data, *xp = (const T *)x->data;
  const W *wp = (const W *)w->data;
  T *dxp = (T *)dx->data;
  bool vec = C % NT_PACK == 0 && nt_aligned16(dyp) && nt_aligned16(xp) && nt_aligned16(wp) &&
             nt_aligned16(dxp);
  float *dbp = db ? (float *)db->data : nullptr;
  if (vec)
    return launch_backward_v<T, W, true>(ctx, rows, C, dyp, xp, wp, (const float *)mean->data,
                                         (const float *)rstd->data, dxp, (float *)dw->data, dbp);
  return launch_backward_v<T, W, false>(ctx, rows, C, dyp, xp, wp, (const float *)mean->data,
                                        (const float *)rstd->data, dxp, (float *)dw->data, dbp);
}

} // namespace

nt_status nt_layernorm_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                                    const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                                    nt_tensor *rstd) {
  int C = (int)x->shape[x->ndim - 1];
  int64_t rows = nt_tensor_numel(x) / C;
  if (rows == 0) return NT_OK;
  if (weight->dtype == NT_F32) {
    NT_DISPATCH_FLOAT(x->dtype, T, launch_forward<T, float>(ctx, rows, C, x, weight, bias, y, mean, rstd));
  } else {
    NT_DISPATCH_FLOAT(x->dtype, T, launch_forward<T, T>(ctx, rows, C, x, weight, bias, y, mean, rstd));
  }
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_layernorm_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                     const nt_tensor *weight, const nt_tensor *mean,
                                     const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                     nt_tensor *dbias) {
  int C = (int)x->shape[x->ndim - 1];
  int64_t rows = nt_tensor_numel(x) / C;
  if (rows == 0) return NT_OK;
  nt_status st = NT_ERR_INTERNAL;
  if (weight->dtype == NT_F32) {
    NT_DISPATCH_FLOAT(x->dtype, T,
                      st = launch_backward<T, float>(ctx, rows, C, dy, x, weight, mean, rstd, dx,
                                                     dweight, dbias));
  } else {
    NT_DISPATCH_FLOAT(x->dtype, T,
                      st = launch_backward<T, T>(ctx, rows, C, dy, x, weight, mean, rstd, dx,
                                                 dweight, dbias));
  }
  return st;
}
