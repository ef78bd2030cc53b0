/* The training loop machinery both models share: optimizer and scaler setup, the LR schedule,
 * the step (with its CUDA graph), logging, metrics and checkpoints. */
#include "train/train_internal.h"
#include "models/checkpoint.h"
#include "core/cuda_util.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

double nt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
  o.cuda_graph = -1;
  o.progress = -1;
  o.temperature = 0.8f;
  o.top_k = 200;
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
  if (T->o->quiet) return;
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

nt_status nt_trainer_init(nt_trainer *T, nt_ctx *ctx, const nt_train_options *o,
                          nt_train_result *res, nt_params *params, const char *model_name,
                          const char *items_name) {
  memset(T, 0, sizeof *T);
  T->ctx = ctx;
  T->o = o;
  T->res = res;
  T->out = o->out ? o->out : stdout;
  T->model_name = model_name;
  T->items_name = items_name;
  T->params = params;
  T->compute = params->compute_dtype;
  T->best_val = 1e30;
  T->bar = o->progress == 1 || (o->progress < 0 && isatty(fileno(T->out)));
  T->peak_flops = peak_flops(ctx, o->precision);
  int nu = params->n_units;
  T->units = calloc((size_t)nu, sizeof *T->units);
  T->ranges = calloc((size_t)(2 * nu), sizeof *T->ranges);
  if (!T->units || !T->ranges) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  int nd = 0, nn = 0;
  nt_param_range *dec = T->ranges, *nodec = T->ranges + nu;
  for (int u = 0; u < nu; u++) {
    nt_unit *un = &params->units[u];
    T->units[u].params = un->compute;
    T->units[u].grads = un->grad;
    T->units[u].master_init = un->compute.owner ? &un->master : NULL;
    if (un->n_decay) dec[nd++] = (nt_param_range){u, 0, un->n_decay};
    if (un->numel > un->n_decay) nodec[nn++] = (nt_param_range){u, un->n_decay, un->numel - un->n_decay};
  }
  /* 2-D weights decay; biases and LayerNorm parameters do not (nanoGPT's groups) */
  nt_param_group groups[2] = {{1.0f, (float)o->weight_decay, dec, nd}, {1.0f, 0.0f, nodec, nn}};
  nt_adamw_options ao = nt_adamw_defaults();
  ao.lr = o->lr;
  ao.beta1 = o->beta1;
  ao.beta2 = o->beta2;
  ao.eps = o->eps;
  ao.weight_decay = o->weight_decay;
  nt_status st = nt_adamw_create(ctx, &ao, T->units, nu, groups, 2, &T->opt);
  for (int u = 0; u < nu && !st; u++) {
    nt_tensor master, m, v;
    st = nt_adamw_state_views(T->opt, u, &master, &m, &v);
    if (!st) st = nt_params_adopt_master(ctx, params, u, &master);
  }
  if (st) return st;
  nt_scaler_options so = nt_scaler_defaults();
  so.enabled = o->precision == NT_PREC_FP16;
  so.init_scale = o->init_scale;
  so.growth_factor = o->growth_factor;
  so.backoff_factor = o->backoff_factor;
  so.growth_interval = o->growth_interval;
  st = nt_scaler_create(ctx, &so, &T->scaler);
  if (st) return st;
  if (o->out_dir) {
    char path[4096];
    st = nt_make_dirs(ctx, o->out_dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    st = nt_metrics_log_open(ctx, path, o->resume != NULL, &T->log);
    if (st) return st;
    snprintf(T->prom_path, sizeof T->prom_path, "%s/metrics.prom", o->out_dir);
  }
  int mode = o->cuda_graph;
  T->graph_wanted = nt_ctx_is_cuda(ctx) && mode != 0;
  const char *pr = getenv("NT_PROFILE_ITERS");
  if (!pr || sscanf(pr, "%ld:%ld", &T->profile_from, &T->profile_to) != 2)
    T->profile_from = T->profile_to = -1;
  T->t_start = T->t_last = nt_now_s();
  T->last_loss = NAN;
  return NT_OK;
}

void nt_trainer_free(nt_trainer *T) {
  nt_graph_free(T->graph);
  nt_metrics_log_close(T->log);
  nt_scaler_free(T->ctx, T->scaler);
  nt_adamw_free(T->ctx, T->opt);
  free(T->units);
  free(T->ranges);
  memset(T, 0, sizeof *T);
}

const float *nt_trainer_loss_scale(nt_trainer *T) {
  if (!nt_scaler_enabled(T->scaler)) return NULL;
  nt_tensor s = nt_scaler_scale_tensor(T->scaler);
  return (const float *)s.data;
}

double nt_trainer_lr(const nt_trainer *T, int64_t it) {
  const nt_train_options *o = T->o;
  if (!o->decay_lr) return o->lr;
  int64_t warm = o->warmup_iters;
  int64_t decay = o->lr_decay_iters > 0 ? o->lr_decay_iters
                  : T->schedule_iters > 0 ? T->schedule_iters : T->total_iters;
  if (it < warm) return o->lr * (double)(it + 1) / (double)(warm + 1);
  if (it > decay || decay <= warm) return o->min_lr;
  double ratio = (double)(it - warm) / (double)(decay - warm);
  double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
  return o->min_lr + coeff * (o->lr - o->min_lr);
}

nt_status nt_trainer_read_scalar(nt_trainer *T, const nt_tensor *t, float *out) {
  nt_tensor h = nt_tensor_view(out, NT_F32, nt_cpu(), 0, NULL);
  return nt_tensor_copy(T->ctx, &h, t);
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

static nt_status write_metrics(nt_trainer *T, const nt_train_metrics *m, bool prom) {
  nt_status st = NT_OK;
  if (T->log) st = nt_metrics_log_write(T->ctx, T->log, m);
  if (!st && prom && T->prom_path[0]) st = nt_metrics_prometheus_write(T->ctx, T->prom_path, m);
  return st;
}

static nt_status log_step(nt_trainer *T, float loss) {
  const nt_train_options *o = T->o;
  double now = nt_now_s();
  int64_t steps = T->iter - T->iter_last;
  double dt = now - T->t_last;
  nt_scaler_values sv = {1.0f, 0, 0, 0, -1};
  float gn = NAN;
  nt_status st = nt_scaler_read(T->ctx, T->scaler, &sv);
  if (!st && o->grad_clip > 0) st = nt_adamw_last_grad_norm(T->ctx, T->opt, &gn);
  if (st) return st;
  if (!nt_scaler_enabled(T->scaler)) sv.scale = 1.0f;
  nt_train_metrics m = nt_train_metrics_empty();
  m.model = T->model_name;
  m.items = T->items_name;
  m.step = T->iter;
  m.loss = loss;
  m.lr = nt_trainer_lr(T, T->iter - 1);
  m.scale = sv.scale;
  m.skipped_steps = sv.skipped_total;
  m.grad_norm = gn;
  if (steps > 0 && dt > 0) {
    m.step_ms = 1e3 * dt / (double)steps;
    m.items_per_sec = (double)(steps * T->items_per_step) / dt;
    m.data_wait_ms = 1e3 * T->wait_s / (double)steps;
    if (T->peak_flops > 0) m.mfu = T->flops_per_item * m.items_per_sec / T->peak_flops;
    T->last_ips = m.items_per_sec;
    T->last_step_ms = m.step_ms;
  }
  if (T->o->model == NT_MODEL_CNN && T->total_iters > 0 && o->epochs > 0)
    m.epoch = (double)T->iter * o->epochs / (double)T->total_iters;
  m.elapsed_s = now - T->t_start;
  fill_memory(T, &m);
  T->res->skipped = sv.skipped_total;
  bool prom = o->metrics_interval <= 0 || T->iter % o->metrics_interval == 0 ||
              T->iter == T->total_iters;
  T->last_train = m;
  st = write_metrics(T, &m, prom);
  if (!o->quiet) {
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
              T->items_name, (double)sv.scale, eta);
    } else {
      fprintf(T->out, "step %lld/%lld | loss %.4f | lr %.3e | scale %g | norm %.3f | %.1f ms | "
              "%s %s/s", (long long)T->iter, (long long)T->total_iters, (double)loss, m.lr,
              (double)sv.scale, (double)gn, m.step_ms, ips, T->items_name);
      if (!isnan(m.mfu)) fprintf(T->out, " | mfu %.1f%%", 100 * m.mfu);
      fprintf(T->out, " | mem %.0f MiB\n", m.mem_allocated / 1048576.0);
    }
    fflush(T->out);
  }
  T->t_last = nt_now_s();
  T->iter_last = T->iter;
  T->wait_s = 0;
  return st;
}

/* The model's body inside an RNG step: its reservations are relative to the step base, and
 * the base's increment is the last thing queued (captured with the body). T->rng_step gets
 * the step's count. */
static nt_status rng_step_body(nt_ctx *ctx, void *arg) {
  nt_trainer *T = arg;
  nt_status st = nt_ctx_rng_step_begin(ctx);
  if (st) return st;
  st = T->body(ctx, T->body_arg);
  nt_status end = nt_ctx_rng_step_end(ctx, &T->rng_step);
  return st ? st : end;
}

static nt_status replay(nt_trainer *T) {
  nt_status st = nt_ctx_rng_step_replay(T->ctx, T->graph_rng);
  return st ? st : nt_graph_launch(T->ctx, T->graph);
}

static nt_status run_body(nt_trainer *T) {
  nt_ctx *ctx = T->ctx;
  if (T->graph) return replay(T);
  const uint64_t prev = T->rng_step;
  nt_status st = rng_step_body(ctx, T);
  if (st) return st;
  T->eager_steps++;
  if (T->eager_steps > 1 && T->rng_step != prev) T->rng_varies = true;
  /* Capture after two eager steps: they warm the pool, tune the GEMM plans, and let lazily
   * allocated buffers (the loader's device ring, the RNG step base) exist before the graph
   * bakes in the scratch addresses the ops free inside it; nothing allocated later may hold
   * data across a replay. */
  if (!T->graph_wanted || T->graph_tried || T->eager_steps < 2) return NT_OK;
  T->graph_tried = true;
  if (T->rng_varies) {
    nt_log(ctx, NT_LOG_WARN, "CUDA graph: the step's random-number count changed between "
           "steps; running eagerly");
    return NT_OK;
  }
  const uint64_t eager_rng = T->rng_step;
  st = nt_graph_capture(ctx, rng_step_body, T, &T->graph);
  const uint64_t captured = T->rng_step;
  T->rng_step = eager_rng;
  if (st) {
    nt_log(ctx, NT_LOG_WARN, "CUDA graph capture failed, running eagerly: %s", nt_last_error(ctx));
    nt_clear_error(ctx);
    T->graph = NULL;
    return NT_OK;
  }
  if (captured != eager_rng) {
    /* The replays would advance the base by the wrong amount (or reuse numbers). */
    nt_log(ctx, NT_LOG_WARN, "CUDA graph: the captured step reserves %llu random numbers, the "
           "eager steps %llu; running eagerly", (unsigned long long)captured,
           (unsigned long long)eager_rng);
    nt_graph_free(T->graph);
    T->graph = NULL;
    return NT_OK;
  }
  T->graph_rng = captured;
  T->res->used_cuda_graph = true;
  return NT_OK;
}

nt_status nt_trainer_step(nt_trainer *T, const nt_tensor *loss) {
  const nt_train_options *o = T->o;
  nt_mem_stats m0, m1;
  nt_mem_get_stats(T->ctx, &m0);
  /* NT_PROFILE_ITERS="a:b": iterations a..b-1 are the profiler's range (see nt_profiler_range). */
  if (T->iter == T->profile_from) nt_profiler_range(T->ctx, true);
  nt_status st = run_body(T);
  if (st) return st;
  nt_optim_step_args a = nt_optim_args((float)nt_trainer_lr(T, T->iter));
  a.max_norm = (float)o->grad_clip;
  st = nt_adamw_step_scaled(T->ctx, T->opt, T->scaler, &a);
  if (!st) st = nt_scaler_update(T->ctx, T->scaler);
  if (st) return st;
  if (T->iter + 1 == T->profile_to) nt_profiler_range(T->ctx, false);
  nt_mem_get_stats(T->ctx, &m1);
  if (T->eager_steps >= 3 || T->graph)
    T->res->steady_system_allocs += m1.n_system_allocs - m0.n_system_allocs;
  T->iter++;
  T->res->steps = T->iter;
  bool due = o->log_interval > 0 && (T->iter % o->log_interval == 0 || T->iter == T->total_iters);
  if (o->record_losses || due) {
    float l;
    st = nt_trainer_read_scalar(T, loss, &l);
    if (st) return st;
    T->last_loss = l;
    T->res->last_loss = l;
    if (o->record_losses) {
      int64_t k = T->res->n_losses;
      double *nl = realloc(T->res->losses, (size_t)(k + 1) * sizeof *nl);
      if (!nl) return NT_ERROR(T->ctx, NT_ERR_OOM, "out of host memory for the loss history");
      if (k == 0) T->res->first_step = T->iter - 1;
      nl[k] = l;
      T->res->losses = nl;
      T->res->n_losses = k + 1;
    }
    if (due) st = log_step(T, l);
  }
  return st;
}

nt_status nt_trainer_log_eval(nt_trainer *T, double train_loss, double val_loss, double accuracy) {
  nt_train_metrics m = nt_train_metrics_empty();
  m.model = T->model_name;
  m.items = T->items_name;
  m.kind = "eval";
  m.step = T->iter;
  m.loss = train_loss;
  m.val_loss = val_loss;
  m.accuracy = accuracy;
  m.elapsed_s = nt_now_s() - T->t_start;
  fill_memory(T, &m);
  nt_status st = T->log ? nt_metrics_log_write(T->ctx, T->log, &m) : NT_OK;
  /* the Prometheus file keeps the latest training gauges plus the evaluation's */
  nt_train_metrics p = T->last_train.model ? T->last_train : m;
  p.kind = "train";
  p.val_loss = val_loss;
  p.accuracy = accuracy;
  if (!st && T->prom_path[0]) st = nt_metrics_prometheus_write(T->ctx, T->prom_path, &p);
  if (T->o->model == NT_MODEL_GPT)
    nt_trainer_print(T, "step %lld: train loss %.4f, val loss %.4f\n", (long long)T->iter,
                     train_loss, val_loss);
  else
    nt_trainer_print(T, "epoch %llu (step %lld): test loss %.4f, test accuracy %.2f%%\n",
                     (unsigned long long)T->epoch, (long long)T->iter, val_loss, 100 * accuracy);
  return st;
}

/* ---- checkpoints ---- */

nt_status nt_trainer_save(nt_trainer *T, nt_config_writer config, const void *arg) {
  const nt_train_options *o = T->o;
  if (!o->out_dir) return NT_OK;
  nt_ctx *ctx = T->ctx;
  int32_t step = 0;
  nt_scaler_state ss;
  nt_status st = nt_adamw_get_step(ctx, T->opt, &step);
  if (!st) st = nt_scaler_state_get(ctx, T->scaler, &ss);
  if (st) return st;
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "format");
  nt_jw_str(&w, "nanotrain-checkpoint");
  nt_jw_key(&w, "version");
  nt_jw_i64(&w, 1);
  nt_jw_key(&w, "model");
  nt_jw_str(&w, T->model_name);
  nt_jw_key(&w, "precision");
  nt_jw_str(&w, nt_precision_name(o->precision));
  nt_jw_key(&w, "iter");
  nt_jw_i64(&w, T->iter);
  nt_jw_key(&w, "best_val_loss");
  nt_jw_num(&w, T->best_val);
  nt_jw_key(&w, "tensors");
  nt_jw_str(&w, "ckpt.safetensors");
  nt_jw_key(&w, "config");
  nt_jw_begin(&w, '{');
  config(&w, arg);
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
  nt_jw_bool(&w, nt_scaler_enabled(T->scaler));
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
  st = nt_checkpoint_save(ctx, o->out_dir, T->params, T->opt, json);
  free(json);
  if (!st) nt_trainer_print(T, "saved checkpoint to %s/ckpt.{safetensors,json} (step %lld)\n",
                            o->out_dir, (long long)T->iter);
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

nt_status nt_trainer_restore(nt_trainer *T, const nt_json *root) {
  nt_ctx *ctx = T->ctx;
  const char *where = T->o->resume;
  const char *model = nt_json_str(nt_json_get(root, "model"), "");
  if (strcmp(model, T->model_name))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: a '%s' checkpoint cannot resume a '%s' run", where,
                    model, T->model_name);
  nt_status st = nt_checkpoint_load_tensors(ctx, where, T->params, T->opt);
  if (st) return st;
  const nt_json *opt = nt_json_get(root, "optimizer"), *sc = nt_json_get(root, "scaler");
  const nt_json *rng = nt_json_get(root, "rng"), *ld = nt_json_get(root, "loader");
  if (!opt || !sc || !rng || !ld)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: sidecar lacks optimizer/scaler/rng/loader", where);
  st = nt_adamw_set_step(ctx, T->opt, (int32_t)nt_json_get_i64(opt, "step", 0));
  if (st) return st;
  nt_scaler_state ss;
  st = nt_scaler_state_get(ctx, T->scaler, &ss);
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
  if (nt_scaler_enabled(T->scaler)) st = nt_scaler_state_set(ctx, T->scaler, &ss);
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

void nt_trainer_finish(nt_trainer *T, const nt_mem_estimate *est) {
  nt_mem_stats ms;
  nt_mem_get_stats(T->ctx, &ms);
  T->res->peak_bytes = ms.peak_allocated;
  T->res->estimate_bytes = (size_t)est->total;
  T->res->items_per_sec = T->last_ips;
  T->res->step_ms = T->last_step_ms;
  if (T->o->quiet) return;
  if (T->bar) fprintf(T->out, "\n");
  fprintf(T->out, "memory (%s, %s): estimate vs measured peak\n",
          nt_ctx_is_cuda(T->ctx) ? "GPU" : "CPU", nt_dtype_name(T->compute));
  nt_memest_print(T->out, est, (double)ms.peak_allocated);
}

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
  nt_policy pol;
  nt_status st = nt_policy_make(ctx, o->precision, &pol);
  if (st) return st;
  nt_policy_apply(ctx, &pol);
  return o->model == NT_MODEL_GPT ? nt_train_gpt(ctx, o, &pol, res)
                                  : nt_train_cnn(ctx, o, &pol, res);
}

void nt_train_result_free(nt_train_result *r) {
  if (!r) return;
  free(r->losses);
  free(r->sample);
  r->losses = NULL;
  r->sample = NULL;
}
