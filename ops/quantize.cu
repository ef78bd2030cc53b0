/* FP8 quantization kernels. Every form computes the tensor's amax in the same pass: the max of
 * |x|'s bits as unsigned integers per thread (a non-negative float orders like its bit pattern,
 * and every NaN's bits lie above inf's, so a NaN wins, as the delayed-scaling update expects),
 * a block reduction, then one atomicMax per block with NaN normalised to 0x7fc00000.
 * The unit of work is 16 consecutive elements of one row of x (load_q16): 16-byte loads when
 * the row is aligned and the 16 all exist, two elements per conversion instruction
 * (__nv_cvt_float2_to_fp8x2: the same rounding as the one-element form, so the same bytes).
 *   plain:      a grid-stride loop over y's 16-byte groups, one 16-byte store each.
 *   tiles:      64x64 tiles of x, one 16-element unit per thread; the units go transposed into
 *               shared memory (a 16-byte XOR swizzle keeps both the byte writes and the 16-byte
 *               reads free of bank conflicts), from where y_t's rows leave in 16-byte stores;
 *               with a row-major output too (the dual form), each unit is also stored there
 *               directly, so x is read once for both layouts. */
#include "ops/memops_cuda.cuh"
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

/* x[r, c0 .. c0 + 16) quantized: fp8(x * s) inside x, 0 outside it (whatever the scale); |x|
 * folded into the amax bits m. vec_in: x and its row stride are 16-byte aligned. */
template <typename T, bool E4M3>
__device__ __forceinline__ uint4 load_q16(const T *x, int64_t ldx, int64_t R, int64_t C,
                                          int64_t r, int64_t c0, float s, bool vec_in,
                                          uint32_t &m) {
  float v[16];
  const bool full = r < R && c0 + 16 <= C;
  if (full && vec_in) {
    const T *p = x + r * ldx + c0;
    nt_load8(p, v);
    nt_load8(p + 8, v + 8);
  } else {
#pragma unroll
    for (int j = 0; j < 16; j++)
      v[j] = (r < R && c0 + j < C) ? nt_to_f(x[r * ldx + c0 + j]) : 0.0f;
  }
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
    store16(y, r, g * 16, load_q16<T, E4M3>(x, ldx, R, C, r, g * 16, s, vec_in, m));
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

/* Block (bx, by) covers x rows [bx*64, +64) and x columns [by*64, +64): y_t rows [by*64, +64)
 * and columns [bx*64, +64), and with ROWS the same region of yr. Thread t quantizes the unit at
 * tile row t/4, columns (t%4)*16. */
template <typename T, bool E4M3, bool ROWS>
__global__ void __launch_bounds__(kThreads)
quantize_tiles(const T *x, int64_t ldx, int64_t R, int64_t C, out8 yr, out8 yt,
               const float *scale, float *amax, bool vec_in) {
  __shared__ __align__(16) uint8_t tile[kTile * kTile];
  const float s = *scale;
  const int64_t r0 = (int64_t)blockIdx.x * kTile, c0 = (int64_t)blockIdx.y * kTile;
  const int ur = threadIdx.x >> 2, uc = (threadIdx.x & 3) * 16;
  uint32_t m = 0;
  union { uint4 w; uint8_t b[16]; } q;
  q.w = load_q16<T, E4M3>(x, ldx, R, C, r0 + ur, c0 + uc, s, vec_in, m);
  if (ROWS) store16(yr, r0 + ur, c0 + uc, q.w);
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

/* yr: the row-major output or NULL; yt: the transposed one or NULL (not both NULL). */
template <typename T, bool E4M3>
void launch(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *yr, const nt_tensor *yt,
            const float *scale, float *amax) {
  const T *xp = (const T *)x->data;
  int64_t R = x->shape[0], C = x->shape[1], ldx = x->stride[0];
  bool vec_in = nt_aligned16(xp) && (ldx * (int64_t)sizeof(T)) % 16 == 0;
  out8 orow = out_of(yr), otr = out_of(yt);
  cudaStream_t st = nt_cuda_stream(ctx);
  if (!yt) {
    int64_t work = orow.rows * ((orow.cols + 15) / 16);
    quantize_rows<T, E4M3><<<grid_for(ctx, work), kThreads, 0, st>>>(xp, ldx, R, C, orow, scale,
                                                                     amax, vec_in);
    return;
  }
  /* The tiles cover both outputs, in x's coordinates. */
  int64_t rows = otr.cols > orow.rows ? otr.cols : orow.rows;
  int64_t cols = otr.rows > orow.cols ? otr.rows : orow.cols;
  dim3 grid((unsigned)up64(rows), (unsigned)up64(cols));
  if (yr)
    quantize_tiles<T, E4M3, true><<<grid, kThreads, 0, st>>>(xp, ldx, R, C, orow, otr, scale,
                                                            amax, vec_in);
  else
    quantize_tiles<T, E4M3, false><<<grid, kThreads, 0, st>>>(xp, ldx, R, C, orow, otr, scale,
                                                             amax, vec_in);
}

nt_status quantize(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *yr, const nt_tensor *yt,
                   const float *scale, float *amax) {
  if (yt) {
    int64_t cols = yt->shape[0], rows = yt->shape[1];
    if (yr && yr->shape[1] > cols) cols = yr->shape[1];
    if (yr && yr->shape[0] > rows) rows = yr->shape[0];
    if (up64(cols) > 65535 || up64(rows) > INT32_MAX)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "fp8 quantize: a transposed output of %lld x %lld is beyond the grid's "
                      "reach", (long long)cols, (long long)rows);
  }
  bool e4m3 = (yt ? yt : yr)->dtype == NT_FP8_E4M3;
  NT_DISPATCH_FLOAT(x->dtype, T,
                    if (e4m3) launch<T, true>(ctx, x, yr, yt, scale, amax);
                    else launch<T, false>(ctx, x, yr, yt, scale, amax));
  return NT_CUDA_LAUNCHED(ctx);
}

}  // namespace

extern "C" nt_status nt_fp8_quantize_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                          bool transpose, const float *scale, float *amax) {
  return quantize(ctx, x, transpose ? nullptr : y, transpose ? y : nullptr, scale, amax);
}

extern "C" nt_status nt_fp8_quantize_dual_cuda(nt_ctx *ctx, const nt_tensor *x,
                                               nt_tensor *y_rows, nt_tensor *y_t,
                                               const float *scale, float *amax) {
  return quantize(ctx, x, y_rows, y_t, scale, amax);
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
