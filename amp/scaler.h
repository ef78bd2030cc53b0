/* Dynamic loss scaler, the same options, defaults, update rule, misuse errors and state as
 * torch.amp.GradScaler (docs/semantics.md), plus opt-in extras (min/max scale, hysteresis).
 *
 * The state (scale, inv_scale, found_inf, growth_tracker, counters) lives where the context
 * computes: device memory for a CUDA context (updated by a one-thread kernel), host memory for a
 * CPU context. The per-step path never synchronizes with the host:
 *
 *   loss * scale          nt_scaler_scale_tensor() is a F32 scalar the loss backward can read
 *   nt_scaler_unscale     zeroes found_inf (first unscale of the step), multiplies every grad by
 *                         inv_scale and sets found_inf on any non-finite element (one launch)
 *   [clip, optimizer]     the optimizer takes nt_scaler_found_inf_tensor() and skips on device
 *   nt_scaler_step        marks the step (unscales first when the caller did not); pair with the
 *                         optimizer's step (train/step.c runs the whole sequence)
 *   nt_scaler_update      the GradScaler rule, on the device
 *
 * Only nt_scaler_read / nt_scaler_log / nt_scaler_state_get copy values to the host (they sync).
 *
 * Several optimizers: unscale all their gradients in one nt_scaler_unscale, pass
 * nt_scaler_found_inf_tensor() to each optimizer's step (optim/optimizer.h), then update.
 * Data parallel: all-reduce (sum) the found_inf tensor between unscale and the optimizer step;
 * any non-zero sum is an overflow on some rank, so every rank skips and backs off alike.
 *
 * Extras (all off by default, so the defaults behave exactly as PyTorch):
 *   min_scale > 0: a backoff never goes below min_scale (scale = max(scale*backoff, min_scale)).
 *   max_scale > 0: a growth never goes above max_scale (grown = min(scale*growth, max_scale)).
 *   hysteresis H >= 1 (DeepSpeed's "hysteresis"/delayed_shift): the scale is backed off on the
 *     H-th consecutive overflow; overflows 1..H-1 of a run only reset growth_tracker (the step
 *     is still skipped). After a backoff every further consecutive overflow backs off again;
 *     a step without overflow re-arms the full H. H = 1 (or 0) is PyTorch's behaviour. */
#ifndef NT_AMP_SCALER_H
#define NT_AMP_SCALER_H
#include <stdint.h>
#include <stdbool.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  bool enabled;              /* false: every call is a no-op, found_inf stays 0 (bf16/fp32) */
  float init_scale;          /* 65536 */
  float growth_factor;       /* 2.0, must be > 1 */
  float backoff_factor;      /* 0.5, must be in (0, 1) */
  int32_t growth_interval;   /* 2000, must be >= 1 */
  float min_scale;           /* extra: 0 = no lower bound (PyTorch) */
  float max_scale;           /* extra: 0 = no upper bound (PyTorch) */
  int32_t hysteresis;        /* extra: 1 = back off on every overflow (PyTorch) */
} nt_scaler_options;

/* PyTorch's defaults (enabled). */
nt_scaler_options nt_scaler_defaults(void);
/* Presets from practice: "default" (PyTorch's), "transformer" (init 65536, interval 2000),
 * "cnn" (interval 1000), "pointcloud" (init 32768). Unknown name: NT_ERR_INVALID_ARG. */
nt_status nt_scaler_preset(nt_ctx *ctx, const char *name, nt_scaler_options *out);

typedef struct nt_scaler nt_scaler;

nt_status nt_scaler_create(nt_ctx *ctx, const nt_scaler_options *opt, nt_scaler **out);
void nt_scaler_free(nt_ctx *ctx, nt_scaler *s);          /* NULL is a no-op */
bool nt_scaler_enabled(const nt_scaler *s);

/* F32 scalar views of the state, on the context's device (valid until nt_scaler_free). */
nt_tensor nt_scaler_scale_tensor(const nt_scaler *s);
nt_tensor nt_scaler_inv_scale_tensor(const nt_scaler *s);  /* (float)(1.0 / (double)scale) */
nt_tensor nt_scaler_found_inf_tensor(const nt_scaler *s);  /* > 0 after an overflow */

/* Unscales all gradients in one multi-tensor launch and records the inf check. Errors
 * (NT_ERR_STATE): a second unscale in one step, an unscale after step. */
nt_status nt_scaler_unscale(nt_ctx *ctx, nt_scaler *s, nt_tensor *const *grads, int n);
/* Records the optimizer step. If the step was not unscaled yet, unscales `grads` first (then
 * grads must be given). Error (NT_ERR_STATE): a second step before update. *found_inf receives
 * the tensor the optimizer must read (NULL when the scaler is disabled). */
nt_status nt_scaler_step(nt_ctx *ctx, nt_scaler *s, nt_tensor *const *grads, int n,
                         const nt_tensor **found_inf);
/* The update rule. Error (NT_ERR_STATE): no unscale recorded since the last update. */
nt_status nt_scaler_update(nt_ctx *ctx, nt_scaler *s);

/* Values, for logging (synchronizes). Any pointer may be NULL. */
typedef struct {
  float scale;
  int32_t growth_tracker;
  int64_t updates;           /* nt_scaler_update calls */
  int64_t skipped_total;     /* updates that saw an overflow (= skipped optimizer steps) */
  int64_t last_skipped;      /* the update index (0-based) of the latest overflow, -1: none */
} nt_scaler_values;
nt_status nt_scaler_read(nt_ctx *ctx, nt_scaler *s, nt_scaler_values *out);
/* Reads and logs (nt_log, info) the scale and the steps skipped since the previous log. */
nt_status nt_scaler_log(nt_ctx *ctx, nt_scaler *s);

/* Plain state for checkpoints (a JSON sidecar writes these fields by name). */
typedef struct {
  float scale;
  float growth_factor;
  float backoff_factor;
  int32_t growth_interval;
  int32_t growth_tracker;
  float min_scale, max_scale;
  int32_t hysteresis;
  int32_t hysteresis_left;   /* overflows still tolerated before the next backoff */
  int64_t updates;
  int64_t skipped_total;
} nt_scaler_state;
nt_status nt_scaler_state_get(nt_ctx *ctx, nt_scaler *s, nt_scaler_state *out);   /* syncs */
/* Restores the state (and the options it carries); the scaler then behaves identically to
 * the one saved. Must be called between steps (not after unscale/step before update). */
nt_status nt_scaler_state_set(nt_ctx *ctx, nt_scaler *s, const nt_scaler_state *st);

NT_EXTERN_C_END
#endif
