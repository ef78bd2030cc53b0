/* The training loop, the same for every model (train/model.h): the optimizer and scaler for
 * the model's parameters, the step (train/step.h), the LR schedule (optim/schedule.h),
 * evaluations, logging and metrics; checkpoints are in train/train_checkpoint.c. */
#include "train/train_internal.h"
#include "core/cuda_util.h"
#include "models/checkpoint.h"
#include "core/stop.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

nt_train_options nt_train_defaults(nt_model_kind model) {
  nt_train_options o;
  memset(&o, 0, sizeof o);
  o.model = model;
  o.device = nt_cpu();
  o.precision = NT_PREC_FP32;
  o.gpt = nt_gpt_config_shakespeare_char();
  o.cnn = nt_cnn_config_default();
  o.gpt_data = "shakespeare";
  o.beta1 = 0.9;
  o.eps = 1e-8;
  o.grad_clip = 1.0;
  o.decay_lr = true;
  o.init_scale = 65536.0f;
  o.growth_factor = 2.0f;
  o.backoff_factor = 0.5f;
  o.growth_interval = 2000;
  o.seed = 1337;
  o.num_workers = 2;
  o.world_size = 1;
  o.cuda_graph = -1;
  o.progress = -1;
  o.temperature = 0.8f;
  o.top_k = 200;
  o.dist.fsdp = nt_fsdp_defaults();
  o.dist.grad_accum_steps = 1;
  if (model == NT_MODEL_GPT) {
    /* nanoGPT config/train_shakespeare_char.py */
    o.batch_size = 64;
    o.max_iters = 5000;
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.beta2 = 0.99;
    o.weight_decay = 0.1;
    o.warmup_iters = 100;
    o.lr_decay_iters = 5000;
    o.eval_interval = 250;
    o.checkpoint_interval = 250;
    o.eval_iters = 200;
    o.log_interval = 10;
  } else {
    o.batch_size = 128;
    o.epochs = 10;
    o.lr = 1e-3;
    o.min_lr = 1e-5;
    o.beta2 = 0.999;
    o.weight_decay = 0.05;
    o.warmup_iters = 0;
    o.eval_interval = 0;   /* the CNN evaluates after every epoch */
    o.log_interval = 50;
    o.growth_interval = 1000;   /* the CNN preset of the loss scaler */
    o.num_workers = 4;
  }
  return o;
}

void nt_trainer_print(nt_trainer *T, const char *fmt, ...) {
  if (T->o->quiet || T->rank != 0) return;
  if (T->bar) fprintf(T->out, "\r\033[K");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(T->out, fmt, ap);
  va_end(ap);
  fflush(T->out);
}

/* Dense peak FLOP/s of the GPU for the precision (for MFU), 0 when unknown. */
static double peak_flops(nt_ctx *ctx, nt_precision p) {
#ifdef NT_HAVE_CUDA
  if (!nt_ctx_is_cuda(ctx)) return 0;
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, nt_ctx_device(ctx).index) != cudaSuccess) return 0;
  /* H100/H200 SXM and A100 datasheet dense numbers */
  double bf16 = prop.major >= 9 ? 989.4e12 : prop.major == 8 && prop.minor == 0 ? 312e12 : 0;
  double fp32 = prop.major >= 9 ? 66.9e12 : prop.major == 8 && prop.minor == 0 ? 19.5e12 : 0;
  switch (p) {
  case NT_PREC_FP32: return fp32;
  case NT_PREC_TF32: return bf16 / 2;
  default: return bf16;
  }
#else
  (void)ctx;
  (void)p;
  return 0;
#endif
}

/* The step's body: the model's micro-step on the staged batch. */
static nt_status train_body(nt_ctx *ctx, void *arg, const float *loss_scale,
                            const nt_unit_hooks *hooks) {
  nt_trainer *T = arg;
  return T->model->ops->train_micro_step(ctx, T->model, &T->batch, loss_scale, hooks);
}

/* Optimizer and scaler (per the precision policy), the LR schedule, the step, metrics files. */
static nt_status trainer_init(nt_trainer *T) {
  const nt_train_options *o = T->o;
  nt_ctx *ctx = T->ctx;
  nt_model *md = T->model;
  T->best_val = 1e30;
  T->last_eval_iter = T->last_save_iter = -1;
  T->bar = o->progress == 1 || (o->progress < 0 && isatty(fileno(T->out)));
  T->peak_flops = peak_flops(ctx, T->pol.precision);
  /* how long the run is: iterations, or epochs of the model's batch source */
  int64_t nb = md->batches_per_epoch, schedule_iters = 0;
  T->total_iters = o->max_iters;
  if (nb > 0) {
    /* --max-iters stops, not reshapes; an iteration takes K batches */
    T->total_iters = schedule_iters = nb / T->accum * o->epochs;
    if (o->max_iters > 0 && o->max_iters < T->total_iters) T->total_iters = o->max_iters;
  }
  int64_t decay = o->lr_decay_iters > 0 ? o->lr_decay_iters
                  : schedule_iters > 0 ? schedule_iters : T->total_iters;
  T->sched = o->decay_lr ? nt_schedule_warmup_cosine(o->lr, o->min_lr, o->warmup_iters, decay)
                         : nt_schedule_constant(o->lr);
  nt_optimizer_options oo = nt_optimizer_defaults();
  oo.adamw.lr = o->lr;
  oo.adamw.beta1 = o->beta1;
  oo.adamw.beta2 = o->beta2;
  oo.adamw.eps = o->eps;
  oo.adamw.weight_decay = o->weight_decay;
  oo.scaler.enabled = T->pol.needs_scaler;
  oo.scaler.init_scale = o->init_scale;
  oo.scaler.growth_factor = o->growth_factor;
  oo.scaler.backoff_factor = o->backoff_factor;
  oo.scaler.growth_interval = o->growth_interval;
  nt_step_options so;
  memset(&so, 0, sizeof so);
  so.params = md->params;
  so.body = train_body;
  so.body_arg = T;
  so.max_norm = (float)o->grad_clip;
  so.cuda_graph = T->accum > 1 ? 0 : o->cuda_graph;   /* accumulation runs eagerly */
  so.trace = o->trace && T->rank == 0 ? T->out : NULL;
  /* data parallel: the FSDP runtime, AdamW over the owned shards, the step's hooks */
  nt_status st = nt_trainer_dist_init(T, &oo, &so);
  if (!st && !T->fsdp) st = nt_optimizer_for_params(ctx, md->params, &oo, &T->opt);
  if (!st) st = nt_trainer_check_config(T);
  so.optimizer = T->opt;
  if (!st) st = nt_step_create(ctx, &so, &T->step);
  if (st) return st;
  if (o->out_dir && T->rank == 0) {
    char path[4096];
    st = nt_make_dirs(ctx, o->out_dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    st = nt_metrics_log_open(ctx, path, o->resume != NULL, &T->log);
    if (st) return st;
    snprintf(T->prom_path, sizeof T->prom_path, "%s/metrics.prom", o->out_dir);
  }
  if (nt_ctx_is_cuda(ctx)) {
    st = nt_event_create(ctx, &T->ev_start, true);
    if (!st) st = nt_event_create(ctx, &T->ev_end, true);
    if (st) return st;
  }
  T->t_start = nt_now_s();
  return NT_OK;
}

static void trainer_free(nt_trainer *T) {
  nt_event_free(T->ctx, T->ev_start);
  nt_event_free(T->ctx, T->ev_end);
  nt_step_free(T->ctx, T->step);
  nt_metrics_log_close(T->log);
  nt_optimizer_free(T->ctx, &T->opt);
  nt_trainer_dist_free(T);
  nt_model_free(T->ctx, T->model);
  memset(T, 0, sizeof *T);
}

static void fmt_duration(char *buf, size_t len, double s) {
  if (!(s >= 0) || s > 1e7) snprintf(buf, len, "--");
  else if (s >= 3600) snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

static void fill_memory(nt_trainer *T, nt_train_metrics *m) {
  nt_mem_stats ms;
  nt_mem_get_stats(T->ctx, &ms);
  m->mem_allocated = (double)ms.allocated;
  m->mem_reserved = (double)ms.reserved;
  m->mem_peak = (double)ms.peak_allocated;
}

/* A metrics file that cannot be written (full disk, removed out-dir) costs a warning, not the
 * run: the first failure and then every 100th are reported. */
static void metrics_failed(nt_trainer *T) {
  if (T->res->failed_metrics++ % 100) return;
  if (T->bar) fprintf(T->out, "\n");
  fprintf(stderr, "nanotrain: warning: metrics not written (%s); training goes on\n",
          nt_last_error(T->ctx));
}

static void write_metrics(nt_trainer *T, const nt_train_metrics *m, bool prom) {
  if (T->log && nt_metrics_log_write(T->ctx, T->log, m)) metrics_failed(T);
  if (prom && T->prom_path[0] && nt_metrics_prometheus_write(T->ctx, T->prom_path, m))
    metrics_failed(T);
}

/* A log window starts: now, and (GPU) an event on the compute stream. */
static nt_status window_start(nt_trainer *T) {
  T->t_last = nt_now_s();
  return T->ev_start ? nt_event_record(T->ctx, T->ev_start, NULL) : NT_OK;
}

/* Seconds since the window started: the events' elapsed time on a GPU (ev_end was recorded
 * after the window's last step; the loss read before this call has synchronized), else the
 * host's clock. */
static nt_status window_seconds(nt_trainer *T, double now, double *dt) {
  *dt = now - T->t_last;
  if (!T->ev_start) return NT_OK;
  float ms = 0;
  nt_status st = nt_event_synchronize(T->ctx, T->ev_end);
  if (!st) st = nt_event_elapsed_ms(T->ctx, T->ev_start, T->ev_end, &ms);
  if (!st) *dt = 1e-3 * (double)ms;
  return st;
}

/* Every rank's loss and peak memory reach rank 0, which logs their means and lists. */
static nt_status log_step(nt_trainer *T, float loss, const double *rank_loss) {
  const nt_train_options *o = T->o;
  const nt_model *md = T->model;
  double now = nt_now_s(), dt;
  int64_t steps = T->iter - T->iter_last;
  nt_scaler_values sv = {1.0f, 0, 0, 0, -1};
  float gn = NAN;
  nt_mem_stats ms;
  nt_mem_get_stats(T->ctx, &ms);
  double *rank_peak = T->world > 1 ? T->rank_peak : NULL;
  nt_status st = NT_OK;
  if (rank_peak) st = nt_trainer_gather(T, (double)ms.peak_allocated, rank_peak);
  if (!st && T->comm) st = nt_comm_check_fingerprint(T->comm, T->ctx);
  if (!st) st = window_seconds(T, now, &dt);
  if (!st) st = nt_scaler_read(T->ctx, T->opt.scaler, &sv);
  if (!st && o->grad_clip > 0) st = nt_adamw_last_grad_norm(T->ctx, T->opt.adamw, &gn);
  if (st) return st;
  if (!nt_scaler_enabled(T->opt.scaler)) sv.scale = 1.0f;
  nt_train_metrics m = nt_train_metrics_empty();
  m.world = T->world;
  m.rank_loss = T->world > 1 ? rank_loss : NULL;
  m.rank_mem_peak = rank_peak;
  m.model = md->ops->name;
  m.items = md->ops->items;
  m.step = T->iter;
  m.loss = loss;
  m.lr = nt_schedule_lr(&T->sched, T->iter - 1);
  m.scale = sv.scale;
  m.skipped_steps = sv.skipped_total;
  m.grad_norm = gn;
  if (steps > 0 && dt > 0) {
    m.step_ms = 1e3 * dt / (double)steps;
    m.items_per_sec = (double)(steps * T->res->global_batch) / dt;
    m.data_wait_ms = 1e3 * T->wait_s / (double)steps;
    if (T->peak_flops > 0) m.mfu = md->flops_per_item * m.items_per_sec / T->peak_flops;
    T->last_ips = m.items_per_sec;
    T->last_step_ms = m.step_ms;
  }
  if (md->batches_per_epoch > 0)
    m.epoch = (double)(T->iter * T->accum) / (double)md->batches_per_epoch;
  m.elapsed_s = now - T->t_start;
  fill_memory(T, &m);
  T->res->skipped = sv.skipped_total;
  bool prom = o->metrics_interval <= 0 || T->iter % o->metrics_interval == 0 ||
              T->iter == T->total_iters;
  write_metrics(T, &m, prom);
  m.rank_loss = m.rank_mem_peak = NULL;
  T->last_train = m;
  if (!o->quiet && T->rank == 0) {
    char eta[32], ips[32];
    fmt_duration(eta, sizeof eta, (double)(T->total_iters - T->iter) * m.step_ms / 1e3);
    double v = m.items_per_sec;
    if (v >= 1e6) snprintf(ips, sizeof ips, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(ips, sizeof ips, "%.1fk", v / 1e3);
    else snprintf(ips, sizeof ips, "%.1f", isnan(v) ? 0.0 : v);
    if (T->bar) {
      int width = 24, done = (int)(width * T->iter / (T->total_iters ? T->total_iters : 1));
      char bar[32];
      for (int i = 0; i < width; i++) bar[i] = i < done ? '=' : i == done ? '>' : ' ';
      bar[width] = 0;
      fprintf(T->out, "\r\033[K%lld/%lld [%s] loss %.4f | %s %s/s | scale %g | ETA %s",
              (long long)T->iter, (long long)T->total_iters, bar, (double)loss, ips,
              md->ops->items, (double)sv.scale, eta);
    } else {
      fprintf(T->out, "step %lld/%lld | loss %.4f | lr %.3e | scale %g | norm %.3f | %.1f ms | "
              "%s %s/s", (long long)T->iter, (long long)T->total_iters, (double)loss, m.lr,
              (double)sv.scale, (double)gn, m.step_ms, ips, md->ops->items);
      if (!isnan(m.mfu)) fprintf(T->out, " | mfu %.1f%%", 100 * m.mfu);
      fprintf(T->out, " | mem %.0f MiB\n", m.mem_allocated / 1048576.0);
    }
    fflush(T->out);
  }
  T->iter_last = T->iter;
  T->wait_s = 0;
  return window_start(T);
}

/* The forward + backward stage over the iteration's micro-batches (the first is staged
 * already): gradients accumulate over K micro-steps, reduced across ranks on the last only
 * (FSDP's no_sync before it). *loss: the mean of the micro-steps' losses when wanted (reads
 * the device after each). */
static nt_status forward_backward(nt_trainer *T, bool want_loss, float *loss) {
  nt_ctx *ctx = T->ctx;
  nt_model *md = T->model;
  double sum = 0;
  nt_status st = NT_OK;
  for (int k = 0; k < T->accum && !st; k++) {
    if (k > 0) {
      bool end = false;
      double wait = 0;
      st = md->ops->next_batch(ctx, md, T->iter * T->accum + k, &T->batch, &end, &wait);
      T->wait_s += wait;
      if (!st && end)
        st = NT_ERROR(ctx, NT_ERR_STATE, "the batch source ended inside an accumulation");
      if (!st && md->batches_per_epoch > 0) T->batch_in_epoch++;
      if (st) break;
    }
    if (T->fsdp) nt_fsdp_set_sync(T->fsdp, k == T->accum - 1);
    st = k == 0 ? nt_step_forward_backward(ctx, T->step) : nt_step_accumulate(ctx, T->step);
    float l = 0;
    if (!st && want_loss) st = nt_model_read_scalar(ctx, md->ops->loss(md), &l);
    sum += l;
  }
  *loss = (float)(sum / T->accum);
  return st;
}

/* One iteration: the step (train/step.h), then the bookkeeping; logs when due. Reads the loss
 * back (a sync) only when logging or recording every loss; with several ranks it is the mean
 * of the ranks' losses (a gather). */
static nt_status train_step(nt_trainer *T) {
  const nt_train_options *o = T->o;
  nt_ctx *ctx = T->ctx;
  nt_mem_stats m0, m1;
  nt_mem_get_stats(ctx, &m0);
  /* profile_iters [from, to): the profiler's range (nt_profiler_range) */
  bool profile = o->profile_iters.from < o->profile_iters.to;
  if (profile && T->iter == o->profile_iters.from) nt_profiler_range(ctx, true);
  /* the lr as the kernels always got it: rounded to fp32 */
  double lr = (double)(float)nt_schedule_lr(&T->sched, T->iter);
  int64_t next = T->iter + 1;
  bool due = o->log_interval > 0 && (next % o->log_interval == 0 || next == T->total_iters);
  float l = NAN;
  nt_status st;
  if (T->accum == 1) {
    st = nt_step_run(ctx, T->step, lr);
  } else {
    st = forward_backward(T, o->record_losses || due, &l);
    if (!st) st = nt_step_update(ctx, T->step, lr);
  }
  if (st) return st;
  if (profile && T->iter + 1 == o->profile_iters.to) nt_profiler_range(ctx, false);
  nt_mem_get_stats(ctx, &m1);
  if (nt_step_is_steady(T->step))
    T->res->steady_system_allocs += m1.n_system_allocs - m0.n_system_allocs;
  T->res->used_cuda_graph = nt_step_uses_graph(T->step);
  T->iter++;
  T->res->steps = T->iter;
  if (due && T->ev_end) st = nt_event_record(ctx, T->ev_end, NULL);
  /* several ranks agree on stop requests at the loss gather, or in a gather of their own once
   * NT_STOP_AGREE_STEPS steps have passed without one */
  if (!st && !(o->record_losses || due) &&
      T->iter - T->last_gather_iter >= NT_STOP_AGREE_STEPS)
    st = nt_trainer_agree_stop(T);
  if (st || !(o->record_losses || due)) return st;
  if (T->accum == 1) st = nt_model_read_scalar(ctx, T->model->ops->loss(T->model), &l);
  double *rank_loss = T->rank_loss;
  if (!st) st = nt_trainer_gather(T, (double)l, rank_loss);
  if (st) return st;
  if (T->world > 1) {   /* equal batches: the global loss is the ranks' mean */
    double sum = 0;
    for (int r = 0; r < T->world; r++) sum += rank_loss[r];
    l = (float)(sum / T->world);
  }
  T->res->last_loss = l;
  if (o->record_losses) {
    int64_t k = T->res->n_losses;
    double *nl = realloc(T->res->losses, (size_t)(k + 1) * sizeof *nl);
    if (!nl) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the loss history");
    if (nl && k == 0) T->res->first_step = T->iter - 1;
    if (nl) nl[k] = l;
    if (nl) T->res->losses = nl;
    if (nl) T->res->n_losses = k + 1;
  }
  if (!st && due) st = log_step(T, l, rank_loss);
  return st;
}

/* An evaluation record: printed, JSONL, Prometheus. */
static void log_eval(nt_trainer *T, const nt_eval_result *e) {
  const nt_model *md = T->model;
  double held = e->has_val ? e->val_loss : e->test_loss;
  nt_train_metrics m = nt_train_metrics_empty();
  m.model = md->ops->name;
  m.items = md->ops->items;
  m.kind = "eval";
  m.step = T->iter;
  m.loss = e->train_loss;
  m.val_loss = held;
  m.accuracy = e->accuracy;
  m.elapsed_s = nt_now_s() - T->t_start;
  fill_memory(T, &m);
  write_metrics(T, &m, false);
  /* the Prometheus file keeps the latest training gauges plus the evaluation's */
  nt_train_metrics p = T->last_train.model ? T->last_train : m;
  p.kind = "train";
  p.val_loss = held;
  p.accuracy = e->accuracy;
  if (T->prom_path[0] && nt_metrics_prometheus_write(T->ctx, T->prom_path, &p))
    metrics_failed(T);
  char where[64];
  if (md->batches_per_epoch > 0)
    snprintf(where, sizeof where, "epoch %llu (step %lld)", (unsigned long long)T->epoch,
             (long long)T->iter);
  else
    snprintf(where, sizeof where, "step %lld", (long long)T->iter);
  if (e->has_val)
    nt_trainer_print(T, "%s: train loss %.4f, val loss %.4f\n", where, e->train_loss,
                     e->val_loss);
  else
    nt_trainer_print(T, "%s: test loss %.4f, test accuracy %.2f%%\n", where, e->test_loss,
                     100 * e->accuracy);
}

/* Data parallel: the whole parameters an evaluation gathers (FULL_SHARD) and a consolidated
 * checkpoint are not training memory. The training peak so far is kept and the pool's peak
 * restarts after them, so the report compares training with memest's formula. */
static void keep_train_peak(nt_trainer *T) {
  nt_mem_stats ms;
  nt_mem_get_stats(T->ctx, &ms);
  if (ms.peak_allocated > T->train_peak) T->train_peak = ms.peak_allocated;
}

/* A save point (nt_trainer_checkpoint: before the end a failed save warns and the next save
 * point tries again), left out of the training peak under data parallel. */
static nt_status save(nt_trainer *T, bool final) {
  if (T->fsdp) keep_train_peak(T);
  nt_status st = nt_trainer_checkpoint(T, final);
  if (T->fsdp) nt_mem_reset_peak(T->ctx);
  return st;
}

/* The model's evaluation, recorded in the result and logged; the best held-out loss is kept
 * (not at step 0, as nanoGPT). A model that checkpoints per evaluation (the CNN: every epoch)
 * or a run without a checkpoint interval saves after it. final: the end-of-run evaluation (the
 * run saves after it). */
static nt_status evaluate(nt_trainer *T, bool final) {
  nt_eval_result e = {NAN, NAN, NAN, NAN, false, T->eval_count};
  if (T->fsdp) keep_train_peak(T);
  nt_status st = nt_trainer_unshard(T);   /* FULL_SHARD: whole parameters while evaluating */
  if (!st) st = T->model->ops->evaluate(T->ctx, T->model, &e);
  nt_trainer_reshard(T);
  if (!st) st = nt_trainer_agree_stop(T);
  if (st || nt_trainer_stop_requested(T)) return st;   /* a stop during it: no record */
  nt_train_result *r = T->res;
  r->train_loss = e.train_loss;
  r->val_loss = e.val_loss;
  r->test_loss = e.test_loss;
  r->test_accuracy = e.accuracy;
  log_eval(T, &e);
  T->last_eval_iter = T->iter;
  if (!final) T->eval_count++;   /* the end-of-run report is not part of the run's schedule */
  double held = e.has_val ? e.val_loss : e.test_loss;
  /* the checkpoint's best loss is of the schedule's evaluations (so a run stopped and resumed
   * agrees with an uninterrupted one); the result's includes the end-of-run evaluation */
  if (!final && T->iter > 0 && held < T->best_val) T->best_val = held;
  if (final && held < r->best_val_loss) r->best_val_loss = held;
  if (T->fsdp) nt_mem_reset_peak(T->ctx);
  if (!final && T->iter > 0 &&
      (T->model->checkpoint_every_eval || T->o->checkpoint_interval <= 0))
    st = save(T, false);
  if (!st) st = window_start(T);   /* evaluation time is not step time */
  return st;
}

/* The batch source ran out: the next epoch starts, after an evaluation. */
static nt_status end_epoch(nt_trainer *T) {
  T->epoch++;
  T->batch_in_epoch = 0;
  return evaluate(T, false);
}

/* SIGINT / SIGTERM (core/stop.h): the step in flight has finished; save and end the run. */
static nt_status stop_now(nt_trainer *T) {
  T->res->stopped = true;
  T->res->best_val_loss = T->best_val < 1e30 ? T->best_val : NAN;
  if (T->bar) fprintf(T->out, "\n");
  if (T->rank == 0) {
    fprintf(T->out, "stopping after this step (step %lld)\n", (long long)T->iter);
    fflush(T->out);
  }
  return save(T, true);
}

static nt_status train_loop(nt_trainer *T) {
  const nt_train_options *o = T->o;
  nt_ctx *ctx = T->ctx;
  nt_model *md = T->model;
  int64_t nb = md->batches_per_epoch;
  bool epoch_open = false;
  T->last_gather_iter = T->iter;
  nt_status st = window_start(T);
  while (!st && T->iter < T->total_iters) {
    if (nt_trainer_stop_requested(T)) return stop_now(T);
    if (o->eval_interval > 0 && T->iter % o->eval_interval == 0 && T->last_eval_iter != T->iter) {
      st = evaluate(T, false);
      if (st) break;
      if (nt_trainer_stop_requested(T)) return stop_now(T);
    }
    if (!epoch_open) {
      st = md->ops->start_epoch(ctx, md, T->epoch, T->batch_in_epoch);
      epoch_open = true;
      if (st) break;
    }
    bool end = nb > 0 && T->batch_in_epoch + T->accum > nb;   /* no partial accumulation */
    double wait = 0;
    if (!end) st = md->ops->next_batch(ctx, md, T->iter * T->accum, &T->batch, &end, &wait);
    T->wait_s += wait;
    if (st) break;
    if (end) {
      epoch_open = false;
      st = end_epoch(T);
      continue;
    }
    if (nb > 0) T->batch_in_epoch++;
    st = train_step(T);
    if (!st && o->checkpoint_interval > 0 && T->iter % o->checkpoint_interval == 0 &&
        T->iter < T->total_iters)
      st = save(T, false);
  }
  /* a request that reached some ranks after the last agreement: every rank exits alike */
  if (!st) st = nt_trainer_agree_stop(T);
  /* the run ended exactly at an epoch's end */
  if (!st && nb > 0 && T->batch_in_epoch + T->accum > nb) st = end_epoch(T);
  /* the final evaluation (when the run evaluates at all and not already at this step), then
   * the final checkpoint */
  T->res->best_val_loss = T->best_val < 1e30 ? T->best_val : INFINITY;
  if (!st && (o->eval_interval > 0 || nb > 0) && T->last_eval_iter != T->iter)
    st = evaluate(T, true);
  if (isinf(T->res->best_val_loss)) T->res->best_val_loss = NAN;
  if (!st) st = save(T, true);
  return st;
}

/* End of run: throughput and peak memory next to the estimate. */
/* End of run: throughput and peak memory next to the estimate (memest's formula for the
 * strategy and world size); with several ranks, every rank's peak (a gather). */
static nt_status report(nt_trainer *T) {
  nt_mem_stats ms;
  nt_mem_get_stats(T->ctx, &ms);
  if (T->fsdp && T->train_peak > ms.peak_allocated) ms.peak_allocated = T->train_peak;
  const nt_mem_estimate *est = &T->model->estimate;
  T->res->peak_bytes = ms.peak_allocated;
  T->res->estimate_bytes = (size_t)est->total;
  T->res->items_per_sec = T->last_ips;
  T->res->step_ms = T->last_step_ms;
  double *peaks = T->rank_peak;
  nt_status st = nt_trainer_gather(T, (double)ms.peak_allocated, peaks);
  if (!st && !T->o->quiet && T->rank == 0) {
    if (T->bar) fprintf(T->out, "\n");
    fprintf(T->out, "memory (%s, %s, %s, %d rank%s): estimate per rank vs measured peak\n",
            nt_ctx_is_cuda(T->ctx) ? "GPU" : "CPU", nt_dtype_name(T->model->compute),
            nt_sharding_name(T->o->dist.fsdp.strategy), T->world, T->world > 1 ? "s" : "");
    nt_memest_print(T->out, est, (double)ms.peak_allocated);
    for (int r = 0; T->world > 1 && r < T->world; r++)
      fprintf(T->out, "rank %d: measured peak %.2f MiB, memest %.2f MiB\n", r,
              peaks[r] / 1048576.0, est->total / 1048576.0);
  }
  return st;
}

static const struct {
  nt_model_kind kind;
  nt_model_create_fn create;
} model_table[] = {{NT_MODEL_GPT, nt_model_gpt_create}, {NT_MODEL_CNN, nt_model_cnn_create}};

nt_status nt_train_run(nt_ctx *ctx, const nt_train_options *o, nt_train_result *res) {
  memset(res, 0, sizeof *res);
  res->train_loss = res->val_loss = res->best_val_loss = res->test_accuracy = NAN;
  res->test_loss = NAN;
  res->last_loss = NAN;
  if (o->batch_size < 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "batch size %lld must be >= 1",
                    (long long)o->batch_size);
  if (o->growth_factor <= 1.0f || !(o->backoff_factor > 0.0f && o->backoff_factor < 1.0f) ||
      o->growth_interval < 1 || !(o->init_scale > 0.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "loss scaler: init_scale %g > 0, growth_factor %g > 1, backoff_factor %g in "
                    "(0, 1), growth_interval %d >= 1 required",
                    (double)o->init_scale, (double)o->growth_factor, (double)o->backoff_factor,
                    o->growth_interval);
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "rank %d of world size %d", o->rank, o->world_size);
  if (o->dist.comm && (nt_comm_rank(o->dist.comm) != o->rank ||
                       nt_comm_world(o->dist.comm) != o->world_size))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "rank %d of %d, but the communicator's is %d of %d",
                    o->rank, o->world_size, nt_comm_rank(o->dist.comm),
                    nt_comm_world(o->dist.comm));
  nt_model_create_fn create = NULL;
  for (size_t i = 0; i < sizeof model_table / sizeof model_table[0]; i++)
    if (model_table[i].kind == o->model) create = model_table[i].create;
  if (!create) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "unknown model kind %d", (int)o->model);
  nt_trainer T;
  memset(&T, 0, sizeof T);
  T.ctx = ctx;
  T.res = res;
  T.out = o->out ? o->out : stdout;
  T.comm = o->dist.comm;
  T.rank = o->rank;
  T.world = o->world_size;
  T.accum = o->dist.grad_accum_steps > 1 ? o->dist.grad_accum_steps : 1;
  /* a resumed run continues the checkpoint's configuration (train_checkpoint.c) */
  nt_train_options run = *o;
  T.o = &run;
  nt_json side;
  memset(&side, 0, sizeof side);
  nt_status st = nt_trainer_dist_buffers(&T);
  /* a resume reads one checkpoint directory, the same on every rank */
  char ckpt[PATH_MAX];
  if (!st && o->resume) st = nt_trainer_resolve_resume(&T, o->resume, ckpt);
  if (!st && o->resume) {
    run.resume = ckpt;
    st = nt_trainer_read_sidecar(ctx, ckpt, &side);
    if (!st) st = nt_trainer_merge_config(ctx, &side, &run);
    st = nt_trainer_agree(&T, st, "reading the checkpoint's configuration");
  }
  /* the precision policy decides the compute dtype, the scaler and TF32 (amp/policy.h) */
  if (!st) st = nt_policy_make(ctx, run.precision, &T.pol);
  if (st) {
    trainer_free(&T);
    nt_json_free(&side);
    return st;
  }
  nt_policy_apply(ctx, &T.pol);
  st = create(ctx, &run, &T.pol, o->resume ? nt_json_get(&side, "model_config") : NULL,
              &T.model);
  /* the context's stream drives dropout: one stream per rank (rank 0's is the one-process
   * stream) */
  nt_ctx_manual_seed(ctx, nt_train_dropout_seed(run.seed + 2, run.rank));
  nt_ctx_set_rng_offset(ctx, 0);
  if (!st) st = trainer_init(&T);
  if (!st && o->resume) st = nt_trainer_restore(&T, &side);
  if (!st && o->resume && T.iter >= T.total_iters) {
    /* a resume that trains no further (sampling from a checkpoint) writes no file */
    nt_metrics_log_close(T.log);
    T.log = NULL;
    T.prom_path[0] = 0;
  }
  if (!st) {
    res->global_batch = T.model->items_per_step * T.world * T.accum;
    nt_trainer_print(&T, "%s\n", T.model->summary);
    if (T.world > 1 || T.accum > 1 || T.fsdp)
      nt_trainer_print(&T, "data parallel: %d rank%s (%s), %s, %d micro-step%s per step: global "
                       "batch %lld %s\n", T.world, T.world > 1 ? "s" : "",
                       T.comm ? nt_comm_backend_name(nt_comm_backend_of(T.comm)) : "local",
                       nt_sharding_name(o->dist.fsdp.strategy), T.accum, T.accum > 1 ? "s" : "",
                       (long long)res->global_batch, T.model->ops->items);
  }
  if (!st) st = train_loop(&T);
  if (!st) st = report(&T);
  if (!st && T.model->ops->after_training) {
    st = nt_trainer_unshard(&T);
    if (!st)
      st = T.model->ops->after_training(ctx, T.model, res, run.quiet || T.rank ? NULL : T.out);
    nt_trainer_reshard(&T);
  }
  trainer_free(&T);
  nt_json_free(&side);
  return st;
}

void nt_train_result_free(nt_train_result *r) {
  if (!r) return;
  free(r->losses);
  free(r->sample);
  r->losses = NULL;
  r->sample = NULL;
}
