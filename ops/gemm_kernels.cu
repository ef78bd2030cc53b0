/* Epilogues that cuBLASLt cannot fuse for a given case (odd aux leading dims, bias dtypes it
 * rejects, alpha != 1 with a bias gradient, ...), and the accumulation of the fused bias
 * gradient. Elementwise, fp32 arithmetic, results rounded once to the storage dtype. Also the
 * result checksums the autotuner compares kernels with. */
#include "ops/gemm_internal.h"
#include "core/cuda_util.h"
#include "ops/cuda_dtype.cuh"
#include "ops/memops_cuda.cuh"
#include "core/memory.h"
#include "ops/gelu_rule.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

int blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (int)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

template <typename T>
__global__ void bias_act_kernel(T *d, int64_t d_m, int64_t d_batch, T *aux, int64_t x_m,
                                int64_t x_batch, const void *bias, bool bias_f32, int64_t M,
                                int64_t N, int64_t total, int act) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i % N, r = i / N, m = r % M, b = r / M;
    T *dp = d + b * d_batch + m * d_m + n;
    float x = nt_to_f(*dp);
    if (bias) x += bias_f32 ? ((const float *)bias)[n] : nt_to_f(((const T *)bias)[n]);
    if (aux) aux[b * x_batch + m * x_m + n] = nt_from_f<T>(x);
    if (act == NT_GEMMK_ACT_RELU) {
      x = x > 0.0f ? x : 0.0f;
    } else if (act == NT_GEMMK_ACT_GELU) {
      x = nt_gelu(x);
    }
    *dp = nt_from_f<T>(x);
  }
}

template <typename T>
__global__ void dgelu_kernel(T *d, int64_t d_m, const T *aux, int64_t x_m, int64_t N,
                             int64_t total) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i % N, m = i / N;
    T *dp = d + m * d_m + n;
    *dp = nt_from_f<T>(nt_to_f(*dp) * nt_gelu_grad(nt_to_f(aux[m * x_m + n])));
  }
}

/* Column sums, stage 1. Block (tile, chunk) of 8 warps covers columns tile*256 .. +256 and the
 * rows of its chunk; warp w takes every 8th row from the chunk's w-th. A lane owns 8 columns:
 * 8 consecutive ones read as one 16-byte pack (VEC), or lane, lane+32, ... otherwise. The warps'
 * sums meet in shared memory in warp order: partial[chunk][n], a fixed order throughout. */
constexpr int kColTile = 256, kColWarps = 8;

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * kColWarps)
    colsum_partial_kernel(const T *__restrict__ a, int64_t a_m, int64_t M, int64_t N,
                          int64_t rows_per_chunk, float *__restrict__ partial) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  __shared__ float sm[kColWarps][kColTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = (int64_t)blockIdx.x * kColTile;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk;
  if (r1 > M) r1 = M;
  float acc[NT_PACK];
#pragma unroll
  for (int i = 0; i < NT_PACK; i++) acc[i] = 0.0f;
  if (VEC) {
    const int64_t n = n0 + lane * NT_PACK;
    if (n < N) {
#pragma unroll 4
      for (int64_t r = r0 + warp; r < r1; r += kColWarps) {
        float v[NT_PACK];
        nt_load8(a + r * a_m + n, v);
#pragma unroll
        for (int i = 0; i < NT_PACK; i++) acc[i] += v[i];
      }
    }
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) sm[warp][lane * NT_PACK + i] = acc[i];
  } else {
#pragma unroll 2
    for (int64_t r = r0 + warp; r < r1; r += kColWarps) {
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) {
        int64_t n = n0 + i * 32 + lane;
        if (n < N) acc[i] += nt_to_f(a[r * a_m + n]);
      }
    }
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) sm[warp][i * 32 + lane] = acc[i];
  }
  __syncthreads();
  const int64_t n = n0 + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kColWarps; w++) s += sm[w][threadIdx.x];
  partial[(int64_t)blockIdx.y * N + n] = s;
}

/* Stage 2: out[n] += the chunks' partials in order. Block of 8 warps over 32 columns: warp w
 * sums chunks w, w+8, ... (independent loads, several in flight), then warp 0 adds the 8 warp
 * sums in order. */
__global__ void __launch_bounds__(32 * kColWarps)
    colsum_finish_kernel(int64_t N, int nchunks, const float *__restrict__ partial,
                         float *__restrict__ out) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  __shared__ float sm[kColWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = (int64_t)blockIdx.x * 32 + lane;
  float s = 0.0f;
  if (n < N) {
#pragma unroll 8
    for (int c = warp; c < nchunks; c += kColWarps) s += partial[(int64_t)c * N + n];
  }
  sm[warp][lane] = s;
  __syncthreads();
  if (warp || n >= N) return;
  s = 0.0f;
#pragma unroll
  for (int w = 0; w < kColWarps; w++) s += sm[w][lane];
  out[n] += s;
}

template <typename T>
nt_status colsum_launch(nt_ctx *ctx, const T *a, int64_t a_m, int64_t M, int64_t N, float *out) {
  const int64_t tiles = (N + kColTile - 1) / kColTile;
  /* About four blocks per SM in all, chunks of at least 64 rows. */
  int64_t chunks = (4 * (int64_t)nt_sm_count(ctx) + tiles - 1) / tiles;
  int64_t most = (M + 63) / 64;
  if (chunks > most) chunks = most;
  if (chunks < 1) chunks = 1;
  if (chunks > 65535) chunks = 65535;
  const int64_t rpc = (M + chunks - 1) / chunks;
  chunks = (M + rpc - 1) / rpc;
  float *partial = nullptr;
  nt_status st = nt_alloc(ctx, (size_t)(chunks * N) * sizeof(float), (void **)&partial);
  if (st) return st;
  cudaStream_t s = nt_cuda_stream(ctx);
  bool vec = N % NT_PACK == 0 && a_m % NT_PACK == 0 && nt_aligned16(a);
  dim3 grid((unsigned)tiles, (unsigned)chunks);
  auto kernel = vec ? colsum_partial_kernel<T, true> : colsum_partial_kernel<T, false>;
  pdl_launch(nt_pdl_on(ctx), kernel, grid, dim3(32 * kColWarps), 0, s, a, a_m, M, N, rpc, partial);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st) st = nt_gemmk_colsum_finish(ctx, partial, chunks, N, out);
  nt_free(ctx, partial); /* stream-ordered: reused only by later work on this stream */
  return st;
}

/* One block per row (grid-stride), threads along the row; fp64 sums, reduced per warp and
 * added atomically (the order of addition varies, by far less than any tolerance). */
template <typename T>
__global__ void checksum_kernel(const T *d, int64_t d_m, int64_t d_batch, int64_t M, int64_t N,
                                int64_t rows, double *sums) {
  double acc[NT_GEMM_NSUMS];
  for (int j = 0; j < NT_GEMM_NSUMS; j++) acc[j] = 0.0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int64_t b = r / M, m = r - b * M;
    const T *row = d + b * d_batch + m * d_m;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      double x = (double)nt_to_f(row[n]);
      uint64_t h = nt_gemm_mix64((uint64_t)(r * N + n));
      acc[0] += x * x;
#pragma unroll
      for (int j = 0; j < NT_GEMM_NPROJ; j++) acc[1 + j] += ((h >> j) & 1) ? -x : x;
    }
  }
#pragma unroll
  for (int j = 0; j < NT_GEMM_NSUMS; j++) {
    double v = acc[j];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sums + j, v);
  }
}

nt_status bad_dtype(nt_ctx *ctx, nt_dtype dt, const char *what) {
  return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm %s: dtype %s not supported", what, nt_dtype_name(dt));
}

}  // namespace

nt_status nt_gemmk_bias_act(nt_ctx *ctx, nt_dtype dt, void *d, int64_t d_m, int64_t d_batch,
                            void *aux, int64_t x_m, int64_t x_batch, const void *bias,
                            nt_dtype bias_dt, int64_t M, int64_t N, int64_t batch,
                            nt_gemmk_act act) {
  int64_t total = M * N * batch;
  int th = 256, bl = blocks_for(total, th);
  cudaStream_t s = nt_cuda_stream(ctx);
  bool bf32 = bias_dt == NT_F32;
  switch (dt) {
    case NT_F32:
      bias_act_kernel<float><<<bl, th, 0, s>>>((float *)d, d_m, d_batch, (float *)aux, x_m,
                                               x_batch, bias, bf32, M, N, total, (int)act);
      break;
    case NT_F16:
      bias_act_kernel<__half><<<bl, th, 0, s>>>((__half *)d, d_m, d_batch, (__half *)aux, x_m,
                                                x_batch, bias, bf32, M, N, total, (int)act);
      break;
    case NT_BF16:
      bias_act_kernel<__nv_bfloat16><<<bl, th, 0, s>>>((__nv_bfloat16 *)d, d_m, d_batch,
                                                       (__nv_bfloat16 *)aux, x_m, x_batch, bias,
                                                       bf32, M, N, total, (int)act);
      break;
    default: return bad_dtype(ctx, dt, "epilogue");
  }
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_gemmk_dgelu(nt_ctx *ctx, nt_dtype dt, void *d, int64_t d_m, const void *aux,
                         int64_t x_m, int64_t M, int64_t N) {
  int64_t total = M * N;
  int th = 256, bl = blocks_for(total, th);
  cudaStream_t s = nt_cuda_stream(ctx);
  switch (dt) {
    case NT_F32:
      dgelu_kernel<float><<<bl, th, 0, s>>>((float *)d, d_m, (const float *)aux, x_m, N, total);
      break;
    case NT_F16:
      dgelu_kernel<__half><<<bl, th, 0, s>>>((__half *)d, d_m, (const __half *)aux, x_m, N, total);
      break;
    case NT_BF16:
      dgelu_kernel<__nv_bfloat16><<<bl, th, 0, s>>>((__nv_bfloat16 *)d, d_m,
                                                    (const __nv_bfloat16 *)aux, x_m, N, total);
      break;
    default: return bad_dtype(ctx, dt, "DGELU epilogue");
  }
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_gemmk_colsum_add(nt_ctx *ctx, nt_dtype dt, const void *a, int64_t a_m, int64_t M,
                              int64_t N, float *out) {
  if (M <= 0 || N <= 0) return NT_OK;
  switch (dt) {
    case NT_F32: return colsum_launch<float>(ctx, (const float *)a, a_m, M, N, out);
    case NT_F16: return colsum_launch<__half>(ctx, (const __half *)a, a_m, M, N, out);
    case NT_BF16:
      return colsum_launch<__nv_bfloat16>(ctx, (const __nv_bfloat16 *)a, a_m, M, N, out);
    default: return bad_dtype(ctx, dt, "bias gradient");
  }
}

nt_status nt_gemmk_colsum_finish(nt_ctx *ctx, const float *partial, int64_t nchunks, int64_t N,
                                 float *out) {
  if (N <= 0) return NT_OK;
  if (nchunks > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "column sums: %lld partial rows", (long long)nchunks);
  pdl_launch(nt_pdl_on(ctx), colsum_finish_kernel, dim3((unsigned)((N + 31) / 32)),
             dim3(32 * kColWarps), 0, nt_cuda_stream(ctx), N, (int)nchunks, partial, out);
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_gemmk_checksum(nt_ctx *ctx, nt_dtype dt, const void *d, int64_t d_m,
                            int64_t d_batch, int64_t M, int64_t N, int64_t batch, double *sums) {
  cudaStream_t s = nt_cuda_stream(ctx);
  nt_status st = NT_CUDA(ctx, cudaMemsetAsync(sums, 0, NT_GEMM_NSUMS * sizeof(double), s));
  if (st) return st;
  int64_t rows = M * batch;
  if (rows <= 0 || N <= 0) return NT_OK;
  int th = 256, bl = (int)(rows < 2048 ? rows : 2048);
  switch (dt) {
    case NT_F32:
      checksum_kernel<float><<<bl, th, 0, s>>>((const float *)d, d_m, d_batch, M, N, rows, sums);
      break;
    case NT_F16:
      checksum_kernel<__half><<<bl, th, 0, s>>>((const __half *)d, d_m, d_batch, M, N, rows,
                                                sums);
      break;
    case NT_BF16:
      checksum_kernel<__nv_bfloat16><<<bl, th, 0, s>>>((const __nv_bfloat16 *)d, d_m, d_batch, M,
                                                       N, rows, sums);
      break;
    default: return bad_dtype(ctx, dt, "checksum");
  }
  return NT_CUDA_LAUNCHED(ctx);
}
