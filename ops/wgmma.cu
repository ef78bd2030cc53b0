/* nt_wgmma_usable (ops/wgmma.cuh): whether the wgmma kernels can run on the current device. */
#include <atomic>
#include "ops/wgmma.cuh"

namespace {

#ifdef NT_WGMMA_BUILT
__device__ int wgmma_built = 1;
#else
__device__ int wgmma_built = 0;
#endif

constexpr int kMaxDevices = 64;
std::atomic<int> known[kMaxDevices];   /* 0 unknown, 1 usable, 2 not */

}  // namespace

bool nt_wgmma_usable(cudaStream_t stream) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  const int k = known[dev].load(std::memory_order_relaxed);
  if (k) return k == 1;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
    return false;
  int major = 0, minor = 0, built = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                cudaSuccess &&
            major == 9 && minor == 0;
  /* The symbol exists only in cubins built for this device: a failed copy means no sm_90a
   * pass (the runtime's error is cleared so it does not surface at the next launch). */
  if (ok && cudaMemcpyFromSymbol(&built, wgmma_built, sizeof built) != cudaSuccess) {
    (void)cudaGetLastError();
    built = 0;
  }
  ok = ok && built == 1;
  known[dev].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}
