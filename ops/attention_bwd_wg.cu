/* Causal attention backward on Hopper's warpgroup MMA (wgmma), D = 64, F16/BF16: a block of two
 * warpgroups owns 128 keys (64 each; with dropout up to T = 512 a block is one warpgroup and 64
 * keys, see launch_k) and walks the query tiles of 64 from the diagonal to the end,
 * double-buffering Q, dO, lse and D by the TMA (cp.async where no map can be made; Q and dO
 * into 128-byte swizzled shared tiles, ops/wgmma.cuh). Per query tile and warpgroup:
 *   S^T = K Q^T and dP^T = V dO^T   (shared x shared, m64n64, fp32 accumulators),
 *   P^T and dS^T = P^T * (dP^T - D) in registers (attention_bwd_common.cuh, as the mma.sync
 *     kernel: the accumulator layouts agree, so dropout regenerates the same keep bits),
 *   dV += P^T dO and dK += dS^T Q    (P^T, dS^T from registers; dO, Q read N-major),
 *   dQ += dS K                       (dS^T through shared memory, read M-major, and K N-major).
 * Two warpgroups split dQ by columns (each 32 columns over all 128 keys). A tile's dQ
 * product runs in the next tile's chain of products (one barrier per tile); its result is
 * added from registers into the fp32 dq_acc in the accumulator's own order, 16 KB per query
 * tile (nt_attention_wg_dq_acc_floats); dq_tiles_finish scales it into dq. */
#include <stdlib.h>
#include <string.h>
#include "ops/attention_cuda.cuh"
#include "ops/attention_bwd_common.cuh"
#include "ops/attention_tma.cuh"
#include "ops/pdl.cuh"
#include "ops/wgmma.cuh"
#include "core/cuda_util.h"

namespace {

using namespace nt_attn;

constexpr int kD = 64, kBr = 64, kRowBytes = 128;
constexpr int kTileFloats = kBr * kD;            /* one query tile's dQ: 16 KB of fp32 */
constexpr int kFinishThreads = 256;

/* A block of kWG warpgroups: kBc keys, each warpgroup kNq of dQ's columns. */
template <int kWG> struct shape {
  static constexpr int kBc = 64 * kWG, kThreads = 128 * kWG, kNq = kD / kWG;
  static constexpr int kMinBlocks = kWG == 1 ? 2 : 1;
  static constexpr int kDssBytes = kBc * kRowBytes;   /* one dS^T tile */
  /* K, V (kBc rows), two Q and two dO buffers (kBr rows), two dS^T tiles, two lse and two D
   * buffers, two 8-byte TMA barriers, plus slack to align the start to 1024 bytes. */
  static constexpr int kTileBytes = (2 * kBc + 4 * kBr) * kRowBytes + 2 * kDssBytes;
  static constexpr int kSmemBytes = kTileBytes + 4 * kBr * 4 + 16 + 1024;
};

/* The TMA loads K, V and each query tile's Q, dO, lse and D (attention_tma.cuh), one thread
 * issuing the copies and the others waiting on the buffer's barrier, instead of cp.async by
 * every thread: backward 0.2924 against 0.2971 ms for (16, 12, 1024, 64) on the H200. The
 * cp.async kernel runs where a map cannot be made (T below a tile or not a multiple of 4), or
 * with the option attn_tma off. */
struct bwd_maps {
  nt_attn_map q, dout, k, v;
  CUtensorMap lse, d_rows;
};

/* Query tile r0's Q, dO, lse and D into a buffer by the TMA, counted on its barrier with
 * `more` bytes the caller loads next (the barrier takes one arrival per phase). */
__device__ __forceinline__ void tma_query_tile(const bwd_maps &bm, uint32_t q_s, uint32_t do_s,
                                               uint32_t lse_s, uint32_t dr_s, uint32_t bar,
                                               int r0, long bh, int h, int b, uint32_t more) {
  nt_wg::mbar_expect_tx(bar, 2 * kBr * kRowBytes + 2 * kBr * 4 + more);
  tma_rows(bm.q, q_s, bar, r0, h, b);
  tma_rows(bm.dout, do_s, bar, r0, h, b);
  nt_wg::tma_load_2d(lse_s, &bm.lse, bar, r0, (int)bh);
  nt_wg::tma_load_2d(dr_s, &bm.d_rows, bar, r0, (int)bh);
}

/* Registers to the A operand: the accumulator layout of 16 query columns kk of a 64-column
 * tile is the A fragment of k-slice kk. */
template <typename T>
__device__ __forceinline__ void to_a_frag(uint32_t (&a)[4], const float (&x)[8][4], int kk) {
  a[0] = mma_op<T>::pack(x[2 * kk][0], x[2 * kk][1]);
  a[1] = mma_op<T>::pack(x[2 * kk][2], x[2 * kk][3]);
  a[2] = mma_op<T>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]);
  a[3] = mma_op<T>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

/* S^T = K Q^T and dP^T = V dO^T for one warpgroup (m64n64, shared x shared), issued after
 * whatever the caller issued since its fence, then everything waited for. */
template <typename T>
__device__ __forceinline__ void key_products(uint32_t k_s, uint32_t v_s, uint32_t q_s,
                                             uint32_t do_s, float (&st)[8][4],
                                             float (&dpt)[8][4]) {
  auto &st_acc = reinterpret_cast<float(&)[32]>(st);
  auto &dp_acc = reinterpret_cast<float(&)[32]>(dpt);
#pragma unroll
  for (int kk = 0; kk < kD / 16; kk++) {
    nt_wg::mma_ss<T, kBr, 0, 0>::run(st_acc, nt_wg::desc(k_s + 32 * kk),
                                     nt_wg::desc(q_s + 32 * kk), kk > 0);
    nt_wg::mma_ss<T, kBr, 0, 0>::run(dp_acc, nt_wg::desc(v_s + 32 * kk),
                                     nt_wg::desc(do_s + 32 * kk), kk > 0);
  }
  nt_wg::commit();
  nt_wg::wait<0>();
  nt_wg::touch(st_acc);
  nt_wg::touch(dp_acc);
}

/* From S^T and dP^T: P^T and dS^T (p_ds), dS^T stored in the warpgroup's rows of a shared dS^T
 * tile (dss_wg), and the dV and dK products issued, not waited for. */
template <typename T, bool kMask, bool kDrop>
__device__ __forceinline__ void key_grads(float (&st)[8][4], float (&dpt)[8][4], uint32_t q_s,
                                          uint32_t do_s, unsigned char *dss_wg,
                                          float (&gk)[8][4], float (&gv)[8][4], const float *lb,
                                          const float *drb, int q0, int key_a, int warp,
                                          int lane, float sl2, uint32_t kw,
                                          const drop_at &da) {
  p_ds<8, kMask, kDrop, true>(st, dpt, kw, lb, drb, q0, key_a, lane, sl2, da);
  uint32_t pa[kBr / 16][4], sa[kBr / 16][4];
  const int r = 16 * warp + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
  for (int kk = 0; kk < kBr / 16; kk++) {
    to_a_frag<T>(pa[kk], st, kk);
    to_a_frag<T>(sa[kk], dpt, kk);
    *reinterpret_cast<uint32_t *>(dss_wg + nt_wg::sw_off(r, 16 * kk + c)) = sa[kk][0];
    *reinterpret_cast<uint32_t *>(dss_wg + nt_wg::sw_off(r + 8, 16 * kk + c)) = sa[kk][1];
    *reinterpret_cast<uint32_t *>(dss_wg + nt_wg::sw_off(r, 16 * kk + 8 + c)) = sa[kk][2];
    *reinterpret_cast<uint32_t *>(dss_wg + nt_wg::sw_off(r + 8, 16 * kk + 8 + c)) = sa[kk][3];
  }
  auto &gv_acc = reinterpret_cast<float(&)[32]>(gv);
  auto &gk_acc = reinterpret_cast<float(&)[32]>(gk);
  nt_wg::fence();
#pragma unroll
  for (int kk = 0; kk < kBr / 16; kk++) {
    nt_wg::mma_rs<T, kD, 1>::run(gv_acc, pa[kk], nt_wg::desc(do_s + 2048 * kk), true);
    nt_wg::mma_rs<T, kD, 1>::run(gk_acc, sa[kk], nt_wg::desc(q_s + 2048 * kk), true);
  }
  nt_wg::commit();
}

/* key_grads for the tile meeting the diagonal (kMask) or not; kw: the dropout keep word. */
template <typename T, bool kDrop>
__device__ __forceinline__ void key_grads_any(bool mask, float (&st)[8][4], float (&dpt)[8][4],
                                              uint32_t q_s, uint32_t do_s, unsigned char *dss_wg,
                                              float (&gk)[8][4], float (&gv)[8][4],
                                              const float *lb, const float *drb, int q0,
                                              int key_a, int warp, int lane, float sl2,
                                              uint32_t kw, const drop_at &da) {
  if (mask)
    key_grads<T, true, kDrop>(st, dpt, q_s, do_s, dss_wg, gk, gv, lb, drb, q0, key_a, warp, lane,
                              sl2, kw, da);
  else
    key_grads<T, false, kDrop>(st, dpt, q_s, do_s, dss_wg, gk, gv, lb, drb, q0, key_a, warp,
                               lane, sl2, kw, da);
}

/* dQ[:, kNq wg .. + kNq - 1] of a query tile over all the block's keys (dS^T tile at dss_s),
 * issued. */
template <typename T, int kWG>
__device__ __forceinline__ void dq_cols_issue(float (&gq)[shape<kWG>::kNq / 8][4], uint32_t dss_s,
                                              uint32_t k_s, int wg) {
  constexpr int kNq = shape<kWG>::kNq;
  auto &gq_acc = reinterpret_cast<float(&)[kNq / 2]>(gq);
#pragma unroll
  for (int kk = 0; kk < shape<kWG>::kBc / 16; kk++)
    nt_wg::mma_ss<T, kNq, 1, 1>::run(gq_acc, nt_wg::desc(dss_s + 2048 * kk),
                                     nt_wg::desc(k_s + 2048 * kk + 2 * kNq * wg), kk > 0);
}

/* A query tile's lse and D (kBr floats each, from row r0) into shared memory by cp.async,
 * zeros past T (P = 1 there meets zero-filled Q and dO rows: no contribution). A head's rows
 * start at bh * T floats, 16-byte aligned only when 4 divides T: one float per thread. */
__device__ __forceinline__ void load_rows(float *lse_s, float *dr_s, const float *lse_h,
                                          const float *dr_h, int r0, int T_, int tid) {
  if (tid < 2 * kBr) {
    const int j = tid % kBr, row = r0 + j;
    const float *src = tid < kBr ? lse_h : dr_h;
    cp_async4((tid < kBr ? lse_s : dr_s) + j, row < T_ ? src + row : src, row < T_);
  }
}

/* A warpgroup's dQ columns of one query tile added into dq_acc at dst straight from registers,
 * in the wgmma accumulator's order of 32 columns (float4 i of thread t at (i * 128 + t) * 4;
 * 64 columns: two such halves): four floats per reduction, each warp instruction 512
 * contiguous bytes. Against staging the tile in shared memory for one bulk reduction
 * (cp.reduce.async.bulk) this needs no proxy fence, no barrier and no staging tiles: backward
 * 2% faster at (16,12,1024,64) on the H200. */
template <int kN>
__device__ __forceinline__ void dq_reduce(const float (&gq)[kN][4], float *dst, int t) {
#pragma unroll
  for (int i = 0; i < kN; i++)
    red_add_f32x4(dst + (i >> 2) * (kTileFloats / 2) + 4 * ((i & 3) * 128 + t), gq[i][0],
                  gq[i][1], gq[i][2], gq[i][3]);
}

template <typename T, int kWG, bool kDrop, bool kTma>
__global__ void __launch_bounds__(shape<kWG>::kThreads, shape<kWG>::kMinBlocks)
    bwd_wg_kernel(nt_attn_view dov, nt_attn_view qv, nt_attn_view kv, nt_attn_view vv,
                  const float *__restrict__ lse, const float *__restrict__ d_rows,
                  float *__restrict__ dq_acc, float4 *__restrict__ zero_next, long zero_n4,
                  nt_attn_view dkv, nt_attn_view dvv, int BH, int H, int T_, int group,
                  float scale, nt_attn_drop dr, bool overwrite,
                  const __grid_constant__ bwd_maps bm) {
  using S = shape<kWG>;
  constexpr int kBc = S::kBc, kThreads = S::kThreads, kDssBytes = S::kDssBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char *ks = smem_align1024(smem_raw);
  unsigned char *vs = ks + kBc * kRowBytes;
  unsigned char *qs = vs + kBc * kRowBytes;       /* two buffers */
  unsigned char *dos = qs + 2 * kBr * kRowBytes;  /* two buffers */
  unsigned char *dss = dos + 2 * kBr * kRowBytes; /* dS^T [key][query], two buffers */
  float *lse_s = reinterpret_cast<float *>(ks + S::kTileBytes);   /* two buffers */
  float *dr_s = lse_s + 2 * kBr;                                  /* two buffers */
  const uint32_t bar0 = smem_addr(dr_s + 2 * kBr);                /* buffer b's barrier: + 8 b */
  pdl_wait();
  pdl_trigger();

  const int n_t = (T_ + kBr - 1) / kBr;
  /* The heads go in groups of `group` (the last one may be smaller); within a group the low
   * key blocks, which see the most queries, run first. A head's blocks then run close together
   * in time, so the reductions into its dQ tiles find them in the L2. At (16, 12, 1024, 64) on
   * the H200, against all 192 heads at once: with groups of 16 DRAM traffic 281 against
   * 701 MB, L2 hit rate 77% against 50%; with groups of 32 the backward 0.2746-0.2769 against
   * 0.2904-0.2931 ms (bench/RESULTS.md, session 10). */
  const long per = (long)group * (gridDim.x / BH), g0 = blockIdx.x / per * group;
  const long w = blockIdx.x % per, gs = min((long)group, BH - g0);
  const int kt = (int)(w / gs);
  const long bh = g0 + w % gs;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const T *__restrict__ dout = static_cast<const T *>(dov.p) + head_off(dov, bh, H);
  const T *__restrict__ q = static_cast<const T *>(qv.p) + head_off(qv, bh, H);
  const T *__restrict__ k = static_cast<const T *>(kv.p) + head_off(kv, bh, H);
  const T *__restrict__ v = static_cast<const T *>(vv.p) + head_off(vv, bh, H);
  const float *lse_h = lse + bh * T_, *dr_h = d_rows + bh * T_;
  float *dq_h = dq_acc + bh * (long)n_t * kTileFloats + wg * (kTileFloats / 2);
  const int k0 = kt * kBc, wg_k0 = k0 + 64 * wg;
  const int qt0 = k0 / kBr;   /* the first query tile with a query >= some key of the block */
  const int key_a = wg_k0 + 16 * warp + (lane >> 2);   /* this thread's keys: key_a, + 8 */
  const float sl2 = scale * kLog2e;
  drop_at da = {};
  if constexpr (kDrop) {
    da.dr = dr;
    da.T = T_;
  }
  /* Dropout: the mask index of this head's (query 0, key 0), step base included. */
  const unsigned long long head_first =
      kDrop ? drop_origin(dr) + (unsigned long long)bh * T_ * T_ : 0ull;

  const int hh = (int)(bh % H), bb = (int)(bh / H);
  if constexpr (kTma) {
    if (tid == 0) {
      tma_buffer_barriers(bar0);
      tma_query_tile(bm, smem_addr(qs), smem_addr(dos), smem_addr(lse_s), smem_addr(dr_s), bar0,
                     qt0 * kBr, bh, hh, bb, 2 * kBc * kRowBytes);
      tma_rows(bm.k, smem_addr(ks), bar0, k0, hh, bb);
      tma_rows(bm.v, smem_addr(vs), bar0, k0, hh, bb);
    }
  } else {
    load_tile_sw<T, kBc, kThreads>(ks, k, (int)kv.st, k0, T_, tid);
    load_tile_sw<T, kBc, kThreads>(vs, v, (int)vv.st, k0, T_, tid);
    load_tile_sw<T, kBr, kThreads>(qs, q, (int)qv.st, qt0 * kBr, T_, tid);
    load_tile_sw<T, kBr, kThreads>(dos, dout, (int)dov.st, qt0 * kBr, T_, tid);
    load_rows(lse_s, dr_s, lse_h, dr_h, qt0 * kBr, T_, tid);
    cp_async_commit();
  }
  /* The next call's accumulator (attention_dq_pair.c), zeroed by the blocks of key block 0,
   * the first and longest of each group: its lines reach the L2 early and leave it before the
   * fold pass, which finds more of this call's accumulator there (measured with all heads in
   * one group, with dq_tiles_finish's order: backward 0.2916-0.2921 against 0.2930-0.2933 ms
   * at (16, 12, 1024, 64) on the H200). */
  if (kt == 0) {
    const long share = (zero_n4 + BH - 1) / BH, z0 = share * bh;
    const long z1 = min(z0 + share, zero_n4);
    for (long i = z0 + tid; i < z1; i += kThreads) zero_next[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  float gk[8][4], gv[8][4];
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) gk[i][e] = gv[i][e] = 0.f;
  const uint32_t k_s = smem_addr(ks), dss_s = smem_addr(dss);
  const uint32_t k_s_wg = k_s + 64 * wg * kRowBytes, v_s_wg = smem_addr(vs) + 64 * wg * kRowBytes;

  for (int qt = qt0; qt < n_t; qt++) {
    const int buf = (qt - qt0) & 1, q0 = qt * kBr;
    if constexpr (!kTma) cp_async_wait<0>();
    /* Tile qt's Q/dO/lse/D (cp.async) and tile qt - 1's dS^T become visible, to wgmma's async
     * proxy too; every warpgroup is done with tile qt - 1's buffers (each tile's products are
     * waited for within the tile). */
    nt_wg::fence_smem_to_async();
    __syncthreads();
    if (qt + 1 < n_t) {
      const int nb = buf ^ 1, r0 = q0 + kBr;
      if constexpr (kTma) {
        if (tid == 0)
          tma_query_tile(bm, smem_addr(qs + nb * kBr * kRowBytes),
                         smem_addr(dos + nb * kBr * kRowBytes), smem_addr(lse_s + nb * kBr),
                         smem_addr(dr_s + nb * kBr), bar0 + 8 * nb, r0, bh, hh, bb, 0u);
      } else {
        load_tile_sw<T, kBr, kThreads>(qs + nb * kBr * kRowBytes, q, (int)qv.st, r0, T_, tid);
        load_tile_sw<T, kBr, kThreads>(dos + nb * kBr * kRowBytes, dout, (int)dov.st, r0, T_,
                                       tid);
        load_rows(lse_s + nb * kBr, dr_s + nb * kBr, lse_h, dr_h, r0, T_, tid);
        cp_async_commit();
      }
    }
    /* The TMA's tile qt is in once its buffer's barrier completes use (qt - qt0) / 2. */
    if constexpr (kTma) nt_wg::mbar_wait(bar0 + 8 * buf, ((qt - qt0) >> 1) & 1);
    const uint32_t q_s = smem_addr(qs + buf * kBr * kRowBytes),
                   do_s = smem_addr(dos + buf * kBr * kRowBytes);
    const float *lb = lse_s + buf * kBr, *drb = dr_s + buf * kBr;
    unsigned char *dss_wg = dss + buf * kDssBytes + 64 * wg * kRowBytes;
    /* Warpgroup-uniform: does some query of the tile reach this warpgroup's first key? */
    const bool active = kWG == 1 || q0 + kBr - 1 >= wg_k0;
    const bool mask = q0 < wg_k0 + 63;   /* some query may precede some key */
    /* A warpgroup no query of the tile reaches (the second one, on a block's first tile) only
     * zeroes its dS^T rows, which the dQ products of the next tile read, and leaves the tensor
     * cores to the other: backward 0.2927 against 0.2989 ms at (16, 12, 1024, 64) on the H200,
     * 0.0901 against 0.0928 at (64, 6, 256, 64) (bench/RESULTS.md, session 9). */
    if (!active) {
      uint4 *z = reinterpret_cast<uint4 *>(dss_wg);
      for (int i = tid & 127; i < 64 * kRowBytes / 16; i += 128) z[i] = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    uint32_t kw = 0u;
    if (kDrop) {
      da.q_first = head_first + (unsigned long long)q0 * T_ + wg_k0 + 16 * warp;
      kw = mask ? bwd_keep_word<true>(da, q0, key_a, lane)
                : bwd_keep_word<false>(da, q0, key_a, lane);
    }
    /* Tile qt - 1's dQ product goes first in this tile's chain of products. The chain is the
     * same on every tile, so ptxas keeps the wgmma pipelined (products issued under branches
     * get serialised): at the first tile the dQ product reads a buffer no tile wrote (its
     * result is dropped). */
    float st[8][4], dpt[8][4], gq[S::kNq / 8][4];
    nt_wg::fence();
    dq_cols_issue<T, kWG>(gq, dss_s + (buf ^ 1) * kDssBytes, k_s, wg);
    key_products<T>(k_s_wg, v_s_wg, q_s, do_s, st, dpt);
    nt_wg::touch(reinterpret_cast<float(&)[S::kNq / 2]>(gq));
    if (qt > qt0) dq_reduce(gq, dq_h + (long)(qt - 1) * kTileFloats, tid & 127);
    key_grads_any<T, kDrop>(mask, st, dpt, q_s, do_s, dss_wg, gk, gv, lb, drb, q0, key_a, warp,
                            lane, sl2, kw, da);
    /* Waited here, not at the next tile's top: a chain left in flight across the loop's back
     * edge makes ptxas serialise the wgmma (C7515). */
    nt_wg::wait<0>();
    nt_wg::touch(reinterpret_cast<float(&)[32]>(gk));
    nt_wg::touch(reinterpret_cast<float(&)[32]>(gv));
  }
  {   /* the last tile's dQ */
    const int last = (n_t - 1 - qt0) & 1;
    nt_wg::fence_smem_to_async();
    __syncthreads();
    float gq[S::kNq / 8][4];
    nt_wg::fence();
    dq_cols_issue<T, kWG>(gq, dss_s + last * kDssBytes, k_s, wg);
    nt_wg::commit();
    nt_wg::wait<0>();
    nt_wg::touch(reinterpret_cast<float(&)[S::kNq / 2]>(gq));
    dq_reduce(gq, dq_h + (long)(n_t - 1) * kTileFloats, tid & 127);
  }
  write_dkv<T, kD>(gk, gv, static_cast<T *>(dkv.p) + head_off(dkv, bh, H), dkv.st,
                   static_cast<T *>(dvv.p) + head_off(dvv, bh, H), dvv.st, key_a, T_, lane, scale,
                   overwrite);
}

/* dq (+)= scale * dq_acc, one query tile per block: the tile's 16 KB (accumulator order, see
 * dq_reduce) through shared memory into rows, 16 elements of a row per thread. The last query
 * tiles of every head go first: the last blocks of each group of heads added into them, so
 * they are the ones most likely still in the L2. */
template <typename T>
__global__ void __launch_bounds__(kFinishThreads)
    dq_tiles_finish(const float *__restrict__ acc, nt_attn_view dqv, int H, int T_, float scale,
                    bool overwrite) {
  constexpr int kLd = kD + 8;   /* padded rows: a half-warp's float2 writes hit 32 banks */
  __shared__ float tile[kBr * kLd];
  pdl_wait();
  pdl_trigger();
  const int n_t = (T_ + kBr - 1) / kBr;
  const long BH = gridDim.x / n_t, bh = blockIdx.x % BH;
  const int qt = n_t - 1 - (int)(blockIdx.x / BH);
  const int tid = threadIdx.x;
  const float4 *a = reinterpret_cast<const float4 *>(acc + (bh * n_t + qt) * kTileFloats);
  {
    const int wg = tid >> 7, t = tid & 127, w = t >> 5, l = t & 31;
    const int r = 16 * w + (l >> 2), c0 = 32 * wg + 2 * (l & 3);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float4 x = a[wg * (kTileFloats / 8) + i * 128 + t];
      *reinterpret_cast<float2 *>(&tile[r * kLd + c0 + 8 * i]) = make_float2(x.x, x.y);
      *reinterpret_cast<float2 *>(&tile[(r + 8) * kLd + c0 + 8 * i]) = make_float2(x.z, x.w);
    }
  }
  __syncthreads();
  const int r = tid >> 2, c = 16 * (tid & 3), row = qt * kBr + r;
  if (row >= T_) return;
  T *dq = static_cast<T *>(dqv.p) + head_off(dqv, bh, H) + (long long)row * dqv.st + c;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float4 f0 = *reinterpret_cast<const float4 *>(&tile[r * kLd + c + 8 * h]);
    const float4 f1 = *reinterpret_cast<const float4 *>(&tile[r * kLd + c + 8 * h + 4]);
    const float add[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
    add_dq8(dq + 8 * h, add, scale, overwrite);
  }
}

template <typename T, int kWG, bool kDrop>
nt_status launch(nt_ctx *ctx, const bwd_args &a, nt_attn_view dq, float *zero_next,
                 size_t zero_floats) {
  using S = shape<kWG>;
  constexpr bool kBf16 = nt_wg::ab<T>::kBf16;
  const nt_ctx_options *opt = nt_ctx_opts(ctx);
  const int B = a.BH / a.H;
  bwd_maps bm;
  memset(&bm, 0, sizeof bm);
  const bool tma = opt->attn_tma && nt_attn_map_view(&bm.q, a.q, kBf16, B, a.H, a.T, kBr) &&
                   nt_attn_map_view(&bm.dout, a.dout, kBf16, B, a.H, a.T, kBr) &&
                   nt_attn_map_view(&bm.k, a.k, kBf16, B, a.H, a.T, S::kBc) &&
                   nt_attn_map_view(&bm.v, a.v, kBf16, B, a.H, a.T, S::kBc) &&
                   nt_attn_map_rows(&bm.lse, a.lse, a.BH, a.T, kBr) &&
                   nt_attn_map_rows(&bm.d_rows, a.d_rows, a.BH, a.T, kBr);
  auto kernel = tma ? bwd_wg_kernel<T, kWG, kDrop, true> : bwd_wg_kernel<T, kWG, kDrop, false>;
  nt_status st = NT_CUDA(ctx, cudaFuncSetAttribute(
                                  kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  S::kSmemBytes));
  if (st) return st;
  const long n_t = (a.T + kBr - 1) / kBr;
  const long blocks = (long)((a.T + S::kBc - 1) / S::kBc) * a.BH;
  if (blocks > 0x7fffffffL || n_t * a.BH > 0x7fffffffL)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "attention: grid too large");
  const float scale = 1.f / sqrtf((float)kD);
  int group = opt->attn_bwd_group;   /* heads per group; 0: all */
  if (group <= 0 || group > a.BH) group = a.BH;
  cudaStream_t s = nt_cuda_stream(ctx);
  st = NT_CUDA(ctx, pdl_launch(opt->pdl, kernel, dim3((unsigned)blocks), dim3(S::kThreads),
                               S::kSmemBytes, s, a.dout, a.q, a.k, a.v, a.lse, a.d_rows, a.dq_acc,
                               reinterpret_cast<float4 *>(zero_next), (long)(zero_floats / 4),
                               a.dk, a.dv, a.BH, a.H, a.T, group, scale, a.dr, a.overwrite,
                               bm));
  if (st) return st;
  return NT_CUDA(ctx, pdl_launch(opt->pdl, dq_tiles_finish<T>, dim3((unsigned)(n_t * a.BH)),
                                 dim3(kFinishThreads), 0, s, a.dq_acc, dq, a.H, a.T, scale,
                                 a.overwrite));
}

/* With dropout up to T = 512, blocks of one warpgroup and 64 keys, two per SM: one block's
 * Philox work then runs beside the other's products. Backward 0.1029-0.1035 against
 * 0.1101-0.1105 ms at (64, 6, 256, 64) with dropout 0.2 on the H200; at T = 1024 no gain (the
 * dQ reductions nearly double), and without dropout it loses: 0.3766 against 0.2923 ms at
 * (16, 12, 1024, 64), 0.0914 against 0.0900 at T = 256 (bench/RESULTS.md, session 10).
 * The option attn_bwd_keys = 64 or 128 forces either shape. */
template <typename T, bool kDrop>
nt_status launch_k(nt_ctx *ctx, const bwd_args &a, nt_attn_view dq, float *zero_next,
                   size_t zero_floats) {
  const int forced = nt_ctx_opts(ctx)->attn_bwd_keys;
  const int keys = forced ? forced : kDrop && a.T <= 512 ? 64 : 128;
  if (keys == 64) return launch<T, 1, kDrop>(ctx, a, dq, zero_next, zero_floats);
  return launch<T, 2, kDrop>(ctx, a, dq, zero_next, zero_floats);
}

}  // namespace

size_t nt_attention_wg_dq_acc_floats(int BH, int T) {
  return (size_t)BH * (size_t)((T + kBr - 1) / kBr) * kTileFloats;
}

nt_status nt_attention_backward_wg(nt_ctx *ctx, nt_dtype dt, nt_attn_view dout, nt_attn_view q,
                                   nt_attn_view k, nt_attn_view v, const float *lse,
                                   const float *d_rows, float *dq_acc, float *zero_next,
                                   size_t zero_floats, nt_attn_view dq, nt_attn_view dk,
                                   nt_attn_view dv, int BH, int H, int T,
                                   const nt_attn_drop *drop, bool overwrite) {
  const nt_attn_drop none = {0ull, 0ull, nullptr, 0u, 1.f};
  const bwd_args a = {dout, q, k, v, dk, dv, lse, d_rows, dq_acc, BH, H, T,
                      drop ? *drop : none, overwrite};
  const bool dr = drop != NULL;
  if (dt == NT_BF16)
    return dr ? launch_k<__nv_bfloat16, true>(ctx, a, dq, zero_next, zero_floats)
              : launch_k<__nv_bfloat16, false>(ctx, a, dq, zero_next, zero_floats);
  if (dt == NT_F16)
    return dr ? launch_k<__half, true>(ctx, a, dq, zero_next, zero_floats)
              : launch_k<__half, false>(ctx, a, dq, zero_next, zero_floats);
  return NT_ERROR(ctx, NT_ERR_INTERNAL, "attention: no wgmma kernel for %s", nt_dtype_name(dt));
}
