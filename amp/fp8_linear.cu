/* The FP8 linear layer's two small kernels around its GEMMs:
 *   add:    dst (+)= src + bias, src an fp32 GEMM result with leading dim ld (the padded FP8
 *           products), dst any float dtype with a row stride; the same float operations in
 *           the same order as the CPU reference, so results match it bit for bit.
 *   colsum: db += column sums of dy in fp32, deterministic: blocks of 32 columns x 8 row lanes
 *           write partial sums per row chunk (a fixed tree in shared memory), then one thread
 *           per column adds the chunks in order. */
#include "ops/memops_cuda.cuh"

namespace {

constexpr int kThreads = 256;

template <typename D, typename B>
__global__ void add_kernel(D *dst, int64_t lds, int64_t rows, int64_t cols, const float *src,
                           int64_t ld, const B *bias, bool accumulate) {
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < rows * cols;
       i += (int64_t)gridDim.x * kThreads) {
    int64_t r = i / cols, c = i % cols;
    float v = src[r * ld + c];
    if (bias) v += nt_to_f(bias[c]);
    D *p = dst + r * lds + c;
    if (accumulate) v = nt_to_f(*p) + v;
    *p = nt_from_f<D>(v);
  }
}

template <typename T>
__global__ void colsum_partial(const T *dy, int64_t ld, int64_t rows, int64_t cols,
                               int64_t rows_per_chunk, float *partial) {
  __shared__ float red[8][33];
  int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  int64_t c = (int64_t)blockIdx.x * 32 + tx;
  int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + ty; r < r1; r += 8) s += nt_to_f(dy[r * ld + c]);
  red[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float t = red[0][tx];
#pragma unroll
    for (int k = 1; k < 8; k++) t += red[k][tx];
    partial[(int64_t)blockIdx.y * cols + c] = t;
  }
}

template <typename T>
__global__ void colsum_finish(const float *partial, int64_t chunks, int64_t cols, T *db,
                              int64_t stride) {
  int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; k++) s += partial[k * cols + c];
  T *p = db + c * stride;
  *p = nt_from_f<T>(nt_to_f(*p) + s);
}

template <typename D>
void launch_add(nt_ctx *ctx, nt_tensor *dst, const float *src, int64_t ld, const nt_tensor *bias,
                bool accumulate, unsigned grid) {
  D *d = (D *)dst->data;
  int64_t rows = dst->shape[0], cols = dst->shape[1], lds = dst->stride[0];
  cudaStream_t st = nt_cuda_stream(ctx);
  if (!bias) {
    add_kernel<D, float><<<grid, kThreads, 0, st>>>(d, lds, rows, cols, src, ld, nullptr,
                                                    accumulate);
    return;
  }
  NT_DISPATCH_FLOAT(bias->dtype, B,
                    add_kernel<D, B><<<grid, kThreads, 0, st>>>(d, lds, rows, cols, src, ld,
                                                                (const B *)bias->data, accumulate));
}

}  // namespace

extern "C" nt_status nt_fp8_linear_add_cuda(nt_ctx *ctx, nt_tensor *dst, const float *src,
                                            int64_t ld, const nt_tensor *bias, bool accumulate) {
  int64_t n = dst->shape[0] * dst->shape[1];
  if (n == 0) return NT_OK;
  int64_t blocks = (n + kThreads - 1) / kThreads, cap = (int64_t)nt_sm_count(ctx) * 16;
  unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
  if (bias && bias->stride[0] != 1)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "fp8 linear: the bias needs unit stride");
  NT_DISPATCH_FLOAT(dst->dtype, D, launch_add<D>(ctx, dst, src, ld, bias, accumulate, grid));
  return NT_CUDA_LAUNCHED(ctx);
}

extern "C" nt_status nt_fp8_linear_colsum_cuda(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *db) {
  int64_t rows = dy->shape[0], cols = dy->shape[1];
  if (cols == 0) return NT_OK;
  /* Chunks of at least 256 rows, at most 256 chunks: enough blocks to fill the GPU at GPT
   * sizes, few partials to add. */
  int64_t chunks = (rows + 255) / 256;
  if (chunks > 256) chunks = 256;
  if (chunks < 1) chunks = 1;
  int64_t per = (rows + chunks - 1) / chunks;
  if (per < 1) per = 1;
  float *partial = NULL;
  nt_status st = nt_alloc(ctx, sizeof(float) * (size_t)(chunks * cols), (void **)&partial);
  if (st) return st;
  cudaStream_t s = nt_cuda_stream(ctx);
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)chunks);
  NT_DISPATCH_FLOAT(dy->dtype, T,
                    colsum_partial<T><<<grid, kThreads, 0, s>>>((const T *)dy->data,
                                                                dy->stride[0], rows, cols, per,
                                                                partial));
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st) {
    unsigned g2 = (unsigned)((cols + kThreads - 1) / kThreads);
    NT_DISPATCH_FLOAT(db->dtype, T,
                      colsum_finish<T><<<g2, kThreads, 0, s>>>(partial, chunks, cols,
                                                               (T *)db->data, db->stride[0]));
    st = NT_CUDA_LAUNCHED(ctx);
  }
  nt_free(ctx, partial);
  return st;
}
