/* FP8 quantization kernels. Both forms compute the tensor's amax in the same pass: a NaN-aware
 * max per thread, a block reduction, then one atomicMax per block on the float's bits (a
 * non-negative float orders like its bit pattern read as an int; NaN, normalised to 0x7fc00000,
 * sits above inf and so wins, as the delayed-scaling update expects).
 *   plain:      each thread makes 16 output bytes of a row: 16-byte loads (two 8-element packs)
 *               when the row is aligned, one 16-byte store.
 *   transposed: 64x64 tiles through shared memory (written transposed there), so both the
 *               global reads (along x's rows; 16-byte packs when the tile's columns all exist
 *               and rows are aligned) and the 16-byte writes (along y's rows) are coalesced. */
#include "ops/memops_cuda.cuh"
#include <cuda_fp8.h>

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;
constexpr int kPitch = kTile + 16;  /* bytes per shared row: keeps 16-byte rows aligned */

template <bool E4M3> __device__ __forceinline__ uint8_t to_fp8(float v) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float nan_max(float m, float v) {
  if (m != m) return m;
  return (v != v || v > m) ? v : m;
}

/* Block-wide NaN-aware max, then one atomic into *amax. */
__device__ __forceinline__ void block_amax(float m, float *amax) {
  __shared__ float red[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) v = nan_max(v, red[w]);
    int bits = v != v ? 0x7fc00000 : __float_as_int(v);
    atomicMax(reinterpret_cast<int *>(amax), bits);
  }
}

template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
quantize_rows(const T *x, int64_t ldx, int64_t R, int64_t C, uint8_t *y, int64_t yr, int64_t yc,
              const float *scale, float *amax, bool vec_in, bool vec_out) {
  const float s = *scale;
  const int64_t groups = (yc + 15) / 16;
  float m = 0.0f;
  for (int64_t g = (int64_t)blockIdx.x * kThreads + threadIdx.x; g < yr * groups;
       g += (int64_t)gridDim.x * kThreads) {
    int64_t r = g / groups, c0 = (g % groups) * 16;
    float v[16];
    if (r < R && vec_in && c0 + 16 <= C) {
      nt_load8(x + r * ldx + c0, v);
      nt_load8(x + r * ldx + c0 + 8, v + 8);
    } else {
#pragma unroll
      for (int j = 0; j < 16; j++)
        v[j] = (r < R && c0 + j < C) ? nt_to_f(x[r * ldx + c0 + j]) : 0.0f;
    }
    union { uint4 w; uint8_t b[16]; } q;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      m = nan_max(m, fabsf(v[j]));
      /* Padding is 0 whatever the scale; the image of x is fp8(x * scale). */
      q.b[j] = (r < R && c0 + j < C) ? to_fp8<E4M3>(v[j] * s) : (uint8_t)0;
    }
    uint8_t *out = y + r * yc + c0;
    if (vec_out) {
      *reinterpret_cast<uint4 *>(out) = q.w;
    } else {
      for (int j = 0; j < 16 && c0 + j < yc; j++) out[j] = q.b[j];
    }
  }
  if (amax) block_amax(m, amax);
}

/* Block (bx, by) makes y rows [by*64, +64) (x's columns) x y columns [bx*64, +64) (x's rows). */
template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
quantize_transposed(const T *x, int64_t ldx, int64_t R, int64_t C, uint8_t *y, int64_t yr,
                    int64_t yc, const float *scale, float *amax, bool vec_in, bool vec_out) {
  __shared__ __align__(16) uint8_t tile[kTile * kPitch];
  const float s = *scale;
  const int64_t r0 = (int64_t)blockIdx.x * kTile, c0 = (int64_t)blockIdx.y * kTile;
  float m = 0.0f;
  if (vec_in && c0 + kTile <= C) {
    /* The tile's columns all exist: 8-element packs (16-byte loads), 8 threads per row. */
    for (int p = threadIdx.x; p < kTile * (kTile / 8); p += kThreads) {
      int rr = p / (kTile / 8), cc0 = (p % (kTile / 8)) * 8;
      int64_t r = r0 + rr;
      float v[8];
      if (r < R) nt_load8(x + r * ldx + c0 + cc0, v);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        uint8_t q = 0;
        if (r < R) {
          m = nan_max(m, fabsf(v[j]));
          q = to_fp8<E4M3>(v[j] * s);
        }
        tile[(cc0 + j) * kPitch + rr] = q;
      }
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      int rr = i / kTile, cc = i % kTile;
      int64_t r = r0 + rr, c = c0 + cc;
      uint8_t q = 0;
      if (r < R && c < C) {
        float v = nt_to_f(x[r * ldx + c]);
        m = nan_max(m, fabsf(v));
        q = to_fp8<E4M3>(v * s);
      }
      tile[cc * kPitch + rr] = q;
    }
  }
  __syncthreads();
  /* 64 rows of y x 4 segments of 16 bytes = 256 threads. */
  int cc = threadIdx.x >> 2, seg = (threadIdx.x & 3) * 16;
  int64_t row = c0 + cc, col = r0 + seg;
  if (row < yr && col < yc) {
    const uint8_t *src = tile + cc * kPitch + seg;
    uint8_t *out = y + row * yc + col;
    if (vec_out && col + 16 <= yc) {
      *reinterpret_cast<uint4 *>(out) = *reinterpret_cast<const uint4 *>(src);
    } else {
      for (int j = 0; j < 16 && col + j < yc; j++) out[j] = src[j];
    }
  }
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

template <typename T, bool E4M3>
void launch(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, bool transpose, const float *scale,
            float *amax) {
  const T *xp = (const T *)x->data;
  uint8_t *yp = (uint8_t *)y->data;
  int64_t R = x->shape[0], C = x->shape[1], ldx = x->stride[0];
  int64_t yr = y->shape[0], yc = y->shape[1];
  bool vec_out = nt_aligned16(yp) && yc % 16 == 0;
  bool vec_in = nt_aligned16(xp) && (ldx * (int64_t)sizeof(T)) % 16 == 0;
  cudaStream_t st = nt_cuda_stream(ctx);
  if (transpose) {
    dim3 grid((unsigned)((yc + kTile - 1) / kTile), (unsigned)((yr + kTile - 1) / kTile));
    quantize_transposed<T, E4M3><<<grid, kThreads, 0, st>>>(xp, ldx, R, C, yp, yr, yc, scale,
                                                           amax, vec_in, vec_out);
  } else {
    int64_t work = yr * ((yc + 15) / 16);
    quantize_rows<T, E4M3><<<grid_for(ctx, work), kThreads, 0, st>>>(xp, ldx, R, C, yp, yr, yc,
                                                                     scale, amax, vec_in, vec_out);
  }
}

}  // namespace

extern "C" nt_status nt_fp8_quantize_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                          bool transpose, const float *scale, float *amax) {
  if (transpose && ((y->shape[0] + kTile - 1) / kTile > 65535))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                    "fp8 quantize: transposed output of %lld rows is beyond the grid's reach",
                    (long long)y->shape[0]);
  bool e4m3 = y->dtype == NT_FP8_E4M3;
  NT_DISPATCH_FLOAT(x->dtype, T,
                    if (e4m3) launch<T, true>(ctx, x, y, transpose, scale, amax);
                    else launch<T, false>(ctx, x, y, transpose, scale, amax));
  return NT_CUDA_LAUNCHED(ctx);
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
