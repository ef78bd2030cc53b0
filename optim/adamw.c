/* Adam/AdamW: options, dispatch, the CPU reference loop, state views and files. */
#include "optim/adamw.h"
#include "optim/optim_common.h"
#include "optim/update_rules.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_adamw_unit_cuda(nt_ctx *ctx, const nt_optim_chunk *chunks, int64_t n_chunks,
                             float *master, float *m, float *v, const void *grad, nt_dtype gdt,
                             void *lp, nt_dtype pdt, const nt_adam_hyper *h,
                             const nt_optim_record *rec);
#endif

struct nt_adamw {
  nt_adamw_options opt;
  nt_optim_base base;
  float **m, **v;
};

nt_adamw_options nt_adamw_defaults(void) {
  nt_adamw_options o = {1e-3, 0.9, 0.999, 1e-8, 1e-2, true};
  return o;
}

nt_adamw_options nt_adam_defaults(void) {
  nt_adamw_options o = {1e-3, 0.9, 0.999, 1e-8, 0.0, false};
  return o;
}

nt_status nt_adamw_create(nt_ctx *ctx, const nt_adamw_options *opt, const nt_param_unit *units,
                          int n_units, const nt_param_group *groups, int n_groups,
                          nt_adamw **out) {
  nt_adamw_options o = opt ? *opt : nt_adamw_defaults();
  nt_status st;
  *out = NULL;
  if (!(o.lr >= 0.0) || !(o.eps >= 0.0) || !(o.weight_decay >= 0.0))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "adamw: lr %g, eps %g, weight_decay %g must be >= 0",
                    o.lr, o.eps, o.weight_decay);
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0) || !(o.beta2 >= 0.0 && o.beta2 < 1.0))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "adamw: betas (%g, %g) must be in [0, 1)", o.beta1,
                    o.beta2);
  nt_adamw *a = calloc(1, sizeof *a);
  if (!a) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for adamw");
  a->opt = o;
  if ((st = nt_optim_base_init(ctx, &a->base, units, n_units, groups, n_groups, o.weight_decay)))
    goto fail;
  if ((st = nt_optim_base_alloc_state(ctx, &a->base, &a->m))) goto fail;
  if ((st = nt_optim_base_alloc_state(ctx, &a->base, &a->v))) goto fail;
  *out = a;
  return NT_OK;
fail:
  nt_adamw_free(ctx, a);
  return st;
}

void nt_adamw_free(nt_ctx *ctx, nt_adamw *a) {
  if (!a) return;
  nt_optim_base_free_state(ctx, &a->base, a->m);
  nt_optim_base_free_state(ctx, &a->base, a->v);
  nt_optim_base_free(ctx, &a->base);
  free(a);
}

static float load_grad(const void *g, nt_dtype dt, int64_t i) {
  switch (dt) {
    case NT_F16: return nt_f16_to_f32(((const uint16_t *)g)[i]);
    case NT_BF16: return nt_bf16_to_f32(((const uint16_t *)g)[i]);
    default: return ((const float *)g)[i];
  }
}

static void store_param(void *p, nt_dtype dt, int64_t i, float x) {
  if (dt == NT_F16) ((uint16_t *)p)[i] = nt_f32_to_f16(x);
  else if (dt == NT_BF16) ((uint16_t *)p)[i] = nt_f32_to_bf16(x);
}

static void adamw_unit_cpu(const nt_optim_chunk *chunks, int64_t n_chunks, float *master,
                           float *m, float *v, const void *grad, nt_dtype gdt, void *lp,
                           nt_dtype pdt, const nt_adam_hyper *h, const nt_optim_record *rec) {
  if (rec->skip) return;
  for (int64_t c = 0; c < n_chunks; c++) {
    nt_adam_coefs k = nt_adam_coefs_make(rec, chunks[c].group);
    int64_t end = chunks[c].offset + chunks[c].length;
    for (int64_t i = chunks[c].offset; i < end; i++) {
      nt_adam_update(&master[i], &m[i], &v[i], load_grad(grad, gdt, i), rec->clip_coef, h, &k);
      if (pdt != NT_F32) store_param(lp, pdt, i, master[i]);
    }
  }
}

nt_status nt_adamw_step(nt_ctx *ctx, nt_adamw *a, const nt_optim_step_args *args) {
  nt_optim_step_args def = nt_optim_args(-1.0);
  nt_status st;
  if (!a) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "adamw is NULL");
  if (!args) args = &def;
  if ((st = nt_optim_base_prepare(ctx, &a->base, args, a->opt.beta1, a->opt.beta2, a->opt.lr)))
    return st;
  nt_adam_hyper h;
  h.beta1 = (float)a->opt.beta1;
  h.one_minus_beta1 = (float)(1.0 - a->opt.beta1);
  h.beta2 = (float)a->opt.beta2;
  h.one_minus_beta2 = (float)(1.0 - a->opt.beta2);
  h.eps = (float)a->opt.eps;
  h.decoupled = a->opt.decoupled ? 1 : 0;
  for (int u = 0; u < a->base.n_units; u++) {
    const nt_param_unit *pu = &a->base.units[u];
    if (a->base.n_chunks[u] == 0) continue;
#ifdef NT_HAVE_CUDA
    if (nt_ctx_is_cuda(ctx)) {
      st = nt_adamw_unit_cuda(ctx, a->base.chunks[u], a->base.n_chunks[u], a->base.master[u],
                              a->m[u], a->v[u], pu->grads.data, pu->grads.dtype, pu->params.data,
                              pu->params.dtype, &h, a->base.rec);
      if (st) return st;
      continue;
    }
#endif
    if (a->base.device.type != NT_DEV_CPU)
      return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "adamw on a CUDA device without the backend");
    adamw_unit_cpu(a->base.chunks[u], a->base.n_chunks[u], a->base.master[u], a->m[u], a->v[u],
                   pu->grads.data, pu->grads.dtype, pu->params.data, pu->params.dtype, &h,
                   a->base.rec);
  }
  return NT_OK;
}

nt_status nt_adamw_state_views(nt_adamw *a, int u, nt_tensor *master, nt_tensor *m,
                               nt_tensor *v) {
  if (!a || u < 0 || u >= a->base.n_units)
    return NT_ERROR(NULL, NT_ERR_INVALID_ARG, "adamw_state_views: no unit %d", u);
  int64_t n = nt_tensor_numel(&a->base.units[u].params);
  if (master) *master = nt_tensor_view(a->base.master[u], NT_F32, a->base.device, 1, &n);
  if (m) *m = nt_tensor_view(a->m[u], NT_F32, a->base.device, 1, &n);
  if (v) *v = nt_tensor_view(a->v[u], NT_F32, a->base.device, 1, &n);
  return NT_OK;
}

nt_status nt_adamw_get_step(nt_ctx *ctx, nt_adamw *a, int32_t *step) {
  nt_optim_record r;
  nt_status st = nt_optim_base_read(ctx, &a->base, &r);
  if (!st) *step = r.step;
  return st;
}

nt_status nt_adamw_set_step(nt_ctx *ctx, nt_adamw *a, int32_t step) {
  nt_optim_record r;
  if (step < 0) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "adamw: step %d must be >= 0", step);
  nt_status st = nt_optim_base_read(ctx, &a->base, &r);
  if (st) return st;
  r.step = step;
  return nt_optim_base_write(ctx, &a->base, &r);
}

nt_status nt_adamw_last_grad_norm(nt_ctx *ctx, nt_adamw *a, float *norm) {
  nt_optim_record r;
  nt_status st = nt_optim_base_read(ctx, &a->base, &r);
  if (!st) *norm = r.total_norm;
  return st;
}

nt_status nt_adamw_save(nt_ctx *ctx, nt_adamw *a, const char *path) {
  float **const bufs[3] = {a->base.master, a->m, a->v};
  return nt_optim_save(ctx, &a->base, path, a->opt.decoupled ? "adamw" : "adam", bufs, 3);
}

nt_status nt_adamw_load(nt_ctx *ctx, nt_adamw *a, const char *path) {
  float **const bufs[3] = {a->base.master, a->m, a->v};
  nt_status st = nt_optim_load(ctx, &a->base, path, a->opt.decoupled ? "adamw" : "adam", bufs, 3);
  if (st) return st;
  return nt_optim_base_refresh_params(ctx, &a->base);
}
