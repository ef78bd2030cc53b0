/* The loss scaler's state record and update rule, shared by the CPU code (scaler.c) and the
 * one-thread CUDA kernel (scaler.cu) so both run the same arithmetic bit for bit. Private. */
#ifndef NT_AMP_SCALER_RULE_H
#define NT_AMP_SCALER_RULE_H
#include <stdint.h>
#include <math.h>
#include "core/hd.h"

/* Lives in one allocation on the context's device; the public F32 views point into it. */
typedef struct {
  float scale;
  float inv_scale;
  float found_inf;
  int32_t growth_tracker;
  int32_t hysteresis_left;
  int32_t pad;
  int64_t updates;
  int64_t skipped_total;
  int64_t last_skipped;
} nt_scaler_record;

typedef struct {
  float growth_factor, backoff_factor, min_scale, max_scale;
  int32_t growth_interval, hysteresis;
} nt_scaler_rule_args;

/* fp32 multiply that a compiler may not contract or reorder (the kernel and the host agree). */
static inline NT_HD float nt_scaler_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

static inline NT_HD float nt_scaler_inv(float scale) { return (float)(1.0 / (double)scale); }

static inline NT_HD void nt_scaler_rule(nt_scaler_record *r, const nt_scaler_rule_args *a) {
  int32_t hyst = a->hysteresis > 1 ? a->hysteresis : 1;
  if (r->found_inf != 0.0f) {   /* NaN counts as an overflow too */
    r->growth_tracker = 0;
    r->skipped_total += 1;
    r->last_skipped = r->updates;
    if (r->hysteresis_left > 1) {
      r->hysteresis_left -= 1;
    } else {
      float s = nt_scaler_mul(r->scale, a->backoff_factor);
      if (a->min_scale > 0.0f && s < a->min_scale) s = a->min_scale;
      r->scale = s;
      r->hysteresis_left = 1;
    }
  } else {
    int32_t successful = r->growth_tracker + 1;
    r->hysteresis_left = hyst;
    if (successful == a->growth_interval) {
      float grown = nt_scaler_mul(r->scale, a->growth_factor);
      if (a->max_scale > 0.0f && grown > a->max_scale) grown = a->max_scale;
      if (isfinite(grown)) r->scale = grown;
      r->growth_tracker = 0;
    } else {
      r->growth_tracker = successful;
    }
  }
  r->inv_scale = nt_scaler_inv(r->scale);
  r->updates += 1;
}

#endif
