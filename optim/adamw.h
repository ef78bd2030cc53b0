/* Adam and AdamW exactly as torch.optim (docs/semantics.md), fused: one launch per unit
 * updates every parameter of the unit's flat buffer (all groups), applies the clip coefficient,
 * skips on the device when found_inf != 0, and writes the F16/BF16 compute copy of the weights.
 * See optim/optimizer.h for units, groups and step arguments.
 *
 * Arithmetic: fp32 per element in torch's order (m.lerp_(g, 1-beta1), v = fma(1-beta2, g*g,
 * v*beta2), p += (-step_size * m) / (sqrt(v) / bc2_sqrt + eps)), with bc1 = (float)(1 - beta1^t),
 * bc2_sqrt = sqrtf((float)(1 - beta2^t)), step_size = (float)lr / bc1, from the device step
 * counter: docs/semantics.md's Adam and AdamW vectors come out bit for bit. CPU and GPU give the
 * same bits. */
#ifndef NT_OPTIM_ADAMW_H
#define NT_OPTIM_ADAMW_H
#include "core/nt.h"
#include "optim/optimizer.h"
NT_EXTERN_C_BEGIN

typedef struct {
  double lr;             /* 1e-3: used when a step's args are NULL or args->lr < 0 */
  double beta1, beta2;   /* 0.9, 0.999 */
  double eps;            /* 1e-8 */
  double weight_decay;   /* AdamW 1e-2, Adam 0 (groups carry their own) */
  bool decoupled;        /* true: AdamW (p *= 1 - lr*wd); false: Adam (g += wd*p) */
} nt_adamw_options;

nt_adamw_options nt_adamw_defaults(void);   /* torch.optim.AdamW's */
nt_adamw_options nt_adam_defaults(void);    /* torch.optim.Adam's */

typedef struct nt_adamw nt_adamw;

/* Allocates master weights (unless a unit's params are F32), m and v (zeroed) on ctx's device. */
nt_status nt_adamw_create(nt_ctx *ctx, const nt_adamw_options *opt, const nt_param_unit *units,
                          int n_units, const nt_param_group *groups, int n_groups,
                          nt_adamw **out);
void nt_adamw_free(nt_ctx *ctx, nt_adamw *opt);          /* NULL is a no-op */

/* One step over every unit (args may be NULL: the options' lr, no skip, no clipping). */
nt_status nt_adamw_step(nt_ctx *ctx, nt_adamw *opt, const nt_optim_step_args *args);

/* Views of the state of unit u (F32, on ctx's device): master weights, m, v. */
nt_status nt_adamw_state_views(nt_adamw *opt, int u, nt_tensor *master, nt_tensor *m,
                               nt_tensor *v);
/* The number of applied (not skipped) steps; reads the device (synchronizes). */
nt_status nt_adamw_get_step(nt_ctx *ctx, nt_adamw *opt, int32_t *step);
nt_status nt_adamw_set_step(nt_ctx *ctx, nt_adamw *opt, int32_t step);
/* sqrt(sum of squares) of the latest clipped step (synchronizes). */
nt_status nt_adamw_last_grad_norm(nt_ctx *ctx, nt_adamw *opt, float *norm);

/* State files: "NTOPTIM1", kind, units and their numel, the step, then per unit the master
 * weights, m and v (little-endian fp32). Loading checks the layout and rewrites the F16/BF16
 * compute copies from the loaded master weights, so training resumes bit-identically. */
nt_status nt_adamw_save(nt_ctx *ctx, nt_adamw *opt, const char *path);
nt_status nt_adamw_load(nt_ctx *ctx, nt_adamw *opt, const char *path);

NT_EXTERN_C_END
#endif
