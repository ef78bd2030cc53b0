/* Checkpoints of a training run: the model's tensors and AdamW's moments in a safetensors file
 * (models/checkpoint.h), everything else (optimizer step, scaler, RNG, loop position, the
 * model's config) in a JSON sidecar; a resume restores all of it, so it continues bit-identically. */
#include "train/train_internal.h"
#include "models/checkpoint.h"
#include <stdlib.h>
#include <string.h>

nt_status nt_trainer_save(nt_trainer *T) {
  const nt_train_options *o = T->o;
  if (!o->out_dir) return NT_OK;
  nt_ctx *ctx = T->ctx;
  int32_t step = 0;
  nt_scaler_state ss;
  nt_status st = nt_adamw_get_step(ctx, T->opt.adamw, &step);
  if (!st) st = nt_scaler_state_get(ctx, T->opt.scaler, &ss);
  if (st) return st;
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "format");
  nt_jw_str(&w, "nanotrain-checkpoint");
  nt_jw_key(&w, "version");
  nt_jw_i64(&w, 1);
  nt_jw_key(&w, "model");
  nt_jw_str(&w, T->model->ops->name);
  nt_jw_key(&w, "precision");
  nt_jw_str(&w, nt_precision_name(T->pol.precision));   /* effective, after any fallback */
  nt_jw_key(&w, "iter");
  nt_jw_i64(&w, T->iter);
  nt_jw_key(&w, "best_val_loss");
  nt_jw_num(&w, T->best_val);
  nt_jw_key(&w, "tensors");
  nt_jw_str(&w, "ckpt.safetensors");
  nt_jw_key(&w, "config");
  nt_jw_begin(&w, '{');
  T->model->ops->write_config(&w, T->model);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "optimizer");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "type");
  nt_jw_str(&w, "adamw");
  nt_jw_key(&w, "step");
  nt_jw_i64(&w, step);
  nt_jw_key(&w, "lr");
  nt_jw_num(&w, o->lr);
  nt_jw_key(&w, "betas");
  nt_jw_begin(&w, '[');
  nt_jw_num(&w, o->beta1);
  nt_jw_num(&w, o->beta2);
  nt_jw_end(&w, ']');
  nt_jw_key(&w, "eps");
  nt_jw_num(&w, o->eps);
  nt_jw_key(&w, "weight_decay");
  nt_jw_num(&w, o->weight_decay);
  nt_jw_key(&w, "moments");
  nt_jw_str(&w, "optimizer.<unit>.exp_avg / exp_avg_sq in the safetensors file");
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "scaler");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "enabled");
  nt_jw_bool(&w, nt_scaler_enabled(T->opt.scaler));
  nt_jw_key(&w, "scale");
  nt_jw_num(&w, ss.scale);
  nt_jw_key(&w, "growth_factor");
  nt_jw_num(&w, ss.growth_factor);
  nt_jw_key(&w, "backoff_factor");
  nt_jw_num(&w, ss.backoff_factor);
  nt_jw_key(&w, "growth_interval");
  nt_jw_i64(&w, ss.growth_interval);
  nt_jw_key(&w, "growth_tracker");
  nt_jw_i64(&w, ss.growth_tracker);
  nt_jw_key(&w, "min_scale");
  nt_jw_num(&w, ss.min_scale);
  nt_jw_key(&w, "max_scale");
  nt_jw_num(&w, ss.max_scale);
  nt_jw_key(&w, "hysteresis");
  nt_jw_i64(&w, ss.hysteresis);
  nt_jw_key(&w, "hysteresis_left");
  nt_jw_i64(&w, ss.hysteresis_left);
  nt_jw_key(&w, "updates");
  nt_jw_i64(&w, ss.updates);
  nt_jw_key(&w, "skipped_total");
  nt_jw_i64(&w, ss.skipped_total);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "rng");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "seed");
  nt_jw_u64(&w, nt_ctx_seed(ctx));
  nt_jw_key(&w, "offset");
  nt_jw_u64(&w, nt_ctx_rng_offset(ctx));
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "loader");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "epoch");
  nt_jw_u64(&w, T->epoch);
  nt_jw_key(&w, "batch");
  nt_jw_i64(&w, T->batch_in_epoch);
  nt_jw_key(&w, "seed");
  nt_jw_u64(&w, o->seed);
  nt_jw_end(&w, '}');
  nt_jw_key(&w, "train");
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "batch_size");
  nt_jw_i64(&w, o->batch_size);
  nt_jw_key(&w, "max_iters");
  nt_jw_i64(&w, o->max_iters);
  nt_jw_key(&w, "epochs");
  nt_jw_i64(&w, o->epochs);
  nt_jw_key(&w, "min_lr");
  nt_jw_num(&w, o->min_lr);
  nt_jw_key(&w, "warmup_iters");
  nt_jw_i64(&w, o->warmup_iters);
  nt_jw_key(&w, "lr_decay_iters");
  nt_jw_i64(&w, o->lr_decay_iters);
  nt_jw_key(&w, "grad_clip");
  nt_jw_num(&w, o->grad_clip);
  nt_jw_end(&w, '}');
  nt_jw_end(&w, '}');
  char *json = nt_jw_finish(&w);
  if (!json) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the checkpoint sidecar");
  char saved[4096] = "";
  st = nt_checkpoint_save_keep(ctx, o->out_dir, T->model->params, T->opt.adamw, json,
                               o->keep_checkpoints, saved);
  free(json);
  if (st) return st;
  T->last_save_iter = T->iter;
  nt_trainer_print(T, "saved checkpoint %s (step %lld)\n", saved, (long long)T->iter);
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

nt_status nt_trainer_restore(nt_trainer *T, const nt_json *root) {
  nt_ctx *ctx = T->ctx;
  const char *where = T->o->resume;
  const char *model = nt_json_str(nt_json_get(root, "model"), "");
  if (strcmp(model, T->model->ops->name))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: a '%s' checkpoint cannot resume a '%s' run", where,
                    model, T->model->ops->name);
  nt_status st = nt_checkpoint_load_tensors(ctx, where, T->model->params, T->opt.adamw);
  if (st) return st;
  const nt_json *opt = nt_json_get(root, "optimizer"), *sc = nt_json_get(root, "scaler");
  const nt_json *rng = nt_json_get(root, "rng"), *ld = nt_json_get(root, "loader");
  if (!opt || !sc || !rng || !ld)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: sidecar lacks optimizer/scaler/rng/loader", where);
  st = nt_adamw_set_step(ctx, T->opt.adamw, (int32_t)nt_json_get_i64(opt, "step", 0));
  if (st) return st;
  nt_scaler_state ss;
  st = nt_scaler_state_get(ctx, T->opt.scaler, &ss);
  if (st) return st;
  ss.scale = (float)nt_json_get_num(sc, "scale", ss.scale);
  ss.growth_factor = (float)nt_json_get_num(sc, "growth_factor", ss.growth_factor);
  ss.backoff_factor = (float)nt_json_get_num(sc, "backoff_factor", ss.backoff_factor);
  ss.growth_interval = (int32_t)nt_json_get_i64(sc, "growth_interval", ss.growth_interval);
  ss.growth_tracker = (int32_t)nt_json_get_i64(sc, "growth_tracker", ss.growth_tracker);
  ss.min_scale = (float)nt_json_get_num(sc, "min_scale", ss.min_scale);
  ss.max_scale = (float)nt_json_get_num(sc, "max_scale", ss.max_scale);
  ss.hysteresis = (int32_t)nt_json_get_i64(sc, "hysteresis", ss.hysteresis);
  ss.hysteresis_left = (int32_t)nt_json_get_i64(sc, "hysteresis_left", ss.hysteresis_left);
  ss.updates = nt_json_get_i64(sc, "updates", ss.updates);
  ss.skipped_total = nt_json_get_i64(sc, "skipped_total", ss.skipped_total);
  if (nt_scaler_enabled(T->opt.scaler)) st = nt_scaler_state_set(ctx, T->opt.scaler, &ss);
  if (st) return st;
  nt_ctx_manual_seed(ctx, nt_json_u64(nt_json_get(rng, "seed"), nt_ctx_seed(ctx)));
  nt_ctx_set_rng_offset(ctx, nt_json_u64(nt_json_get(rng, "offset"), 0));
  T->iter = T->iter_last = nt_json_get_i64(root, "iter", 0);
  T->epoch = nt_json_u64(nt_json_get(ld, "epoch"), 0);
  T->batch_in_epoch = nt_json_get_i64(ld, "batch", 0);
  T->best_val = nt_json_get_num(root, "best_val_loss", 1e30);
  T->res->steps = T->iter;
  nt_trainer_print(T, "resumed from %s at step %lld (epoch %llu, batch %lld)\n", where,
                   (long long)T->iter, (unsigned long long)T->epoch, (long long)T->batch_in_epoch);
  return NT_OK;
}

