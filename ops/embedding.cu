/* Embedding on the GPU. Forward: one thread per 8-element pack of the output. Backward without
 * atomics, so the result is bit-reproducible: dwpe sums over the batch per (t, c); for dwte the
 * positions are stably radix-sorted by token id (CUB), and the blocks of a run of equal ids sum
 * that token's rows in a fixed order (emb_dwte_kernel). The sort keys are the ids with every
 * id outside [0, V) replaced by V, so only the bits that V needs are sorted: one radix pass
 * instead of four for a vocabulary up to 255 (shakespeare_char's 65), two for GPT-2's. */
#include "ops/memops_cuda.cuh"
#include <cub/device/device_radix_sort.cuh>
#include <math.h>

namespace {

template <typename T, bool VEC>
__global__ void emb_forward_kernel(int64_t n_rows, int T_len, int C, int V,
                                   const int32_t *__restrict__ tokens, const T *__restrict__ wte,
                                   const T *__restrict__ wpe, T *__restrict__ out) {
  int per_row = VEC ? C / NT_PACK : C;
  int64_t total = n_rows * per_row, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
    int64_t row = k / per_row;
    int c = (int)(k - row * per_row) * (VEC ? NT_PACK : 1);
    int tok = tokens[row], t = (int)(row % T_len);
    bool bad = tok < 0 || tok >= V;
    if (VEC) {
      float v[NT_PACK], p[NT_PACK];
      if (!bad) nt_load8(wte + (int64_t)tok * C + c, v);
      if (wpe) nt_load8(wpe + (int64_t)t * C + c, p);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++)
        v[i] = bad ? __int_as_float(0x7fc00000) : v[i] + (wpe ? p[i] : 0.0f);
      nt_store8(out + row * C + c, v);
    } else {
      float v = bad ? __int_as_float(0x7fc00000) : nt_to_f(wte[(int64_t)tok * C + c]);
      if (wpe) v += nt_to_f(wpe[(int64_t)t * C + c]);
      out[row * C + c] = nt_from_f<T>(v);
    }
  }
}

/* dwpe[t, c] += sum over b of dout[b, t, c], b in order. */
template <typename T>
__global__ void emb_dwpe_kernel(int B, int T_len, int C, const T *__restrict__ dout,
                                float *__restrict__ dwpe) {
  int64_t total = (int64_t)T_len * C, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += nt_to_f(dout[(int64_t)b * total + k]);
    dwpe[k] += s;
  }
}

/* Block (b, chunk) handles columns [64 * chunk, 64 * chunk + 64) of the runs of equal ids that
 * start at sorted indices b, b + gridDim.x, ... (with a small vocabulary, a grid of about what
 * the GPU holds at once: a block per sorted index launched n blocks, nearly all of which found
 * no run start and exited, and that cost more than the sums). Its 8 warps take every 8th row of the run (2 columns per
 * lane, several rows' loads in flight), then warp 0 adds the 8 partial sums in warp order: a
 * fixed summation order, so the result is bit-reproducible, while a long run (a small
 * vocabulary has hundreds or thousands of rows per id) is spread over 8 warps and C / 64
 * blocks. */
constexpr int kDwteWarps = 8, kDwteCols = 64;

template <typename T>
__global__ void __launch_bounds__(32 * kDwteWarps)
    emb_dwte_kernel(int n, int C, int V, const int32_t *__restrict__ sorted_ids,
                    const int32_t *__restrict__ sorted_pos, const T *__restrict__ dout,
                    float *__restrict__ dwte) {
  __shared__ float part[kDwteWarps][kDwteCols];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c0 = blockIdx.y * kDwteCols + 2 * lane;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const int id = sorted_ids[i];   /* the same on every thread: the branches below are uniform */
    if ((i > 0 && sorted_ids[i - 1] == id) || id < 0 || id >= V) continue;
    int end = i + 1;   /* each warp finds the run's end 32 ids at a time */
    for (;;) {
      const int j = end + lane;
      const unsigned same = __ballot_sync(0xffffffffu, j < n && sorted_ids[j] == id);
      if (same != 0xffffffffu) {
        end += __ffs(~same) - 1;
        break;
      }
      end += 32;
    }
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 8
    for (int j = i + warp; j < end; j += kDwteWarps) {
      const T *row = dout + (int64_t)sorted_pos[j] * C;
      if (c0 < C) s0 += nt_to_f(row[c0]);
      if (c0 + 1 < C) s1 += nt_to_f(row[c0 + 1]);
    }
    part[warp][2 * lane] = s0;
    part[warp][2 * lane + 1] = s1;
    __syncthreads();
    if (warp == 0)
      for (int k = lane; k < kDwteCols; k += 32) {
        const int c = blockIdx.y * kDwteCols + k;
        if (c >= C) continue;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kDwteWarps; w++) s += part[w][k];
        dwte[(int64_t)id * C + c] += s;
      }
    __syncthreads();   /* part is reused by the block's next run */
  }
}

/* The sort's input: keys[i] = tok[i], or V for an id outside [0, V); pos[i] = i. */
__global__ void emb_keys_kernel(int n, int V, const int32_t *__restrict__ tok,
                                int32_t *__restrict__ keys, int32_t *__restrict__ pos) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int id = tok[i];
  keys[i] = id < 0 || id >= V ? V : id;
  pos[i] = i;
}

/* The bits a key up to V needs. */
int key_bits(int V) {
  int b = 1;
  while (b < 31 && (V >> b) != 0) b++;
  return b;
}

unsigned grid_for(nt_ctx *ctx, int64_t work, int threads) {
  int64_t blocks = (work + threads - 1) / threads, cap = (int64_t)nt_sm_count(ctx) * 16;
  if (blocks > cap) blocks = cap;
  return (unsigned)(blocks < 1 ? 1 : blocks);
}

template <typename T>
void launch_forward(nt_ctx *ctx, int64_t n_rows, int T_len, int C, int V, const int32_t *tok,
                    const T *wte, const T *wpe, T *out) {
  bool vec = C % NT_PACK == 0 && nt_aligned16(wte) && nt_aligned16(out) && (!wpe || nt_aligned16(wpe));
  int64_t work = n_rows * (vec ? C / NT_PACK : C);
  unsigned grid = grid_for(ctx, work, 256);
  cudaStream_t s = nt_cuda_stream(ctx);
  if (vec)
    emb_forward_kernel<T, true><<<grid, 256, 0, s>>>(n_rows, T_len, C, V, tok, wte, wpe, out);
  else
    emb_forward_kernel<T, false><<<grid, 256, 0, s>>>(n_rows, T_len, C, V, tok, wte, wpe, out);
}

template <typename T>
nt_status dwte_backward(nt_ctx *ctx, int n, int C, int V, const int32_t *tok, const T *dout,
                        float *dwte) {
  cudaStream_t s = nt_cuda_stream(ctx);
  int32_t *buf = nullptr; /* keys, sorted keys, positions in, positions out */
  /* a block per sorted index when the ids are mostly distinct (many short runs: parallelism
   * wins), about what the GPU holds at once for a small vocabulary (few long runs) */
  const int want = V > 8 * nt_sm_count(ctx) ? V : 8 * nt_sm_count(ctx);
  const int runs_grid = n < want ? n : want;
  const int bits = key_bits(V);
  void *temp = nullptr;
  size_t temp_bytes = 0;
  nt_status st = NT_CUDA(ctx, cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes,
                                                              (const int32_t *)nullptr,
                                                              (int32_t *)nullptr,
                                                              (const int32_t *)nullptr,
                                                              (int32_t *)nullptr, n, 0, bits, s));
  if (!st) st = nt_alloc(ctx, (size_t)4 * n * sizeof(int32_t), (void **)&buf);
  if (!st) st = nt_alloc(ctx, temp_bytes ? temp_bytes : 1, &temp);
  if (st) goto done;
  emb_keys_kernel<<<(n + 255) / 256, 256, 0, s>>>(n, V, tok, buf, buf + 2 * n);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st)
    st = NT_CUDA(ctx, cub::DeviceRadixSort::SortPairs(temp, temp_bytes, buf, buf + n, buf + 2 * n,
                                                      buf + 3 * n, n, 0, bits, s));
  if (st) goto done;
  emb_dwte_kernel<T><<<dim3((unsigned)runs_grid, (unsigned)((C + kDwteCols - 1) / kDwteCols)),
                       32 * kDwteWarps, 0, s>>>(n, C, V, buf + n, buf + 3 * n, dout, dwte);
  st = NT_CUDA_LAUNCHED(ctx);
done:
  nt_free(ctx, temp);
  nt_free(ctx, buf);
  return st;
}

template <typename T>
nt_status launch_backward(nt_ctx *ctx, int B, int T_len, int C, int V, const int32_t *tok,
                          const T *dout, float *dwte, float *dwpe) {
  if (dwpe) {
    emb_dwpe_kernel<T><<<grid_for(ctx, (int64_t)T_len * C, 256), 256, 0, nt_cuda_stream(ctx)>>>(
        B, T_len, C, dout, dwpe);
    nt_status st = NT_CUDA_LAUNCHED(ctx);
    if (st) return st;
  }
  if (dwte) return dwte_backward<T>(ctx, B * T_len, C, V, tok, dout, dwte);
  return NT_OK;
}

} // namespace

nt_status nt_embedding_forward_cuda(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *wte,
                                    const nt_tensor *wpe, nt_tensor *out) {
  int64_t B = tokens->shape[0], T_len = tokens->shape[1], C = out->shape[2], V = wte->shape[0];
  if (B * T_len == 0 || C == 0) return NT_OK;
  if (C > INT32_MAX || V > INT32_MAX || T_len > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "embedding_forward: sizes beyond 2^31");
  NT_DISPATCH_FLOAT(out->dtype, T,
                    launch_forward<T>(ctx, B * T_len, (int)T_len, (int)C, (int)V,
                                      (const int32_t *)tokens->data, (const T *)wte->data,
                                      wpe ? (const T *)wpe->data : (const T *)nullptr,
                                      (T *)out->data));
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_embedding_backward_cuda(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *dout,
                                     nt_tensor *dwte, nt_tensor *dwpe) {
  int64_t B = tokens->shape[0], T_len = tokens->shape[1], C = dout->shape[2];
  int64_t V = dwte ? dwte->shape[0] : 0;
  if (B * T_len == 0 || C == 0) return NT_OK;
  if (B * T_len > INT32_MAX || C > INT32_MAX || V > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "embedding_backward: sizes beyond 2^31");
  nt_status st = NT_ERR_INTERNAL;
  NT_DISPATCH_FLOAT(dout->dtype, T,
                    st = launch_backward<T>(ctx, (int)B, (int)T_len, (int)C, (int)V,
                                            (const int32_t *)tokens->data, (const T *)dout->data,
                                            dwte ? (float *)dwte->data : nullptr,
                                            dwpe ? (float *)dwpe->data : nullptr));
  return st;
}
