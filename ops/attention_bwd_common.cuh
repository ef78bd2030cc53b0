/* Private to the attention backward kernels (attention_bwd.cu on mma.sync, attention_bwd_wg.cu
 * on wgmma): the per-warp pieces both run on the same accumulator layout. A warp owns 16 keys
 * (rows) against 64 queries (columns) of S^T and dP^T: a thread holds keys key_a = first key
 * + lane / 4 and key_a + 8, queries 8 nt + 2 (lane % 4) + {0, 1} of each 8-query group nt
 * (element e of group nt: query + (e & 1), key + 8 (e >> 1)). The same layout holds a warp's
 * dK and dV rows (columns are then D), and a warp's 16 query rows of dQ. */
#ifndef NT_OPS_ATTENTION_BWD_COMMON_CUH
#define NT_OPS_ATTENTION_BWD_COMMON_CUH
#include "ops/attention_cuda.cuh"
#include "ops/attention_mma.cuh"

namespace nt_attn {

/* Dropout context of one warp's tile: q_first is the mask index of (query q_base, the warp's
 * first key); a query row further is T indices on. */
struct drop_at {
  nt_attn_drop dr;
  unsigned long long q_first;
  int T;
};

/* A backward kernel's operands in one place: dout, q, k, v, dk, dv views and the scratch. */
struct bwd_args {
  nt_attn_view dout, q, k, v, dk, dv;
  const float *lse, *d_rows;
  float *dq_acc;
  int BH, H, T;
  nt_attn_drop dr;
  bool overwrite;
};

/* Keep bits of queries q_base + 2 lane (low half) and + 1 (high half) for the warp's 16 keys.
 * Near the diagonal (kMask) a query before all 16 keys needs none (its P is 0). */
template <bool kMask>
__device__ __forceinline__ uint32_t bwd_keep_word(const drop_at &da, int q_base, int key_a,
                                                  int lane) {
  const int i0 = q_base + 2 * lane, key0 = key_a - (lane >> 2);
  const unsigned long long f0 = da.q_first + (unsigned long long)(2 * lane) * da.T;
  uint32_t kw = 0u;
  if (!kMask || i0 >= key0) kw = keep_bits<16>(da.dr, f0);
  if (!kMask || i0 + 1 >= key0) kw |= keep_bits<16>(da.dr, f0 + da.T) << 16;
  return kw;
}

/* P^T from the saved lse (lb: lse * log2(e) per query of the tile, +inf past T; kLseRaw: lse
 * itself, 0 past T; causal mask near the diagonal), then dS^T = P^T * (dP^T - D) in place of
 * dP^T (drb: D per query). With dropout st becomes the kept P^T * mr (what dV needs) and
 * dS^T = P^T * (dP^T * mr - D); a thread fetches its keep bits from lane 4 nt + lane % 4's word
 * (bwd_keep_word). */
template <int kSt, bool kMask, bool kDrop, bool kLseRaw = false>
__device__ __forceinline__ void p_ds(float (&st)[kSt][4], float (&dpt)[kSt][4], uint32_t kw,
                                     const float *lb, const float *drb, int q_base, int key_a,
                                     int lane, float sl2, const drop_at &da) {
#pragma unroll
  for (int nt = 0; nt < kSt; nt++) {
    /* Keep bits of this thread's elements of n-tile nt: element e at 16 (e & 1) + 8 (e >> 1). */
    uint32_t w = 0u;
    if constexpr (kDrop) w = __shfl_sync(0xffffffffu, kw, nt * 4 + (lane & 3)) >> (lane >> 2);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int ql = nt * 8 + 2 * (lane & 3) + (e & 1);
      const float l2 = kLseRaw ? lb[ql] * kLog2e : lb[ql];
      float p = fast_exp2(fmaf(st[nt][e], sl2, -l2));
      if (kMask && q_base + ql < key_a + (e >> 1) * 8) p = 0.f;
      if constexpr (kDrop) {
        const float mr = (w >> ((e & 1) * 16 + (e >> 1) * 8)) & 1u ? da.dr.rp : 0.f;
        st[nt][e] = p * mr;
        dpt[nt][e] = p * fmaf(dpt[nt][e], mr, -drb[ql]);
      } else {
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - drb[ql]);
      }
    }
  }
}

/* dK (scaled) and dV added into (overwrite: stored in) the head's gradients, adjacent pairs
 * as one 4-byte access (rows are 16-byte aligned, ldk / ldv elements apart, the column even).
 * Every old value is loaded before the first store: dk and dv may alias as far as the compiler
 * knows, so loads interleaved with stores would each wait out a full memory round trip. */
template <typename T, int D>
__device__ __forceinline__ void write_dkv(const float (&gk)[D / 8][4], const float (&gv)[D / 8][4],
                                          T *dk_h, long long ldk, T *dv_h, long long ldv,
                                          int key_a, int T_, int lane, float scale,
                                          bool overwrite) {
  uint32_t ok[2][D / 8], ov[2][D / 8];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int key = key_a + h * 8;
    const uint32_t *rk = reinterpret_cast<const uint32_t *>(dk_h + key * ldk + 2 * (lane & 3));
    const uint32_t *rv = reinterpret_cast<const uint32_t *>(dv_h + key * ldv + 2 * (lane & 3));
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      const bool load = !overwrite && key < T_;
      ok[h][dt] = load ? rk[dt * 4] : 0u;
      ov[h][dt] = load ? rv[dt * 4] : 0u;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int key = key_a + h * 8;
    if (key >= T_) continue;
    uint32_t *rk = reinterpret_cast<uint32_t *>(dk_h + key * ldk + 2 * (lane & 3));
    uint32_t *rv = reinterpret_cast<uint32_t *>(dv_h + key * ldv + 2 * (lane & 3));
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      const T *xk = reinterpret_cast<const T *>(&ok[h][dt]);
      const T *xv = reinterpret_cast<const T *>(&ov[h][dt]);
      rk[dt * 4] = mma_op<T>::pack(nt_to_f(xk[0]) + gk[dt][2 * h] * scale,
                                   nt_to_f(xk[1]) + gk[dt][2 * h + 1] * scale);
      rv[dt * 4] =
          mma_op<T>::pack(nt_to_f(xv[0]) + gv[dt][2 * h], nt_to_f(xv[1]) + gv[dt][2 * h + 1]);
    }
  }
}

/* A warp's 16 rows x (8 kN) columns of dQ (rows row0 + lane / 4 (+ 8), columns col0 + 8 n +
 * 2 (lane % 4)) added into dq_h (rows ld floats apart) with 16-byte reductions: lanes 2j and
 * 2j + 1 of a quad hold columns c..c+1 and c+2..c+3 (c = 4 (j % 2)) of rows g and g + 8, so
 * they swap halves and the even lane keeps row g, the odd one row g + 8 (half the reduction
 * requests of 8-byte ones). Rows past T are skipped. */
template <int kN>
__device__ __forceinline__ void red_dq_rows_v4(const float (&gq)[kN][4], float *dq_h, int ld,
                                               int row0, int col0, int T_, int lane) {
  const bool odd = lane & 1;
  const int row = row0 + (lane >> 2) + (odd ? 8 : 0);
  const int col = col0 + 2 * (lane & 2);
#pragma unroll
  for (int dt = 0; dt < kN; dt++) {
    const float s0 = odd ? gq[dt][0] : gq[dt][2], s1 = odd ? gq[dt][1] : gq[dt][3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (row < T_) {
      float *dst = dq_h + (long)row * ld + col + dt * 8;
      if (odd)
        red_add_f32x4(dst, r0, r1, gq[dt][2], gq[dt][3]);
      else
        red_add_f32x4(dst, gq[dt][0], gq[dt][1], r0, r1);
    }
  }
}

}  // namespace nt_attn

#endif
