#include "core/ctx_internal.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NT_HAVE_CUDA
#include <cublasLt.h>
#endif

/* cuBLASLt workspace: 32 MiB, cuBLAS's recommendation for Hopper (it covers the heuristics'
 * largest choices there). */
#define NT_WORKSPACE_BYTES ((size_t)32 << 20)
#define NT_WORKSPACE_MAX_MIB 4096.0

nt_ctx_options nt_ctx_options_default(void) {
  nt_ctx_options o;
  memset(&o, 0, sizeof o);
  o.log = NT_LOG_INFO;
  o.cublaslt_workspace_bytes = NT_WORKSPACE_BYTES;
  o.gemm_autotune = true;
  o.gemm_search = 1;
  o.gemm_untuned_gflop = 100.0;
  o.conv_l2_mb = -1.0;
  o.pdl = true;
  o.attn_wgmma = true;
  o.attn_tma = true;
  o.attn_bwd_group = 32;
  o.attn_dq_pair = true;
  o.mem_cache = true;
  return o;
}

/* How each option's text maps onto its field. */
typedef enum { K_BOOL, K_INT, K_NUM, K_LOG, K_MIB, K_AUTO_NUM } opt_kind;
typedef struct {
  nt_ctx_option_name name;
  opt_kind kind;
  size_t offset;
  double lo, hi;  /* K_INT, K_NUM, K_MIB, K_AUTO_NUM ("auto" is -1) */
} opt_spec;

#define OPT(key, env, kind, field, lo, hi) \
  {{key, env}, kind, offsetof(nt_ctx_options, field), lo, hi}
static const opt_spec specs[] = {
    OPT("log", "NT_LOG", K_LOG, log, 0, 0),
    OPT("cublaslt_workspace_mib", "NT_CUBLASLT_WORKSPACE_MIB", K_MIB, cublaslt_workspace_bytes,
        0, NT_WORKSPACE_MAX_MIB),
    OPT("gemm_autotune", "NT_GEMM_AUTOTUNE", K_BOOL, gemm_autotune, 0, 0),
    OPT("gemm_search", "NT_GEMM_SEARCH", K_INT, gemm_search, 0, 2),
    OPT("gemm_search_verify", "NT_GEMM_SEARCH_VERIFY", K_BOOL, gemm_search_verify, 0, 0),
    OPT("gemm_untuned_gflop", "NT_GEMM_UNTUNED_GFLOP", K_NUM, gemm_untuned_gflop, 1e-300, 1e300),
    OPT("conv_l2_mb", "NT_CONV_L2_MB", K_AUTO_NUM, conv_l2_mb, 0, 1e12),
    OPT("pdl", "NT_PDL", K_BOOL, pdl, 0, 0),
    OPT("attn_simple", "NT_ATTN_SIMPLE", K_BOOL, attn_simple, 0, 0),
    OPT("attn_wgmma", "NT_ATTN_WGMMA", K_BOOL, attn_wgmma, 0, 0),
    OPT("attn_tma", "NT_ATTN_TMA", K_BOOL, attn_tma, 0, 0),
    OPT("attn_bwd_keys", "NT_ATTN_BWD_KEYS", K_INT, attn_bwd_keys, 0, 128),
    OPT("attn_bwd_group", "NT_ATTN_BWD_GROUP", K_INT, attn_bwd_group, 0, 1 << 30),
    OPT("attn_dq_pair", "NT_ATTN_DQ_PAIR", K_BOOL, attn_dq_pair, 0, 0),
    OPT("mem_cache", "NT_MEM_CACHE", K_BOOL, mem_cache, 0, 0),
};
#undef OPT
enum { NSPECS = sizeof specs / sizeof specs[0] };

const nt_ctx_option_name *nt_ctx_option_name_at(int i) {
  return i >= 0 && i < NSPECS ? &specs[i].name : NULL;
}

/* Ranges and sets beyond what the text parsers check; also checked at context creation. */
static const char *option_invalid(const nt_ctx_options *o) {
  if (o->log < NT_LOG_ERROR || o->log > NT_LOG_DEBUG) return "log";
  if ((double)o->cublaslt_workspace_bytes > NT_WORKSPACE_MAX_MIB * 1048576.0)
    return "cublaslt_workspace_mib";
  if (o->gemm_search < 0 || o->gemm_search > 2) return "gemm_search";
  if (!(o->gemm_untuned_gflop > 0.0)) return "gemm_untuned_gflop";
  if (o->attn_bwd_keys != 0 && o->attn_bwd_keys != 64 && o->attn_bwd_keys != 128)
    return "attn_bwd_keys";
  if (o->attn_bwd_group < 0) return "attn_bwd_group";
  return NULL;
}

static bool parse_field(const opt_spec *sp, const char *v, nt_ctx_options *o) {
  static const char *const words[2][4] = {{"0", "false", "off", "no"}, {"1", "true", "on", "yes"}};
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  void *field = (char *)o + sp->offset;
  char *end = NULL;
  double x = 0.0;
  switch (sp->kind) {
    case K_BOOL:
      for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++)
          if (!strcmp(v, words[b][i])) return *(bool *)field = b, true;
      return false;
    case K_LOG:
      for (int i = 0; i < 4; i++)
        if (!strcmp(v, levels[i])) return *(nt_log_level *)field = (nt_log_level)i, true;
      return false;
    case K_AUTO_NUM:
      if (!strcmp(v, "auto")) return *(double *)field = -1.0, true;
      break;
    default: break;
  }
  x = sp->kind == K_INT ? (double)strtol(v, &end, 10) : strtod(v, &end);
  if (end == v || *end || !(x >= sp->lo && x <= sp->hi)) return false;
  if (sp->kind == K_INT) *(int *)field = (int)x;
  else if (sp->kind == K_MIB) *(size_t *)field = (size_t)(x * 1048576.0 + 0.5);
  else *(double *)field = x;
  return true;
}

nt_status nt_ctx_options_set(nt_ctx_options *opts, const char *key, const char *value) {
  if (!key || !value)
    return NT_ERROR(NULL, NT_ERR_INVALID_ARG, "context option: NULL key or value");
  for (int i = 0; i < NSPECS; i++) {
    if (strcmp(key, specs[i].name.key)) continue;
    nt_ctx_options o = *opts;
    const char *bad = NULL;
    if (!parse_field(&specs[i], value, &o) || ((bad = option_invalid(&o)) && !strcmp(bad, key)))
      return NT_ERROR(NULL, NT_ERR_INVALID_ARG,
                      "context option %s: bad value '%s' (see core/ctx.h)", key, value);
    *opts = o;
    return NT_OK;
  }
  char list[512];
  size_t n = 0;
  for (int i = 0; i < NSPECS && n < sizeof list; i++)
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", specs[i].name.key);
  return NT_ERROR(NULL, NT_ERR_INVALID_ARG, "unknown context option '%s' (known: %s)", key,
                  list);
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

nt_status nt_ctx_create(nt_ctx **out, nt_device dev) { return nt_ctx_create_with(out, dev, NULL); }

nt_status nt_ctx_create_with(nt_ctx **out, nt_device dev, const nt_ctx_options *opts) {
  *out = NULL;
  nt_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    fprintf(stderr, "nanotrain: out of host memory creating a context\n");
    return NT_ERR_OOM;
  }
  pthread_mutex_init(&ctx->err_lock, NULL);
  ctx->device = dev;
  ctx->opts = opts ? *opts : nt_ctx_options_default();
  ctx->seed = 1337;
  *out = ctx;
  nt_status st = NT_OK;
  const char *bad = option_invalid(&ctx->opts);
  if (bad) {
    const nt_ctx_options def = nt_ctx_options_default();
    ctx->opts.log = def.log;  /* a usable level for the message below */
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "context option %s out of range (see core/ctx.h)",
                    bad);
  }
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
    const size_t ws = ctx->opts.cublaslt_workspace_bytes;
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
const nt_ctx_options *nt_ctx_opts(const nt_ctx *ctx) { return &ctx->opts; }
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
nt_status nt_ctx_capturing(nt_ctx *ctx, bool *capturing) {
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

nt_status nt_ctx_capture_begin(nt_ctx *ctx) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    if (ctx->capture_open)
      return NT_ERROR(ctx, NT_ERR_STATE, "CUDA graph: a capture is already open on this context");
    nt_status st = NT_CUDA(ctx, cudaStreamBeginCapture((cudaStream_t)ctx->stream,
                                                       cudaStreamCaptureModeThreadLocal));
    ctx->capture_open = st == NT_OK;
    return st;
  }
#endif
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "CUDA graphs need a CUDA context");
}

nt_status nt_ctx_capture_end(nt_ctx *ctx, bool body_ok, void **graph) {
  *graph = NULL;
#ifdef NT_HAVE_CUDA
  if (!ctx->capture_open)
    return NT_ERROR(ctx, NT_ERR_STATE, "CUDA graph: no capture begun by nt_ctx_capture_begin");
  nt_status st = NT_OK;
  if (ctx->attn_dq_capture_end) st = ctx->attn_dq_capture_end(ctx, ctx->attn_dq, body_ok);
  ctx->capture_open = false;
  cudaGraph_t g = NULL;
  cudaError_t end = cudaStreamEndCapture((cudaStream_t)ctx->stream, &g);
  (void)cudaGetLastError();   /* a failed capture is not sticky: clear it */
  if (st || !body_ok || end != cudaSuccess || !g) {
    if (g) cudaGraphDestroy(g);
    if (st || !body_ok) return st;
    return NT_ERROR(ctx, NT_ERR_CUDA, "CUDA graph capture failed: %s", cudaGetErrorString(end));
  }
  *graph = g;
  return NT_OK;
#else
  (void)body_ok;
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "CUDA graphs: built without CUDA");
#endif
}

nt_status nt_ctx_set_workspace_bytes(nt_ctx *ctx, size_t bytes) {
  if (!nt_ctx_is_cuda(ctx)) return NT_OK;
#ifdef NT_HAVE_CUDA
  bool capturing;
  nt_status st = nt_cuda_set_device(ctx);
  if (!st) st = nt_ctx_capturing(ctx, &capturing);
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
  if (ctx->opts.log >= NT_LOG_DEBUG) fprintf(stderr, "nanotrain: error: %s\n", msg);
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
  nt_status st = nt_ctx_capturing(ctx, &capturing);
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
  nt_status st = nt_ctx_capturing(ctx, &capturing);
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
  nt_status st = nt_ctx_capturing(ctx, &capturing);
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
  nt_log_level max = ctx ? ctx->opts.log : NT_LOG_INFO;
  if (level > max) return;
  static const char *tags[] = {"error", "warn", "info", "debug"};
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[nanotrain %s] %s\n", tags[level], msg);
}
