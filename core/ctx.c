#include "core/ctx_internal.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NT_HAVE_CUDA
#include <cublasLt.h>
#endif

/* cuBLASLt workspace: 32 MiB, cuBLAS's recommendation for Hopper (it covers the heuristics'
 * largest choices there), unless NT_CUBLASLT_WORKSPACE_MIB asks for another size. */
#define NT_WORKSPACE_BYTES ((size_t)32 << 20)
#define NT_WORKSPACE_MAX_MIB 4096.0

static nt_status workspace_from_env(nt_ctx *ctx, size_t *bytes) {
  *bytes = NT_WORKSPACE_BYTES;
  const char *s = getenv("NT_CUBLASLT_WORKSPACE_MIB");
  if (!s || !*s) return NT_OK;
  char *end = NULL;
  const double mib = strtod(s, &end);
  if (end == s || *end || !(mib >= 0.0 && mib <= NT_WORKSPACE_MAX_MIB))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "NT_CUBLASLT_WORKSPACE_MIB=\"%s\": expected a size in MiB from 0 to %.0f", s,
                    NT_WORKSPACE_MAX_MIB);
  *bytes = (size_t)(mib * 1048576.0 + 0.5);
  return NT_OK;
}

static nt_log_level log_level_from_env(void) {
  const char *s = getenv("NT_LOG");
  if (!s) return NT_LOG_INFO;
  if (!strcmp(s, "error")) return NT_LOG_ERROR;
  if (!strcmp(s, "warn")) return NT_LOG_WARN;
  if (!strcmp(s, "debug")) return NT_LOG_DEBUG;
  return NT_LOG_INFO;
}

int nt_cuda_device_count(void) {
#ifdef NT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  /* clear the sticky "no device" error */
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

#ifdef NT_HAVE_CUDA
nt_status nt_cuda_check(nt_ctx *ctx, int err, const char *expr, const char *file, int line) {
  if (err == cudaSuccess) return NT_OK;
  cudaError_t e = (cudaError_t)err;
  nt_status st = NT_ERR_CUDA;
  if (e == cudaErrorMemoryAllocation) st = NT_ERR_OOM;
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) st = NT_ERR_NO_DEVICE;
  return nt_ctx_set_error(ctx, st, file, line, "%s failed: %s (%s)", expr, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

nt_status nt_cuda_set_device(nt_ctx *ctx) { return NT_CUDA(ctx, cudaSetDevice(ctx->device.index)); }

static nt_status cuda_ctx_init(nt_ctx *ctx) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE,
                    "no usable CUDA GPU (cudaGetDeviceCount: %s); run on the CPU instead "
                    "(--device cpu), or run tools/doctor to check the driver",
                    e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
  }
  if (ctx->device.index < 0 || ctx->device.index >= count)
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "CUDA device %d requested but only %d present",
                    ctx->device.index, count);
  nt_status st = nt_cuda_set_device(ctx);
  if (st) return st;
  cudaStream_t s, cs;
  if ((st = NT_CUDA(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))) return st;
  ctx->stream = s;
  if ((st = NT_CUDA(ctx, cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking)))) return st;
  ctx->copy_stream = cs;
  cublasLtHandle_t lt;
  cublasStatus_t bs = cublasLtCreate(&lt);
  if (bs != CUBLAS_STATUS_SUCCESS)
    return NT_ERROR(ctx, NT_ERR_CUBLAS, "cublasLtCreate failed: %s", cublasLtGetStatusString(bs));
  ctx->cublaslt = lt;
  return NT_OK;
}
#endif

nt_status nt_ctx_create(nt_ctx **out, nt_device dev) {
  *out = NULL;
  nt_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    fprintf(stderr, "nanotrain: out of host memory creating a context\n");
    return NT_ERR_OOM;
  }
  pthread_mutex_init(&ctx->err_lock, NULL);
  ctx->device = dev;
  ctx->log_level = log_level_from_env();
  ctx->seed = 1337;
  *out = ctx;
  nt_status st = NT_OK;
  if (dev.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    st = cuda_ctx_init(ctx);
#else
    st = NT_ERROR(ctx, NT_ERR_NO_DEVICE,
                  "this nanotrain was built without the CUDA backend (no CUDA toolkit found)");
#endif
  } else if (dev.type != NT_DEV_CPU) {
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "unknown device type %d", (int)dev.type);
  }
  if (st) return st;
  if ((st = nt_pool_create(ctx, &ctx->pool))) return st;
  if (dev.type == NT_DEV_CUDA) {
    size_t ws;
    if ((st = workspace_from_env(ctx, &ws))) return st;
    if (ws && (st = nt_alloc(ctx, ws, &ctx->workspace))) return st;
    ctx->workspace_bytes = ws;
  }
  return NT_OK;
}

void nt_ctx_free(nt_ctx *ctx) {
  if (!ctx) return;
#ifdef NT_HAVE_CUDA
  if (ctx->stream) {
    (void)cudaSetDevice(ctx->device.index);
    (void)cudaStreamSynchronize(ctx->stream);
    (void)cudaStreamSynchronize(ctx->copy_stream);
  }
#endif
  if (ctx->gemm_cache_free) ctx->gemm_cache_free(ctx, ctx->gemm_cache);
  if (ctx->attn_dq_free) ctx->attn_dq_free(ctx, ctx->attn_dq);
  if (ctx->pool) {
    nt_free(ctx, ctx->workspace);
    nt_pool_destroy(ctx, ctx->pool);
  }
#ifdef NT_HAVE_CUDA
  if (ctx->cublaslt) cublasLtDestroy((cublasLtHandle_t)ctx->cublaslt);
  if (ctx->rng_base && ctx->rng_base != &ctx->rng_base_host) cudaFree(ctx->rng_base);
  if (ctx->stream) cudaStreamDestroy((cudaStream_t)ctx->stream);
  if (ctx->copy_stream) cudaStreamDestroy((cudaStream_t)ctx->copy_stream);
#endif
  pthread_mutex_destroy(&ctx->err_lock);
  free(ctx);
}

nt_device nt_ctx_device(const nt_ctx *ctx) { return ctx->device; }
bool nt_ctx_is_cuda(const nt_ctx *ctx) { return ctx->device.type == NT_DEV_CUDA; }
void *nt_ctx_stream(nt_ctx *ctx) { return ctx->stream; }
void *nt_ctx_copy_stream(nt_ctx *ctx) { return ctx->copy_stream; }
void *nt_ctx_cublaslt(nt_ctx *ctx) { return ctx->cublaslt; }

void *nt_ctx_workspace(nt_ctx *ctx, size_t *bytes) {
  if (bytes) *bytes = ctx->workspace_bytes;
  return ctx->workspace;
}

size_t nt_ctx_workspace_bytes(const nt_ctx *ctx) { return ctx->workspace_bytes; }

/* Whether the compute stream is being captured into a CUDA graph (false for a CPU context). */
static nt_status compute_capturing(nt_ctx *ctx, bool *capturing) {
  *capturing = false;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    nt_status st = NT_CUDA(ctx, cudaStreamIsCapturing((cudaStream_t)ctx->stream, &cap));
    if (st) return st;
    *capturing = cap != cudaStreamCaptureStatusNone;
  }
#else
  (void)ctx;
#endif
  return NT_OK;
}

nt_status nt_ctx_set_workspace_bytes(nt_ctx *ctx, size_t bytes) {
  if (!nt_ctx_is_cuda(ctx)) return NT_OK;
#ifdef NT_HAVE_CUDA
  bool capturing;
  nt_status st = nt_cuda_set_device(ctx);
  if (!st) st = compute_capturing(ctx, &capturing);
  if (st) return st;
  if (capturing)
    return NT_ERROR(ctx, NT_ERR_STATE, "cuBLASLt workspace: cannot be resized while the compute "
                    "stream is being captured into a CUDA graph");
  if (bytes == ctx->workspace_bytes) return NT_OK;
  /* The plans' algorithms were picked for the old size (a smaller buffer would fail them). */
  if (ctx->gemm_cache && ctx->gemm_cache_free) ctx->gemm_cache_free(ctx, ctx->gemm_cache);
  ctx->gemm_cache = NULL;
  /* Freed before the new one is taken, so the pool's peak never holds both. */
  nt_free(ctx, ctx->workspace);
  ctx->workspace = NULL;
  ctx->workspace_bytes = 0;
  if (bytes && (st = nt_alloc(ctx, bytes, &ctx->workspace))) return st;
  ctx->workspace_bytes = bytes;
  return NT_OK;
#else
  (void)bytes;
  return NT_OK;
#endif
}

nt_status nt_ctx_synchronize(nt_ctx *ctx) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    nt_status st = NT_CUDA(ctx, cudaStreamSynchronize((cudaStream_t)ctx->stream));
    if (st) return st;
    return NT_CUDA(ctx, cudaStreamSynchronize((cudaStream_t)ctx->copy_stream));
  }
#endif
  (void)ctx;
  return NT_OK;
}

nt_status nt_ctx_set_error(nt_ctx *ctx, nt_status st, const char *file, int line,
                           const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof msg)
    snprintf(msg + n, sizeof msg - (size_t)n, " [%s:%d]", file, line);
  if (!ctx) {
    fprintf(stderr, "nanotrain: %s: %s\n", nt_status_str(st), msg);
    return st;
  }
  pthread_mutex_lock(&ctx->err_lock);
  ctx->last_status = st;
  memcpy(ctx->last_error, msg, sizeof msg);
  pthread_mutex_unlock(&ctx->err_lock);
  if (ctx->log_level >= NT_LOG_DEBUG) fprintf(stderr, "nanotrain: error: %s\n", msg);
  return st;
}

const char *nt_last_error(const nt_ctx *ctx) { return ctx ? ctx->last_error : ""; }
nt_status nt_last_status(const nt_ctx *ctx) { return ctx ? ctx->last_status : NT_OK; }

void nt_clear_error(nt_ctx *ctx) {
  pthread_mutex_lock(&ctx->err_lock);
  ctx->last_status = NT_OK;
  ctx->last_error[0] = '\0';
  pthread_mutex_unlock(&ctx->err_lock);
}

void nt_ctx_manual_seed(nt_ctx *ctx, uint64_t seed) {
  ctx->seed = seed;
  ctx->rng_offset = 0;
}
uint64_t nt_ctx_seed(const nt_ctx *ctx) { return ctx->seed; }
uint64_t nt_ctx_rng_offset(const nt_ctx *ctx) { return ctx->rng_offset; }
void nt_ctx_set_rng_offset(nt_ctx *ctx, uint64_t offset) { ctx->rng_offset = offset; }

static uint64_t round4(uint64_t n) { return (n + 3) & ~(uint64_t)3; }

uint64_t nt_ctx_rng_reserve(nt_ctx *ctx, uint64_t n) {
  if (ctx->rng_in_step) {
    uint64_t start = ctx->rng_step_used;
    ctx->rng_step_used += round4(n);
    return start;
  }
  uint64_t start = ctx->rng_offset;
  ctx->rng_offset += round4(n);
  return start;
}

/* Makes the base word hold the absolute offset (rounded up to a multiple of 4, so every
 * consumer keeps Philox-block alignment), rewriting it only when it is out of date. */
static nt_status rng_base_sync(nt_ctx *ctx, bool capturing, const char *who) {
  ctx->rng_offset = round4(ctx->rng_offset);
  if (!ctx->rng_base) {
    if (!nt_ctx_is_cuda(ctx)) {
      ctx->rng_base = &ctx->rng_base_host;
    } else {
#ifdef NT_HAVE_CUDA
      if (capturing)
        return NT_ERROR(ctx, NT_ERR_STATE, "%s: the RNG step base does not exist yet; run one "
                        "step eagerly before capturing a CUDA graph", who);
      void *p = NULL;
      nt_status st = nt_cuda_set_device(ctx);
      if (!st) st = NT_CUDA(ctx, cudaMalloc(&p, sizeof(uint64_t)));
      if (st) return st;
      ctx->rng_base = p;
#else
      return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "%s: CUDA is not compiled in", who);
#endif
    }
  }
  if (ctx->rng_base_known && ctx->rng_base_queued == ctx->rng_offset) return NT_OK;
  if (capturing)
    return NT_ERROR(ctx, NT_ERR_STATE, "%s: the RNG step base is out of date (offset %llu, "
                    "base %llu) while a CUDA graph is being captured; a captured rewrite would "
                    "pin every replay to one base", who, (unsigned long long)ctx->rng_offset,
                    (unsigned long long)ctx->rng_base_queued);
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    nt_status st = nt_rng_base_set_cuda(ctx, ctx->rng_base, ctx->rng_offset);
    if (st) return st;
#endif
  } else {
    ctx->rng_base_host = ctx->rng_offset;
  }
  ctx->rng_base_queued = ctx->rng_offset;
  ctx->rng_base_known = true;
  return NT_OK;
}

nt_status nt_ctx_rng_step_begin(nt_ctx *ctx) {
  if (ctx->rng_in_step)
    return NT_ERROR(ctx, NT_ERR_STATE, "nt_ctx_rng_step_begin: a step is already open");
  bool capturing;
  nt_status st = compute_capturing(ctx, &capturing);
  if (!st) st = rng_base_sync(ctx, capturing, "nt_ctx_rng_step_begin");
  if (st) return st;
  ctx->rng_in_step = true;
  ctx->rng_step_used = 0;
  return NT_OK;
}

nt_status nt_ctx_rng_step_end(nt_ctx *ctx, uint64_t *reserved) {
  if (reserved) *reserved = 0;
  if (!ctx->rng_in_step)
    return NT_ERROR(ctx, NT_ERR_STATE, "nt_ctx_rng_step_end: no step is open");
  const uint64_t n = ctx->rng_step_used;
  ctx->rng_in_step = false;
  ctx->rng_step_used = 0;
  if (reserved) *reserved = n;
  bool capturing;
  nt_status st = compute_capturing(ctx, &capturing);
  if (st) return st;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    /* A step without random numbers (no dropout) queues nothing: its graph is unchanged. */
    if (n && (st = nt_rng_base_add_cuda(ctx, ctx->rng_base, n))) return st;
#endif
  } else {
    ctx->rng_base_host += n;
  }
  if (capturing) return NT_OK;   /* each replay advances both (nt_ctx_rng_step_replay) */
  ctx->rng_offset += n;
  ctx->rng_base_queued += n;
  return NT_OK;
}

nt_status nt_ctx_rng_step_replay(nt_ctx *ctx, uint64_t reserved) {
  if (ctx->rng_in_step)
    return NT_ERROR(ctx, NT_ERR_STATE, "nt_ctx_rng_step_replay: called inside an open step");
  if (reserved % 4 != 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "nt_ctx_rng_step_replay: %llu numbers is not a "
                    "step's count (a multiple of 4)", (unsigned long long)reserved);
  bool capturing;
  nt_status st = compute_capturing(ctx, &capturing);
  if (!st) st = rng_base_sync(ctx, capturing, "nt_ctx_rng_step_replay");
  if (st) return st;
  ctx->rng_offset += reserved;
  ctx->rng_base_queued += reserved;
  return NT_OK;
}

bool nt_ctx_rng_in_step(const nt_ctx *ctx) { return ctx->rng_in_step; }

const uint64_t *nt_ctx_rng_base(const nt_ctx *ctx) {
  return ctx->rng_in_step ? ctx->rng_base : NULL;
}

nt_status nt_ctx_rng_base_read(nt_ctx *ctx, uint64_t *out) {
  *out = 0;
  if (!ctx->rng_base)
    return NT_ERROR(ctx, NT_ERR_STATE, "nt_ctx_rng_base_read: no RNG step has run yet");
  if (!nt_ctx_is_cuda(ctx)) {
    *out = ctx->rng_base_host;
    return NT_OK;
  }
#ifdef NT_HAVE_CUDA
  nt_status st = nt_cuda_set_device(ctx);
  if (!st) st = NT_CUDA(ctx, cudaMemcpyAsync(out, ctx->rng_base, sizeof *out,
                                             cudaMemcpyDeviceToHost, (cudaStream_t)ctx->stream));
  if (!st) st = NT_CUDA(ctx, cudaStreamSynchronize((cudaStream_t)ctx->stream));
  return st;
#else
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "nt_ctx_rng_base_read: CUDA is not compiled in");
#endif
}

void nt_ctx_set_allow_tf32(nt_ctx *ctx, bool allow) { ctx->allow_tf32 = allow; }
bool nt_ctx_allow_tf32(const nt_ctx *ctx) { return ctx->allow_tf32; }

void nt_log(nt_ctx *ctx, nt_log_level level, const char *fmt, ...) {
  nt_log_level max = ctx ? ctx->log_level : log_level_from_env();
  if (level > max) return;
  static const char *tags[] = {"error", "warn", "info", "debug"};
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[nanotrain %s] %s\n", tags[level], msg);
}
