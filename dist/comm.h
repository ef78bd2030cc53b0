/* Communicators: the collectives sharded data parallel needs, over three backends behind one
 * interface.
 *
 *   LOCAL  world 1; every collective is a no-op (in place) or a copy. Needs neither MPI nor NCCL.
 *   MPI    host tensors directly; device tensors staged through a pinned host buffer (a
 *          device-to-host copy that synchronizes the compute stream, the MPI call, a
 *          host-to-device copy on the compute stream). This is how several ranks share one GPU,
 *          which NCCL refuses. F16/BF16 SUM and MAX are computed in F32 (the buffer is widened
 *          on the host, reduced as MPI_FLOAT, rounded back once), so MPI's 16-bit results are
 *          at least as accurate as NCCL's. All-gather and broadcast move the bytes unchanged.
 *          Every call is non-blocking (MPI_I*) and polled with MPI_Test against the timeout;
 *          the communicator uses MPI_ERRORS_RETURN.
 *   NCCL   device tensors, on the communicator's own stream: each collective first waits (an
 *          event) for the work queued so far on the compute stream, then runs on the
 *          communication stream; nt_comm_wait_seq makes the compute stream wait for it. The
 *          communicator is non-blocking (ncclCommInitRankConfig, blocking = 0): every call
 *          that reports ncclInProgress is polled with ncclCommGetAsyncError against the
 *          timeout, and on a timeout or an error the communicator is aborted (ncclCommAbort).
 *
 * Reductions are SUM or MAX only: means are the caller's (fold 1/N into the unscale; NCCL's
 * AVG is avoided on purpose). Collectives work on contiguous F32/F16/BF16 tensors; counts are
 * elements. Reduce-scatter and all-gather follow NCCL's layout: the full buffer holds
 * world * n elements and rank r owns [r * n, (r + 1) * n); passing the owned slice of the full
 * buffer as the shard makes them in place.
 *
 * Errors never hang: a collective that does not complete within timeout_s returns NT_ERR_NCCL
 * with "rank R: <collective> #K (n x dtype) did not complete within T s". After any error the
 * program should call nt_comm_abort (which ends the job for MPI) and exit non-zero.
 *
 * Consistency checks: nt_comm_check_config compares a hash of a caller-given byte string (the
 * configuration) across ranks; with `fingerprint` on, every collective's (kind, op, count,
 * dtype, root) is folded into a running hash that nt_comm_check_fingerprint compares across
 * ranks (call it at step boundaries): a rank that issues a different sequence of collectives
 * is named instead of deadlocking the others. */
#ifndef NT_DIST_COMM_H
#define NT_DIST_COMM_H
#include <stdint.h>
#include <stdbool.h>
#include "core/nt.h"
#include "dist/launch.h"
NT_EXTERN_C_BEGIN

typedef enum { NT_COMM_LOCAL = 0, NT_COMM_MPI, NT_COMM_NCCL } nt_comm_backend;
typedef enum { NT_REDUCE_SUM = 0, NT_REDUCE_MAX } nt_reduce_op;
typedef enum {
  NT_COLL_ALL_REDUCE = 0, NT_COLL_REDUCE_SCATTER, NT_COLL_ALL_GATHER, NT_COLL_BROADCAST,
  NT_COLL_BARRIER, NT_COLL_BYTES_GATHER
} nt_coll_kind;

#define NT_DIST_DEFAULT_TIMEOUT_S 300.0

typedef struct {
  nt_comm_backend backend;
  const nt_dist_launch *launch;  /* rank, world, local rank; the NCCL id bootstrap (MPI or TCP) */
  double timeout_s;              /* every blocking wait; default NT_DIST_DEFAULT_TIMEOUT_S */
  bool fingerprint;              /* debug: hash the sequence of collectives */
} nt_comm_options;

typedef struct nt_comm nt_comm;

bool nt_comm_backend_parse(const char *s, nt_comm_backend *out);   /* local, mpi, nccl */
const char *nt_comm_backend_name(nt_comm_backend b);
const char *nt_coll_name(nt_coll_kind k);

/* LOCAL needs launch->world == 1 (launch may be NULL). MPI needs MPI initialised
 * (nt_dist_mpi_init). NCCL needs a CUDA context (its device is used) and, for world > 1, the
 * launcher's bootstrap. NT_ERR_UNSUPPORTED when the backend is not compiled in. */
nt_status nt_comm_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm **out);
void nt_comm_free(nt_ctx *ctx, nt_comm *c);                  /* NULL is a no-op */
/* Ends the job after an error: ncclCommAbort / MPI_Abort (which does not return). */
void nt_comm_abort(nt_ctx *ctx, nt_comm *c);

int nt_comm_rank(const nt_comm *c);
int nt_comm_world(const nt_comm *c);
nt_comm_backend nt_comm_backend_of(const nt_comm *c);
/* The communication stream (cudaStream_t as void*); NULL when collectives run on the host. */
void *nt_comm_stream(const nt_comm *c);
/* Collectives issued so far; collective k (1-based) is complete on the device once the
 * compute stream has waited with nt_comm_wait_seq(k). */
int64_t nt_comm_seq(const nt_comm *c);

/* In place on t (contiguous, numel elements). */
nt_status nt_comm_all_reduce(nt_comm *c, nt_ctx *ctx, nt_tensor *t, nt_reduce_op op);
/* SUM: full holds world * n elements, shard n elements (shard may be full's slice at rank * n:
 * in place). Afterwards shard = sum over ranks of full[rank * n, (rank + 1) * n). full's other
 * elements are left unspecified. Dtypes must match. */
nt_status nt_comm_reduce_scatter(nt_comm *c, nt_ctx *ctx, const nt_tensor *full,
                                 nt_tensor *shard);
/* full[r * n, (r + 1) * n) = shard of rank r, for every r (shard may be full's own slice). */
nt_status nt_comm_all_gather(nt_comm *c, nt_ctx *ctx, const nt_tensor *shard, nt_tensor *full);
nt_status nt_comm_broadcast(nt_comm *c, nt_ctx *ctx, nt_tensor *t, int root);
/* Host barrier (waits, bounded by the timeout). */
nt_status nt_comm_barrier(nt_comm *c, nt_ctx *ctx);

/* The compute stream waits (no host sync) for collective `seq` and everything issued before
 * it; seq <= 0 or a host backend: nothing to do. */
nt_status nt_comm_wait_seq(nt_comm *c, nt_ctx *ctx, int64_t seq);
/* The host waits for every collective issued so far, bounded by the timeout. */
nt_status nt_comm_synchronize(nt_comm *c, nt_ctx *ctx);

/* Gathers `n` host bytes from every rank into all[world * n] (synchronous, bounded). */
nt_status nt_comm_gather_bytes(nt_comm *c, nt_ctx *ctx, const void *mine, size_t n, void *all);
/* Fails with NT_ERR_INVALID_ARG, naming the first rank that differs from rank 0, when the
 * ranks' configuration strings differ (compared by a 64-bit FNV-1a hash). */
nt_status nt_comm_check_config(nt_comm *c, nt_ctx *ctx, const void *config, size_t n);
/* With `fingerprint` on: compares the running hash of the collectives issued since the start
 * across ranks (NT_ERR_STATE naming the first rank that differs); else a no-op. */
nt_status nt_comm_check_fingerprint(nt_comm *c, nt_ctx *ctx);

/* 64-bit FNV-1a, continuing from h (start with NT_FNV_OFFSET). */
#define NT_FNV_OFFSET 14695981039346656037ULL
uint64_t nt_fnv1a(uint64_t h, const void *bytes, size_t n);

NT_EXTERN_C_END
#endif
