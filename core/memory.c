/* Placeholder pool: direct allocation with statistics. To be replaced by the caching
 * allocator (size-binned free lists, stream-aware reuse). */
#include "core/ctx_internal.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdlib.h>
#include <string.h>

typedef struct { void *ptr; size_t size; } block;

struct nt_pool {
  pthread_mutex_t lock;
  block *blocks;
  size_t n, cap;
  nt_mem_stats stats;
};

nt_status nt_pool_create(nt_ctx *ctx, struct nt_pool **out) {
  struct nt_pool *p = calloc(1, sizeof *p);
  if (!p) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the memory pool");
  pthread_mutex_init(&p->lock, NULL);
  *out = p;
  return NT_OK;
}

static void system_free(nt_ctx *ctx, void *ptr) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) { (void)cudaFree(ptr); return; }
#endif
  (void)ctx;
  free(ptr);
}

void nt_pool_destroy(nt_ctx *ctx, struct nt_pool *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) system_free(ctx, p->blocks[i].ptr);
  free(p->blocks);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

nt_status nt_alloc(nt_ctx *ctx, size_t bytes, void **ptr) {
  struct nt_pool *p = ctx->pool;
  size_t size = (bytes + 255) & ~(size_t)255;
  void *m = NULL;
  *ptr = NULL;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    nt_status st = NT_CUDA(ctx, cudaMalloc(&m, size));
    if (st) return st;
  } else
#endif
  {
    m = aligned_alloc(256, size ? size : 256);
    if (!m) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory allocating %zu bytes", bytes);
  }
  pthread_mutex_lock(&p->lock);
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    block *nb = realloc(p->blocks, cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&p->lock);
      system_free(ctx, m);
      return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the pool's block table");
    }
    p->blocks = nb;
    p->cap = cap;
  }
  p->blocks[p->n++] = (block){m, size};
  p->stats.allocated += size;
  p->stats.reserved += size;
  p->stats.requested += bytes;
  p->stats.n_allocs++;
  p->stats.n_system_allocs++;
  if (p->stats.allocated > p->stats.peak_allocated) p->stats.peak_allocated = p->stats.allocated;
  if (p->stats.reserved > p->stats.peak_reserved) p->stats.peak_reserved = p->stats.reserved;
  pthread_mutex_unlock(&p->lock);
  *ptr = m;
  return NT_OK;
}

void nt_free(nt_ctx *ctx, void *ptr) {
  if (!ptr) return;
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < p->n; i++) {
    if (p->blocks[i].ptr != ptr) continue;
    p->stats.allocated -= p->blocks[i].size;
    p->stats.reserved -= p->blocks[i].size;
    p->stats.n_frees++;
    p->blocks[i] = p->blocks[--p->n];
    break;
  }
  pthread_mutex_unlock(&p->lock);
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) (void)cudaStreamSynchronize(nt_cuda_stream(ctx));
#endif
  system_free(ctx, ptr);
}

nt_status nt_alloc_record_stream(nt_ctx *ctx, void *ptr, void *stream) {
  (void)ctx; (void)ptr; (void)stream;
  return NT_OK;
}

void nt_mem_get_stats(nt_ctx *ctx, nt_mem_stats *out) {
  pthread_mutex_lock(&ctx->pool->lock);
  *out = ctx->pool->stats;
  pthread_mutex_unlock(&ctx->pool->lock);
}

void nt_mem_reset_peak(nt_ctx *ctx) {
  pthread_mutex_lock(&ctx->pool->lock);
  ctx->pool->stats.peak_allocated = ctx->pool->stats.allocated;
  ctx->pool->stats.peak_reserved = ctx->pool->stats.reserved;
  pthread_mutex_unlock(&ctx->pool->lock);
}

nt_status nt_mem_empty_cache(nt_ctx *ctx) { (void)ctx; return NT_OK; }

nt_status nt_pinned_alloc(nt_ctx *ctx, size_t bytes, void **ptr) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return NT_CUDA(ctx, cudaMallocHost(ptr, bytes ? bytes : 1));
#endif
  *ptr = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
  return *ptr ? NT_OK : NT_ERROR(ctx, NT_ERR_OOM, "out of host memory (%zu bytes pinned)", bytes);
}

void nt_pinned_free(nt_ctx *ctx, void *ptr) {
  if (!ptr) return;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) { (void)cudaFreeHost(ptr); return; }
#endif
  (void)ctx;
  free(ptr);
}
