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
  nt_log_level log_level;
  uint64_t seed;
  uint64_t rng_offset;
  bool allow_tf32;
  void *stream;                   /* cudaStream_t */
  void *copy_stream;              /* cudaStream_t */
  void *cublaslt;                 /* cublasLtHandle_t */
  void *workspace;                /* cuBLASLt workspace, from the pool */
  size_t workspace_bytes;
  struct nt_pool *pool;
  void *gemm_cache;               /* ops/gemm: cached cuBLASLt plans per shape */
  void (*gemm_cache_free)(nt_ctx *ctx, void *cache);
};

nt_status nt_pool_create(nt_ctx *ctx, struct nt_pool **out);
void nt_pool_destroy(nt_ctx *ctx, struct nt_pool *pool);

#endif
