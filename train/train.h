/* Training runs of the GPT (tiny shakespeare or token shards / synthetic tokens) and the CNN
 * (Fashion-MNIST) through one loop (train/train.c over the model interface, train/model.h):
 * mixed precision per the policy, AdamW with decay on 2-D weights only, warmup + cosine LR,
 * global-norm clipping, the dynamic loss scaler for fp16 (the step's stages: train/step.h),
 * evaluation, checkpoints with bit-identical resume, a JSONL metrics log, a Prometheus
 * textfile, a progress bar on a terminal, and (GPU) the forward/backward captured as a CUDA
 * graph. examples/nanotrain.c is the command line around nt_train_run. */
#ifndef NT_TRAIN_TRAIN_H
#define NT_TRAIN_TRAIN_H
#include <stdio.h>
#include "core/nt.h"
#include "models/cnn.h"
#include "models/gpt.h"
#include "amp/policy.h"
#include "dist/fsdp.h"
NT_EXTERN_C_BEGIN

typedef enum { NT_MODEL_GPT = 0, NT_MODEL_CNN } nt_model_kind;

/* What a checkpoint holds under data parallel (docs/sharding.md "Checkpoints"):
 *   CONSOLIDATED  ckpt.safetensors, the whole fp32 state (rank 0 gathers and writes it):
 *                 PyTorch FSDP's FULL_STATE_DICT
 *   SHARDED       one file per rank with the fp32 master and AdamW moments it owns, and the
 *                 ranges in the manifest: SHARDED_STATE_DICT
 *   BOTH          both in the same checkpoint directory
 *   AUTO          SHARDED when the strategy shards (SHARD_GRAD_OP, FULL_SHARD) over more
 *                 than one rank, else CONSOLIDATED (one process, or NO_SHARD, where rank 0
 *                 holds everything anyway)
 * Either kind resumes at any world size and strategy. */
typedef enum {
  NT_CKPT_AUTO = 0, NT_CKPT_CONSOLIDATED, NT_CKPT_SHARDED, NT_CKPT_BOTH
} nt_checkpoint_format;
bool nt_checkpoint_format_parse(const char *s, nt_checkpoint_format *out);
const char *nt_checkpoint_format_name(nt_checkpoint_format f);

/* Precision policies are amp/policy.h's: fp32; tf32 (fp32 storage, TF32 GEMMs); bf16; fp16 (with
 * the dynamic loss scaler); fp8 (the models have no FP8 linear path yet: it runs as bf16, with
 * a notice). */

typedef struct {
  nt_model_kind model;
  nt_device device;
  nt_precision precision;
  nt_gpt_config gpt;
  nt_cnn_config cnn;
  const char *gpt_data;        /* "shakespeare" (default), "synthetic", or a shard file path */
  int64_t batch_size;
  int64_t max_iters;           /* GPT: iterations; CNN: 0 = run all epochs, > 0 stops early */
  int epochs;                  /* CNN */
  double lr, min_lr, weight_decay, beta1, beta2, eps, grad_clip;
  int64_t warmup_iters, lr_decay_iters;   /* lr_decay_iters 0 = the run's total iterations */
  bool decay_lr;
  float init_scale, growth_factor, backoff_factor;
  int growth_interval;
  uint64_t seed;
  int64_t eval_interval, eval_iters, log_interval, metrics_interval;
  int num_workers;              /* loader threads (0: load synchronously) */
  int rank, world_size;        /* data parallel: this process's share of the data (default 0
                                * of 1); each rank draws its own batches and dropout masks,
                                * rank 0 of 1 the single-process ones */
  bool augment;                /* CNN: random crop (pad 2) + horizontal flip */
  int64_t train_subset, test_subset;   /* CNN: use the first N images (0 = all) */
  const char *data_dir;        /* tiny shakespeare's dir (NT_DATA_DIR) / Fashion-MNIST's */
  const char *out_dir;         /* checkpoints, metrics.jsonl, metrics.prom; NULL = none */
  const char *resume;          /* a checkpoint directory (or .safetensors/.json path) */
  int64_t checkpoint_interval; /* save every N iterations (GPT default 250; 0: after every
                                * evaluation); always at the end, per epoch for the CNN */
  int keep_checkpoints;        /* checkpoints kept in out_dir, newest first (0: all) */
  nt_checkpoint_format checkpoint_format;   /* AUTO (see above) */
  /* the options given on the command line (long names, e.g. "lr", "n-layer"): on resume the
   * checkpoint's configuration wins and these must agree with it (models/state.h) */
  const char *const *given;
  int n_given;
  int sample_tokens;           /* GPT: generate this many characters after training */
  float temperature;
  int top_k;
  int cuda_graph;              /* -1 auto (on a GPU), 0 off, 1 on (falls back) */
  int progress;                /* -1 auto (isatty), 0 plain lines, 1 bar */
  bool quiet;                  /* no per-step output (tests) */
  bool record_losses;          /* keep every step's loss in the result (syncs every step) */
  bool trace;                  /* print each step's AMP events (scale, found_inf, skipped or
                                * not, growth tracker): syncs every step */
  struct {
    int64_t from, to;          /* iterations [from, to) are the profiler's range
                                * (nt_profiler_range); from >= to: none */
  } profile_iters;
  FILE *out;                   /* where progress goes (stdout when NULL) */
  /* Sharded data parallel (dist/, docs/sharding.md). comm NULL: one process, and with
   * NO_SHARD the run is exactly the one-process path (no FSDP runtime; the CUDA graph unless
   * accumulating). Otherwise every rank of comm (its rank and world are rank and world_size
   * above) runs nt_train_run with the same options:
   * the batch is per rank (global batch = batch_size x world x grad_accum_steps); the GPT's
   * rank r draws rows [r*B, (r+1)*B) of the global batch a single process with batch N*B
   * would draw, the CNN's loader takes DistributedSampler's share; dropout streams differ per
   * rank; only rank 0 prints and writes files (every rank's loss and peak memory are in
   * metrics.jsonl). Checkpoints are consolidated or sharded (checkpoint_format); a resume
   * reshards either at any world size. A stop request (SIGINT / SIGTERM) that reaches some
   * ranks is agreed at the next gather (within 10 steps): every rank
   * stops after the same step, saves and records the same signal (nt_stop_exit_code). */
  struct {
    nt_comm *comm;               /* not owned; NULL = world 1 (LOCAL semantics) */
    nt_fsdp_options fsdp;        /* strategy, prefetch, reduce dtype; param_dtype is the
                                  * precision policy's compute dtype (set by the trainer) */
    bool param_dtype_given;      /* fsdp.param_dtype was given: it must then equal the
                                  * policy's compute dtype */
    int grad_accum_steps;        /* K >= 1 micro-steps per optimizer step (no_sync on K-1) */
  } dist;
} nt_train_options;

/* nanoGPT shakespeare_char defaults for the GPT; AdamW 1e-3 / cosine / 10 epochs for the CNN. */
nt_train_options nt_train_defaults(nt_model_kind model);

typedef struct {
  int64_t steps;               /* optimizer iterations run (including skipped ones) */
  int64_t skipped;             /* skipped for overflow */
  double last_loss;            /* train loss of the last step */
  double train_loss, val_loss; /* GPT: the last evaluation (NaN when none) */
  double best_val_loss;        /* GPT: the lowest validation loss of any evaluation (as
                                * nanoGPT reports it: its checkpoint keeps the best) */
  double test_accuracy, test_loss;   /* CNN */
  double items_per_sec;        /* tokens or images per second in the last log window */
  double step_ms;              /* its mean step time (GPU: from events on the compute stream) */
  size_t peak_bytes;           /* measured peak allocated (pool statistics) */
  size_t estimate_bytes;       /* tools/memest's estimate for the run */
  bool used_cuda_graph;
  int64_t failed_saves;        /* checkpoint saves that failed (warned; the run went on) */
  int64_t failed_metrics;      /* metrics.jsonl / metrics.prom writes that failed (warned) */
  bool stopped;                /* a stop request (SIGINT/SIGTERM) ended the run early */
  uint64_t steady_system_allocs; /* system (cudaMalloc / host) allocations made inside training
                                  * steps after the third: 0 when the steady state allocates
                                  * nothing */
  double *losses;              /* record_losses: loss of step i at losses[i - first_step] */
  int64_t first_step, n_losses;
  char *sample;                /* sample_tokens: the generated text (NUL-terminated) */
  int64_t global_batch;        /* items per optimizer step over all ranks and micro-steps */
} nt_train_result;

nt_status nt_train_run(nt_ctx *ctx, const nt_train_options *o, nt_train_result *res);
void nt_train_result_free(nt_train_result *r);

NT_EXTERN_C_END
#endif
