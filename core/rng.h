/* Counter-based RNG: Philox4x32-10 exactly as cuRAND's curand_init(seed, 0, offset) +
 * curand() sequence, so a CPU run and a GPU run draw the same 32-bit numbers for the same
 * (seed, offset). Number i of the stream is word (i % 4) of Philox(key = seed,
 * counter = i / 4). */
#ifndef NT_RNG_H
#define NT_RNG_H
#include <stdint.h>
#include "core/status.h"
#include "core/tensor.h"
NT_EXTERN_C_BEGIN

/* One Philox4x32-10 block: counter (4 words) and key (2 words) -> 4 words. */
void nt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Number `index` of the stream for `seed` (as curand() would return it). */
uint32_t nt_rng_u32(uint64_t seed, uint64_t index);
/* curand_uniform's mapping of a 32-bit number to (0, 1]. */
float nt_rng_u32_to_uniform(uint32_t x);

/* Fills an F32 tensor with uniform (0,1] numbers index offset .. offset+numel-1 of the stream,
 * on the tensor's device. */
nt_status nt_rng_uniform(nt_ctx *ctx, nt_tensor *out, uint64_t seed, uint64_t offset);
/* Normal(mean, std) by Box-Muller on pairs of numbers (as curand_normal2). CPU and GPU agree
 * to a few ulp (the GPU's logf/sincos differ in the last bits). */
nt_status nt_rng_normal(nt_ctx *ctx, nt_tensor *out, uint64_t seed, uint64_t offset,
                        float mean, float std);

NT_EXTERN_C_END
#endif
