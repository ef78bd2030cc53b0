/* The trainer's state and the pieces of the training loop split over train/train.c (the loop,
 * logging) and train/train_checkpoint.c (save, resume). Private to train/. */
#ifndef NT_TRAIN_TRAIN_INTERNAL_H
#define NT_TRAIN_TRAIN_INTERNAL_H
#include "train/train.h"
#include "train/model.h"
#include "train/step.h"
#include "train/metrics.h"
#include "optim/schedule.h"
#include "core/stream.h"
#include <limits.h>

typedef struct {
  nt_ctx *ctx;
  const nt_train_options *o;
  nt_train_result *res;
  FILE *out;
  nt_model *model;
  nt_policy pol;
  nt_optimizer opt;
  nt_step *step;
  nt_schedule sched;
  nt_model_batch batch;         /* the staged batch the step's body trains on */
  nt_metrics_log *log;
  char prom_path[4096];
  /* loop position */
  int64_t iter;                 /* iterations completed (skipped ones included) */
  int64_t total_iters;
  uint64_t epoch;
  int64_t batch_in_epoch;
  int64_t last_eval_iter, last_save_iter;   /* -1: none in this run */
  double best_val;
  int64_t eval_count;           /* evaluations of the schedule run (not the end-of-run one);
                                 * resumed runs continue the count */
  /* throughput: a log window runs from one log to the next; on a GPU its time comes from two
   * events recorded on the compute stream (read when the log already synchronizes) */
  double peak_flops;
  nt_event *ev_start, *ev_end;
  double t_start, t_last;
  int64_t iter_last;
  double wait_s;                /* data wait since the last log */
  double last_ips, last_step_ms;
  bool bar;
  nt_train_metrics last_train;  /* the latest train record (the Prometheus file's base) */
  /* data parallel (train/train_dist.c); fsdp NULL: the one-process path */
  int rank, world, accum;
  nt_comm *comm;                /* o->dist.comm, or a LOCAL one owned here (own_comm) */
  bool own_comm;
  nt_fsdp *fsdp;
  nt_unit_hooks unit_hooks;
  nt_step_hooks step_hooks;
  nt_grad_range *ranges;
  nt_tensor *unsharded;         /* FULL_SHARD: whole compute units while evaluating */
  nt_ctx *host;                 /* a CPU context: the consolidated state lives in host memory */
  size_t train_peak;            /* the peak allocated by training (evaluations excluded) */
  int stop_sig;                 /* several ranks: the stop signal they agreed on (0: none) */
  int64_t last_gather_iter;     /* T->iter at the last nt_trainer_gather (the same on every
                                 * rank: gathers are collective) */
  /* Host buffers for the ranks' gathers, allocated once (nt_trainer_dist_buffers) so that no
   * rank stays out of a collective for want of host memory: `gathered` receives every rank's
   * report (NT_TRAINER_REPORT_MAX bytes each), rank_loss and rank_peak a figure per rank. */
  void *gathered;
  double *rank_loss, *rank_peak;
} nt_trainer;

/* The most one rank contributes to a gather into T->gathered (a sharded save's report holds a
 * path). */
#define NT_TRAINER_REPORT_MAX (PATH_MAX + 256)

/* The dropout stream's seed of a rank (rank 0: base itself, as one process). */
static inline uint64_t nt_train_dropout_seed(uint64_t base, int rank) {
  return base + (uint64_t)rank * 0x9E3779B97F4A7C15ULL;
}

/* The optimizer's views of a unit hold this rank's shard (the sharded strategies) or the whole
 * unit (NO_SHARD, one process). */
static inline bool nt_trainer_shard_views(const nt_trainer *T) {
  return T->fsdp && T->o->dist.fsdp.strategy != NT_SHARD_NO_SHARD;
}

void nt_trainer_print(nt_trainer *T, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Data parallel (train/train_dist.c). */
/* Allocates T's buffers for T->world ranks (before anything collective). */
nt_status nt_trainer_dist_buffers(nt_trainer *T);
/* Builds the FSDP runtime over the model's parameters, the optimizer over the owned shards and
 * the step's hooks and owned gradient ranges (into so); T->fsdp stays NULL on the one-process
 * path (no communicator at world 1 with NO_SHARD), and then nothing here is needed. */
nt_status nt_trainer_dist_init(nt_trainer *T, const nt_optimizer_options *oo,
                               nt_step_options *so);
void nt_trainer_dist_free(nt_trainer *T);
/* The ranks agree on an outcome (all ranks call it; one process: st): a failure anywhere fails
 * every rank (the failing rank keeps its own message, the others name it and `what`). */
nt_status nt_trainer_agree(nt_trainer *T, nt_status st, const char *what);
/* Stops with a clear error when the ranks' configurations differ. */
nt_status nt_trainer_check_config(nt_trainer *T);
/* Every rank's value of x into all[world] (all ranks call it; world 1: a copy; all NULL: only
 * the stop requests). Each gather is also a point where the ranks agree on a stop request
 * (SIGINT / SIGTERM reaching some of them): the loss gather of a logged step, a dedicated one
 * when NT_STOP_AGREE_STEPS steps have passed since the last gather, after an evaluation and at
 * the end of training. */
nt_status nt_trainer_gather(nt_trainer *T, double x, double *all);
#define NT_STOP_AGREE_STEPS 10
/* A stop request as the loop sees it: this process's (one rank) or the agreed one. */
bool nt_trainer_stop_requested(nt_trainer *T);
/* A gather of nothing but the stop requests (no-op for one rank or once agreed). */
nt_status nt_trainer_agree_stop(nt_trainer *T);
/* FULL_SHARD: gathers every unit whole for an evaluation or sampling, and back (no-ops
 * otherwise). */
nt_status nt_trainer_unshard(nt_trainer *T);
void nt_trainer_reshard(nt_trainer *T);
/* The whole fp32 state for a consolidated checkpoint, in host memory (T->host's tensors): a
 * parameter set with whole master buffers and an AdamW over them holding the moments (built on
 * every rank: the gathers are collective); nt_trainer_scatter puts such a state back into this
 * rank's shards. Errors of T->host are carried over to T->ctx. */
typedef struct {
  nt_params params;
  nt_adamw *adamw;
  nt_tensor *whole;
} nt_trainer_whole;
nt_status nt_trainer_consolidate(nt_trainer *T, nt_trainer_whole *w, bool gather);
nt_status nt_trainer_scatter(nt_trainer *T, nt_trainer_whole *w);
void nt_trainer_whole_free(nt_trainer *T, nt_trainer_whole *w);
/* st (a failure on T->host) with T->host's message moved to T->ctx. */
nt_status nt_trainer_host_error(nt_trainer *T, nt_status st);

/* Sharded checkpoints (train/train_shards.c). */
/* The format a save writes (AUTO resolved: sharded when the strategy shards over N > 1). */
nt_checkpoint_format nt_trainer_checkpoint_format(const nt_trainer *T);
/* Every rank: writes its shard into a new checkpoint that rank 0 commits with `sidecar` (rank
 * 0's text; others pass NULL) once every rank's file is on disk; `whole` (BOTH; rank 0) also
 * writes the consolidated tensors: its gathered state, or (whole->adamw NULL) the model's.
 * pre: a failure before the save (nothing is written; the ranks still take part, so that all
 * fail alike). saved: rank 0's new directory; warned: rank 0's nt_checkpoint_stage_commit's
 * (T->ctx holds the warning). Every rank returns the same outcome. */
nt_status nt_trainer_save_sharded(nt_trainer *T, nt_status pre, const char *sidecar,
                                  nt_trainer_whole *whole, char *saved, bool *warned);
/* Whether a checkpoint's manifest describes shards. */
bool nt_trainer_manifest_sharded(const nt_json *manifest);
/* Every rank: the parameters and moments it owns now, from the shards of the checkpoint in dir
 * (its manifest given), at any old world size; every rank returns the same outcome. */
nt_status nt_trainer_load_sharded(nt_trainer *T, const char *dir, const nt_json *manifest);

/* Checkpoints (train/train_checkpoint.c). */
nt_status nt_trainer_save(nt_trainer *T);
/* A save point: saves unless there is no out-dir or this step is saved already. A failed save
 * is a warning (counted in res->failed_saves) and the run goes on, except when `final`. */
nt_status nt_trainer_checkpoint(nt_trainer *T, bool final);
/* Resume: the checkpoint's options, model shape and precision replace o's, except the
 * documented overrides given on the command line (o->given); a given option that differs is
 * NT_ERR_INVALID_ARG naming both values. */
nt_status nt_trainer_merge_config(nt_ctx *ctx, const nt_json *side, nt_train_options *o);
/* --resume `where` as one checkpoint directory, into dir[PATH_MAX] (all ranks call it): each
 * rank resolves it (models/checkpoint.h) and every rank must have found rank 0's directory,
 * else every rank fails. Both reads of a resume (sidecar, tensors) then use that directory. */
nt_status nt_trainer_resolve_resume(nt_trainer *T, const char *where, char *dir);
/* Reads a checkpoint's sidecar (the model config is needed before the model is built). */
nt_status nt_trainer_read_sidecar(nt_ctx *ctx, const char *where, nt_json *root);
/* Restores parameters, moments, step, scaler, RNG and loop position from o->resume (a
 * checkpoint directory, nt_trainer_resolve_resume's). */
nt_status nt_trainer_restore(nt_trainer *T, const nt_json *sidecar);

#endif
