/* Learning-rate schedules (see schedule.h). */
#include "optim/schedule.h"
#include <math.h>
#include <string.h>

nt_schedule nt_schedule_constant(double lr) {
  nt_schedule s;
  memset(&s, 0, sizeof s);
  s.kind = NT_SCHED_CONSTANT;
  s.lr = lr;
  return s;
}

nt_schedule nt_schedule_warmup_cosine(double lr, double min_lr, int64_t warmup_iters,
                                      int64_t decay_iters) {
  nt_schedule s = nt_schedule_constant(lr);
  s.kind = NT_SCHED_WARMUP_COSINE;
  s.min_lr = min_lr;
  s.warmup_iters = warmup_iters;
  s.decay_iters = decay_iters;
  return s;
}

nt_schedule nt_schedule_step(double lr, int64_t step_size, double gamma) {
  nt_schedule s = nt_schedule_constant(lr);
  s.kind = NT_SCHED_STEP;
  s.step_size = step_size;
  s.gamma = gamma;
  return s;
}

nt_status nt_schedule_check(nt_ctx *ctx, const nt_schedule *s) {
  if (!(s->lr >= 0.0) || !isfinite(s->lr))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "schedule: lr %g must be finite and >= 0", s->lr);
  switch (s->kind) {
    case NT_SCHED_CONSTANT: return NT_OK;
    case NT_SCHED_WARMUP_COSINE:
      if (!(s->min_lr >= 0.0) || s->min_lr > s->lr)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "schedule: min_lr %g must be in [0, lr %g]",
                        s->min_lr, s->lr);
      if (s->warmup_iters < 0 || s->decay_iters <= s->warmup_iters)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                        "schedule: need 0 <= warmup_iters (%lld) < decay_iters (%lld)",
                        (long long)s->warmup_iters, (long long)s->decay_iters);
      return NT_OK;
    case NT_SCHED_STEP:
      if (s->step_size < 1 || !(s->gamma > 0.0) || !isfinite(s->gamma))
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                        "schedule: step_size %lld must be >= 1 and gamma %g > 0",
                        (long long)s->step_size, s->gamma);
      return NT_OK;
  }
  return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "schedule: unknown kind %d", (int)s->kind);
}

nt_status nt_schedule_parse_kind(nt_ctx *ctx, const char *name, nt_schedule_kind *out) {
  if (name && strcmp(name, "constant") == 0) *out = NT_SCHED_CONSTANT;
  else if (name && (strcmp(name, "cosine") == 0 || strcmp(name, "warmup_cosine") == 0))
    *out = NT_SCHED_WARMUP_COSINE;
  else if (name && strcmp(name, "step") == 0) *out = NT_SCHED_STEP;
  else
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "unknown lr schedule '%s' (constant, cosine, step)",
                    name ? name : "(null)");
  return NT_OK;
}

double nt_schedule_lr(const nt_schedule *s, int64_t it) {
  switch (s->kind) {
    case NT_SCHED_WARMUP_COSINE: {
      if (it < s->warmup_iters) return s->lr * (double)(it + 1) / (double)(s->warmup_iters + 1);
      if (it > s->decay_iters || s->decay_iters <= s->warmup_iters) return s->min_lr;
      double ratio = (double)(it - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
      double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
      return s->min_lr + coeff * (s->lr - s->min_lr);
    }
    case NT_SCHED_STEP:
      return s->step_size > 0 ? s->lr * pow(s->gamma, (double)(it / s->step_size)) : s->lr;
    default: return s->lr;
  }
}
