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

nt_status nt_model_loader_next(nt_loader *l, uint64_t *waited_ns, nt_batch *b, bool *end,
                               double *wait_s) {
  *wait_s = 0;
  nt_status st = nt_loader_next(l, b, end);
  if (st || *end) return st;
  nt_loader_stats ls;
  nt_loader_get_stats(l, &ls);
  *wait_s = 1e-9 * (double)(ls.wait_ns_total - *waited_ns);
  *waited_ns = ls.wait_ns_total;
  return NT_OK;
}
