/* The per-step prepare of the fused optimizers on the device: one thread reads found_inf and
 * the gradients' sum of squares and writes the step record the update kernels read. */
#include "optim/optim_common.h"
#include "core/cuda_util.h"

namespace {
__global__ void optim_prepare_kernel(nt_optim_record *rec, float *found, const float *grad_scale,
                                     const float *sumsq, float max_norm, double beta1,
                                     double beta2, double lr, const float *lr_dev,
                                     nt_optim_groups g) {
  nt_optim_prepare_rule(rec, found, grad_scale, sumsq, max_norm, beta1, beta2, lr, lr_dev, &g);
}
}  // namespace

extern "C" nt_status nt_optim_prepare_cuda(nt_ctx *ctx, nt_optim_record *rec, float *found,
                                           const float *grad_scale, const float *sumsq,
                                           float max_norm, double beta1, double beta2, double lr,
                                           const float *lr_dev, const nt_optim_groups *g) {
  optim_prepare_kernel<<<1, 1, 0, nt_cuda_stream(ctx)>>>(rec, found, grad_scale, sumsq, max_norm,
                                                         beta1, beta2, lr, lr_dev, *g);
  return NT_CUDA_LAUNCHED(ctx);
}
