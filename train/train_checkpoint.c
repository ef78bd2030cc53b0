/* Checkpoints of a training run: the model's tensors and AdamW's moments in a safetensors file
 * (models/checkpoint.h), everything else in a JSON sidecar. Each piece of state is one table
 * (models/state.h) that both the save and the resume walk: the run's options ("config"), the
 * model's shape ("model_config"), the loop position with the RNG and optimizer step
 * ("position") and the loss scaler ("scaler"); a resume restores all of it, so it continues
 * bit-identically, and options given on the command line must agree with it.
 * Data parallel (--checkpoint-format): a consolidated checkpoint is the same files as one
 * process (rank 0 writes the whole fp32 state, gathered from every rank's shards under the
 * sharded strategies; a resume reads it whole and keeps this rank's shards, train_dist.c); a
 * sharded one has a file per rank (train_shards.c). Either resumes at any world size. */
#include "train/train_internal.h"
#include "models/checkpoint.h"
#include "models/limits.h"
#include "models/state.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OPT(name, member, kind, lo, hi) \
  NT_STATE_FIELD_NAMED(name, nt_train_options, member, kind, lo, hi)
/* The run's options, named as the command line's (with '_' for '-'). */
static const nt_state_field config_fields[] = {
    OPT("batch_size", batch_size, NT_STATE_I64, 1, NT_MAX_BATCH_SIZE),
    OPT("max_iters", max_iters, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("epochs", epochs, NT_STATE_I32, 0, NT_MAX_EPOCHS),
    OPT("lr", lr, NT_STATE_F64, 0, 10),
    OPT("min_lr", min_lr, NT_STATE_F64, 0, 10),
    OPT("weight_decay", weight_decay, NT_STATE_F64, 0, 10),
    OPT("beta1", beta1, NT_STATE_F64, 0, 1),
    OPT("beta2", beta2, NT_STATE_F64, 0, 1),
    OPT("eps", eps, NT_STATE_F64, 0, 1),
    OPT("grad_clip", grad_clip, NT_STATE_F64, 0, 1e9),
    OPT("warmup_iters", warmup_iters, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("lr_decay_iters", lr_decay_iters, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("decay_lr", decay_lr, NT_STATE_BOOL, 0, 1),
    OPT("init_scale", init_scale, NT_STATE_F32, 0, NT_STATE_ANY),
    OPT("growth_factor", growth_factor, NT_STATE_F32, 1, 1e6),
    OPT("backoff_factor", backoff_factor, NT_STATE_F32, 0, 1),
    OPT("growth_interval", growth_interval, NT_STATE_I32, 1, INT32_MAX),
    OPT("seed", seed, NT_STATE_U64, 0, NT_STATE_ANY),
    OPT("eval_interval", eval_interval, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("eval_iters", eval_iters, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("log_interval", log_interval, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("metrics_interval", metrics_interval, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("num_workers", num_workers, NT_STATE_I32, 0, NT_MAX_WORKERS),
    OPT("checkpoint_interval", checkpoint_interval, NT_STATE_I64, 0, NT_MAX_ITERS),
    OPT("keep_checkpoints", keep_checkpoints, NT_STATE_I32, 0, 1000000),
    OPT("sample", sample_tokens, NT_STATE_I32, 0, NT_MAX_SAMPLE_TOKENS),
    OPT("temperature", temperature, NT_STATE_F32, 0, 100),
    OPT("top_k", top_k, NT_STATE_I32, 0, NT_MAX_VOCAB_SIZE),
    OPT("augment", augment, NT_STATE_BOOL, 0, 1),
    OPT("train_subset", train_subset, NT_STATE_I64, 0, INT32_MAX),
    OPT("test_subset", test_subset, NT_STATE_I64, 0, INT32_MAX),
};
/* The model's shape as the model wrote it (write_config: the effective one, e.g. the GPT's
 * vocabulary size from its corpus). */
static const nt_state_field gpt_fields[] = {
    OPT("n_layer", gpt.n_layer, NT_STATE_I32, 1, NT_MAX_N_LAYER),
    OPT("n_head", gpt.n_head, NT_STATE_I32, 1, NT_MAX_N_HEAD),
    OPT("n_embd", gpt.n_embd, NT_STATE_I32, 1, NT_MAX_N_EMBD),
    OPT("block_size", gpt.block_size, NT_STATE_I32, 1, NT_MAX_BLOCK_SIZE),
    OPT("vocab_size", gpt.vocab_size, NT_STATE_I32, 1, NT_MAX_VOCAB_SIZE),
    OPT("dropout", gpt.dropout, NT_STATE_F32, 0, 1),
};
static const nt_state_field cnn_fields[] = {
    OPT("c1", cnn.c1, NT_STATE_I32, 1, NT_MAX_CNN_WIDTH),
    OPT("c2", cnn.c2, NT_STATE_I32, 1, NT_MAX_CNN_WIDTH),
    OPT("hidden", cnn.hidden, NT_STATE_I32, 1, NT_MAX_CNN_WIDTH),
    OPT("dropout", cnn.dropout, NT_STATE_F32, 0, 1),
};
#undef OPT
#define NFIELDS(t) ((int)(sizeof t / sizeof t[0]))

/* Options a resumed run may change (the run's length, how it reports, what it samples). */
static const char *const overridable[] = {"max-iters", "eval-interval", "log-interval",
                                          "checkpoint-interval", "keep-checkpoints",
                                          "num-workers", "sample", "temperature", "top-k",
                                          "metrics-interval"};

/* Where the loop stands, with the RNG and the optimizer's step. */
typedef struct {
  int64_t iter, batch, eval_count;
  uint64_t epoch, rng_seed, rng_offset;
  double best_val_loss;   /* 1e30: no evaluation yet */
  int32_t optimizer_step;
  int64_t samples;        /* of the epoch, over every rank: a resume at another world size
                           * takes up the same position (DistributedSampler's global batches are
                           * the same sets when batch x N is) */
} position;
static const nt_state_field position_fields[] = {
    NT_STATE_FIELD(position, iter, NT_STATE_I64, 0, NT_MAX_ITERS),
    NT_STATE_FIELD(position, epoch, NT_STATE_U64, 0, NT_MAX_ITERS),
    NT_STATE_FIELD(position, batch, NT_STATE_I64, 0, NT_MAX_ITERS),
    NT_STATE_FIELD(position, eval_count, NT_STATE_I64, 0, NT_MAX_ITERS),
    NT_STATE_FIELD(position, best_val_loss, NT_STATE_F64, -NT_STATE_ANY, NT_STATE_ANY),
    NT_STATE_FIELD(position, rng_seed, NT_STATE_U64, 0, NT_STATE_ANY),
    NT_STATE_FIELD(position, rng_offset, NT_STATE_U64, 0, NT_STATE_ANY),
    NT_STATE_FIELD(position, optimizer_step, NT_STATE_I32, 0, INT32_MAX),
    NT_STATE_FIELD(position, samples, NT_STATE_I64, 0, INT64_MAX),
};

static bool is_given(const nt_train_options *o, const char *name) {
  for (int i = 0; i < o->n_given; i++)
    if (!strcmp(o->given[i], name)) return true;
  return false;
}

/* The kind of GPT data a --data value names: shakespeare, synthetic, or a token shard. */
static const char *data_kind(const char *src) {
  return !strcmp(src, "shakespeare") || !strcmp(src, "synthetic") ? src : "a token shard";
}

/* Options that set several saved fields at once, or a field under another name (--widths,
 * --preset, --no-decay-lr), and the GPT's data source: a conflict names the option as typed
 * with both values; an absent --data takes the checkpoint's. Run before the tables' merge (so
 * a field given on its own, e.g. --n-layer after --preset, is that merge's). */
static nt_status merge_composite(nt_ctx *ctx, const nt_json *side, nt_train_options *o) {
  const nt_json *cfg = nt_json_get(side, "config"), *mc = nt_json_get(side, "model_config");
  char msg[512] = "";
  size_t used = 0;
  int n = 0;
#define CONFLICT(...) do { \
    int w_ = snprintf(msg + used, sizeof msg - used, "%s", n++ ? ", " : ""); \
    if (w_ > 0 && (size_t)w_ < sizeof msg - used) used += (size_t)w_; \
    w_ = snprintf(msg + used, sizeof msg - used, __VA_ARGS__); \
    if (w_ > 0 && (size_t)w_ < sizeof msg - used) used += (size_t)w_; \
  } while (0)
  const nt_json *decay = nt_json_get(cfg, "decay_lr");
  if (is_given(o, "no-decay-lr") && decay && decay->type == NT_JSON_BOOL && decay->b)
    CONFLICT("--no-decay-lr (the checkpoint decays the learning rate)");
  if (o->model == NT_MODEL_CNN && is_given(o, "widths")) {
    int64_t c1 = nt_json_get_i64(mc, "c1", -1), c2 = nt_json_get_i64(mc, "c2", -1),
            h = nt_json_get_i64(mc, "hidden", -1);
    if (c1 != o->cnn.c1 || c2 != o->cnn.c2 || h != o->cnn.hidden)
      CONFLICT("--widths %d,%d,%d (the checkpoint has %lld,%lld,%lld)", o->cnn.c1, o->cnn.c2,
               o->cnn.hidden, (long long)c1, (long long)c2, (long long)h);
  }
  if (o->model == NT_MODEL_GPT && is_given(o, "preset")) {
    /* the preset's fields not given on their own; a text corpus sets the vocabulary size */
    struct { const char *opt, *key; double mine; } f[] = {
        {"n-layer", "n_layer", o->gpt.n_layer},       {"n-head", "n_head", o->gpt.n_head},
        {"n-embd", "n_embd", o->gpt.n_embd},          {"block-size", "block_size", o->gpt.block_size},
        {"vocab-size", "vocab_size", o->gpt.vocab_size}, {"dropout", "dropout", o->gpt.dropout}};
    bool text = nt_json_get(mc, "vocab") != NULL;
    char diff[256] = "";
    size_t dn = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
      if (is_given(o, f[i].opt) || (text && !strcmp(f[i].key, "vocab_size"))) continue;
      double ck = nt_json_get_num(mc, f[i].key, NAN);
      if ((float)ck == (float)f[i].mine) continue;
      int w = snprintf(diff + dn, sizeof diff - dn, "%s%s %g (the checkpoint has %g)",
                       dn ? ", " : "", f[i].key, f[i].mine, ck);
      if (w > 0 && (size_t)w < sizeof diff - dn) dn += (size_t)w;
    }
    if (dn) CONFLICT("--preset: %s", diff);
  }
  const char *ck_data = nt_json_str(nt_json_get(nt_json_get(mc, "data"), "source"), NULL);
  if (o->model == NT_MODEL_GPT && ck_data && strcmp(ck_data, "fashion-mnist")) {
    if (!is_given(o, "data")) o->gpt_data = ck_data;   /* (the sidecar outlives the run) */
    else if (strcmp(data_kind(o->gpt_data), data_kind(ck_data)))
      CONFLICT("--data %s (the checkpoint has %s)", o->gpt_data, ck_data);
  }
#undef CONFLICT
  if (!n) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "--resume: %s conflict%s with the checkpoint; drop "
                  "%s to continue the run as saved", msg, n > 1 ? "" : "s", n > 1 ? "them" : "it");
}

nt_status nt_trainer_merge_config(nt_ctx *ctx, const nt_json *side, nt_train_options *o) {
  const char *what = "--resume";
  const char *model = nt_json_str(nt_json_get(side, "model"), "");
  const char *want = o->model == NT_MODEL_GPT ? "gpt" : "cnn";
  if (strcmp(model, want))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s %s: --model %s conflicts with the checkpoint "
                    "(a '%s' model)", what, o->resume, want, model);
  nt_status st0 = merge_composite(ctx, side, o);
  if (st0) return st0;
  /* Data parallel: --batch-size is per rank, so a resume at another world size (or another
   * number of micro-steps) may change it as long as the global batch stays the same. */
  const nt_json *dp = nt_json_get(side, "data_parallel");
  int64_t accum = o->dist.grad_accum_steps > 1 ? o->dist.grad_accum_steps : 1;
  bool same_split = nt_json_get_i64(dp, "world_size", 1) == o->world_size &&
                    nt_json_get_i64(dp, "grad_accum_steps", 1) == accum;
  int64_t ck_global = same_split ? 0 : nt_json_get_i64(dp, "global_batch", 0);
  const char *over[NFIELDS(overridable) + 1];
  int n_over = 0;
  for (; n_over < NFIELDS(overridable); n_over++) over[n_over] = overridable[n_over];
  if (ck_global > 0) over[n_over++] = "batch-size";
  nt_status st = nt_state_merge(ctx, nt_json_get(side, "config"), config_fields,
                                NFIELDS(config_fields), o, sizeof *o, o->given, o->n_given,
                                over, n_over, what);
  if (!st && ck_global > 0 && o->batch_size * o->world_size * accum != ck_global)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "%s: a global batch of %lld (--batch-size %lld x %d rank(s) x "
                    "--grad-accum-steps %lld) differs from the checkpoint's %lld: give the "
                    "per-rank --batch-size that keeps it", what,
                    (long long)(o->batch_size * o->world_size * accum), (long long)o->batch_size,
                    o->world_size, (long long)accum, (long long)ck_global);
  const nt_json *mc = nt_json_get(side, "model_config");
  if (!st && o->model == NT_MODEL_GPT)
    st = nt_state_merge(ctx, mc, gpt_fields, NFIELDS(gpt_fields), o, sizeof *o, o->given,
                        o->n_given, NULL, 0, what);
  if (!st && o->model == NT_MODEL_CNN)
    st = nt_state_merge(ctx, mc, cnn_fields, NFIELDS(cnn_fields), o, sizeof *o, o->given,
                        o->n_given, NULL, 0, what);
  if (st) return st;
  /* the precision the run computed in (after any fallback) */
  const char *saved = nt_json_str(nt_json_get(side, "precision"), "");
  nt_precision p;
  st = nt_precision_parse(ctx, saved, &p);
  if (st)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: the checkpoint's precision '%s' is unknown", what,
                    saved);
  if (is_given(o, "dtype") && p != o->precision)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "%s: --dtype %s (the checkpoint has %s) conflicts with the checkpoint; drop "
                    "it to continue the run as saved", what, nt_precision_name(o->precision),
                    saved);
  o->precision = p;
  return NT_OK;
}

/* The sidecar's text (rank 0): everything but the tensors. */
static nt_status sidecar_json(nt_trainer *T, bool whole_file, char **out) {
  const nt_train_options *o = T->o;
  nt_ctx *ctx = T->ctx;
  *out = NULL;
  position pos = {T->iter, T->batch_in_epoch, T->eval_count, T->epoch, nt_ctx_seed(ctx),
                  nt_ctx_rng_offset(ctx), T->best_val, 0,
                  T->batch_in_epoch * o->batch_size * T->world};
  nt_scaler_state ss;
  nt_status st = nt_adamw_get_step(ctx, T->opt.adamw, &pos.optimizer_step);
  if (!st) st = nt_scaler_state_get(ctx, T->opt.scaler, &ss);
  if (st) return st;
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "format");
  nt_jw_str(&w, "nanotrain-checkpoint");
  nt_jw_key(&w, "version");
  nt_jw_i64(&w, 2);
  nt_jw_key(&w, "model");
  nt_jw_str(&w, T->model->ops->name);
  nt_jw_key(&w, "precision");
  nt_jw_str(&w, nt_precision_name(T->pol.precision));   /* effective, after any fallback */
  nt_jw_key(&w, "iter");   /* names the checkpoint's directory */
  nt_jw_i64(&w, T->iter);
  nt_jw_key(&w, "tensors");   /* the consolidated file, or one file per rank (the manifest) */
  nt_jw_str(&w, whole_file ? "ckpt.safetensors" : "sharded");
  nt_jw_key(&w, "config");
  nt_jw_begin(&w, '{');
  nt_state_write(&w, config_fields, NFIELDS(config_fields), o);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "model_config");
  nt_jw_begin(&w, '{');
  T->model->ops->write_config(&w, T->model);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "data_parallel");   /* informational, except the global batch (a resume) */
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "world_size");
  nt_jw_i64(&w, T->world);
  nt_jw_key(&w, "grad_accum_steps");
  nt_jw_i64(&w, T->accum);
  nt_jw_key(&w, "sharding_strategy");
  nt_jw_str(&w, nt_sharding_name(o->dist.fsdp.strategy));
  nt_jw_key(&w, "checkpoint_format");
  nt_jw_str(&w, nt_checkpoint_format_name(nt_trainer_checkpoint_format(T)));
  nt_jw_key(&w, "global_batch");
  nt_jw_i64(&w, o->batch_size * T->world * T->accum);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "position");
  nt_jw_begin(&w, '{');
  nt_state_write(&w, position_fields, NFIELDS(position_fields), &pos);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "scaler");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "enabled");
  nt_jw_bool(&w, nt_scaler_enabled(T->opt.scaler));
  nt_state_write(&w, nt_scaler_state_fields, nt_scaler_state_n_fields, &ss);
  nt_jw_end(&w, '}');
  nt_jw_end(&w, '}');
  *out = nt_jw_finish(&w);
  return *out ? NT_OK : NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the checkpoint sidecar");
}

nt_status nt_trainer_save(nt_trainer *T) {
  const nt_train_options *o = T->o;
  if (!o->out_dir) return NT_OK;
  nt_ctx *ctx = T->ctx;
  nt_checkpoint_format fmt = nt_trainer_checkpoint_format(T);
  bool shards = fmt == NT_CKPT_SHARDED || fmt == NT_CKPT_BOTH, whole_file = fmt != NT_CKPT_SHARDED;
  /* the consolidated file of a sharded state: every rank takes part in the gathers */
  nt_trainer_whole whole;
  memset(&whole, 0, sizeof whole);
  nt_status st = NT_OK;
  if (nt_trainer_shard_views(T) && whole_file) st = nt_trainer_consolidate(T, &whole, true);
  char *json = NULL, saved[4096] = "";
  bool warned = false;       /* saved, but what follows the rename failed (rank 0) */
  nt_ctx *committer = ctx;   /* the context holding that warning */
  if (!st && T->rank == 0) st = sidecar_json(T, whole_file, &json);
  if (shards) {   /* every rank writes its file; rank 0 commits (the outcome is shared) */
    st = nt_trainer_save_sharded(T, st, json, whole_file ? &whole : NULL, saved, &warned);
  } else if (!st && T->rank == 0) {
    if (nt_trainer_shard_views(T)) {   /* the consolidated state lives in host memory */
      committer = T->host;
      st = nt_trainer_host_error(T, nt_checkpoint_save_keep(T->host, o->out_dir, &whole.params,
                                                            whole.adamw, json,
                                                            o->keep_checkpoints, saved,
                                                            &warned));
    } else {
      st = nt_checkpoint_save_keep(ctx, o->out_dir, T->model->params, T->opt.adamw, json,
                                   o->keep_checkpoints, saved, &warned);
    }
  }
  free(json);
  nt_trainer_whole_free(T, &whole);
  if (st) return st;
  T->last_save_iter = T->iter;
  nt_trainer_print(T, "saved checkpoint %s (step %lld)\n", saved, (long long)T->iter);
  if (warned) fprintf(stderr, "nanotrain: warning: %s\n", nt_last_error(committer));
  return NT_OK;
}

nt_status nt_trainer_checkpoint(nt_trainer *T, bool final) {
  if (!T->o->out_dir || T->last_save_iter == T->iter) return NT_OK;
  nt_status st = nt_trainer_save(T);
  if (!st || final) return st;
  /* the previous checkpoint is whole (a save writes a new directory); the next save point
   * tries again */
  T->res->failed_saves++;
  if (T->bar) fprintf(T->out, "\n");
  fprintf(stderr, "nanotrain: warning: checkpoint at step %lld not saved (%s); training goes "
          "on and the next save point tries again\n", (long long)T->iter,
          nt_last_error(T->ctx));
  return NT_OK;
}

nt_status nt_trainer_resolve_resume(nt_trainer *T, const char *where, char *dir) {
  char mine[PATH_MAX] = "";
  nt_status st = nt_checkpoint_resolve(T->ctx, where, mine, sizeof mine);
  st = nt_trainer_agree(T, st, "finding the checkpoint of --resume");
  if (st) return st;
  snprintf(dir, PATH_MAX, "%s", mine);
  if (!T->comm || T->world < 2) return NT_OK;
  char(*all)[PATH_MAX] = T->gathered;   /* every rank's directory */
  st = nt_comm_gather_bytes(T->comm, T->ctx, mine, sizeof mine, all);
  for (int r = 1; !st && r < T->world; r++)
    if (strcmp(all[r], all[0]))
      st = NT_ERROR(T->ctx, NT_ERR_STATE, "--resume %s: rank %d found the checkpoint %s, rank 0 "
                    "%s (the out-dir changed while the ranks started, or they do not share a "
                    "file system); resume from one checkpoint directory", where, r, all[r],
                    all[0]);
  return st;
}

nt_status nt_trainer_read_sidecar(nt_ctx *ctx, const char *where, nt_json *root) {
  char *text = NULL;
  nt_status st = nt_checkpoint_read_sidecar(ctx, where, &text);
  if (st) return st;
  st = nt_json_parse(ctx, text, strlen(text), where, root);
  free(text);
  if (!st && strcmp(nt_json_str(nt_json_get(root, "format"), ""), "nanotrain-checkpoint")) {
    nt_json_free(root);
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: not a nanotrain checkpoint sidecar", where);
  }
  return st;
}

/* Parameters and moments: from the shards when the checkpoint has them (each rank reads what
 * it owns), else from the consolidated file (whole, then this rank's shards of it). The ranks
 * agree on each outcome, so that all fail together. */
static nt_status load_state(nt_trainer *T, const char *where) {
  char dir[PATH_MAX];
  nt_json m;
  nt_status read = nt_checkpoint_manifest(T->ctx, where, dir, sizeof dir, &m);
  nt_status st = nt_trainer_agree(T, read, "reading the checkpoint's manifest");
  if (st) {
    if (!read) nt_json_free(&m);
    return st;
  }
  if (nt_trainer_manifest_sharded(&m)) {
    st = nt_trainer_load_sharded(T, dir, &m);
  } else if (nt_trainer_shard_views(T)) {
    nt_trainer_whole whole;
    st = nt_trainer_consolidate(T, &whole, false);
    if (!st)
      st = nt_trainer_host_error(T, nt_checkpoint_load_tensors(T->host, dir, &whole.params,
                                                               whole.adamw));
    if (!st) st = nt_trainer_scatter(T, &whole);
    nt_trainer_whole_free(T, &whole);
  } else {
    st = nt_checkpoint_load_tensors(T->ctx, dir, T->model->params, T->opt.adamw);
  }
  if (!nt_trainer_manifest_sharded(&m))   /* (the sharded load agrees already) */
    st = nt_trainer_agree(T, st, "reading the checkpoint");
  nt_json_free(&m);
  return st;
}

nt_status nt_trainer_restore(nt_trainer *T, const nt_json *root) {
  nt_ctx *ctx = T->ctx;
  const char *where = T->o->resume;
  const char *model = nt_json_str(nt_json_get(root, "model"), "");
  if (strcmp(model, T->model->ops->name))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: a '%s' checkpoint cannot resume a '%s' run", where,
                    model, T->model->ops->name);
  position pos;
  nt_scaler_state ss;
  nt_status st = nt_scaler_state_get(ctx, T->opt.scaler, &ss);
  if (!st) st = nt_state_read(ctx, nt_json_get(root, "position"), position_fields,
                              NFIELDS(position_fields), &pos, sizeof pos, "ckpt.json position");
  if (!st) st = nt_state_read(ctx, nt_json_get(root, "scaler"), nt_scaler_state_fields,
                              nt_scaler_state_n_fields, &ss, sizeof ss, "ckpt.json scaler");
  if (!st) st = load_state(T, where);
  if (!st) st = nt_adamw_set_step(ctx, T->opt.adamw, pos.optimizer_step);
  if (!st && nt_scaler_enabled(T->opt.scaler)) st = nt_scaler_state_set(ctx, T->opt.scaler, &ss);
  if (st) return st;
  /* the file holds rank 0's dropout stream; the other ranks derive theirs from it */
  nt_ctx_manual_seed(ctx, nt_train_dropout_seed(pos.rng_seed, T->rank));
  nt_ctx_set_rng_offset(ctx, pos.rng_offset);
  T->iter = T->iter_last = pos.iter;
  T->epoch = pos.epoch;
  /* the same position in samples at any world size */
  int64_t per_batch = T->o->batch_size * T->world;
  if (pos.samples % per_batch)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: resuming %lld samples into the epoch with %d "
                    "rank(s) of batch %lld: not a whole number of batches", where,
                    (long long)pos.samples, T->world, (long long)T->o->batch_size);
  T->batch_in_epoch = pos.samples / per_batch;
  T->eval_count = pos.eval_count;
  T->best_val = pos.best_val_loss;
  T->last_save_iter = T->iter;   /* this step is saved: a run that trains no further (sampling
                                  * from a checkpoint) does not write it again */
  T->res->steps = T->iter;
  nt_trainer_print(T, "resumed from %s at step %lld (epoch %llu, batch %lld)\n", where,
                   (long long)T->iter, (unsigned long long)T->epoch, (long long)T->batch_in_epoch);
  return NT_OK;
}

