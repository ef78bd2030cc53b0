/* The FSDP unit runtime: data parallelism over the flat parameter units of models/module.h,
 * with PyTorch FSDP's strategy and option names (docs/sharding.md walks one step).
 *
 *   NO_SHARD       (DDP)    every rank keeps whole units; grads_ready all-reduces the unit's
 *                           gradient (SUM) on the communication stream, overlapped with the
 *                           rest of the backward.
 *   SHARD_GRAD_OP  (ZeRO-2) whole compute parameters are kept; grads_ready reduce-scatters the
 *                           unit's gradient into this rank's fp32 gradient shard and frees the
 *                           whole gradient; the optimizer (and its fp32 master and moments) runs
 *                           over the owned shard only; params_updated all-gathers the updated
 *                           compute parameters in place.
 *   FULL_SHARD     (ZeRO-3) only the shard of the compute parameters is kept: before_forward and
 *                           before_backward all-gather a unit into a temporary whole buffer,
 *                           which is freed after use (after the unit's forward when
 *                           reshard_after_forward, after its backward always).
 *
 * The runtime takes over the unit buffers of an allocated nt_params at create: for the sharded
 * strategies it frees the model's whole master/grad/compute buffers and points unit->compute
 * and unit->grad at its own (padded) buffers while they exist (data NULL while a unit is
 * sharded). Code that calls the model must therefore take views of a unit's buffers after the
 * hooks have run (not cache them at model creation). NO_SHARD leaves the buffers alone.
 *
 * Means: reductions are sums. The gradients the optimizer sees must be divided by the world
 * size N (nt_fsdp_grad_divisor); fold 1/N into the unscale factor (the loss scaler's
 * inv_scale, or 1 without a scaler): the step does it with nt_step_options.grad_divisor = N
 * (train/fsdp_step.h), unscaling the owned gradients in place without clipping and folding the
 * factor into the optimizer's clip coefficient with clipping.
 * Gradient accumulation: the loss is divided by K as on one rank; nt_fsdp_set_sync(false) for
 * the first K-1 micro-steps skips the reductions (FSDP's no_sync), so the whole gradients
 * accumulate locally (sharded strategies then hold whole gradients until the last micro-step).
 *
 * Streams: every hook only enqueues work (the NCCL backend) except with the MPI backend, whose
 * collectives run on the host (device buffers are staged and the compute stream synchronized).
 * The compute stream waits for a unit's gather in before_forward / before_backward (FULL_SHARD),
 * for all gradient reductions once the last unit of the micro-step has called grads_ready (or in
 * nt_fsdp_finish_backward), and for SHARD_GRAD_OP's gathers at the end of params_updated. So
 * every collective issued in a forward + backward is also waited for inside it, and that part
 * of the step can be captured as a CUDA graph with the NCCL backend (after warm-up steps, so the
 * gathered and whole-gradient buffers come from the pool's cache). The MPI backend synchronizes
 * with the host and cannot be captured. */
#ifndef NT_DIST_FSDP_H
#define NT_DIST_FSDP_H
#include <stdio.h>
#include "core/nt.h"
#include "dist/comm.h"
#include "dist/shard.h"
#include "models/module.h"
#include "optim/optimizer.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_BACKWARD_PREFETCH_NONE = 0,
  NT_BACKWARD_PREFETCH_PRE,   /* gather the next unit when the current one's backward starts */
  NT_BACKWARD_PREFETCH_POST   /* gather the next unit when the current one's gradient is ready */
} nt_backward_prefetch;

typedef struct {
  nt_sharding strategy;                    /* NO_SHARD */
  nt_dtype param_dtype;                    /* the compute copy's dtype: must equal the params'
                                            * compute dtype (gathers move this dtype) */
  nt_dtype reduce_dtype;                   /* F32 (default), F16 or BF16 */
  bool reshard_after_forward;              /* true */
  bool limit_all_gathers;                  /* true: at most two units gathered at once */
  nt_backward_prefetch backward_prefetch;  /* BACKWARD_PRE */
  bool forward_prefetch;                   /* false */
  /* false (default): the runtime frees the model's whole buffers and allocates whole ones
   * only while needed (the memory the strategy promises; the model must take its views after
   * the hooks). true: the model's whole compute and gradient buffers stay allocated at their
   * addresses (for models that keep views taken at creation): the same collectives and
   * results, but parameters and gradients cost whole-model memory plus the shards. Needs every
   * unit's size to be a multiple of the world size (unit sizes are multiples of 16, so any
   * world size dividing 16). */
  bool stable_buffers;
  FILE *trace;                             /* non-NULL: one line per runtime event (below) */
} nt_fsdp_options;

/* Trace lines (rank 0 of a job usually passes stderr or a file; each rank may have its own):
 *   fsdp r<rank> +<ms> <event> unit <u> <bytes> B [seq <collective>] [stream comm|compute]
 * events: gather, free-params, alloc-grad, reduce (all_reduce / reduce_scatter), free-grad,
 * join, global-reduce, all-gather-updated, wait. Times are host enqueue times since create:
 * with the NCCL backend the device runs the work later, on the stream named. */

nt_fsdp_options nt_fsdp_defaults(void);
bool nt_backward_prefetch_parse(const char *s, nt_backward_prefetch *out);

typedef struct nt_fsdp nt_fsdp;

/* p: allocated and initialised (the same initial values on every rank). comm outlives the
 * runtime. */
nt_status nt_fsdp_create(nt_ctx *ctx, nt_comm *comm, nt_params *p, const nt_fsdp_options *opt,
                         nt_fsdp **out);
void nt_fsdp_free(nt_ctx *ctx, nt_fsdp *f);     /* NULL is a no-op */

const nt_shard_layout *nt_fsdp_layout(const nt_fsdp *f, int unit);
nt_params *nt_fsdp_params(const nt_fsdp *f);
nt_sharding nt_fsdp_strategy(const nt_fsdp *f);
int nt_fsdp_grad_divisor(const nt_fsdp *f);      /* the world size */

/* The hooks of train/model.h and train/step.h (arg = the nt_fsdp). */
nt_status nt_fsdp_before_forward(nt_ctx *ctx, void *arg, int unit);
nt_status nt_fsdp_before_backward(nt_ctx *ctx, void *arg, int unit);
nt_status nt_fsdp_grads_ready(nt_ctx *ctx, void *arg, int unit);
nt_status nt_fsdp_global_reduce(nt_ctx *ctx, void *arg, float *found_inf, float *sumsq);
nt_status nt_fsdp_params_updated(nt_ctx *ctx, void *arg);

/* false: the following micro-steps accumulate without reducing (no_sync); true (default):
 * the next micro-step reduces. */
void nt_fsdp_set_sync(nt_fsdp *f, bool sync);
/* Ends a micro-step's gradient reductions if the last grads_ready did not (idempotent). */
nt_status nt_fsdp_finish_backward(nt_ctx *ctx, nt_fsdp *f);
/* Zeroes what the next backward accumulates into (replaces nt_params_zero_grad). */
nt_status nt_fsdp_zero_grad(nt_ctx *ctx, nt_fsdp *f);

/* Optimizer views, one per unit: NO_SHARD the whole unit; sharded strategies the owned range
 * of the padded buffers (compute shard, fp32 gradient shard, and master_init: the fp32 owned
 * values when the compute copy is 16-bit). */
nt_status nt_fsdp_param_units(nt_fsdp *f, nt_param_unit *out);
/* Once the optimizer has copied its master weights (16-bit compute, sharded strategies): frees
 * the runtime's initial fp32 shards that master_init pointed at. */
void nt_fsdp_drop_master_init(nt_ctx *ctx, nt_fsdp *f);
/* Parameter-group ranges (unit offsets) mapped into the owned shards; empty parts dropped.
 * Returns the number written (at most n). */
int nt_fsdp_map_ranges(const nt_fsdp *f, const nt_param_range *in, int n, nt_param_range *out);
/* The owned real gradient elements (padding excluded), for the inf check and the norm: up to
 * one view per unit, *n set to the count. */
nt_status nt_fsdp_owned_grads(nt_fsdp *f, nt_tensor *out, int *n);
/* The whole unit (F32 [numel] on any device) from every rank's shard: src is an F32 [shard]
 * tensor (e.g. the optimizer's master or moment view of the unit), NULL for the compute
 * parameters (F32 compute only). NO_SHARD: src's whole unit, copied. Synchronous. */
nt_status nt_fsdp_gather_unit(nt_ctx *ctx, nt_fsdp *f, int unit, const nt_tensor *src,
                              nt_tensor *dst);
/* The reverse, for loading a whole (consolidated) unit at any world size: dst (F32 [shard] on
 * ctx's device, e.g. the optimizer's master or moment view; NO_SHARD: [numel]) = this rank's
 * owned range of src (F32 [numel], any device), padding zero. No communication. */
nt_status nt_fsdp_scatter_unit(nt_ctx *ctx, nt_fsdp *f, int unit, const nt_tensor *src,
                               nt_tensor *dst);
/* Rewrites the runtime's compute copy of the unit (kept shard, or whole buffer) from whole fp32
 * values src (F32 [numel], any device), converted to the compute dtype. */
nt_status nt_fsdp_load_unit(nt_ctx *ctx, nt_fsdp *f, int unit, const nt_tensor *src);

/* The same from this rank's owned fp32 values only (a sharded checkpoint): owned is F32
 * [shard] (NO_SHARD: [numel]) on ctx's device, e.g. the optimizer's master view after loading.
 * SHARD_GRAD_OP, which keeps whole compute copies, all-gathers them (collective: every rank
 * calls it for the same units in the same order). */
nt_status nt_fsdp_load_owned(nt_ctx *ctx, nt_fsdp *f, int j, const nt_tensor *owned);

/* Bytes per rank: persistent buffers plus the peak of temporary whole buffers since create. */
typedef struct {
  double parameters;     /* compute copies: kept ones + peak of gathered units */
  double gradients;      /* fp32 gradients: kept shards (or units) + peak of whole ones */
  double master;         /* fp32 master weights the optimizer keeps (16-bit compute only) */
  double optimizer;      /* AdamW's two fp32 moments over the optimizer's elements */
  int peak_gathered;     /* most units gathered at once (FULL_SHARD) */
} nt_fsdp_memory;
void nt_fsdp_memory_of(const nt_fsdp *f, nt_fsdp_memory *out);

NT_EXTERN_C_END
#endif
