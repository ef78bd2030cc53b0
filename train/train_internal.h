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
} nt_trainer;

void nt_trainer_print(nt_trainer *T, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checkpoints (train/train_checkpoint.c). */
nt_status nt_trainer_save(nt_trainer *T);
/* A save point: saves unless there is no out-dir or this step is saved already. A failed save
 * is a warning (counted in res->failed_saves) and the run goes on, except when `final`. */
nt_status nt_trainer_checkpoint(nt_trainer *T, bool final);
/* Resume: the checkpoint's options, model shape and precision replace o's, except the
 * documented overrides given on the command line (o->given); a given option that differs is
 * NT_ERR_INVALID_ARG naming both values. */
nt_status nt_trainer_merge_config(nt_ctx *ctx, const nt_json *side, nt_train_options *o);
/* Reads a checkpoint's sidecar (the model config is needed before the model is built). */
nt_status nt_trainer_read_sidecar(nt_ctx *ctx, const char *where, nt_json *root);
/* Restores parameters, moments, step, scaler, RNG and loop position from o->resume. */
nt_status nt_trainer_restore(nt_trainer *T, const nt_json *sidecar);

#endif
