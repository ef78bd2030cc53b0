/* Private to the wgmma attention kernels: tensor maps that let the TMA load their tiles.
 * A [B, H, T, 64] view (16-bit elements, rows contiguous) becomes a 4-D map whose three outer
 * dimensions go by increasing stride, as the TMA wants them nested, so q/k/v views of a
 * [B, T, 3C] projection map as well as contiguous tensors; boxes are `rows` rows of one head,
 * 128-byte swizzled (ops/wgmma.cuh), and rows past T arrive as zeros. */
#ifndef NT_OPS_ATTENTION_TMA_CUH
#define NT_OPS_ATTENTION_TMA_CUH
#include <cuda.h>
#include "ops/attention_cuda.cuh"
#include "ops/wgmma.cuh"

/* The map and, per view dimension t, h, b, the map dimension (1..3) that holds it. */
struct nt_attn_map {
  CUtensorMap m;
  int pos[3];
};

/* Each returns false where the TMA cannot describe the operand (no driver entry point, T below
 * a box, a stride the TMA rejects); the caller then runs its cp.async kernel. */
bool nt_attn_map_view(nt_attn_map *map, const nt_attn_view &v, bool bf16, int B, int H, int T,
                      int rows);
/* The per-row floats of a contiguous [BH, T] buffer (lse, rowsum(dO * O)) as a 2-D map with
 * boxes of `rows` floats of one head; needs p 16-byte aligned and T a multiple of 4. */
bool nt_attn_map_rows(CUtensorMap *map, const float *p, int BH, int T, int rows);

namespace nt_attn {

/* The barriers of a double buffer at shared bar0 and bar0 + 8, one arrival per phase (the
 * issuing thread's expect_tx); before anyone waits on them, a block barrier. */
__device__ __forceinline__ void tma_buffer_barriers(uint32_t bar0) {
  nt_wg::mbar_init(bar0, 1);
  nt_wg::mbar_init(bar0 + 8, 1);
  nt_wg::mbar_init_fence();
}

/* A box of map from row0 of head (b, h) into shared dst, its bytes counted on barrier bar. */
__device__ __forceinline__ void tma_rows(const nt_attn_map &map, uint32_t dst, uint32_t bar,
                                         int row0, int h, int b) {
  int c[4] = {0, 0, 0, 0};
#pragma unroll
  for (int d = 1; d < 4; d++) c[d] = map.pos[0] == d ? row0 : map.pos[1] == d ? h : b;
  nt_wg::tma_load_4d(dst, &map.m, bar, c[0], c[1], c[2], c[3]);
}

}  // namespace nt_attn

#endif
