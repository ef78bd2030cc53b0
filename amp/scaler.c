/* Loss scaler: option checks, the per-step state machine (misuse errors), dispatch of the
 * update to the host rule or the device kernel, logging and state get/set. */
#include "amp/scaler.h"
#include "amp/scaler_rule.h"
#include "ops/reduce.h"
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_scaler_update_cuda(nt_ctx *ctx, nt_scaler_record *rec, const nt_scaler_rule_args *a);
nt_status nt_scaler_zero_found_inf_cuda(nt_ctx *ctx, nt_scaler_record *rec);
#endif

struct nt_scaler {
  nt_scaler_options opt;
  nt_device device;
  nt_scaler_record *rec;     /* on the context's device */
  bool unscaled;             /* since the last update */
  bool stepped;
  int64_t logged_skipped;    /* skipped_total at the previous nt_scaler_log */
  nt_tensor found_view;      /* handed to the optimizer by nt_scaler_step */
};

nt_scaler_options nt_scaler_defaults(void) {
  nt_scaler_options o;
  memset(&o, 0, sizeof o);
  o.enabled = true;
  o.init_scale = 65536.0f;
  o.growth_factor = 2.0f;
  o.backoff_factor = 0.5f;
  o.growth_interval = 2000;
  o.min_scale = 0.0f;
  o.max_scale = 0.0f;
  o.hysteresis = 1;
  return o;
}

nt_status nt_scaler_preset(nt_ctx *ctx, const char *name, nt_scaler_options *out) {
  nt_scaler_options o = nt_scaler_defaults();
  if (!name) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler preset name is NULL");
  if (strcmp(name, "default") == 0) {
  } else if (strcmp(name, "transformer") == 0) {
    o.init_scale = 65536.0f;
    o.growth_interval = 2000;
  } else if (strcmp(name, "cnn") == 0) {
    o.growth_interval = 1000;
  } else if (strcmp(name, "pointcloud") == 0) {
    o.init_scale = 32768.0f;
  } else {
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "unknown scaler preset '%s' (default, transformer, cnn, pointcloud)", name);
  }
  *out = o;
  return NT_OK;
}

static nt_status check_options(nt_ctx *ctx, const nt_scaler_options *o) {
  if (!(o->growth_factor > 1.0f) || !isfinite(o->growth_factor))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler growth_factor %g must be > 1",
                    (double)o->growth_factor);
  if (!(o->backoff_factor < 1.0f) || !(o->backoff_factor > 0.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler backoff_factor %g must be in (0, 1)",
                    (double)o->backoff_factor);
  if (o->growth_interval < 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler growth_interval %d must be >= 1",
                    (int)o->growth_interval);
  if (!(o->init_scale > 0.0f) || !isfinite(o->init_scale))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler init_scale %g must be finite and > 0",
                    (double)o->init_scale);
  if (!(o->min_scale >= 0.0f) || !(o->max_scale >= 0.0f) || !isfinite(o->max_scale))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler min_scale %g / max_scale %g must be >= 0",
                    (double)o->min_scale, (double)o->max_scale);
  if (o->min_scale > 0.0f && o->max_scale > 0.0f && o->min_scale > o->max_scale)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler min_scale %g > max_scale %g",
                    (double)o->min_scale, (double)o->max_scale);
  if (o->hysteresis < 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "scaler hysteresis %d must be >= 0",
                    (int)o->hysteresis);
  return NT_OK;
}

static nt_scaler_rule_args rule_args(const nt_scaler_options *o) {
  nt_scaler_rule_args a;
  a.growth_factor = o->growth_factor;
  a.backoff_factor = o->backoff_factor;
  a.min_scale = o->min_scale;
  a.max_scale = o->max_scale;
  a.growth_interval = o->growth_interval;
  a.hysteresis = o->hysteresis;
  return a;
}

/* Byte copy between the record (context's device) and host memory. */
static nt_status record_copy(nt_ctx *ctx, nt_scaler *s, nt_scaler_record *host, bool to_host) {
  int64_t n = (int64_t)sizeof *host;
  nt_tensor dev = nt_tensor_view(s->rec, NT_U8, s->device, 1, &n);
  nt_tensor h = nt_tensor_view(host, NT_U8, nt_cpu(), 1, &n);
  return to_host ? nt_tensor_copy(ctx, &h, &dev) : nt_tensor_copy(ctx, &dev, &h);
}

nt_status nt_scaler_create(nt_ctx *ctx, const nt_scaler_options *opt, nt_scaler **out) {
  nt_scaler_options o = opt ? *opt : nt_scaler_defaults();
  *out = NULL;
  nt_status st = check_options(ctx, &o);
  if (st) return st;
  nt_scaler *s = calloc(1, sizeof *s);
  if (!s) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the loss scaler");
  s->opt = o;
  s->device = nt_ctx_device(ctx);
  st = nt_alloc(ctx, sizeof(nt_scaler_record), (void **)&s->rec);
  if (st) goto fail;
  nt_scaler_record r;
  memset(&r, 0, sizeof r);
  r.scale = o.enabled ? o.init_scale : 1.0f;
  r.inv_scale = nt_scaler_inv(r.scale);
  r.hysteresis_left = o.hysteresis > 1 ? o.hysteresis : 1;
  r.last_skipped = -1;
  st = record_copy(ctx, s, &r, false);
  if (st) goto fail;
  s->found_view = nt_scaler_found_inf_tensor(s);
  *out = s;
  return NT_OK;
fail:
  nt_scaler_free(ctx, s);
  return st;
}

void nt_scaler_free(nt_ctx *ctx, nt_scaler *s) {
  if (!s) return;
  nt_free(ctx, s->rec);
  free(s);
}

bool nt_scaler_enabled(const nt_scaler *s) { return s && s->opt.enabled; }

static nt_tensor scalar_view(const nt_scaler *s, float *p) {
  return nt_tensor_view(p, NT_F32, s->device, 0, NULL);
}
nt_tensor nt_scaler_scale_tensor(const nt_scaler *s) { return scalar_view(s, &s->rec->scale); }
nt_tensor nt_scaler_inv_scale_tensor(const nt_scaler *s) {
  return scalar_view(s, &s->rec->inv_scale);
}
nt_tensor nt_scaler_found_inf_tensor(const nt_scaler *s) {
  return scalar_view(s, &s->rec->found_inf);
}

static nt_status check_ctx(nt_ctx *ctx, const nt_scaler *s) {
  nt_device d = nt_ctx_device(ctx);
  if (!s) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loss scaler is NULL");
  if (d.type != s->device.type || d.index != s->device.index)
    return NT_ERROR(ctx, NT_ERR_DEVICE, "loss scaler used with a context of another device");
  return NT_OK;
}

static nt_status zero_found_inf(nt_ctx *ctx, nt_scaler *s) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return nt_scaler_zero_found_inf_cuda(ctx, s->rec);
#endif
  if (s->device.type != NT_DEV_CPU)
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "loss scaler on a CUDA device without the backend");
  s->rec->found_inf = 0.0f;
  return NT_OK;
}

nt_status nt_scaler_unscale(nt_ctx *ctx, nt_scaler *s, nt_tensor *const *grads, int n) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  if (!s->opt.enabled) return NT_OK;
  if (s->stepped)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "loss scaler: unscale called after step (call update first)");
  if (s->unscaled)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "loss scaler: unscale already called since the last update");
  if (n < 0 || (n > 0 && !grads))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loss scaler: unscale of %d gradients", n);
  st = zero_found_inf(ctx, s);
  if (st) return st;
  if (n > 0) {
    nt_tensor inv = nt_scaler_inv_scale_tensor(s), found = nt_scaler_found_inf_tensor(s);
    st = nt_unscale_and_check(ctx, grads, n, &inv, &found);
    if (st) return st;
  }
  s->unscaled = true;
  return NT_OK;
}

nt_status nt_scaler_step(nt_ctx *ctx, nt_scaler *s, nt_tensor *const *grads, int n,
                         const nt_tensor **found_inf) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  if (found_inf) *found_inf = NULL;
  if (!s->opt.enabled) return NT_OK;
  if (s->stepped)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "loss scaler: step already called since the last update");
  if (!s->unscaled) {
    if (n <= 0 || !grads)
      return NT_ERROR(ctx, NT_ERR_STATE,
                      "loss scaler: step without a prior unscale needs the gradients");
    st = nt_scaler_unscale(ctx, s, grads, n);
    if (st) return st;
  }
  s->stepped = true;
  if (found_inf) *found_inf = &s->found_view;
  return NT_OK;
}

nt_status nt_scaler_update(nt_ctx *ctx, nt_scaler *s) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  if (!s->opt.enabled) return NT_OK;
  if (!s->unscaled)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "loss scaler: update with no inf check recorded (call unscale or step "
                    "since the last update)");
  nt_scaler_rule_args a = rule_args(&s->opt);
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) st = nt_scaler_update_cuda(ctx, s->rec, &a);
  else
#endif
    nt_scaler_rule(s->rec, &a);
  if (st) return st;
  s->unscaled = false;
  s->stepped = false;
  return NT_OK;
}

nt_status nt_scaler_read(nt_ctx *ctx, nt_scaler *s, nt_scaler_values *out) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  nt_scaler_record r;
  st = record_copy(ctx, s, &r, true);
  if (st) return st;
  out->scale = r.scale;
  out->growth_tracker = r.growth_tracker;
  out->updates = r.updates;
  out->skipped_total = r.skipped_total;
  out->last_skipped = r.last_skipped;
  return NT_OK;
}

nt_status nt_scaler_log(nt_ctx *ctx, nt_scaler *s) {
  nt_scaler_values v;
  nt_status st = nt_scaler_read(ctx, s, &v);
  if (st) return st;
  int64_t fresh = v.skipped_total - s->logged_skipped;
  if (fresh > 0)
    nt_log(ctx, NT_LOG_INFO,
           "loss scale %g after %lld updates: %lld step(s) skipped for overflow since the last "
           "log (latest at update %lld, %lld in total)",
           (double)v.scale, (long long)v.updates, (long long)fresh, (long long)v.last_skipped,
           (long long)v.skipped_total);
  else
    nt_log(ctx, NT_LOG_INFO, "loss scale %g after %lld updates (%lld skipped in total)",
           (double)v.scale, (long long)v.updates, (long long)v.skipped_total);
  s->logged_skipped = v.skipped_total;
  return NT_OK;
}

nt_status nt_scaler_state_get(nt_ctx *ctx, nt_scaler *s, nt_scaler_state *out) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  nt_scaler_record r;
  st = record_copy(ctx, s, &r, true);
  if (st) return st;
  memset(out, 0, sizeof *out);
  out->scale = r.scale;
  out->growth_factor = s->opt.growth_factor;
  out->backoff_factor = s->opt.backoff_factor;
  out->growth_interval = s->opt.growth_interval;
  out->growth_tracker = r.growth_tracker;
  out->min_scale = s->opt.min_scale;
  out->max_scale = s->opt.max_scale;
  out->hysteresis = s->opt.hysteresis;
  out->hysteresis_left = r.hysteresis_left;
  out->updates = r.updates;
  out->skipped_total = r.skipped_total;
  return NT_OK;
}

nt_status nt_scaler_state_set(nt_ctx *ctx, nt_scaler *s, const nt_scaler_state *in) {
  nt_status st = check_ctx(ctx, s);
  if (st) return st;
  if (s->unscaled || s->stepped)
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "loss scaler: state_set in the middle of a step (after unscale/step, "
                    "before update)");
  nt_scaler_options o = s->opt;
  o.growth_factor = in->growth_factor;
  o.backoff_factor = in->backoff_factor;
  o.growth_interval = in->growth_interval;
  o.min_scale = in->min_scale;
  o.max_scale = in->max_scale;
  o.hysteresis = in->hysteresis;
  /* The saved scale may have legitimately decayed to 0 or a subnormal: only the options are
   * validated, the scale must merely be finite and >= 0. */
  o.init_scale = 1.0f;
  st = check_options(ctx, &o);
  if (st) return st;
  if (!(in->scale >= 0.0f) || !isfinite(in->scale) || in->growth_tracker < 0 ||
      in->updates < 0 || in->skipped_total < 0 || in->hysteresis_left < 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "loss scaler state: scale %g, growth_tracker %d, counters must be >= 0",
                    (double)in->scale, (int)in->growth_tracker);
  nt_scaler_record r;
  memset(&r, 0, sizeof r);
  r.scale = in->scale;
  r.inv_scale = nt_scaler_inv(in->scale);
  r.growth_tracker = in->growth_tracker;
  r.hysteresis_left = in->hysteresis_left > 0 ? in->hysteresis_left
                                              : (in->hysteresis > 1 ? in->hysteresis : 1);
  r.updates = in->updates;
  r.skipped_total = in->skipped_total;
  r.last_skipped = -1;
  st = record_copy(ctx, s, &r, false);
  if (st) return st;
  o.init_scale = s->opt.init_scale;
  s->opt = o;
  s->logged_skipped = in->skipped_total;
  return NT_OK;
}
