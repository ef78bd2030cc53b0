/* Programmatic dependent launch (Hopper): a kernel launched with pdl_launch may be scheduled
 * while the kernel before it in the stream is still finishing, so its launch and its blocks'
 * start overlap the other's last wave instead of following its completion. Such a kernel calls
 * pdl_wait() in every block before it touches global memory (the wait returns once the grids
 * before it have completed and their writes are visible), and may call pdl_trigger() to let the
 * kernel after it be scheduled before it completes itself. Both are no-ops below sm_90 and in
 * a kernel launched the ordinary way. Callers pass the context's option pdl (core/ctx.h):
 * false launches every kernel the ordinary way.
 * Attention forward+backward on the H200, 10 queued calls: 0.3798 against 0.3852 ms at
 * (16, 12, 1024, 64), 0.1124 against 0.1175 ms at (64, 6, 256, 64). Since session 17 the
 * LayerNorm register kernels and their finalize, dropout and the column sums launch this way
 * too (nt_pdl_on, ops/memops_cuda.cuh): shakespeare_char's step, option on against off in one
 * call, 3.76M against 3.65M tokens/s (bench/RESULTS.md, session 17). */
#ifndef NT_OPS_PDL_CUH
#define NT_OPS_PDL_CUH
#include <utility>
#include <cuda_runtime.h>

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, s>>>(args...), with the programmatic-serialisation attribute
 * when `allowed` (the caller knows the device is sm_90 or newer and the option is on). */
template <typename... KArgs, typename... Args>
cudaError_t pdl_launch(bool allowed, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t s, Args &&...args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = allowed ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

#endif
