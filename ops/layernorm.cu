/* LayerNorm on the GPU: a warp (or half of one) per row, a lane always owning the same columns.
 *
 * Rows of 16-bit types with C a multiple of 8 up to 1024 (GPT-2's 768, the small GPT's 384) take
 * the register kernels: a lane holds its NP packs of 8 elements of the row in registers, so the
 * row crosses DRAM once and nothing is re-read. The backward loads x, dy and dx of a row
 * together, keeps its dweight / dbias (and the extras' column sums) in registers across the
 * rows it walks, and writes them once per block: no shared-memory traffic per row. Its extras
 * (ops/layernorm.h) are formed from the rounded dx before it is stored: the dropout mask of
 * ops/dropout_cuda.cuh on the same element numbers as nt_dropout_forward, and the column sums.
 *
 * Other rows (fp32, odd C, misaligned data, wider rows) take the general kernels: the row comes
 * from DRAM once and the variance and output passes hit L1; the backward's every warp adds its
 * rows into its own slice of shared memory.
 *
 * Either way dweight / dbias are summed deterministically in two stages: a per-block partial
 * (the block's warps in order), then a finalize kernel sums the partials in a fixed order. */
#include "ops/memops_cuda.cuh"
#include "ops/dropout_cuda.cuh"
#include <initializer_list>

namespace {

constexpr int kWarps = 8;    /* rows per block in the general forward */
constexpr int kRegMaxNP = 4; /* the register kernels take C <= 32 lanes x 8 x kRegMaxNP */
constexpr int kRegFwdWarps = 4, kRegBwdWarps = 4;

/* The register kernels give a row LPR lanes (32, or 16 for rows up to 512 wide, so that a
 * warp works on two rows and no lane idles at C = 384): lane l of a warp serves row
 * l / LPR of the warp's rows and columns (l % LPR + LPR j) * 8 .. + 7 for its packs j < NP. */
template <int LPR> __device__ __forceinline__ int reg_col(int lane, int j) {
  return (lane % LPR + LPR * j) * NT_PACK;
}

/* Sum over the LPR lanes of a row (a fixed tree; LPR 32 is nt_warp_sum). */
template <int LPR> __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The backward's arithmetic on one pack of 8 (both kernel forms): with g = w * dy and
 * xhat = (x - mean) * rstd, a row first sums g and g * xhat (row_terms); then, with sg and sgx
 * their means over the row, dx += (g - sg - xhat * sgx) * rstd, and the pack's dweight and dbias
 * terms dy * xhat and dy are added to dw and db (pack_grads). */
__device__ __forceinline__ void ln_bwd_row_terms(const float *xv, const float *dv, const float *wv,
                                                 float m, float r, float &sg, float &sgx) {
#pragma unroll
  for (int i = 0; i < NT_PACK; i++) {
    float g = wv[i] * dv[i];
    sg += g;
    sgx += g * (xv[i] - m) * r;
  }
}
__device__ __forceinline__ void ln_bwd_pack_grads(const float *xv, const float *dv,
                                                  const float *wv, float m, float r, float sg,
                                                  float sgx, float *dx, float *dw, float *db) {
#pragma unroll
  for (int i = 0; i < NT_PACK; i++) {
    float xh = (xv[i] - m) * r;
    dx[i] += (wv[i] * dv[i] - sg - xh * sgx) * r;
    dw[i] += dv[i] * xh;
    db[i] += dv[i];
  }
}

template <typename T, typename W, int NP, int LPR>
__global__ void __launch_bounds__(32 * kRegFwdWarps)
    ln_forward_reg_kernel(int64_t rows, int C, const T *__restrict__ x, const W *__restrict__ w,
                          const W *__restrict__ b, T *__restrict__ y, float *__restrict__ mean,
                          float *__restrict__ rstd) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t row = ((int64_t)blockIdx.x * kRegFwdWarps + (threadIdx.x >> 5)) * (32 / LPR) +
                      lane / LPR;
  const bool valid = row < rows; /* a half-warp past the end still joins the shuffles */
  const int64_t o = row * C;
  float v[NP][NT_PACK];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NP; j++) {
    const int c = reg_col<LPR>(lane, j);
    if (valid && c < C) {
      nt_load8(x + o + c, v[j]);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) s += v[j][i];
    }
  }
  const float m = row_sum<LPR>(s) / (float)C;
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < NP; j++)
    if (valid && reg_col<LPR>(lane, j) < C)
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) q += (v[j][i] - m) * (v[j][i] - m);
  const float r = rsqrtf(row_sum<LPR>(q) / (float)C + 1e-5f);
  if (!valid) return;
#pragma unroll
  for (int j = 0; j < NP; j++) {
    const int c = reg_col<LPR>(lane, j);
    if (c >= C) continue;
    float wv[NT_PACK], bv[NT_PACK];
    nt_load8(w + c, wv);
    if (b) nt_load8(b + c, bv);
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) v[j][i] = (v[j][i] - m) * r * wv[i] + (b ? bv[i] : 0.0f);
    nt_store8(y + o + c, v[j]);
  }
  if (lane % LPR == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

/* The backward's extras in the register kernel (ops/layernorm.h). */
struct reg_extras {
  void *dropped;          /* T *, or NULL */
  float p, keep_scale;
  uint64_t seed, rel_offset;
  const uint64_t *base;   /* the RNG step word, NULL outside a step */
  bool colsum;
};

/* Row first + lane / LPR's packs of x and dy, its mean and rstd (zero past the last row; the
 * packs are then not read). */
template <typename T, int NP, int LPR>
__device__ __forceinline__ void ln_bwd_load_row(int64_t first, int64_t rows, int C, int lane,
                                                const T *__restrict__ x, const T *__restrict__ dy,
                                                const float *__restrict__ mean,
                                                const float *__restrict__ rstd,
                                                nt_raw_pack<T> (&xr)[NP], nt_raw_pack<T> (&dyr)[NP],
                                                float &m, float &r) {
  const int64_t row = first + lane / LPR, o = row * C;
  const bool valid = row < rows;
#pragma unroll
  for (int j = 0; j < NP; j++) {
    const int c = reg_col<LPR>(lane, j);
    if (valid && c < C) {
      xr[j] = nt_load_raw(x + o + c);
      dyr[j] = nt_load_raw(dy + o + c);
    }
  }
  m = valid ? mean[row] : 0.0f;
  r = valid ? rstd[row] : 0.0f;
}

/* Grid-stride over rows, kRegBwdWarps * 32 / LPR rows at a time. Dynamic shared memory: one
 * slice of nout * C floats per (warp, row of the warp); block b's partial sums go to
 * partial[b * nout * C ..]: dweight, dbias, then (nout 3) the column sums. */
template <typename T, typename W, int NP, int LPR>
__global__ void __launch_bounds__(32 * kRegBwdWarps)
    ln_backward_reg_kernel(int64_t rows, int C, const T *__restrict__ dy,
                           const T *__restrict__ x, const W *__restrict__ w,
                           const float *__restrict__ mean, const float *__restrict__ rstd, T *dx,
                           float *__restrict__ partial, reg_extras e) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  extern __shared__ float4 smem4[];
  float *smem = reinterpret_cast<float *>(smem4);
  constexpr int RPW = 32 / LPR, SLICES = kRegBwdWarps * RPW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nout = e.colsum ? 3 : 2;
  const uint64_t offset = e.rel_offset + (e.base ? *e.base : 0);
  T *dropped = static_cast<T *>(e.dropped);
  float aw[NP][NT_PACK], ab[NP][NT_PACK], ac[NP][NT_PACK];
#pragma unroll
  for (int j = 0; j < NP; j++)
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) aw[j][i] = ab[j][i] = ac[j][i] = 0.0f;
  /* Software-pipelined: the next row's x, dy, mean and rstd are loaded before this row's sums
   * and stores (its dx, read only by the stores, at the top of its own iteration), so each warp
   * keeps two rows' loads in flight; the arithmetic is unchanged, bit for bit.
   * GPT-2's step 29.65-29.72 against 29.76-29.81 ms, the small GPT's 4.178-4.194 against
   * 4.205-4.211 (bench/RESULTS.md, session 21). The loop runs while the warp's first row
   * exists (a warp-uniform condition). */
  const int64_t step = (int64_t)gridDim.x * SLICES;
  int64_t first = ((int64_t)blockIdx.x * kRegBwdWarps + warp) * RPW;
  nt_raw_pack<T> xr[NP], dyr[NP];
  float m, r;
  ln_bwd_load_row<T, NP, LPR>(first, rows, C, lane, x, dy, mean, rstd, xr, dyr, m, r);
  for (; first < rows; first += step) {
    const int64_t row = first + lane / LPR, o = row * C;
    const bool valid = row < rows;
    nt_raw_pack<T> dxr[NP], xn[NP], dyn[NP];
#pragma unroll
    for (int j = 0; j < NP; j++) {
      const int c = reg_col<LPR>(lane, j);
      if (valid && c < C) dxr[j] = nt_load_raw(dx + o + c);
    }
    float mn, rn;
    ln_bwd_load_row<T, NP, LPR>(first + step, rows, C, lane, x, dy, mean, rstd, xn, dyn, mn, rn);
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int j = 0; j < NP; j++) {
      const int c = reg_col<LPR>(lane, j);
      if (!valid || c >= C) continue;
      float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK];
      nt_unpack(xr[j], xv);
      nt_unpack(dyr[j], dv);
      nt_load8(w + c, wv);
      ln_bwd_row_terms(xv, dv, wv, m, r, sg, sgx);
    }
    sg = row_sum<LPR>(sg) / (float)C;
    sgx = row_sum<LPR>(sgx) / (float)C;
#pragma unroll
    for (int j = 0; j < NP; j++) {
      const int c = reg_col<LPR>(lane, j);
      if (!valid || c >= C) continue;
      float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK], ov[NT_PACK];
      nt_unpack(xr[j], xv);
      nt_unpack(dyr[j], dv);
      nt_unpack(dxr[j], ov);
      nt_load8(w + c, wv);
      ln_bwd_pack_grads(xv, dv, wv, m, r, sg, sgx, ov, aw[j], ab[j]);
      nt_raw_pack<T> out = nt_pack_from<T>(ov);
      nt_store_raw(dx + o + c, out);
      if (!dropped && !e.colsum) continue;
      nt_unpack(out, ov); /* dx as stored: what the unfused ops would read */
      if (dropped) {
        bool keep[NT_PACK];
        nt_dropout_keep8(e.seed, offset + (uint64_t)(o + c), e.p, keep);
#pragma unroll
        for (int i = 0; i < NT_PACK; i++) ov[i] = keep[i] ? ov[i] * e.keep_scale : 0.0f;
        out = nt_pack_from<T>(ov);
        nt_store_raw(dropped + o + c, out);
        nt_unpack(out, ov);
      }
      if (e.colsum)
#pragma unroll
        for (int i = 0; i < NT_PACK; i++) ac[j][i] += ov[i];
    }
#pragma unroll
    for (int j = 0; j < NP; j++) {
      xr[j] = xn[j];
      dyr[j] = dyn[j];
    }
    m = mn;
    r = rn;
  }
  float *mine = smem + (size_t)(warp * RPW + lane / LPR) * nout * C;
#pragma unroll
  for (int j = 0; j < NP; j++) {
    const int c = reg_col<LPR>(lane, j);
    if (c >= C) continue;
#pragma unroll
    for (int i = 0; i < NT_PACK; i++) {
      mine[c + i] = aw[j][i];
      mine[C + c + i] = ab[j][i];
      if (e.colsum) mine[2 * C + c + i] = ac[j][i];
    }
  }
  __syncthreads();
  float *out = partial + (size_t)blockIdx.x * nout * C;
  for (int i = threadIdx.x; i < nout * C; i += blockDim.x) {
    float t = 0.0f;
    for (int k = 0; k < SLICES; k++) t += smem[(size_t)k * nout * C + i];
    out[i] = t;
  }
}

template <typename T, typename W, bool VEC>
__global__ void ln_forward_kernel(int64_t rows, int C, const T *__restrict__ x,
                                  const W *__restrict__ w, const W *__restrict__ b,
                                  T *__restrict__ y, float *__restrict__ mean,
                                  float *__restrict__ rstd) {
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int64_t row = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T *xr = x + row * C;
  T *yr = y + row * C;
  float s = 0.0f;
  if (VEC) {
#pragma unroll 4
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK];
      nt_load8(xr + p, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) s += v[i];
    }
  } else {
    for (int c = lane; c < C; c += 32) s += nt_to_f(xr[c]);
  }
  float m = nt_warp_sum(s) / (float)C, q = 0.0f;
  if (VEC) {
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK];
      nt_load8(xr + p, v);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) q += (v[i] - m) * (v[i] - m);
    }
  } else {
    for (int c = lane; c < C; c += 32) q += (nt_to_f(xr[c]) - m) * (nt_to_f(xr[c]) - m);
  }
  float r = rsqrtf(nt_warp_sum(q) / (float)C + 1e-5f);
  if (VEC) {
    for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
      float v[NT_PACK], wv[NT_PACK], bv[NT_PACK];
      nt_load8(xr + p, v);
      nt_load8(w + p, wv);
      if (b) nt_load8(b + p, bv);
#pragma unroll
      for (int i = 0; i < NT_PACK; i++) v[i] = (v[i] - m) * r * wv[i] + (b ? bv[i] : 0.0f);
      nt_store8(yr + p, v);
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      float o = (nt_to_f(xr[c]) - m) * r * nt_to_f(w[c]) + (b ? nt_to_f(b[c]) : 0.0f);
      yr[c] = nt_from_f<T>(o);
    }
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

/* Dynamic shared memory: nw slices of 2*C floats (dweight part, dbias part). Block b's partial
 * goes to partial[b * 2C ..]. */
template <typename T, typename W, bool VEC>
__global__ void ln_backward_kernel(int64_t rows, int C, const T *__restrict__ dy,
                                   const T *__restrict__ x, const W *__restrict__ w,
                                   const float *__restrict__ mean, const float *__restrict__ rstd,
                                   T *dx, float *__restrict__ partial) {
  extern __shared__ float4 smem4[];
  float *smem = reinterpret_cast<float *>(smem4);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float *sw = smem + (size_t)warp * 2 * C, *sb = sw + C;
  for (int i = threadIdx.x; i < nw * 2 * C; i += blockDim.x) smem[i] = 0.0f;
  __syncthreads();
  for (int64_t row = (int64_t)blockIdx.x * nw + warp; row < rows; row += (int64_t)gridDim.x * nw) {
    const T *xr = x + row * C, *dyr = dy + row * C;
    T *dxr = dx + row * C;
    float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
    if (VEC) {
#pragma unroll 4
      for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
        float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK];
        nt_load8(xr + p, xv);
        nt_load8(dyr + p, dv);
        nt_load8(w + p, wv);
        ln_bwd_row_terms(xv, dv, wv, m, r, sg, sgx);
      }
    } else {
      for (int c = lane; c < C; c += 32) {
        float g = nt_to_f(w[c]) * nt_to_f(dyr[c]);
        sg += g;
        sgx += g * (nt_to_f(xr[c]) - m) * r;
      }
    }
    sg = nt_warp_sum(sg) / (float)C;
    sgx = nt_warp_sum(sgx) / (float)C;
    if (VEC) {
      for (int p = lane * NT_PACK; p < C; p += 32 * NT_PACK) {
        float xv[NT_PACK], dv[NT_PACK], wv[NT_PACK], ov[NT_PACK];
        nt_load8(xr + p, xv);
        nt_load8(dyr + p, dv);
        nt_load8(w + p, wv);
        nt_load8(dxr + p, ov);
        /* the warp's slices in shared memory, moved as float4 */
        float4 *w4 = reinterpret_cast<float4 *>(sw + p), *b4 = reinterpret_cast<float4 *>(sb + p);
        float4 wacc[2] = {w4[0], w4[1]}, bacc[2] = {b4[0], b4[1]};
        ln_bwd_pack_grads(xv, dv, wv, m, r, sg, sgx, ov, reinterpret_cast<float *>(wacc),
                          reinterpret_cast<float *>(bacc));
        w4[0] = wacc[0]; w4[1] = wacc[1]; b4[0] = bacc[0]; b4[1] = bacc[1];
        nt_store8(dxr + p, ov);
      }
    } else {
      for (int c = lane; c < C; c += 32) {
        float d = nt_to_f(dyr[c]), xh = (nt_to_f(xr[c]) - m) * r;
        float o = nt_to_f(dxr[c]) + (nt_to_f(w[c]) * d - sg - xh * sgx) * r;
        dxr[c] = nt_from_f<T>(o);
        sw[c] += d * xh;
        sb[c] += d;
      }
    }
  }
  __syncthreads();
  float *out = partial + (size_t)blockIdx.x * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < nw; k++) s += smem[(size_t)k * 2 * C + i];
    out[i] = s;
  }
}

/* dweight[c] += sum over k of partial[k][0][c], dbias likewise from partial[k][1][c], and with
 * nout 3 colsum[c] = the sum of partial[k][2][c] (partial rows are nout * C floats). A block
 * owns 32 columns; its 16 warps each sum every 16th partial row (coalesced 32-float reads, many
 * in flight), then warp 0 adds the 16 warp sums in order: fixed order, bit-reproducible, and
 * 16x shorter dependent chains than one thread per column walking all the partials. */
constexpr int kFinWarps = 16;

__global__ void __launch_bounds__(32 * kFinWarps)
    ln_finalize_kernel(int C, int nblocks, int nout, const float *__restrict__ partial,
                       float *dweight, float *dbias, float *colsum) {
  pdl_wait(); /* launched with pdl_launch: nothing global before this */
  pdl_trigger();
  __shared__ float s_s[3][kFinWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * 32 + lane;
  float a[3] = {0.0f, 0.0f, 0.0f};
  /* Unrolled so that several partial rows' loads are in flight at once (the sums still run in
   * k order): the loop is a chain of memory round trips otherwise. */
  if (c < C)
#pragma unroll 8
    for (int k = warp; k < nblocks; k += kFinWarps) {
      const float *row = partial + (size_t)k * nout * C + c;
      a[0] += row[0];
      a[1] += row[C];
      if (nout == 3) a[2] += row[2 * C];
    }
#pragma unroll
  for (int q = 0; q < 3; q++) s_s[q][warp][lane] = a[q];
  __syncthreads();
  if (warp || c >= C) return;
  a[0] = a[1] = a[2] = 0.0f;
#pragma unroll
  for (int w = 0; w < kFinWarps; w++)
#pragma unroll
    for (int q = 0; q < 3; q++) a[q] += s_s[q][w][lane];
  dweight[c] += a[0];
  if (dbias) dbias[c] += a[1];
  if (nout == 3) colsum[c] = a[2];
}

/* The register kernels' shape for C and the rows' pointers, as LPR * 8 + NP (0: they do not
 * take them; only 16-bit types reach this): rows up to 512 wide get 16 lanes, wider ones 32. */
constexpr int reg_key(int lpr, int np) { return lpr * 8 + np; }

int reg_shape(int C, std::initializer_list<const void *> ptrs) {
  if (C % NT_PACK != 0 || C > 32 * NT_PACK * kRegMaxNP) return 0;
  for (const void *p : ptrs)
    if (p && !nt_aligned16(p)) return 0;
  const int packs = C / NT_PACK, lpr = packs <= 16 * kRegMaxNP ? 16 : 32;
  return reg_key(lpr, (packs + lpr - 1) / lpr);
}

/* The switch cases of the register kernels' shapes: X(LPR, NP) each. */
#define NT_LN_REG_SHAPES(X) X(16, 1) X(16, 2) X(16, 3) X(16, 4) X(32, 3) X(32, 4)

template <typename T, typename W>
void launch_forward(nt_ctx *ctx, int64_t rows, int C, const nt_tensor *x, const nt_tensor *w,
                    const nt_tensor *b, nt_tensor *y, nt_tensor *mean, nt_tensor *rstd) {
  const T *xp = (const T *)x->data;
  const W *wp = (const W *)w->data, *bp = b ? (const W *)b->data : nullptr;
  T *yp = (T *)y->data;
  float *mp = mean ? (float *)mean->data : nullptr, *rp = rstd ? (float *)rstd->data : nullptr;
  cudaStream_t s = nt_cuda_stream(ctx);
#define NT_LN_FWD_REG(LPR, NP)                                                                   \
  case reg_key(LPR, NP): {                                                                       \
    const int64_t per_block = kRegFwdWarps * (32 / LPR);                                        \
    pdl_launch(nt_pdl_on(ctx), ln_forward_reg_kernel<T, W, NP, LPR>,                            \
               dim3((unsigned)((rows + per_block - 1) / per_block)), dim3(32 * kRegFwdWarps), 0, \
               s, rows, C, xp, wp, bp, yp, mp, rp);                                              \
    return;                                                                                      \
  }
  if constexpr (sizeof(T) == 2) {
    switch (reg_shape(C, {xp, yp, wp, bp})) {
      NT_LN_REG_SHAPES(NT_LN_FWD_REG)
    default: break;
    }
  }
#undef NT_LN_FWD_REG
  bool vec = C % NT_PACK == 0 && nt_aligned16(xp) && nt_aligned16(yp) && nt_aligned16(wp) &&
             (!bp || nt_aligned16(bp));
  unsigned blocks = (unsigned)((rows + kWarps - 1) / kWarps);
  if (vec)
    ln_forward_kernel<T, W, true><<<blocks, kWarps * 32, 0, s>>>(rows, C, xp, wp, bp, yp, mp, rp);
  else
    ln_forward_kernel<T, W, false><<<blocks, kWarps * 32, 0, s>>>(rows, C, xp, wp, bp, yp, mp, rp);
}

/* A backward kernel of nw warps and `smem` bytes of dynamic shared memory, as many blocks as
 * fit on the GPU at once (at most one per rows_per_block rows), then the finalize over their
 * partials of nout * C floats each. launch(grid, partial) enqueues the kernel. */
template <typename K, typename L>
nt_status run_backward(nt_ctx *ctx, K kernel, int nw, int rows_per_block, size_t smem,
                       int64_t rows, int C, int nout, float *dw, float *db, float *colsum,
                       L launch) {
  nt_status st = NT_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)smem));
  if (st) return st;
  int per_sm = 0;
  st = NT_CUDA(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, nw * 32, smem));
  if (st) return st;
  if (per_sm < 1) per_sm = 1;
  int64_t want = (rows + rows_per_block - 1) / rows_per_block;
  int64_t grid = (int64_t)per_sm * nt_sm_count(ctx);
  if (grid > want) grid = want;
  if (grid < 1) grid = 1;
  float *partial = nullptr;
  st = nt_alloc(ctx, (size_t)grid * nout * C * sizeof(float), (void **)&partial);
  if (st) return st;
  launch((unsigned)grid, partial);
  st = NT_CUDA_LAUNCHED(ctx);
  if (!st)
    st = NT_CUDA(ctx, pdl_launch(nt_pdl_on(ctx), ln_finalize_kernel, dim3((C + 31) / 32),
                                 dim3(32 * kFinWarps), 0, nt_cuda_stream(ctx), C, (int)grid,
                                 nout, (const float *)partial, dw, db, colsum));
  nt_free(ctx, partial); /* stream-ordered: reused only by later work on this stream */
  return st;
}

template <typename T, typename W, int NP, int LPR>
nt_status backward_reg(nt_ctx *ctx, int64_t rows, int C, const T *dy, const T *x, const W *w,
                       const float *mean, const float *rstd, T *dx, float *dw, float *db,
                       const reg_extras &e, float *colsum) {
  const int nout = e.colsum ? 3 : 2, rows_per_block = kRegBwdWarps * (32 / LPR);
  const size_t smem = (size_t)rows_per_block * nout * C * sizeof(float);
  auto kernel = ln_backward_reg_kernel<T, W, NP, LPR>;
  cudaStream_t s = nt_cuda_stream(ctx);
  return run_backward(ctx, kernel, kRegBwdWarps, rows_per_block, smem, rows, C, nout, dw, db,
                      colsum,
                      [&](unsigned grid, float *partial) {
                        pdl_launch(nt_pdl_on(ctx), kernel, dim3(grid), dim3(32 * kRegBwdWarps),
                                   smem, s, rows, C, dy, x, w, mean, rstd, dx, partial, e);
                      });
}

template <typename T, typename W, bool VEC>
nt_status backward_general(nt_ctx *ctx, int64_t rows, int C, const T *dy, const T *x,
                           const W *w, const float *mean, const float *rstd, T *dx, float *dw,
                           float *db) {
  /* Warps per block: as many as fit 96 KiB of shared memory, at most 8. */
  int nw = (int)(96 * 1024 / ((size_t)8 * C));
  if (nw > 8) nw = 8;
  if (nw < 1) nw = 1;
  const size_t smem = (size_t)nw * 2 * C * sizeof(float);
  auto kernel = ln_backward_kernel<T, W, VEC>;
  cudaStream_t s = nt_cuda_stream(ctx);
  return run_backward(ctx, kernel, nw, nw, smem, rows, C, 2, dw, db, nullptr,
                      [&](unsigned grid, float *partial) {
                        kernel<<<grid, nw * 32, smem, s>>>(rows, C, dy, x, w, mean, rstd, dx,
                                                           partial);
                      });
}

template <typename T, typename W>
nt_status launch_backward(nt_ctx *ctx, int64_t rows, int C, const nt_tensor *dy,
                          const nt_tensor *x, const nt_tensor *w, const nt_tensor *mean,
                          const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                          const nt_layernorm_bwd_opts *o, bool *fused) {
  const T *dyp = (const T *)dy->data, *xp = (const T *)x->data;
  const W *wp = (const W *)w->data;
  T *dxp = (T *)dx->data;
  const float *mp = (const float *)mean->data, *rp = (const float *)rstd->data;
  float *dwp = (float *)dw->data, *dbp = db ? (float *)db->data : nullptr;
  reg_extras e = {};
  float *colsum = nullptr;
  if (o && o->dropped) {
    e.dropped = o->dropped->data;
    e.p = o->p;
    e.keep_scale = 1.0f / (1.0f - o->p);
    e.seed = o->seed;
    e.rel_offset = o->offset;
    e.base = nt_ctx_rng_base(ctx);
  }
  if (o && o->colsum) {
    e.colsum = true;
    colsum = (float *)o->colsum->data;
  }
  *fused = true;
#define NT_LN_BWD_REG(LPR, NP)                                                                   \
  case reg_key(LPR, NP):                                                                         \
    return backward_reg<T, W, NP, LPR>(ctx, rows, C, dyp, xp, wp, mp, rp, dxp, dwp, dbp, e, colsum);
  if constexpr (sizeof(T) == 2) {
    switch (reg_shape(C, {dyp, xp, wp, dxp, e.dropped})) {
      NT_LN_REG_SHAPES(NT_LN_BWD_REG)
    default: break;
    }
  }
#undef NT_LN_BWD_REG
  *fused = false;
  bool vec = C % NT_PACK == 0 && nt_aligned16(dyp) && nt_aligned16(xp) && nt_aligned16(wp) &&
             nt_aligned16(dxp);
  if (vec) return backward_general<T, W, true>(ctx, rows, C, dyp, xp, wp, mp, rp, dxp, dwp, dbp);
  return backward_general<T, W, false>(ctx, rows, C, dyp, xp, wp, mp, rp, dxp, dwp, dbp);
}

} // namespace

nt_status nt_layernorm_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                                    const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                                    nt_tensor *rstd) {
  int C = (int)x->shape[x->ndim - 1];
  int64_t rows = nt_tensor_numel(x) / C;
  if (rows == 0) return NT_OK;
  if (weight->dtype == NT_F32) {
    NT_DISPATCH_FLOAT(x->dtype, T, launch_forward<T, float>(ctx, rows, C, x, weight, bias, y, mean, rstd));
  } else {
    NT_DISPATCH_FLOAT(x->dtype, T, launch_forward<T, T>(ctx, rows, C, x, weight, bias, y, mean, rstd));
  }
  return NT_CUDA_LAUNCHED(ctx);
}

nt_status nt_layernorm_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                     const nt_tensor *weight, const nt_tensor *mean,
                                     const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                     nt_tensor *dbias, const nt_layernorm_bwd_opts *opts,
                                     bool *fused) {
  int C = (int)x->shape[x->ndim - 1];
  int64_t rows = nt_tensor_numel(x) / C;
  *fused = false;
  if (rows == 0) return NT_OK;
  nt_status st = NT_ERR_INTERNAL;
  if (weight->dtype == NT_F32) {
    NT_DISPATCH_FLOAT(x->dtype, T,
                      st = launch_backward<T, float>(ctx, rows, C, dy, x, weight, mean, rstd, dx,
                                                     dweight, dbias, opts, fused));
  } else {
    NT_DISPATCH_FLOAT(x->dtype, T,
                      st = launch_backward<T, T>(ctx, rows, C, dy, x, weight, mean, rstd, dx,
                                                 dweight, dbias, opts, fused));
  }
  return st;
}
