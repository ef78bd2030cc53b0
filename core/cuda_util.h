/* Helpers for code that calls the CUDA runtime (C or CUDA C). Not part of the public API. */
#ifndef NT_CUDA_UTIL_H
#define NT_CUDA_UTIL_H
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "core/ctx.h"
NT_EXTERN_C_BEGIN

/* Turns a cudaError_t into a status, recording "<expr> failed: <cuda message> at file:line". */
nt_status nt_cuda_check(nt_ctx *ctx, int err, const char *expr, const char *file, int line);
#define NT_CUDA(ctx, call) nt_cuda_check((ctx), (int)(call), #call, __FILE__, __LINE__)
/* After a kernel launch: catches bad launch configurations. */
#define NT_CUDA_LAUNCHED(ctx) \
  nt_cuda_check((ctx), (int)cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static inline cudaStream_t nt_cuda_stream(nt_ctx *ctx) { return (cudaStream_t)nt_ctx_stream(ctx); }

/* Blocks of 256 threads for a grid-stride loop over n items: one block per 256 items, at least
 * 1, at most 65535 * 8 (the loop strides over the rest). */
static inline unsigned nt_grid_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

/* Makes the context's device current for the calling thread. */
nt_status nt_cuda_set_device(nt_ctx *ctx);

NT_EXTERN_C_END
#endif
#endif
