/* Tensor-core causal attention backward (FlashAttention-2): a block owns 64 or 128 key rows
 * (4 or 8 warps of 16 keys) and walks the query tiles of 64 from the diagonal to the end,
 * double-buffering Q and dO with cp.async. Per query tile, each warp recomputes P^T from the
 * saved lse, then
 *   dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - D),  dK += dS^T Q
 * in registers (fp32 accumulators), and dQ += dS K is reduced across key blocks with fp32
 * atomics (two floats per reduction) into dq_acc (scaled and added into dq by the caller). */
#include <stdlib.h>
#include "ops/attention_cuda.cuh"
#include "ops/attention_mma.cuh"
#include "core/cuda_util.h"

namespace {

using namespace nt_attn;

constexpr int kBr = 64;      /* queries per tile */
constexpr int kLongT = 512;  /* from this T on, 8-warp blocks */
constexpr float kLog2e = 1.4426950408889634f;

/* A block of W warps owns 16 * W keys (16 per warp). */
template <int D, int W> constexpr int smem_bytes() {
  return (2 * 16 * W + 4 * kBr) * (D + kLdPad) * 2 + 16 * W * (kBr + kLdPad) * 2 + 4 * kBr * 4;
}

/* One warp's share of a query tile: its 16 keys against the tile's 64 queries (S^T, dP^T,
 * P^T, dS^T; dV and dK accumulate in registers, dS^T goes to shared memory for the dQ
 * product). kMask: the tile meets the diagonal (queries before a key get P = 0); the other
 * tiles run without the per-element test. */
template <typename T, int D, bool kMask>
__device__ __forceinline__ void warp_tile(const uint32_t (&kf)[D / 16][4],
                                          const uint32_t (&vf)[D / 16][4],
                                          float (&gk)[D / 8][4], float (&gv)[D / 8][4],
                                          const T *qb, const T *db, const float *lb,
                                          const float *drb, T *dss, int kr0, int lane, float sl2,
                                          int q_base, int key_a) {
  constexpr int kLd = D + kLdPad, kLdS = kBr + kLdPad, kDt = D / 8, kKs = D / 16, kSt = kBr / 8;
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
  /* P^T from the saved lse (causal mask near the diagonal), then dS^T in place of dP^T. */
#pragma unroll
  for (int nt = 0; nt < kSt; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int ql = nt * 8 + 2 * (lane & 3) + (e & 1);
      float p = fast_exp2(fmaf(st[nt][e], sl2, -lb[ql]));
      if (kMask && q_base + ql < key_a + (e >> 1) * 8) p = 0.f;
      st[nt][e] = p;
      dpt[nt][e] = p * (dpt[nt][e] - drb[ql]);
    }
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

template <typename T, int D, int W>
__global__ void __launch_bounds__(32 * W)
    bwd_kernel(const T *__restrict__ dout, const T *__restrict__ q, const T *__restrict__ k,
               const T *__restrict__ v, const float *__restrict__ lse,
               const float *__restrict__ d_rows, float *__restrict__ dq_acc, T *__restrict__ dk,
               T *__restrict__ dv, int BH, int T_, float scale) {
  constexpr int kThreads = 32 * W, kBc = 16 * W;
  constexpr int kLd = D + kLdPad, kLdS = kBr + kLdPad, kDt = D / 8, kKs = D / 16;
  /* dQ = dS K: the W warps split the tile's 64 queries in 4 blocks of 16 and D in W / 4. */
  constexpr int kSplit = W / 4, kDw = D / kSplit;
  static_assert(W % 4 == 0 && kDw % 16 == 0, "dQ split must leave 16-column pieces");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *ks = reinterpret_cast<T *>(smem_raw);
  T *vs = ks + kBc * kLd;
  T *qs = vs + kBc * kLd;       /* two buffers */
  T *dos = qs + 2 * kBr * kLd;  /* two buffers */
  T *dss = dos + 2 * kBr * kLd; /* dS^T [key][query] */
  float *lse_s = reinterpret_cast<float *>(dss + kBc * kLdS);   /* two buffers, * log2(e) */
  float *dr_s = lse_s + 2 * kBr;                                 /* two buffers */

  const int n_t = (T_ + kBr - 1) / kBr;
  const int kt = (int)(blockIdx.x / BH);   /* low key tiles see the most queries: run first */
  const long bh = blockIdx.x % BH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const long head = bh * (long)T_ * D;
  const int k0 = kt * kBc;
  const int qt0 = k0 / kBr;   /* the first query tile with a query >= some key of the block */
  const float sl2 = scale * kLog2e;

  load_tile<T, kBc, D, kThreads>(ks, k + head, k0, T_, tid);
  load_tile<T, kBc, D, kThreads>(vs, v + head, k0, T_, tid);
  load_tile<T, kBr, D, kThreads>(qs, q + head, qt0 * kBr, T_, tid);
  load_tile<T, kBr, D, kThreads>(dos, dout + head, qt0 * kBr, T_, tid);
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

  for (int qt = qt0; qt < n_t; qt++) {
    const int buf = (qt - qt0) & 1;
    /* The next tile's lse and D: past-the-end queries get lse = +inf, so their P is 0. */
    float next_lse = INFINITY, next_dr = 0.f;
    if (qt + 1 < n_t) {
      const int nb = buf ^ 1, r0 = (qt + 1) * kBr;
      load_tile<T, kBr, D, kThreads>(qs + nb * kBr * kLd, q + head, r0, T_, tid);
      load_tile<T, kBr, D, kThreads>(dos + nb * kBr * kLd, dout + head, r0, T_, tid);
      cp_async_commit();
      if (tid < kBr && r0 + tid < T_) {   /* in flight during this tile; stored at its end */
        next_lse = lse[bh * T_ + r0 + tid];
        next_dr = d_rows[bh * T_ + r0 + tid];
      }
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (qt == qt0) {
#pragma unroll
      for (int kk = 0; kk < kKs; kk++) {
        ldsm_x4(kf[kk], a_frag_addr(ks, kLd, warp * 16, kk * 16, lane));
        ldsm_x4(vf[kk], a_frag_addr(vs, kLd, warp * 16, kk * 16, lane));
      }
    }
    const T *qb = qs + buf * kBr * kLd, *db = dos + buf * kBr * kLd;
    const float *lb = lse_s + buf * kBr, *drb = dr_s + buf * kBr;
    /* Warp-uniform: do this warp's 16 keys meet any query of the tile (query >= key)? */
    const bool active = qt * kBr + kBr - 1 >= k0 + warp * 16;
    const bool needs_mask = qt * kBr < k0 + kBc - 1;   /* some query may precede some key */

    if (!active) {
      /* P = dS = 0 for this warp: only its rows of dS^T (zeros) matter, for the dQ product. */
      const int kr = warp * 16 + (lane >> 2);
#pragma unroll
      for (int c = 0; c < kBr; c += 8) {
        *reinterpret_cast<uint32_t *>(dss + kr * kLdS + c + 2 * (lane & 3)) = 0u;
        *reinterpret_cast<uint32_t *>(dss + (kr + 8) * kLdS + c + 2 * (lane & 3)) = 0u;
      }
    } else if (needs_mask) {
      warp_tile<T, D, true>(kf, vf, gk, gv, qb, db, lb, drb, dss, warp * 16, lane, sl2,
                            qt * kBr, key_a);
    } else {
      warp_tile<T, D, false>(kf, vf, gk, gv, qb, db, lb, drb, dss, warp * 16, lane, sl2,
                             qt * kBr, key_a);
    }
    __syncthreads();   /* all of dS^T is in shared memory */

    /* dQ[16 queries, kDw columns of this warp] = dS K over the block's keys, with atomics. */
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
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int row = qt * kBr + mq + (lane >> 2) + h * 8;
      if (row < T_) {
        float *dst = dq_acc + head + (long)row * D + d0 + 2 * (lane & 3);
#pragma unroll
        for (int dt = 0; dt < kDw / 8; dt++)
          red_add_f32x2(dst + dt * 8, gq[dt][2 * h], gq[dt][2 * h + 1]);
      }
    }
    /* The other lse/D buffer was last read before the barrier above; the next iteration's
     * top barrier publishes it. */
    if (qt + 1 < n_t && tid < kBr) {
      lse_s[(buf ^ 1) * kBr + tid] = next_lse * kLog2e;
      dr_s[(buf ^ 1) * kBr + tid] = next_dr;
    }
    /* No barrier here: the next iteration's prefetch only touches this tile's Q/dO
     * buffers, read before the barrier above, and its dS^T writes come after its own top
     * barrier, which every warp reaches only once done with this tile's dQ. */
  }

#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int key = key_a + h * 8;
    if (key >= T_) continue;
    const long off = head + (long)key * D + 2 * (lane & 3);
    /* Adjacent pairs as one 4-byte access (rows are 16-byte aligned, the column even). */
#pragma unroll
    for (int dt = 0; dt < kDt; dt++) {
      uint32_t *pk = reinterpret_cast<uint32_t *>(dk + off + dt * 8);
      uint32_t *pv = reinterpret_cast<uint32_t *>(dv + off + dt * 8);
      const uint32_t ok = *pk, ov = *pv;
      const T *xk = reinterpret_cast<const T *>(&ok), *xv = reinterpret_cast<const T *>(&ov);
      *pk = mma_op<T>::pack(nt_attn_to_f32(xk[0]) + gk[dt][2 * h] * scale,
                            nt_attn_to_f32(xk[1]) + gk[dt][2 * h + 1] * scale);
      *pv = mma_op<T>::pack(nt_attn_to_f32(xv[0]) + gv[dt][2 * h],
                            nt_attn_to_f32(xv[1]) + gv[dt][2 * h + 1]);
    }
  }
}

template <typename T, int D, int W>
nt_status launch(nt_ctx *ctx, const void *dout, const void *q, const void *k, const void *v,
                 const float *lse, const float *d_rows, float *dq_acc, void *dk, void *dv,
                 int BH, int T_) {
  constexpr int bytes = smem_bytes<D, W>(), kBc = 16 * W;
  nt_status st = NT_CUDA(ctx, cudaFuncSetAttribute(bwd_kernel<T, D, W>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   bytes));
  if (st) return st;
  const long blocks = (long)((T_ + kBc - 1) / kBc) * BH;
  if (blocks > 0x7fffffffL) return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: grid too large");
  bwd_kernel<T, D, W><<<(unsigned)blocks, 32 * W, bytes, nt_cuda_stream(ctx)>>>(
      (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, d_rows, dq_acc, (T *)dk,
      (T *)dv, BH, T_, 1.f / sqrtf((float)D));
  return NT_CUDA_LAUNCHED(ctx);
}

/* Long sequences take 128-key blocks of 8 warps (half the Q/dO traffic and dQ atomics per
 * key); short ones keep 64-key blocks of 4 warps, which balance the causal work better.
 * NT_ATTN_BWD_WARPS=4 or 8 forces one (benchmarks and tests compare the two). */
template <typename T, int D>
nt_status launch_w(nt_ctx *ctx, const void *dout, const void *q, const void *k, const void *v,
                   const float *lse, const float *d_rows, float *dq_acc, void *dk, void *dv,
                   int BH, int T_) {
  const char *e = getenv("NT_ATTN_BWD_WARPS");
  const int forced = e ? atoi(e) : 0;
  const bool eight = forced == 8 || (forced != 4 && T_ >= kLongT);
  if (eight)
    return launch<T, D, 8>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T_);
  return launch<T, D, 4>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T_);
}

template <typename T>
nt_status launch_d(nt_ctx *ctx, const void *dout, const void *q, const void *k, const void *v,
                   const float *lse, const float *d_rows, float *dq_acc, void *dk, void *dv,
                   int BH, int T_, int D) {
  if (D == 64) return launch_w<T, 64>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T_);
  if (D == 32) return launch_w<T, 32>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T_);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for D = %d", D);
}

}  // namespace

nt_status nt_attention_backward_mma(nt_ctx *ctx, nt_dtype dt, const void *dout, const void *q,
                                    const void *k, const void *v, const float *lse,
                                    const float *d_rows, float *dq_acc, void *dk, void *dv,
                                    int BH, int T, int D) {
  if (dt == NT_BF16)
    return launch_d<__nv_bfloat16>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T, D);
  if (dt == NT_F16)
    return launch_d<__half>(ctx, dout, q, k, v, lse, d_rows, dq_acc, dk, dv, BH, T, D);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for %s",
                  nt_dtype_name(dt));
}
