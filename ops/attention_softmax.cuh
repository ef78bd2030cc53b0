/* Private to the attention forward kernels (attention_fwd.cu on mma.sync, attention_fwd_wg.cu
 * on wgmma): the per-tile online softmax and the dropout keep bits, on score tiles in the
 * accumulator layout both instructions share. A warp holds kM blocks of 16 rows; for each, a
 * thread holds rows g and g + 8 (g = lane / 4) and keys 8 nt + 2 (lane % 4) + {0, 1} of each
 * 8-key group nt: s[mi][nt][0..1] on row g, s[mi][nt][2..3] on row g + 8. */
#ifndef NT_OPS_ATTENTION_SOFTMAX_CUH
#define NT_OPS_ATTENTION_SOFTMAX_CUH
#include "ops/attention_cuda.cuh"
#include "ops/attention_mma.cuh"

namespace nt_attn {

/* Where a warp's dropout keep bits live: kRw rows per warp, kLp lanes per row, kSlots 32-key
 * words per lane (lane L: row L % kRw, words L / kRw + kLp * slot of the tile's keys). */
template <int KB, int kM> struct fwd_keep {
  static constexpr int kRw = 16 * kM, kLp = 32 / kRw, kSlots = KB / 32 / kLp;
};

/* This lane's keep words for the tile of KB keys from key0 (mask index of key 0 in its row:
 * the mask's origin plus lane_rel). On the diagonal a word whose keys all follow the row is
 * not needed (left 0). */
template <int KB, int kM, bool kDiag>
__device__ __forceinline__ void draw_keep(uint32_t (&kw)[fwd_keep<KB, kM>::kSlots],
                                          const nt_attn_drop &dr, unsigned long long lane_rel,
                                          int key0, int lane_row, int lane) {
  using keep = fwd_keep<KB, kM>;
  const unsigned long long lane_first = drop_origin(dr) + lane_rel;
#pragma unroll
  for (int sl = 0; sl < keep::kSlots; sl++) {
    const int key = key0 + 32 * (sl * keep::kLp + lane / keep::kRw);
    kw[sl] = 0u;
    if (!kDiag || key <= lane_row) kw[sl] = keep_bits<32>(dr, lane_first + (unsigned)key);
  }
}

/* Masks keys after the row on the diagonal (kDiag), then folds the tile into each row's
 * running max m_r and sum l_r (base-2 exponentials, sl2 = scale * log2(e)), turning s into
 * the unnormalised probabilities and rescaling the output accumulator o. row_a: the row of
 * this thread's s[0][*][0]. Inactive m-blocks (no key at or before any of their rows) are
 * left alone. */
template <int kM, int kSt, int kDt, bool kDiag>
__device__ __forceinline__ void online_softmax(float (&s)[kM][kSt][4], float (&o)[kM][kDt][4],
                                               float (&m_r)[kM][2], float (&l_r)[kM][2],
                                               const bool (&active)[kM], int key0, int row_a,
                                               int lane, float sl2) {
#pragma unroll
  for (int mi = 0; mi < kM; mi++) {
    if (!active[mi]) continue;
    if (kDiag) {   /* keys after the query (and past T) are masked */
#pragma unroll
      for (int nt = 0; nt < kSt; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
          const int row = row_a + mi * 16 + (e >> 1) * 8;
          if (key > row) s[mi][nt][e] = -INFINITY;
        }
    }
    /* Per row (a row's values are spread over the 4 lanes of a quad). */
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mx = m_r[mi][h];
#pragma unroll
      for (int nt = 0; nt < kSt; nt++)
        mx = fmaxf(mx, fmaxf(s[mi][nt][2 * h], s[mi][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float corr = fast_exp2((m_r[mi][h] - mx) * sl2), off = mx * sl2;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kSt; nt++) {
        s[mi][nt][2 * h] = fast_exp2(fmaf(s[mi][nt][2 * h], sl2, -off));
        s[mi][nt][2 * h + 1] = fast_exp2(fmaf(s[mi][nt][2 * h + 1], sl2, -off));
        sum += s[mi][nt][2 * h] + s[mi][nt][2 * h + 1];
      }
      l_r[mi][h] = l_r[mi][h] * corr + sum;
      m_r[mi][h] = mx;
#pragma unroll
      for (int dt = 0; dt < kDt; dt++) {
        o[mi][dt][2 * h] *= corr;
        o[mi][dt][2 * h + 1] *= corr;
      }
    }
  }
}

/* Zeroes the dropped probabilities (the 1 / (1 - p_eff) goes into the final normalisation): the
 * lanes of the fragment layout fetch their bits from the lanes that drew them (draw_keep) with
 * one shuffle per row and word; a thread's keys 8 nt + 2 (L % 4) + {0, 1} are bits
 * 8 (nt % 4) + {0, 1} of the word shifted right by 2 (L % 4). */
template <int KB, int kM>
__device__ __forceinline__ void apply_keep(float (&s)[kM][KB / 8][4],
                                           const uint32_t (&kw)[fwd_keep<KB, kM>::kSlots],
                                           const bool (&active)[kM], int lane) {
  using keep = fwd_keep<KB, kM>;
#pragma unroll
  for (int mi = 0; mi < kM; mi++) {
    if (!active[mi]) continue;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = (lane >> 2) + mi * 16 + h * 8;   /* the row within the warp */
#pragma unroll
      for (int c = 0; c < KB / 32; c++) {
        const uint32_t w =
            __shfl_sync(0xffffffffu, kw[c / keep::kLp], r + keep::kRw * (c % keep::kLp)) >>
            (2 * (lane & 3));
#pragma unroll
        for (int qn = 0; qn < 4; qn++) {
          float *x = &s[mi][4 * c + qn][2 * h];
          x[0] = (w >> (8 * qn)) & 1u ? x[0] : 0.f;
          x[1] = (w >> (8 * qn + 1)) & 1u ? x[1] : 0.f;
        }
      }
    }
  }
}

}  // namespace nt_attn

#endif
