/* Tensor-core causal attention backward (FlashAttention-2): a block owns 64 or 128 key rows
 * (4 or 8 warps of 16 keys) and walks the query tiles of 64 from the diagonal to the end,
 * double-buffering Q and dO with cp.async. Per query tile, each warp recomputes P^T from the
 * saved lse, then
 *   dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - D),  dK += dS^T Q
 * in registers (fp32 accumulators), and dQ += dS K is reduced across key blocks with fp32
 * reductions into dq_acc (scaled and added into dq by the caller). The kernel runs one
 * barrier per query tile (tile i's dQ product after the barrier of tile i + 1, two dS^T
 * buffers) and reduces dQ four floats at a time (a kernel with two barriers per tile lost
 * to it and was removed). Operands are strided views with 16-byte aligned rows.
 *
 * Dropout (kDrop, a separate instantiation of the default kernel: the kernels without it are
 * unchanged): with mr = keep ? 1 / (1 - p_eff) : 0 per probability,
 *   dV += (P^T * mr) dO,  dS^T = P^T * (dP^T * mr - D),
 * D = rowsum(dO * O) of the dropped output (ops/attention.c derives it). The keep bits
 * are regenerated from the Philox stream: per query tile, lane L draws the 16 keep bits of the
 * warp's 16 keys (16 consecutive mask elements, one Philox block when T is a multiple of 16)
 * for queries 2L and 2L + 1 into one word, and a thread holding queries
 * 8 nt + 2 (L % 4) + {0, 1} of keys L / 4 (+ 8) fetches word 4 nt + L % 4 with one shuffle
 * per nt. */
#include "ops/attention_cuda.cuh"
#include "ops/attention_mma.cuh"
#include "ops/attention_bwd_common.cuh"
#include "core/cuda_util.h"

namespace {

using namespace nt_attn;

constexpr int kBr = 64;      /* queries per tile */
constexpr int kLongT = 512;  /* from this T on, 8-warp blocks */

/* A block of W warps owns 16 * W keys (16 per warp); two dS^T buffers. */
template <int D, int W> constexpr int smem_bytes() {
  return (2 * 16 * W + 4 * kBr) * (D + kLdPad) * 2 + 2 * 16 * W * (kBr + kLdPad) * 2 +
         4 * kBr * 4;
}

/* One warp's share of a query tile: its 16 keys against the tile's 64 queries (S^T, dP^T,
 * P^T, dS^T; dV and dK accumulate in registers, dS^T goes to shared memory for the dQ
 * product). kMask: the tile meets the diagonal (queries before a key get P = 0); the other
 * tiles run without the per-element test. kDrop: dropout as the top comment says. */
template <typename T, int D, bool kMask, bool kDrop>
__device__ __forceinline__ void warp_tile(const uint32_t (&kf)[D / 16][4],
                                          const uint32_t (&vf)[D / 16][4],
                                          float (&gk)[D / 8][4], float (&gv)[D / 8][4],
                                          const T *qb, const T *db, const float *lb,
                                          const float *drb, T *dss, int kr0, int lane, float sl2,
                                          int q_base, int key_a, const drop_at &da) {
  constexpr int kLd = D + kLdPad, kLdS = kBr + kLdPad, kDt = D / 8, kKs = D / 16, kSt = kBr / 8;
  /* Keep bits, drawn first so the integer work overlaps the tensor-core work. */
  uint32_t kw = 0u;
  if constexpr (kDrop) kw = bwd_keep_word<kMask>(da, q_base, key_a, lane);
  /* S^T = K Q^T and dP^T = V dO^T: [16 keys x 64 queries] per warp. */
  float st[kSt][4], dpt[kSt][4];
#pragma unroll
  for (int i = 0; i < kSt; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kKs; kk++) {
#pragma unroll
    for (int np = 0; np < kSt / 2; np++) {
      uint32_t b[4];
      ldsm_x4(b, bt_frag_addr(qb, kLd, np * 16, kk * 16, lane));
      mma_op<T>::run(st[2 * np], kf[kk], b[0], b[1]);
      mma_op<T>::run(st[2 * np + 1], kf[kk], b[2], b[3]);
      ldsm_x4(b, bt_frag_addr(db, kLd, np * 16, kk * 16, lane));
      mma_op<T>::run(dpt[2 * np], vf[kk], b[0], b[1]);
      mma_op<T>::run(dpt[2 * np + 1], vf[kk], b[2], b[3]);
    }
  }
  p_ds<kSt, kMask, kDrop>(st, dpt, kw, lb, drb, q_base, key_a, lane, sl2, da);
  /* dV += P^T dO and dK += dS^T Q (the accumulator layout is the A-fragment layout). */
#pragma unroll
  for (int kk = 0; kk < kBr / 16; kk++) {
    uint32_t ap[4], as[4];
    ap[0] = mma_op<T>::pack(st[2 * kk][0], st[2 * kk][1]);
    ap[1] = mma_op<T>::pack(st[2 * kk][2], st[2 * kk][3]);
    ap[2] = mma_op<T>::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]);
    ap[3] = mma_op<T>::pack(st[2 * kk + 1][2], st[2 * kk + 1][3]);
    as[0] = mma_op<T>::pack(dpt[2 * kk][0], dpt[2 * kk][1]);
    as[1] = mma_op<T>::pack(dpt[2 * kk][2], dpt[2 * kk][3]);
    as[2] = mma_op<T>::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
    as[3] = mma_op<T>::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
    /* dS^T to shared memory for the dQ product (rows of keys, columns of queries). */
    const int kr = kr0 + (lane >> 2), qc = kk * 16 + 2 * (lane & 3);
    *reinterpret_cast<uint32_t *>(dss + kr * kLdS + qc) = as[0];
    *reinterpret_cast<uint32_t *>(dss + (kr + 8) * kLdS + qc) = as[1];
    *reinterpret_cast<uint32_t *>(dss + kr * kLdS + qc + 8) = as[2];
    *reinterpret_cast<uint32_t *>(dss + (kr + 8) * kLdS + qc + 8) = as[3];
#pragma unroll
    for (int dp = 0; dp < kDt / 2; dp++) {
      uint32_t b[4];
      ldsm_x4_t(b, b_frag_addr_t(db, kLd, kk * 16, dp * 16, lane));
      mma_op<T>::run(gv[2 * dp], ap, b[0], b[1]);
      mma_op<T>::run(gv[2 * dp + 1], ap, b[2], b[3]);
      ldsm_x4_t(b, b_frag_addr_t(qb, kLd, kk * 16, dp * 16, lane));
      mma_op<T>::run(gk[2 * dp], as, b[0], b[1]);
      mma_op<T>::run(gk[2 * dp + 1], as, b[2], b[3]);
    }
  }
}

/* One warp's part of a query tile: the tensor-core work when its 16 keys meet some query of
 * the tile (query >= key), else zeros for its rows of dS^T (only the dQ product reads them). */
template <typename T, int D, int W, bool kDrop>
__device__ __forceinline__ void key_tile(const uint32_t (&kf)[D / 16][4],
                                         const uint32_t (&vf)[D / 16][4], float (&gk)[D / 8][4],
                                         float (&gv)[D / 8][4], const T *qb, const T *db,
                                         const float *lb, const float *drb, T *dss, int warp,
                                         int lane, float sl2, int qt, int k0, int key_a,
                                         const nt_attn_drop &dr, unsigned long long head_first,
                                         int T_) {
  constexpr int kLdS = kBr + kLdPad, kBc = 16 * W;
  /* Warp-uniform: do this warp's 16 keys meet any query of the tile? */
  const bool active = qt * kBr + kBr - 1 >= k0 + warp * 16;
  const bool needs_mask = qt * kBr < k0 + kBc - 1;   /* some query may precede some key */
  if (!active) {
    const int kr = warp * 16 + (lane >> 2);
#pragma unroll
    for (int c = 0; c < kBr; c += 8) {
      *reinterpret_cast<uint32_t *>(dss + kr * kLdS + c + 2 * (lane & 3)) = 0u;
      *reinterpret_cast<uint32_t *>(dss + (kr + 8) * kLdS + c + 2 * (lane & 3)) = 0u;
    }
  } else {
    drop_at da = {};
    if constexpr (kDrop) {
      da.dr = dr;
      da.T = T_;
      da.q_first = head_first + (unsigned long long)(qt * kBr) * T_ + k0 + warp * 16;
    }
    if (needs_mask)
      warp_tile<T, D, true, kDrop>(kf, vf, gk, gv, qb, db, lb, drb, dss, warp * 16, lane, sl2,
                                   qt * kBr, key_a, da);
    else
      warp_tile<T, D, false, kDrop>(kf, vf, gk, gv, qb, db, lb, drb, dss, warp * 16, lane, sl2,
                                    qt * kBr, key_a, da);
  }
}

/* dQ[16 queries, D / (W / 4) columns of this warp] += dS K over the block's keys, added into
 * dq_h (one head's fp32 accumulator) with reductions: the W warps split the tile's 64
 * queries in 4 blocks of 16 and D in W / 4. Lane pairs swap halves first so that each lane
 * owns four adjacent floats of one row, one 16-byte reduction instead of two 8-byte ones
 * (half the reduction requests reaching L2). */
template <typename T, int D, int W>
__device__ __forceinline__ void dq_tile(const T *dss, const T *ks, float *dq_h, int q_first,
                                        int T_, int warp, int lane) {
  constexpr int kLd = D + kLdPad, kLdS = kBr + kLdPad, kBc = 16 * W;
  constexpr int kSplit = W / 4, kDw = D / kSplit;
  static_assert(W % 4 == 0 && kDw % 16 == 0, "dQ split must leave 16-column pieces");
  const int mq = (warp & 3) * 16, d0 = (warp >> 2) * kDw;
  /* Even and odd key steps accumulate apart (summed below): twice the independent
   * tensor-core chains, half as long. */
  float gq[kDw / 8][4], gq2[kDw / 8][4];
#pragma unroll
  for (int i = 0; i < kDw / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) gq[i][e] = gq2[i][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; kk++) {
    uint32_t a[4];
    ldsm_x4_t(a, at_frag_addr_t(dss, kLdS, mq, kk * 16, lane));
    float (&acc)[kDw / 8][4] = (kk & 1) ? gq2 : gq;
#pragma unroll
    for (int dp = 0; dp < kDw / 16; dp++) {
      uint32_t b[4];
      ldsm_x4_t(b, b_frag_addr_t(ks, kLd, kk * 16, d0 + dp * 16, lane));
      mma_op<T>::run(acc[2 * dp], a, b[0], b[1]);
      mma_op<T>::run(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
#pragma unroll
  for (int i = 0; i < kDw / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) gq[i][e] += gq2[i][e];
  red_dq_rows_v4<kDw / 8>(gq, dq_h, D, q_first + mq, d0, T_, lane);
}

/* One barrier per query tile, the dQ product of tile i running after that barrier together
 * with the key-side work of tile i + 1 (two dS^T buffers). */
template <typename T, int D, int W, bool kDrop>
__global__ void __launch_bounds__(32 * W)
    bwd_kernel(nt_attn_view dov, nt_attn_view qv, nt_attn_view kv, nt_attn_view vv,
               const float *__restrict__ lse, const float *__restrict__ d_rows,
               float *__restrict__ dq_acc, nt_attn_view dkv, nt_attn_view dvv, int BH, int H,
               int T_, float scale, nt_attn_drop dr, bool overwrite) {
  constexpr int kThreads = 32 * W, kBc = 16 * W;
  constexpr int kLd = D + kLdPad, kLdS = kBr + kLdPad, kDt = D / 8, kKs = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *ks = reinterpret_cast<T *>(smem_raw);
  T *vs = ks + kBc * kLd;
  T *qs = vs + kBc * kLd;       /* two buffers */
  T *dos = qs + 2 * kBr * kLd;  /* two buffers */
  T *dss = dos + 2 * kBr * kLd; /* dS^T [key][query], two buffers */
  float *lse_s = reinterpret_cast<float *>(dss + 2 * kBc * kLdS); /* two buffers, * log2e */
  float *dr_s = lse_s + 2 * kBr;                                 /* two buffers */

  const int n_t = (T_ + kBr - 1) / kBr;
  const int kt = (int)(blockIdx.x / BH);   /* low key tiles see the most queries: run first */
  const long bh = blockIdx.x % BH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const long head = bh * (long)T_ * D;   /* of the contiguous dQ accumulator */
  const T *__restrict__ dout = static_cast<const T *>(dov.p) + head_off(dov, bh, H);
  const T *__restrict__ q = static_cast<const T *>(qv.p) + head_off(qv, bh, H);
  const T *__restrict__ k = static_cast<const T *>(kv.p) + head_off(kv, bh, H);
  const T *__restrict__ v = static_cast<const T *>(vv.p) + head_off(vv, bh, H);
  const int k0 = kt * kBc;
  const int qt0 = k0 / kBr;   /* the first query tile with a query >= some key of the block */
  const float sl2 = scale * kLog2e;
  /* Dropout: the mask index of this head's (query 0, key 0), step base included. */
  const unsigned long long head_first =
      kDrop ? drop_origin(dr) + (unsigned long long)bh * T_ * T_ : 0ull;

  load_tile<T, kBc, D, kThreads>(ks, k, (int)kv.st, k0, T_, tid);
  load_tile<T, kBc, D, kThreads>(vs, v, (int)vv.st, k0, T_, tid);
  load_tile<T, kBr, D, kThreads>(qs, q, (int)qv.st, qt0 * kBr, T_, tid);
  load_tile<T, kBr, D, kThreads>(dos, dout, (int)dov.st, qt0 * kBr, T_, tid);
  cp_async_commit();
  if (tid < kBr) {
    /* Past-the-end queries get lse = +inf, so their P is exactly 0. */
    const int row = qt0 * kBr + tid;
    lse_s[tid] = row < T_ ? lse[bh * T_ + row] * kLog2e : INFINITY;
    dr_s[tid] = row < T_ ? d_rows[bh * T_ + row] : 0.f;
  }

  uint32_t kf[kKs][4], vf[kKs][4];
  float gk[kDt][4], gv[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) gk[i][e] = gv[i][e] = 0.f;
  const int key_a = k0 + warp * 16 + (lane >> 2);   /* this thread's keys: key_a, key_a + 8 */

  /* Iteration i's barrier publishes tile i's Q/dO (waited for just before it), its lse/D
   * (stored at the end of i - 1) and the dS^T of tile i - 1; past it every warp is done
   * with tile i - 1's Q/dO and lse/D buffers (refilled below for tile i + 1) and with the
   * dS^T of tile i - 2 (the buffer tile i writes). One more iteration runs the last dQ. */
  for (int qt = qt0; qt <= n_t; qt++) {
    const int buf = (qt - qt0) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (qt == qt0) {
#pragma unroll
      for (int kk = 0; kk < kKs; kk++) {
        ldsm_x4(kf[kk], a_frag_addr(ks, kLd, warp * 16, kk * 16, lane));
        ldsm_x4(vf[kk], a_frag_addr(vs, kLd, warp * 16, kk * 16, lane));
      }
    }
    /* The next tile's lse and D: past-the-end queries get lse = +inf, so their P is 0. */
    float next_lse = INFINITY, next_dr = 0.f;
    if (qt + 1 < n_t) {
      const int nb = buf ^ 1, r0 = (qt + 1) * kBr;
      load_tile<T, kBr, D, kThreads>(qs + nb * kBr * kLd, q, (int)qv.st, r0, T_, tid);
      load_tile<T, kBr, D, kThreads>(dos + nb * kBr * kLd, dout, (int)dov.st, r0, T_, tid);
      cp_async_commit();
      if (tid < kBr && r0 + tid < T_) {   /* in flight during this tile */
        next_lse = lse[bh * T_ + r0 + tid];
        next_dr = d_rows[bh * T_ + r0 + tid];
      }
    }
    if (qt > qt0)
      dq_tile<T, D, W>(dss + (buf ^ 1) * kBc * kLdS, ks, dq_acc + head, (qt - 1) * kBr, T_,
                       warp, lane);
    if (qt < n_t) {
      const T *qb = qs + buf * kBr * kLd, *db = dos + buf * kBr * kLd;
      const float *lb = lse_s + buf * kBr, *drb = dr_s + buf * kBr;
      key_tile<T, D, W, kDrop>(kf, vf, gk, gv, qb, db, lb, drb, dss + buf * kBc * kLdS, warp,
                               lane, sl2, qt, k0, key_a, dr, head_first, T_);
    }
    if (qt + 1 < n_t && tid < kBr) {
      lse_s[(buf ^ 1) * kBr + tid] = next_lse * kLog2e;
      dr_s[(buf ^ 1) * kBr + tid] = next_dr;
    }
  }
  write_dkv<T, D>(gk, gv, static_cast<T *>(dkv.p) + head_off(dkv, bh, H), dkv.st,
                  static_cast<T *>(dvv.p) + head_off(dvv, bh, H), dvv.st, key_a, T_, lane, scale,
                  overwrite);
}

template <typename T, int D, int W, bool kDrop>
nt_status launch(nt_ctx *ctx, const bwd_args &a) {
  constexpr int bytes = smem_bytes<D, W>(), kBc = 16 * W;
  auto kernel = bwd_kernel<T, D, W, kDrop>;
  nt_status st = NT_CUDA(
      ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (st) return st;
  const long blocks = (long)((a.T + kBc - 1) / kBc) * a.BH;
  if (blocks > 0x7fffffffL) return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: grid too large");
  kernel<<<(unsigned)blocks, 32 * W, bytes, nt_cuda_stream(ctx)>>>(
      a.dout, a.q, a.k, a.v, a.lse, a.d_rows, a.dq_acc, a.dk, a.dv, a.BH, a.H, a.T,
      1.f / sqrtf((float)D), a.dr, a.overwrite);
  return NT_CUDA_LAUNCHED(ctx);
}

/* Long sequences take 128-key blocks of 8 warps (half the Q/dO traffic and dQ atomics per
 * key); short ones keep 64-key blocks of 4 warps, which balance the causal work better.
 * The tests reach both shapes through T on either side of kLongT. */
template <typename T, int D>
nt_status launch_w(nt_ctx *ctx, const bwd_args &a, bool drop) {
  const bool eight = a.T >= kLongT;
  if (drop && eight) return launch<T, D, 8, true>(ctx, a);
  if (drop) return launch<T, D, 4, true>(ctx, a);
  if (eight) return launch<T, D, 8, false>(ctx, a);
  return launch<T, D, 4, false>(ctx, a);
}

template <typename T>
nt_status launch_d(nt_ctx *ctx, const bwd_args &a, int D, bool drop) {
  if (D == 64) return launch_w<T, 64>(ctx, a, drop);
  if (D == 32) return launch_w<T, 32>(ctx, a, drop);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for D = %d", D);
}

}  // namespace

nt_status nt_attention_backward_mma(nt_ctx *ctx, nt_dtype dt, nt_attn_view dout, nt_attn_view q,
                                    nt_attn_view k, nt_attn_view v, const float *lse,
                                    const float *d_rows, float *dq_acc, nt_attn_view dk,
                                    nt_attn_view dv, int BH, int H, int T, int D,
                                    const nt_attn_drop *drop, bool overwrite) {
  const nt_attn_drop none = {0ull, 0ull, nullptr, 0u, 1.f};
  const bwd_args a = {dout, q, k, v, dk, dv, lse, d_rows, dq_acc, BH, H, T,
                      drop ? *drop : none, overwrite};
  if (dt == NT_BF16) return launch_d<__nv_bfloat16>(ctx, a, D, drop != NULL);
  if (dt == NT_F16) return launch_d<__half>(ctx, a, D, drop != NULL);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for %s",
                  nt_dtype_name(dt));
}
