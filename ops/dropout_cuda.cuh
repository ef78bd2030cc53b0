/* Private device helpers for dropout's mask, shared by the dropout kernels and the ops that
 * apply the same mask inside another pass (LayerNorm's backward): element e of a stream at
 * `offset` keeps its value when number offset + e of Philox4x32-10 under `seed`, mapped to
 * (0, 1], is above p (ops/dropout.h; the CPU's nt_rng_u32 and nt_rng_u32_to_uniform). */
#ifndef NT_OPS_DROPOUT_CUDA_CUH
#define NT_OPS_DROPOUT_CUDA_CUH
#include <curand_philox4x32_x.h>
#include <stdint.h>

/* Same arithmetic as nt_rng_u32_to_uniform (cuRAND's mapping to (0, 1], as one FMA). */
__device__ __forceinline__ float nt_u32_to_uniform(unsigned int x) {
  const float inv = 0x1p-32f;
  return __fmaf_rn((float)x, inv, inv / 2.0f);
}

/* Numbers first..first+3 of the stream (first a multiple of 4): Philox4x32-10 of counter
 * first / 4 under key seed, as curand_init(seed, 0, first) + curand4 would return them. */
__device__ __forceinline__ uint4 nt_philox_block(uint64_t seed, uint64_t first) {
  uint64_t block = first >> 2;
  return curand_Philox4x32_10(make_uint4((unsigned)block, (unsigned)(block >> 32), 0u, 0u),
                              make_uint2((unsigned)seed, (unsigned)(seed >> 32)));
}

/* keep[i] for the 8 elements first..first+7 (first a multiple of 4). */
__device__ __forceinline__ void nt_dropout_keep8(uint64_t seed, uint64_t first, float p,
                                                 bool keep[8]) {
  uint4 r0 = nt_philox_block(seed, first), r1 = nt_philox_block(seed, first + 4);
  unsigned int r[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
  for (int i = 0; i < 8; i++) keep[i] = nt_u32_to_uniform(r[i]) > p;
}

#endif
