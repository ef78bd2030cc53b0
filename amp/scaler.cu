/* The loss scaler's device side: the update rule in a one-thread kernel (the same function the
 * host runs, amp/scaler_rule.h) and the per-step reset of found_inf. No host sync. */
#include "amp/scaler_rule.h"
#include "core/cuda_util.h"
#include <stddef.h>

namespace {
__global__ void scaler_update_kernel(nt_scaler_record *rec, nt_scaler_rule_args a) {
  nt_scaler_rule(rec, &a);
}
}  // namespace

extern "C" nt_status nt_scaler_update_cuda(nt_ctx *ctx, nt_scaler_record *rec,
                                           const nt_scaler_rule_args *a) {
  scaler_update_kernel<<<1, 1, 0, nt_cuda_stream(ctx)>>>(rec, *a);
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_scaler_zero_found_inf_cuda(nt_ctx *ctx, nt_scaler_record *rec) {
  return NT_CUDA(ctx, cudaMemsetAsync(&rec->found_inf, 0, sizeof(float), nt_cuda_stream(ctx)));
}
