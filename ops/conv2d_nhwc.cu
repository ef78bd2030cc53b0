/* NHWC Conv2d on CUDA for F16 / BF16: implicit GEMMs on tensor cores (mma.sync m16n8k16, fp32
 * accumulation), operands gathered straight from the activations into shared memory by
 * cp.async (zero-fill for the padding), so there is no im2col buffer. Three products:
 *
 *   forward   y [M = N*OH*OW, Cout]   = A [M, K] @ Wp^T      A(m, k) = x at output pixel m
 *                                                             shifted by tap k's (kh, kw)
 *   dx        dx [N*H*W, Cin]         = the same kernel run on dy with the flipped, transposed
 *                                       weight and pad KH-1-pad (stride 1): a conv of dy
 *   dw        dw [Cout, K]            = dy^T [Cout, M] @ A [M, K], split over M (split-K)
 *
 *   conv+pool the forward with its rows in 2x2-window order and the max-pool in the epilogue
 *
 * with K = KH*KW*C ordered (kh, kw, c): one tap's channels are contiguous in NHWC memory. The
 * weight is repacked per call into Wp [R, Kp] (R output channels; tiny next to the
 * activations) so that B tiles are plain 16-byte rows. The F32 path and the cases the tensor
 * core kernels do not take are in ops/conv2d_nhwc_direct.cu. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ops/conv2d_nhwc.h"
#include "ops/conv2d_nhwc_cuda.cuh"
#include "ops/mma.cuh"
#include "core/cuda_util.h"
#include "ops/cuda_dtype.cuh"

extern "C" {
nt_status nt_conv2d_nhwc_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                      const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                      bool relu);
nt_status nt_conv2d_nhwc_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                       const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                       const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                                       nt_conv2d_params p);
nt_status nt_conv2d_nhwc_pool_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                           const nt_tensor *b, nt_tensor *y, nt_tensor *argmax,
                                           nt_conv2d_params p, bool relu, bool y_nchw);
}

namespace {

using namespace nt_mma;

constexpr int kBK = 32;       /* K per pipeline stage: 32 channels of one tap (or 32 flat k) */
constexpr int kStages = 3;    /* cp.async pipeline depth */
constexpr int kThreads = 128; /* four warps */
constexpr int kPad = 8;       /* halves of padding per shared row: conflict-free ldmatrix */

/* One convolution as the implicit GEMM sees it: input [N, H, W, C] (x, or dy for dx), output
 * [N, OH, OW, R] (y, or dx), kernel KH x KW; the packed weight is [R, Kp]. vec: C % 8 == 0 and
 * input and mask 16-byte aligned, A is gathered in 16-byte chunks by cp.async and the packed
 * weight has Cp = C rounded up to kBK columns per tap; otherwise elements are loaded one by one
 * with K flat (Cp = C, K padded to kBK): the first layer (C = 1, K = 9 -> 32), odd test shapes.
 * out_vec (dw only): dy's rows of R channels in 16-byte chunks too; out_pair (forward, dx): R
 * even and the output 4-byte aligned, so the epilogue stores channel pairs as one 32-bit word. */
struct igeom {
  int N, H, W, C, OH, OW, R, KH, KW, stride, padh, padw, Cp, Kp, M;
  bool vec, out_vec, out_pair;
  int PH, PW;          /* pooled forward: the 2x2 pool's output plane (M = N*PH*PW*4) */
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* in / out: the GEMM's input and output tensors (16-byte chunks need aligned rows) */
igeom make_geom(int N, int H, int W, int C, int OH, int OW, int R, int KH, int KW, int stride,
                int padh, int padw, const void *in, const void *out, const void *mask) {
  const bool al = aligned16(in) && aligned16(mask);
  igeom g = {N, H, W, C, OH, OW, R, KH, KW, stride, padh, padw, 0, 0, N * OH * OW,
             al && C % 8 == 0, aligned16(out) && aligned16(mask) && R % 8 == 0,
             R % 2 == 0 && ((uintptr_t)out & 3u) == 0, 0, 0};
  if (g.vec) {
    g.Cp = (C + kBK - 1) / kBK * kBK;
    g.Kp = KH * KW * g.Cp;
  } else {
    g.Cp = C;
    g.Kp = (KH * KW * C + kBK - 1) / kBK * kBK;
  }
  return g;
}

template <typename T> __device__ __forceinline__ T zero() { return nt_from_f<T>(0.f); }

/* The output pixel (n, oh, ow) of GEMM row m: row-major over [N, OH, OW]; with POOL, rows go
 * window by window (m = 4 * pooled pixel + 2 * dy + dx) so that a 2x2 window is four adjacent
 * rows, held by lanes L, L^4, L^8, L^12 of one warp in the mma accumulator layout. */
template <bool POOL>
__device__ __forceinline__ void pixel_of(int m, const igeom &g, int &n, int &oh, int &ow) {
  if (POOL) {
    const int q = m >> 2, phw = g.PH * g.PW;
    n = q / phw;
    const int r = q - n * phw, ph = r / g.PW, pw = r - ph * g.PW;
    oh = 2 * ph + ((m >> 1) & 1);
    ow = 2 * pw + (m & 1);
  } else {
    const int ohw = g.OH * g.OW;
    n = m / ohw;
    const int r = m - n * ohw;
    oh = r / g.OW;
    ow = r - oh * g.OW;
  }
}

/* Whether (b at window position ib) replaces (a at ia) as a window's maximum: a NaN wins, then
 * the larger value, ties to the earlier position (torch's max-pool, in any merge order). */
__device__ __forceinline__ bool pool_better(float b, int ib, float a, int ia) {
  const bool bn = isnan(b), an = isnan(a);
  if (bn != an) return bn;
  if (bn) return ib < ia;
  return b > a || (b == a && ib < ia);
}

/* Where the forward kernel writes: y, or (pooled) y and argmax in the pool's layout. */
struct conv_out {
  const void *bias;   /* [R] f32 or T, or NULL */
  bool bias_f32, relu, y_nchw;
  void *y;
  int *argmax;
  const void *ymask;  /* T in y's layout, or NULL: y is written as 0 where ymask <= 0 */
};

/* Zeroes the 8 values of a 16-byte chunk of `a` where the matching chunk of `m` is not > 0 (the
 * ReLU mask of dy, applied in shared memory after the copy lands). */
template <typename T> __device__ __forceinline__ void mask_chunk(T *a, const T *m) {
  uint4 av = *reinterpret_cast<uint4 *>(a);
  const uint4 mv = *reinterpret_cast<const uint4 *>(m);
  T *ae = reinterpret_cast<T *>(&av);
  const T *me = reinterpret_cast<const T *>(&mv);
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (!(nt_to_f(me[e]) > 0.f)) ae[e] = zero<T>();
  *reinterpret_cast<uint4 *>(a) = av;
}

/* Wp[r, k] for the packed K order (tap, c) with Cp columns per tap: w[r, c, kh, kw] for the
 * forward; flip (dx): w[c, r, KH-1-kh, KW-1-kw] (w is [Cout, Cin, KH, KW]; then r runs over
 * Cin and c over Cout). Zero in the padding. */
template <typename T>
__global__ void pack_weight(const T *__restrict__ w, T *__restrict__ wp, igeom g, bool flip) {
  const unsigned total = (unsigned)g.R * g.Kp;
  const int Cin = flip ? g.R : g.C;   /* w's dim 1 */
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    const int r = (int)(i / (unsigned)g.Kp), k = (int)(i - (unsigned)r * g.Kp);
    const int tap = k / g.Cp, c = k - tap * g.Cp;
    T v = zero<T>();
    if (tap < g.KH * g.KW && c < g.C) {
      const int kh = tap / g.KW, kw = tap - kh * g.KW;
      v = flip ? w[((c * Cin + r) * g.KH + g.KH - 1 - kh) * g.KW + g.KW - 1 - kw]
               : w[((r * Cin + c) * g.KH + kh) * g.KW + kw];
    }
    wp[i] = v;
  }
}

/* The forward / dx kernel.
 *   GEMM: M = N*OH*OW output pixels, N = R output channels, K = Kp (taps x channels).
 *   A (M x K): the input pixel under each tap, gathered per k-step (one tap, 32 channels);
 *              with MASK, dy's ReLU mask (same shape as the input) is gathered beside it.
 *   B (K x N): the packed weight, Wp rows are output channels (B^T row-major).
 * Tile 128 x BN x 32 (BN = 32 or 64: the CNN's channel counts, one block column covers them
 * all so the input is read once), four warps of 32 rows x BN, three cp.async stages (BN 64
 * with the mask: 77 KB of shared memory, two blocks per SM; without: 46 KB). The epilogue
 * adds the bias (f32 or T), applies the ReLU and writes rows of R contiguous channels, zeroed
 * where out.ymask <= 0 (dx of a conv whose input is a ReLU output). POOL: rows in window
 * order (pixel_of), and the epilogue writes the 2x2 max and its argmax instead of y. Element
 * loads instead of cp.async when C % 8 != 0 (conv1: C = 1, K = 9 in one 32-wide k-step). */
template <typename T, int BN, bool MASK, bool POOL>
__global__ void __launch_bounds__(kThreads)
    conv_igemm(const T *__restrict__ x, const T *__restrict__ mask, const T *__restrict__ wp,
               conv_out out, igeom g) {
  constexpr int BM = 128, LD = kBK + kPad, NT = BN / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *As = reinterpret_cast<T *>(smem_raw);   /* [kStages][BM][LD] */
  T *Bs = As + kStages * BM * LD;            /* [kStages][BN][LD] */
  T *Ms = Bs + kStages * BN * LD;            /* [kStages][BM][LD], MASK only */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int cpt = g.Cp / kBK;

  /* vec loader: this thread's 8-channel chunk (aj) of rows (tid >> 2) + 32 i; each row's image
   * offset and top-left input corner, found once (-1: the row is past M). */
  const int aj = tid & 3;
  int a_base[4], a_ih[4], a_iw[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int m = m0 + (tid >> 2) + 32 * i;
    a_base[i] = -1;
    a_ih[i] = a_iw[i] = 0;
    if (m < g.M) {
      int n, oh, ow;
      pixel_of<POOL>(m, g, n, oh, ow);
      a_base[i] = n * g.H * g.W * g.C;
      a_ih[i] = oh * g.stride - g.padh;
      a_iw[i] = ow * g.stride - g.padw;
    }
  }

  /* element loader (not vec): row tid's image offset and corner */
  static_assert(BM == kThreads, "the element loader takes one row per thread");
  int f_base = -1, f_ih = 0, f_iw = 0;
  if (!g.vec && m0 + tid < g.M) {
    int n, oh, ow;
    pixel_of<POOL>(m0 + tid, g, n, oh, ow);
    f_base = n * g.H * g.W * g.C;
    f_ih = oh * g.stride - g.padh;
    f_iw = ow * g.stride - g.padw;
  }

  auto load_stage = [&](int s, int t) {
    T *as = As + s * BM * LD, *bs = Bs + s * BN * LD, *ms = Ms + s * BM * LD;
    if (g.vec) {
      const int tap = t / cpt, ci = (t - tap * cpt) * kBK + aj * 8;
      const int kh = tap / g.KW, kw = tap - kh * g.KW;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int r = (tid >> 2) + 32 * i, ih = a_ih[i] + kh, iw = a_iw[i] + kw;
        const bool ok = a_base[i] >= 0 && ci < g.C && (unsigned)ih < (unsigned)g.H &&
                        (unsigned)iw < (unsigned)g.W;
        const int off = ok ? a_base[i] + (ih * g.W + iw) * g.C + ci : 0;
        cp_async16_ca(as + r * LD + aj * 8, x + off, ok);
        if (MASK) cp_async16_ca(ms + r * LD + aj * 8, mask + off, ok);
      }
    } else {
      /* one row per thread (BM == kThreads: row tid, its pixel found once), its 32 flat k
       * = tap * C + c in turn: every thread has the same share of real taps (conv1: 9) */
      /* (kh, kw, ci) of k = t * kBK, then stepped along with k (no division per element) */
      const int r = tid, k0 = t * kBK, tap0 = k0 / g.C;
      int ci = k0 - tap0 * g.C, kh = tap0 / g.KW, kw = tap0 - kh * g.KW;
      for (int kk = 0; kk < kBK; kk++) {
        const int ih = f_ih + kh, iw = f_iw + kw;
        T v = zero<T>();
        if (f_base >= 0 && kh < g.KH && (unsigned)ih < (unsigned)g.H &&
            (unsigned)iw < (unsigned)g.W) {
          const int off = f_base + (ih * g.W + iw) * g.C + ci;
          v = x[off];
          if (MASK && !(nt_to_f(mask[off]) > 0.f)) v = zero<T>();
        }
        as[r * LD + kk] = v;
        if (++ci == g.C) {
          ci = 0;
          if (++kw == g.KW) {
            kw = 0;
            kh++;
          }
        }
      }
    }
    for (int c = tid; c < BN * (kBK / 8); c += kThreads) {
      const int r = c >> 2, j = c & 3, row = n0 + r;
      const bool ok = row < g.R;
      cp_async16(bs + r * LD + j * 8, wp + (ok ? row * g.Kp + t * kBK + j * 8 : 0), ok);
    }
  };

  float acc[2][NT][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[a][b][c] = 0.f;

  const int KT = g.Kp / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int t = 0; t < KT; t++) {
    const int s = t % kStages;
    cp_async_wait<kStages - 2>();
    if (MASK && g.vec) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int at = s * BM * LD + ((tid >> 2) + 32 * i) * LD + aj * 8;
        mask_chunk(As + at, Ms + at);
      }
    }
    __syncthreads();
    if (t + kStages - 1 < KT) load_stage((t + kStages - 1) % kStages, t + kStages - 1);
    cp_async_commit();
    const T *as = As + s * BM * LD, *bs = Bs + s * BN * LD;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
        ldsm_x4(a[mt], a_frag_addr(as, LD, warp * 32 + mt * 16, kk, lane));
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4(b, bt_frag_addr(bs, LD, np * 16, kk, lane));
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          mma_op<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
          mma_op<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  /* epilogue: lane holds (row g8, cols c2, c2+1) and (row g8 + 8, same cols) per tile */
  const int g8 = lane >> 2, c2 = 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const int co = n0 + nt * 8 + c2;
    const bool one = co < g.R, two = co + 1 < g.R;
    float b0 = 0.f, b1 = 0.f;
    if (out.bias && one) {
      const float *bf = (const float *)out.bias;
      const T *bt = (const T *)out.bias;
      b0 = out.bias_f32 ? bf[co] : nt_to_f(bt[co]);
      if (two) b1 = out.bias_f32 ? bf[co + 1] : nt_to_f(bt[co + 1]);
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int m = m0 + warp * 32 + mt * 16 + g8 + 8 * h;
        float v0 = acc[mt][nt][2 * h] + b0, v1 = acc[mt][nt][2 * h + 1] + b1;
        if (out.relu) {
          v0 = v0 > 0.f || v0 != v0 ? v0 : 0.f;
          v1 = v1 > 0.f || v1 != v1 ? v1 : 0.f;
        }
        if (POOL) {
          /* compare the values y would hold (rounded to T), as the unfused pool does; the
           * four rows of a window are lanes xor 4 and xor 8 apart (all lanes shuffle) */
          v0 = nt_to_f(nt_from_f<T>(v0));
          v1 = nt_to_f(nt_from_f<T>(v1));
          int i0 = g8 & 3, i1 = g8 & 3;
#pragma unroll
          for (int o = 4; o <= 8; o <<= 1) {
            const float u0 = __shfl_xor_sync(0xffffffffu, v0, o);
            const float u1 = __shfl_xor_sync(0xffffffffu, v1, o);
            const int j0 = __shfl_xor_sync(0xffffffffu, i0, o);
            const int j1 = __shfl_xor_sync(0xffffffffu, i1, o);
            if (pool_better(u0, j0, v0, i0)) { v0 = u0; i0 = j0; }
            if (pool_better(u1, j1, v1, i1)) { v1 = u1; i1 = j1; }
          }
          if ((g8 & 3) || m >= g.M || !one) continue;
          const int q = m >> 2, phw = g.PH * g.PW, n = q / phw, r = q - n * phw;
          const int ph = r / g.PW, pw = r - ph * g.PW;
          const long at = out.y_nchw ? ((long)n * g.R + co) * phw + r : (long)q * g.R + co;
          const long step = out.y_nchw ? phw : 1;
          T *py = (T *)out.y;
          py[at] = nt_from_f<T>(v0);
          out.argmax[at] = (2 * ph + (i0 >> 1)) * g.OW + 2 * pw + (i0 & 1);
          if (two) {
            py[at + step] = nt_from_f<T>(v1);
            out.argmax[at + step] = (2 * ph + (i1 >> 1)) * g.OW + 2 * pw + (i1 & 1);
          }
          continue;
        }
        if (m >= g.M || !one) continue;
        if (out.ymask) {
          const T *ym = (const T *)out.ymask + (long)m * g.R + co;
          if (!(nt_to_f(ym[0]) > 0.f)) v0 = 0.f;
          if (two && !(nt_to_f(ym[1]) > 0.f)) v1 = 0.f;
        }
        T *dst = (T *)out.y + (long)m * g.R + co;
        if (two && g.out_pair) {
          *reinterpret_cast<uint32_t *>(dst) = mma_op<T>::pack(v0, v1);
        } else {
          dst[0] = nt_from_f<T>(v0);
          if (two) dst[1] = nt_from_f<T>(v1);
        }
      }
  }
}

/* The weight-gradient kernel.
 *   GEMM: M = Cout, N = KH*KW*C columns (tap, c), K = N*OH*OW output pixels, split over
 *         blockIdx.z into `chunk`-pixel ranges.
 *   A (M x K): dy^T, tiles of dy [32 pixels][BMW channels] read by transposed ldmatrix; with
 *              MASK, relu_y masks them as they land.
 *   B (K x N): the input under each column's tap at each pixel (implicit im2col), tiles
 *              [32 pixels][64 columns] read by transposed ldmatrix.
 * Tile BMW (32 or 64, the CNN's Cout) x 64 x 32, warps 2 x 2 (BMW/2 rows x 32 columns), three
 * stages in static shared memory (41 KB). Each block writes its fp32 partial to
 * part[split][Cout][Kc] (no atomics); the blocks of column tile 0 also sum dy per channel into
 * dbpart[split][Cout]. wgrad_reduce adds the splits in a fixed order. */
template <typename T, int BMW, bool MASK>
__global__ void __launch_bounds__(kThreads)
    wgrad_igemm(const T *__restrict__ dy, const T *__restrict__ mask, const T *__restrict__ x,
                float *__restrict__ part, float *__restrict__ dbpart, igeom g, int cols, int Kc,
                int chunk) {
  constexpr int BNW = 64, LDA = BMW + kPad, LDB = BNW + kPad, MT = BMW / 32, NT = 4;
  __shared__ __align__(16) T As[kStages][kBK][LDA];
  __shared__ __align__(16) T Bs[kStages][kBK][LDB];
  __shared__ __align__(16) T Ms[MASK ? kStages : 1][kBK][LDA];
  __shared__ int4 colinfo[BNW];   /* element x loader: (kh, kw, c, real) of each tile column */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  const int n0 = blockIdx.x * BNW, m0 = blockIdx.y * BMW;
  const int p_begin = blockIdx.z * chunk;
  const int p_end = min(p_begin + chunk, g.M);
  const bool dy_vec = g.out_vec;
  constexpr int CPR = BMW / 8, RPP = kThreads / CPR;   /* dy chunks per row, rows per pass */
  /* vec x loader: column chunk (tid & 7) of rows (tid >> 3) + 16 i; its tap found once */
  const int xcol = n0 + (tid & 7) * 8, xtap = xcol / g.C, xci = xcol - xtap * g.C;
  const bool xok = xtap < g.KH * g.KW;
  const int xkh = xtap / g.KW, xkw = xtap - xkh * g.KW;

  auto load_stage = [&](int s, int t) {
    const int p0 = p_begin + t * kBK;
    if (dy_vec) {
      const int j = tid % CPR, co = m0 + j * 8;
#pragma unroll
      for (int i = 0; i < kBK / RPP; i++) {
        const int r = tid / CPR + i * RPP, p = p0 + r;
        const bool ok = p < p_end && co < g.R;
        const long off = ok ? (long)p * g.R + co : 0;
        cp_async16(&As[s][r][j * 8], dy + off, ok);
        if (MASK) cp_async16(&Ms[s][r][j * 8], mask + off, ok);
      }
    } else {
      for (int e = tid; e < kBK * BMW; e += kThreads) {
        const int r = e / BMW, c = e - r * BMW, p = p0 + r, co = m0 + c;
        T v = zero<T>();
        if (p < p_end && co < g.R) {
          const long off = (long)p * g.R + co;
          v = dy[off];
          if (MASK && !(nt_to_f(mask[off]) > 0.f)) v = zero<T>();
        }
        As[s][r][c] = v;
      }
    }
    if (g.vec) {
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int r = (tid >> 3) + 16 * i, p = p0 + r;
        bool ok = xok && p < p_end;
        int off = 0;
        if (ok) {
          int n, oh, ow;
          pixel_of<false>(p, g, n, oh, ow);
          const int ih = oh * g.stride - g.padh + xkh, iw = ow * g.stride - g.padw + xkw;
          ok = (unsigned)ih < (unsigned)g.H && (unsigned)iw < (unsigned)g.W;
          off = ok ? ((n * g.H + ih) * g.W + iw) * g.C + xci : 0;
        }
        cp_async16_ca(&Bs[s][r][(tid & 7) * 8], x + off, ok);
      }
    } else {
      /* pixel row tid & 31 (found once per step), columns (tid >> 5) + 4 i: the real
       * columns (conv1: 9) spread over all four warps */
      const int r = tid & 31, p = p0 + r;
      int base = -1, ih0 = 0, iw0 = 0;
      if (p < p_end) {
        int n, oh, ow;
        pixel_of<false>(p, g, n, oh, ow);
        base = n * g.H * g.W * g.C;
        ih0 = oh * g.stride - g.padh;
        iw0 = ow * g.stride - g.padw;
      }
#pragma unroll 4
      for (int i = 0; i < BNW / 4; i++) {
        const int c = (tid >> 5) + 4 * i;
        const int4 ci = colinfo[c];
        const int ih = ih0 + ci.x, iw = iw0 + ci.y;
        T v = zero<T>();
        if (base >= 0 && ci.w && (unsigned)ih < (unsigned)g.H && (unsigned)iw < (unsigned)g.W)
          v = x[base + (ih * g.W + iw) * g.C + ci.z];
        Bs[s][r][c] = v;
      }
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int a = 0; a < MT; a++)
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[a][b][c] = 0.f;
  float dbacc = 0.f;
  const bool do_db = blockIdx.x == 0 && tid < BMW;
  if (tid < BNW) {
    const int col = n0 + tid, tap = col / g.C, kh = tap / g.KW;
    colinfo[tid] = make_int4(kh, tap - kh * g.KW, col - tap * g.C, tap < g.KH * g.KW);
  }
  __syncthreads();

  const int KT = p_end > p_begin ? (p_end - p_begin + kBK - 1) / kBK : 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int t = 0; t < KT; t++) {
    const int s = t % kStages;
    cp_async_wait<kStages - 2>();
    if (MASK && dy_vec) {
#pragma unroll
      for (int i = 0; i < kBK / RPP; i++) {
        const int r = tid / CPR + i * RPP, c = (tid % CPR) * 8;
        mask_chunk(&As[s][r][c], &Ms[s][r][c]);
      }
    }
    __syncthreads();
    if (t + kStages - 1 < KT) load_stage((t + kStages - 1) % kStages, t + kStages - 1);
    cp_async_commit();
    if (do_db)
#pragma unroll 8
      for (int r = 0; r < kBK; r++) dbacc += nt_to_f(As[s][r][tid]);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        ldsm_x4_t(a[mt], at_frag_addr_t(&As[s][0][0], LDA, wm * (BMW / 2) + mt * 16, kk, lane));
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4_t(b, b_frag_addr_t(&Bs[s][0][0], LDB, kk, wn * 32 + np * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma_op<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
          mma_op<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g8 = lane >> 2, c2 = 2 * (lane & 3);
  float *out = part + (long)blockIdx.z * g.R * Kc;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int co = m0 + wm * (BMW / 2) + mt * 16 + g8 + 8 * h;
        const int col = n0 + wn * 32 + nt * 8 + c2;
        if (co < g.R && col < cols)   /* Kc is a multiple of 8: col + 1 stays in the row */
          *reinterpret_cast<float2 *>(out + (long)co * Kc + col) =
              make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
  if (do_db && m0 + tid < g.R) dbpart[blockIdx.z * g.R + m0 + tid] = dbacc;
}

/* dw[co, c, kh, kw] += sum over splits of part[split][co][(kh*KW + kw)*C + c], and db[co] +=
 * sum of dbpart[split][co]. Outputs are numbered dw first (co, col), then db (co); a block
 * takes kRedCols consecutive outputs (j = threadIdx.x % kRedCols, coalesced) and spreads the
 * splits over kRedGroups thread groups (split k to group k % kRedGroups, each in split order);
 * thread group 0 then adds the groups' sums in group order. Fixed order throughout: the same
 * bits on every run. */
constexpr int kRedCols = 32, kRedGroups = 16;
template <typename W, typename B>
__global__ void __launch_bounds__(kRedCols * kRedGroups)
    wgrad_reduce(const float *__restrict__ part, const float *__restrict__ dbpart, int splits,
                 igeom g, int cols, int Kc, W *__restrict__ dw, B *__restrict__ db) {
  __shared__ float sums[kRedGroups][kRedCols];
  const int j = threadIdx.x % kRedCols, grp = threadIdx.x / kRedCols;
  const int nw = dw ? g.R * cols : 0, total = nw + (db ? g.R : 0);
  const int i = blockIdx.x * kRedCols + j;
  const bool is_w = i < nw;
  int co = 0, col = 0;
  if (is_w) {
    co = i / cols;
    col = i - co * cols;
  } else {
    co = i - nw;
  }
  float s = 0.f;
  if (i < total)
    for (int k = grp; k < splits; k += kRedGroups)
      s += is_w ? part[((long)k * g.R + co) * Kc + col] : dbpart[(long)k * g.R + co];
  sums[grp][j] = s;
  __syncthreads();
  if (grp != 0 || i >= total) return;
  s = 0.f;
#pragma unroll
  for (int k = 0; k < kRedGroups; k++) s += sums[k][j];
  if (is_w) {
    const int tap = col / g.C, c = col - tap * g.C, kh = tap / g.KW, kw = tap - kh * g.KW;
    W *d = dw + ((co * g.C + c) * g.KH + kh) * g.KW + kw;
    *d = nt_from_f<W>(nt_to_f(*d) + s);
  } else {
    db[co] = nt_from_f<B>(nt_to_f(db[co]) + s);
  }
}

/* out = conv(in) through the packed weight (forward, or dx with flip), with the mask (dx) or
 * the pool (forward, out.argmax set: g.M counts the pooled windows' rows) as the kernel
 * describes. */
template <typename T>
nt_status run_conv(nt_ctx *ctx, nt_dtype dt, const T *in, const T *mask, const T *w, bool flip,
                   const conv_out &out, const igeom &g) {
  cudaStream_t s = nt_cuda_stream(ctx);
  nt_tensor wp = {};
  const int64_t shape[2] = {g.R, g.Kp};
  nt_status st = nt_tensor_alloc(ctx, &wp, dt, 2, shape);
  if (st) return st;
  pack_weight<T><<<nt_grid_for((long)g.R * g.Kp), 256, 0, s>>>(w, (T *)wp.data, g, flip);
  st = NT_CUDA_LAUNCHED(ctx);
  const bool wide = g.R > 32, pool = out.argmax != nullptr;
  const int BN = wide ? 64 : 32;
  auto kernel = wide ? (mask   ? conv_igemm<T, 64, true, false>
                        : pool ? conv_igemm<T, 64, false, true>
                               : conv_igemm<T, 64, false, false>)
                     : (mask   ? conv_igemm<T, 32, true, false>
                        : pool ? conv_igemm<T, 32, false, true>
                               : conv_igemm<T, 32, false, false>);
  const int bytes = kStages * ((mask ? 2 : 1) * 128 + BN) * (kBK + kPad) * (int)sizeof(T);
  if (!st)
    st = NT_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           bytes));
  if (!st) {
    dim3 grid((unsigned)((g.M + 127) / 128), (unsigned)((g.R + BN - 1) / BN));
    kernel<<<grid, kThreads, bytes, s>>>(in, mask, (const T *)wp.data, out, g);
    st = NT_CUDA_LAUNCHED(ctx);
  }
  nt_tensor_free(ctx, &wp);
  return st;
}

template <typename W, typename B>
nt_status launch_reduce(nt_ctx *ctx, const float *part, const float *dbpart, int splits,
                        const igeom &g, int cols, int Kc, nt_tensor *dw, nt_tensor *db) {
  const long total = (dw ? (long)g.R * cols : 0) + (db ? g.R : 0);
  wgrad_reduce<W, B><<<(unsigned)((total + kRedCols - 1) / kRedCols), kRedCols * kRedGroups, 0,
                       nt_cuda_stream(ctx)>>>(
      part, dbpart, splits, g, cols, Kc, dw ? (W *)dw->data : (W *)nullptr,
      db ? (B *)db->data : (B *)nullptr);
  return NT_CUDA_LAUNCHED(ctx);
}

/* dw (and db) += the weight gradient of the conv x -> dy (g: input x, output dy). */
template <typename T>
nt_status run_wgrad(nt_ctx *ctx, const T *dy, const T *mask, const T *x, const igeom &g,
                    nt_tensor *dw, nt_tensor *db) {
  const int cols = g.KH * g.KW * g.C, Kc = (cols + 7) / 8 * 8;
  const int BMW = g.R > 32 ? 64 : 32;
  const int tiles = ((cols + 63) / 64) * ((g.R + BMW - 1) / BMW);
  int sms = 132, dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  /* about four blocks per SM in all, each split at least 16 k-steps long */
  const int steps = (g.M + kBK - 1) / kBK;
  int splits = (4 * sms + tiles - 1) / tiles;
  if (splits > steps / 16) splits = steps / 16;
  if (splits < 1) splits = 1;
  const int chunk = (steps + splits - 1) / splits * kBK;
  splits = (g.M + chunk - 1) / chunk;
  nt_tensor part = {}, dbp = {};
  const int64_t sp[1] = {(int64_t)splits * g.R * Kc}, sd[1] = {(int64_t)splits * g.R};
  nt_status st = nt_tensor_alloc(ctx, &part, NT_F32, 1, sp);
  if (!st) st = nt_tensor_alloc(ctx, &dbp, NT_F32, 1, sd);
  if (!st) {
    auto kernel = BMW == 64 ? (mask ? wgrad_igemm<T, 64, true> : wgrad_igemm<T, 64, false>)
                            : (mask ? wgrad_igemm<T, 32, true> : wgrad_igemm<T, 32, false>);
    dim3 grid((unsigned)((cols + 63) / 64), (unsigned)((g.R + BMW - 1) / BMW), (unsigned)splits);
    kernel<<<grid, kThreads, 0, nt_cuda_stream(ctx)>>>(dy, mask, x, (float *)part.data,
                                                       (float *)dbp.data, g, cols, Kc, chunk);
    st = NT_CUDA_LAUNCHED(ctx);
  }
  if (!st) {
    const float *pp = (const float *)part.data, *pd = (const float *)dbp.data;
    const bool w32 = !dw || dw->dtype == NT_F32, b32 = !db || db->dtype == NT_F32;
    if (w32 && b32) st = launch_reduce<float, float>(ctx, pp, pd, splits, g, cols, Kc, dw, db);
    else if (w32) st = launch_reduce<float, T>(ctx, pp, pd, splits, g, cols, Kc, dw, db);
    else if (b32) st = launch_reduce<T, float>(ctx, pp, pd, splits, g, cols, Kc, dw, db);
    else st = launch_reduce<T, T>(ctx, pp, pd, splits, g, cols, Kc, dw, db);
  }
  nt_tensor_free(ctx, &part);
  nt_tensor_free(ctx, &dbp);
  return st;
}

struct shape4 { int N, H, W, C; };
shape4 dims_of(const nt_tensor *t) {
  return {(int)t->shape[0], (int)t->shape[1], (int)t->shape[2], (int)t->shape[3]};
}

template <typename T>
nt_status forward_t(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w, const nt_tensor *b,
                    nt_tensor *y, nt_conv2d_params p, bool relu) {
  const shape4 i = dims_of(x), o = dims_of(y);
  const igeom g = make_geom(i.N, i.H, i.W, i.C, o.H, o.W, o.C, (int)w->shape[2],
                            (int)w->shape[3], p.stride, p.pad, p.pad, x->data, y->data, nullptr);
  const conv_out out = {b ? b->data : nullptr, b && b->dtype == NT_F32, relu, false, y->data,
                        nullptr, nullptr};
  return run_conv<T>(ctx, x->dtype, (const T *)x->data, nullptr, (const T *)w->data, false, out,
                     g);
}

/* p = maxpool2(conv(x)) in one kernel: the conv's rows in window order, the pool in the
 * epilogue; the conv output is never stored. */
template <typename T>
nt_status forward_pool_t(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w, const nt_tensor *b,
                         nt_tensor *y, nt_tensor *argmax, nt_conv2d_params p, bool relu,
                         bool y_nchw) {
  const shape4 i = dims_of(x);
  const int KH = (int)w->shape[2], KW = (int)w->shape[3], R = (int)w->shape[0];
  const int OH = (i.H + 2 * p.pad - KH) / p.stride + 1, OW = (i.W + 2 * p.pad - KW) / p.stride + 1;
  igeom g = make_geom(i.N, i.H, i.W, i.C, OH, OW, R, KH, KW, p.stride, p.pad, p.pad, x->data,
                      nullptr, nullptr);
  g.PH = OH / 2;
  g.PW = OW / 2;
  g.M = i.N * g.PH * g.PW * 4;
  if (g.M == 0) return NT_OK;
  const conv_out out = {b ? b->data : nullptr, b && b->dtype == NT_F32, relu, y_nchw, y->data,
                        (int *)argmax->data, nullptr};
  return run_conv<T>(ctx, x->dtype, (const T *)x->data, nullptr, (const T *)w->data, false, out,
                     g);
}

template <typename T>
nt_status backward_t(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                     const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                     const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                     nt_conv2d_params p) {
  const shape4 i = dims_of(x), o = dims_of(dy);
  const int KH = (int)w->shape[2], KW = (int)w->shape[3];
  const T *mask = relu_y ? (const T *)relu_y->data : nullptr;
  nt_status st = NT_OK;
  if (dx) {
    if (p.stride == 1 && p.pad < KH && p.pad < KW) {
      /* dx = conv of dy (C = Cout) with the flipped weight, padded K-1-pad: [N, H, W, Cin] */
      const igeom gx = make_geom(o.N, o.H, o.W, o.C, i.H, i.W, i.C, KH, KW, 1, KH - 1 - p.pad,
                                 KW - 1 - p.pad, dy->data, dx->data, mask);
      const conv_out out = {nullptr, false, false, false, dx->data, nullptr,
                            dx_mask ? dx_mask->data : nullptr};
      st = run_conv<T>(ctx, x->dtype, (const T *)dy->data, mask, (const T *)w->data, true, out,
                       gx);
    } else {
      st = nt_conv2d_nhwc_dgrad_direct(ctx, dy, relu_y, w, dx, dx_mask, p);
    }
  }
  if (!st && dw) {
    const igeom g = make_geom(i.N, i.H, i.W, i.C, o.H, o.W, o.C, KH, KW, p.stride, p.pad, p.pad,
                              x->data, dy->data, mask);
    st = run_wgrad<T>(ctx, (const T *)dy->data, mask, (const T *)x->data, g, dw, db);
  } else if (!st && db) {
    st = nt_conv2d_nhwc_wgrad_direct(ctx, dy, relu_y, x, nullptr, db, p);
  }
  return st;
}

nt_status too_big(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *y, const nt_tensor *w) {
  const double lim = 2e9, k = (double)w->shape[1] * w->shape[2] * w->shape[3] + 64;
  if ((double)nt_tensor_numel(x) > lim || (double)nt_tensor_numel(y) > lim ||
      (double)w->shape[0] * k > lim)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "conv2d_nhwc: tensors past 2e9 elements");
  return NT_OK;
}

}  // namespace

extern "C" nt_status nt_conv2d_nhwc_forward_cuda(nt_ctx *ctx, const nt_tensor *x,
                                                 const nt_tensor *w, const nt_tensor *b,
                                                 nt_tensor *y, nt_conv2d_params p, bool relu) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, x, y, w))) return st;
  if (nt_tensor_numel(y) == 0) return NT_OK;
  switch (x->dtype) {
    case NT_F32: return nt_conv2d_nhwc_forward_direct(ctx, x, w, b, y, p, relu);
    case NT_F16: return forward_t<__half>(ctx, x, w, b, y, p, relu);
    case NT_BF16: return forward_t<__nv_bfloat16>(ctx, x, w, b, y, p, relu);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc: unsupported dtype");
  }
}

extern "C" nt_status nt_conv2d_nhwc_pool_forward_cuda(nt_ctx *ctx, const nt_tensor *x,
                                                      const nt_tensor *w, const nt_tensor *b,
                                                      nt_tensor *y, nt_tensor *argmax,
                                                      nt_conv2d_params p, bool relu,
                                                      bool y_nchw) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, x, y, w))) return st;
  switch (x->dtype) {
    case NT_F16: return forward_pool_t<__half>(ctx, x, w, b, y, argmax, p, relu, y_nchw);
    case NT_BF16:
      return forward_pool_t<__nv_bfloat16>(ctx, x, w, b, y, argmax, p, relu, y_nchw);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc_pool: no fused kernel for this dtype");
  }
}

extern "C" nt_status nt_conv2d_nhwc_backward_cuda(nt_ctx *ctx, const nt_tensor *dy,
                                                  const nt_tensor *relu_y, const nt_tensor *x,
                                                  const nt_tensor *w, nt_tensor *dx,
                                                  const nt_tensor *dx_mask, nt_tensor *dw,
                                                  nt_tensor *db, nt_conv2d_params p) {
  nt_status st = nt_cuda_set_device(ctx);
  if (st || (st = too_big(ctx, x, dy, w))) return st;
  if (nt_tensor_numel(dy) == 0) {
    /* no outputs: dx is all zeros, dw and db unchanged */
    return dx ? nt_tensor_zero(ctx, dx) : NT_OK;
  }
  switch (x->dtype) {
    case NT_F32:
      st = dx ? nt_conv2d_nhwc_dgrad_direct(ctx, dy, relu_y, w, dx, dx_mask, p) : NT_OK;
      if (!st && (dw || db)) st = nt_conv2d_nhwc_wgrad_direct(ctx, dy, relu_y, x, dw, db, p);
      return st;
    case NT_F16: return backward_t<__half>(ctx, dy, relu_y, x, w, dx, dx_mask, dw, db, p);
    case NT_BF16:
      return backward_t<__nv_bfloat16>(ctx, dy, relu_y, x, w, dx, dx_mask, dw, db, p);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "conv2d_nhwc: unsupported dtype");
  }
}
