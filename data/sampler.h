/* DistributedSampler (torch.utils.data.distributed) arithmetic, as docs/semantics.md states it:
 *   num_samples = ceil(len / R); with drop_last and len % R != 0: ceil((len - R) / R)
 *   total = num_samples * R
 *   the index list 0..len-1, shuffled (when shuffle) by a generator seeded seed + epoch, the
 *   same on every rank; without drop_last padded to `total` by repeating from the start
 *   (cyclically if the padding is longer than the list); with drop_last cut to `total`;
 *   rank r takes the entries r, r + R, r + 2R, ...
 * The shuffle is Fisher-Yates (from the last position down: swap i with j uniform in [0, i])
 * driven by splitmix64 seeded with seed + epoch; j = x % (i + 1), rejecting the few x of the
 * top partial range so it is exactly uniform. It is deterministic on every platform; it does
 * NOT reproduce torch.randperm's order. Call nt_sampler_set_epoch before each epoch or every
 * epoch repeats one order. */
#ifndef NT_DATA_SAMPLER_H
#define NT_DATA_SAMPLER_H
#include <stdbool.h>
#include <stdint.h>
#include "core/ctx.h"
NT_EXTERN_C_BEGIN

typedef struct {
  int64_t len;          /* dataset size */
  int rank, world_size;
  bool shuffle, drop_last;
  uint64_t seed, epoch;
  int64_t num_samples;  /* indices this rank draws per epoch */
  int64_t total;        /* num_samples * world_size */
} nt_sampler;

/* Checks len > 0, world_size >= 1, 0 <= rank < world_size, and that drop_last leaves each rank
 * at least one sample (len >= world_size); each failure is NT_ERR_INVALID_ARG. */
nt_status nt_sampler_init(nt_ctx *ctx, nt_sampler *s, int64_t len, int rank, int world_size,
                          bool shuffle, uint64_t seed, bool drop_last);
void nt_sampler_set_epoch(nt_sampler *s, uint64_t epoch);
/* num_samples and total for a layout, without a sampler. */
int64_t nt_sampler_num_samples(int64_t len, int world_size, bool drop_last);
/* This rank's indices for the current epoch: out[0 .. num_samples). `scratch` holds `len`
 * int64 (NULL: allocated here; NT_ERR_OOM if that fails). */
nt_status nt_sampler_indices(nt_ctx *ctx, const nt_sampler *s, int64_t *out, int64_t *scratch);

/* The generator behind the shuffle, for reuse (transforms draw from it too). */
uint64_t nt_splitmix64(uint64_t *state);
/* Uniform in [0, bound) from the splitmix64 stream (bound > 0). */
uint64_t nt_splitmix64_below(uint64_t *state, uint64_t bound);
/* Fisher-Yates permutation of 0..n-1 from `seed`, into perm. */
void nt_randperm(int64_t n, uint64_t seed, int64_t *perm);

NT_EXTERN_C_END
#endif
