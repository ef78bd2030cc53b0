/* The MPI backend (compiled when CMake finds MPI: NT_HAVE_MPI). Host buffers go to MPI as they
 * are; device buffers are staged through pinned host memory. Every collective is a
 * non-blocking MPI call polled with MPI_Test against the communicator's timeout, so a dead or
 * stalled peer turns into an error naming this rank and the collective instead of a hang.
 * F16/BF16 reductions are widened to F32 on the host, reduced as MPI_FLOAT and rounded back. */
#ifdef NT_HAVE_MPI
#include "dist/comm_internal.h"
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  MPI_Comm comm;
  void *stage;          /* pinned host staging for device buffers */
  size_t stage_bytes;
  float *wide;          /* F32 scratch for 16-bit reductions */
  size_t wide_bytes;
  void *out;            /* host scratch for an out-of-place reduce-scatter result */
  size_t out_bytes;
} mpi_impl;

static nt_status mpi_fail(nt_comm *c, nt_ctx *ctx, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return NT_ERROR(ctx, NT_ERR_NCCL, "rank %d: MPI error in %s: %s", c->rank, what, msg);
}

static nt_status wait_req(nt_comm *c, nt_ctx *ctx, MPI_Request *req, const char *what) {
  double deadline = nt_dist_now() + c->timeout_s;
  int round = 0;
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(c, ctx, rc, what);
    if (done) return NT_OK;
    if (nt_dist_now() > deadline)
      return nt_comm_timeout_error(c, ctx, what, "a peer rank died, stalled or issued another "
                                                 "collective");
    nt_dist_backoff(&round);
  }
}

static nt_status grow(nt_ctx *ctx, void **buf, size_t *have, size_t need, bool pinned) {
  if (need <= *have) return NT_OK;
  if (pinned) {
    nt_pinned_free(ctx, *buf);
    *buf = NULL;
    *have = 0;
    nt_status st = nt_pinned_alloc(ctx, need, buf);
    if (st) return st;
  } else {
    void *p = realloc(*buf, need);
    if (!p) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory (%zu bytes) for MPI", need);
    *buf = p;
  }
  *have = need;
  return NT_OK;
}

static MPI_Datatype mpi_type(nt_dtype dt) {
  return dt == NT_F32 ? MPI_FLOAT : dt == NT_U8 ? MPI_BYTE : MPI_UINT16_T;
}

static void widen(float *dst, const void *src, int64_t n, nt_dtype dt) {
  const uint16_t *s = src;
  for (int64_t i = 0; i < n; i++)
    dst[i] = dt == NT_F16 ? nt_f16_to_f32(s[i]) : nt_bf16_to_f32(s[i]);
}

static void narrow(void *dst, const float *src, int64_t n, nt_dtype dt) {
  uint16_t *d = dst;
  for (int64_t i = 0; i < n; i++)
    d[i] = dt == NT_F16 ? nt_f32_to_f16(src[i]) : nt_f32_to_bf16(src[i]);
}

/* The collective on host buffers (the a->device flag is ignored here). */
static nt_status host_collective(nt_comm *c, nt_ctx *ctx, const nt_coll_args *a) {
  mpi_impl *m = c->impl;
  int n = (int)a->count, W = c->world;
  size_t es = nt_dtype_size(a->dtype);
  bool reduce = a->kind == NT_COLL_ALL_REDUCE || a->kind == NT_COLL_REDUCE_SCATTER;
  bool wide = reduce && a->dtype != NT_F32;
  MPI_Op op = a->op == NT_REDUCE_MAX ? MPI_MAX : MPI_SUM;
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  nt_status st = NT_OK;
  switch (a->kind) {
  case NT_COLL_ALL_REDUCE:
    if (wide) {
      if ((st = grow(ctx, (void **)&m->wide, &m->wide_bytes, (size_t)n * 4, false))) return st;
      widen(m->wide, a->recv, n, a->dtype);
      rc = MPI_Iallreduce(MPI_IN_PLACE, m->wide, n, MPI_FLOAT, op, m->comm, &req);
    } else {
      rc = MPI_Iallreduce(MPI_IN_PLACE, a->recv, n, MPI_FLOAT, op, m->comm, &req);
    }
    break;
  case NT_COLL_REDUCE_SCATTER: {
    /* Out of place into scratch, then copied to the shard (which may alias the input). */
    size_t total = (size_t)n * (size_t)W;
    if ((st = grow(ctx, &m->out, &m->out_bytes, (size_t)n * 4, false))) return st;
    const void *send = a->send;
    if (wide) {
      if ((st = grow(ctx, (void **)&m->wide, &m->wide_bytes, total * 4, false))) return st;
      widen(m->wide, a->send, (int64_t)total, a->dtype);
      send = m->wide;
    }
    rc = MPI_Ireduce_scatter_block(send, m->out, n, wide ? MPI_FLOAT : mpi_type(a->dtype), op,
                                   m->comm, &req);
    break;
  }
  case NT_COLL_ALL_GATHER:
  case NT_COLL_BYTES_GATHER: {
    char *own = (char *)a->recv + (size_t)c->rank * (size_t)n * es;
    if (a->send != own) memmove(own, a->send, (size_t)n * es);
    rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a->recv, n, mpi_type(a->dtype),
                        m->comm, &req);
    break;
  }
  case NT_COLL_BROADCAST:
    rc = MPI_Ibcast(a->recv, n, mpi_type(a->dtype), a->root, m->comm, &req);
    break;
  case NT_COLL_BARRIER:
    rc = MPI_Ibarrier(m->comm, &req);
    break;
  }
  if (rc != MPI_SUCCESS) return mpi_fail(c, ctx, rc, a->what);
  if ((st = wait_req(c, ctx, &req, a->what))) return st;
  if (a->kind == NT_COLL_ALL_REDUCE && wide) narrow(a->recv, m->wide, n, a->dtype);
  if (a->kind == NT_COLL_REDUCE_SCATTER) {
    if (wide)
      narrow(a->recv, m->out, n, a->dtype);
    else
      memcpy(a->recv, m->out, (size_t)n * es);
  }
  return NT_OK;
}

static nt_status copy_bytes(nt_ctx *ctx, void *dst, bool dst_dev, const void *src, bool src_dev,
                            size_t bytes) {
  int64_t n = (int64_t)bytes;
  nt_tensor d = nt_tensor_view(dst, NT_U8, dst_dev ? nt_ctx_device(ctx) : nt_cpu(), 1, &n);
  nt_tensor s = nt_tensor_view((void *)src, NT_U8, src_dev ? nt_ctx_device(ctx) : nt_cpu(), 1, &n);
  return nt_tensor_copy(ctx, &d, &s);
}

/* Device buffers: the full extent goes through the pinned stage. The device-to-host copy
 * synchronizes the compute stream, so the stage is free again when the next collective
 * starts (the host-to-device copy of the previous one is ordered before it on that stream). */
static nt_status mpi_collective(nt_comm *c, nt_ctx *ctx, const nt_coll_args *a) {
  mpi_impl *m = c->impl;
  if (a->count > INT_MAX / (c->world > 0 ? c->world : 1))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "rank %d: %s is too large for one MPI call", c->rank,
                    a->what);
  if (!a->device || a->kind == NT_COLL_BARRIER || a->kind == NT_COLL_BYTES_GATHER)
    return host_collective(c, ctx, a);
  size_t es = nt_dtype_size(a->dtype), n = (size_t)a->count, W = (size_t)c->world;
  bool full_in = a->kind == NT_COLL_REDUCE_SCATTER, full_out = a->kind == NT_COLL_ALL_GATHER;
  size_t bytes = (full_in || full_out ? W * n : n) * es;
  nt_status st = grow(ctx, &m->stage, &m->stage_bytes, bytes ? bytes : 1, true);
  if (st) return st;
  nt_coll_args h = *a;
  h.device = false;
  char *stage = m->stage;
  if (full_out) {
    char *own = stage + (size_t)c->rank * n * es;
    if ((st = copy_bytes(ctx, own, false, a->send, true, n * es))) return st;
    h.send = own;
    h.recv = stage;
  } else {
    if ((st = copy_bytes(ctx, stage, false, full_in ? a->send : a->recv, true, bytes))) return st;
    h.send = stage;
    h.recv = stage;   /* reduce-scatter: the result lands in the stage's first n elements */
  }
  if ((st = host_collective(c, ctx, &h))) return st;
  return copy_bytes(ctx, a->recv, true, stage, false, full_in ? n * es : bytes);
}

static void mpi_abort(nt_comm *c, nt_ctx *ctx) {
  (void)ctx;
  MPI_Abort(((mpi_impl *)c->impl)->comm, 1);
}

static void mpi_destroy(nt_comm *c, nt_ctx *ctx) {
  mpi_impl *m = c->impl;
  if (!m) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&m->comm);
  nt_pinned_free(ctx, m->stage);
  free(m->wide);
  free(m->out);
  free(m);
  c->impl = NULL;
}

static const nt_comm_vtable mpi_vt = {mpi_collective, NULL, NULL, mpi_abort, mpi_destroy};

nt_status nt_comm_mpi_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm *c) {
  (void)opt;
  int init = 0, rank = 0, size = 0;
  MPI_Initialized(&init);
  if (!init)
    return NT_ERROR(ctx, NT_ERR_STATE, "the MPI backend needs MPI initialised (nt_dist_mpi_init)");
  mpi_impl *m = calloc(1, sizeof *m);
  if (!m) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the MPI communicator");
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &size);
  c->impl = m;
  c->vt = &mpi_vt;
  if (rc != MPI_SUCCESS) {
    nt_status st = mpi_fail(c, ctx, rc, "communicator creation");
    mpi_destroy(c, ctx);
    return st;
  }
  if (rank != c->rank || size != c->world) {
    mpi_destroy(c, ctx);
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "MPI says rank %d of %d but the launch says rank %d of %d", rank, size,
                    c->rank, c->world);
  }
  return NT_OK;
}

nt_status nt_mpi_bcast_world(nt_ctx *ctx, void *buf, size_t n, double timeout_s) {
  nt_comm tmp;
  memset(&tmp, 0, sizeof tmp);
  MPI_Comm_rank(MPI_COMM_WORLD, &tmp.rank);
  tmp.timeout_s = timeout_s;
  MPI_Request req;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(&tmp, ctx, rc, "the NCCL id broadcast");
  return wait_req(&tmp, ctx, &req, "the NCCL id broadcast");
}
#else
typedef int nt_comm_mpi_not_built;
#endif
