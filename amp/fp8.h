/* FP8 delayed scaling, as Transformer Engine's DelayedScaling (docs/semantics.md):
 * every FP8 tensor (a linear layer's input, weight, output gradient) keeps an amax history
 * (default length 1024) and a scale:
 *   ops record the current amax into the tensor's amax slot (nt_fp8_amax_tensor, the newest
 *   history slot, zeroed at the previous update; writers take a max into it);
 *   nt_fp8_update (one launch for all tensors of the set):
 *     amax  = max(history)                       (a NaN anywhere makes it NaN)
 *     scale = fp8_max * 2^-margin / amax         if amax is finite and > 0, else unchanged
 *             (an infinite quotient, from a subnormal amax, is clamped to FLT_MAX)
 *     scale_inv = 1 / scale
 *     roll one slot: the next slot becomes the newest and is zeroed.
 * fp8_max is 448 for E4M3 (weights, activations) and 57344 for E5M2 (gradients), "HYBRID".
 * Scales start at 1. The state stays on the context's device; GEMMs read scale_inv pointers
 * (ops/gemm.h). No host sync. */
#ifndef NT_AMP_FP8_H
#define NT_AMP_FP8_H
#include <stdint.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  int32_t history_len;   /* 1024 */
  int32_t margin;        /* 0 */
} nt_fp8_options;

nt_fp8_options nt_fp8_defaults(void);
/* 448 (E4M3), 57344 (E5M2); 0 for other dtypes. */
float nt_fp8_max(nt_dtype format);

typedef struct nt_fp8_state nt_fp8_state;

/* A set of n FP8 tensors with their formats (NT_FP8_E4M3 or NT_FP8_E5M2). */
nt_status nt_fp8_state_create(nt_ctx *ctx, const nt_fp8_options *opt, const nt_dtype *formats,
                              int n, nt_fp8_state **out);
void nt_fp8_state_free(nt_ctx *ctx, nt_fp8_state *s);
int nt_fp8_state_count(const nt_fp8_state *s);

/* F32 scalar views on ctx's device for tensor i. */
nt_tensor nt_fp8_scale_tensor(const nt_fp8_state *s, int i);
nt_tensor nt_fp8_scale_inv_tensor(const nt_fp8_state *s, int i);
nt_tensor nt_fp8_amax_tensor(const nt_fp8_state *s, int i);

/* Records amax = max|x| of an F32 tensor into tensor i's amax slot (max with what is there);
 * for ops that do not compute an amax themselves. */
nt_status nt_fp8_record_amax(nt_ctx *ctx, nt_fp8_state *s, int i, const nt_tensor *x);
/* Updates every tensor's scale and rolls the histories (one launch). */
nt_status nt_fp8_update(nt_ctx *ctx, nt_fp8_state *s);

/* Host copies (synchronize): scale and the history in age order (newest first). */
nt_status nt_fp8_read(nt_ctx *ctx, nt_fp8_state *s, int i, float *scale, float *scale_inv,
                      float *history);

NT_EXTERN_C_END
#endif
