/* For programs only (examples/, tools/, tests/): the one place that reads the launcher's
 * environment variables. Library code never includes this header (the library reads no
 * environment); a program calls nt_dist_launch_from_env once at start-up.
 *
 *   nt_dist_launch l;
 *   if (nt_dist_launch_from_env(ctx, &l)) ... error ...
 *   GPU: l.local_rank (unless the user chose one); communicator: nt_comm_create with &l.
 *
 * Under mpirun (OMPI_COMM_WORLD_* or PMI_* set) MPI is initialised here, and rank, size and
 * local rank come from MPI itself. */
#ifndef NT_DIST_LAUNCH_ENV_H
#define NT_DIST_LAUNCH_ENV_H
#include <stdlib.h>
#include "dist/launch.h"

static inline nt_status nt_dist_launch_from_env(nt_ctx *ctx, nt_dist_launch *out) {
  nt_dist_launch_strings s = {
      getenv("RANK"),           getenv("WORLD_SIZE"),    getenv("LOCAL_RANK"),
      getenv("MASTER_ADDR"),    getenv("MASTER_PORT"),   getenv("SLURM_PROCID"),
      getenv("SLURM_NTASKS"),   getenv("SLURM_LOCALID"), getenv("OMPI_COMM_WORLD_RANK"),
      getenv("OMPI_COMM_WORLD_SIZE"), getenv("PMI_RANK"), getenv("PMI_SIZE")};
  nt_status st = nt_dist_launch_parse(ctx, &s, out);
  if (!st && out->kind == NT_LAUNCH_MPI) st = nt_dist_mpi_init(ctx, out);
  return st;
}
#endif
