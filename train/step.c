/* The training step, stage by stage (train/step.h lists the stages and what each one means).
 * Read nt_step_forward_backward and nt_step_update from top to bottom: each line is a stage. */
#include "train/step.h"
#include "train/cuda_graph.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include <stdlib.h>
#include <string.h>

struct nt_step {
  nt_step_options o;
  nt_grad_range *ranges;          /* owned copy (or every unit of params, whole) */
  nt_tensor *grad_views;          /* per range: a 1-D view of [lo, hi) */
  nt_tensor **grad_list;
  int n_ranges;
  float *sumsq;                   /* device F32: the owned gradients' sum of squares */
  float *scratch;                 /* device F32 [3]: 1/grad_divisor, the unscale factor, an
                                   * unused inf flag (no scaler) */
  bool accumulate;                /* the body runs without zeroing the gradients first */
  int64_t steps;
  /* CUDA graph of the forward + backward stage */
  nt_graph *graph;
  bool graph_wanted, graph_tried;
  int eager_steps;
  /* Random numbers the body reserves per step: the latest step's count, whether two eager
   * steps differed, and the captured graph's count. */
  uint64_t rng_step, graph_rng;
  bool rng_varies;
};

/* ---- the optimizer and the scaler for an nt_params ---- */

nt_optimizer_options nt_optimizer_defaults(void) {
  nt_optimizer_options o;
  o.adamw = nt_adamw_defaults();
  o.scaler = nt_scaler_defaults();
  o.scaler.enabled = false;
  return o;
}

nt_status nt_optimizer_for_units(nt_ctx *ctx, nt_params *params, const nt_param_unit *units,
                                 nt_range_map_fn map, void *map_arg, bool adopt,
                                 const nt_optimizer_options *o, nt_optimizer *out) {
  memset(out, 0, sizeof *out);
  if (!params || !params->allocated || params->n_units < 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer: the parameters are not allocated");
  nt_optimizer_options def = nt_optimizer_defaults();
  if (!o) o = &def;
  int nu = params->n_units;
  nt_param_range *ranges = calloc((size_t)(4 * nu), sizeof *ranges);
  if (!ranges) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the optimizer's units");
  int nd = 0, nn = 0;
  nt_param_range *dec = ranges, *nodec = ranges + nu;
  for (int u = 0; u < nu; u++) {
    nt_unit *un = &params->units[u];
    if (un->n_decay) dec[nd++] = (nt_param_range){u, 0, un->n_decay};
    if (un->numel > un->n_decay)
      nodec[nn++] = (nt_param_range){u, un->n_decay, un->numel - un->n_decay};
  }
  if (map) {   /* into the views' coordinates */
    nd = map(map_arg, dec, nd, ranges + 2 * nu);
    nn = map(map_arg, nodec, nn, ranges + 3 * nu);
    dec = ranges + 2 * nu;
    nodec = ranges + 3 * nu;
  }
  /* 2-D weights decay; biases and LayerNorm parameters do not (nanoGPT's groups) */
  nt_param_group groups[2] = {{1.0f, o->adamw.weight_decay, nd ? dec : NULL, nd},
                              {1.0f, 0.0, nn ? nodec : NULL, nn}};
  nt_status st = nt_adamw_create(ctx, &o->adamw, units, nu, groups, 2, &out->adamw);
  /* the optimizer now holds the fp32 master weights: the units point at them */
  for (int u = 0; u < nu && !st && adopt; u++) {
    nt_tensor master;
    st = nt_adamw_state_views(out->adamw, u, &master, NULL, NULL);
    if (!st) st = nt_params_adopt_master(ctx, params, u, &master);
  }
  free(ranges);
  if (!st) st = nt_scaler_create(ctx, &o->scaler, &out->scaler);
  if (st) nt_optimizer_free(ctx, out);
  return st;
}

nt_status nt_optimizer_for_params(nt_ctx *ctx, nt_params *params, const nt_optimizer_options *o,
                                  nt_optimizer *out) {
  memset(out, 0, sizeof *out);
  if (!params || !params->allocated || params->n_units < 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer: the parameters are not allocated");
  nt_param_unit *units = calloc((size_t)params->n_units, sizeof *units);
  if (!units) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the optimizer's units");
  for (int u = 0; u < params->n_units; u++) {
    nt_unit *un = &params->units[u];
    units[u] = (nt_param_unit){un->compute, un->grad, un->compute.owner ? &un->master : NULL};
  }
  nt_status st = nt_optimizer_for_units(ctx, params, units, NULL, NULL, true, o, out);
  free(units);
  return st;
}

void nt_optimizer_free(nt_ctx *ctx, nt_optimizer *o) {
  if (!o) return;
  nt_scaler_free(ctx, o->scaler);
  nt_adamw_free(ctx, o->adamw);
  memset(o, 0, sizeof *o);
}

/* ---- creation ---- */

nt_status nt_step_create(nt_ctx *ctx, const nt_step_options *o, nt_step **out) {
  *out = NULL;
  if (!o || !o->params || !o->body || !o->optimizer.adamw)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "step: params, body and optimizer are required");
  if (!(o->max_norm >= 0.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "step: max_norm %g must be >= 0", (double)o->max_norm);
  if (o->n_ranges < 0 || (o->n_ranges > 0 && !o->ranges))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "step: %d gradient ranges", o->n_ranges);
  nt_step *s = calloc(1, sizeof *s);
  if (!s) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the step");
  s->o = *o;
  s->o.ranges = NULL;
  int n = o->ranges ? o->n_ranges : o->params->n_units;
  s->n_ranges = n;
  s->ranges = calloc((size_t)(n ? n : 1), sizeof *s->ranges);
  s->grad_views = calloc((size_t)(n ? n : 1), sizeof *s->grad_views);
  s->grad_list = calloc((size_t)(n ? n : 1), sizeof *s->grad_list);
  nt_status st = NT_OK;
  if (!s->ranges || !s->grad_views || !s->grad_list)
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the step's gradient ranges");
  for (int i = 0; i < n && !st; i++) {
    nt_grad_range r;
    if (o->ranges) {
      r = o->ranges[i];
    } else {
      r.grad = o->params->units[i].grad;
      r.lo = 0;
      r.hi = o->params->units[i].numel;
    }
    int64_t numel = nt_tensor_numel(&r.grad);
    if (r.lo < 0 || r.hi < r.lo || r.hi > numel || !nt_tensor_is_contiguous(&r.grad)) {
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "step: gradient range %d [%lld, %lld) of a %lld-element buffer (contiguous)",
                    i, (long long)r.lo, (long long)r.hi, (long long)numel);
      break;
    }
    int64_t len = r.hi - r.lo;
    s->ranges[i] = r;
    s->grad_views[i] = nt_tensor_view((char *)r.grad.data + (size_t)r.lo * nt_dtype_size(r.grad.dtype),
                                      r.grad.dtype, r.grad.device, 1, &len);
    s->grad_list[i] = &s->grad_views[i];
  }
  if (!st) st = nt_alloc(ctx, sizeof(float), (void **)&s->sumsq);
  if (!st && o->grad_divisor > 1) {
    float inv = 1.0f / (float)o->grad_divisor;
    int64_t one = 1;
    st = nt_alloc(ctx, 3 * sizeof(float), (void **)&s->scratch);
    nt_tensor h = nt_tensor_view(&inv, NT_F32, nt_cpu(), 1, &one);
    nt_tensor d = nt_tensor_view(s->scratch, NT_F32, nt_ctx_device(ctx), 1, &one);
    if (!st) st = nt_tensor_copy(ctx, &d, &h);
    if (!st) st = nt_ctx_synchronize(ctx);
  }
  if (st) {
    nt_step_free(ctx, s);
    return st;
  }
  s->graph_wanted = nt_ctx_is_cuda(ctx) && o->cuda_graph != 0;
  *out = s;
  return NT_OK;
}

void nt_step_free(nt_ctx *ctx, nt_step *s) {
  if (!s) return;
  nt_graph_free(s->graph);
  nt_free(ctx, s->sumsq);
  nt_free(ctx, s->scratch);
  free(s->ranges);
  free(s->grad_views);
  free(s->grad_list);
  free(s);
}

const float *nt_step_loss_scale(const nt_step *s) {
  nt_scaler *sc = s->o.optimizer.scaler;
  if (!nt_scaler_enabled(sc)) return NULL;
  nt_tensor t = nt_scaler_scale_tensor(sc);
  return (const float *)t.data;
}

bool nt_step_uses_graph(const nt_step *s) { return s->graph != NULL; }
bool nt_step_is_steady(const nt_step *s) { return s->graph || s->eager_steps >= 3; }
int64_t nt_step_count(const nt_step *s) { return s->steps; }

/* ---- stage 1: forward + backward (the capturable body) ---- */

/* Zeroed gradients, then the model's micro-step, inside an RNG step: the body's random-number
 * reservations are relative to the step base, and the base's increment is the last work queued
 * (so a captured graph carries it). s->rng_step gets the step's count. The model calls the unit
 * hooks' grads_ready as each unit's backward is enqueued (stage 2). */
static nt_status body_in_rng_step(nt_ctx *ctx, void *arg) {
  nt_step *s = arg;
  nt_status st = nt_ctx_rng_step_begin(ctx);
  if (st) return st;
  const nt_step_hooks *h = s->o.hooks;
  const nt_unit_hooks *uh = h ? h->unit : NULL;
  if (!s->accumulate)
    st = h && h->zero_grad ? h->zero_grad(ctx, h->arg) : nt_params_zero_grad(ctx, s->o.params);
  if (!st) st = s->o.body(ctx, s->o.body_arg, nt_step_loss_scale(s), uh);
  nt_status end = nt_ctx_rng_step_end(ctx, &s->rng_step);
  return st ? st : end;
}

/* Capture after two eager steps: they warm the pool, tune the GEMM plans, and let lazily
 * allocated buffers (a loader's device ring, the RNG step base) exist before the graph bakes
 * in the scratch addresses the ops free inside it; nothing allocated later may hold data
 * across a replay. The replays assume the step's random-number count never changes: when two
 * eager steps differ, or the capture differs from them, the step stays eager (with a
 * warning). */
static void try_capture(nt_ctx *ctx, nt_step *s) {
  s->graph_tried = true;
  if (s->rng_varies) {
    nt_log(ctx, NT_LOG_WARN, "CUDA graph: the step's random-number count changed between "
           "steps; running eagerly");
    return;
  }
  const uint64_t eager_rng = s->rng_step;
  nt_status st = nt_graph_capture(ctx, body_in_rng_step, s, &s->graph);
  const uint64_t captured = s->rng_step;
  s->rng_step = eager_rng;
  if (st) {
    nt_log(ctx, NT_LOG_WARN, "CUDA graph capture failed, running eagerly: %s", nt_last_error(ctx));
    nt_clear_error(ctx);
    s->graph = NULL;
    return;
  }
  if (captured != eager_rng) {
    /* the replays would advance the base by the wrong amount (or reuse numbers) */
    nt_log(ctx, NT_LOG_WARN, "CUDA graph: the captured step reserves %llu random numbers, the "
           "eager steps %llu; running eagerly", (unsigned long long)captured,
           (unsigned long long)eager_rng);
    nt_graph_free(s->graph);
    s->graph = NULL;
    return;
  }
  s->graph_rng = captured;
}

nt_status nt_step_forward_backward(nt_ctx *ctx, nt_step *s) {
  if (s->graph) {
    nt_status st = nt_ctx_rng_step_replay(ctx, s->graph_rng);
    return st ? st : nt_graph_launch(ctx, s->graph);
  }
  const uint64_t prev = s->rng_step;
  nt_status st = body_in_rng_step(ctx, s);
  if (st) return st;
  s->eager_steps++;
  if (s->eager_steps > 1 && s->rng_step != prev) s->rng_varies = true;
  if (s->graph_wanted && !s->graph_tried && s->eager_steps >= 2) try_capture(ctx, s);
  return NT_OK;
}

nt_status nt_step_accumulate(nt_ctx *ctx, nt_step *s) {
  if (s->graph || s->graph_wanted)
    return NT_ERROR(ctx, NT_ERR_STATE, "step: accumulation needs a step without a CUDA graph");
  s->accumulate = true;
  nt_status st = body_in_rng_step(ctx, s);
  s->accumulate = false;
  return st;
}

/* ---- stages 3 to 9: from the gradients to the updated parameters ---- */

static float *found_inf_flag(nt_step *s) {
  nt_scaler *sc = s->o.optimizer.scaler;
  if (!nt_scaler_enabled(sc)) return NULL;
  nt_tensor f = nt_scaler_found_inf_tensor(sc);
  return (float *)f.data;
}

/* Stage 3: the gradients carry the loss scale and, summed over ranks x accumulated
 * micro-steps, a factor grad_divisor. With clipping on, no pass over them: *factor gets
 * 1/scale (/ grad_divisor) and the optimizer applies it inside its update, folded into the
 * clipping coefficient, setting found_inf (fp16) when the unscaled norm sqrt(sumsq) * factor
 * (stages 4-5) is not finite: when a gradient is not, or 1/scale is inf. The same bits as the
 * pass when the scale and grad_divisor are powers of two, within rounding otherwise. One
 * difference from PyTorch's unscale-then-check: finite scaled gradients whose global sum of
 * squares overflows fp32 (above ~3.4e38: a scaled global norm above ~1.8e19, an unscaled one
 * above ~2.8e14 at scale 65536) also skip the step, where PyTorch (unscaling first) would clip
 * and step normally. Without clipping: grads *= the factor over the owned ranges and
 * found_inf = 1 on a non-finite element, one multi-tensor launch (the scaler zeroes found_inf
 * first); nothing to do without loss scaling and without a divisor. *folded says which. */
static nt_status stage_unscale_and_check(nt_ctx *ctx, nt_step *s, nt_tensor *factor_out,
                                         bool *folded) {
  nt_scaler *sc = s->o.optimizer.scaler;
  bool fold = s->o.max_norm > 0.0f;
  nt_status st;
  *folded = false;
  if (s->scratch) {
    /* a sum of grad_divisor means: multiply by inv_scale / grad_divisor in the same pass (the
     * scaler's unscale of no tensors zeroes found_inf and records the unscale) */
    nt_device dev = nt_ctx_device(ctx);
    nt_tensor inv_n = nt_tensor_view(s->scratch, NT_F32, dev, 0, NULL);
    nt_tensor factor = nt_tensor_view(s->scratch + 1, NT_F32, dev, 0, NULL);
    nt_tensor spare = nt_tensor_view(s->scratch + 2, NT_F32, dev, 0, NULL);
    nt_tensor found = nt_scaler_found_inf_tensor(sc), inv = nt_scaler_inv_scale_tensor(sc);
    bool scaled = nt_scaler_enabled(sc);
    st = nt_scaler_unscale(ctx, sc, NULL, 0);
    if (!st && scaled) st = nt_tensor_copy(ctx, &factor, &inv);
    if (!st && scaled) st = nt_scale(ctx, 1.0f / (float)s->o.grad_divisor, &factor);
    if (fold) {
      *factor_out = scaled ? factor : inv_n;
      *folded = true;
    } else if (!st) {
      st = nt_unscale_and_check(ctx, s->grad_list, s->n_ranges, scaled ? &factor : &inv_n,
                                scaled ? &found : &spare);
    }
  } else if (fold && nt_scaler_enabled(sc)) {
    st = nt_scaler_unscale(ctx, sc, NULL, 0);   /* zeroes found_inf, records the unscale */
    *factor_out = nt_scaler_inv_scale_tensor(sc);
    *folded = true;
  } else {
    st = nt_scaler_unscale(ctx, sc, s->grad_list, s->n_ranges);
  }
  /* marks the optimizer step taken (GradScaler's bookkeeping; the grads are unscaled already,
   * or will be inside the optimizer's update) */
  if (!st) st = nt_scaler_step(ctx, s->o.optimizer.scaler, NULL, 0, NULL);
  return st;
}

/* Stage 4: this rank's share of the squared gradient norm (deterministic, one launch). */
static nt_status stage_grad_sumsq(nt_ctx *ctx, nt_step *s) {
  if (!(s->o.max_norm > 0.0f)) return NT_OK;
  nt_tensor out = nt_tensor_view(s->sumsq, NT_F32, nt_ctx_device(ctx), 0, NULL);
  return nt_sum_squares(ctx, (const nt_tensor *const *)s->grad_list, s->n_ranges, &out);
}

/* Stage 5: found_inf MAX and sumsq SUM across ranks (the hook); identity at one rank. With
 * stage 3 folded, found_inf is still zero on every rank (the optimizer sets it from the global
 * sum of squares): only sumsq is reduced. */
static nt_status stage_global_reduce(nt_ctx *ctx, nt_step *s, bool folded) {
  const nt_step_hooks *h = s->o.hooks;
  if (!h || !h->global_reduce) return NT_OK;
  float *sumsq = s->o.max_norm > 0.0f ? s->sumsq : NULL;
  float *found = folded ? NULL : found_inf_flag(s);
  if (!sumsq && !found) return NT_OK;
  return h->global_reduce(ctx, h->arg, found, sumsq);
}

/* Stage 6: clipping. The coefficient min(1, max_norm / (sqrt(sumsq) + 1e-6)) is computed on the
 * device by the optimizer's prepare kernel from the (global) sumsq and applied inside its update
 * kernel, so the gradient buffers are not rewritten: this stage only hands both over. */
static void stage_clip(nt_step *s, nt_optim_step_args *a, nt_tensor *sumsq_view) {
  a->max_norm = s->o.max_norm;
  a->grad_sumsq = s->o.max_norm > 0.0f ? sumsq_view : NULL;
}

/* Stage 7: AdamW, skipped on the device when found_inf != 0 (with stage 3 folded, the optimizer
 * sets found_inf from the sum of squares first). */
static nt_status stage_optimizer(nt_ctx *ctx, nt_step *s, nt_optim_step_args *a,
                                 const nt_tensor *found_view) {
  a->found_inf = found_view;
  return nt_adamw_step(ctx, s->o.optimizer.adamw, a);
}

/* Stage 8: GradScaler's update rule, on the device. */
static nt_status stage_scaler_update(nt_ctx *ctx, nt_step *s) {
  return nt_scaler_update(ctx, s->o.optimizer.scaler);
}

/* Stage 9: parameters updated (the hook: sharded strategies all-gather here). */
static nt_status stage_params_updated(nt_ctx *ctx, nt_step *s) {
  const nt_step_hooks *h = s->o.hooks;
  return h && h->params_updated ? h->params_updated(ctx, h->arg) : NT_OK;
}

/* Stage 10: the F16/BF16 compute copies from the fp32 master weights. AdamW's update kernel
 * writes them in the same pass as the master weights (stage 7), so there is nothing left to
 * enqueue here; an optimizer without that fusion would call nt_params_sync_compute. */
static nt_status stage_refresh_low_precision(nt_ctx *ctx, nt_step *s) {
  (void)ctx;
  (void)s;
  return NT_OK;
}

/* --trace: the step's AMP events. Reads the device (synchronizes). */
static nt_status trace_amp(nt_ctx *ctx, nt_step *s, float found, float scale_before) {
  if (!nt_scaler_enabled(s->o.optimizer.scaler)) {
    fprintf(s->o.trace, "amp step %lld: no loss scaling (the precision needs none)\n",
            (long long)s->steps);
    return NT_OK;
  }
  nt_scaler_values v;
  nt_status st = nt_scaler_read(ctx, s->o.optimizer.scaler, &v);
  if (st) return st;
  fprintf(s->o.trace, "amp step %lld: scale %g, found_inf %g -> %s, scale now %g, growth "
          "tracker %d, skipped so far %lld\n", (long long)s->steps, (double)scale_before,
          (double)found, found != 0.0f ? "optimizer step skipped" : "optimizer step applied",
          (double)v.scale, (int)v.growth_tracker, (long long)v.skipped_total);
  fflush(s->o.trace);
  return NT_OK;
}

static nt_status read_flag(nt_ctx *ctx, const float *dev, float *out) {
  int64_t one = 1;
  nt_tensor d = nt_tensor_view((void *)dev, NT_F32, nt_ctx_device(ctx), 1, &one);
  nt_tensor h = nt_tensor_view(out, NT_F32, nt_cpu(), 1, &one);
  return nt_tensor_copy(ctx, &h, &d);
}

nt_status nt_step_update(nt_ctx *ctx, nt_step *s, double lr) {
  nt_optim_step_args a = nt_optim_args(lr);
  nt_tensor sumsq = nt_tensor_view(s->sumsq, NT_F32, nt_ctx_device(ctx), 0, NULL);
  float *found = found_inf_flag(s);
  nt_tensor found_view = nt_tensor_view(found, NT_F32, nt_ctx_device(ctx), 0, NULL);
  float trace_found = 0.0f, trace_scale = 1.0f;
  nt_tensor factor;
  bool folded = false;
  nt_status st = stage_unscale_and_check(ctx, s, &factor, &folded);
  if (!st) st = stage_grad_sumsq(ctx, s);
  if (!st) st = stage_global_reduce(ctx, s, folded);
  if (!st) stage_clip(s, &a, &sumsq);
  if (folded) a.grad_scale = &factor;   /* the unscale rides on the optimizer's update */
  if (!st) st = stage_optimizer(ctx, s, &a, found ? &found_view : NULL);
  if (!st && s->o.trace && found) {   /* before the update: the flag and the scale it used */
    const float *scale = nt_step_loss_scale(s);
    st = read_flag(ctx, found, &trace_found);
    if (!st) st = read_flag(ctx, scale, &trace_scale);
  }
  if (!st) st = stage_scaler_update(ctx, s);
  if (!st) st = stage_params_updated(ctx, s);
  if (!st) st = stage_refresh_low_precision(ctx, s);
  if (st) return st;
  s->steps++;
  if (s->o.trace) st = trace_amp(ctx, s, trace_found, trace_scale);
  return st;
}

nt_status nt_step_run(nt_ctx *ctx, nt_step *s, double lr) {
  nt_status st = nt_step_forward_backward(ctx, s);   /* stages 1-2 */
  return st ? st : nt_step_update(ctx, s, lr);       /* stages 3-10 */
}
