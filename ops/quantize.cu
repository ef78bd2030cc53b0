/* FP8 quantization kernels. Every form computes the tensor's amax in the same pass: the max of
 * |x|'s bits as unsigned integers per thread (a non-negative float orders like its bit pattern,
 * and every NaN's bits lie above inf's, so a NaN wins, as the delayed-scaling update expects),
 * a block reduction, then one atomicMax per block with NaN normalised to 0x7fc00000.
 * The unit of work is 16 consecutive elements of one row of x (load16, q16): 16-byte loads when
 * the row is aligned and the 16 all exist, two elements per conversion instruction
 * (__nv_cvt_float2_to_fp8x2: the same rounding as the one-element form, so the same bytes).
 *   plain:      a grid-stride loop over y's 16-byte groups, one 16-byte store each.
 *   tiles:      64x64 tiles of x, one 16-element unit per thread; the units go transposed into
 *               shared memory (a 16-byte XOR swizzle keeps both the byte writes and the 16-byte
 *               reads free of bank conflicts), from where y_t's rows leave in 16-byte stores;
 *               with a row-major output too (the dual form), each unit is also stored there
 *               directly, so x is read once for both layouts. The dual form may also take x
 *               as the gradient of a GELU (x' = x * gelu'(pre), rounded to x's dtype, in
 *               registers) and leave the 64-row block's column sums of x' in an fp32 partial
 *               buffer [blocks, C] (warp shuffles over the warp's 8 rows, then the 8 warps in
 *               order), which ops/gemm_kernels.cu's colsum finish adds into the output. */
#include "ops/memops_cuda.cuh"
#include "ops/gelu_rule.h"
#include "ops/gemm_internal.h"
#include "core/memory.h"
#include <cuda_fp8.h>

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  /* 64 x 64 elements = kThreads units of 16 */

/* One FP8 output: rows x cols bytes, dense; vec: 16-byte aligned with cols % 16 == 0. */
struct out8 {
  uint8_t *p;
  int64_t rows, cols;
  bool vec;
};

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

/* Block-wide max of the amax bits, then one atomic into *amax. */
__device__ __forceinline__ void block_amax(uint32_t m, float *amax) {
  __shared__ uint32_t red[kThreads / 32];
  m = __reduce_max_sync(0xffffffffu, m);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t v = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) v = max(v, red[w]);
    if (v > 0x7f800000u) v = 0x7fc00000u;
    atomicMax(reinterpret_cast<int *>(amax), (int)v);
  }
}

/* Loads x[r, c0 .. c0 + 16) into v, 0 outside x. With pre (same layout as x): v = x' =
 * T(0 + x * gelu'(pre)), nt_gelu_backward's bytes. vec_in: x, pre and their row stride are
 * 16-byte aligned. */
template <typename T>
__device__ __forceinline__ void load16(const T *x, const T *pre, int64_t ldx, int64_t R,
                                       int64_t C, int64_t r, int64_t c0, bool vec_in,
                                       float v[16]) {
  float p[16];
  const bool full = r < R && c0 + 16 <= C;
  if (full && vec_in) {
    nt_load8(x + r * ldx + c0, v);
    nt_load8(x + r * ldx + c0 + 8, v + 8);
    if (pre) {
      nt_load8(pre + r * ldx + c0, p);
      nt_load8(pre + r * ldx + c0 + 8, p + 8);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      bool in = r < R && c0 + j < C;
      v[j] = in ? nt_to_f(x[r * ldx + c0 + j]) : 0.0f;
      p[j] = in && pre ? nt_to_f(pre[r * ldx + c0 + j]) : 0.0f;
    }
  }
  if (pre) {
#pragma unroll
    for (int j = 0; j < 16; j++) v[j] = nt_to_f(nt_from_f<T>(0.0f + v[j] * nt_gelu_grad(p[j])));
  }
}

/* v (x[r, c0 .. c0 + 16), load16's) quantized: fp8(v * s) inside x, 0 outside it (whatever
 * the scale); |v| folded into the amax bits m. */
template <bool E4M3>
__device__ __forceinline__ uint4 q16(const float v[16], int64_t R, int64_t C, int64_t r,
                                     int64_t c0, float s, uint32_t &m) {
  const bool full = r < R && c0 + 16 <= C;
  union { uint4 w; __nv_fp8x2_storage_t h[8]; } q;
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    m = max(m, max(abs_bits(v[j]), abs_bits(v[j + 1])));
    float2 f = make_float2(v[j] * s, v[j + 1] * s);
    if (!full) {
      if (r >= R || c0 + j >= C) f.x = 0.0f;
      if (r >= R || c0 + j + 1 >= C) f.y = 0.0f;
    }
    q.h[j / 2] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2);
  }
  return q.w;
}

/* Stores the 16 bytes at o.p[row, col ..], those of them inside o. */
__device__ __forceinline__ void store16(const out8 &o, int64_t row, int64_t col, uint4 q) {
  if (row >= o.rows || col >= o.cols) return;
  uint8_t *out = o.p + row * o.cols + col;
  if (o.vec) {
    *reinterpret_cast<uint4 *>(out) = q;
  } else {
    union { uint4 w; uint8_t b[16]; } u;
    u.w = q;
    for (int j = 0; j < 16 && col + j < o.cols; j++) out[j] = u.b[j];
  }
}

template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
quantize_rows(const T *x, int64_t ldx, int64_t R, int64_t C, out8 y, const float *scale,
              float *amax, bool vec_in) {
  const float s = *scale;
  const int64_t groups = (y.cols + 15) / 16, total = y.rows * groups;
  const int64_t start = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * kThreads;
  /* (r, g) steps by the stride in rows and groups: no division inside the loop. */
  int64_t r = start / groups, g = start % groups;
  const int64_t dr = stride / groups, dg = stride % groups;
  uint32_t m = 0;
  for (int64_t i = start; i < total; i += stride) {
    float v[16];
    load16<T>(x, nullptr, ldx, R, C, r, g * 16, vec_in, v);
    store16(y, r, g * 16, q16<E4M3>(v, R, C, r, g * 16, s, m));
    r += dr;
    g += dg;
    if (g >= groups) {
      g -= groups;
      r++;
    }
  }
  if (amax) block_amax(m, amax);
}

/* Byte offset of element (row, col) of the 64 x 64 shared tile: 16-byte segments XOR-swizzled
 * by the row's 16-row band. */
__device__ __forceinline__ int tile_at(int row, int col) {
  return row * kTile + ((((col >> 4) ^ (row >> 4)) & 3) << 4) + (col & 15);
}

/* partial[blockIdx.x, c0 + c] = the sum of v over the block's 64 rows, for the tile's columns
 * inside C; v is this thread's unit (tile row threadIdx.x / 4, columns (threadIdx.x % 4) * 16). */
__device__ __forceinline__ void tile_colsums(float v[16], int64_t c0, int64_t C,
                                             float *partial) {
  __shared__ float sums[kThreads / 32][kTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  /* The warp's lanes l, l^4, l^8, l^16 hold the same columns of 8 rows. */
#pragma unroll
  for (int j = 0; j < 16; j++) {
    v[j] += __shfl_xor_sync(0xffffffffu, v[j], 4);
    v[j] += __shfl_xor_sync(0xffffffffu, v[j], 8);
    v[j] += __shfl_xor_sync(0xffffffffu, v[j], 16);
  }
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < 16; j++) sums[warp][lane * 16 + j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < kTile && c0 + threadIdx.x < C) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; w++) t += sums[w][threadIdx.x];
    partial[(int64_t)blockIdx.x * C + c0 + threadIdx.x] = t;
  }
}

/* Block (bx, by) covers x rows [bx*64, +64) and x columns [by*64, +64): y_t rows [by*64, +64)
 * and columns [bx*64, +64), and with ROWS the same region of yr. Thread t quantizes the unit at
 * tile row t/4, columns (t%4)*16. pre (the GELU backward) and partial (the column sums) only
 * with ROWS, each may be NULL. */
template <typename T, bool E4M3, bool ROWS>
__global__ void __launch_bounds__(kThreads)
quantize_tiles(const T *x, const T *pre, int64_t ldx, int64_t R, int64_t C, out8 yr, out8 yt,
               const float *scale, float *amax, float *partial, bool vec_in) {
  __shared__ __align__(16) uint8_t tile[kTile * kTile];
  const float s = *scale;
  const int64_t r0 = (int64_t)blockIdx.x * kTile, c0 = (int64_t)blockIdx.y * kTile;
  const int ur = threadIdx.x >> 2, uc = (threadIdx.x & 3) * 16;
  uint32_t m = 0;
  union { uint4 w; uint8_t b[16]; } q;
  float v[16];
  load16<T>(x, ROWS ? pre : nullptr, ldx, R, C, r0 + ur, c0 + uc, vec_in, v);
  q.w = q16<E4M3>(v, R, C, r0 + ur, c0 + uc, s, m);
  if (ROWS) store16(yr, r0 + ur, c0 + uc, q.w);
  if (ROWS && partial) tile_colsums(v, c0, C, partial);
#pragma unroll
  for (int j = 0; j < 16; j++) tile[tile_at(uc + j, ur)] = q.b[j];
  __syncthreads();
  /* Tile row ur of the transpose (x column c0 + ur), bytes uc .. uc + 15 (x rows r0 + uc ..). */
  store16(yt, c0 + ur, r0 + uc, *reinterpret_cast<const uint4 *>(tile + tile_at(ur, uc)));
  if (amax) block_amax(m, amax);
}

template <bool E4M3>
__global__ void dequantize_kernel(const uint8_t *x, float *y, int64_t n, const float *scale_inv) {
  const float s = *scale_inv;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)x[i], E4M3 ? __NV_E4M3 : __NV_E5M2);
    y[i] = __half2float(__half(h)) * s;
  }
}

unsigned grid_for(nt_ctx *ctx, int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  int64_t cap = (int64_t)nt_sm_count(ctx) * 16;
  if (blocks > cap) blocks = cap;
  return (unsigned)(blocks < 1 ? 1 : blocks);
}

out8 out_of(const nt_tensor *y) {
  out8 o = {nullptr, 0, 0, false};
  if (!y) return o;
  o.p = (uint8_t *)y->data;
  o.rows = y->shape[0];
  o.cols = y->shape[1];
  o.vec = nt_aligned16(o.p) && o.cols % 16 == 0;
  return o;
}

int64_t up64(int64_t n) { return (n + kTile - 1) / kTile; }

/* What one call quantizes: x into yr (row-major) and/or yt (transposed), at least one; pre
 * and partial: the dual form's GELU backward and column-sum buffer, or NULL. */
struct job {
  const nt_tensor *x, *yr, *yt, *pre;
  const float *scale;
  float *amax, *partial;
};

/* The tiles cover both outputs, in x's coordinates: bx the 64-row blocks (the column sums'
 * partial rows), by the 64-column ones. */
void tile_blocks(const job &j, int64_t *bx, int64_t *by) {
  int64_t rows = j.yt->shape[1], cols = j.yt->shape[0];
  if (j.yr && j.yr->shape[0] > rows) rows = j.yr->shape[0];
  if (j.yr && j.yr->shape[1] > cols) cols = j.yr->shape[1];
  *bx = up64(rows);
  *by = up64(cols);
}

dim3 tile_grid(const job &j) {
  int64_t bx, by;
  tile_blocks(j, &bx, &by);
  return dim3((unsigned)bx, (unsigned)by);
}

template <typename T, bool E4M3>
void launch(nt_ctx *ctx, const job &j) {
  const T *xp = (const T *)j.x->data, *pre = j.pre ? (const T *)j.pre->data : nullptr;
  int64_t R = j.x->shape[0], C = j.x->shape[1], ldx = j.x->stride[0];
  bool vec_in = nt_aligned16(xp) && (!pre || nt_aligned16(pre)) &&
                (ldx * (int64_t)sizeof(T)) % 16 == 0;
  out8 orow = out_of(j.yr), otr = out_of(j.yt);
  cudaStream_t st = nt_cuda_stream(ctx);
  if (!j.yt) {
    int64_t work = orow.rows * ((orow.cols + 15) / 16);
    quantize_rows<T, E4M3><<<grid_for(ctx, work), kThreads, 0, st>>>(xp, ldx, R, C, orow,
                                                                     j.scale, j.amax, vec_in);
  } else if (j.yr) {
    quantize_tiles<T, E4M3, true><<<tile_grid(j), kThreads, 0, st>>>(
        xp, pre, ldx, R, C, orow, otr, j.scale, j.amax, j.partial, vec_in);
  } else {
    quantize_tiles<T, E4M3, false><<<tile_grid(j), kThreads, 0, st>>>(
        xp, nullptr, ldx, R, C, orow, otr, j.scale, j.amax, nullptr, vec_in);
  }
}

/* colsum (F32 [C] or NULL): += the column sums of what the dual form quantized, through the
 * partial buffer. */
nt_status quantize(nt_ctx *ctx, job j, float *colsum) {
  int64_t C = j.x->shape[1], chunks = 0, by = 0;
  if (j.yt) {
    tile_blocks(j, &chunks, &by);
    if (by > 65535 || chunks > INT32_MAX)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "fp8 quantize: a transposed output of %lld x %lld is beyond the grid's "
                      "reach", (long long)j.yt->shape[0], (long long)j.yt->shape[1]);
  }
  nt_status s;
  if (colsum) {
    if ((s = nt_alloc(ctx, (size_t)(chunks * C) * sizeof(float), (void **)&j.partial))) return s;
  }
  bool e4m3 = (j.yt ? j.yt : j.yr)->dtype == NT_FP8_E4M3;
  NT_DISPATCH_FLOAT(j.x->dtype, T,
                    if (e4m3) launch<T, true>(ctx, j);
                    else launch<T, false>(ctx, j));
  s = NT_CUDA_LAUNCHED(ctx);
  if (colsum) {
    if (!s) s = nt_gemmk_colsum_finish(ctx, j.partial, chunks, C, colsum);
    nt_free(ctx, j.partial); /* stream-ordered: reused only by later work on this stream */
  }
  return s;
}

}  // namespace

extern "C" nt_status nt_fp8_quantize_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                          bool transpose, const float *scale, float *amax) {
  job j = {x, transpose ? nullptr : y, transpose ? y : nullptr, nullptr, scale, amax, nullptr};
  return quantize(ctx, j, nullptr);
}

extern "C" nt_status nt_fp8_quantize_dual_cuda(nt_ctx *ctx, const nt_tensor *x,
                                               nt_tensor *y_rows, nt_tensor *y_t,
                                               const float *scale, float *amax,
                                               const nt_tensor *gelu_pre, float *colsum) {
  job j = {x, y_rows, y_t, gelu_pre, scale, amax, nullptr};
  return quantize(ctx, j, colsum);
}

extern "C" nt_status nt_fp8_dequantize_cuda(nt_ctx *ctx, const nt_tensor *x,
                                            const float *scale_inv, nt_tensor *y) {
  int64_t n = nt_tensor_numel(x);
  const uint8_t *xp = (const uint8_t *)x->data;
  float *yp = (float *)y->data;
  unsigned grid = grid_for(ctx, n);
  cudaStream_t st = nt_cuda_stream(ctx);
  if (x->dtype == NT_FP8_E4M3)
    dequantize_kernel<true><<<grid, kThreads, 0, st>>>(xp, yp, n, scale_inv);
  else
    dequantize_kernel<false><<<grid, kThreads, 0, st>>>(xp, yp, n, scale_inv);
  return NT_CUDA_LAUNCHED(ctx);
}
