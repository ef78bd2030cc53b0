/* Dropout with cuRAND's Philox4x32-10: element i uses number offset + i of the stream, exactly
 * as the CPU's nt_rng_u32(seed, offset + i); offset is a multiple of 4, so elements 4j..4j+3
 * are the four words of one Philox block (counter (offset + 4j) / 4, key seed). Inside an RNG
 * step the kernel adds the step base, read from device memory when it runs (core/ctx.h). */
#include "ops/memops_cuda.cuh"
#include "ops/dropout_cuda.cuh"

namespace {

/* y = dropout(x) (SET), y += dropout(x) (ACC) or y = res + dropout(x) (RES), in fp32 with
 * one rounding. */
enum { SET, ACC, RES };

template <typename T, int MODE>
__global__ void dropout_kernel(int64_t n, int64_t npacks, float p, float keep_scale,
                               uint64_t seed, uint64_t rel_offset, const uint64_t *base,
                               const T *x, const T *res, T *y) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  /* base: the step word (a multiple of 4), NULL outside a step. */
  const uint64_t offset = rel_offset + (base ? *base : 0);
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t k = tid; k < npacks; k += stride) {
    int64_t e = k * NT_PACK;
    bool keep[NT_PACK];
    nt_dropout_keep8(seed, offset + (uint64_t)e, p, keep);
    float vx[NT_PACK], vy[NT_PACK];
    nt_load8(x + e, vx);
    if (MODE == ACC) nt_load8(y + e, vy);
    if (MODE == RES) nt_load8(res + e, vy);
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) {
      float v = keep[i] ? vx[i] * keep_scale : 0.0f;
      vy[i] = MODE == SET ? v : vy[i] + v;
    }
    nt_store8(y + e, vy);
  }
  /* Scalar elements: each thread takes whole groups of 4 so one Philox block serves them. */
  int64_t first = npacks * NT_PACK;
  for (int64_t g = first / 4 + tid; g * 4 < n; g += stride) {
    uint4 r = nt_philox_block(seed, offset + (uint64_t)g * 4);
    unsigned int rr[4] = {r.x, r.y, r.z, r.w};
    for (int i = 0; i < 4 && g * 4 + i < n; i++) {
      int64_t e = g * 4 + i;
      float v = nt_u32_to_uniform(rr[i]) > p ? nt_to_f(x[e]) * keep_scale : 0.0f;
      if (MODE == ACC) v += nt_to_f(y[e]);
      if (MODE == RES) v += nt_to_f(res[e]);
      y[e] = nt_from_f<T>(v);
    }
  }
}

template <typename T>
void launch(nt_ctx *ctx, int64_t n, float p, uint64_t seed, uint64_t offset, const T *x,
            const T *res, T *y, bool acc) {
  bool vec = nt_aligned16(x) && nt_aligned16(y) && (!res || nt_aligned16(res));
  int64_t npacks = vec ? n / NT_PACK : 0;
  int64_t work = npacks > 0 ? npacks : (n + 3) / 4;
  const int threads = 256;
  int64_t blocks = (work + threads - 1) / threads, cap = (int64_t)nt_sm_count(ctx) * 16;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  cudaStream_t s = nt_cuda_stream(ctx);
  const uint64_t *base = nt_ctx_rng_base(ctx);
  auto kernel = res ? dropout_kernel<T, RES> : acc ? dropout_kernel<T, ACC> : dropout_kernel<T, SET>;
  pdl_launch(nt_pdl_on(ctx), kernel, dim3((unsigned)blocks), dim3(threads), 0, s, n, npacks, p,
             keep_scale, seed, offset, base, x, res, y);
}

} // namespace

nt_status nt_dropout_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *res, nt_tensor *y,
                          float p, uint64_t seed, uint64_t offset, bool accumulate) {
  int64_t n = nt_tensor_numel(x);
  if (n == 0) return NT_OK;
  NT_DISPATCH_FLOAT(x->dtype, T,
                    launch<T>(ctx, n, p, seed, offset, (const T *)x->data,
                              res ? (const T *)res->data : nullptr, (T *)y->data, accumulate));
  return NT_CUDA_LAUNCHED(ctx);
}
