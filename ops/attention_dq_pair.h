/* The wgmma backward's pair of dQ accumulators kept by the context (attention_dq_pair.c).
 * Private to ops/attention*. */
#ifndef NT_OPS_ATTENTION_DQ_PAIR_H
#define NT_OPS_ATTENTION_DQ_PAIR_H
#include <stdbool.h>
#include <stddef.h>
#include "core/ctx.h"
NT_EXTERN_C_BEGIN

/* For a backward whose accumulator has `floats` floats: *acc, zero once queued work has run,
 * to add into, and *next, to be zeroed over `floats` by this call's kernel for the next call.
 * Both NULL (and NT_OK) when the pair is not used (the caller then takes a per-call
 * accumulator): with the context option attn_dq_pair off, when the two buffers do not fit in
 * memory, in a capture not begun by nt_ctx_capture_begin, or when the buffers are too small
 * once a capture has begun (attention_dq_pair.c). */
nt_status nt_attn_dq_pair_take(nt_ctx *ctx, size_t floats, float **acc, float **next);
/* After the call's work was queued (ok) or failed part way (!ok). */
void nt_attn_dq_pair_done(nt_ctx *ctx, size_t floats, bool ok);

NT_EXTERN_C_END
#endif
