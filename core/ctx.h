/* nt_ctx: one device and everything tied to it: compute and copy streams, the cuBLASLt handle
 * and workspace, RNG state, the memory pool and the last error. No mutable globals: two
 * contexts in one process do not interfere. */
#ifndef NT_CTX_H
#define NT_CTX_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "core/status.h"
#include "core/tensor.h"
NT_EXTERN_C_BEGIN

typedef struct nt_ctx nt_ctx;

/* Creates a context for `dev`. On failure (no GPU, no driver, CUDA not compiled in) *out is
 * still a valid context that holds the error message (nt_last_error) and must be freed. */
nt_status nt_ctx_create(nt_ctx **out, nt_device dev);
void nt_ctx_free(nt_ctx *ctx);                     /* NULL is a no-op */

nt_device nt_ctx_device(const nt_ctx *ctx);
bool nt_ctx_is_cuda(const nt_ctx *ctx);
/* Number of CUDA devices usable by this process (0 without a GPU or without the backend). */
int nt_cuda_device_count(void);

/* The raw handles, as void* so this header stays plain C (cast to cudaStream_t,
 * cublasLtHandle_t). NULL for a CPU context. */
void *nt_ctx_stream(nt_ctx *ctx);           /* compute stream */
void *nt_ctx_copy_stream(nt_ctx *ctx);      /* host<->device copies (the data loader) */
void *nt_ctx_cublaslt(nt_ctx *ctx);
void *nt_ctx_workspace(nt_ctx *ctx, size_t *bytes);  /* cuBLASLt workspace */
/* The cuBLASLt workspace: the most scratch a GEMM algorithm may use (cuBLASLt's heuristics
 * only offer algorithms that fit, so a smaller one can mean slower kernels for some shapes).
 * Default 32 MiB, cuBLAS's recommendation for Hopper (PyTorch's choice there too), or
 * NT_CUBLASLT_WORKSPACE_MIB (a number >= 0, fractions allowed) at context creation. Setting it
 * releases the old buffer (stream-ordered), allocates the new one and drops the cached GEMM
 * plans, which were chosen for the old size (the next GEMM of each shape plans and autotunes
 * again). Call it outside stream capture and before capturing CUDA graphs: a graph keeps the
 * buffer it was captured with. 0: no workspace. If the allocation fails the context is left
 * with none (and the error). A CPU context has no workspace: a no-op, the size stays 0. */
nt_status nt_ctx_set_workspace_bytes(nt_ctx *ctx, size_t bytes);
size_t nt_ctx_workspace_bytes(const nt_ctx *ctx);
/* Blocks until all work queued on the context's streams has finished. */
nt_status nt_ctx_synchronize(nt_ctx *ctx);

/* Errors. nt_ctx_set_error records a message and returns `st` so it can be returned directly:
 *   if (n < 0) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "batch size %d must be > 0", n);
 * Thread-safe. A NULL ctx is accepted: the message is then printed to stderr. */
nt_status nt_ctx_set_error(nt_ctx *ctx, nt_status st, const char *file, int line,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define NT_ERROR(ctx, st, ...) nt_ctx_set_error((ctx), (st), __FILE__, __LINE__, __VA_ARGS__)
const char *nt_last_error(const nt_ctx *ctx);      /* "" when no error was recorded */
nt_status nt_last_status(const nt_ctx *ctx);
void nt_clear_error(nt_ctx *ctx);

/* RNG: a counter-based Philox4x32-10 stream per context (seed, offset). Ops that draw random
 * numbers (dropout, init) take `n` numbers starting at the current offset and advance it, so
 * CPU and GPU runs from the same seed draw the same numbers. */
void nt_ctx_manual_seed(nt_ctx *ctx, uint64_t seed);
uint64_t nt_ctx_seed(const nt_ctx *ctx);
uint64_t nt_ctx_rng_offset(const nt_ctx *ctx);
void nt_ctx_set_rng_offset(nt_ctx *ctx, uint64_t offset);
/* Reserves n numbers: returns the offset to draw from and advances the context's offset
 * (rounded up to a multiple of 4, Philox's block). */
uint64_t nt_ctx_rng_reserve(nt_ctx *ctx, uint64_t n);

/* TF32 for fp32 GEMMs (the "tf32" precision policy). Off by default. */
void nt_ctx_set_allow_tf32(nt_ctx *ctx, bool allow);
bool nt_ctx_allow_tf32(const nt_ctx *ctx);

/* Logging: level from NT_LOG (error, warn, info, debug; default info), to stderr. */
typedef enum { NT_LOG_ERROR = 0, NT_LOG_WARN, NT_LOG_INFO, NT_LOG_DEBUG } nt_log_level;
void nt_log(nt_ctx *ctx, nt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

NT_EXTERN_C_END
#endif
