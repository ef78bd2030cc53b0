/* Tensor-core causal attention forward (FlashAttention-2): a block owns 128 query rows (four
 * warps of 2 x 16) and walks the key/value tiles of 64 rows up to the diagonal,
 * double-buffered with cp.async. S = Q K^T and
 * O += P V run on mma.sync m16n8k16 with fp32 accumulation; the softmax keeps a running max
 * and sum per row in fp32 (base-2 exponentials with log2(e) folded into the scale). Rows and
 * keys past T are zero-filled on load and masked. Q stays in shared memory (its fragments are
 * re-read per tile, as FlashAttention-2 does) to keep the registers for the accumulators; one
 * barrier per tile. Operands are strided views with 16-byte aligned rows.
 *
 * Dropout (kDrop, a separate instantiation: the kernels without it are unchanged) zeroes
 * probabilities after the softmax statistics (the normaliser and lse see all of them) and
 * scales the output by 1 / (1 - p_eff). The keep bits come from the Philox stream, one byte
 * per probability (ops/attention.h): for each tile a warp's rows x keys split into 32-key
 * words (one row, 32 consecutive mask elements, 2 Philox blocks when T is a multiple of 16),
 * each lane computes kSlots of them (lane L: row L % kRw, words L / kRw + kLp * slot), and
 * the lanes of the MMA fragment layout fetch theirs with one shuffle per row and word:
 * a thread holds keys 8 nt + 2 (L % 4) + {0, 1}, bits 8 (nt % 4) + {0, 1} of the word shifted
 * right by 2 (L % 4). */
#include "ops/attention_cuda.cuh"
#include "ops/attention_mma.cuh"
#include "ops/attention_softmax.cuh"
#include "core/cuda_util.h"

namespace {

using namespace nt_attn;

/* A block covers kBr = 128 query rows: 8 / kM warps each own kM blocks of 16 rows, so every
 * K/V fragment read from shared memory feeds kM tensor-core products. The launcher runs
 * kM = 2 (4 warps, about 240 registers, 2 blocks per SM); kM = 1, 3 blocks per SM and
 * 128-key tiles landed within 5% of it (bench/RESULTS.md, session 2) and are no longer
 * built. */
constexpr int kBr = 128;

/* KB keys per tile (64). */
template <int D, int KB> constexpr int smem_bytes() { return (kBr + 4 * KB) * (D + kLdPad) * 2; }

/* One key/value tile for one warp: S = Q K^T, online softmax, [dropout,] O += P V. kDiag:
 * the tile meets the diagonal, so keys after a row (and past T) are masked and m-blocks that
 * see no key are skipped; the other tiles run without any branch. kDrop: lane_rel is the
 * mask index of key 0 in this lane's keep-bit row (lane_row), relative to the mask's
 * origin (drop_origin: from the offset plus the RNG step base). The base is read again for every
 * tile (one L1 hit) rather than kept live: holding it in registers added spills to the D = 64
 * kernel, which is at its 255-register bound. */
template <typename T, int D, int KB, int kM, bool kDiag, bool kDrop>
__device__ __forceinline__ void fwd_tile(const T *kb, const T *vb,
                                         const T *qw,
                                         float (&o)[kM][D / 8][4], float (&m_r)[kM][2],
                                         float (&l_r)[kM][2], int key0, int row_w, int lane,
                                         float sl2, const nt_attn_drop &dr,
                                         unsigned long long lane_rel, int lane_row) {
  constexpr int kLd = D + kLdPad, kDt = D / 8, kKs = D / 16, kSt = KB / 8;
  /* An m-block whose last row precedes the tile's first key sees nothing here (warp-uniform).
   * Tile 0 is never skipped, so every row's running max is finite after it. */
  bool active[kM];
#pragma unroll
  for (int mi = 0; mi < kM; mi++) active[mi] = !kDiag || row_w + mi * 16 + 15 >= key0;

  /* This lane's keep words, drawn first so the integer work overlaps the tensor-core work. */
  uint32_t kw[fwd_keep<KB, kM>::kSlots];
  if constexpr (kDrop) draw_keep<KB, kM, kDiag>(kw, dr, lane_rel, key0, lane_row, lane);
  float s[kM][kSt][4];
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int i = 0; i < kSt; i++) s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kKs; kk++) {
    /* Q fragments come from shared memory on every tile: 32 registers fewer for the whole
     * loop (what lets the 3-blocks-per-SM build exist), for 8 more ldmatrix per tile. */
    uint32_t qf[kM][4];
#pragma unroll
    for (int mi = 0; mi < kM; mi++)
      if (active[mi]) ldsm_x4(qf[mi], a_frag_addr(qw, kLd, mi * 16, kk * 16, lane));
#pragma unroll
    for (int np = 0; np < kSt / 2; np++) {
      uint32_t b[4];
      ldsm_x4(b, bt_frag_addr(kb, kLd, np * 16, kk * 16, lane));
#pragma unroll
      for (int mi = 0; mi < kM; mi++) {
        if (!active[mi]) continue;
        mma_op<T>::run(s[mi][2 * np], qf[mi], b[0], b[1]);
        mma_op<T>::run(s[mi][2 * np + 1], qf[mi], b[2], b[3]);
      }
    }
  }
  online_softmax<kM, kSt, kDt, kDiag>(s, o, m_r, l_r, active, key0, row_w + (lane >> 2), lane,
                                      sl2);
  if constexpr (kDrop) apply_keep<KB, kM>(s, kw, active, lane);
  /* O += P V: the accumulator layout of S is the A-fragment layout of P. */
#pragma unroll
  for (int kk = 0; kk < KB / 16; kk++) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mi = 0; mi < kM; mi++) {
      a[mi][0] = mma_op<T>::pack(s[mi][2 * kk][0], s[mi][2 * kk][1]);
      a[mi][1] = mma_op<T>::pack(s[mi][2 * kk][2], s[mi][2 * kk][3]);
      a[mi][2] = mma_op<T>::pack(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
      a[mi][3] = mma_op<T>::pack(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kDt / 2; dp++) {
      uint32_t b[4];
      ldsm_x4_t(b, b_frag_addr_t(vb, kLd, kk * 16, dp * 16, lane));
#pragma unroll
      for (int mi = 0; mi < kM; mi++) {
        if (!active[mi]) continue;
        mma_op<T>::run(o[mi][2 * dp], a[mi], b[0], b[1]);
        mma_op<T>::run(o[mi][2 * dp + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

/* kMinBlocks: blocks per SM the registers must allow (2: about 240 registers, no spills;
 * 3: 168 registers with a few spilled, half as many warps again to hide latency). */
template <typename T, int D, int kMinBlocks, int KB, int kM, bool kDrop>
__global__ void __launch_bounds__(256 / kM, kMinBlocks)
    fwd_kernel(nt_attn_view qv, nt_attn_view kv, nt_attn_view vv, nt_attn_view ov,
               float *__restrict__ lse, int BH, int H, int T_, float scale, nt_attn_drop dr) {
  constexpr int kLd = D + kLdPad, kDt = D / 8, kThreads = 256 / kM;
  static_assert(16 * (kThreads / 32) * kM == kBr, "warps x rows must cover the block");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *qs = reinterpret_cast<T *>(smem_raw);
  T *ks = qs + kBr * kLd;   /* two buffers of K then two of V */
  T *vs = ks + 2 * KB * kLd;

  const int n_qt = (T_ + kBr - 1) / kBr, n_kt = (T_ + KB - 1) / KB;
  /* Heaviest tiles (most keys) first so the tail of the grid is short. */
  const int qt = n_qt - 1 - (int)(blockIdx.x / BH);
  const long bh = blockIdx.x % BH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const T *__restrict__ q = static_cast<const T *>(qv.p) + head_off(qv, bh, H);
  const T *__restrict__ k = static_cast<const T *>(kv.p) + head_off(kv, bh, H);
  const T *__restrict__ v = static_cast<const T *>(vv.p) + head_off(vv, bh, H);
  T *__restrict__ out = static_cast<T *>(ov.p) + head_off(ov, bh, H);
  const int q0 = qt * kBr;
  const int kt_end = min(n_kt - 1, (q0 + kBr - 1) / KB);   /* last key tile any row sees */
  const float sl2 = scale * kLog2e;
  const int wrow0 = warp * 16 * kM;   /* the warp's first row within the block */
  /* Dropout: the row whose keep bits this lane draws, and its key 0's mask index relative to
   * the mask's origin. */
  const int lane_row = q0 + wrow0 + lane % fwd_keep<KB, kM>::kRw;
  const unsigned long long lane_rel = kDrop ? ((unsigned long long)bh * T_ + lane_row) * T_ : 0ull;

  load_tile<T, kBr, D, kThreads>(qs, q, (int)qv.st, q0, T_, tid);
  load_tile<T, KB, D, kThreads>(ks, k, (int)kv.st, 0, T_, tid);
  load_tile<T, KB, D, kThreads>(vs, v, (int)vv.st, 0, T_, tid);
  cp_async_commit();

  float o[kM][kDt][4], m_r[kM][2], l_r[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; mi++) {
    m_r[mi][0] = m_r[mi][1] = -INFINITY;
    l_r[mi][0] = l_r[mi][1] = 0.f;
#pragma unroll
    for (int i = 0; i < kDt; i++) o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.f;
  }

  for (int kt = 0; kt <= kt_end; kt++) {
    const int buf = kt & 1;
    cp_async_wait<0>();
    /* One barrier per tile: tile kt is visible to all, and every warp is done with tile
     * kt - 1, whose buffers the prefetch below refills while this tile is computed. */
    __syncthreads();
    if (kt < kt_end) {
      load_tile<T, KB, D, kThreads>(ks + (buf ^ 1) * KB * kLd, k, (int)kv.st, (kt + 1) * KB, T_,
                                     tid);
      load_tile<T, KB, D, kThreads>(vs + (buf ^ 1) * KB * kLd, v, (int)vv.st, (kt + 1) * KB, T_,
                                     tid);
      cp_async_commit();
    }
    const T *kb = ks + buf * KB * kLd, *vb = vs + buf * KB * kLd;
    if (kt * KB + KB - 1 > q0)   /* some key may follow some row of the block */
      fwd_tile<T, D, KB, kM, true, kDrop>(kb, vb, qs + wrow0 * kLd, o, m_r, l_r, kt * KB,
                                          q0 + wrow0, lane, sl2, dr, lane_rel, lane_row);
    else
      fwd_tile<T, D, KB, kM, false, kDrop>(kb, vb, qs + wrow0 * kLd, o, m_r, l_r, kt * KB,
                                           q0 + wrow0, lane, sl2, dr, lane_rel, lane_row);
  }

  /* Normalise, stage the warp's rows in its own rows of the Q tile (only this warp reads
   * them, and its last read is done), write 16-byte pieces. */
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float l = l_r[mi][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = (kDrop ? dr.rp : 1.f) / l;
      const int r = wrow0 + mi * 16 + (lane >> 2) + h * 8;
#pragma unroll
      for (int dt = 0; dt < kDt; dt++) {
        const uint32_t pk = mma_op<T>::pack(o[mi][dt][2 * h] * inv, o[mi][dt][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t *>(qs + r * kLd + dt * 8 + 2 * (lane & 3)) = pk;
      }
      const int row = q0 + r;
      if ((lane & 3) == 0 && row < T_) lse[bh * T_ + row] = m_r[mi][h] * scale + logf(l);
    }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = lane; c < 16 * kM * kChunks; c += 32) {
    const int r = wrow0 + c / kChunks, col = (c % kChunks) * 8;
    if (q0 + r < T_)
      *reinterpret_cast<uint4 *>(out + (long long)(q0 + r) * (int)ov.st + col) =
          *reinterpret_cast<const uint4 *>(qs + r * kLd + col);
  }
}

template <typename T, int D, int kMinBlocks, int KB, int kM, bool kDrop>
nt_status launch_b(nt_ctx *ctx, const nt_attn_view *ops, float *lse, int BH, int H, int T_,
                   const nt_attn_drop &dr) {
  constexpr int bytes = smem_bytes<D, KB>();
  auto kernel = fwd_kernel<T, D, kMinBlocks, KB, kM, kDrop>;
  nt_status st = NT_CUDA(
      ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (st) return st;
  const long blocks = (long)((T_ + kBr - 1) / kBr) * BH;
  if (blocks > 0x7fffffffL) return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: grid too large");
  kernel<<<(unsigned)blocks, 256 / kM, bytes, nt_cuda_stream(ctx)>>>(
      ops[0], ops[1], ops[2], ops[3], lse, BH, H, T_, 1.f / sqrtf((float)D), dr);
  return NT_CUDA_LAUNCHED(ctx);
}

/* 64-key tiles, 4 warps of 32 rows, 2 blocks per SM. */
template <typename T, int D>
nt_status launch(nt_ctx *ctx, const nt_attn_view *ops, float *lse, int BH, int H, int T_,
                 const nt_attn_drop *drop) {
  if (drop) return launch_b<T, D, 2, 64, 2, true>(ctx, ops, lse, BH, H, T_, *drop);
  const nt_attn_drop none = {0ull, 0ull, nullptr, 0u, 1.f};
  return launch_b<T, D, 2, 64, 2, false>(ctx, ops, lse, BH, H, T_, none);
}

template <typename T>
nt_status launch_d(nt_ctx *ctx, const nt_attn_view *ops, float *lse, int BH, int H, int T_, int D,
                   const nt_attn_drop *drop) {
  if (D == 64) return launch<T, 64>(ctx, ops, lse, BH, H, T_, drop);
  if (D == 32) return launch<T, 32>(ctx, ops, lse, BH, H, T_, drop);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for D = %d", D);
}

}  // namespace

bool nt_attention_mma_supported(nt_dtype dt, int D) {
  return (dt == NT_F16 || dt == NT_BF16) && (D == 32 || D == 64);
}

nt_status nt_attention_forward_mma(nt_ctx *ctx, nt_dtype dt, nt_attn_view q, nt_attn_view k,
                                   nt_attn_view v, nt_attn_view out, float *lse, int BH, int H,
                                   int T, int D, const nt_attn_drop *drop) {
  const nt_attn_view ops[4] = {q, k, v, out};
  if (dt == NT_BF16) return launch_d<__nv_bfloat16>(ctx, ops, lse, BH, H, T, D, drop);
  if (dt == NT_F16) return launch_d<__half>(ctx, ops, lse, BH, H, T, D, drop);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no tensor-core kernel for %s",
                  nt_dtype_name(dt));
}
