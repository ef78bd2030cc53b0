/* What every model implementation shares (train/model.h). */
#include "train/model.h"
#include <time.h>

void nt_model_free(nt_ctx *ctx, nt_model *m) {
  if (m) m->ops->free(ctx, m);
}

nt_status nt_model_read_scalar(nt_ctx *ctx, const nt_tensor *t, float *out) {
  nt_tensor h = nt_tensor_view(out, NT_F32, nt_cpu(), 0, NULL);
  return nt_tensor_copy(ctx, &h, t);
}

double nt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
