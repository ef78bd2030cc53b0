/* The wgmma backward's dQ accumulators, kept by the context between calls.
 *
 * The backward adds dQ with atomics into an fp32 accumulator that must be zero on entry.
 * Zeroing it in the pass before the kernel (prep_rows) is memory-bound: 50 MB of stores at
 * GPT-2's shape, 12 of that pass's 28 us on the H200. With two accumulators kept here a call
 * adds into one, which is already zero, while its main kernel, bound by the tensor cores,
 * stores the zeros of the other one for the next call.
 *
 * The host tracks, for each buffer, how much of it is zero once the queued work has run. After
 * any call: the next call's buffer is zero over what that call zeroed, the other is dirty.
 *
 * In a CUDA graph. A replay repeats the captured buffers and cannot run host code, so the pair
 * is used in a capture only when
 * - the capture was begun by nt_ctx_capture_begin (core/ctx.h), whose end calls
 *   pair_capture_end below, and
 * - the first captured call finds its buffer allocated and already zero (a captured memset
 *   would run at every replay).
 * pair_capture_end then makes each replay leave the pair as the capture found it:
 * - an even number of calls does that by itself: the last one zeroes the first one's buffer;
 * - after an odd number it adds a memset of that buffer to the capture.
 * A capture that failed ran nothing, and the state is put back as it was.
 *
 * Once any capture has begun on the context the buffers are never freed or allocated again,
 * until the context is freed. A graph may hold them. And the pool may hand a replay's scratch
 * to eager work between replays, so a pair allocated after a capture could be dirtied by the
 * next replay (train/step.c: nothing allocated after the capture may hold data across a
 * replay). A later call that needs more than the buffers hold takes a per-call accumulator.
 * The context option attn_dq_pair (core/ctx.h) turns the pair off. */
#ifdef NT_HAVE_CUDA
#include <stdlib.h>
#include "core/ctx_internal.h"
#include "core/cuda_util.h"
#include "core/memory.h"
#include "ops/attention_dq_pair.h"

typedef struct {
  float *buf[2];
  size_t cap;        /* floats in each buffer */
  size_t zeroed[2];  /* floats from the start of each buffer that are zero once queued work ran */
  int cur;           /* the buffer the next call adds into */
  bool frozen;       /* a capture has begun on this context: no freeing, no new buffers */
  /* A capture that uses the pair: the state when its first call took a buffer. */
  bool in_capture;
  int cur0;
  size_t zeroed0;    /* zeroed[cur0] then */
  size_t floats0;    /* the first captured call's size */
} dq_pair;

static void release_buffers(nt_ctx *ctx, dq_pair *p) {
  for (int i = 0; i < 2; i++) {
    nt_free(ctx, p->buf[i]); /* stream-ordered: queued kernels still using it run first */
    p->buf[i] = NULL;
    p->zeroed[i] = 0;
  }
  p->cap = 0;
}

static void pair_free(nt_ctx *ctx, void *state) {
  if (!state) return;
  release_buffers(ctx, state);
  free(state);
}

/* Before the capture ends (core/ctx.c). The state it leaves holds after the capture whether or
 * not the graph ever runs: it is the start state, or a more cautious one. */
static nt_status pair_capture_end(nt_ctx *ctx, void *state, bool body_ok) {
  dq_pair *p = state;
  if (!p || !p->in_capture) return NT_OK;
  p->in_capture = false;
  const int c0 = p->cur0;
  nt_status st = NT_OK;
  if (!body_ok) {
    p->zeroed[c0] = p->zeroed0;   /* nothing ran */
  } else if (p->cur != c0 || p->zeroed[c0] < p->floats0) {
    st = NT_CUDA(ctx, cudaMemsetAsync(p->buf[c0], 0, p->floats0 * sizeof(float),
                                      nt_cuda_stream(ctx)));
    p->zeroed[c0] = p->floats0;
  }
  p->cur = c0;
  p->zeroed[c0 ^ 1] = 0;
  return st;
}

/* The context's pair, created on first use; NULL without host memory (the per-call path). */
static dq_pair *pair_of(nt_ctx *ctx) {
  if (!ctx->attn_dq && (ctx->attn_dq = calloc(1, sizeof(dq_pair)))) {
    ctx->attn_dq_free = pair_free;
    ctx->attn_dq_capture_end = pair_capture_end;
  }
  return ctx->attn_dq;
}

nt_status nt_attn_dq_pair_take(nt_ctx *ctx, size_t floats, float **acc, float **next) {
  *acc = *next = NULL;
  if (!nt_ctx_opts(ctx)->attn_dq_pair) return NT_OK;
  bool capturing = false;
  nt_status st = nt_ctx_capturing(ctx, &capturing);
  if (st) return st;
  dq_pair *p = pair_of(ctx);
  if (!p) return NT_OK;
  if (capturing) {
    p->frozen = true;
    if (!p->in_capture) {
      if (!ctx->capture_open || p->cap < floats || p->zeroed[p->cur] < floats) return NT_OK;
      p->in_capture = true;
      p->cur0 = p->cur;
      p->zeroed0 = p->zeroed[p->cur];
      p->floats0 = floats;
    }
    /* Within the capture: zero on entry as the host tracks it (a larger call than the
     * first falls back to a per-call accumulator). */
    if (p->cap < floats || p->zeroed[p->cur] < floats) return NT_OK;
  } else if (p->cap < floats) {
    if (p->frozen) return NT_OK;
    release_buffers(ctx, p);
    for (int i = 0; i < 2; i++) {
      if (nt_alloc(ctx, floats * sizeof(float), (void **)&p->buf[i]) == NT_OK) continue;
      /* Out of memory for a second buffer: the caller's single transient one may still fit. */
      release_buffers(ctx, p);
      nt_clear_error(ctx);
      return NT_OK;
    }
    p->cap = floats;
  }
  if (p->zeroed[p->cur] < floats) {
    st = NT_CUDA(ctx, cudaMemsetAsync(p->buf[p->cur], 0, floats * sizeof(float),
                                      nt_cuda_stream(ctx)));
    if (st) return st;
    p->zeroed[p->cur] = floats;
  }
  *acc = p->buf[p->cur];
  *next = p->buf[p->cur ^ 1];
  return NT_OK;
}

void nt_attn_dq_pair_done(nt_ctx *ctx, size_t floats, bool ok) {
  dq_pair *p = ctx->attn_dq;
  if (!p) return;
  if (!ok) { /* what ran is unknown: zero both again before their next use */
    p->zeroed[0] = p->zeroed[1] = 0;
    return;
  }
  p->zeroed[p->cur] = 0;
  if (p->zeroed[p->cur ^ 1] < floats) p->zeroed[p->cur ^ 1] = floats;
  p->cur ^= 1;
}
#endif /* NT_HAVE_CUDA */
