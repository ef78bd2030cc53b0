/* What every nanotrain optimizer (AdamW/Adam, SGD) shares: the parameters it updates, its
 * parameter groups and the per-step arguments.
 *
 * Parameters live in flat buffers, one per model unit. A unit gives the optimizer the unit's
 * compute copy of the weights (F32, F16 or BF16) and its gradient buffer (F32, F16 or BF16, same
 * numel). The optimizer owns fp32 master weights and its moments for every unit; when the
 * compute copy is F16/BF16 the fused kernel writes it from the new master weights in the same
 * launch (no separate pass). When the compute copy is F32 it IS the master (no extra copy).
 *
 * Parameter groups are lists of (unit, offset, length) ranges, each group with its own
 * lr multiplier and weight decay (e.g. no decay for biases and norms). Ranges must not overlap;
 * elements covered by no group are frozen (never updated). With no groups at all, one group
 * covers every element of every unit with the optimizer's weight_decay and lr multiplier 1.
 * At most NT_OPTIM_MAX_GROUPS groups.
 *
 * The step counter lives on the device. A step is skipped on the device when *found_inf != 0
 * (from the loss scaler): parameters, moments and the step counter stay bitwise unchanged.
 * Clipping by global norm (torch.nn.utils.clip_grad_norm_): with max_norm > 0 every gradient is
 * multiplied by min(1, max_norm / (sqrt(sumsq) + 1e-6)) inside the optimizer kernel; sumsq is
 * grad_sumsq when given (e.g. all-reduced across ranks) or computed by the optimizer over its
 * units' gradients (nt_sum_squares). The gradient buffers themselves are never modified. */
#ifndef NT_OPTIM_OPTIMIZER_H
#define NT_OPTIM_OPTIMIZER_H
#include <stdint.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

#define NT_OPTIM_MAX_GROUPS 8

typedef struct {
  nt_tensor params;               /* compute copy: contiguous F32/F16/BF16 (any shape) */
  nt_tensor grads;                /* contiguous F32/F16/BF16, numel of params */
  const nt_tensor *master_init;   /* optional F32 initial values (else params, upcast); when
                                   * given, a F16/BF16 params is rewritten from it at create */
} nt_param_unit;

typedef struct {
  int unit;                       /* index into the units */
  int64_t offset, length;         /* elements of that unit's flat buffer */
} nt_param_range;

typedef struct {
  float lr_mult;                  /* this group's lr = step lr * lr_mult */
  double weight_decay;
  const nt_param_range *ranges;
  int n_ranges;
} nt_param_group;

typedef struct {
  double lr;                      /* this step's learning rate (optim/schedule.h); < 0: the optimizer's lr */
  const nt_tensor *found_inf;     /* F32 scalar on the ctx's device, or NULL: no overflow check */
  float max_norm;                 /* > 0: clip by global norm (inf: a coefficient of 1 for
                                   * any finite norm, as torch's); 0: no clipping */
  const nt_tensor *grad_sumsq;    /* F32 scalar sum of squares of all grads, or NULL */
  const nt_tensor *lr_tensor;     /* F32 scalar on the device, or NULL: the lr read on the device
                                   * (overrides lr), so a captured CUDA graph of the step can
                                   * follow a schedule written into it */
  /* F32 scalar on the device, or NULL: the gradients still carry a factor (the loss scale, a
   * divisor) that the step removes by multiplying them by grad_scale, folded into the clipping
   * coefficient (no pass over the gradients). Needs max_norm > 0: the norm is taken as
   * sqrt(grad_sumsq) * grad_scale, and that norm not being finite is the overflow check (a
   * non-finite gradient, squares that overflow fp32, an infinite grad_scale): with found_inf,
   * it is set to 1 and the step skipped, as if the unscale pass had found it; without, nothing
   * is checked (a NaN coefficient propagates, as torch's clip_grad_norm_'s). */
  const nt_tensor *grad_scale;
} nt_optim_step_args;

static inline nt_optim_step_args nt_optim_args(double lr) {
  nt_optim_step_args a = {lr, NULL, 0.0f, NULL, NULL, NULL};
  return a;
}

NT_EXTERN_C_END
#endif
