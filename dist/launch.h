/* Launch: who this process is among the ranks of a job, and the bootstrap that hands NCCL's
 * unique id from rank 0 to the others.
 *
 * Three launchers are understood (the library reads no environment variable: a program fills
 * the strings, e.g. with tools/launch_env.h, which only programs include):
 *   mpirun / mpiexec   rank and size come from MPI itself (nt_dist_mpi_init); NCCL's id is
 *                      broadcast with MPI.
 *   torchrun-style     RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; NCCL's id goes
 *                      over one TCP connection per rank to MASTER_ADDR:MASTER_PORT, where rank 0
 *                      listens (nt_dist_bootstrap_bytes).
 *   Slurm (srun)       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the id exchange is the TCP one,
 *                      so MASTER_ADDR and MASTER_PORT must be set too (as torch's srun recipes do).
 * The GPU a rank uses is its local rank's unless the program chooses otherwise. */
#ifndef NT_DIST_LAUNCH_H
#define NT_DIST_LAUNCH_H
#include <stddef.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_LAUNCH_SINGLE = 0,  /* one process, no launcher */
  NT_LAUNCH_MPI,         /* mpirun: rank and size from MPI */
  NT_LAUNCH_ENV,         /* torchrun-style environment */
  NT_LAUNCH_SLURM        /* srun */
} nt_launch_kind;

#define NT_DIST_ADDR_MAX 256

typedef struct {
  nt_launch_kind kind;
  int rank, world, local_rank;
  char master_addr[NT_DIST_ADDR_MAX];  /* "" when not given */
  int master_port;                     /* 0 when not given */
} nt_dist_launch;

/* The launcher's values as the environment spells them (any may be NULL = unset). */
typedef struct {
  const char *rank, *world_size, *local_rank;           /* RANK, WORLD_SIZE, LOCAL_RANK */
  const char *master_addr, *master_port;                /* MASTER_ADDR, MASTER_PORT */
  const char *slurm_procid, *slurm_ntasks, *slurm_localid;
  const char *ompi_rank, *ompi_size;                    /* OMPI_COMM_WORLD_RANK / _SIZE, */
  const char *pmi_rank, *pmi_size;                      /* PMI_RANK / PMI_SIZE (MPICH) */
} nt_dist_launch_strings;

/* Decides the launcher from the strings (MPI's variables first, then RANK/WORLD_SIZE, then
 * Slurm's; none: a single process) and parses them. Malformed numbers, rank >= world, a
 * missing MASTER_ADDR/MASTER_PORT for the TCP bootstrap with world > 1: NT_ERR_INVALID_ARG. */
nt_status nt_dist_launch_parse(nt_ctx *ctx, const nt_dist_launch_strings *s, nt_dist_launch *out);
const char *nt_launch_kind_name(nt_launch_kind k);

/* Bootstrap over TCP: rank 0 listens on master_port, every other rank connects to
 * master_addr:master_port (retrying until the deadline) and receives `n` bytes that rank 0
 * gave in `buf`. Every wait is bounded by timeout_s; a rank that never connects makes rank 0
 * fail naming the ranks still missing. */
nt_status nt_dist_bootstrap_bytes(nt_ctx *ctx, const nt_dist_launch *l, void *buf, size_t n,
                                  double timeout_s);

/* MPI: initialises MPI (thread level FUNNELED) when it is not yet, and fills rank, world and
 * local rank (from a shared-memory split of the world). NT_ERR_UNSUPPORTED without MPI. */
nt_status nt_dist_mpi_init(nt_ctx *ctx, nt_dist_launch *out);
/* MPI_Finalize if this process initialised MPI through nt_dist_mpi_init and it is still up. */
void nt_dist_mpi_finalize(void);

NT_EXTERN_C_END
#endif
