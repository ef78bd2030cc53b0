/* The FP8 delayed-scaling record and rule, shared by the host (fp8.c) and the device (fp8.cu).
 * Private. */
#ifndef NT_AMP_FP8_RULE_H
#define NT_AMP_FP8_RULE_H
#include <stdint.h>
#include <math.h>
#include <float.h>
#include "core/hd.h"

/* One tensor's record; the history of `len` floats follows each record in memory (the stride
 * between records is nt_fp8_stride(len) floats, keeping 16-byte alignment). */
typedef struct {
  float scale;
  float scale_inv;
  float amax;        /* the newest slot: ops write the current step's amax here */
  float fp8_max;
  int32_t pos;       /* index in history of the newest slot */
  int32_t len;
  int32_t margin;
  int32_t pad;
} nt_fp8_record;

static inline NT_HD int64_t nt_fp8_stride(int32_t len) {
  return (int64_t)(sizeof(nt_fp8_record) / sizeof(float)) + (((int64_t)len + 3) & ~(int64_t)3);
}

static inline NT_HD float nt_fp8_nanmax(float a, float b) {
  if (a != a || b != b) return NAN;
  return a > b ? a : b;
}

/* After max(history) is known: the scale rule, then the roll. */
static inline NT_HD void nt_fp8_finish(nt_fp8_record *r, float *history, float amax) {
  if (isfinite(amax) && amax > 0.0f) {
    float s = r->fp8_max / amax;
    s = ldexpf(s, -r->margin);
    if (isinf(s)) s = FLT_MAX;
    r->scale = s;
    r->scale_inv = 1.0f / s;
  }
  r->pos = (r->pos + 1) % r->len;
  history[r->pos] = 0.0f;
  r->amax = 0.0f;
}

#endif
