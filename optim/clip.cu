/* In-place gradient scale by the clip coefficient, computed on the device from the sum of
 * squares (no host sync). */
#include "optim/vec_access.cuh"
#include "core/cuda_util.h"
#include <math.h>

namespace {
__global__ void clip_scale_kernel(float *g, int64_t n, const float *sumsq, float max_norm,
                                  float *total_norm) {
  float total = sqrtf(*sumsq);
  float c = max_norm / (total + 1e-6f);
  if (!(c < 1.0f) && c == c) c = 1.0f;
  if (total_norm && blockIdx.x == 0 && threadIdx.x == 0) *total_norm = total;
  int64_t stride = 4 * (int64_t)blockDim.x * gridDim.x;
  bool vec = nt_vec::aligned4(g);
  for (int64_t i = 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
    if (vec && i + 4 <= n) {
      float x[4];
      nt_vec::load4(g + i, x);
      for (int e = 0; e < 4; e++) x[e] = __fmul_rn(x[e], c);
      nt_vec::store4(g + i, x);
    } else {
      for (int64_t j = i; j < n && j < i + 4; j++) g[j] = __fmul_rn(g[j], c);
    }
  }
}
}  // namespace

extern "C" nt_status nt_clip_scale_cuda(nt_ctx *ctx, float *g, int64_t n, const float *sumsq,
                                        float max_norm, float *total_norm) {
  int64_t blocks = (n + 1023) / 1024;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535) blocks = 65535;
  clip_scale_kernel<<<(unsigned)blocks, 256, 0, nt_cuda_stream(ctx)>>>(g, n, sumsq, max_norm,
                                                                        total_norm);
  return NT_CUDA_LAUNCHED(ctx);
}
