/* The data loader: torch.utils.data.DataLoader + DistributedSampler semantics and names
 * (docs/semantics.md), with worker threads filling pinned host slots and, for a CUDA context, the
 * copy stream moving each batch to the device without host synchronization.
 *
 * Data path for a CUDA context:
 *   worker threads fill a free host slot (pinned when pin_memory) with batch b;
 *   nt_loader_next (the consumer) takes the slot of the next batch in order, makes the copy
 *   stream wait until compute has released the device buffer it will overwrite (a ring of
 *   device_buffers >= 2), issues cudaMemcpyAsync on the copy stream, records the slot's copy
 *   event and makes the compute stream wait on it. The slot goes back to the workers only
 *   after that event has completed (queried, never waited on, unless the loader has nothing
 *   else to give and must wait anyway).
 *   The returned batch is valid for work queued on the compute stream before the next call to
 *   nt_loader_next / nt_loader_release: that call records "compute done" for its device buffer.
 * For a CPU context the batch is the host slot itself (no copy), valid until the next call.
 *
 * Epochs: nt_loader_set_epoch(e) then nt_loader_next until *end; the order comes from
 * seed + epoch (the same on every rank). Without set_epoch every epoch repeats one order (as
 * torch). Workers persist for the loader's lifetime (persistent_workers=True).
 *
 * Batches: num_batches = drop_last ? num_samples / batch_size : ceil(num_samples / batch_size),
 * num_samples per rank as nt_sampler. A batch larger than the dataset is allowed without
 * drop_last (one smaller batch, as torch); with drop_last it would yield nothing and is an
 * NT_ERR_INVALID_ARG at create. An empty dataset is NT_ERR_INVALID_ARG.
 *
 * Slots: num_workers * prefetch_factor batches may be in flight (being filled or ready) plus
 * the one the consumer holds; num_workers 0 loads synchronously inside nt_loader_next.
 *
 * Errors: a sample callback that fails makes nt_loader_next return its status with the
 * message "loader: batch B, sample I (worker W): <callback's message>" once the consumer
 * reaches that batch (earlier batches are delivered first); the epoch ends there. Nothing
 * hangs; nt_loader_free at any point joins the workers and frees everything. */
#ifndef NT_DATA_LOADER_H
#define NT_DATA_LOADER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"
#include "core/tensor.h"
NT_EXTERN_C_BEGIN

#define NT_LOADER_MAX_FIELDS 4

/* One field of a sample (e.g. the image, the label): dtype and per-sample dims (ndim 0 is a
 * scalar, at most NT_MAX_DIMS - 1 so the batch dim fits). */
typedef struct {
  nt_dtype dtype;
  int ndim;
  int64_t shape[NT_MAX_DIMS - 1];
} nt_field_spec;

/* What a sample callback gets besides its destination rows. */
/* Randomness in a sample callback should come from nt_sample_seed(seed, epoch, index)
 * (data/transform.h): the batches are then the same whatever the number of workers. (torch
 * seeds worker w with seed + w instead; info->seed + info->worker gives that stream.) */
typedef struct {
  int64_t index;      /* dataset index */
  uint64_t seed;      /* the loader's seed */
  uint64_t epoch;
  int worker;         /* 0..num_workers-1, or -1 when loading synchronously */
  char *msg;          /* error message buffer (write with nt_sample_fail) */
  size_t msg_len;
} nt_sample_info;

/* Fills sample info->index into dst[f] (one row of each field). Runs on worker threads,
 * concurrently: it must only read shared state. Returns NT_OK or a status with a message. */
typedef nt_status (*nt_sample_fn)(void *user, const nt_sample_info *info, void *const *dst);

typedef struct {
  int64_t len;
  int n_fields;
  nt_field_spec fields[NT_LOADER_MAX_FIELDS];
  nt_sample_fn get;
  void *user;
} nt_dataset;

/* Records a message for the consumer and returns st:
 *   return nt_sample_fail(info, NT_ERR_FORMAT, "%s: bad record %lld", path, (long long)i); */
nt_status nt_sample_fail(const nt_sample_info *info, nt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Bytes of one sample of field f. */
size_t nt_field_row_bytes(const nt_field_spec *f);

typedef struct {
  int64_t batch_size;    /* default 1 */
  bool shuffle;          /* default false */
  uint64_t seed;         /* default 0 */
  bool drop_last;        /* default false */
  int num_workers;       /* default 0: synchronous */
  int prefetch_factor;   /* default 2 (batches in flight per worker) */
  bool pin_memory;       /* default true: page-locked slots for a CUDA context */
  int rank, world_size;  /* default 0, 1 */
  int device_buffers;    /* device batch ring for a CUDA context, >= 2; default 2 */
} nt_loader_opts;

nt_loader_opts nt_loader_default_opts(void);

typedef struct {
  int n_fields;
  nt_tensor field[NT_LOADER_MAX_FIELDS];  /* [size, field dims...] where ctx computes */
  int64_t size;                           /* rows (the last batch may be smaller) */
  int64_t step;                           /* batch number within the epoch */
  uint64_t epoch;
  const int64_t *indices;                 /* the dataset indices of the rows */
} nt_batch;

/* Host-side timing. wait_ns is the time nt_loader_next blocked until the batch was ready in a
 * host slot: starvation when workers are too slow, but also back-pressure when the GPU is
 * behind (every slot is waiting for its copy, and copies wait for compute to release a device
 * buffer). To measure how long compute waited for data, compare a loop's time with and without
 * the loader (bench/bench_loader.c does). */
typedef struct {
  int64_t steps;            /* batches delivered */
  uint64_t wait_ns_total;   /* time nt_loader_next waited for a batch to be ready on the host */
  uint64_t wait_ns_last;
  uint64_t wait_ns_max;
  uint64_t next_ns_total;   /* whole time spent inside nt_loader_next (wait + copy issue) */
} nt_loader_stats;

typedef struct nt_loader nt_loader;

/* The dataset struct is copied; ds->user must outlive the loader. */
nt_status nt_loader_create(nt_ctx *ctx, const nt_dataset *ds, const nt_loader_opts *opts,
                           nt_loader **out);
void nt_loader_free(nt_loader *l);                     /* NULL is a no-op; any time */
/* Sets the epoch of the next iteration; in the middle of an epoch it abandons the rest. */
nt_status nt_loader_set_epoch(nt_loader *l, uint64_t epoch);
/* The next batch of the epoch in order, or *end = true (and out->size 0) after the last one;
 * the call after *end starts the next iteration (same epoch unless set_epoch). */
nt_status nt_loader_next(nt_loader *l, nt_batch *out, bool *end);
/* Releases the held batch early (optional; nt_loader_next does it). */
nt_status nt_loader_release(nt_loader *l);
int64_t nt_loader_num_batches(const nt_loader *l);
int64_t nt_loader_num_samples(const nt_loader *l);    /* per rank per epoch */
void nt_loader_get_stats(const nt_loader *l, nt_loader_stats *out);
void nt_loader_reset_stats(nt_loader *l);

NT_EXTERN_C_END
#endif
