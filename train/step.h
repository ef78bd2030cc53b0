/* One training step as explicit stages: the public API for programs that bring their own model.
 *
 * What a porter writes (see tests/test_step_api.c for a complete program):
 *   1. The model's parameters as units of flat buffers (models/module.h: nt_params_add_unit,
 *      nt_params_add, nt_params_alloc, nt_params_init).
 *   2. The optimizer and the loss scaler for them: nt_optimizer_for_params (below) builds AdamW
 *      with nanoGPT's two groups (2-D weights decay, biases and norms do not) over every unit,
 *      hands the fp32 master weights to AdamW, and builds the scaler that the precision needs.
 *   3. A body: one micro-step of the model (forward, loss, backward accumulating into the
 *      units' gradient buffers), with the loss gradient multiplied by *loss_scale (NULL: 1)
 *      and the unit hooks called around each unit (NULL hooks: nothing to call).
 *   4. nt_step_create, then nt_step_run once per iteration with the iteration's learning rate
 *      (optim/schedule.h gives schedules).
 *
 * A step runs these stages, in this order (train/step.c reads as the list):
 *   forward + backward   zero the gradients, the body (inside the context's RNG step bracket, so
 *                        dropout draws fresh numbers when replayed); on a GPU the third step
 *                        captures this stage as a CUDA graph and later steps replay it (after
 *                        two eager steps that warm the memory pool and the GEMM plans)
 *   gradients ready      per unit, inside the body: the model calls hooks->unit->grads_ready as
 *                        each unit's backward is enqueued (data parallel reduces there)
 *   unscale + inf check  without clipping: grads *= 1/scale (and 1/grad_divisor: the mean over
 *                        ranks and micro-steps) over the owned gradient ranges, found_inf (a
 *                        device F32 flag, fp16 only) = 1 on any non-finite element. With
 *                        clipping the gradients stay as they are: the factor goes to the
 *                        optimizer (folded into the clip coefficient, below)
 *   gradient norm        the sum of squares of the owned gradient ranges (when clipping)
 *   global reductions    hooks->global_reduce(found_inf MAX, sumsq SUM) (identity at one rank);
 *                        with clipping, sumsq only (found_inf is set by the optimizer)
 *   clip                 coef = min(1, max_norm / (norm + 1e-6)), norm = sqrt(sumsq) times the
 *                        factor, applied (times the factor) inside the optimizer's kernel
 *                        (torch.nn.utils.clip_grad_norm_'s arithmetic); a norm that is not
 *                        finite sets found_inf (fp16)
 *   optimizer            AdamW; skipped on the device when found_inf != 0 (parameters, moments
 *                        and the step counter unchanged)
 *   scaler update        GradScaler's rule on the device (back off on overflow, grow after
 *                        growth_interval clean steps)
 *   parameters updated   hooks->params_updated (data parallel all-gathers there)
 *   low-precision copies the F16/BF16 compute copy is rewritten from the fp32 master weights;
 *                        AdamW's kernel does it in the optimizer stage's pass (fused)
 * Nothing in a step waits for the device; the trace (options.trace) is the exception.
 *
 * Semantics follow PyTorch: torch.amp.GradScaler for the scaler (amp/scaler.h),
 * torch.optim.AdamW (optim/adamw.h), clip_grad_norm_ (optim/clip.h). */
#ifndef NT_TRAIN_STEP_H
#define NT_TRAIN_STEP_H
#include <stdio.h>
#include "core/nt.h"
#include "models/module.h"
#include "optim/adamw.h"
#include "amp/scaler.h"
NT_EXTERN_C_BEGIN

/* ---- building the optimizer and the scaler for a model's parameters ---- */

typedef struct {
  nt_adamw_options adamw;         /* lr, betas, eps, weight_decay (of the decay group) */
  nt_scaler_options scaler;       /* enabled = dynamic loss scaling (fp16) */
} nt_optimizer_options;

/* torch.optim.AdamW's and torch.amp.GradScaler's defaults, the scaler disabled. */
nt_optimizer_options nt_optimizer_defaults(void);

typedef struct {
  nt_adamw *adamw;
  nt_scaler *scaler;              /* always built; disabled unless options.scaler.enabled */
} nt_optimizer;

/* AdamW over every unit of params (initialised and allocated): group 0 = each unit's
 * [0, n_decay) with options.adamw.weight_decay, group 1 = [n_decay, numel) without decay
 * (nanoGPT's configure_optimizers). The optimizer takes over the fp32 master weights
 * (nt_params_adopt_master). On failure *out is empty. */
nt_status nt_optimizer_for_params(nt_ctx *ctx, nt_params *params, const nt_optimizer_options *o,
                                  nt_optimizer *out);
/* The same over other views of the units (sharded data parallel: each unit's owned shard,
 * train/fsdp_step.h): units[u] is what AdamW updates for unit u; map (NULL: identity) turns the
 * two groups' unit ranges into ranges of those views, returning how many it wrote (empty ones
 * dropped); adopt: the parameters take over the optimizer's master weights as above (only
 * when the views are the units' whole buffers). */
typedef int (*nt_range_map_fn)(void *arg, const nt_param_range *in, int n, nt_param_range *out);
nt_status nt_optimizer_for_units(nt_ctx *ctx, nt_params *params, const nt_param_unit *units,
                                 nt_range_map_fn map, void *map_arg, bool adopt,
                                 const nt_optimizer_options *o, nt_optimizer *out);
void nt_optimizer_free(nt_ctx *ctx, nt_optimizer *o);       /* frees what it holds */

/* ---- hooks where data parallelism plugs in (NULL at world size 1) ---- */

typedef struct nt_step_hooks {
  void *arg;
  const nt_unit_hooks *unit;                 /* passed to the model's body */
  /* found_inf: device F32 scalar, reduce MAX across ranks in place; sumsq: device F32 scalar
   * (sum of squares of this rank's owned gradient elements, padding excluded), reduce SUM in
   * place. Either may be NULL: found_inf without a scaler or with clipping (the optimizer then
   * sets it from the reduced sumsq), sumsq without clipping. */
  nt_status (*global_reduce)(nt_ctx *ctx, void *arg, float *found_inf, float *sumsq);
  /* after the optimizer step (skipped or not): sharded strategies all-gather updated params */
  nt_status (*params_updated)(nt_ctx *ctx, void *arg);
  /* zeroes what the next backward accumulates into; NULL: nt_params_zero_grad (sharded
   * strategies own the gradient buffers, dist/fsdp.h's nt_fsdp_zero_grad) */
  nt_status (*zero_grad)(nt_ctx *ctx, void *arg);
} nt_step_hooks;

/* The elements [lo, hi) of a flat gradient buffer (contiguous F32/F16/BF16, on the context's
 * device) that this rank owns: the unscale, inf check and norm stages run over these. */
typedef struct {
  nt_tensor grad;
  int64_t lo, hi;
} nt_grad_range;

/* The micro-step: forward, loss, backward into the gradient buffers (which the step has
 * zeroed). The loss gradient is multiplied by *loss_scale (a device F32 on the GPU, host on
 * the CPU; NULL = 1). hooks may be NULL. It must enqueue work only (no host sync, no
 * allocation that misses the pool's cache after the first steps) so it can be captured. */
typedef nt_status (*nt_step_body)(nt_ctx *ctx, void *arg, const float *loss_scale,
                                  const nt_unit_hooks *hooks);

typedef struct {
  nt_params *params;              /* the model's units: their gradients are zeroed per step */
  nt_step_body body;
  void *body_arg;
  nt_optimizer optimizer;         /* not owned */
  float max_norm;                 /* > 0: clip the global gradient norm to it; 0: no clipping */
  /* The gradient elements this rank owns. NULL: every unit of params, whole. Copied. */
  const nt_grad_range *ranges;
  int n_ranges;
  const nt_step_hooks *hooks;     /* NULL: one rank. Not copied: must outlive the step */
  /* > 1: the gradients hold a sum of that many micro-batch means (ranks x accumulated
   * micro-steps); the optimizer sees them multiplied by 1 / grad_divisor (times the loss
   * scaler's 1/scale): the global mean. Without clipping the unscale stage multiplies the
   * gradients in place; with clipping the factor is folded into the clip coefficient and the
   * gradient buffers keep the sum. 0 or 1: none. */
  int grad_divisor;
  int cuda_graph;                 /* -1 auto (on a GPU context), 0 never, 1 on (falls back to
                                   * eager with a warning when capture fails) */
  FILE *trace;                    /* non-NULL: each step prints its AMP events there (the
                                   * scale, found_inf, skipped or not, the growth tracker);
                                   * this reads the device: every step synchronizes */
} nt_step_options;

typedef struct nt_step nt_step;

nt_status nt_step_create(nt_ctx *ctx, const nt_step_options *o, nt_step **out);
void nt_step_free(nt_ctx *ctx, nt_step *s);                 /* NULL is a no-op */

/* One optimizer iteration: every stage above. lr: this step's learning rate. */
nt_status nt_step_run(nt_ctx *ctx, nt_step *s, double lr);

/* The two halves of nt_step_run, for a caller that runs something between them (gradient
 * accumulation, inspection): the forward + backward stage (replayed as a CUDA graph once
 * captured), and everything after it. */
nt_status nt_step_forward_backward(nt_ctx *ctx, nt_step *s);
nt_status nt_step_update(nt_ctx *ctx, nt_step *s, double lr);
/* Gradient accumulation: the forward + backward stage without zeroing the gradients, so the
 * micro-step adds to the previous one's (call nt_step_forward_backward for the first micro-step
 * of an iteration, this for the others, then nt_step_update). Always eager: a run that
 * accumulates should create the step with cuda_graph 0. */
nt_status nt_step_accumulate(nt_ctx *ctx, nt_step *s);

/* The device F32 loss scale the body receives (NULL when the scaler is disabled). */
const float *nt_step_loss_scale(const nt_step *s);
/* Whether forward + backward now replays a CUDA graph. */
bool nt_step_uses_graph(const nt_step *s);
/* Whether the steps are past warm-up (the graph is captured, or three eager steps ran): from
 * then on a step should allocate no new memory. */
bool nt_step_is_steady(const nt_step *s);
/* Steps run so far (nt_step_update calls). */
int64_t nt_step_count(const nt_step *s);

NT_EXTERN_C_END
#endif
