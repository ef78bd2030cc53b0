/* Memory: a caching allocator per context (device memory for CUDA contexts, aligned host
 * memory for CPU contexts) and pinned host buffers. */
#ifndef NT_MEMORY_H
#define NT_MEMORY_H
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

typedef struct nt_ctx nt_ctx;

typedef struct {
  size_t allocated;        /* bytes handed out and not yet freed (block sizes) */
  size_t reserved;         /* bytes obtained from the system (cudaMalloc) and kept */
  size_t peak_allocated;   /* high-water mark of `allocated` since the last reset */
  size_t peak_reserved;
  size_t requested;        /* bytes the callers asked for (before rounding) */
  double fragmentation;    /* (reserved - largest free block - allocated) / reserved, 0..1 */
  uint64_t n_allocs;       /* nt_alloc calls */
  uint64_t n_system_allocs;/* calls that went to the system allocator (cache misses) */
  uint64_t n_frees;
} nt_mem_stats;

/* Allocation is 256-byte aligned. For a CUDA context the block is usable on the context's
 * compute stream; freeing returns it to the cache at once (stream-ordered reuse). */
nt_status nt_alloc(nt_ctx *ctx, size_t bytes, void **ptr);
void nt_free(nt_ctx *ctx, void *ptr);                        /* NULL is a no-op */
/* Marks a block as used by another stream: it is not reused until the work that stream has
 * queued by the time of nt_free has completed. */
nt_status nt_alloc_record_stream(nt_ctx *ctx, void *ptr, void *stream);
void nt_mem_get_stats(nt_ctx *ctx, nt_mem_stats *out);
void nt_mem_reset_peak(nt_ctx *ctx);
/* Returns cached free blocks to the system. */
nt_status nt_mem_empty_cache(nt_ctx *ctx);

/* Page-locked host memory (plain aligned host memory for a CPU context). */
nt_status nt_pinned_alloc(nt_ctx *ctx, size_t bytes, void **ptr);
void nt_pinned_free(nt_ctx *ctx, void *ptr);                 /* NULL is a no-op */

NT_EXTERN_C_END
#endif
