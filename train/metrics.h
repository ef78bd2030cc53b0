/* Training metrics: one JSON object per line (JSONL, appended, flushed per record) and a
 * Prometheus text-format file in the node_exporter textfile-collector convention (written to
 * a temporary file in the same directory, then renamed over the target, so a scraper never
 * reads a half-written file). Non-finite values are written as null (JSONL) / NaN (Prometheus);
 * fields that do not apply are NaN and left out. */
#ifndef NT_TRAIN_METRICS_H
#define NT_TRAIN_METRICS_H
#include <stdio.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct {
  const char *model;          /* "gpt" / "cnn" */
  const char *kind;           /* "train" or "eval" */
  int64_t step;
  double epoch;               /* fractional epoch (NaN for the GPT's random windows) */
  double loss, lr, scale, grad_norm;
  int64_t skipped_steps;      /* total optimizer steps skipped for overflow */
  double items_per_sec;       /* tokens/s (GPT) or images/s (CNN) */
  const char *items;          /* "tokens" or "images" */
  double step_ms;
  double mfu;                 /* model FLOPs utilisation, 0..1 (GPU only, else NaN) */
  double mem_allocated, mem_reserved, mem_peak;   /* bytes */
  double data_wait_ms;        /* mean wait for data per step since the last record */
  double val_loss, accuracy;  /* eval records */
  double elapsed_s;
  /* data parallel: world > 1 adds every rank's loss and peak memory (NULL: left out) */
  int world;
  const double *rank_loss, *rank_mem_peak;
} nt_train_metrics;

/* A record with every double NaN and counters zero. */
nt_train_metrics nt_train_metrics_empty(void);

typedef struct nt_metrics_log nt_metrics_log;
/* append: keep existing lines (resume). */
nt_status nt_metrics_log_open(nt_ctx *ctx, const char *path, bool append, nt_metrics_log **out);
void nt_metrics_log_close(nt_metrics_log *l);          /* NULL is a no-op */
nt_status nt_metrics_log_write(nt_ctx *ctx, nt_metrics_log *l, const nt_train_metrics *m);

/* Writes the gauges nanotrain_<field>{model="gpt"} to path via path.tmp + rename. */
nt_status nt_metrics_prometheus_write(nt_ctx *ctx, const char *path, const nt_train_metrics *m);

NT_EXTERN_C_END
#endif
