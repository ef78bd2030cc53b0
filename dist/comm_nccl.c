/* The NCCL backend (compiled when libnccl is found: NT_HAVE_NCCL). Device tensors only.
 *
 * Ordering: before each collective an event recorded on the compute stream makes the
 * communication stream wait for everything queued so far; after it, an event from a ring of
 * NT_NCCL_RING is recorded on the communication stream, and nt_comm_wait_seq makes the compute
 * stream wait for that event. An older slot re-recorded by a later collective only makes the
 * wait stronger (it covers the later work too).
 *
 * Failure handling: the communicator is non-blocking (blocking = 0). Calls that answer
 * ncclInProgress are polled with ncclCommGetAsyncError against the timeout; host waits
 * (nt_comm_synchronize, the byte gathers, the barrier) poll the stream's event and the
 * communicator's asynchronous error together. A timeout or an error aborts the communicator
 * (ncclCommAbort), so kernels blocked on a dead peer are released.
 *
 * CUDA graphs: while the compute stream is being captured (cudaStreamIsCapturing) the backend
 * only enqueues: the communication stream joins the capture through the `ready` event, the
 * collective and its `done` event are captured, and nothing polls a stream or an event (which
 * a capture forbids). A non-blocking call that answers ncclInProgress is still waited out with
 * ncclCommGetAsyncError, a host-side read of the communicator's state: the collective must be
 * enqueued before its `done` event is recorded behind it. Host collectives (barrier, byte
 * gathers) are refused during a capture. Two kinds of waits are skipped rather than made
 * illegal: inside a capture, a wait for a collective issued before the capture began (the step
 * waited for those eagerly already); outside, a wait for a collective recorded inside a
 * capture (its ring slot holds a captured event, which only the graph may wait on; the graph,
 * launched on the compute stream, joins its collectives itself). A host wait on such a slot
 * polls an event recorded on the compute stream instead. */
#ifdef NT_HAVE_NCCL
#include "dist/comm_internal.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NT_NCCL_RING 64

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ready;               /* compute stream -> communication stream */
  cudaEvent_t done[NT_NCCL_RING];  /* after collective k: slot k % NT_NCCL_RING */
  void *scratch;                   /* device bytes for host-side gathers and the barrier */
  size_t scratch_bytes;
  int device;
  bool comm_ok, aborted;
  bool captured[NT_NCCL_RING];     /* slot last recorded inside a stream capture */
  int64_t capture_base;            /* capturing: the last collective issued before it; -1 not */
} nccl_impl;

/* Whether the context's compute stream is being captured into a CUDA graph; tracks where the
 * capture began: collectives after capture_base belong to it (issued: the last collective
 * issued before the caller's own). */
static bool capturing(nt_comm *c, nt_ctx *ctx, int64_t issued) {
  nccl_impl *m = c->impl;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)nt_ctx_stream(ctx), &cs) != cudaSuccess)
    cs = cudaStreamCaptureStatusNone;
  bool on = cs == cudaStreamCaptureStatusActive;
  if (on && m->capture_base < 0) m->capture_base = issued;
  if (!on) m->capture_base = -1;
  return on;
}

static void nccl_abort(nt_comm *c, nt_ctx *ctx) {
  (void)ctx;
  nccl_impl *m = c->impl;
  if (m && m->comm_ok && !m->aborted) {
    ncclCommAbort(m->comm);
    m->aborted = true;
  }
}

static nt_status cuda_fail(nt_comm *c, nt_ctx *ctx, cudaError_t e, const char *what) {
  return NT_ERROR(ctx, NT_ERR_CUDA, "rank %d: %s: %s", c->rank, what, cudaGetErrorString(e));
}

/* Waits out ncclInProgress; any other error (or the timeout) aborts the communicator. */
static nt_status nccl_settle(nt_comm *c, nt_ctx *ctx, ncclResult_t res, const char *what) {
  nccl_impl *m = c->impl;
  double deadline = nt_dist_now() + c->timeout_s;
  int round = 0;
  while (res == ncclInProgress) {
    if (nt_dist_now() > deadline) {
      nt_status st = nt_comm_timeout_error(c, ctx, what, "NCCL call still in progress");
      nccl_abort(c, ctx);
      return st;
    }
    nt_dist_backoff(&round);
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(m->comm, &async);
    res = q != ncclSuccess ? q : async;
  }
  if (res == ncclSuccess) return NT_OK;
  const char *last = m->comm_ok ? ncclGetLastError(m->comm) : "";
  nt_status st = NT_ERROR(ctx, NT_ERR_NCCL, "rank %d: %s: %s%s%s", c->rank, what,
                          ncclGetErrorString(res), last && *last ? ": " : "", last ? last : "");
  nccl_abort(c, ctx);
  return st;
}

/* The host waits for the communication stream's work up to `ev`, watching for NCCL errors. */
static nt_status nccl_wait_event(nt_comm *c, nt_ctx *ctx, cudaEvent_t ev, const char *what) {
  nccl_impl *m = c->impl;
  double deadline = nt_dist_now() + c->timeout_s;
  int round = 0;
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return NT_OK;
    if (e != cudaErrorNotReady) return cuda_fail(c, ctx, e, what);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) return nccl_settle(c, ctx, async, what);
    if (nt_dist_now() > deadline) {
      nt_status st = nt_comm_timeout_error(c, ctx, what, "a peer rank died, stalled or issued "
                                                         "another collective");
      nccl_abort(c, ctx);
      return st;
    }
    nt_dist_backoff(&round);
  }
}

static nt_status scratch_of(nt_comm *c, nt_ctx *ctx, size_t bytes) {
  nccl_impl *m = c->impl;
  if (bytes <= m->scratch_bytes) return NT_OK;
  if (m->scratch) cudaFree(m->scratch);
  m->scratch = NULL;
  m->scratch_bytes = 0;
  cudaError_t e = cudaMalloc(&m->scratch, bytes);
  if (e != cudaSuccess) return cuda_fail(c, ctx, e, "NCCL scratch allocation");
  m->scratch_bytes = bytes;
  return NT_OK;
}

static ncclDataType_t nccl_type(nt_dtype dt) {
  return dt == NT_F32 ? ncclFloat32 : dt == NT_F16 ? ncclFloat16 : dt == NT_BF16 ? ncclBfloat16
                                                                                 : ncclUint8;
}

static nt_status nccl_collective(nt_comm *c, nt_ctx *ctx, const nt_coll_args *a) {
  nccl_impl *m = c->impl;
  if (m->aborted)
    return NT_ERROR(ctx, NT_ERR_NCCL, "rank %d: %s on an aborted communicator", c->rank, a->what);
  bool host = a->kind == NT_COLL_BYTES_GATHER || a->kind == NT_COLL_BARRIER;
  if (!host && !a->device)
    return NT_ERROR(ctx, NT_ERR_DEVICE, "rank %d: the NCCL backend takes device tensors (%s)",
                    c->rank, a->what);
  bool in_capture = capturing(c, ctx, c->seq - 1);
  if (host && in_capture)
    return NT_ERROR(ctx, NT_ERR_STATE, "rank %d: %s waits on the host: not allowed while the "
                    "compute stream is captured into a CUDA graph", c->rank, a->what);
  cudaStream_t compute = (cudaStream_t)nt_ctx_stream(ctx), s = m->stream;
  cudaError_t e = cudaEventRecord(m->ready, compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s, m->ready, 0);
  if (e != cudaSuccess) return cuda_fail(c, ctx, e, a->what);
  size_t n = (size_t)a->count;
  ncclDataType_t dt = nccl_type(a->dtype);
  ncclRedOp_t op = a->op == NT_REDUCE_MAX ? ncclMax : ncclSum;
  ncclResult_t res = ncclSuccess;
  nt_status st = NT_OK;
  switch (a->kind) {
  case NT_COLL_ALL_REDUCE:
    res = ncclAllReduce(a->send, a->recv, n, dt, op, m->comm, s);
    break;
  case NT_COLL_REDUCE_SCATTER:
    res = ncclReduceScatter(a->send, a->recv, n, dt, ncclSum, m->comm, s);
    break;
  case NT_COLL_ALL_GATHER:
    res = ncclAllGather(a->send, a->recv, n, dt, m->comm, s);
    break;
  case NT_COLL_BROADCAST:
    res = ncclBroadcast(a->send, a->recv, n, dt, a->root, m->comm, s);
    break;
  case NT_COLL_BARRIER:
    if ((st = scratch_of(c, ctx, sizeof(float)))) return st;
    res = ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->comm, s);
    break;
  case NT_COLL_BYTES_GATHER: {
    size_t total = n * (size_t)c->world;
    if ((st = scratch_of(c, ctx, total + n))) return st;
    char *all = m->scratch, *mine = all + total;
    e = cudaMemcpyAsync(mine, a->send, n, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) return cuda_fail(c, ctx, e, a->what);
    res = ncclAllGather(mine, all, n, ncclUint8, m->comm, s);
    if (res == ncclSuccess || res == ncclInProgress) {
      if ((st = nccl_settle(c, ctx, res, a->what))) return st;
      res = ncclSuccess;
      e = cudaMemcpyAsync(a->recv, all, total, cudaMemcpyDeviceToHost, s);
      if (e != cudaSuccess) return cuda_fail(c, ctx, e, a->what);
    }
    break;
  }
  }
  if ((st = nccl_settle(c, ctx, res, a->what))) return st;
  cudaEvent_t done = m->done[c->seq % NT_NCCL_RING];
  if ((e = cudaEventRecord(done, s)) != cudaSuccess) return cuda_fail(c, ctx, e, a->what);
  m->captured[c->seq % NT_NCCL_RING] = in_capture;
  return host ? nccl_wait_event(c, ctx, done, a->what) : NT_OK;
}

static nt_status nccl_wait_seq(nt_comm *c, nt_ctx *ctx, int64_t seq) {
  nccl_impl *m = c->impl;
  int slot = (int)(seq % NT_NCCL_RING);
  bool in_capture = capturing(c, ctx, c->seq);
  if (in_capture ? seq <= m->capture_base : m->captured[slot]) return NT_OK;   /* see above */
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)nt_ctx_stream(ctx), m->done[slot], 0);
  return e == cudaSuccess ? NT_OK : cuda_fail(c, ctx, e, "waiting for a collective");
}

static nt_status nccl_synchronize(nt_comm *c, nt_ctx *ctx) {
  nccl_impl *m = c->impl;
  if (c->seq == 0) return NT_OK;
  char what[64];
  snprintf(what, sizeof what, "collectives up to #%lld", (long long)c->seq);
  if (capturing(c, ctx, c->seq))
    return NT_ERROR(ctx, NT_ERR_STATE, "rank %d: waiting on the host for %s while the compute "
                    "stream is captured into a CUDA graph", c->rank, what);
  int slot = (int)(c->seq % NT_NCCL_RING);
  if (!m->captured[slot]) return nccl_wait_event(c, ctx, m->done[slot], what);
  /* the last collective ran inside a graph, which the compute stream launched: wait for that */
  cudaError_t e = cudaEventRecord(m->ready, (cudaStream_t)nt_ctx_stream(ctx));
  return e == cudaSuccess ? nccl_wait_event(c, ctx, m->ready, what)
                          : cuda_fail(c, ctx, e, what);
}

static void nccl_destroy(nt_comm *c, nt_ctx *ctx) {
  nccl_impl *m = c->impl;
  if (!m) return;
  /* An aborted communicator's resources are already gone (ncclCommAbort frees them). A
   * failing finalize aborts it too; its message is dropped (destruction reports nothing). */
  if (m->comm_ok && !m->aborted) {
    if (nccl_settle(c, ctx, ncclCommFinalize(m->comm), "ncclCommFinalize")) nt_clear_error(ctx);
    if (!m->aborted && nccl_settle(c, ctx, ncclCommDestroy(m->comm), "ncclCommDestroy"))
      nt_clear_error(ctx);
  }
  for (int i = 0; i < NT_NCCL_RING; i++)
    if (m->done[i]) cudaEventDestroy(m->done[i]);
  if (m->ready) cudaEventDestroy(m->ready);
  if (m->stream) cudaStreamDestroy(m->stream);
  if (m->scratch) cudaFree(m->scratch);
  free(m);
  c->impl = NULL;
}

static const nt_comm_vtable nccl_vt = {nccl_collective, nccl_wait_seq, nccl_synchronize,
                                       nccl_abort, nccl_destroy};

/* Rank 0's unique id reaches every rank: MPI_Bcast under mpirun, else the TCP bootstrap. */
static nt_status share_id(nt_ctx *ctx, const nt_comm_options *opt, ncclUniqueId *id) {
  const nt_dist_launch *l = opt->launch;
  if (!l || l->world == 1) return NT_OK;
  double t = opt->timeout_s > 0 ? opt->timeout_s : NT_DIST_DEFAULT_TIMEOUT_S;
  if (l->kind == NT_LAUNCH_MPI) {
#ifdef NT_HAVE_MPI
    return nt_mpi_bcast_world(ctx, id, sizeof *id, t);
#else
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "launched by mpirun but MPI is not compiled in");
#endif
  }
  return nt_dist_bootstrap_bytes(ctx, l, id, sizeof *id, t);
}

nt_status nt_comm_nccl_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm *c) {
  if (!nt_ctx_is_cuda(ctx))
    return NT_ERROR(ctx, NT_ERR_DEVICE, "the NCCL backend needs a CUDA context");
  nccl_impl *m = calloc(1, sizeof *m);
  if (!m) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the NCCL communicator");
  c->impl = m;
  c->vt = &nccl_vt;
  m->device = nt_ctx_device(ctx).index;
  m->capture_base = -1;
  nt_status st = NT_OK;
  cudaError_t e = cudaSetDevice(m->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
  for (int i = 0; i < NT_NCCL_RING && e == cudaSuccess; i++)
    e = cudaEventCreateWithFlags(&m->done[i], cudaEventDisableTiming);
  if (e != cudaSuccess) st = cuda_fail(c, ctx, e, "NCCL communicator setup");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (!st && c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      st = NT_ERROR(ctx, NT_ERR_NCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  }
  if (!st) st = share_id(ctx, opt, &id);
  if (!st) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&m->comm, c->world, id, c->rank, &cfg);
    m->comm_ok = r == ncclSuccess || r == ncclInProgress;
    st = nccl_settle(c, ctx, r, "ncclCommInitRankConfig");
  }
  c->stream = m->stream;
  if (st) {
    nt_status keep = st;
    nccl_destroy(c, ctx);
    c->vt = NULL;
    return keep;
  }
  return NT_OK;
}
#else
typedef int nt_comm_nccl_not_built;
#endif
