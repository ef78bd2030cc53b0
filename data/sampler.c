#include "data/sampler.h"
#include <stdlib.h>

uint64_t nt_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Rejection of the top partial range keeps the modulo exactly uniform. */
uint64_t nt_splitmix64_below(uint64_t *state, uint64_t bound) {
  uint64_t reject_from = UINT64_MAX - UINT64_MAX % bound;  /* a multiple of bound */
  uint64_t x;
  do {
    x = nt_splitmix64(state);
  } while (x >= reject_from);
  return x % bound;
}

void nt_randperm(int64_t n, uint64_t seed, int64_t *perm) {
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)nt_splitmix64_below(&state, (uint64_t)i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

int64_t nt_sampler_num_samples(int64_t len, int world_size, bool drop_last) {
  if (drop_last && len % world_size != 0)
    return (len - world_size + world_size - 1) / world_size;  /* ceil((len - R) / R) */
  return (len + world_size - 1) / world_size;
}

nt_status nt_sampler_init(nt_ctx *ctx, nt_sampler *s, int64_t len, int rank, int world_size,
                          bool shuffle, uint64_t seed, bool drop_last) {
  if (len <= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "sampler: empty dataset (len %lld)", (long long)len);
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "sampler: rank %d outside [0, world_size %d)", rank,
                    world_size);
  int64_t ns = nt_sampler_num_samples(len, world_size, drop_last);
  if (ns <= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "sampler: drop_last with %lld samples over %d ranks leaves no samples",
                    (long long)len, world_size);
  s->len = len;
  s->rank = rank;
  s->world_size = world_size;
  s->shuffle = shuffle;
  s->drop_last = drop_last;
  s->seed = seed;
  s->epoch = 0;
  s->num_samples = ns;
  s->total = ns * world_size;
  return NT_OK;
}

void nt_sampler_set_epoch(nt_sampler *s, uint64_t epoch) { s->epoch = epoch; }

nt_status nt_sampler_indices(nt_ctx *ctx, const nt_sampler *s, int64_t *out, int64_t *scratch) {
  int64_t *list = scratch ? scratch : malloc((size_t)s->len * sizeof *list);
  if (!list)
    return NT_ERROR(ctx, NT_ERR_OOM, "sampler: out of memory for %lld indices", (long long)s->len);
  if (s->shuffle) {
    nt_randperm(s->len, s->seed + s->epoch, list);
  } else {
    for (int64_t i = 0; i < s->len; i++) list[i] = i;
  }
  /* Entry k of the padded (or cut) list of `total` is list[k % len]: padding repeats from the
   * start; with drop_last total <= len, so k < len. */
  for (int64_t i = 0; i < s->num_samples; i++) {
    int64_t k = s->rank + i * (int64_t)s->world_size;
    out[i] = list[k % s->len];
  }
  if (!scratch) free(list);
  return NT_OK;
}
