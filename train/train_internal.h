/* What the GPT and CNN training loops share (private to models/train*.c). */
#ifndef NT_TRAIN_TRAIN_INTERNAL_H
#define NT_TRAIN_TRAIN_INTERNAL_H
#include "train/train.h"
#include "train/cuda_graph.h"
#include "models/json.h"
#include "train/metrics.h"
#include "train/memest.h"
#include "amp/scaler.h"
#include "optim/adamw.h"

typedef struct {
  nt_ctx *ctx;
  const nt_train_options *o;
  nt_train_result *res;
  FILE *out;
  const char *model_name;       /* "gpt" / "cnn" */
  const char *items_name;       /* "tokens" / "images" */
  nt_dtype compute;
  nt_params *params;
  nt_adamw *opt;
  nt_scaler *scaler;
  nt_param_unit *units;
  nt_param_range *ranges;
  nt_metrics_log *log;
  char prom_path[4096];
  /* the step body (zero grads, forward, backward) and its CUDA graph */
  nt_graph_body body;
  void *body_arg;
  nt_graph *graph;
  bool graph_wanted, graph_tried;
  int eager_steps;
  long profile_from, profile_to;  /* NT_PROFILE_ITERS="a:b" (-1: none), read once at init */
  /* Random numbers the body reserves per step (inside the context's RNG step bracket): the
   * latest step's, whether two eager steps differed, and the captured graph's. */
  uint64_t rng_step, graph_rng;
  bool rng_varies;
  /* loop position */
  int64_t iter;                 /* iterations completed (skipped ones included) */
  int64_t total_iters;
  int64_t schedule_iters;        /* the cosine's length when lr_decay_iters is 0 */
  uint64_t epoch;
  int64_t batch_in_epoch;
  double best_val;
  /* throughput */
  double flops_per_item, peak_flops;
  int64_t items_per_step;
  double t_start, t_last;
  int64_t iter_last;
  double wait_s;                /* data wait since the last log */
  double last_loss, last_ips, last_step_ms;
  bool bar;
  nt_train_metrics last_train;  /* the latest train record (the Prometheus file's base) */
} nt_trainer;

double nt_now_s(void);

/* Optimizer (decay on the units' decay ranges only), scaler, metrics files. params must be
 * initialised. */
nt_status nt_trainer_init(nt_trainer *T, nt_ctx *ctx, const nt_train_options *o,
                          nt_train_result *res, nt_params *params, const char *model_name,
                          const char *items_name);
void nt_trainer_free(nt_trainer *T);
/* The loss gradient's multiplier: the scaler's device scale (fp16), else NULL. */
const float *nt_trainer_loss_scale(nt_trainer *T);
double nt_trainer_lr(const nt_trainer *T, int64_t it);
/* One iteration: the body (a replayed CUDA graph when captured), then the AdamW step with
 * unscale/skip/clip and the scaler update. Logs when due. loss: the model's F32 scalar.
 * The body runs inside an RNG step (nt_ctx_rng_step_begin/end), so its dropout masks come
 * from offsets relative to the context's device-side step base and its end-of-step increment
 * is part of the captured graph: every replay draws fresh masks, the same ones an eager step
 * would. The replays assume the count of random numbers the step reserves never changes: if
 * the two eager steps differ, or the capture differs from them, no graph is used (with a
 * warning). */
nt_status nt_trainer_step(nt_trainer *T, const nt_tensor *loss);
/* Reads a device F32 scalar (synchronizes). */
nt_status nt_trainer_read_scalar(nt_trainer *T, const nt_tensor *t, float *out);
/* An evaluation record (printed, JSONL, Prometheus). */
nt_status nt_trainer_log_eval(nt_trainer *T, double train_loss, double val_loss, double accuracy);
void nt_trainer_print(nt_trainer *T, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checkpoints: the model writes its config into the sidecar through `config`. */
typedef void (*nt_config_writer)(nt_jw *w, const void *arg);
nt_status nt_trainer_save(nt_trainer *T, nt_config_writer config, const void *arg);
/* Restores parameters, moments, step, scaler, RNG and loop position from o->resume. */
nt_status nt_trainer_restore(nt_trainer *T, const nt_json *sidecar);
/* Reads o->resume's sidecar (for the model config before the model is built). */
nt_status nt_trainer_read_sidecar(nt_ctx *ctx, const char *where, nt_json *root);
/* End of run: peak memory next to the estimate. */
void nt_trainer_finish(nt_trainer *T, const nt_mem_estimate *est);

nt_status nt_train_gpt(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                       nt_train_result *res);
nt_status nt_train_cnn(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                       nt_train_result *res);

#endif
