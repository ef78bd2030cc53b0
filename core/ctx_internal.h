/* The context's fields, for core/ and for backends. Not part of the public API. */
#ifndef NT_CTX_INTERNAL_H
#define NT_CTX_INTERNAL_H
#include <pthread.h>
#include "core/ctx.h"

struct nt_pool;   /* memory.c */

struct nt_ctx {
  nt_device device;
  pthread_mutex_t err_lock;       /* errors may be recorded from loader threads */
  nt_status last_status;
  char last_error[1024];
  nt_ctx_options opts;            /* fixed at creation */
  uint64_t seed;
  uint64_t rng_offset;             /* absolute; during a step, the step's base */
  /* The per-step RNG base (nt_ctx_rng_step_begin/end). */
  bool rng_in_step;
  uint64_t rng_step_used;          /* numbers reserved in the open step */
  uint64_t *rng_base;              /* device word, or &rng_base_host; NULL before a step */
  uint64_t rng_base_host;
  uint64_t rng_base_queued;        /* the word's value once queued work has run */
  bool rng_base_known;             /* rng_base_queued is valid */
  bool allow_tf32;
  void *stream;                   /* cudaStream_t */
  void *copy_stream;              /* cudaStream_t */
  void *cublaslt;                 /* cublasLtHandle_t */
  void *workspace;                /* cuBLASLt workspace, from the pool */
  size_t workspace_bytes;
  struct nt_pool *pool;
  void *gemm_cache;               /* ops/gemm: cached cuBLASLt plans per shape */
  void (*gemm_cache_free)(nt_ctx *ctx, void *cache);
  void *attn_dq;                  /* ops/attention_dq_pair.c: the backward's dQ accumulators */
  void (*attn_dq_free)(nt_ctx *ctx, void *state);
  /* Called by nt_ctx_capture_end before the capture ends (body_ok: the captured work was
   * queued without error), so the pair can restore its state inside the capture. */
  nt_status (*attn_dq_capture_end)(nt_ctx *ctx, void *state, bool body_ok);
  bool capture_open;              /* nt_ctx_capture_begin's capture is open */
};

NT_EXTERN_C_BEGIN
#ifdef NT_HAVE_CUDA
/* core/rng.cu: one-thread kernels on the compute stream that set / advance the step base. */
nt_status nt_rng_base_set_cuda(nt_ctx *ctx, uint64_t *base, uint64_t value);
nt_status nt_rng_base_add_cuda(nt_ctx *ctx, uint64_t *base, uint64_t n);
#endif

/* Whether ctx's compute stream is being captured into a CUDA graph (false on the CPU). */
nt_status nt_ctx_capturing(nt_ctx *ctx, bool *capturing);
nt_status nt_pool_create(nt_ctx *ctx, struct nt_pool **out);
void nt_pool_destroy(nt_ctx *ctx, struct nt_pool *pool);
NT_EXTERN_C_END

#endif
