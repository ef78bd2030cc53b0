#include "models/module.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

nt_status nt_params_add_unit(nt_ctx *ctx, nt_params *p, const char *name, int *unit) {
  if (p->allocated) return NT_ERROR(ctx, NT_ERR_STATE, "unit '%s' added after allocation", name);
  if (p->n_units == p->cap) {
    int cap = p->cap ? p->cap * 2 : 8;
    nt_unit *u = realloc(p->units, (size_t)cap * sizeof *u);
    if (!u) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the unit table");
    p->units = u;
    p->cap = cap;
  }
  nt_unit *u = &p->units[p->n_units];
  memset(u, 0, sizeof *u);
  snprintf(u->name, sizeof u->name, "%s", name);
  *unit = p->n_units++;
  return NT_OK;
}

nt_status nt_params_add(nt_ctx *ctx, nt_params *p, int unit, const char *name, int ndim,
                        const int64_t *shape, bool decay, nt_init_kind init, float init_a,
                        int *index) {
  if (unit < 0 || unit >= p->n_units)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "parameter '%s': no unit %d", name, unit);
  if (ndim < 1 || ndim > NT_MAX_DIMS)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "parameter '%s' has %d dims", name, ndim);
  if (strlen(name) >= NT_PARAM_NAME_MAX)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "parameter name '%s' is too long", name);
  nt_unit *u = &p->units[unit];
  if (u->n_params == u->cap) {
    int cap = u->cap ? u->cap * 2 : 8;
    nt_param_desc *d = realloc(u->params, (size_t)cap * sizeof *d);
    if (!d) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the parameter table");
    u->params = d;
    u->cap = cap;
  }
  nt_param_desc *d = &u->params[u->n_params];
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->ndim = ndim;
  d->numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0)
      return NT_ERROR(ctx, NT_ERR_SHAPE, "parameter '%s' dim %d is %lld", name, i,
                      (long long)shape[i]);
    d->shape[i] = shape[i];
    d->numel *= shape[i];
  }
  d->decay = decay;
  d->init = init;
  d->init_a = init_a;
  if (index) *index = u->n_params;
  u->n_params++;
  return NT_OK;
}

static void layout_unit(nt_unit *u) {
  int64_t off = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < u->n_params; i++) {
      nt_param_desc *d = &u->params[i];
      if (d->decay != (pass == 0)) continue;
      d->offset = off;
      off = align_up(off + d->numel, NT_PARAM_ALIGN);
    }
    if (pass == 0) u->n_decay = off;
  }
  u->numel = off;
}

void nt_params_layout(nt_params *p) {
  p->numel = 0;
  p->n_real = 0;
  for (int k = 0; k < p->n_units; k++) {
    layout_unit(&p->units[k]);
    for (int i = 0; i < p->units[k].n_params; i++) p->n_real += p->units[k].params[i].numel;
    p->numel += p->units[k].numel;
  }
}

void nt_model_sizes_of(const nt_params *p, size_t activation_bytes, nt_model_sizes *out) {
  memset(out, 0, sizeof *out);
  out->n_params = p->n_real;
  out->n_flat = p->numel;
  out->n_units = p->n_units;
  for (int k = 0; k < p->n_units; k++)
    if (p->units[k].numel > out->largest_unit) out->largest_unit = p->units[k].numel;
  out->activation_bytes = activation_bytes;
}

nt_status nt_params_alloc(nt_ctx *ctx, nt_params *p, nt_dtype compute_dtype) {
  if (p->allocated) return NT_ERROR(ctx, NT_ERR_STATE, "parameters allocated twice");
  if (compute_dtype != NT_F32 && compute_dtype != NT_F16 && compute_dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "compute dtype %s: expected f32, f16 or bf16",
                    nt_dtype_name(compute_dtype));
  p->compute_dtype = compute_dtype;
  nt_params_layout(p);
  nt_status st = NT_OK;
  for (int k = 0; k < p->n_units; k++) {
    nt_unit *u = &p->units[k];
    int64_t n = u->numel ? u->numel : 1;
    st = nt_tensor_alloc(ctx, &u->master, NT_F32, 1, &n);
    if (!st) st = nt_tensor_alloc(ctx, &u->grad, NT_F32, 1, &n);
    if (st) break;
    if (compute_dtype == NT_F32) {
      u->compute = u->master;
      u->compute.owner = NULL;
    } else {
      st = nt_tensor_alloc(ctx, &u->compute, compute_dtype, 1, &n);
      if (st) break;
    }
    /* every buffer zeroed once, the compute copy too: the optimizer and the casts write only
     * the parameters' elements, so the alignment gaps between them would otherwise never be
     * defined, and a vector load at a tensor's end may read into one */
    st = nt_tensor_zero(ctx, &u->master);
    if (!st) st = nt_tensor_zero(ctx, &u->grad);
    if (!st && u->compute.owner) st = nt_tensor_zero(ctx, &u->compute);
    if (st) break;
  }
  p->allocated = true;
  return st;
}

void nt_params_free(nt_ctx *ctx, nt_params *p) {
  if (!p) return;
  for (int k = 0; k < p->n_units; k++) {
    nt_unit *u = &p->units[k];
    if (u->compute.owner) nt_tensor_free(ctx, &u->compute);
    nt_tensor_free(ctx, &u->grad);
    nt_tensor_free(ctx, &u->master);
    free(u->params);
  }
  free(p->units);
  memset(p, 0, sizeof *p);
}

nt_tensor nt_params_view(const nt_params *p, int unit, int index, nt_param_view which) {
  const nt_unit *u = &p->units[unit];
  const nt_param_desc *d = &u->params[index];
  const nt_tensor *buf = which == NT_VIEW_MASTER ? &u->master
                         : which == NT_VIEW_GRAD ? &u->grad
                                                 : &u->compute;
  char *base = (char *)buf->data + (size_t)d->offset * nt_dtype_size(buf->dtype);
  return nt_tensor_view(base, buf->dtype, buf->device, d->ndim, d->shape);
}

bool nt_params_find(const nt_params *p, const char *name, int *unit, int *index) {
  for (int k = 0; k < p->n_units; k++)
    for (int i = 0; i < p->units[k].n_params; i++)
      if (!strcmp(p->units[k].params[i].name, name)) {
        *unit = k;
        *index = i;
        return true;
      }
  return false;
}

/* Parameter k draws numbers from stream position k << 40, independent of the others. */
static void init_param(const nt_param_desc *d, float *dst, uint64_t seed, uint64_t k) {
  uint64_t base = k << 40;
  switch (d->init) {
  case NT_INIT_ZEROS:
    memset(dst, 0, (size_t)d->numel * sizeof(float));
    break;
  case NT_INIT_ONES:
    for (int64_t i = 0; i < d->numel; i++) dst[i] = 1.0f;
    break;
  case NT_INIT_UNIFORM:
    for (int64_t i = 0; i < d->numel; i++) {
      double u = nt_rng_u32_to_uniform(nt_rng_u32(seed, base + (uint64_t)i));
      dst[i] = (float)((2.0 * u - 1.0) * d->init_a);
    }
    break;
  case NT_INIT_NORMAL:
    /* Box-Muller in double on pairs (u1, u2). */
    for (int64_t i = 0; i < d->numel; i += 2) {
      double u1 = nt_rng_u32_to_uniform(nt_rng_u32(seed, base + (uint64_t)i));
      double u2 = nt_rng_u32_to_uniform(nt_rng_u32(seed, base + (uint64_t)i + 1));
      double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
      dst[i] = (float)(r * cos(a) * d->init_a);
      if (i + 1 < d->numel) dst[i + 1] = (float)(r * sin(a) * d->init_a);
    }
    break;
  }
}

nt_status nt_params_init(nt_ctx *ctx, nt_params *p, uint64_t seed) {
  if (!p->allocated) return NT_ERROR(ctx, NT_ERR_STATE, "parameters initialised before alloc");
  uint64_t k = 0;
  nt_status st = NT_OK;
  for (int j = 0; j < p->n_units && !st; j++) {
    nt_unit *u = &p->units[j];
    float *host = calloc((size_t)(u->numel ? u->numel : 1), sizeof(float));
    if (!host) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory initialising '%s'", u->name);
    for (int i = 0; i < u->n_params; i++, k++)
      init_param(&u->params[i], host + u->params[i].offset, seed, k);
    nt_tensor src = nt_tensor_view(host, NT_F32, nt_cpu(), 1, u->master.shape);
    st = nt_tensor_copy(ctx, &u->master, &src);
    free(host);
  }
  if (!st) st = nt_params_sync_compute(ctx, p);
  return st;
}

nt_status nt_params_sync_compute(nt_ctx *ctx, nt_params *p) {
  for (int j = 0; j < p->n_units; j++) {
    nt_unit *u = &p->units[j];
    if (!u->compute.owner) continue;
    nt_status st = nt_convert(ctx, &u->compute, &u->master);
    if (st) return st;
  }
  return NT_OK;
}

nt_status nt_params_zero_grad(nt_ctx *ctx, nt_params *p) {
  for (int j = 0; j < p->n_units; j++) {
    nt_status st = nt_tensor_zero(ctx, &p->units[j].grad);
    if (st) return st;
  }
  return NT_OK;
}

nt_status nt_params_adopt_master(nt_ctx *ctx, nt_params *p, int unit, const nt_tensor *master) {
  nt_unit *u = &p->units[unit];
  if (master->dtype != NT_F32 || nt_tensor_numel(master) != u->numel)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "unit '%s': optimizer master has %lld elements, expected %lld",
                    u->name, (long long)nt_tensor_numel(master), (long long)u->numel);
  if (!u->compute.owner) {
    if (master->data != u->master.data)
      return NT_ERROR(ctx, NT_ERR_STATE, "unit '%s' is F32: the optimizer must update it in place",
                      u->name);
    return NT_OK;
  }
  if (u->master.owner) nt_tensor_free(ctx, &u->master);
  u->master = nt_tensor_view(master->data, NT_F32, master->device, 1, &u->numel);
  return NT_OK;
}

nt_status nt_arena_add(nt_ctx *ctx, nt_arena *a, nt_tensor *t, nt_dtype dt, int ndim,
                       const int64_t *shape) {
  if (a->base) return NT_ERROR(ctx, NT_ERR_STATE, "activation added after the arena was allocated");
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 64;
    nt_tensor **s = realloc(a->slots, (size_t)cap * sizeof *s);
    if (!s) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the activation table");
    a->slots = s;
    a->cap = cap;
  }
  *t = nt_tensor_view(NULL, dt, nt_ctx_device(ctx), ndim, shape);
  a->slots[a->n++] = t;
  a->bytes += (nt_tensor_nbytes(t) + 255) & ~(size_t)255;
  return NT_OK;
}

nt_status nt_arena_alloc(nt_ctx *ctx, nt_arena *a) {
  nt_status st = nt_alloc(ctx, a->bytes ? a->bytes : 256, &a->base);
  if (st) return st;
  size_t off = 0;
  for (int i = 0; i < a->n; i++) {
    a->slots[i]->data = (char *)a->base + off;
    off += (nt_tensor_nbytes(a->slots[i]) + 255) & ~(size_t)255;
  }
  return NT_OK;
}

void nt_arena_free(nt_ctx *ctx, nt_arena *a) {
  if (!a) return;
  nt_free(ctx, a->base);
  free(a->slots);
  memset(a, 0, sizeof *a);
}

nt_tensor nt_prefix_view(const nt_tensor *t, int ndim, const int64_t *shape) {
  return nt_tensor_view(t->data, t->dtype, t->device, ndim, shape);
}

nt_status nt_unit_before_forward(nt_ctx *ctx, const nt_unit_hooks *h, int unit) {
  return h && h->before_forward ? h->before_forward(ctx, h->arg, unit) : NT_OK;
}

nt_status nt_unit_before_backward(nt_ctx *ctx, const nt_unit_hooks *h, int unit) {
  return h && h->before_backward ? h->before_backward(ctx, h->arg, unit) : NT_OK;
}

nt_status nt_unit_grads_ready(nt_ctx *ctx, const nt_unit_hooks *h, int unit) {
  return h && h->grads_ready ? h->grads_ready(ctx, h->arg, unit) : NT_OK;
}
