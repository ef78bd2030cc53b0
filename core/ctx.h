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

/* Logging levels (nt_log below). */
typedef enum { NT_LOG_ERROR = 0, NT_LOG_WARN, NT_LOG_INFO, NT_LOG_DEBUG } nt_log_level;

/* Every kernel and algorithm choice of the library, fixed when the context is created (the
 * library reads no environment variable). Start from nt_ctx_options_default() and change
 * fields, or set them by name with nt_ctx_options_set (the key in quotes below). Programs may
 * map flags (`nanotrain --kernel-opt key=value`) and environment variables (each option's
 * name in nt_ctx_option_name_at, "NT_" + the key in capitals) onto them once at start.
 * Defaults are what the library picks on its own; the others exist for fallbacks, tests,
 * benchmarks and tuning on other GPUs (bench/RESULTS.md has the measurements). */
typedef struct {
  nt_log_level log;               /* "log": error, warn, info (default), debug */
  /* "cublaslt_workspace_mib" (MiB, fractions allowed, 0 to 4096): the cuBLASLt workspace
   * allocated at creation; default 32 MiB (see nt_ctx_set_workspace_bytes). */
  size_t cublaslt_workspace_bytes;
  /* GEMM (ops/gemm.h). "gemm_autotune": time cuBLASLt's candidates on a shape's first use
   * (default true; false keeps the heuristic's first choice). "gemm_search": 0 heuristic
   * list only, 1 (default) also a widened search for products of 1 GFLOP or more, 2 the
   * widened search on every shape (diagnosis). "gemm_search_verify": check every searched
   * candidate's result, not only the finalists' (tests; default false).
   * "gemm_untuned_gflop": products this large keep cuBLASLt's first choice untimed
   * (default 100). */
  bool gemm_autotune;
  int gemm_search;
  bool gemm_search_verify;
  double gemm_untuned_gflop;
  /* "conv_l2_mb": conv2d's im2col scratch per batch chunk, MiB; < 0 (default, "auto"): about
   * 8 MiB or 16k GEMM rows, at most 16 MiB; 0: the whole batch at once (ops/conv2d.h). */
  double conv_l2_mb;
  /* "pdl": programmatic dependent launch on Hopper (ops/pdl.cuh) for the attention kernels
   * and the memory-bound LayerNorm, dropout and column-sum kernels; default true. */
  bool pdl;
  /* Attention (ops/attention.h). "attn_simple": the simple kernels (no tensor cores) for
   * every case, as where the tensor-core ones do not apply (default false). "attn_wgmma":
   * the Hopper wgmma kernels for D = 64 where the build and the GPU have them; false: the
   * mma.sync ones (default true). "attn_tma": the wgmma kernels load by the TMA where a
   * tensor map can be made; false: cp.async, as they do where none can (default true).
   * "attn_bwd_keys": the wgmma backward's block, 64 keys (one warpgroup) or 128 (two);
   * 0 (default): 64 with dropout up to T = 512, else 128. "attn_bwd_group": the wgmma
   * backward runs its blocks this many heads at a time (default 32; 0: all at once; tune for
   * another L2 size). "attn_dq_pair": the wgmma backward keeps two dQ accumulators in the
   * context and zeroes the next one in its kernel; false: a transient one zeroed before each
   * call (less memory held between calls; default true). */
  bool attn_simple;
  bool attn_wgmma;
  bool attn_tma;
  int attn_bwd_keys;
  int attn_bwd_group;
  bool attn_dq_pair;
  /* "mem_cache": the pool carves requests out of larger segments and keeps freed blocks
   * (default true). false: every request is its own system allocation of exactly its size,
   * kept for a later request of the same size only, so compute-sanitizer's memcheck (or ASan
   * on the CPU) sees an access past a tensor's end; for sanitizer runs, not for training. */
  bool mem_cache;
} nt_ctx_options;

nt_ctx_options nt_ctx_options_default(void);
/* Sets the option named `key` from its text form: booleans 0/1/true/false/on/off/yes/no,
 * numbers as above, log levels by name, "auto" for conv_l2_mb's default. NT_ERR_INVALID_ARG, with a
 * message on stderr naming the key or the value, for an unknown key or a bad value
 * (*opts is then unchanged). */
nt_status nt_ctx_options_set(nt_ctx_options *opts, const char *key, const char *value);
/* Option i's key and the environment variable a program may map onto it, i from 0; NULL past
 * the last option. */
typedef struct {
  const char *key, *env;
} nt_ctx_option_name;
const nt_ctx_option_name *nt_ctx_option_name_at(int i);

/* Creates a context for `dev` with the default options. On failure (no GPU, no driver, CUDA
 * not compiled in) *out is still a valid context that holds the error message (nt_last_error)
 * and must be freed. */
nt_status nt_ctx_create(nt_ctx **out, nt_device dev);
/* The same with options (NULL: the defaults); out-of-range values are NT_ERR_INVALID_ARG. */
nt_status nt_ctx_create_with(nt_ctx **out, nt_device dev, const nt_ctx_options *opts);
/* The options the context was created with. */
const nt_ctx_options *nt_ctx_opts(const nt_ctx *ctx);
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
 * Default 32 MiB, cuBLAS's recommendation for Hopper (PyTorch's choice there too), or the
 * option cublaslt_workspace_bytes at context creation. Setting it releases the old buffer
 * (stream-ordered), allocates the new one and drops the cached GEMM plans, which were chosen
 * for the old size (the next GEMM of each shape plans and autotunes again). Call it outside
 * stream capture and before capturing CUDA graphs: a graph keeps the buffer it was captured
 * with. 0: no workspace. If the allocation fails the context is left with none (and the
 * error). A CPU context has no workspace: a no-op, the size stays 0. */
nt_status nt_ctx_set_workspace_bytes(nt_ctx *ctx, size_t bytes);
size_t nt_ctx_workspace_bytes(const nt_ctx *ctx);
/* A capture of the compute stream that will be replayed (train/cuda_graph.c uses these in place
 * of cudaStreamBeginCapture/EndCapture). While it is open, ops may capture state they keep
 * across calls (the attention backward's pair of dQ accumulators, ops/attention_dq_pair.c),
 * and the end adds to the capture, when `body_ok`, what makes every replay leave that state as
 * it found it. `*graph` gets the cudaGraph_t, or NULL: when the capture failed (the status says
 * why) or, with NT_OK, when `body_ok` is false (the body's own error stands). Begin on a CPU
 * context: NT_ERR_UNSUPPORTED. A capture not begun this way still works; such ops then use
 * per-call buffers in it. */
nt_status nt_ctx_capture_begin(nt_ctx *ctx);
nt_status nt_ctx_capture_end(nt_ctx *ctx, bool body_ok, void **graph);
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
 * CPU and GPU runs from the same seed draw the same numbers. nt_ctx_rng_offset is the
 * absolute position (what checkpoints save); set it outside a step (below). */
void nt_ctx_manual_seed(nt_ctx *ctx, uint64_t seed);
uint64_t nt_ctx_seed(const nt_ctx *ctx);
uint64_t nt_ctx_rng_offset(const nt_ctx *ctx);
void nt_ctx_set_rng_offset(nt_ctx *ctx, uint64_t offset);
/* Reserves n numbers: returns the offset to draw from and advances the context's offset
 * (rounded up to a multiple of 4, Philox's block). Inside a step (below) the offset returned
 * is relative to the step base: 0 for the step's first reservation. */
uint64_t nt_ctx_rng_reserve(nt_ctx *ctx, uint64_t n);

/* Per-step RNG base, so that a step captured as a CUDA graph draws fresh numbers on every
 * replay (PyTorch's graph-safe Philox offsets, in spirit). The base is a uint64 in device
 * memory (host memory for a CPU context) that the random ops read when they run: between
 * nt_ctx_rng_step_begin and nt_ctx_rng_step_end, nt_ctx_rng_reserve hands out offsets
 * relative to it, and dropout (ops/dropout.h) and attention dropout (ops/attention.h) draw
 * number base + offset + i. A step's numbers are therefore the same ones the absolute offsets
 * of an unbracketed step would give.
 *  - begin: the base becomes the absolute offset (rounded up to a multiple of 4); the device
 *    word is rewritten, on the compute stream, only when it is out of date (the first step,
 *    after nt_ctx_set_rng_offset / nt_ctx_manual_seed or reservations outside a step). During
 *    stream capture an out-of-date base is an error (NT_ERR_STATE): a captured rewrite would
 *    pin every replay to one base.
 *  - end: enqueues base += (numbers reserved in the step) on the compute stream (nothing when
 *    the step reserved none) and advances the absolute offset by as much, so after the step
 *    nt_ctx_rng_offset equals the base.
 *    *reserved (may be NULL) gets that count. While the stream is being captured the increment
 *    is recorded into the graph and the absolute offset is left alone: replays advance both.
 *  - replay: call it just before launching a graph captured between begin and end that
 *    reserved `reserved` numbers (a step must reserve the same count every time to be
 *    replayed): brings the base up to date if needed and advances the absolute offset by
 *    `reserved`, as the graph's own increment will advance the base.
 * Begin inside a step, end or replay outside one are NT_ERR_STATE. */
nt_status nt_ctx_rng_step_begin(nt_ctx *ctx);
nt_status nt_ctx_rng_step_end(nt_ctx *ctx, uint64_t *reserved);
nt_status nt_ctx_rng_step_replay(nt_ctx *ctx, uint64_t reserved);
bool nt_ctx_rng_in_step(const nt_ctx *ctx);
/* The base word for the random ops: a device pointer (host for a CPU context) inside a step,
 * NULL outside one (base 0: offsets are absolute). */
const uint64_t *nt_ctx_rng_base(const nt_ctx *ctx);
/* The base's value once queued work has run (synchronizes; for tests and diagnostics).
 * NT_ERR_STATE before the first step. */
nt_status nt_ctx_rng_base_read(nt_ctx *ctx, uint64_t *out);

/* The default for fp32 GEMMs that leave their option tf32 at NT_TF32_DEFAULT (ops/gemm.h):
 * the precision policy's choice, set by nt_policy_apply (amp/policy.h). Off at creation. An
 * op that needs one behaviour sets it on its own GEMMs instead of changing this. */
void nt_ctx_set_allow_tf32(nt_ctx *ctx, bool allow);
bool nt_ctx_allow_tf32(const nt_ctx *ctx);

/* Logging to stderr, up to the context's option `log` (info without a context). */
void nt_log(nt_ctx *ctx, nt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

NT_EXTERN_C_END
#endif
