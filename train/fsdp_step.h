/* The FSDP runtime plugged into the step pipeline (train/step.h): its hooks, the gradient
 * ranges the step's unscale / inf check / norm run over, and the optimizer over the owned
 * shards. What the step itself must still do for N > 1 ranks:
 *   - zero the gradients with nt_fsdp_zero_grad (sharded strategies have no whole gradient
 *     buffer between steps: their unit->grad data is NULL): the step hooks' zero_grad;
 *   - divide the gradients by N, also without a loss scaler, so means over the global batch
 *     reach the optimizer (reductions are sums): nt_step_options.grad_divisor = N (the unscale
 *     factor becomes inv_scale / N: applied in place without clipping, folded into the clip
 *     coefficient with it);
 *   - with the MPI backend, run without CUDA graphs (its collectives synchronize the host). */
#ifndef NT_DIST_FSDP_STEP_H
#define NT_DIST_FSDP_STEP_H
#include "dist/fsdp.h"
#include "train/step.h"
NT_EXTERN_C_BEGIN

/* Fills both hook tables with the runtime's functions (arg = f); step->unit = unit. */
void nt_fsdp_hooks(nt_fsdp *f, nt_unit_hooks *unit, nt_step_hooks *step);
/* One range per unit that owns real gradient elements (padding excluded): out must hold
 * params->n_units entries; *n gets the count. Pass them as nt_step_options.ranges. */
nt_status nt_fsdp_grad_ranges(nt_ctx *ctx, nt_fsdp *f, nt_grad_range *out, int *n);
/* nt_optimizer_for_params over the runtime's views: AdamW over each unit's owned shard (the
 * whole unit for NO_SHARD), decay on 2-D weights only, and the scaler. */
nt_status nt_fsdp_optimizer(nt_ctx *ctx, nt_fsdp *f, const nt_optimizer_options *o,
                            nt_optimizer *out);

NT_EXTERN_C_END
#endif
