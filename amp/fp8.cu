/* FP8 delayed scaling on the device: one block per tensor reduces its amax history (NaN
 * propagating max), applies the rule of fp8_rule.h and rolls the history. Also an amax
 * recorder for F32 tensors (max of |x| into the tensor's slot). */
#include "amp/fp8_rule.h"
#include "core/cuda_util.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) fp8_update_kernel(float *base, int64_t stride) {
  __shared__ float red[kThreads];
  nt_fp8_record *r = reinterpret_cast<nt_fp8_record *>(base + stride * blockIdx.x);
  float *hist = reinterpret_cast<float *>(r + 1);
  if (threadIdx.x == 0) hist[r->pos] = r->amax;
  __syncthreads();
  float m = 0.0f;
  for (int j = threadIdx.x; j < r->len; j += kThreads) m = nt_fp8_nanmax(m, hist[j]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) red[threadIdx.x] = nt_fp8_nanmax(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) nt_fp8_finish(r, hist, red[0]);
}

/* Non-negative floats order like their bit patterns, so atomicMax on the int view is a float
 * max; a NaN (bits above inf) wins, which propagates it as the update expects. */
__global__ void amax_kernel(float *amax, const float *x, int64_t n) {
  __shared__ float red[kThreads];
  float m = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads)
    m = nt_fp8_nanmax(m, fabsf(x[i]));
  red[threadIdx.x] = m;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) red[threadIdx.x] = nt_fp8_nanmax(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float v = red[0];
    int bits = v != v ? 0x7fc00000 : __float_as_int(v);
    atomicMax(reinterpret_cast<int *>(amax), bits);
  }
}

}  // namespace

extern "C" nt_status nt_fp8_update_cuda(nt_ctx *ctx, float *base, int n, int64_t stride) {
  fp8_update_kernel<<<n, kThreads, 0, nt_cuda_stream(ctx)>>>(base, stride);
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_fp8_record_amax_cuda(nt_ctx *ctx, float *amax, const float *x, int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 1024) blocks = 1024;
  if (blocks < 1) return NT_OK;
  amax_kernel<<<(unsigned)blocks, kThreads, 0, nt_cuda_stream(ctx)>>>(amax, x, n);
  return NT_CUDA_LAUNCHED(ctx);
}
