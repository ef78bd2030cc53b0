/* Private to ops/attention_fwd.cu and attention_bwd.cu: the generic tensor-core pieces of
 * ops/mma.cuh (fragment layouts described there) under the nt_attn names, plus what only
 * attention uses (padded and swizzled tile loads, vector reductions, fast exp2). Tiles live in
 * shared memory row-major with a padded row (kLdPad halves). */
#ifndef NT_OPS_ATTENTION_MMA_CUH
#define NT_OPS_ATTENTION_MMA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "ops/mma.cuh"
#include "ops/wgmma.cuh"

namespace nt_attn {

constexpr int kLdPad = 8;   /* halves of padding per shared-memory row (16 bytes) */

/* The generic pieces (ops/mma.cuh), under the names attention has always used. */
using nt_mma::smem_addr;
using nt_mma::cp_async16;
using nt_mma::cp_async4;
using nt_mma::cp_async_commit;
using nt_mma::cp_async_wait;
using nt_mma::ldsm_x4;
using nt_mma::ldsm_x4_t;
using nt_mma::mma_op;
using nt_mma::a_frag_addr;
using nt_mma::bt_frag_addr;
using nt_mma::b_frag_addr_t;
using nt_mma::at_frag_addr_t;

/* The first 1024-byte boundary at or after the dynamic shared array (wgmma's 128-byte swizzle
 * repeats every 1024 bytes). Arithmetic on the array itself, not through an integer, keeps the
 * compiler aware that the result is a shared address: 32-bit LDS/STS instead of generic
 * 64-bit accesses (in the wgmma backward: 11 fewer registers, no spills, 3% faster). */
__device__ __forceinline__ unsigned char *smem_align1024(unsigned char *raw) {
  return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
}

/* Four adjacent floats added in one reduction (sm_90: red.v4.f32); p 16-byte aligned. */
__device__ __forceinline__ void red_add_f32x4(float *p, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

/* 2^x with the hardware approximation (2 ulp; exact 0 for -inf), as the softmax needs. */
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* Copies rows [row0, row0 + ROWS) of a [rows_total, D] matrix whose rows lie ld elements
 * apart (16-byte aligned) into a padded shared tile, zero-filling rows past the end. */
template <typename T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(T *smem, const T *g, int ld, int row0,
                                          int rows_total, int tid) {
  constexpr int kChunks = D / 8;   /* 16-byte pieces per row */
  constexpr int kLd = D + kLdPad, kRows = THREADS / kChunks;   /* rows per pass */
  static_assert((ROWS * kChunks) % THREADS == 0 && THREADS % kChunks == 0,
                "tile pieces must split evenly over threads");
  const int r0 = tid / kChunks, col = (tid % kChunks) * 8;
  const T *p = g + (long long)(row0 + r0) * ld + col;
#pragma unroll
  for (int i = 0; i < ROWS / kRows; i++) {
    const int r = r0 + i * kRows;
    const bool ok = row0 + r < rows_total;
    /* A row past the end reads nothing (src-size 0); its address stays inside the matrix. */
    cp_async16(smem + r * kLd + col, ok ? p : g, ok);
    p += kRows * ld;
  }
}

/* The same for rows of D = 64 into a 128-byte swizzled tile (ops/wgmma.cuh), the wgmma
 * kernels' operand layout. */
template <typename T, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_sw(unsigned char *tile, const T *g, int ld, int row0,
                                             int rows_total, int tid) {
  constexpr int kPass = THREADS / 8;   /* rows per pass: 8 chunks of 16 bytes per row */
  static_assert(ROWS % kPass == 0, "tile rows must split evenly over threads");
  const int r0 = tid / 8, j = tid % 8;
#pragma unroll
  for (int i = 0; i < ROWS / kPass; i++) {
    const int r = r0 + i * kPass;
    const bool ok = row0 + r < rows_total;
    cp_async16(tile + nt_wg::sw_off(r, 8 * j), ok ? g + (long long)(row0 + r) * ld + 8 * j : g,
               ok);
  }
}

}  // namespace nt_attn

#endif
