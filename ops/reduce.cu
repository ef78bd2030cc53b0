/* Multi-tensor reductions. One launch covers up to kMaxTensors tensors, their descriptors
 * passed by value as the kernel's parameter (about 8 KB: Volta+ with CUDA 12.1+ take up to
 * 32 KB), so nothing is copied from the host and the launch can be captured in a CUDA graph.
 * Every tensor is cut into chunks of kChunk elements and block b takes global chunk b, so the
 * work split (and with it the sum order) depends only on the tensor sizes: deterministic. */
#include "ops/memops_cuda.cuh"
#include <math.h>

namespace {

constexpr int kMaxTensors = 288;
constexpr int64_t kChunk = 16384; /* a multiple of NT_PACK: chunk starts stay 16-byte aligned */
constexpr int kThreads = 256;

struct mt_args {
  void *ptr[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_chunk[kMaxTensors + 1]; /* tensor k owns chunks [first_chunk[k], first_chunk[k+1]) */
  uint8_t dtype[kMaxTensors];
  int ntensors;
};
static_assert(sizeof(mt_args) < 32000, "kernel parameters are limited to 32 KB");

/* The tensor that block `b` works on: binary search over the chunk starts. */
__device__ __forceinline__ int find_tensor(const mt_args &a, int64_t b) {
  int lo = 0, hi = a.ntensors - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (a.first_chunk[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <typename T>
__device__ float chunk_sum_squares(const T *p, int64_t begin, int64_t end) {
  float s = 0.0f;
  if (nt_aligned16(p)) {
    int64_t vend = begin + (end - begin) / NT_PACK * NT_PACK;
    for (int64_t i = begin + threadIdx.x * NT_PACK; i < vend; i += blockDim.x * NT_PACK) {
      float v[NT_PACK];
      nt_load8(p + i, v);
#pragma unroll
      for (int j = 0; j < NT_PACK; j++) s += v[j] * v[j];
    }
    begin = vend;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float v = nt_to_f(p[i]);
    s += v * v;
  }
  return s;
}

__global__ void sum_squares_kernel(mt_args a, float *partial) {
  __shared__ float red[32];
  int64_t b = blockIdx.x;
  int k = find_tensor(a, b);
  int64_t begin = (b - a.first_chunk[k]) * kChunk, end = begin + kChunk;
  if (end > a.n[k]) end = a.n[k];
  float s = 0.0f;
  switch (a.dtype[k]) {
  case NT_F32: s = chunk_sum_squares((const float *)a.ptr[k], begin, end); break;
  case NT_F16: s = chunk_sum_squares((const __half *)a.ptr[k], begin, end); break;
  default: s = chunk_sum_squares((const __nv_bfloat16 *)a.ptr[k], begin, end); break;
  }
  s = nt_block_sum(s, red);
  if (threadIdx.x == 0) partial[b] = s;
}

/* One block: partial sums in a fixed order, fp64. */
__global__ void finalize_sum_kernel(int64_t n, const float *__restrict__ partial, float *out) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = nt_block_sum(s, red);
  if (threadIdx.x == 0) *out = (float)s;
}

template <typename T>
__device__ bool chunk_unscale(T *p, int64_t begin, int64_t end, float inv) {
  bool bad = false;
  if (nt_aligned16(p)) {
    int64_t vend = begin + (end - begin) / NT_PACK * NT_PACK;
    for (int64_t i = begin + threadIdx.x * NT_PACK; i < vend; i += blockDim.x * NT_PACK) {
      float v[NT_PACK];
      nt_load8(p + i, v);
#pragma unroll
      for (int j = 0; j < NT_PACK; j++) {
        bad |= !isfinite(v[j]);
        v[j] *= inv;
      }
      nt_store8(p + i, v);
    }
    begin = vend;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float v = nt_to_f(p[i]);
    bad |= !isfinite(v);
    p[i] = nt_from_f<T>(v * inv);
  }
  return bad;
}

__global__ void unscale_kernel(mt_args a, const float *__restrict__ inv_scale, float *found_inf) {
  int64_t b = blockIdx.x;
  int k = find_tensor(a, b);
  int64_t begin = (b - a.first_chunk[k]) * kChunk, end = begin + kChunk;
  if (end > a.n[k]) end = a.n[k];
  float inv = *inv_scale;
  bool bad;
  switch (a.dtype[k]) {
  case NT_F32: bad = chunk_unscale((float *)a.ptr[k], begin, end, inv); break;
  case NT_F16: bad = chunk_unscale((__half *)a.ptr[k], begin, end, inv); break;
  default: bad = chunk_unscale((__nv_bfloat16 *)a.ptr[k], begin, end, inv); break;
  }
  /* Only ever sets the flag; every writer writes the same value. */
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

template <typename T>
__global__ void mean_kernel(int64_t n, const T *__restrict__ x, float *out) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += nt_to_f(x[i]);
  s = nt_block_sum(s, red);
  if (threadIdx.x == 0) *out = n ? (float)(s / (double)n) : __int_as_float(0x7fc00000);
}

/* Fills `a` with the non-empty tensors of xs[from..] (at most kMaxTensors); returns the next
 * index; a.first_chunk[a.ntensors] is the number of chunks (blocks). */
int fill_args(const nt_tensor *const *xs, int n, int from, mt_args *a) {
  a->ntensors = 0;
  a->first_chunk[0] = 0;
  int i = from;
  for (; i < n && a->ntensors < kMaxTensors; i++) {
    int64_t m = nt_tensor_numel(xs[i]);
    if (m == 0) continue;
    int k = a->ntensors++;
    a->ptr[k] = xs[i]->data;
    a->n[k] = m;
    a->dtype[k] = (uint8_t)xs[i]->dtype;
    a->first_chunk[k + 1] = a->first_chunk[k] + (m + kChunk - 1) / kChunk;
  }
  return i;
}

} // namespace

nt_status nt_sum_squares_cuda(nt_ctx *ctx, const nt_tensor *const *xs, int n, nt_tensor *out) {
  cudaStream_t s = nt_cuda_stream(ctx);
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += (nt_tensor_numel(xs[i]) + kChunk - 1) / kChunk;
  if (total == 0) return NT_CUDA(ctx, cudaMemsetAsync(out->data, 0, sizeof(float), s));
  float *partial = nullptr;
  nt_status st = nt_alloc(ctx, (size_t)total * sizeof(float), (void **)&partial);
  if (st) return st;
  int64_t done = 0;
  for (int from = 0; from < n && !st;) {
    mt_args a;
    from = fill_args(xs, n, from, &a);
    int64_t blocks = a.first_chunk[a.ntensors];
    if (blocks == 0) continue;
    sum_squares_kernel<<<(unsigned)blocks, kThreads, 0, s>>>(a, partial + done);
    st = NT_CUDA_LAUNCHED(ctx);
    done += blocks;
  }
  if (!st) {
    finalize_sum_kernel<<<1, 1024, 0, s>>>(total, partial, (float *)out->data);
    st = NT_CUDA_LAUNCHED(ctx);
  }
  nt_free(ctx, partial);
  return st;
}

nt_status nt_unscale_and_check_cuda(nt_ctx *ctx, nt_tensor *const *xs, int n,
                                    const nt_tensor *inv_scale, nt_tensor *found_inf) {
  cudaStream_t s = nt_cuda_stream(ctx);
  nt_status st = NT_OK;
  for (int from = 0; from < n && !st;) {
    mt_args a;
    from = fill_args((const nt_tensor *const *)xs, n, from, &a);
    int64_t blocks = a.first_chunk[a.ntensors];
    if (blocks == 0) continue;
    unscale_kernel<<<(unsigned)blocks, kThreads, 0, s>>>(a, (const float *)inv_scale->data,
                                                         (float *)found_inf->data);
    st = NT_CUDA_LAUNCHED(ctx);
  }
  return st;
}

nt_status nt_mean_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *out) {
  int64_t n = nt_tensor_numel(x);
  cudaStream_t s = nt_cuda_stream(ctx);
  if (n == 0) {
    mean_kernel<float><<<1, 32, 0, s>>>(0, nullptr, (float *)out->data);
    return NT_CUDA_LAUNCHED(ctx);
  }
  NT_DISPATCH_FLOAT(x->dtype, T,
                    mean_kernel<T><<<1, 1024, 0, s>>>(n, (const T *)x->data, (float *)out->data));
  return NT_CUDA_LAUNCHED(ctx);
}
