/* Does a kernel launched with programmatic dependent launch (PDL) see the data of a
 * cudaMemcpyAsync issued just before it in the same stream? The embedding forward kernel, the
 * first kernel of a GPT step, follows the copies of the step's tokens and targets; with PDL it
 * broke gpu_test_train's fp32 losses (README.md). Each round: a kernel writes round r into a
 * source buffer, one or two copies move it, then a checker kernel (PDL or not, eager or inside a
 * graph launched after the copies) waits with griddepcontrol.wait and counts elements of the
 * first copy's destination that are not r.
 *   nvcc -O2 -arch=sm_90a -o memcpy_pdl memcpy_pdl.cu && ./memcpy_pdl */
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void fill(int *p, long n, int v) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) p[i] = v;
}
__global__ void check(const int *p, long n, int v, unsigned long long *bad) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  unsigned long long b = 0;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) b += p[i] != v;
  if (b) atomicAdd(bad, b);
}

static cudaError_t launch_check(bool pdl, cudaStream_t s, const int *p, long n, int v,
                                unsigned long long *bad) {
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(528);
  c.blockDim = dim3(256);
  c.stream = s;
  c.attrs = a;
  c.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&c, check, p, n, v, bad);
}

int main() {
  const long n = 16 << 20; /* 64 MiB of ints: a copy that takes tens of microseconds */
  int *src, *dst, *dst2, *hsrc;
  unsigned long long *bad, hbad;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&src, n * 4));
  CK(cudaMalloc(&dst, n * 4));
  CK(cudaMalloc(&dst2, n * 4));
  CK(cudaMallocHost(&hsrc, n * 4));
  CK(cudaMalloc(&bad, 8));
  const char *names[] = {"D2D copy", "D2D copy + second copy", "H2D copy (pinned)"};
  for (int graph = 0; graph < 2; graph++)
    for (int pdl = 0; pdl < 2; pdl++)
      for (int kind = 0; kind < 3; kind++) {
        CK(cudaMemsetAsync(bad, 0, 8, s));
        const int rounds = 200;
        for (int r = 1; r <= rounds; r++) {
          int v = r + 1000 * (kind + 3 * (pdl + 2 * graph));
          if (kind == 2) {
            CK(cudaStreamSynchronize(s));
            for (long i = 0; i < n; i++) hsrc[i] = v;
            CK(cudaMemcpyAsync(dst, hsrc, n * 4, cudaMemcpyHostToDevice, s));
          } else {
            fill<<<528, 256, 0, s>>>(src, n, v);
            CK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, s));
            if (kind == 1) CK(cudaMemcpyAsync(dst2, src, n * 4, cudaMemcpyDeviceToDevice, s));
          }
          if (graph) {
            cudaStream_t cs;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
            CK(launch_check(pdl, cs, dst, n, v, bad));
            CK(cudaStreamEndCapture(cs, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            CK(cudaStreamDestroy(cs));
          } else {
            CK(launch_check(pdl, s, dst, n, v, bad));
          }
        }
        CK(cudaMemcpyAsync(&hbad, bad, 8, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        printf("%s, checker %s%s: %llu stale elements over %d rounds\n", names[kind],
               pdl ? "with PDL" : "without PDL", graph ? " in a graph" : "", hbad, rounds);
      }
  return 0;
}
