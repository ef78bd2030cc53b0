/* What the communicator backends share with the generic layer (dist/comm.c). Not public. */
#ifndef NT_DIST_COMM_INTERNAL_H
#define NT_DIST_COMM_INTERNAL_H
#include "dist/comm.h"

/* One collective, already checked by the generic layer.
 *   ALL_REDUCE, BROADCAST: in place on recv (count elements).
 *   REDUCE_SCATTER: send = full (world * count), recv = shard (count; may alias full's slice).
 *   ALL_GATHER: send = shard (count), recv = full (world * count); send may alias full's slice.
 *   BYTES_GATHER: host bytes, send (count), recv (world * count); dtype U8.
 *   BARRIER: no data. */
typedef struct {
  nt_coll_kind kind;
  nt_reduce_op op;
  nt_dtype dtype;
  const void *send;
  void *recv;
  int64_t count;
  int root;
  bool device;          /* the buffers are device memory */
  char what[112];       /* "all_reduce #12 (1024 x f32)" for messages */
} nt_coll_args;

typedef struct {
  nt_status (*collective)(nt_comm *c, nt_ctx *ctx, const nt_coll_args *a);
  nt_status (*wait_seq)(nt_comm *c, nt_ctx *ctx, int64_t seq);     /* may be NULL */
  nt_status (*synchronize)(nt_comm *c, nt_ctx *ctx);               /* may be NULL */
  void (*abort)(nt_comm *c, nt_ctx *ctx);
  void (*destroy)(nt_comm *c, nt_ctx *ctx);
} nt_comm_vtable;

struct nt_comm {
  const nt_comm_vtable *vt;
  nt_comm_backend backend;
  int rank, world;
  double timeout_s;
  bool fingerprint;
  uint64_t fp_hash;
  int64_t seq;
  void *stream;         /* communication stream, or NULL */
  void *impl;           /* the backend's state */
  uint64_t *hashes;     /* world entries: the hash comparisons' gather (allocated with c, so
                         * that no rank stays out of it for want of host memory) */
};

/* Monotonic seconds. */
double nt_dist_now(void);
/* Sleeps a little longer each time (20 us doubling up to 1 ms) while polling. */
void nt_dist_backoff(int *round);
/* NT_ERR_NCCL "rank R: <what> did not complete within T s (<hint>)". */
nt_status nt_comm_timeout_error(nt_comm *c, nt_ctx *ctx, const char *what, const char *hint);

#ifdef NT_HAVE_MPI
nt_status nt_comm_mpi_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm *c);
/* Broadcasts n bytes from rank 0 of MPI_COMM_WORLD (the NCCL id), bounded by timeout_s. */
nt_status nt_mpi_bcast_world(nt_ctx *ctx, void *buf, size_t n, double timeout_s);
#endif
#ifdef NT_HAVE_NCCL
nt_status nt_comm_nccl_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm *c);
#endif
#endif
