/* Random fills on the GPU with cuRAND's device API (Philox4_32_10), so the GPU side is cuRAND
 * itself and rng.c reproduces it. Each thread draws one group of four consecutive numbers of
 * the stream: curand_init(seed, 0, offset + 4t) is a counter set-up for Philox (no long
 * skip-ahead), and one curand_uniform4 / curand_normal4 call yields the four results.
 *
 * cuRAND computes the next Philox block eagerly (curand4 prefetches it, curand_init computes
 * one per skip). When the offset is a multiple of 4 the kernels instead start from
 * curand_init(seed, 0, 0) and skipahead(4 * block): the compiler then sees that the position
 * inside the block is 0 and drops every block but the one used, one Philox per thread instead
 * of two. The numbers are the same either way. */
#include <cuda_runtime.h>
#include <curand_kernel.h>
#include <stdint.h>
#include "core/rng.h"
#include "core/ctx_internal.h"
#include "core/cuda_util.h"

namespace {

/* Writes v (elements base .. base + 3) where they exist; one 16-byte store when possible. */
__device__ void store4(float *out, int64_t base, int64_t n, float4 v) {
  if (base + 4 <= n && (uintptr_t)(out + base) % 16 == 0) {
    *reinterpret_cast<float4 *>(out + base) = v;
    return;
  }
  float w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4 && base + k < n; k++) out[base + k] = w[k];
}

/* State at number offset + base of the stream (base is a multiple of 4). */
template <bool ALIGNED>
__device__ void init_at(curandStatePhilox4_32_10_t *state, unsigned long long seed,
                        unsigned long long offset, int64_t base) {
  if (ALIGNED) {
    curand_init(seed, 0ull, 0ull, state);
    skipahead(4ull * ((offset >> 2) + ((unsigned long long)base >> 2)), state);
  } else {
    curand_init(seed, 0ull, offset + (unsigned long long)base, state);
  }
}

template <bool ALIGNED>
__global__ void uniform_kernel(float *out, int64_t n, unsigned long long seed,
                               unsigned long long offset) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
  for (int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; base < n;
       base += stride) {
    curandStatePhilox4_32_10_t state;
    init_at<ALIGNED>(&state, seed, offset, base);
    store4(out, base, n, curand_uniform4(&state));
  }
}

template <bool ALIGNED>
__global__ void normal_kernel(float *out, int64_t n, unsigned long long seed,
                              unsigned long long offset, float mean, float std) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
  for (int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; base < n;
       base += stride) {
    curandStatePhilox4_32_10_t state;
    init_at<ALIGNED>(&state, seed, offset, base);
    float4 z = curand_normal4(&state);
    float4 v = make_float4(fmaf(z.x, std, mean), fmaf(z.y, std, mean), fmaf(z.z, std, mean),
                           fmaf(z.w, std, mean));
    store4(out, base, n, v);
  }
}

/* The per-step RNG base (core/ctx.h): written only by these one-thread kernels, read by the
 * random ops' kernels later on the same stream. */
__global__ void base_set_kernel(unsigned long long *base, unsigned long long value) {
  *base = value;
}

__global__ void base_add_kernel(unsigned long long *base, unsigned long long n) { *base += n; }

unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = ((n + 3) / 4 + threads - 1) / threads;
  return (unsigned)(blocks > 65536 ? 65536 : blocks);  /* grid-stride beyond this */
}

}  // namespace

/* Called only by nt_rng_uniform / nt_rng_normal (rng.c) after their argument checks. */
extern "C" nt_status nt_rng_uniform_cuda(nt_ctx *ctx, float *out, int64_t n, uint64_t seed,
                                         uint64_t offset) {
  const int threads = 256;
  cudaStream_t s = nt_cuda_stream(ctx);
  if (offset % 4 == 0)
    uniform_kernel<true><<<grid_for(n, threads), threads, 0, s>>>(out, n, seed, offset);
  else
    uniform_kernel<false><<<grid_for(n, threads), threads, 0, s>>>(out, n, seed, offset);
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_rng_normal_cuda(nt_ctx *ctx, float *out, int64_t n, uint64_t seed,
                                        uint64_t offset, float mean, float std) {
  const int threads = 256;
  cudaStream_t s = nt_cuda_stream(ctx);
  if (offset % 4 == 0)
    normal_kernel<true><<<grid_for(n, threads), threads, 0, s>>>(out, n, seed, offset, mean, std);
  else
    normal_kernel<false><<<grid_for(n, threads), threads, 0, s>>>(out, n, seed, offset, mean, std);
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_rng_base_set_cuda(nt_ctx *ctx, uint64_t *base, uint64_t value) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  base_set_kernel<<<1, 1, 0, nt_cuda_stream(ctx)>>>((unsigned long long *)base, value);
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_rng_base_add_cuda(nt_ctx *ctx, uint64_t *base, uint64_t n) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  base_add_kernel<<<1, 1, 0, nt_cuda_stream(ctx)>>>((unsigned long long *)base, n);
  return NT_CUDA_LAUNCHED(ctx);
}
