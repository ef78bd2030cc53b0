/* Launch: parsing the launcher's values, the TCP bootstrap of NCCL's id, MPI start-up. */
#include "dist/launch.h"
#include "dist/comm_internal.h"
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef NT_HAVE_MPI
#include <mpi.h>
#endif

const char *nt_launch_kind_name(nt_launch_kind k) {
  static const char *names[] = {"single", "mpirun", "torchrun-env", "slurm"};
  return (unsigned)k < 4 ? names[k] : "?";
}

static bool parse_int(const char *s, int lo, int *out) {
  if (!s || !*s) return false;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > 1 << 30) return false;
  *out = (int)v;
  return true;
}

static nt_status parse_triple(nt_ctx *ctx, const char *rank, const char *world, const char *local,
                              const char *names, nt_dist_launch *l) {
  if (!parse_int(rank, 0, &l->rank) || !parse_int(world, 1, &l->world))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: rank '%s' / world size '%s' are not numbers",
                    names, rank ? rank : "", world ? world : "");
  if (local && !parse_int(local, 0, &l->local_rank))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: local rank '%s' is not a number", names, local);
  if (!local) l->local_rank = l->rank;
  if (l->rank >= l->world)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: rank %d is not below the world size %d", names,
                    l->rank, l->world);
  return NT_OK;
}

nt_status nt_dist_launch_parse(nt_ctx *ctx, const nt_dist_launch_strings *s, nt_dist_launch *l) {
  memset(l, 0, sizeof *l);
  l->world = 1;
  nt_status st = NT_OK;
  if ((s->ompi_rank && s->ompi_size) || (s->pmi_rank && s->pmi_size)) {
    l->kind = NT_LAUNCH_MPI;
    bool ompi = s->ompi_rank && s->ompi_size;
    st = parse_triple(ctx, ompi ? s->ompi_rank : s->pmi_rank, ompi ? s->ompi_size : s->pmi_size,
                      NULL, "mpirun", l);
    l->local_rank = -1;  /* nt_dist_mpi_init finds it */
  } else if (s->rank && s->world_size) {
    l->kind = NT_LAUNCH_ENV;
    st = parse_triple(ctx, s->rank, s->world_size, s->local_rank, "RANK/WORLD_SIZE/LOCAL_RANK", l);
  } else if (s->slurm_procid && s->slurm_ntasks) {
    l->kind = NT_LAUNCH_SLURM;
    st = parse_triple(ctx, s->slurm_procid, s->slurm_ntasks, s->slurm_localid,
                      "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID", l);
  }
  if (st) return st;
  if (s->master_addr) {
    if (strlen(s->master_addr) >= NT_DIST_ADDR_MAX)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "MASTER_ADDR is too long");
    strcpy(l->master_addr, s->master_addr);
  }
  if (s->master_port && (!parse_int(s->master_port, 1, &l->master_port) || l->master_port > 65535))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "MASTER_PORT '%s' is not a port", s->master_port);
  bool tcp = l->kind == NT_LAUNCH_ENV || l->kind == NT_LAUNCH_SLURM;
  if (tcp && l->world > 1 && (!l->master_addr[0] || !l->master_port))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "%s launch of %d ranks needs MASTER_ADDR and MASTER_PORT (rank 0's address "
                    "and a free port)", nt_launch_kind_name(l->kind), l->world);
  return NT_OK;
}

/* ---- TCP bootstrap ---- */

static int remaining_ms(double deadline) {
  double left = deadline - nt_dist_now();
  return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

/* Sends or receives exactly n bytes before the deadline. */
static bool xfer(int fd, void *buf, size_t n, bool send_dir, double deadline) {
  char *p = buf;
  while (n) {
    struct pollfd pfd = {fd, send_dir ? POLLOUT : POLLIN, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0 || poll(&pfd, 1, ms) <= 0) return false;
    ssize_t k = send_dir ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    p += k;
    n -= (size_t)k;
  }
  return true;
}

static nt_status serve(nt_ctx *ctx, const nt_dist_launch *l, const void *buf, size_t n,
                       double timeout_s) {
  double deadline = nt_dist_now() + timeout_s;
  int fd = socket(AF_INET6, SOCK_STREAM, 0), v6 = 1;
  if (fd < 0) {
    v6 = 0;
    fd = socket(AF_INET, SOCK_STREAM, 0);
  }
  if (fd < 0) return NT_ERROR(ctx, NT_ERR_IO, "bootstrap: socket: %s", strerror(errno));
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons((uint16_t)l->master_port);
    len = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons((uint16_t)l->master_port);
    len = sizeof *a;
  }
  if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, l->world)) {
    nt_status st = NT_ERROR(ctx, NT_ERR_IO, "bootstrap: rank 0 cannot listen on port %d: %s",
                            l->master_port, strerror(errno));
    close(fd);
    return st;
  }
  char *seen = calloc((size_t)l->world, 1);
  int served = 0;
  nt_status st = seen ? NT_OK : NT_ERROR(ctx, NT_ERR_OOM, "bootstrap: out of host memory");
  while (!st && served < l->world - 1) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0 || poll(&pfd, 1, ms) <= 0) break;
    int cfd = accept(fd, NULL, NULL);
    if (cfd < 0) continue;
    int32_t r = -1;
    if (xfer(cfd, &r, sizeof r, false, deadline) && r > 0 && r < l->world && !seen[r] &&
        xfer(cfd, (void *)buf, n, true, deadline)) {
      seen[r] = 1;
      served++;
    }
    close(cfd);
  }
  if (!st && served < l->world - 1) {
    char missing[160] = "";
    size_t off = 0;
    for (int r = 1; r < l->world && off + 12 < sizeof missing; r++)
      if (!seen[r]) off += (size_t)snprintf(missing + off, sizeof missing - off, " %d", r);
    st = NT_ERROR(ctx, NT_ERR_NCCL,
                  "rank 0: bootstrap on port %d: ranks%s did not connect within %.1f s",
                  l->master_port, missing, timeout_s);
  }
  free(seen);
  close(fd);
  return st;
}

static nt_status fetch(nt_ctx *ctx, const nt_dist_launch *l, void *buf, size_t n,
                       double timeout_s) {
  double deadline = nt_dist_now() + timeout_s;
  char port[16];
  snprintf(port, sizeof port, "%d", l->master_port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(l->master_addr, port, &hints, &res);
  if (gai)
    return NT_ERROR(ctx, NT_ERR_IO, "rank %d: bootstrap: cannot resolve '%s': %s", l->rank,
                    l->master_addr, gai_strerror(gai));
  bool ok = false;
  while (!ok && nt_dist_now() < deadline) {
    for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (fd < 0) continue;
      if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        int32_t r = l->rank;
        ok = xfer(fd, &r, sizeof r, true, deadline) && xfer(fd, buf, n, false, deadline);
      }
      close(fd);
    }
    if (!ok) {
      struct timespec ts = {0, 100 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  freeaddrinfo(res);
  if (!ok)
    return NT_ERROR(ctx, NT_ERR_NCCL,
                    "rank %d: bootstrap: no answer from rank 0 at %s:%d within %.1f s", l->rank,
                    l->master_addr, l->master_port, timeout_s);
  return NT_OK;
}

nt_status nt_dist_bootstrap_bytes(nt_ctx *ctx, const nt_dist_launch *l, void *buf, size_t n,
                                  double timeout_s) {
  if (l->world == 1) return NT_OK;
  if (!l->master_addr[0] || l->master_port <= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "bootstrap needs MASTER_ADDR and MASTER_PORT");
  return l->rank == 0 ? serve(ctx, l, buf, n, timeout_s) : fetch(ctx, l, buf, n, timeout_s);
}

/* ---- MPI ---- */

#ifdef NT_HAVE_MPI
static bool mpi_started_here;

nt_status nt_dist_mpi_init(nt_ctx *ctx, nt_dist_launch *l) {
  int init = 0, provided = 0;
  MPI_Initialized(&init);
  if (!init) {
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return NT_ERROR(ctx, NT_ERR_NCCL, "MPI_Init_thread failed");
    mpi_started_here = true;
  }
  MPI_Comm node;
  int rank = 0, size = 1, local = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
  }
  l->kind = NT_LAUNCH_MPI;
  l->rank = rank;
  l->world = size;
  l->local_rank = local;
  return NT_OK;
}

void nt_dist_mpi_finalize(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (mpi_started_here && !fin) MPI_Finalize();
}
#else
nt_status nt_dist_mpi_init(nt_ctx *ctx, nt_dist_launch *l) {
  (void)l;
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "launched by mpirun but MPI is not compiled in");
}

void nt_dist_mpi_finalize(void) {}
#endif
