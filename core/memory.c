/* The caching allocator (scheme in memory.h). One pool per context, guarded by one mutex: the
 * data loader frees from worker threads.
 *
 * Every piece of a segment is a block; blocks of one segment are linked by address (prev/next)
 * so a freed block merges with free neighbours, and a segment that is one free block again can
 * go back to the system. A free block sits in its pool's size bin; a block in use sits in a
 * hash table keyed by its pointer (nt_free must find it, and must recognise foreign pointers);
 * a block freed while other streams may still use it sits on the pending list with one event
 * per such stream, and becomes free when all have completed.
 *
 * All blocks are owned by the context's compute stream: work on that stream is ordered, so a
 * block it frees can be handed out again at once. */
#include "core/ctx_internal.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUND_BYTES ((size_t)512)
#define SMALL_MAX ((size_t)1 << 20)          /* requests up to this use the small pool */
#define SMALL_SEGMENT ((size_t)2 << 20)
#define MEDIUM_MAX ((size_t)10 << 20)        /* large requests under this share segments */
#define MEDIUM_SEGMENT ((size_t)20 << 20)
#define LARGE_ROUND ((size_t)2 << 20)
#define MAX_REQUEST ((size_t)1 << 60)        /* beyond this, rounding could overflow */
/* Bins: 4 per power of two, from 512 B (2^9) up to 2^63. */
#define NBINS ((64 - 9) * 4)

enum { BLOCK_FREE, BLOCK_USED, BLOCK_PENDING };

typedef struct mblock {
  char *ptr;
  size_t size;
  size_t requested;                 /* the caller's size while in use */
  struct mblock *prev, *next;       /* address-ordered neighbours within the segment */
  struct mblock *lprev, *lnext;     /* bin free list, or the pending list */
  struct mblock *hnext;             /* hash chain while in use */
  void **streams;                   /* other streams recorded on this block */
  int n_streams, cap_streams;
  void **events;                    /* while pending: one event per recorded stream */
  int n_events;
  unsigned char state, small;
} mblock;

typedef struct {
  mblock **slots;
  size_t cap, n;                    /* cap is a power of two (or 0) */
} ptr_table;

struct nt_pool {
  pthread_mutex_t lock;
  mblock *bins[2][NBINS];           /* [small?][bin] free lists */
  ptr_table used;                   /* blocks handed out by nt_alloc */
  ptr_table pinned;                 /* pinned host buffers (size in mblock.size) */
  mblock *pending;
  void **event_cache;               /* completed events, kept for reuse */
  int n_event_cache, cap_event_cache;
  size_t limit;
  nt_mem_stats stats;
};

/* ---- helpers ---------------------------------------------------------------------------- */

static int bin_of(size_t size) {
  int b = 63 - __builtin_clzll((unsigned long long)size);
  int sub = (int)((size >> (b - 2)) & 3);
  int i = (b - 9) * 4 + sub;
  return i < 0 ? 0 : i;
}

static size_t round_request(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + ROUND_BYTES - 1) & ~(ROUND_BYTES - 1);
}

static size_t segment_size(size_t size) {
  if (size <= SMALL_MAX) return SMALL_SEGMENT;
  if (size < MEDIUM_MAX) return MEDIUM_SEGMENT;
  return (size + LARGE_ROUND - 1) & ~(LARGE_ROUND - 1);
}

static size_t hash_ptr(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
  return (size_t)(x ^ (x >> 29)) & (cap - 1);
}

/* Makes room for one more entry (so the insert after it cannot fail). */
static int table_reserve(ptr_table *t) {
  if (t->n < t->cap) return 0;
  size_t cap = t->cap ? t->cap * 2 : 256;
  mblock **slots = calloc(cap, sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < t->cap; i++) {
    for (mblock *b = t->slots[i], *nx; b; b = nx) {
      nx = b->hnext;
      size_t h = hash_ptr(b->ptr, cap);
      b->hnext = slots[h];
      slots[h] = b;
    }
  }
  free(t->slots);
  t->slots = slots;
  t->cap = cap;
  return 0;
}

static void table_insert(ptr_table *t, mblock *b) {
  size_t h = hash_ptr(b->ptr, t->cap);
  b->hnext = t->slots[h];
  t->slots[h] = b;
  t->n++;
}

static mblock *table_remove(ptr_table *t, const void *ptr) {
  if (!t->cap) return NULL;
  for (mblock **pp = &t->slots[hash_ptr(ptr, t->cap)]; *pp; pp = &(*pp)->hnext) {
    mblock *b = *pp;
    if (b->ptr != ptr) continue;
    *pp = b->hnext;
    b->hnext = NULL;
    t->n--;
    return b;
  }
  return NULL;
}

static mblock *table_find(ptr_table *t, const void *ptr) {
  if (!t->cap) return NULL;
  for (mblock *b = t->slots[hash_ptr(ptr, t->cap)]; b; b = b->hnext)
    if (b->ptr == ptr) return b;
  return NULL;
}

static void bin_insert(struct nt_pool *p, mblock *b) {
  mblock **head = &p->bins[b->small][bin_of(b->size)];
  b->state = BLOCK_FREE;
  b->lprev = NULL;
  b->lnext = *head;
  if (*head) (*head)->lprev = b;
  *head = b;
}

static void bin_remove(struct nt_pool *p, mblock *b) {
  if (b->lprev) b->lprev->lnext = b->lnext;
  else p->bins[b->small][bin_of(b->size)] = b->lnext;
  if (b->lnext) b->lnext->lprev = b->lprev;
  b->lprev = b->lnext = NULL;
}

/* Best fit: the smallest free block >= size in the first bin that has one. */
static mblock *find_free(struct nt_pool *p, int small, size_t size) {
  for (int i = bin_of(size); i < NBINS; i++) {
    mblock *best = NULL;
    for (mblock *b = p->bins[small][i]; b; b = b->lnext) {
      if (b->size == size) return b;   /* the common case in a steady state */
      if (b->size > size && (!best || b->size < best->size)) best = b;
    }
    if (best) return best;
  }
  return NULL;
}

static mblock *find_exact(struct nt_pool *p, int small, size_t size) {
  for (mblock *b = p->bins[small][bin_of(size)]; b; b = b->lnext)
    if (b->size == size) return b;
  return NULL;
}

static size_t largest_free(struct nt_pool *p) {
  size_t best = 0;
  for (int s = 0; s < 2; s++)
    for (int i = NBINS - 1; i >= 0; i--) {
      if (!p->bins[s][i]) continue;
      for (mblock *b = p->bins[s][i]; b; b = b->lnext)
        if (b->size > best) best = b->size;
      break;
    }
  return best;
}

static void free_block_struct(mblock *b) {
  free(b->streams);
  free(b->events);
  free(b);
}

/* Returns a block to its bin, merged with free neighbours of its segment. */
static void release_block(struct nt_pool *p, mblock *b) {
  b->n_streams = 0;
  mblock *pr = b->prev, *nx = b->next;
  if (pr && pr->state == BLOCK_FREE) {
    bin_remove(p, pr);
    pr->size += b->size;
    pr->next = nx;
    if (nx) nx->prev = pr;
    free_block_struct(b);
    b = pr;
  }
  nx = b->next;
  if (nx && nx->state == BLOCK_FREE) {
    bin_remove(p, nx);
    b->size += nx->size;
    b->next = nx->next;
    if (nx->next) nx->next->prev = b;
    free_block_struct(nx);
  }
  bin_insert(p, b);
}

/* ---- the system allocator ---------------------------------------------------------------- */

#ifdef NT_HAVE_CUDA
/* The pool may be used from threads whose current device differs (loader workers). */
static int device_enter(nt_ctx *ctx) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) { (void)cudaGetLastError(); prev = -1; }
  if (prev != ctx->device.index) (void)cudaSetDevice(ctx->device.index);
  return prev;
}
static void device_leave(nt_ctx *ctx, int prev) {
  if (prev >= 0 && prev != ctx->device.index) (void)cudaSetDevice(prev);
}
#endif

/* *oom is set (and NT_OK returned) when the memory is simply not there, so the caller can
 * empty the cache and retry; other failures are errors. */
static nt_status system_alloc(nt_ctx *ctx, size_t size, void **out, int *oom) {
  struct nt_pool *p = ctx->pool;
  *out = NULL;
  *oom = 0;
  if (p->limit && p->stats.reserved + size > p->limit) { *oom = 1; return NT_OK; }
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    int prev = device_enter(ctx);
    cudaError_t e = cudaMalloc(out, size);
    device_leave(ctx, prev);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      *out = NULL;
      *oom = 1;
      return NT_OK;
    }
    return NT_CUDA(ctx, e);
  }
#endif
  /* exactly `size` bytes, 512-byte aligned: with mem_cache off that is the request's own size,
   * so ASan sees an access past its end (aligned_alloc would need a multiple of 512) */
  if (posix_memalign(out, ROUND_BYTES, size) != 0) {
    *out = NULL;
    *oom = 1;
  }
  return NT_OK;
}

static void system_free(nt_ctx *ctx, void *ptr) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    int prev = device_enter(ctx);
    cudaError_t e = cudaFree(ptr);
    device_leave(ctx, prev);
    if (e != cudaSuccess)
      nt_log(ctx, NT_LOG_ERROR, "cudaFree(%p) failed: %s", ptr, cudaGetErrorString(e));
    return;
  }
#endif
  (void)ctx;
  free(ptr);
}

/* ---- stream-aware release ---------------------------------------------------------------- */

#ifdef NT_HAVE_CUDA
static void event_put(struct nt_pool *p, void *ev) {
  if (p->n_event_cache == p->cap_event_cache) {
    int cap = p->cap_event_cache ? p->cap_event_cache * 2 : 16;
    void **c = realloc(p->event_cache, (size_t)cap * sizeof *c);
    if (!c) { (void)cudaEventDestroy((cudaEvent_t)ev); return; }
    p->event_cache = c;
    p->cap_event_cache = cap;
  }
  p->event_cache[p->n_event_cache++] = ev;
}

/* Records an event on each stream that used `b`. A stream whose event cannot be recorded is
 * synchronized instead, so the block is never released early. */
static void record_free_events(nt_ctx *ctx, mblock *b) {
  struct nt_pool *p = ctx->pool;
  b->events = malloc((size_t)b->n_streams * sizeof *b->events);
  b->n_events = 0;
  int prev = device_enter(ctx);
  for (int i = 0; i < b->n_streams; i++) {
    cudaEvent_t ev = NULL;
    if (p->n_event_cache) ev = (cudaEvent_t)p->event_cache[--p->n_event_cache];
    else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) ev = NULL;
    if (ev && b->events && cudaEventRecord(ev, (cudaStream_t)b->streams[i]) == cudaSuccess) {
      b->events[b->n_events++] = ev;
      continue;
    }
    (void)cudaGetLastError();
    if (ev) event_put(p, ev);
    nt_log(ctx, NT_LOG_WARN, "nt_free: could not record an event for a block used on another "
           "stream; synchronizing that stream instead");
    (void)cudaStreamSynchronize((cudaStream_t)b->streams[i]);
  }
  device_leave(ctx, prev);
}
#endif

/* Moves pending blocks whose events have all completed to the free lists. `wait` blocks on
 * the events instead of querying them. */
static void process_pending(nt_ctx *ctx, int wait) {
  struct nt_pool *p = ctx->pool;
  for (mblock *b = p->pending, *nx; b; b = nx) {
    nx = b->lnext;
#ifdef NT_HAVE_CUDA
    int done = 1;
    while (b->n_events > 0) {
      cudaEvent_t ev = (cudaEvent_t)b->events[b->n_events - 1];
      cudaError_t e = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
      if (e == cudaErrorNotReady) { (void)cudaGetLastError(); done = 0; break; }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        nt_log(ctx, NT_LOG_ERROR, "memory pool: waiting for a stream event failed (%s); "
               "releasing the block", cudaGetErrorString(e));
      }
      event_put(p, ev);
      b->n_events--;
    }
    if (!done) continue;
#else
    (void)wait;
#endif
    if (b->lprev) b->lprev->lnext = b->lnext;
    else p->pending = b->lnext;
    if (b->lnext) b->lnext->lprev = b->lprev;
    free(b->events);
    b->events = NULL;
    p->stats.pending -= b->size;
    release_block(p, b);
  }
}

/* Gives every segment that is one free block back to the system. */
static void release_cached(nt_ctx *ctx) {
  struct nt_pool *p = ctx->pool;
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < NBINS; i++)
      for (mblock *b = p->bins[s][i], *nx; b; b = nx) {
        nx = b->lnext;
        if (b->prev || b->next) continue;
        bin_remove(p, b);
        system_free(ctx, b->ptr);
        p->stats.reserved -= b->size;
        free_block_struct(b);
      }
}

/* Before emptying the cache: all work that may still use freed blocks must be done. */
static void synchronize_for_release(nt_ctx *ctx) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    int prev = device_enter(ctx);
    (void)cudaStreamSynchronize(nt_cuda_stream(ctx));
    device_leave(ctx, prev);
  }
#endif
  process_pending(ctx, 1);
}

/* ---- pool lifetime ----------------------------------------------------------------------- */

nt_status nt_pool_create(nt_ctx *ctx, struct nt_pool **out) {
  struct nt_pool *p = calloc(1, sizeof *p);
  if (!p) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the memory pool");
  pthread_mutex_init(&p->lock, NULL);
  *out = p;
  return NT_OK;
}

static void destroy_block(nt_ctx *ctx, mblock *b) {
  if (!b->prev) system_free(ctx, b->ptr);   /* the first block holds the segment's pointer */
  free_block_struct(b);
}

static void pinned_system_free(nt_ctx *ctx, void *ptr);

/* ctx->pool must be `p`. Everything goes back to the system, leaked blocks included. */
void nt_pool_destroy(nt_ctx *ctx, struct nt_pool *p) {
  if (!p) return;
  synchronize_for_release(ctx);
  if (p->used.n)
    nt_log(ctx, NT_LOG_WARN, "memory pool destroyed with %zu blocks (%zu bytes) still allocated",
           p->used.n, p->stats.allocated);
  if (p->pinned.n)
    nt_log(ctx, NT_LOG_WARN, "memory pool destroyed with %zu pinned buffers (%zu bytes) not "
           "freed", p->pinned.n, p->stats.pinned);
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < NBINS; i++)
      for (mblock *b = p->bins[s][i], *nx; b; b = nx) { nx = b->lnext; destroy_block(ctx, b); }
  for (size_t i = 0; i < p->used.cap; i++)
    for (mblock *b = p->used.slots[i], *nx; b; b = nx) { nx = b->hnext; destroy_block(ctx, b); }
  for (size_t i = 0; i < p->pinned.cap; i++)
    for (mblock *b = p->pinned.slots[i], *nx; b; b = nx) {
      nx = b->hnext;
      pinned_system_free(ctx, b->ptr);
      free(b);
    }
  free(p->used.slots);
  free(p->pinned.slots);
#ifdef NT_HAVE_CUDA
  for (int i = 0; i < p->n_event_cache; i++) (void)cudaEventDestroy((cudaEvent_t)p->event_cache[i]);
#endif
  free(p->event_cache);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

/* ---- allocation -------------------------------------------------------------------------- */

static nt_status oom_error(nt_ctx *ctx, size_t bytes, int flushed) {
  struct nt_pool *p = ctx->pool;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char device_info[160] = "";
#ifdef NT_HAVE_CUDA
  size_t dev_free = 0, dev_total = 0;
  if (nt_ctx_is_cuda(ctx)) {
    int prev = device_enter(ctx);
    if (cudaMemGetInfo(&dev_free, &dev_total) == cudaSuccess)
      snprintf(device_info, sizeof device_info, "; cuda:%d has %.2f GiB free of %.2f GiB",
               ctx->device.index, (double)dev_free / gib, (double)dev_total / gib);
    (void)cudaGetLastError();
    device_leave(ctx, prev);
  }
#endif
  char limit_info[96] = "";
  if (p->limit)
    snprintf(limit_info, sizeof limit_info, " (pool limit %zu bytes)", p->limit);
  return NT_ERROR(ctx, NT_ERR_OOM,
                  "out of %s memory: requested %zu bytes (%.2f GiB); this context's pool has "
                  "%zu bytes (%.2f GiB) allocated and %zu bytes (%.2f GiB) reserved%s%s%s; reduce "
                  "the batch size or free tensors",
                  nt_ctx_is_cuda(ctx) ? "device" : "host", bytes, (double)bytes / gib,
                  p->stats.allocated, (double)p->stats.allocated / gib, p->stats.reserved,
                  (double)p->stats.reserved / gib, limit_info, device_info,
                  flushed ? ", after emptying its cache" : "");
}

/* A new segment for `size` bytes, as one free block in its bin; NULL with an error set. */
static mblock *new_segment(nt_ctx *ctx, size_t size, int small, size_t bytes, nt_status *st) {
  struct nt_pool *p = ctx->pool;
  size_t seg = ctx->opts.mem_cache ? segment_size(size) : size;
  /* A cudaMalloc inside a capture invalidates it, and the error would surface later at some
   * unrelated launch: say so here instead. */
  bool capturing = false;
  if ((*st = nt_ctx_capturing(ctx, &capturing))) return NULL;
  if (capturing) {
    *st = NT_ERROR(ctx, NT_ERR_STATE,
                   "device memory: a request of %zu bytes needs a new cudaMalloc while the "
                   "compute stream is being captured into a CUDA graph (that would invalidate "
                   "the capture); run the captured work once eagerly first so the pool holds "
                   "its memory%s", bytes,
                   ctx->opts.mem_cache ? "" : " (with mem_cache off, a freed block serves only "
                   "a request of its exact size, once its stream work is done: capture with "
                   "mem_cache on)");
    return NULL;
  }
  mblock *b = calloc(1, sizeof *b);
  if (!b) { *st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a pool block"); return NULL; }
  void *mem = NULL;
  int oom = 0;
  *st = system_alloc(ctx, seg, &mem, &oom);
  if (!*st && oom) {
    /* Out of memory: wait for held-back blocks (one may fit now), then give every cached
     * segment back and retry once. */
    free(b);
    p->stats.n_cache_flushes++;
    synchronize_for_release(ctx);
    mblock *cached = ctx->opts.mem_cache ? find_free(p, small, size) : find_exact(p, small, size);
    if (cached) return cached;
    release_cached(ctx);
    if (!(b = calloc(1, sizeof *b))) {
      *st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a pool block");
      return NULL;
    }
    *st = system_alloc(ctx, seg, &mem, &oom);
    size_t tight = (size + LARGE_ROUND - 1) & ~(LARGE_ROUND - 1);
    if (!*st && oom && tight < seg) {   /* a shared 20 MiB segment may not fit; this may */
      seg = tight;
      *st = system_alloc(ctx, seg, &mem, &oom);
    }
    if (!*st && oom) *st = oom_error(ctx, bytes, 1);
  }
  if (*st) { free(b); return NULL; }
  b->ptr = mem;
  b->size = seg;
  b->small = (unsigned char)small;
  p->stats.reserved += seg;
  p->stats.n_system_allocs++;
  if (p->stats.reserved > p->stats.peak_reserved) p->stats.peak_reserved = p->stats.reserved;
  bin_insert(p, b);
  return b;
}

static nt_status alloc_locked(nt_ctx *ctx, size_t bytes, void **ptr) {
  struct nt_pool *p = ctx->pool;
  if (bytes > MAX_REQUEST) return oom_error(ctx, bytes, 0);
  if (table_reserve(&p->used))
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the pool's block table");
  if (p->pending) process_pending(ctx, 0);
  /* mem_cache off: exact sizes, each its own segment, reused only by an equal request */
  bool exact = !ctx->opts.mem_cache;
  size_t size = exact ? (bytes ? bytes : 1) : round_request(bytes);
  int small = size <= SMALL_MAX;
  mblock *b = exact ? find_exact(p, small, size) : find_free(p, small, size);
  nt_status st = NT_OK;
  if (!b && !(b = new_segment(ctx, size, small, bytes, &st))) return st;
  bin_remove(p, b);
  size_t rest = b->size - size;
  if (rest >= ROUND_BYTES && (small || rest > SMALL_MAX)) {
    mblock *r = calloc(1, sizeof *r);
    if (r) {  /* without it the block is simply handed out whole */
      r->ptr = b->ptr + size;
      r->size = rest;
      r->small = b->small;
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = size;
      bin_insert(p, r);
    }
  }
  b->state = BLOCK_USED;
  b->requested = bytes;
  table_insert(&p->used, b);
  p->stats.allocated += b->size;
  p->stats.requested += bytes;
  p->stats.n_allocs++;
  if (p->stats.allocated > p->stats.peak_allocated) p->stats.peak_allocated = p->stats.allocated;
  *ptr = b->ptr;
  return NT_OK;
}

nt_status nt_alloc(nt_ctx *ctx, size_t bytes, void **ptr) {
  *ptr = NULL;
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  nt_status st = alloc_locked(ctx, bytes, ptr);
  pthread_mutex_unlock(&p->lock);
  return st;
}

void nt_free(nt_ctx *ctx, void *ptr) {
  if (!ptr) return;
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  mblock *b = table_remove(&p->used, ptr);
  if (!b) {
    p->stats.n_invalid_frees++;
    pthread_mutex_unlock(&p->lock);
    nt_log(ctx, NT_LOG_ERROR, "nt_free(%p): not a block allocated from this context's pool "
           "(a double free, a foreign pointer, or a pointer into a block); ignored", ptr);
    return;
  }
  p->stats.allocated -= b->size;
  p->stats.requested -= b->requested;
  p->stats.n_frees++;
  b->requested = 0;
  if (b->n_streams == 0) {
    release_block(p, b);
  } else {
#ifdef NT_HAVE_CUDA
    if (nt_ctx_is_cuda(ctx)) record_free_events(ctx, b);
#endif
    b->state = BLOCK_PENDING;
    b->lprev = NULL;
    b->lnext = p->pending;
    if (p->pending) p->pending->lprev = b;
    p->pending = b;
    p->stats.pending += b->size;
  }
  pthread_mutex_unlock(&p->lock);
}

nt_status nt_alloc_record_stream(nt_ctx *ctx, void *ptr, void *stream) {
  struct nt_pool *p = ctx->pool;
  nt_status st = NT_OK;
  pthread_mutex_lock(&p->lock);
  mblock *b = table_find(&p->used, ptr);
  if (!b) {
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "nt_alloc_record_stream: %p is not a block "
                  "allocated (and not yet freed) from this context's pool", ptr);
    goto done;
  }
  if (!stream || stream == ctx->stream) goto done;   /* the owning stream orders itself */
  for (int i = 0; i < b->n_streams; i++)
    if (b->streams[i] == stream) goto done;
  if (b->n_streams == b->cap_streams) {
    int cap = b->cap_streams ? b->cap_streams * 2 : 2;
    void **s = realloc(b->streams, (size_t)cap * sizeof *s);
    if (!s) {
      st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory recording a stream on a block");
      goto done;
    }
    b->streams = s;
    b->cap_streams = cap;
  }
  b->streams[b->n_streams++] = stream;
done:
  pthread_mutex_unlock(&p->lock);
  return st;
}

/* ---- statistics and control -------------------------------------------------------------- */

void nt_mem_get_stats(nt_ctx *ctx, nt_mem_stats *out) {
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  *out = p->stats;
  size_t largest = largest_free(p);
  out->fragmentation = p->stats.reserved
      ? (double)(p->stats.reserved - p->stats.allocated - largest) / (double)p->stats.reserved
      : 0.0;
  pthread_mutex_unlock(&p->lock);
}

void nt_mem_reset_peak(nt_ctx *ctx) {
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  p->stats.peak_allocated = p->stats.allocated;
  p->stats.peak_reserved = p->stats.reserved;
  pthread_mutex_unlock(&p->lock);
}

nt_status nt_mem_empty_cache(nt_ctx *ctx) {
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  synchronize_for_release(ctx);
  release_cached(ctx);
  pthread_mutex_unlock(&p->lock);
  return NT_OK;
}

void nt_mem_set_limit(nt_ctx *ctx, size_t max_bytes) {
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  p->limit = max_bytes;
  pthread_mutex_unlock(&p->lock);
}

const char *nt_mem_describe(nt_ctx *ctx, char *buf, size_t len) {
  nt_mem_stats s;
  nt_mem_get_stats(ctx, &s);
  const double mib = 1024.0 * 1024.0;
  snprintf(buf, len, "allocated %.1f MiB, reserved %.1f MiB, peak allocated %.1f MiB, peak "
           "reserved %.1f MiB, fragmentation %.1f%%, %llu allocs (%llu from the system)",
           (double)s.allocated / mib, (double)s.reserved / mib, (double)s.peak_allocated / mib,
           (double)s.peak_reserved / mib, 100.0 * s.fragmentation,
           (unsigned long long)s.n_allocs, (unsigned long long)s.n_system_allocs);
  return buf;
}

/* ---- pinned host memory ------------------------------------------------------------------ */

static void pinned_system_free(nt_ctx *ctx, void *ptr) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess)
      nt_log(ctx, NT_LOG_ERROR, "cudaFreeHost(%p) failed: %s", ptr, cudaGetErrorString(e));
    return;
  }
#endif
  (void)ctx;
  free(ptr);
}

nt_status nt_pinned_alloc(nt_ctx *ctx, size_t bytes, void **ptr) {
  struct nt_pool *p = ctx->pool;
  *ptr = NULL;
  size_t size = round_request(bytes);
  mblock *b = calloc(1, sizeof *b);
  if (!b) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a pinned buffer record");
  nt_status st = NT_OK;
  void *mem = NULL;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    int prev = device_enter(ctx);
    cudaError_t e = cudaHostAlloc(&mem, size, cudaHostAllocPortable);
    device_leave(ctx, prev);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      st = NT_ERROR(ctx, NT_ERR_OOM, "out of page-locked host memory: requested %zu bytes "
                    "(%zu bytes pinned already by this context)", bytes, p->stats.pinned);
    } else {
      st = NT_CUDA(ctx, e);
    }
  } else
#endif
  {
    mem = aligned_alloc(ROUND_BYTES, size);
    if (!mem) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory: requested %zu bytes", bytes);
  }
  if (st) { free(b); return st; }
  b->ptr = mem;
  b->size = size;
  pthread_mutex_lock(&p->lock);
  int full = table_reserve(&p->pinned);
  if (!full) {
    table_insert(&p->pinned, b);
    p->stats.pinned += size;
  }
  pthread_mutex_unlock(&p->lock);
  if (full) {
    free(b);
    pinned_system_free(ctx, mem);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the pinned buffer table");
  }
  *ptr = mem;
  return NT_OK;
}

void nt_pinned_free(nt_ctx *ctx, void *ptr) {
  if (!ptr) return;
  struct nt_pool *p = ctx->pool;
  pthread_mutex_lock(&p->lock);
  mblock *b = table_remove(&p->pinned, ptr);
  if (b) p->stats.pinned -= b->size;
  pthread_mutex_unlock(&p->lock);
  if (!b) {
    nt_log(ctx, NT_LOG_ERROR, "nt_pinned_free(%p): not a buffer from nt_pinned_alloc on this "
           "context (or freed already); ignored", ptr);
    return;
  }
  free(b);
  pinned_system_free(ctx, ptr);
}
