/* Warp-level tensor-core pieces shared by the CUDA kernels of ops/ (attention, the NHWC
 * convolutions): cp.async, ldmatrix, mma.sync m16n8k16 with fp32 accumulation, F16 and BF16.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16, lane L, g = L / 4, c = 2 * (L % 4)):
 *   A 16x16 (row-major)  regs {a0..a3}: (g, c..c+1), (g+8, c..), (g, c+8..), (g+8, c+8..)
 *   B 16x8  (k x n)      regs {b0, b1}: (k = c..c+1, n = g), (k = c+8.., n = g)
 *   C 16x8  fp32         {c0, c1} at (g, c..c+1), {c2, c3} at (g+8, c..c+1)
 * Tiles live in shared memory row-major with a padded row so the eight row addresses of one
 * ldmatrix fall into different banks. */
#ifndef NT_OPS_MMA_CUH
#define NT_OPS_MMA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace nt_mma {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; zero-fills the destination when !pred. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(pred ? 16 : 0));
}
/* The same, cached in L1 on the way (.ca): for gathers that read the same lines again soon,
 * as a convolution's taps do. */
__device__ __forceinline__ void cp_async16_ca(void *dst, const void *src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(pred ? 16 : 0));
}
/* 4-byte async copy (only 4-byte alignment needed); zero-fills the destination when !pred. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
/* Waits until at most N of this thread's committed groups are pending. The memory clobber keeps
 * the compiler from moving this thread's plain shared-memory reads of the landed data (the
 * convolutions' mask_chunk, before any __syncthreads) above the wait. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <typename T> struct mma_op;
template <> struct mma_op<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};
template <> struct mma_op<__half> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};

/* Address lane L hands to ldmatrix.x4 so the four 8x8 pieces come back as an A fragment
 * (rows r0..r0+15, cols c0..c0+15 of a row-major tile with leading dim ld). */
template <typename T>
__device__ __forceinline__ const T *a_frag_addr(const T *tile, int ld, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
/* For B = tile^T (tile rows are n, cols are k), non-transposed ldmatrix.x4: pieces come back as
 * {b0, b1} of n-block n0..n0+7 then {b0, b1} of n0+8..n0+15, over k = k0..k0+15. */
template <typename T>
__device__ __forceinline__ const T *bt_frag_addr(const T *tile, int ld, int n0, int k0, int lane) {
  return tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}
/* For B = tile (tile rows are k, cols are n), transposed ldmatrix.x4: pieces come back as
 * {b0, b1} of n-block n0..n0+7 then {b0, b1} of n0+8..n0+15, over k = k0..k0+15. */
template <typename T>
__device__ __forceinline__ const T *b_frag_addr_t(const T *tile, int ld, int k0, int n0, int lane) {
  return tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}
/* For A = tile^T (tile rows are k, cols are m), transposed ldmatrix.x4: an A fragment over
 * m = m0..m0+15, k = k0..k0+15. */
template <typename T>
__device__ __forceinline__ const T *at_frag_addr_t(const T *tile, int ld, int m0, int k0,
                                                   int lane) {
  return tile + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8;
}

}  // namespace nt_mma

#endif
