/* SGD as torch.optim.SGD (momentum, dampening, nesterov, weight decay), fused like AdamW: one
 * launch per unit over the flat buffer, clip coefficient applied in the kernel, skipped on the
 * device when found_inf != 0, F16/BF16 compute copy written in the same pass.
 *   g = g * clip;  g += wd * p;
 *   momentum != 0: b = g on the first applied step, else b = momentum * b + (1 - dampening) * g;
 *                  g = nesterov ? g + momentum * b : b
 *   p = p - lr * g */
#ifndef NT_OPTIM_SGD_H
#define NT_OPTIM_SGD_H
#include "core/nt.h"
#include "optim/optimizer.h"
NT_EXTERN_C_BEGIN

typedef struct {
  double lr;             /* used when a step's args are NULL or args->lr < 0 */
  double momentum;       /* 0 */
  double dampening;      /* 0 */
  double weight_decay;   /* 0 */
  bool nesterov;         /* needs momentum > 0 and dampening 0 (as torch) */
} nt_sgd_options;

nt_sgd_options nt_sgd_defaults(double lr);

typedef struct nt_sgd nt_sgd;

nt_status nt_sgd_create(nt_ctx *ctx, const nt_sgd_options *opt, const nt_param_unit *units,
                        int n_units, const nt_param_group *groups, int n_groups, nt_sgd **out);
void nt_sgd_free(nt_ctx *ctx, nt_sgd *opt);
nt_status nt_sgd_step(nt_ctx *ctx, nt_sgd *opt, const nt_optim_step_args *args);
/* Views of unit u's master weights and momentum buffer (momentum is zeroed when unused). */
nt_status nt_sgd_state_views(nt_sgd *opt, int u, nt_tensor *master, nt_tensor *momentum_buf);
nt_status nt_sgd_get_step(nt_ctx *ctx, nt_sgd *opt, int32_t *step);
/* State files as nt_adamw_save (kind "sgd": master weights and momentum buffers). */
nt_status nt_sgd_save(nt_ctx *ctx, nt_sgd *opt, const char *path);
nt_status nt_sgd_load(nt_ctx *ctx, nt_sgd *opt, const char *path);

NT_EXTERN_C_END
#endif
