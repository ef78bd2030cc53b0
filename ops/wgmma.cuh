/* Hopper warpgroup MMA (wgmma.mma_async) for 16-bit operands with fp32 accumulation: shared
 * memory descriptors, the 128-byte swizzled tile layout they read, and the fence / commit /
 * wait steps. Needs an sm_90a build (arch-specific instructions): everything that emits wgmma
 * sits under NT_WGMMA_BUILT, and the host asks nt_wgmma_built() (attention.cu) before it
 * launches a kernel that uses it.
 *
 * Tiles live in shared memory as rows of 64 16-bit elements (128 bytes) whose 16-byte chunks
 * are permuted within each group of 8 rows: element (r, c) sits at byte
 *   r * 128 + ((c / 8) ^ (r % 8)) * 16 + (c % 8) * 2,
 * with the tile 1024-byte aligned (PTX ISA "Shared Memory Matrix Layout", 128B swizzling).
 * The same bytes serve both operand orientations:
 *   K-major (rows are M or N, the 64 columns are K): SBO = 1024 between groups of 8 rows;
 *     the k-th slice of 16 columns starts 32 * k bytes further (the hardware applies the
 *     swizzle to the address it forms, so the start moves like an unswizzled one).
 *   MN-major (rows are K, the 64 columns are M or N; imm-trans = 1): SBO = 1024 between groups
 *     of 8 K rows; the k-th slice of 16 rows starts 2048 * k bytes further; one 64-wide
 *     column block, so LBO (the next block of 64 columns) is never used.
 *
 * Register layouts (per warp w = warp % 4 of the warpgroup, lane L, g = L / 4, c = 2 (L % 4)):
 *   accumulator m64nN: rows 16 w + g (+ 8), d[4 j + {0, 1}] at (16 w + g, 8 j + c + {0, 1}),
 *     d[4 j + {2, 3}] at (16 w + g + 8, ...): the mma.sync m16n8 C layout per 8 columns;
 *   A m64k16 from registers: the mma.sync m16n8k16 A fragment of rows 16 w .. 16 w + 15. */
#ifndef NT_OPS_WGMMA_CUH
#define NT_OPS_WGMMA_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NT_WGMMA_BUILT 1
#endif

namespace nt_wg {

/* Byte offset of element (r, c) in a swizzled tile of 64-element rows. */
__device__ __forceinline__ uint32_t sw_off(int r, int c) {
  return (uint32_t)(r * 128 + ((((c >> 3) ^ r) & 7) << 4) + (c & 7) * 2);
}

/* Descriptor of a swizzled operand starting at shared address `addr` (see the top comment;
 * `addr` plus the k-slice advance). Bits: start >> 4 at 0, LBO >> 4 at 16 (1: unused),
 * SBO >> 4 at 32, layout 1 (128B swizzle) at 62. */
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
         (uint64_t)1 << 62;
}

__device__ __forceinline__ void fence() {
#ifdef NT_WGMMA_BUILT
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef NT_WGMMA_BUILT
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wait() {
#ifdef NT_WGMMA_BUILT
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Shared-memory writes by ordinary stores (and cp.async) become visible to wgmma's async
 * proxy only after this fence (then a barrier for the other threads' writes). */
__device__ __forceinline__ void fence_smem_to_async() {
#ifdef NT_WGMMA_BUILT
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* The tensor-memory accelerator (TMA) and its shared-memory barriers. mbar_*: a barrier at
 * shared address `bar`; mbar_expect_tx arrives once and adds `bytes` the barrier's phase
 * waits for; mbar_wait returns once the phase of the given parity has completed.
 * tma_load_2d / tma_load_4d: the box of a 2-D / 4-D tensor map at coordinates c0.. into
 * shared `dst`, its bytes counted on `bar`. */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
#ifdef NT_WGMMA_BUILT
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
/* After mbar_init, before the barriers are used (by other threads or by the TMA). */
__device__ __forceinline__ void mbar_init_fence() {
#ifdef NT_WGMMA_BUILT
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
  fence_smem_to_async();
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef NT_WGMMA_BUILT
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef NT_WGMMA_BUILT
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
#endif
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, uint32_t bar, int c0,
                                            int c1) {
#ifdef NT_WGMMA_BUILT
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];\n"
               ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1)
               : "memory");
#endif
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
#ifdef NT_WGMMA_BUILT
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
               ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#endif
}

/* Keeps the compiler from moving accumulator reads or writes across an asynchronous MMA
 * still in flight: the registers are "changed" here as far as it knows. */
template <int R> __device__ __forceinline__ void touch(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <typename T> struct ab;
template <> struct ab<__nv_bfloat16> { static constexpr bool kBf16 = true; };
template <> struct ab<__half> { static constexpr bool kBf16 = false; };

#define NT_WG_R8(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), \
  "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), "+f"(d[b + 7])
#define NT_WG_R16(b) NT_WG_R8(b), NT_WG_R8(b + 8)
#define NT_WG_R32(b) NT_WG_R16(b), NT_WG_R16(b + 16)
#define NT_WG_R64 NT_WG_R32(0), NT_WG_R32(32)

#define NT_WG_L16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define NT_WG_L32 NT_WG_L16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, " \
  "%28, %29, %30, %31"
#define NT_WG_L64 NT_WG_L32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63"

/* Per N: the accumulator list, then the operand numbers after it spelled out (inline asm
 * takes only literal numbers). ss inputs: da, db, accumulate, TA, TB; rs inputs: a0..a3, db,
 * accumulate, TB. P: the scale-d predicate's source; T: the operands after the accumulators. */
#define NT_WG_OUT_32 NT_WG_R16(0)
#define NT_WG_OUT_64 NT_WG_R32(0)
#define NT_WG_OUT_128 NT_WG_R64
#define NT_WG_LIST_32 NT_WG_L16
#define NT_WG_LIST_64 NT_WG_L32
#define NT_WG_LIST_128 NT_WG_L64
#define NT_WG_SSP_32 "%18"
#define NT_WG_SST_32 "%16, %17, p, 1, 1, %19, %20"
#define NT_WG_SSP_64 "%34"
#define NT_WG_SST_64 "%32, %33, p, 1, 1, %35, %36"
#define NT_WG_SSP_128 "%66"
#define NT_WG_SST_128 "%64, %65, p, 1, 1, %67, %68"
#define NT_WG_RSP_32 "%21"
#define NT_WG_RST_32 "{%16, %17, %18, %19}, %20, p, 1, 1, %22"
#define NT_WG_RSP_64 "%37"
#define NT_WG_RST_64 "{%32, %33, %34, %35}, %36, p, 1, 1, %38"
#define NT_WG_RSP_128 "%69"
#define NT_WG_RST_128 "{%64, %65, %66, %67}, %68, p, 1, 1, %70"

#define NT_WG_ASM(N, TYPE, FORM)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " NT_WG_##FORM##P_##N ", 0;\n"              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE               \
               " {" NT_WG_LIST_##N "}, " NT_WG_##FORM##T_##N ";\n}\n"                        \
               : NT_WG_OUT_##N                                                               \
               : NT_WG_##FORM##_IN)
#define NT_WG_SS_IN "l"(da), "l"(db), "r"((int)accumulate), "n"(TA), "n"(TB)
#define NT_WG_RS_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"((int)accumulate), \
  "n"(TB)

/* mma_ss: D (64 x N, fp32) = [D +] A B with A (64 x 16) and B (16 x N) in shared memory;
 * mma_rs: the same with A in registers. accumulate: D += (else D =). TA / TB: A M-major /
 * B N-major (imm-trans). Outside an sm_90a pass the bodies are empty: the kernels that call
 * them are never launched there (nt_wgmma_built). */
template <typename T, int N, int TA, int TB> struct mma_ss;
template <typename T, int N, int TB> struct mma_rs;

#ifdef NT_WGMMA_BUILT
#define NT_WG_DEFINE(N)                                                     \
  template <typename T, int TA, int TB> struct mma_ss<T, N, TA, TB> {                          \
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t da, uint64_t db,    \
                                               bool accumulate) {                              \
      if constexpr (ab<T>::kBf16) NT_WG_ASM(N, "bf16", SS);                                    \
      else NT_WG_ASM(N, "f16", SS);                                                            \
    }                                                                                          \
  };                                                                                           \
  template <typename T, int TB> struct mma_rs<T, N, TB> {                                      \
    static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t (&a)[4],      \
                                               uint64_t db, bool accumulate) {                 \
      if constexpr (ab<T>::kBf16) NT_WG_ASM(N, "bf16", RS);                                    \
      else NT_WG_ASM(N, "f16", RS);                                                            \
    }                                                                                          \
  };
#else
#define NT_WG_DEFINE(N)                                                     \
  template <typename T, int TA, int TB> struct mma_ss<T, N, TA, TB> {                          \
    static __device__ __forceinline__ void run(float (&)[N / 2], uint64_t, uint64_t, bool) {}  \
  };                                                                                           \
  template <typename T, int TB> struct mma_rs<T, N, TB> {                                      \
    static __device__ __forceinline__ void run(float (&)[N / 2], const uint32_t (&)[4],        \
                                               uint64_t, bool) {}                              \
  };
#endif

NT_WG_DEFINE(32)
NT_WG_DEFINE(64)
NT_WG_DEFINE(128)

}  // namespace nt_wg

/* Whether the current device runs this build's wgmma kernels: compute capability 9.0 and an
 * sm_90a pass in the build (ops/wgmma.cu). Cached per device after the first ask, which
 * copies one word from the device; asked first inside a CUDA graph capture it answers false
 * (and does not cache) rather than break the capture. */
bool nt_wgmma_usable(cudaStream_t stream);

#endif
