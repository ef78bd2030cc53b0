/* SGD: options, dispatch, the CPU reference loop, state views and files. */
#include "optim/sgd.h"
#include "optim/optim_common.h"
#include "optim/update_rules.h"
#include <math.h>
#include <stdlib.h>

#ifdef NT_HAVE_CUDA
nt_status nt_sgd_unit_cuda(nt_ctx *ctx, const nt_optim_chunk *chunks, int64_t n_chunks,
                           float *master, float *buf, const void *grad, nt_dtype gdt, void *lp,
                           nt_dtype pdt, const nt_sgd_hyper *h, const nt_optim_record *rec);
#endif

struct nt_sgd {
  nt_sgd_options opt;
  nt_optim_base base;
  float **buf;       /* momentum buffers (allocated even without momentum: keeps files uniform) */
};

nt_sgd_options nt_sgd_defaults(double lr) {
  nt_sgd_options o = {lr, 0.0, 0.0, 0.0, false};
  return o;
}

nt_status nt_sgd_create(nt_ctx *ctx, const nt_sgd_options *opt, const nt_param_unit *units,
                        int n_units, const nt_param_group *groups, int n_groups, nt_sgd **out) {
  nt_status st;
  *out = NULL;
  if (!opt) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "sgd: options are required (lr)");
  nt_sgd_options o = *opt;
  if (!(o.lr >= 0.0) || !(o.momentum >= 0.0) || !(o.weight_decay >= 0.0) || !(o.dampening >= 0.0))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "sgd: lr %g, momentum %g, dampening %g, weight_decay %g must be >= 0", o.lr,
                    o.momentum, o.dampening, o.weight_decay);
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "sgd: nesterov needs momentum > 0 and dampening 0 (got %g, %g)", o.momentum,
                    o.dampening);
  nt_sgd *s = calloc(1, sizeof *s);
  if (!s) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for sgd");
  s->opt = o;
  if ((st = nt_optim_base_init(ctx, &s->base, units, n_units, groups, n_groups, o.weight_decay)))
    goto fail;
  if ((st = nt_optim_base_alloc_state(ctx, &s->base, &s->buf))) goto fail;
  *out = s;
  return NT_OK;
fail:
  nt_sgd_free(ctx, s);
  return st;
}

void nt_sgd_free(nt_ctx *ctx, nt_sgd *s) {
  if (!s) return;
  nt_optim_base_free_state(ctx, &s->base, s->buf);
  nt_optim_base_free(ctx, &s->base);
  free(s);
}

static float load_grad(const void *g, nt_dtype dt, int64_t i) {
  switch (dt) {
    case NT_F16: return nt_f16_to_f32(((const uint16_t *)g)[i]);
    case NT_BF16: return nt_bf16_to_f32(((const uint16_t *)g)[i]);
    default: return ((const float *)g)[i];
  }
}

static void sgd_unit_cpu(const nt_optim_chunk *chunks, int64_t n_chunks, float *master,
                         float *buf, const void *grad, nt_dtype gdt, void *lp, nt_dtype pdt,
                         const nt_sgd_hyper *h, const nt_optim_record *rec) {
  if (rec->skip) return;
  for (int64_t c = 0; c < n_chunks; c++) {
    int grp = chunks[c].group;
    float neg_lr = rec->neg_lr[grp], wd = rec->wd[grp];
    int64_t end = chunks[c].offset + chunks[c].length;
    for (int64_t i = chunks[c].offset; i < end; i++) {
      nt_sgd_update(&master[i], buf ? &buf[i] : NULL, load_grad(grad, gdt, i), rec->clip_coef,
                    wd, neg_lr, rec->step == 1, h);
      if (pdt == NT_F16) ((uint16_t *)lp)[i] = nt_f32_to_f16(master[i]);
      else if (pdt == NT_BF16) ((uint16_t *)lp)[i] = nt_f32_to_bf16(master[i]);
    }
  }
}

nt_status nt_sgd_step(nt_ctx *ctx, nt_sgd *s, const nt_optim_step_args *args) {
  nt_optim_step_args def = nt_optim_args(-1.0);
  nt_status st;
  if (!s) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "sgd is NULL");
  if (!args) args = &def;
  if ((st = nt_optim_base_prepare(ctx, &s->base, args, 0.0, 0.0, s->opt.lr))) return st;
  nt_sgd_hyper h;
  h.momentum = (float)s->opt.momentum;
  h.one_minus_dampening = (float)(1.0 - s->opt.dampening);
  h.nesterov = s->opt.nesterov ? 1 : 0;
  bool use_buf = s->opt.momentum != 0.0;
  for (int u = 0; u < s->base.n_units; u++) {
    const nt_param_unit *pu = &s->base.units[u];
    float *buf = use_buf ? s->buf[u] : NULL;
    if (s->base.n_chunks[u] == 0) continue;
#ifdef NT_HAVE_CUDA
    if (nt_ctx_is_cuda(ctx)) {
      st = nt_sgd_unit_cuda(ctx, s->base.chunks[u], s->base.n_chunks[u], s->base.master[u], buf,
                            pu->grads.data, pu->grads.dtype, pu->params.data, pu->params.dtype,
                            &h, s->base.rec);
      if (st) return st;
      continue;
    }
#endif
    if (s->base.device.type != NT_DEV_CPU)
      return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "sgd on a CUDA device without the backend");
    sgd_unit_cpu(s->base.chunks[u], s->base.n_chunks[u], s->base.master[u], buf, pu->grads.data,
                 pu->grads.dtype, pu->params.data, pu->params.dtype, &h, s->base.rec);
  }
  return NT_OK;
}

nt_status nt_sgd_state_views(nt_sgd *s, int u, nt_tensor *master, nt_tensor *momentum_buf) {
  if (!s || u < 0 || u >= s->base.n_units)
    return NT_ERROR(NULL, NT_ERR_INVALID_ARG, "sgd_state_views: no unit %d", u);
  int64_t n = nt_tensor_numel(&s->base.units[u].params);
  if (master) *master = nt_tensor_view(s->base.master[u], NT_F32, s->base.device, 1, &n);
  if (momentum_buf) *momentum_buf = nt_tensor_view(s->buf[u], NT_F32, s->base.device, 1, &n);
  return NT_OK;
}

nt_status nt_sgd_get_step(nt_ctx *ctx, nt_sgd *s, int32_t *step) {
  nt_optim_record r;
  nt_status st = nt_optim_base_read(ctx, &s->base, &r);
  if (!st) *step = r.step;
  return st;
}

nt_status nt_sgd_save(nt_ctx *ctx, nt_sgd *s, const char *path) {
  float **const bufs[2] = {s->base.master, s->buf};
  return nt_optim_save(ctx, &s->base, path, "sgd", bufs, 2);
}

nt_status nt_sgd_load(nt_ctx *ctx, nt_sgd *s, const char *path) {
  float **const bufs[2] = {s->base.master, s->buf};
  nt_status st = nt_optim_load(ctx, &s->base, path, "sgd", bufs, 2);
  if (st) return st;
  return nt_optim_base_refresh_params(ctx, &s->base);
}
