/* The one interface every trained model implements (the GPT in train/model_gpt.c, the CNN in
 * train/model_cnn.c): the trainer (train/train.c) drives any of them through it and never
 * asks which model it has.
 *
 * A model owns its parameters (nt_params units), its fixed device input buffers and its data:
 *   params             the units the optimizer updates and the checkpoint stores
 *   train_micro_step   forward + loss + backward on a staged batch; the loss gradient times
 *                      *loss_scale; the unit hooks around each unit (models/module.h). This is
 *                      the step's capturable body: it enqueues work only
 *   loss               the device F32 scalar mean loss of the latest micro-step / evaluation
 *   evaluate           the held-out loss (and accuracy when the model has one); may sync
 *   batch source       start_epoch positions the stream, next_batch stages the next batch into
 *                      the model's fixed input buffers (the same addresses every step, so a
 *                      captured step reads them) and says how long it waited for data
 *   write_config       what the checkpoint adds: the model's effective shape (the trainer
 *                      merges it into the options on resume) and the GPT's vocabulary
 *   after_training     optional (sampling text), then free */
#ifndef NT_TRAIN_MODEL_H
#define NT_TRAIN_MODEL_H
#include "core/nt.h"
#include "models/module.h"
#include "models/json.h"
#include "data/loader.h"
#include "train/memest.h"
#include "train/train.h"
NT_EXTERN_C_BEGIN

/* A staged batch: device tensors (inputs, targets) in the model's fixed buffers. */
typedef struct {
  nt_tensor inputs, targets;
  int64_t size;
} nt_model_batch;

/* An evaluation; NaN where the model has no such figure (the GPT: train/val loss, the CNN:
 * test loss and accuracy). has_val: the held-out loss is val_loss (else test_loss). round (set
 * by the trainer): the scheduled evaluations before this one, which keys the GPT's evaluation
 * batches, so a resumed run evaluates on the same batches as an uninterrupted one. */
typedef struct {
  double train_loss, val_loss, test_loss, accuracy;
  bool has_val;
  int64_t round;
} nt_eval_result;

typedef struct nt_model nt_model;

typedef struct {
  const char *name;               /* "gpt": the checkpoint's model field, the metrics label */
  const char *items;              /* what throughput counts: "tokens", "images" */
  nt_status (*train_micro_step)(nt_ctx *ctx, nt_model *m, const nt_model_batch *b,
                                const float *loss_scale, const nt_unit_hooks *hooks);
  const nt_tensor *(*loss)(const nt_model *m);
  nt_status (*evaluate)(nt_ctx *ctx, nt_model *m, nt_eval_result *out);
  /* Positions the training stream at batch `skip` of `epoch` (a resume lands mid-epoch). */
  nt_status (*start_epoch)(nt_ctx *ctx, nt_model *m, uint64_t epoch, int64_t skip);
  /* Stages the batch of iteration `iter`; *end: the epoch has no more batches (nothing
   * staged). *wait_s: seconds spent waiting for data. */
  nt_status (*next_batch)(nt_ctx *ctx, nt_model *m, int64_t iter, nt_model_batch *out,
                          bool *end, double *wait_s);
  void (*write_config)(nt_jw *w, const nt_model *m);
  nt_status (*after_training)(nt_ctx *ctx, nt_model *m, nt_train_result *res, FILE *out);
  void (*free)(nt_ctx *ctx, nt_model *m);
} nt_model_ops;

struct nt_model {
  const nt_model_ops *ops;
  nt_params *params;
  nt_dtype compute;               /* the policy's effective compute dtype */
  int64_t items_per_step;         /* tokens or images per optimizer step */
  double flops_per_item;          /* training FLOPs per token / image (MFU) */
  int64_t batches_per_epoch;      /* 0: an endless stream (the run counts iterations) */
  bool checkpoint_every_eval;     /* true: save after every evaluation; false: only when the
                                   * validation loss improves (nanoGPT) */
  nt_mem_estimate estimate;       /* tools/memest's estimate for the run */
  char summary[512];              /* one line printed at the start of the run */
  void *impl;
};

/* Builds a model for the run: reads its data, creates and initialises its parameters (seed
 * o->seed), allocates its input buffers. o holds the resumed checkpoint's shape already;
 * config: the checkpoint's "model_config" object (the GPT checks its corpus's vocabulary
 * against it), NULL for a fresh run. pol: the precision policy in force. */
typedef nt_status (*nt_model_create_fn)(nt_ctx *ctx, const nt_train_options *o,
                                        const nt_policy *pol, const nt_json *config,
                                        nt_model **out);

nt_status nt_model_gpt_create(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                              const nt_json *config, nt_model **out);
nt_status nt_model_cnn_create(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                              const nt_json *config, nt_model **out);

void nt_model_free(nt_ctx *ctx, nt_model *m);   /* NULL is a no-op */
/* The next batch of a loader, with the seconds it waited (from the loader's wait total, whose
 * previous reading *waited_ns holds; reset it to 0 with nt_loader_reset_stats). */
nt_status nt_model_loader_next(nt_loader *l, uint64_t *waited_ns, nt_batch *b, bool *end,
                               double *wait_s);
/* Monotonic wall-clock seconds. */
double nt_now_s(void);
/* Copies a device F32 scalar (a loss) to the host (synchronizes). */
nt_status nt_model_read_scalar(nt_ctx *ctx, const nt_tensor *t, float *out);

NT_EXTERN_C_END
#endif
