/* Model parameters in flat buffers, one per unit (a transformer block, the embeddings, a CNN
 * stage), as docs/architecture.md says: the same buffers that the optimizer updates in one
 * launch and that sharding splits. Each unit has
 *   master  F32 [numel]  the parameters (fp32 master weights under mixed precision)
 *   grad    F32 [numel]  their gradients (backward accumulates into views of it)
 *   compute [numel] in the policy's compute dtype (aliases master for fp32/tf32)
 * Parameters that get weight decay (2-D weights) come first in a unit, so a unit is two
 * contiguous ranges: [0, n_decay) with decay, [n_decay, numel) without. Offsets are aligned to
 * NT_PARAM_ALIGN elements (16-byte vector access in every dtype); the gaps are zero and stay
 * zero (zero gradient, zero weight).
 * Also: an activation arena, so a model allocates all its activations once at init. */
#ifndef NT_MODELS_MODULE_H
#define NT_MODELS_MODULE_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

#define NT_PARAM_ALIGN 16
#define NT_PARAM_NAME_MAX 80

typedef enum { NT_INIT_ZEROS = 0, NT_INIT_ONES, NT_INIT_NORMAL, NT_INIT_UNIFORM } nt_init_kind;

typedef struct {
  char name[NT_PARAM_NAME_MAX];   /* checkpoint name, as nanoGPT / torch would name it */
  int ndim;
  int64_t shape[NT_MAX_DIMS];
  int64_t numel;
  int64_t offset;                 /* element offset in the unit's flat buffers */
  bool decay;                     /* weight decay applies (2-D weights) */
  nt_init_kind init;
  float init_a;                   /* std (NORMAL) or bound (UNIFORM: [-a, a]) */
} nt_param_desc;

typedef struct {
  char name[48];
  nt_param_desc *params;
  int n_params, cap;
  int64_t numel;                  /* flat length, alignment gaps included */
  int64_t n_decay;                /* [0, n_decay) takes weight decay */
  nt_tensor master, grad, compute;
} nt_unit;

typedef struct {
  nt_unit *units;
  int n_units, cap;
  nt_dtype compute_dtype;
  int64_t numel;                  /* sum over units (with gaps) */
  int64_t n_real;                 /* sum of parameter sizes (what a model "has") */
  bool allocated;
} nt_params;

/* Building: add units and their parameters, then nt_params_alloc assigns offsets (decayed
 * parameters first) and allocates the buffers on ctx's device. Returns indices. */
nt_status nt_params_add_unit(nt_ctx *ctx, nt_params *p, const char *name, int *unit);
nt_status nt_params_add(nt_ctx *ctx, nt_params *p, int unit, const char *name, int ndim,
                        const int64_t *shape, bool decay, nt_init_kind init, float init_a,
                        int *index);
nt_status nt_params_alloc(nt_ctx *ctx, nt_params *p, nt_dtype compute_dtype);
void nt_params_free(nt_ctx *ctx, nt_params *p);
/* Assigns offsets and sizes without allocating (estimates). */
void nt_params_layout(nt_params *p);

typedef struct {
  int64_t n_params;          /* parameter elements */
  int64_t n_flat;            /* flat-buffer elements (alignment gaps included) */
  int64_t largest_unit;      /* elements of the largest unit */
  int n_units;
  size_t activation_bytes;
} nt_model_sizes;
void nt_model_sizes_of(const nt_params *p, size_t activation_bytes, nt_model_sizes *out);

typedef enum { NT_VIEW_MASTER = 0, NT_VIEW_GRAD, NT_VIEW_COMPUTE } nt_param_view;
/* A view with the parameter's shape into one of the unit's buffers. */
nt_tensor nt_params_view(const nt_params *p, int unit, int index, nt_param_view which);
/* Finds a parameter by name; false when absent. */
bool nt_params_find(const nt_params *p, const char *name, int *unit, int *index);

/* Initialises every parameter from (seed): numbers are drawn on the host from the Philox
 * stream (parameter k of the model uses its own stream position), so a CPU and a GPU model
 * start bit-identical. Then refreshes the compute copies. */
nt_status nt_params_init(nt_ctx *ctx, nt_params *p, uint64_t seed);
/* compute = convert(master) for every unit whose compute buffer is a separate copy. */
nt_status nt_params_sync_compute(nt_ctx *ctx, nt_params *p);
nt_status nt_params_zero_grad(nt_ctx *ctx, nt_params *p);
/* Hands the fp32 master weights of `unit` over to an optimizer that owns its own copy (the
 * optimizer was created with master_init = this unit's master): frees the unit's buffer and
 * makes `master` (F32 [numel], owned by the optimizer) the unit's master view. For an F32 unit
 * the compute buffer is the master and stays so (master must then alias it). */
nt_status nt_params_adopt_master(nt_ctx *ctx, nt_params *p, int unit, const nt_tensor *master);

/* Per-unit hooks a model calls during a training micro-step, around each unit (a transformer
 * block, the embeddings, a CNN stage; indices are this nt_params' unit indices). They are where
 * data parallelism gathers sharded parameters and reduces gradients; at one rank there is
 * nothing to do, so a NULL hooks pointer or a NULL member is a no-op. Every call only enqueues
 * work on the context's streams (no host synchronization), so the micro-step stays capturable
 * as a CUDA graph.
 *   before_forward(u)   unit u's compute parameters are about to be read by its forward
 *   before_backward(u)  ... by its backward
 *   grads_ready(u)      unit u's gradient buffer is final for this micro-step; called as soon as
 *                       its backward is enqueued, in the order the backward finishes units
 *                       (last unit first) */
typedef struct nt_unit_hooks {
  void *arg;
  nt_status (*before_forward)(nt_ctx *ctx, void *arg, int unit);
  nt_status (*before_backward)(nt_ctx *ctx, void *arg, int unit);
  nt_status (*grads_ready)(nt_ctx *ctx, void *arg, int unit);
} nt_unit_hooks;

/* Call the hook when hooks and the member are set (else NT_OK). */
nt_status nt_unit_before_forward(nt_ctx *ctx, const nt_unit_hooks *h, int unit);
nt_status nt_unit_before_backward(nt_ctx *ctx, const nt_unit_hooks *h, int unit);
nt_status nt_unit_grads_ready(nt_ctx *ctx, const nt_unit_hooks *h, int unit);

/* Activation arena: record tensors (shapes), then allocate one block and point them into it. */
typedef struct {
  nt_tensor **slots;
  int n, cap;
  size_t bytes;
  void *base;
} nt_arena;

nt_status nt_arena_add(nt_ctx *ctx, nt_arena *a, nt_tensor *t, nt_dtype dt, int ndim,
                       const int64_t *shape);
nt_status nt_arena_alloc(nt_ctx *ctx, nt_arena *a);
void nt_arena_free(nt_ctx *ctx, nt_arena *a);

/* A contiguous view of the first elements of `t` with a new shape (runtime batch/sequence
 * sizes smaller than the allocated ones). The caller guarantees numel(shape) <= numel(t). */
nt_tensor nt_prefix_view(const nt_tensor *t, int ndim, const int64_t *shape);

NT_EXTERN_C_END
#endif
