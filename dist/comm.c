/* The generic communicator layer: argument checks, the collective counter, the fingerprint and
 * configuration hashes, and the LOCAL backend (world 1). */
#include "dist/comm_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

double nt_dist_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nt_dist_backoff(int *round) {
  long us = 20L << (*round < 6 ? *round : 6);
  if (us > 1000) us = 1000;
  (*round)++;
  struct timespec ts = {0, us * 1000L};
  nanosleep(&ts, NULL);
}

nt_status nt_comm_timeout_error(nt_comm *c, nt_ctx *ctx, const char *what, const char *hint) {
  return NT_ERROR(ctx, NT_ERR_NCCL, "rank %d: %s did not complete within %.1f s (%s)", c->rank,
                  what, c->timeout_s, hint);
}

uint64_t nt_fnv1a(uint64_t h, const void *bytes, size_t n) {
  const unsigned char *p = bytes;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

bool nt_comm_backend_parse(const char *s, nt_comm_backend *out) {
  static const char *names[] = {"local", "mpi", "nccl"};
  for (int i = 0; i < 3; i++)
    if (!strcasecmp(s, names[i])) {
      *out = (nt_comm_backend)i;
      return true;
    }
  return false;
}

const char *nt_comm_backend_name(nt_comm_backend b) {
  return b == NT_COMM_MPI ? "mpi" : b == NT_COMM_NCCL ? "nccl" : "local";
}

const char *nt_coll_name(nt_coll_kind k) {
  static const char *names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                "broadcast",  "barrier",        "bytes_gather"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* ---- LOCAL: world 1. In-place collectives are no-ops; out-of-place ones copy. ---- */

static nt_status local_collective(nt_comm *c, nt_ctx *ctx, const nt_coll_args *a) {
  (void)c;
  bool moves = a->kind == NT_COLL_REDUCE_SCATTER || a->kind == NT_COLL_ALL_GATHER ||
               a->kind == NT_COLL_BYTES_GATHER;
  if (!moves || a->send == a->recv || a->count == 0) return NT_OK;
  if (a->kind == NT_COLL_BYTES_GATHER) {
    memcpy(a->recv, a->send, (size_t)a->count);
    return NT_OK;
  }
  nt_device dev = a->device ? nt_ctx_device(ctx) : nt_cpu();
  nt_tensor src = nt_tensor_view((void *)a->send, a->dtype, dev, 1, &a->count);
  nt_tensor dst = nt_tensor_view(a->recv, a->dtype, dev, 1, &a->count);
  return nt_tensor_copy(ctx, &dst, &src);
}

static void local_abort(nt_comm *c, nt_ctx *ctx) { (void)c, (void)ctx; }
static void local_destroy(nt_comm *c, nt_ctx *ctx) { (void)c, (void)ctx; }

static const nt_comm_vtable local_vt = {local_collective, NULL, NULL, local_abort, local_destroy};

/* ---- creation ---- */

nt_status nt_comm_create(nt_ctx *ctx, const nt_comm_options *opt, nt_comm **out) {
  *out = NULL;
  nt_comm *c = calloc(1, sizeof *c);
  if (!c) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a communicator");
  c->backend = opt->backend;
  c->rank = opt->launch ? opt->launch->rank : 0;
  c->world = opt->launch ? opt->launch->world : 1;
  c->timeout_s = opt->timeout_s > 0 ? opt->timeout_s : NT_DIST_DEFAULT_TIMEOUT_S;
  c->fingerprint = opt->fingerprint;
  c->fp_hash = NT_FNV_OFFSET;
  nt_status st = NT_OK;
  if (c->world < 1 || c->rank < 0 || c->rank >= c->world) {
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "rank %d of world %d is not a valid rank", c->rank,
                  c->world);
  } else if (!(c->hashes = calloc((size_t)c->world, sizeof *c->hashes))) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a communicator of %d ranks", c->world);
  } else if (opt->backend == NT_COMM_LOCAL) {
    if (c->world != 1)
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "the local backend serves one rank; world %d needs mpi or nccl", c->world);
    c->vt = &local_vt;
  } else if (opt->backend == NT_COMM_MPI) {
#ifdef NT_HAVE_MPI
    st = nt_comm_mpi_create(ctx, opt, c);
#else
    st = NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "the MPI backend is not compiled in (no MPI found)");
#endif
  } else if (opt->backend == NT_COMM_NCCL) {
#ifdef NT_HAVE_NCCL
    st = nt_comm_nccl_create(ctx, opt, c);
#else
    st = NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "the NCCL backend is not compiled in (no NCCL found)");
#endif
  } else {
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "unknown communicator backend %d", (int)opt->backend);
  }
  if (st) {
    free(c->hashes);
    free(c);
    return st;
  }
  *out = c;
  return NT_OK;
}

void nt_comm_free(nt_ctx *ctx, nt_comm *c) {
  if (!c) return;
  if (c->vt) c->vt->destroy(c, ctx);
  free(c->hashes);
  free(c);
}

void nt_comm_abort(nt_ctx *ctx, nt_comm *c) {
  if (c && c->vt) c->vt->abort(c, ctx);
}

int nt_comm_rank(const nt_comm *c) { return c->rank; }
int nt_comm_world(const nt_comm *c) { return c->world; }
nt_comm_backend nt_comm_backend_of(const nt_comm *c) { return c->backend; }
void *nt_comm_stream(const nt_comm *c) { return c->stream; }
int64_t nt_comm_seq(const nt_comm *c) { return c->seq; }

/* ---- collectives ---- */

static nt_status issue(nt_comm *c, nt_ctx *ctx, nt_coll_args *a) {
  c->seq++;
  snprintf(a->what, sizeof a->what, "%s #%lld (%lld x %s)", nt_coll_name(a->kind),
           (long long)c->seq, (long long)a->count, nt_dtype_name(a->dtype));
  if (c->fingerprint) {
    int64_t rec[5] = {(int64_t)a->kind, (int64_t)a->op, a->count, (int64_t)a->dtype, a->root};
    c->fp_hash = nt_fnv1a(c->fp_hash, rec, sizeof rec);
  }
  return c->vt->collective(c, ctx, a);
}

static nt_status check_buf(nt_comm *c, nt_ctx *ctx, const nt_tensor *t, const char *what) {
  (void)c;
  if (t->dtype != NT_F32 && t->dtype != NT_F16 && t->dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: collectives take f32, f16 or bf16, not %s", what,
                    nt_dtype_name(t->dtype));
  nt_status st = nt_check_contiguous(ctx, t, what);
  if (!st) st = nt_check_device(ctx, t, what);
  return st;
}

static nt_coll_args args_of(nt_ctx *ctx, nt_coll_kind kind, const nt_tensor *t) {
  nt_coll_args a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.dtype = t->dtype;
  a.device = nt_ctx_is_cuda(ctx);
  return a;
}

nt_status nt_comm_all_reduce(nt_comm *c, nt_ctx *ctx, nt_tensor *t, nt_reduce_op op) {
  nt_status st = check_buf(c, ctx, t, "all_reduce buffer");
  if (st) return st;
  nt_coll_args a = args_of(ctx, NT_COLL_ALL_REDUCE, t);
  a.op = op;
  a.send = a.recv = t->data;
  a.count = nt_tensor_numel(t);
  return issue(c, ctx, &a);
}

static nt_status check_pair(nt_comm *c, nt_ctx *ctx, const nt_tensor *full,
                            const nt_tensor *shard, const char *what) {
  nt_status st = check_buf(c, ctx, full, what);
  if (!st) st = check_buf(c, ctx, shard, what);
  if (st) return st;
  if (full->dtype != shard->dtype)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: full buffer %s, shard %s", what,
                    nt_dtype_name(full->dtype), nt_dtype_name(shard->dtype));
  if (nt_tensor_numel(full) != (int64_t)c->world * nt_tensor_numel(shard))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: full buffer of %lld elements, shard of %lld at world %d",
                    what, (long long)nt_tensor_numel(full), (long long)nt_tensor_numel(shard),
                    c->world);
  return NT_OK;
}

/* Reduce-scatter (full -> shard) and all-gather (shard -> full). */
static nt_status issue_pair(nt_comm *c, nt_ctx *ctx, nt_coll_kind kind, const nt_tensor *full,
                            const nt_tensor *shard) {
  bool rs = kind == NT_COLL_REDUCE_SCATTER;
  nt_status st = check_pair(c, ctx, full, shard, nt_coll_name(kind));
  if (st) return st;
  nt_coll_args a = args_of(ctx, kind, full);
  a.send = rs ? full->data : shard->data;
  a.recv = rs ? shard->data : full->data;
  a.count = nt_tensor_numel(shard);
  return issue(c, ctx, &a);
}

nt_status nt_comm_reduce_scatter(nt_comm *c, nt_ctx *ctx, const nt_tensor *full,
                                 nt_tensor *shard) {
  return issue_pair(c, ctx, NT_COLL_REDUCE_SCATTER, full, shard);
}

nt_status nt_comm_all_gather(nt_comm *c, nt_ctx *ctx, const nt_tensor *shard, nt_tensor *full) {
  return issue_pair(c, ctx, NT_COLL_ALL_GATHER, full, shard);
}

nt_status nt_comm_broadcast(nt_comm *c, nt_ctx *ctx, nt_tensor *t, int root) {
  nt_status st = check_buf(c, ctx, t, "broadcast buffer");
  if (st) return st;
  if (root < 0 || root >= c->world)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "broadcast root %d outside world %d", root, c->world);
  nt_coll_args a = args_of(ctx, NT_COLL_BROADCAST, t);
  a.send = a.recv = t->data;
  a.count = nt_tensor_numel(t);
  a.root = root;
  return issue(c, ctx, &a);
}

nt_status nt_comm_barrier(nt_comm *c, nt_ctx *ctx) {
  nt_coll_args a;
  memset(&a, 0, sizeof a);
  a.kind = NT_COLL_BARRIER;
  a.dtype = NT_U8;
  return issue(c, ctx, &a);
}

nt_status nt_comm_gather_bytes(nt_comm *c, nt_ctx *ctx, const void *mine, size_t n, void *all) {
  nt_coll_args a;
  memset(&a, 0, sizeof a);
  a.kind = NT_COLL_BYTES_GATHER;
  a.dtype = NT_U8;
  a.send = mine;
  a.recv = all;
  a.count = (int64_t)n;
  return issue(c, ctx, &a);
}

nt_status nt_comm_wait_seq(nt_comm *c, nt_ctx *ctx, int64_t seq) {
  if (seq <= 0 || !c->vt->wait_seq) return NT_OK;
  return c->vt->wait_seq(c, ctx, seq > c->seq ? c->seq : seq);
}

nt_status nt_comm_synchronize(nt_comm *c, nt_ctx *ctx) {
  return c->vt->synchronize ? c->vt->synchronize(c, ctx) : NT_OK;
}

/* Gathers every rank's 64-bit value; *bad = the first rank whose value differs from rank 0's
 * (-1: all equal). */
static nt_status compare_u64(nt_comm *c, nt_ctx *ctx, uint64_t mine, int *bad, uint64_t *v0,
                             uint64_t *vbad) {
  uint64_t *all = c->hashes;
  nt_status st = nt_comm_gather_bytes(c, ctx, &mine, sizeof mine, all);
  *bad = -1;
  for (int r = 1; !st && r < c->world && *bad < 0; r++)
    if (all[r] != all[0]) *bad = r;
  *v0 = all[0];
  *vbad = *bad >= 0 ? all[*bad] : all[0];
  return st;
}

nt_status nt_comm_check_config(nt_comm *c, nt_ctx *ctx, const void *config, size_t n) {
  uint64_t h = nt_fnv1a(NT_FNV_OFFSET, config, n), h0, hb;
  int bad;
  nt_status st = compare_u64(c, ctx, h, &bad, &h0, &hb);
  if (st) return st;
  if (bad >= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "rank %d: the ranks' configurations differ: rank 0 has hash %016llx, rank %d "
                    "%016llx (same flags, model and data on every rank?)",
                    c->rank, (unsigned long long)h0, bad, (unsigned long long)hb);
  return NT_OK;
}

nt_status nt_comm_check_fingerprint(nt_comm *c, nt_ctx *ctx) {
  if (!c->fingerprint) return NT_OK;
  uint64_t mine = c->fp_hash, h0, hb;
  int64_t seq = c->seq;
  int bad;
  nt_status st = compare_u64(c, ctx, mine, &bad, &h0, &hb);
  if (st) return st;
  if (bad >= 0)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "rank %d: rank %d issued a different sequence of collectives than rank 0 "
                    "(fingerprints %016llx and %016llx after %lld collectives here)",
                    c->rank, bad, (unsigned long long)h0, (unsigned long long)hb, (long long)seq);
  return NT_OK;
}
