/* Memory: a caching allocator per context (device memory for CUDA contexts, aligned host
 * memory for CPU contexts, through the same cache logic) and pinned host buffers.
 *
 * Sizes: a request is rounded up to a multiple of 512 bytes. Requests up to 1 MiB come from
 * 2 MiB segments (the small pool); larger ones from the large pool, whose segments are 20 MiB
 * for requests under 10 MiB and the request rounded up to 2 MiB otherwise. A cached block is
 * reused best-fit (smallest free block that fits, from size-binned free lists) and split;
 * freed neighbours in a segment merge again, so a repeated alloc/free pattern reaches a steady
 * state with no system allocation. A large-pool block is split only when more than 1 MiB
 * would remain (the slack otherwise stays with the block and counts as allocated). */
#ifndef NT_MEMORY_H
#define NT_MEMORY_H
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

typedef struct nt_ctx nt_ctx;

typedef struct {
  size_t allocated;        /* bytes in blocks handed out and not yet freed (rounded sizes) */
  size_t reserved;         /* bytes obtained from the system (cudaMalloc) and kept */
  size_t peak_allocated;   /* high-water mark of `allocated` since the last reset */
  size_t peak_reserved;
  size_t requested;        /* bytes the callers asked for, of the blocks now allocated */
  double fragmentation;    /* (reserved - largest free block - allocated) / reserved, 0..1 */
  uint64_t n_allocs;       /* successful nt_alloc calls */
  uint64_t n_system_allocs;/* calls that went to the system allocator (cache misses) */
  uint64_t n_frees;        /* nt_free calls on blocks of this pool */
  /* Added fields: */
  size_t pending;          /* freed bytes held back until another stream's work completes */
  size_t pinned;           /* bytes of pinned host buffers now allocated */
  uint64_t n_cache_flushes;/* allocation failures that emptied the cache and retried */
  uint64_t n_invalid_frees;/* nt_free of pointers not from this pool (logged, ignored) */
} nt_mem_stats;

/* Allocation is 512-byte aligned. For a CUDA context the block is usable on the context's
 * compute stream; freeing returns it to the cache at once (stream-ordered reuse). Out of
 * memory: the cache is emptied and the allocation retried once, then NT_ERR_OOM with a message
 * giving the requested, allocated and reserved bytes. Thread-safe. */
nt_status nt_alloc(nt_ctx *ctx, size_t bytes, void **ptr);
/* NULL is a no-op. A pointer this pool did not hand out (or a double free) is reported
 * through nt_log as an error and ignored. */
void nt_free(nt_ctx *ctx, void *ptr);
/* Marks a block as used by another stream: it is not reused until the work that stream has
 * queued by the time of nt_free has completed (an event recorded at free time, queried at
 * alloc time). `ptr` must be a pointer returned by nt_alloc. On a CPU context any non-NULL
 * value names a stream and the block is released at the next allocation. */
nt_status nt_alloc_record_stream(nt_ctx *ctx, void *ptr, void *stream);
void nt_mem_get_stats(nt_ctx *ctx, nt_mem_stats *out);
void nt_mem_reset_peak(nt_ctx *ctx);
/* Returns cached free segments to the system (after synchronizing the compute stream). */
nt_status nt_mem_empty_cache(nt_ctx *ctx);
/* Caps `reserved` at max_bytes (0: no cap); a request that would exceed it fails as out of
 * memory after emptying the cache. Like a memory fraction, for sharing a GPU and for tests. */
void nt_mem_set_limit(nt_ctx *ctx, size_t max_bytes);
/* One line: "allocated 1.2 GiB, reserved 2.0 GiB, peak 1.5 GiB, ..." into buf. */
const char *nt_mem_describe(nt_ctx *ctx, char *buf, size_t len);

/* Page-locked host memory (plain aligned host memory for a CPU context). */
nt_status nt_pinned_alloc(nt_ctx *ctx, size_t bytes, void **ptr);
void nt_pinned_free(nt_ctx *ctx, void *ptr);                 /* NULL is a no-op */

NT_EXTERN_C_END
#endif
