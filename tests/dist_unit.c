/* dist/ pieces that need no MPI: launch parsing, the TCP bootstrap on 127.0.0.1 (ranks are
 * forked processes), the sharding arithmetic and the LOCAL communicator. */
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dist/comm.h"
#include "dist/fsdp.h"
#include "dist/launch.h"
#include "tools/launch_env.h"
#include "dist/shard.h"
#include "testutil.h"

static void test_parse(nt_ctx *ctx) {
  nt_dist_launch l;
  nt_dist_launch_strings s;
  memset(&s, 0, sizeof s);
  CHECK_OK(ctx, nt_dist_launch_parse(ctx, &s, &l));
  CHECK(l.kind == NT_LAUNCH_SINGLE && l.world == 1 && l.rank == 0, "no launcher: single");
  s.rank = "2", s.world_size = "4", s.local_rank = "0", s.master_addr = "10.0.0.1";
  s.master_port = "29500";
  CHECK_OK(ctx, nt_dist_launch_parse(ctx, &s, &l));
  CHECK(l.kind == NT_LAUNCH_ENV && l.rank == 2 && l.world == 4 && l.local_rank == 0 &&
        l.master_port == 29500 && !strcmp(l.master_addr, "10.0.0.1"), "torchrun env");
  s.master_port = NULL;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dist_launch_parse(ctx, &s, &l));   /* no port */
  s.master_port = "29500", s.rank = "4";
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dist_launch_parse(ctx, &s, &l));   /* rank >= world */
  s.rank = "x1";
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_dist_launch_parse(ctx, &s, &l));
  memset(&s, 0, sizeof s);
  s.slurm_procid = "3", s.slurm_ntasks = "8", s.slurm_localid = "1";
  s.master_addr = "node1", s.master_port = "1234";
  CHECK_OK(ctx, nt_dist_launch_parse(ctx, &s, &l));
  CHECK(l.kind == NT_LAUNCH_SLURM && l.rank == 3 && l.world == 8 && l.local_rank == 1, "slurm");
  s.ompi_rank = "1", s.ompi_size = "2";   /* MPI's variables win */
  CHECK_OK(ctx, nt_dist_launch_parse(ctx, &s, &l));
  CHECK(l.kind == NT_LAUNCH_MPI && l.rank == 1 && l.world == 2, "mpirun");
  /* The program-side reader: torchrun's variables. */
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                        "SLURM_PROCID", "SLURM_NTASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  setenv("RANK", "1", 1), setenv("WORLD_SIZE", "3", 1), setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1), setenv("MASTER_PORT", "29511", 1);
  CHECK_OK(ctx, nt_dist_launch_from_env(ctx, &l));
  CHECK(l.kind == NT_LAUNCH_ENV && l.rank == 1 && l.world == 3 && l.master_port == 29511,
        "from the environment");
}

/* A port the kernel just handed out (bound to port 0, then released). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = 29517;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
      !getsockname(fd, (struct sockaddr *)&a, &len))
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* Ranks 1..world-1 are children; rank 0 (this process) serves `id`. missing: a rank that never
 * starts (rank 0 must then fail within the timeout and name it). */
static void test_bootstrap(nt_ctx *ctx, int world, int missing) {
  int port = free_port();
  unsigned char id[128];
  for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 37 + 11);
  pid_t kids[8];
  int nk = 0;
  for (int r = 1; r < world; r++) {
    if (r == missing) continue;
    pid_t pid = fork();
    if (pid == 0) {
      nt_ctx *c = NULL;
      nt_ctx_create(&c, nt_cpu());
      nt_dist_launch l = {NT_LAUNCH_ENV, r, world, r, "127.0.0.1", port};
      unsigned char got[128] = {0};
      nt_status st = nt_dist_bootstrap_bytes(c, &l, got, sizeof got, 5.0);
      _exit(st ? 10 : memcmp(got, id, sizeof id) ? 11 : 0);
    }
    kids[nk++] = pid;
  }
  nt_dist_launch l0 = {NT_LAUNCH_ENV, 0, world, 0, "127.0.0.1", port};
  nt_status st = nt_dist_bootstrap_bytes(ctx, &l0, id, sizeof id, missing > 0 ? 1.5 : 10.0);
  if (missing > 0) {
    CHECK(st == NT_ERR_NCCL, "a missing rank fails the bootstrap");
    char want[32];
    snprintf(want, sizeof want, "ranks %d did not", missing);
    CHECK(strstr(nt_last_error(ctx), want) != NULL, "message names the rank: %s",
          nt_last_error(ctx));
    nt_clear_error(ctx);
  } else {
    CHECK_OK(ctx, st);
  }
  for (int k = 0; k < nk; k++) {
    int status = 0;
    waitpid(kids[k], &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "world %d: child %d status %d", world,
          k, status);
  }
}

static void test_shard(void) {
  for (int w = 1; w <= 5; w++)
    for (int64_t n = 0; n < 40; n += 3) {
      int64_t covered = 0, real = 0;
      for (int r = 0; r < w; r++) {
        nt_shard_layout s = nt_shard_layout_of(n, r, w);
        CHECK(s.padded % w == 0 && s.padded >= n && s.padded - n < w + (n == 0 ? 1 : 0) * w,
              "padding of %lld at %d", (long long)n, w);
        CHECK(s.lo == covered && s.hi - s.lo == s.shard, "ranges tile");
        covered = s.hi;
        real += nt_shard_real(&s);
      }
      CHECK(real == n, "real elements %lld of %lld", (long long)real, (long long)n);
    }
  nt_shard_layout s = nt_shard_layout_of(10, 2, 4);   /* shard 3: owns [6, 9) */
  int64_t off, len;
  CHECK(nt_shard_intersect(&s, 0, 8, &off, &len) && off == 0 && len == 2, "head range");
  CHECK(nt_shard_intersect(&s, 7, 3, &off, &len) && off == 1 && len == 2, "tail range");
  CHECK(!nt_shard_intersect(&s, 0, 6, &off, &len), "range before the shard");
  nt_shard_layout t = nt_shard_layout_of(10, 3, 4);  /* owns [9, 12): one real element */
  CHECK(nt_shard_real(&t) == 1 && t.real_hi == 10, "padding excluded");
}

static void test_local(nt_ctx *ctx) {
  nt_comm *c = NULL;
  nt_comm_options o = {NT_COMM_LOCAL, NULL, 0, true};
  if (!CHECK_OK(ctx, nt_comm_create(ctx, &o, &c))) return;
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  int64_t n = 4;
  nt_tensor ta = nt_tensor_view(a, NT_F32, nt_cpu(), 1, &n), tb = nt_tensor_view(b, NT_F32, nt_cpu(), 1, &n);
  CHECK_OK(ctx, nt_comm_all_reduce(c, ctx, &ta, NT_REDUCE_SUM));
  CHECK(a[3] == 4, "world-1 all_reduce is the identity");
  CHECK_OK(ctx, nt_comm_all_gather(c, ctx, &ta, &tb));
  CHECK(b[0] == 1 && b[3] == 4, "world-1 all_gather copies");
  CHECK_OK(ctx, nt_comm_check_config(c, ctx, "x", 1));
  CHECK_OK(ctx, nt_comm_check_fingerprint(c, ctx));
  CHECK(nt_comm_seq(c) == 4, "seq %lld", (long long)nt_comm_seq(c));
  nt_tensor i32 = ta;
  i32.dtype = NT_I32;
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_comm_all_reduce(c, ctx, &i32, NT_REDUCE_SUM));
  nt_comm_free(ctx, c);
  nt_dist_launch two = {NT_LAUNCH_ENV, 0, 2, 0, "", 0};
  o.launch = &two;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_comm_create(ctx, &o, &c));
  nt_comm_backend b2;
  CHECK(nt_comm_backend_parse("NCCL", &b2) && b2 == NT_COMM_NCCL, "backend names");
}

int main(void) {
  nt_ctx *ctx = NULL;
  nt_ctx_create(&ctx, nt_cpu());
  test_parse(ctx);
  test_shard();
  test_local(ctx);
  test_bootstrap(ctx, 2, -1);
  test_bootstrap(ctx, 4, -1);
  test_bootstrap(ctx, 3, 2);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
