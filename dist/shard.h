/* Sharding arithmetic for flat per-unit buffers (header only).
 *
 * A unit of `numel` elements is padded to the next multiple of the world size W
 * (padded = ceil(numel / W) * W) so that every rank owns the same number of elements,
 * shard = padded / W, as NCCL's reduce-scatter and all-gather require. Rank r owns
 * [lo, hi) = [r * shard, (r + 1) * shard) of the padded buffer; of those, [lo, real_hi) with
 * real_hi = min(hi, numel) are parameters and the rest is padding (zero weights, zero
 * gradients). Padding is left out of norms, inf checks and checkpoints: use the real range
 * for those. The optimizer may run over the whole owned range (its padding stays zero under
 * AdamW and SGD: the gradients and weights there are zero). */
#ifndef NT_DIST_SHARD_H
#define NT_DIST_SHARD_H
#include <stdint.h>
#include <stdbool.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

/* PyTorch FSDP's sharding strategies and the ZeRO stages they correspond to (docs/sharding.md):
 * NO_SHARD = DDP, SHARD_GRAD_OP = ZeRO-2, FULL_SHARD = ZeRO-3. */
typedef enum { NT_SHARD_NO_SHARD = 0, NT_SHARD_GRAD_OP, NT_SHARD_FULL } nt_sharding;
/* Accepts the FSDP names and DP / ZERO2 / ZERO3, case-insensitively. */
bool nt_sharding_parse(const char *s, nt_sharding *out);
const char *nt_sharding_name(nt_sharding s);

typedef struct {
  int64_t numel;     /* real elements of the unit */
  int64_t padded;    /* numel rounded up to a multiple of the world size (>= world) */
  int64_t shard;     /* padded / world: elements every rank owns */
  int64_t lo, hi;    /* this rank's owned range of the padded buffer */
  int64_t real_hi;   /* min(hi, numel); real_hi <= lo: the rank owns only padding */
} nt_shard_layout;

static inline nt_shard_layout nt_shard_layout_of(int64_t numel, int rank, int world) {
  nt_shard_layout s;
  int64_t w = world < 1 ? 1 : world;
  s.numel = numel;
  s.shard = numel > 0 ? (numel + w - 1) / w : 1;
  s.padded = s.shard * w;
  s.lo = s.shard * rank;
  s.hi = s.lo + s.shard;
  s.real_hi = s.hi < numel ? s.hi : numel;
  return s;
}

/* Real (non-padding) elements this rank owns. */
static inline int64_t nt_shard_real(const nt_shard_layout *s) {
  return s->real_hi > s->lo ? s->real_hi - s->lo : 0;
}

/* The part of the unit's element range [off, off + len) that this rank owns, as an offset into
 * the rank's shard: false when the intersection is empty. */
static inline bool nt_shard_intersect(const nt_shard_layout *s, int64_t off, int64_t len,
                                      int64_t *local_off, int64_t *local_len) {
  int64_t a = off > s->lo ? off : s->lo;
  int64_t b = off + len < s->real_hi ? off + len : s->real_hi;
  if (b <= a) return false;
  *local_off = a - s->lo;
  *local_len = b - a;
  return true;
}

/* A 1-D view of elements [off, off + len) of a contiguous tensor. */
static inline nt_tensor nt_flat_view(const nt_tensor *t, int64_t off, int64_t len) {
  char *base = (char *)t->data + (size_t)off * nt_dtype_size(t->dtype);
  return nt_tensor_view(t->data ? base : NULL, t->dtype, t->device, 1, &len);
}

NT_EXTERN_C_END
#endif
