/* Learning-rate schedules, host-side (the lr is a kernel argument, so no device state):
 *   constant:      lr
 *   warmup_cosine: nanoGPT's get_lr: it < warmup: lr * (it + 1) / (warmup + 1);
 *                  it > decay_iters (or decay_iters <= warmup): min_lr; else
 *                  min_lr + 0.5 * (1 + cos(pi * ratio)) *
 *                  (lr - min_lr), ratio = (it - warmup) / (decay_iters - warmup)
 *   step:          lr * gamma^(it / step_size)   (torch.optim.lr_scheduler.StepLR)
 * `it` counts iterations from 0, skipped steps included (as PyTorch's schedulers). */
#ifndef NT_OPTIM_SCHEDULE_H
#define NT_OPTIM_SCHEDULE_H
#include <stdint.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum { NT_SCHED_CONSTANT = 0, NT_SCHED_WARMUP_COSINE, NT_SCHED_STEP } nt_schedule_kind;

typedef struct {
  nt_schedule_kind kind;
  double lr;             /* peak / base lr */
  double min_lr;         /* warmup_cosine floor */
  int64_t warmup_iters;  /* warmup_cosine */
  int64_t decay_iters;   /* warmup_cosine: the iteration where the floor is reached */
  int64_t step_size;     /* step: iterations between decays */
  double gamma;          /* step: factor per decay */
} nt_schedule;

nt_schedule nt_schedule_constant(double lr);
nt_schedule nt_schedule_warmup_cosine(double lr, double min_lr, int64_t warmup_iters,
                                      int64_t decay_iters);
nt_schedule nt_schedule_step(double lr, int64_t step_size, double gamma);
/* Checks the fields (positive sizes, warmup < decay, ...). */
nt_status nt_schedule_check(nt_ctx *ctx, const nt_schedule *s);
/* Parses "constant", "cosine" / "warmup_cosine", "step" into the kind. */
nt_status nt_schedule_parse_kind(nt_ctx *ctx, const char *name, nt_schedule_kind *out);
double nt_schedule_lr(const nt_schedule *s, int64_t it);

NT_EXTERN_C_END
#endif
