/* The wgmma backward's dQ accumulators, kept by the context between calls (eager use only).
 *
 * The backward adds dQ with atomics into an fp32 accumulator that must be zero on entry.
 * Zeroing it in the pass before the kernel (prep_rows) is memory-bound: 50 MB of stores at
 * GPT-2's shape, 12 of that pass's 28 us on the H200. With two accumulators kept here a call
 * adds into one, which is already zero, while its main kernel, bound by the tensor cores,
 * stores the zeros of the other one for the next call.
 *
 * While the compute stream is being captured into a CUDA graph the pair is not used (callers
 * take a transient accumulator and zero it in prep_rows): a replay repeats the captured
 * buffers, so after an odd number of calls the first one would find its accumulator dirty.
 * The first capture also retires the pair for good:
 * - its two buffers go back to the pool, where the captured call's transient request (of the
 *   same size) finds them; otherwise the capture may need a new cudaMalloc, which fails it;
 * - the pool may later hand a replay's scratch to eager work between replays, so a pair
 *   allocated after a capture could be dirtied by the next replay (train/step.c: nothing
 *   allocated after the capture may hold data across a replay).
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
  bool retired;      /* a capture has begun on this context: never used again */
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

/* The context's pair, created on first use; NULL without host memory (the transient path). */
static dq_pair *pair_of(nt_ctx *ctx) {
  if (!ctx->attn_dq && (ctx->attn_dq = calloc(1, sizeof(dq_pair)))) ctx->attn_dq_free = pair_free;
  return ctx->attn_dq;
}

nt_status nt_attn_dq_pair_take(nt_ctx *ctx, size_t floats, float **acc, float **next) {
  *acc = *next = NULL;
  if (!nt_ctx_opts(ctx)->attn_dq_pair) return NT_OK;
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  nt_status st = NT_CUDA(ctx, cudaStreamIsCapturing(nt_cuda_stream(ctx), &cap));
  if (st) return st;
  dq_pair *p = pair_of(ctx);
  if (cap != cudaStreamCaptureStatusNone) {
    if (!p)
      return NT_ERROR(ctx, NT_ERR_OOM, "attention: out of host memory for the dQ pair's state");
    if (!p->retired) release_buffers(ctx, p);
    p->retired = true;
    return NT_OK;
  }
  if (!p || p->retired) return NT_OK;
  if (p->cap < floats) {
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
