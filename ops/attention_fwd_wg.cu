/* Causal attention forward on Hopper's warpgroup MMA (wgmma), D = 64, F16/BF16: a block of one
 * warpgroup owns 64 query rows and walks the key/value tiles (KB keys) up to the diagonal,
 * double-buffered by the TMA into 128-byte swizzled shared tiles (ops/wgmma.cuh). Per tile:
 * S = Q K^T as one asynchronous m64nKBk16 chain reading Q and K from shared memory, the online
 * softmax in registers (attention_softmax.cuh, shared with the mma.sync kernel: the
 * accumulator layouts agree), then O += P V with P converted in registers to the A operand and
 * V read N-major from shared memory. Against the mma.sync kernel (attention_fwd.cu) this reads
 * no operand fragments through the register file and issues one instruction per 64 x KB x 16
 * product instead of 64.
 *
 * Rows past T read zeros and are not stored; keys past T are masked with the causal mask (on
 * the diagonal tile, where every such key follows every row). Dropout as in attention_fwd.cu:
 * the same keep words, so the mask is the same bit for bit. */
#include <stdlib.h>
#include <string.h>
#include "ops/attention_cuda.cuh"
#include "ops/attention_softmax.cuh"
#include "ops/attention_tma.cuh"
#include "ops/pdl.cuh"
#include "ops/wgmma.cuh"
#include "core/cuda_util.h"

namespace {

using namespace nt_attn;

constexpr int kD = 64, kBr = 64, kThreads = 128, kRowBytes = 128;

/* Q, two K buffers, two V buffers, two 8-byte TMA barriers, plus slack to align the start to
 * 1024 bytes. */
template <int KB> constexpr int smem_bytes() { return (kBr + 4 * KB) * kRowBytes + 16 + 1024; }

/* Q, K and V tiles are loaded by the TMA (attention_tma.cuh), one thread issuing each tile's
 * copies and the others waiting on the tile's barrier, instead of 16-byte cp.async by every
 * thread: 0.089 against 0.098 ms for (16, 12, 1024, 64) on the H200. The cp.async kernel
 * runs where a map cannot be made, or with the option attn_tma off. */
struct fwd_maps {
  nt_attn_map m[3];   /* q, k, v */
};

/* One key/value tile for the block's 64 rows (this warp's from row_w). */
template <typename T, int KB, bool kDiag, bool kDrop>
__device__ __forceinline__ void wg_tile(uint32_t q_s, uint32_t k_s, uint32_t v_s,
                                        float (&o)[1][kD / 8][4], float (&m_r)[1][2],
                                        float (&l_r)[1][2], int key0, int row_w, int lane,
                                        float sl2, const nt_attn_drop &dr,
                                        unsigned long long lane_rel, int lane_row) {
  constexpr int kSt = KB / 8;
  uint32_t kw[fwd_keep<KB, 1>::kSlots];
  if constexpr (kDrop) draw_keep<KB, 1, kDiag>(kw, dr, lane_rel, key0, lane_row, lane);

  float s[1][kSt][4];
  auto &sacc = reinterpret_cast<float(&)[KB / 2]>(s);
  auto &oacc = reinterpret_cast<float(&)[kD / 2]>(o);
  nt_wg::fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; kk++)
    nt_wg::mma_ss<T, KB, 0, 0>::run(sacc, nt_wg::desc(q_s + 32 * kk),
                                    nt_wg::desc(k_s + 32 * kk), kk > 0);
  nt_wg::commit();
  nt_wg::wait<0>();
  nt_wg::touch(sacc);

  /* Every warp's rows go through the softmax, also those that precede the whole tile on the
   * diagonal: fully masked, their probabilities are 0 (their running max is finite from
   * tile 0), which is what the warpgroup-wide P V product needs from them. */
  const bool active[1] = {true};
  online_softmax<1, kSt, kD / 8, kDiag>(s, o, m_r, l_r, active, key0, row_w + (lane >> 2), lane,
                                        sl2);
  if constexpr (kDrop) apply_keep<KB, 1>(s, kw, active, lane);

  uint32_t pa[KB / 16][4];
#pragma unroll
  for (int kk = 0; kk < KB / 16; kk++) {
    pa[kk][0] = mma_op<T>::pack(s[0][2 * kk][0], s[0][2 * kk][1]);
    pa[kk][1] = mma_op<T>::pack(s[0][2 * kk][2], s[0][2 * kk][3]);
    pa[kk][2] = mma_op<T>::pack(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
    pa[kk][3] = mma_op<T>::pack(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
  }
  nt_wg::fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; kk++)
    nt_wg::mma_rs<T, kD, 1>::run(oacc, pa[kk], nt_wg::desc(v_s + 2048 * kk), true);
  nt_wg::commit();
  nt_wg::wait<0>();
  nt_wg::touch(oacc);
}

template <typename T, int KB, int kMinBlocks, bool kDrop, bool kTma>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    fwd_wg_kernel(nt_attn_view qv, nt_attn_view kv, nt_attn_view vv, nt_attn_view ov,
                  float *__restrict__ lse, int BH, int H, int T_, float scale, nt_attn_drop dr,
                  const __grid_constant__ fwd_maps fm) {
  constexpr int kDt = kD / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char *qs = smem_align1024(smem_raw);
  unsigned char *ks = qs + kBr * kRowBytes;   /* two K buffers, then two V buffers */
  unsigned char *vs = ks + 2 * KB * kRowBytes;
  const uint32_t bar0 = smem_addr(vs + 2 * KB * kRowBytes);   /* buffer b's barrier: + 8 b */
  pdl_wait();
  pdl_trigger();

  const int n_qt = (T_ + kBr - 1) / kBr, n_kt = (T_ + KB - 1) / KB;
  /* Heaviest tiles (most keys) first so the tail of the grid is short. */
  const int qt = n_qt - 1 - (int)(blockIdx.x / BH);
  const long bh = blockIdx.x % BH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const T *__restrict__ q = static_cast<const T *>(qv.p) + head_off(qv, bh, H);
  const T *__restrict__ k = static_cast<const T *>(kv.p) + head_off(kv, bh, H);
  const T *__restrict__ v = static_cast<const T *>(vv.p) + head_off(vv, bh, H);
  T *__restrict__ out = static_cast<T *>(ov.p) + head_off(ov, bh, H);
  const int q0 = qt * kBr, row_w = q0 + 16 * warp;
  const int kt_end = min(n_kt - 1, (q0 + kBr - 1) / KB);   /* last key tile any row sees */
  const float sl2 = scale * kLog2e;
  /* Dropout: the row whose keep bits this lane draws, and its key 0's mask index relative to
   * the mask's origin. */
  const int lane_row = row_w + lane % fwd_keep<KB, 1>::kRw;
  const unsigned long long lane_rel = kDrop ? ((unsigned long long)bh * T_ + lane_row) * T_ : 0ull;

  const int hh = (int)(bh % H), bb = (int)(bh / H);
  if constexpr (kTma) {
    if (tid == 0) {
      tma_buffer_barriers(bar0);
      nt_wg::mbar_expect_tx(bar0, (kBr + 2 * KB) * kRowBytes);
      tma_rows(fm.m[0], smem_addr(qs), bar0, q0, hh, bb);
      tma_rows(fm.m[1], smem_addr(ks), bar0, 0, hh, bb);
      tma_rows(fm.m[2], smem_addr(vs), bar0, 0, hh, bb);
    }
  } else {
    load_tile_sw<T, kBr, kThreads>(qs, q, (int)qv.st, q0, T_, tid);
    load_tile_sw<T, KB, kThreads>(ks, k, (int)kv.st, 0, T_, tid);
    load_tile_sw<T, KB, kThreads>(vs, v, (int)vv.st, 0, T_, tid);
    cp_async_commit();
  }

  float o[1][kDt][4], m_r[1][2] = {{-INFINITY, -INFINITY}}, l_r[1][2] = {{0.f, 0.f}};
#pragma unroll
  for (int i = 0; i < kDt; i++) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.f;
  const uint32_t q_s = smem_addr(qs);

  for (int kt = 0; kt <= kt_end; kt++) {
    const int buf = kt & 1;
    if constexpr (kTma) {
      /* The warpgroup is done with tile kt - 1 (its wgmma chains were waited for), whose
       * buffers take tile kt + 1; tile kt is in once its barrier's phase kt / 2 completes. */
      __syncthreads();
      if (tid == 0 && kt < kt_end) {
        const int nb = buf ^ 1;
        nt_wg::mbar_expect_tx(bar0 + 8 * nb, 2 * KB * kRowBytes);
        tma_rows(fm.m[1], smem_addr(ks + nb * KB * kRowBytes), bar0 + 8 * nb, (kt + 1) * KB, hh,
                 bb);
        tma_rows(fm.m[2], smem_addr(vs + nb * KB * kRowBytes), bar0 + 8 * nb, (kt + 1) * KB, hh,
                 bb);
      }
      nt_wg::mbar_wait(bar0 + 8 * buf, (kt >> 1) & 1);
    } else {
      cp_async_wait<0>();
      /* Tile kt (written through cp.async, the generic proxy) becomes visible to wgmma's async
       * proxy, and the warpgroup is done with tile kt - 1 (its wgmma chains were waited
       * for), whose buffers the prefetch below refills. */
      nt_wg::fence_smem_to_async();
      __syncthreads();
      if (kt < kt_end) {
        const int nb = buf ^ 1;
        load_tile_sw<T, KB, kThreads>(ks + nb * KB * kRowBytes, k, (int)kv.st, (kt + 1) * KB,
                                      T_, tid);
        load_tile_sw<T, KB, kThreads>(vs + nb * KB * kRowBytes, v, (int)vv.st, (kt + 1) * KB,
                                      T_, tid);
        cp_async_commit();
      }
    }
    const uint32_t k_s = smem_addr(ks + buf * KB * kRowBytes),
                   v_s = smem_addr(vs + buf * KB * kRowBytes);
    if (kt * KB + KB - 1 > q0)   /* some key may follow some row */
      wg_tile<T, KB, true, kDrop>(q_s, k_s, v_s, o, m_r, l_r, kt * KB, row_w, lane, sl2, dr,
                                  lane_rel, lane_row);
    else
      wg_tile<T, KB, false, kDrop>(q_s, k_s, v_s, o, m_r, l_r, kt * KB, row_w, lane, sl2, dr,
                                   lane_rel, lane_row);
  }

  /* Normalise, stage the warp's 16 rows in its own rows of the Q tile (only this warp reads
   * them, and the warpgroup's last read of Q was waited for), write 16-byte pieces. */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float l = l_r[0][h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = (kDrop ? dr.rp : 1.f) / l;
    const int r = 16 * warp + (lane >> 2) + h * 8;   /* row within the block */
#pragma unroll
    for (int dt = 0; dt < kDt; dt++)
      *reinterpret_cast<uint32_t *>(qs + nt_wg::sw_off(r, dt * 8 + 2 * (lane & 3))) =
          mma_op<T>::pack(o[0][dt][2 * h] * inv, o[0][dt][2 * h + 1] * inv);
    const int row = q0 + r;
    if ((lane & 3) == 0 && row < T_) lse[bh * T_ + row] = m_r[0][h] * scale + logf(l);
  }
  __syncwarp();
#pragma unroll
  for (int c = lane; c < 16 * 8; c += 32) {
    const int r = 16 * warp + c / 8, j = c % 8;
    if (q0 + r < T_)
      *reinterpret_cast<uint4 *>(out + (long long)(q0 + r) * (int)ov.st + 8 * j) =
          *reinterpret_cast<const uint4 *>(qs + nt_wg::sw_off(r, 8 * j));
  }
}

template <typename T, int KB, int kMinBlocks, bool kDrop>
nt_status launch(nt_ctx *ctx, const nt_attn_view *ops, float *lse, int BH, int H, int T_,
                 const nt_attn_drop &dr) {
  constexpr int bytes = smem_bytes<KB>();
  constexpr bool kBf16 = nt_wg::ab<T>::kBf16;
  fwd_maps fm;
  memset(&fm, 0, sizeof fm);
  const bool tma = nt_ctx_opts(ctx)->attn_tma &&
                   nt_attn_map_view(&fm.m[0], ops[0], kBf16, BH / H, H, T_, kBr) &&
                   nt_attn_map_view(&fm.m[1], ops[1], kBf16, BH / H, H, T_, KB) &&
                   nt_attn_map_view(&fm.m[2], ops[2], kBf16, BH / H, H, T_, KB);
  auto kernel = tma ? fwd_wg_kernel<T, KB, kMinBlocks, kDrop, true>
                    : fwd_wg_kernel<T, KB, kMinBlocks, kDrop, false>;
  nt_status st = NT_CUDA(
      ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (st) return st;
  const long blocks = (long)((T_ + kBr - 1) / kBr) * BH;
  if (blocks > 0x7fffffffL) return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: grid too large");
  return NT_CUDA(ctx, pdl_launch(nt_ctx_opts(ctx)->pdl, kernel, dim3((unsigned)blocks),
                                 dim3(kThreads), bytes, nt_cuda_stream(ctx), ops[0], ops[1],
                                 ops[2], ops[3], lse, BH, H, T_, 1.f / sqrtf((float)kD), dr, fm));
}

/* Blocks of one warpgroup with 64-key tiles: four fit an SM, and each refills its buffers as
 * soon as its own products are done. Against blocks of two warpgroups (128 rows, two per SM):
 * forward 0.0860 against 0.0874 ms at (16, 12, 1024, 64) and 0.0221 against 0.0233 ms at
 * (64, 6, 256, 64) on the H200; 128-key tiles (three blocks per SM) took 0.0941 ms at
 * T = 1024 (bench/RESULTS.md, session 9). The kernel keeps KB a parameter. */
template <typename T>
nt_status launch_t(nt_ctx *ctx, const nt_attn_view *ops, float *lse, int BH, int H, int T_,
                   const nt_attn_drop *drop) {
  if (drop) return launch<T, 64, 4, true>(ctx, ops, lse, BH, H, T_, *drop);
  const nt_attn_drop none = {0ull, 0ull, nullptr, 0u, 1.f};
  return launch<T, 64, 4, false>(ctx, ops, lse, BH, H, T_, none);
}

}  // namespace

nt_status nt_attention_forward_wg(nt_ctx *ctx, nt_dtype dt, nt_attn_view q, nt_attn_view k,
                                  nt_attn_view v, nt_attn_view out, float *lse, int BH, int H,
                                  int T, const nt_attn_drop *drop) {
  const nt_attn_view ops[4] = {q, k, v, out};
  if (dt == NT_BF16) return launch_t<__nv_bfloat16>(ctx, ops, lse, BH, H, T, drop);
  if (dt == NT_F16) return launch_t<__half>(ctx, ops, lse, BH, H, T, drop);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no wgmma kernel for %s", nt_dtype_name(dt));
}
