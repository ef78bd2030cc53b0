/* The wgmma building blocks (ops/wgmma.cuh) against a CPU product, BF16 and F16: one
 * warpgroup multiplies 64 x 64 (x N) tiles held in the 128-byte swizzled layout, with
 *   ss K-major A and K-major B (N 32, 64 and 128: B's rows are its N),
 *   ss K-major A and N-major B (imm-trans-b: B's rows are K), also N 32 starting at B's
 *      column 32 (64 bytes into the swizzled rows: how a warpgroup takes half the columns),
 *   ss M-major A and N-major B (both transposed),
 *   rs A from registers (the accumulator-to-A conversion the attention kernels use) and
 *      N-major B,
 * four k-slices of 16 accumulated. Inputs are small integers times powers of two, so every
 * product and sum is exact in fp32: the check is exact. Skipped without a GPU or where the
 * build has no sm_90a pass for the device (nt_wgmma_usable). */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "tests/testutil.h"
}
#include "ops/wgmma.cuh"

namespace {

enum form { KK, KN, KN_HI, MN, RS };

/* Writes a [rows x 64] row-major global matrix into a swizzled tile. */
template <typename T>
__device__ void to_tile(unsigned char *tile, const T *g, int rows) {
  for (int i = threadIdx.x; i < rows * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    *reinterpret_cast<T *>(tile + nt_wg::sw_off(r, c)) = g[i];
  }
}

/* a: A's tile as stored (64 x 64: [m][k], or [k][m] for MN); b: B's (N x 64 [n][k] for KK,
 * 64 x N [k][n] otherwise, N = 64 there). d: [64][N] fp32. */
template <typename T, int N, int F>
__global__ void product(const T *a, const T *b, float *d) {
  __shared__ __align__(1024) unsigned char sa[64 * 128];
  __shared__ __align__(1024) unsigned char sb[128 * 128];
  to_tile(sa, a, 64);
  to_tile(sb, b, F == KK ? N : 64);
  nt_wg::fence_smem_to_async();
  __syncthreads();
  const uint32_t pa = (uint32_t)__cvta_generic_to_shared(sa),
                 pb = (uint32_t)__cvta_generic_to_shared(sb);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) acc[i] = 0.f;
  nt_wg::fence();
#pragma unroll
  for (int k = 0; k < 4; k++) {
    /* K-major operands advance 16 columns (32 bytes), K-row-major ones 16 rows (2048). */
    const uint64_t da = nt_wg::desc(pa + (F == MN ? 2048 : 32) * k);
    const uint64_t db = nt_wg::desc(pb + (F == KK ? 32 : 2048) * k + (F == KN_HI ? 64 : 0));
    if constexpr (F == KK) nt_wg::mma_ss<T, N, 0, 0>::run(acc, da, db, k > 0);
    if constexpr (F == KN || F == KN_HI) nt_wg::mma_ss<T, N, 0, 1>::run(acc, da, db, k > 0);
    if constexpr (F == MN) nt_wg::mma_ss<T, N, 1, 1>::run(acc, da, db, k > 0);
    if constexpr (F == RS) {
      /* A's fragment of rows 16 warp .. + 15, columns 16 k .. + 15, from global memory. */
      const T *r0 = a + (16 * warp + g) * 64 + 16 * k + c, *r8 = r0 + 8 * 64;
      uint32_t f[4];
      f[0] = *reinterpret_cast<const uint32_t *>(r0);
      f[1] = *reinterpret_cast<const uint32_t *>(r8);
      f[2] = *reinterpret_cast<const uint32_t *>(r0 + 8);
      f[3] = *reinterpret_cast<const uint32_t *>(r8 + 8);
      nt_wg::mma_rs<T, N, 1>::run(acc, f, db, k > 0);
    }
  }
  nt_wg::commit();
  nt_wg::wait<0>();
  nt_wg::touch(acc);
#pragma unroll
  for (int j = 0; j < N / 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      d[(16 * warp + g + 8 * (e / 2)) * N + 8 * j + c + e % 2] = acc[4 * j + e];
}

template <typename T, int N, int F>
void run_form(nt_test_rng *rng, const char *tname) {
  const int brows = F == KK ? N : 64;
  float ha[64 * 64], hb[128 * 64], hd[64 * 128];
  for (int i = 0; i < 64 * 64; i++) ha[i] = ldexpf((float)(int)nt_test_uniform(rng, -8, 8), -2);
  for (int i = 0; i < brows * 64; i++)
    hb[i] = ldexpf((float)(int)nt_test_uniform(rng, -8, 8), -3);
  T ta[64 * 64], tb[128 * 64];
  /* Exact in both 16-bit formats: the host conversions round-trip them. */
  for (int i = 0; i < 64 * 64; i++) ta[i] = T(ha[i]);
  for (int i = 0; i < brows * 64; i++) tb[i] = T(hb[i]);
  T *da = NULL, *db = NULL;
  float *dd = NULL;
  bool ok = cudaMalloc(&da, sizeof ta) == cudaSuccess &&
            cudaMalloc(&db, sizeof tb) == cudaSuccess &&
            cudaMalloc(&dd, sizeof hd) == cudaSuccess &&
            cudaMemcpy(da, ta, sizeof ta, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(db, tb, sizeof tb, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    product<T, N, F><<<1, 128>>>(da, db, dd);
    ok = cudaDeviceSynchronize() == cudaSuccess &&
         cudaMemcpy(hd, dd, sizeof(float) * 64 * N, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  CHECK(ok, "%s N %d form %d: CUDA error %s", tname, N, F, cudaGetErrorString(cudaGetLastError()));
  int bad = 0;
  for (int m = 0; ok && m < 64; m++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < 64; k++) {
        const double x = F == MN ? ha[k * 64 + m] : ha[m * 64 + k];
        const double y = F == KK ? hb[n * 64 + k] : hb[k * 64 + n + (F == KN_HI ? 32 : 0)];
        s += x * y;
      }
      if ((double)hd[m * N + n] != s && bad++ < 4)
        fprintf(stderr, "  %s N %d form %d: d[%d][%d] = %g, want %g\n", tname, N, F, m, n,
                hd[m * N + n], s);
    }
  CHECK(ok && bad == 0, "%s N %d form %d: %d wrong elements", tname, N, F, bad);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
}

template <typename T> void run_all(nt_test_rng *rng, const char *tname) {
  run_form<T, 32, KK>(rng, tname);
  run_form<T, 64, KK>(rng, tname);
  run_form<T, 128, KK>(rng, tname);
  run_form<T, 64, KN>(rng, tname);
  run_form<T, 32, KN_HI>(rng, tname);
  run_form<T, 64, MN>(rng, tname);
  run_form<T, 64, RS>(rng, tname);
  run_form<T, 32, RS>(rng, tname);
}

}  // namespace

int main(void) {
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  if (!nt_wgmma_usable(0)) {
    nt_ctx_free(g);
    return nt_test_skip("no sm_90a build for this device (wgmma)");
  }
  nt_test_rng rng = {42};
  run_all<__nv_bfloat16>(&rng, "bf16");
  run_all<__half>(&rng, "f16");
  nt_ctx_free(g);
  return nt_test_finish();
}
