/* Elementwise maps: one kernel template per op, 8-element packs with 16-byte accesses when
 * every pointer is 16-byte aligned, a scalar loop for the tail (or for everything otherwise). */
#include "ops/memops_cuda.cuh"
#include "ops/gelu_rule.h"

namespace {

/* One element: a, b are the inputs, o the current output (read only by accumulating ops). */
template <nt_ew_op OP> struct ew;
template <> struct ew<NT_EW_GELU_FWD> {
  static constexpr bool reads_b = false, reads_out = false;
  __device__ static float f(float a, float, float, float) { return nt_gelu(a); }
};
template <> struct ew<NT_EW_GELU_BWD> {
  static constexpr bool reads_b = true, reads_out = true;
  __device__ static float f(float x, float dy, float o, float) { return o + dy * nt_gelu_grad(x); }
};
template <> struct ew<NT_EW_RELU_FWD> {
  static constexpr bool reads_b = false, reads_out = false;
  __device__ static float f(float a, float, float, float) { return a > 0.0f ? a : 0.0f; }
};
template <> struct ew<NT_EW_RELU_BWD> {
  static constexpr bool reads_b = true, reads_out = true;
  __device__ static float f(float y, float dy, float o, float) { return o + (y > 0.0f ? dy : 0.0f); }
};
template <> struct ew<NT_EW_ADD> {
  static constexpr bool reads_b = true, reads_out = false;
  __device__ static float f(float a, float b, float, float) { return a + b; }
};
template <> struct ew<NT_EW_AXPY> {
  static constexpr bool reads_b = false, reads_out = true;
  __device__ static float f(float a, float, float o, float alpha) { return o + alpha * a; }
};
template <> struct ew<NT_EW_SCALE> {
  static constexpr bool reads_b = false, reads_out = false;
  __device__ static float f(float a, float, float, float alpha) { return alpha * a; }
};

/* out may alias a or b: each element is read and written by the same thread. */
template <typename T, nt_ew_op OP>
__global__ void ew_kernel(int64_t n, int64_t npacks, float alpha, const T *a, const T *b, T *out) {
  using E = ew<OP>;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t p = tid; p < npacks; p += stride) {
    float va[NT_PACK], vb[NT_PACK], vo[NT_PACK];
    nt_load8(a + p * NT_PACK, va);
    if (E::reads_b) nt_load8(b + p * NT_PACK, vb);
    if (E::reads_out) nt_load8(out + p * NT_PACK, vo);
#pragma unroll
    for (int i = 0; i < NT_PACK; i++)
      vo[i] = E::f(va[i], E::reads_b ? vb[i] : 0.0f, E::reads_out ? vo[i] : 0.0f, alpha);
    nt_store8(out + p * NT_PACK, vo);
  }
  for (int64_t i = npacks * NT_PACK + tid; i < n; i += stride) {
    float vb = E::reads_b ? nt_to_f(b[i]) : 0.0f, vo = E::reads_out ? nt_to_f(out[i]) : 0.0f;
    out[i] = nt_from_f<T>(E::f(nt_to_f(a[i]), vb, vo, alpha));
  }
}

template <typename T, nt_ew_op OP>
void launch(nt_ctx *ctx, int64_t n, float alpha, const T *a, const T *b, T *out) {
  bool vec = nt_aligned16(a) && nt_aligned16(out) && (!ew<OP>::reads_b || nt_aligned16(b));
  int64_t npacks = vec ? n / NT_PACK : 0;
  int64_t work = npacks > 0 ? npacks : n;
  const int threads = 256;
  int64_t blocks = (work + threads - 1) / threads;
  int64_t cap = (int64_t)nt_sm_count(ctx) * 16; /* enough resident work; the rest strides */
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  ew_kernel<T, OP><<<(unsigned)blocks, threads, 0, nt_cuda_stream(ctx)>>>(n, npacks, alpha, a, b,
                                                                          out);
}

template <typename T>
void launch_op(nt_ctx *ctx, nt_ew_op op, int64_t n, float alpha, const T *a, const T *b, T *out) {
  switch (op) {
  case NT_EW_GELU_FWD: launch<T, NT_EW_GELU_FWD>(ctx, n, alpha, a, b, out); break;
  case NT_EW_GELU_BWD: launch<T, NT_EW_GELU_BWD>(ctx, n, alpha, a, b, out); break;
  case NT_EW_RELU_FWD: launch<T, NT_EW_RELU_FWD>(ctx, n, alpha, a, b, out); break;
  case NT_EW_RELU_BWD: launch<T, NT_EW_RELU_BWD>(ctx, n, alpha, a, b, out); break;
  case NT_EW_ADD: launch<T, NT_EW_ADD>(ctx, n, alpha, a, b, out); break;
  case NT_EW_AXPY: launch<T, NT_EW_AXPY>(ctx, n, alpha, a, b, out); break;
  case NT_EW_SCALE: launch<T, NT_EW_SCALE>(ctx, n, alpha, a, b, out); break;
  }
}

} // namespace

nt_status nt_elementwise_map_cuda(nt_ctx *ctx, nt_ew_op op, float alpha, const nt_tensor *a,
                                  const nt_tensor *b, nt_tensor *out) {
  int64_t n = nt_tensor_numel(out);
  if (n == 0) return NT_OK;
  NT_DISPATCH_FLOAT(out->dtype, T,
                    launch_op<T>(ctx, op, n, alpha, (const T *)a->data,
                                 b ? (const T *)b->data : (const T *)nullptr, (T *)out->data));
  return NT_CUDA_LAUNCHED(ctx);
}
