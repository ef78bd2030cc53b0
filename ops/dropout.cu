/* Dropout with cuRAND's Philox4x32-10: element i uses number offset + i of the stream, exactly
 * as the CPU's nt_rng_u32(seed, offset + i); offset is a multiple of 4, so elements 4j..4j+3
 * are the four words of one Philox block (counter (offset + 4j) / 4, key seed). Inside an RNG
 * step the kernel adds the step base, read from device memory when it runs (core/ctx.h). */
#include "ops/memops_cuda.cuh"
#include <curand_philox4x32_x.h>

namespace {

/* Same arithmetic as nt_rng_u32_to_uniform (cuRAND's mapping to (0, 1], as one FMA). */
__device__ __forceinline__ float u32_to_uniform(unsigned int x) {
  const float inv = 0x1p-32f;
  return __fmaf_rn((float)x, inv, inv / 2.0f);
}

/* Numbers first..first+3 of the stream (first a multiple of 4): Philox4x32-10 of counter
 * first / 4 under key seed, as curand_init(seed, 0, first) + curand4 would return them. */
__device__ __forceinline__ uint4 philox_block(uint64_t seed, uint64_t first) {
  uint64_t block = first >> 2;
  return curand_Philox4x32_10(make_uint4((unsigned)block, (unsigned)(block >> 32), 0u, 0u),
                              make_uint2((unsigned)seed, (unsigned)(seed >> 32)));
}

template <typename T, bool ACC>
__global__ void dropout_kernel(int64_t n, int64_t npacks, float p, float keep_scale,
                               uint64_t seed, uint64_t rel_offset, const uint64_t *base,
                               const T *x, T *y) {
  /* base: the step word (a multiple of 4), NULL outside a step. */
  const uint64_t offset = rel_offset + (base ? *base : 0);
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t k = tid; k < npacks; k += stride) {
    int64_t e = k * NT_PACK;
    uint4 r0 = philox_block(seed, offset + (uint64_t)e);
    uint4 r1 = philox_block(seed, offset + (uint64_t)e + 4);
    unsigned int r[NT_PACK] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
    float vx[NT_PACK], vy[NT_PACK];
    nt_load8(x + e, vx);
    if (ACC) nt_load8(y + e, vy);
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) {
      float v = u32_to_uniform(r[i]) > p ? vx[i] * keep_scale : 0.0f;
      vy[i] = ACC ? vy[i] + v : v;
    }
    nt_store8(y + e, vy);
  }
  /* Scalar elements: each thread takes whole groups of 4 so one Philox block serves them. */
  int64_t first = npacks * NT_PACK;
  for (int64_t g = first / 4 + tid; g * 4 < n; g += stride) {
    uint4 r = philox_block(seed, offset + (uint64_t)g * 4);
    unsigned int rr[4] = {r.x, r.y, r.z, r.w};
    for (int i = 0; i < 4 && g * 4 + i < n; i++) {
      int64_t e = g * 4 + i;
      float v = u32_to_uniform(rr[i]) > p ? nt_to_f(x[e]) * keep_scale : 0.0f;
      if (ACC) v += nt_to_f(y[e]);
      y[e] = nt_from_f<T>(v);
    }
  }
}

template <typename T>
void launch(nt_ctx *ctx, int64_t n, float p, uint64_t seed, uint64_t offset, const T *x, T *y,
            bool acc) {
  int64_t npacks = nt_aligned16(x) && nt_aligned16(y) ? n / NT_PACK : 0;
  int64_t work = npacks > 0 ? npacks : (n + 3) / 4;
  const int threads = 256;
  int64_t blocks = (work + threads - 1) / threads, cap = (int64_t)nt_sm_count(ctx) * 16;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  cudaStream_t s = nt_cuda_stream(ctx);
  const uint64_t *base = nt_ctx_rng_base(ctx);
  if (acc)
    dropout_kernel<T, true><<<(unsigned)blocks, threads, 0, s>>>(n, npacks, p, keep_scale, seed,
                                                                 offset, base, x, y);
  else
    dropout_kernel<T, false><<<(unsigned)blocks, threads, 0, s>>>(n, npacks, p, keep_scale, seed,
                                                                  offset, base, x, y);
}

} // namespace

nt_status nt_dropout_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, float p, uint64_t seed,
                          uint64_t offset, bool accumulate) {
  int64_t n = nt_tensor_numel(x);
  if (n == 0) return NT_OK;
  NT_DISPATCH_FLOAT(x->dtype, T,
                    launch<T>(ctx, n, p, seed, offset, (const T *)x->data, (T *)y->data,
                              accumulate));
  return NT_CUDA_LAUNCHED(ctx);
}
