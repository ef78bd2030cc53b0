/* Shared machinery of the fused optimizers: unit and group checks, the chunk table, master
 * weights, the device step record, and state files. */
#include "optim/optim_common.h"
#include "ops/reduce.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_optim_prepare_cuda(nt_ctx *ctx, nt_optim_record *rec, float *found,
                                const float *grad_scale, const float *sumsq, float max_norm,
                                double beta1, double beta2, double lr, const float *lr_dev,
                                const nt_optim_groups *g);
#endif

nt_status nt_optim_copy(nt_ctx *ctx, void *dst, bool dst_host, const void *src, bool src_host,
                        size_t bytes) {
  int64_t n = (int64_t)bytes;
  nt_device dev = nt_ctx_device(ctx);
  nt_tensor d = nt_tensor_view(dst, NT_U8, dst_host ? nt_cpu() : dev, 1, &n);
  nt_tensor s = nt_tensor_view((void *)src, NT_U8, src_host ? nt_cpu() : dev, 1, &n);
  return nt_tensor_copy(ctx, &d, &s);
}

static bool float_dtype(nt_dtype dt) { return dt == NT_F32 || dt == NT_F16 || dt == NT_BF16; }

static nt_status check_unit(nt_ctx *ctx, const nt_param_unit *u, int i) {
  char what[64];
  nt_status st;
  snprintf(what, sizeof what, "optimizer unit %d params", i);
  if ((st = nt_check_contiguous(ctx, &u->params, what)) || (st = nt_check_device(ctx, &u->params, what)))
    return st;
  if (!float_dtype(u->params.dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s (expected f32, f16 or bf16)", what,
                    nt_dtype_name(u->params.dtype));
  snprintf(what, sizeof what, "optimizer unit %d grads", i);
  if ((st = nt_check_contiguous(ctx, &u->grads, what)) || (st = nt_check_device(ctx, &u->grads, what)))
    return st;
  if (!float_dtype(u->grads.dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s (expected f32, f16 or bf16)", what,
                    nt_dtype_name(u->grads.dtype));
  if (nt_tensor_numel(&u->grads) != nt_tensor_numel(&u->params))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "optimizer unit %d: %lld grads for %lld params", i,
                    (long long)nt_tensor_numel(&u->grads), (long long)nt_tensor_numel(&u->params));
  if (nt_tensor_numel(&u->params) > ((int64_t)1 << 40))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "optimizer unit %d is too large", i);
  if (u->master_init) {
    snprintf(what, sizeof what, "optimizer unit %d master_init", i);
    if ((st = nt_check_dtype(ctx, u->master_init, NT_F32, what)) ||
        (st = nt_check_contiguous(ctx, u->master_init, what)) ||
        (st = nt_check_device(ctx, u->master_init, what)))
      return st;
    if (nt_tensor_numel(u->master_init) != nt_tensor_numel(&u->params))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: numel %lld, params %lld", what,
                      (long long)nt_tensor_numel(u->master_init),
                      (long long)nt_tensor_numel(&u->params));
  }
  return NT_OK;
}

typedef struct { int64_t off, len; int group; } range;

static int range_cmp(const void *a, const void *b) {
  const range *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Splits the unit's sorted ranges into chunks; chunk boundaries fall on multiples of
 * NT_OPTIM_CHUNK inside a range, so all but a range's first chunk start 16-byte aligned. */
static int64_t build_chunks(const range *r, int n, nt_optim_chunk *out) {
  int64_t k = 0;
  for (int i = 0; i < n; i++) {
    int64_t pos = r[i].off, end = r[i].off + r[i].len;
    while (pos < end) {
      int64_t next = (pos / NT_OPTIM_CHUNK + 1) * NT_OPTIM_CHUNK;
      if (next > end) next = end;
      if (out) {
        out[k].offset = pos;
        out[k].length = (int32_t)(next - pos);
        out[k].group = r[i].group;
      }
      k++;
      pos = next;
    }
  }
  return k;
}

static nt_status unit_chunks(nt_ctx *ctx, nt_optim_base *b, int u, const nt_param_group *groups,
                             int n_groups) {
  int64_t numel = nt_tensor_numel(&b->units[u].params);
  int n = 0, cap = 1;
  for (int g = 0; g < n_groups; g++) cap += groups[g].n_ranges;
  range *rs = malloc(sizeof *rs * (size_t)cap);
  nt_optim_chunk *host = NULL;
  nt_status st = NT_OK;
  if (!rs) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for parameter ranges");
  if (n_groups == 0) {
    rs[n].off = 0; rs[n].len = numel; rs[n].group = 0; n++;
  }
  for (int g = 0; g < n_groups; g++) {
    for (int j = 0; j < groups[g].n_ranges; j++) {
      const nt_param_range *pr = &groups[g].ranges[j];
      if (pr->unit != u) continue;
      if (pr->offset < 0 || pr->length < 0 || pr->offset + pr->length > numel) {
        st = NT_ERROR(ctx, NT_ERR_SHAPE,
                      "parameter group %d range %d: [%lld, %lld) outside unit %d of %lld elements",
                      g, j, (long long)pr->offset, (long long)(pr->offset + pr->length), u,
                      (long long)numel);
        goto done;
      }
      if (pr->length == 0) continue;
      rs[n].off = pr->offset; rs[n].len = pr->length; rs[n].group = g; n++;
    }
  }
  qsort(rs, (size_t)n, sizeof *rs, range_cmp);
  for (int i = 1; i < n; i++) {
    if (rs[i].off < rs[i - 1].off + rs[i - 1].len) {
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "parameter groups %d and %d overlap in unit %d at element %lld",
                    rs[i - 1].group, rs[i].group, u, (long long)rs[i].off);
      goto done;
    }
  }
  b->n_chunks[u] = build_chunks(rs, n, NULL);
  if (b->n_chunks[u] == 0) goto done;
  size_t bytes = sizeof *host * (size_t)b->n_chunks[u];
  host = malloc(bytes);
  if (!host) { st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the chunk table"); goto done; }
  build_chunks(rs, n, host);
  st = nt_alloc(ctx, bytes, (void **)&b->chunks[u]);
  if (st) goto done;
  st = nt_optim_copy(ctx, b->chunks[u], false, host, true, bytes);
done:
  free(host);
  free(rs);
  return st;
}

static nt_status init_master(nt_ctx *ctx, nt_optim_base *b, int u, const nt_tensor *init) {
  nt_param_unit *pu = &b->units[u];
  int64_t numel = nt_tensor_numel(&pu->params);
  nt_tensor master;
  nt_status st;
  if (pu->params.dtype == NT_F32) {
    b->master[u] = (float *)pu->params.data;
    if (init) return nt_tensor_copy(ctx, &pu->params, init);
    return NT_OK;
  }
  st = nt_alloc(ctx, sizeof(float) * (size_t)(numel ? numel : 1), (void **)&b->master[u]);
  if (st) return st;
  b->master_owned[u] = true;
  master = nt_tensor_view(b->master[u], NT_F32, b->device, 1, &numel);
  if (numel == 0) return NT_OK;
  if (init) {
    st = nt_tensor_copy(ctx, &master, init);
    if (st) return st;
    nt_tensor p = nt_tensor_view(pu->params.data, pu->params.dtype, b->device, 1, &numel);
    return nt_convert(ctx, &p, &master);
  }
  nt_tensor p = nt_tensor_view(pu->params.data, pu->params.dtype, b->device, 1, &numel);
  return nt_convert(ctx, &master, &p);
}

nt_status nt_optim_base_refresh_params(nt_ctx *ctx, nt_optim_base *b) {
  for (int u = 0; u < b->n_units; u++) {
    nt_param_unit *pu = &b->units[u];
    int64_t numel = nt_tensor_numel(&pu->params);
    if (pu->params.dtype == NT_F32 || numel == 0) continue;
    nt_tensor master = nt_tensor_view(b->master[u], NT_F32, b->device, 1, &numel);
    nt_tensor p = nt_tensor_view(pu->params.data, pu->params.dtype, b->device, 1, &numel);
    nt_status st = nt_convert(ctx, &p, &master);
    if (st) return st;
  }
  return NT_OK;
}

nt_status nt_optim_base_init(nt_ctx *ctx, nt_optim_base *b, const nt_param_unit *units,
                             int n_units, const nt_param_group *groups, int n_groups,
                             double default_weight_decay) {
  nt_status st;
  memset(b, 0, sizeof *b);
  b->device = nt_ctx_device(ctx);
  if (n_units < 1 || !units)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer needs at least one unit (got %d)", n_units);
  if (n_groups < 0 || n_groups > NT_OPTIM_MAX_GROUPS || (n_groups > 0 && !groups))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer: %d parameter groups (at most %d)",
                    n_groups, NT_OPTIM_MAX_GROUPS);
  for (int i = 0; i < n_units; i++)
    if ((st = check_unit(ctx, &units[i], i))) return st;
  for (int g = 0; g < n_groups; g++) {
    if (groups[g].n_ranges < 0 || (groups[g].n_ranges > 0 && !groups[g].ranges))
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "parameter group %d: %d ranges", g,
                      groups[g].n_ranges);
    if (!(groups[g].weight_decay >= 0.0) || !(groups[g].lr_mult >= 0.0f))
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                      "parameter group %d: weight_decay %g and lr_mult %g must be >= 0", g,
                      (double)groups[g].weight_decay, (double)groups[g].lr_mult);
    for (int j = 0; j < groups[g].n_ranges; j++)
      if (groups[g].ranges[j].unit < 0 || groups[g].ranges[j].unit >= n_units)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "parameter group %d range %d: unit %d of %d",
                        g, j, groups[g].ranges[j].unit, n_units);
  }
  b->n_units = n_units;
  b->n_groups = n_groups ? n_groups : 1;
  b->groups.n = b->n_groups;
  if (n_groups == 0) {
    b->groups.lr_mult[0] = 1.0;
    b->groups.weight_decay[0] = default_weight_decay;
  }
  for (int g = 0; g < n_groups; g++) {
    b->groups.lr_mult[g] = groups[g].lr_mult;
    b->groups.weight_decay[g] = groups[g].weight_decay;
  }
  b->units = calloc((size_t)n_units, sizeof *b->units);
  b->master = calloc((size_t)n_units, sizeof *b->master);
  b->master_owned = calloc((size_t)n_units, sizeof *b->master_owned);
  b->chunks = calloc((size_t)n_units, sizeof *b->chunks);
  b->n_chunks = calloc((size_t)n_units, sizeof *b->n_chunks);
  b->grad_views = calloc((size_t)n_units, sizeof *b->grad_views);
  b->grad_list = calloc((size_t)n_units, sizeof *b->grad_list);
  if (!b->units || !b->master || !b->master_owned || !b->chunks || !b->n_chunks ||
      !b->grad_views || !b->grad_list) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the optimizer");
    goto fail;
  }
  for (int u = 0; u < n_units; u++) {
    b->units[u] = units[u];
    b->units[u].master_init = NULL;
    int64_t gn = nt_tensor_numel(&units[u].grads);
    b->grad_views[u] = nt_tensor_view(units[u].grads.data, units[u].grads.dtype, b->device, 1, &gn);
    b->grad_list[u] = &b->grad_views[u];
    if ((st = init_master(ctx, b, u, units[u].master_init))) goto fail;
    if ((st = unit_chunks(ctx, b, u, groups, n_groups))) goto fail;
  }
  if ((st = nt_alloc(ctx, sizeof *b->rec, (void **)&b->rec))) goto fail;
  if ((st = nt_alloc(ctx, sizeof(float), (void **)&b->sumsq))) goto fail;
  nt_optim_record r;
  memset(&r, 0, sizeof r);
  r.clip_coef = 1.0f;
  if ((st = nt_optim_base_write(ctx, b, &r))) goto fail;
  return NT_OK;
fail:
  nt_optim_base_free(ctx, b);
  return st;
}

void nt_optim_base_free(nt_ctx *ctx, nt_optim_base *b) {
  if (!b) return;
  for (int u = 0; u < b->n_units; u++) {
    if (b->master_owned && b->master_owned[u]) nt_free(ctx, b->master[u]);
    if (b->chunks) nt_free(ctx, b->chunks[u]);
  }
  free(b->units);
  free(b->master);
  free(b->master_owned);
  free(b->chunks);
  free(b->n_chunks);
  free(b->grad_views);
  free(b->grad_list);
  nt_free(ctx, b->rec);
  nt_free(ctx, b->sumsq);
  memset(b, 0, sizeof *b);
}

nt_status nt_optim_base_alloc_state(nt_ctx *ctx, nt_optim_base *b, float ***out) {
  float **bufs = calloc((size_t)b->n_units, sizeof *bufs);
  nt_status st = NT_OK;
  *out = NULL;
  if (!bufs) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for optimizer state");
  for (int u = 0; u < b->n_units; u++) {
    int64_t numel = nt_tensor_numel(&b->units[u].params);
    int64_t n = numel ? numel : 1;
    if ((st = nt_alloc(ctx, sizeof(float) * (size_t)n, (void **)&bufs[u]))) goto fail;
    nt_tensor t = nt_tensor_view(bufs[u], NT_F32, b->device, 1, &n);
    if ((st = nt_tensor_zero(ctx, &t))) goto fail;
  }
  *out = bufs;
  return NT_OK;
fail:
  nt_optim_base_free_state(ctx, b, bufs);
  return st;
}

void nt_optim_base_free_state(nt_ctx *ctx, nt_optim_base *b, float **bufs) {
  if (!bufs) return;
  for (int u = 0; u < b->n_units; u++) nt_free(ctx, bufs[u]);
  free(bufs);
}

nt_status nt_optim_base_read(nt_ctx *ctx, nt_optim_base *b, nt_optim_record *out) {
  return nt_optim_copy(ctx, out, true, b->rec, b->device.type == NT_DEV_CPU, sizeof *out);
}

nt_status nt_optim_base_write(nt_ctx *ctx, nt_optim_base *b, const nt_optim_record *in) {
  return nt_optim_copy(ctx, b->rec, b->device.type == NT_DEV_CPU, in, true, sizeof *in);
}

static nt_status check_scalar(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  nt_status st;
  if ((st = nt_check_dtype(ctx, t, NT_F32, what)) || (st = nt_check_device(ctx, t, what))) return st;
  if (nt_tensor_numel(t) != 1)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s must be a scalar (1 element), has %lld", what,
                    (long long)nt_tensor_numel(t));
  return NT_OK;
}

nt_status nt_optim_base_prepare(nt_ctx *ctx, nt_optim_base *b, const nt_optim_step_args *a,
                                double beta1, double beta2, double default_lr) {
  nt_status st;
  const float *sumsq = NULL, *lr_dev = NULL, *grad_scale = NULL;
  float *found = NULL;
  if (!a) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer step arguments are NULL");
  double lr = a->lr >= 0.0 ? a->lr : default_lr;
  if (!isfinite(lr)) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer step: lr %g is not finite", lr);
  if (a->lr_tensor) {
    if ((st = check_scalar(ctx, a->lr_tensor, "lr_tensor"))) return st;
    lr_dev = (const float *)a->lr_tensor->data;
  }
  if (!(a->max_norm >= 0.0f))   /* NaN too; inf is a norm without clipping, as torch's */
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer step: max_norm %g must be >= 0",
                    (double)a->max_norm);
  if (a->found_inf) {
    if ((st = check_scalar(ctx, a->found_inf, "found_inf"))) return st;
    found = (float *)a->found_inf->data;
  }
  if (a->grad_scale) {
    if ((st = check_scalar(ctx, a->grad_scale, "grad_scale"))) return st;
    if (!(a->max_norm > 0.0f))
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "optimizer step: grad_scale needs max_norm > 0 "
                      "(the overflow check and the norm come from the sum of squares)");
    grad_scale = (const float *)a->grad_scale->data;
  }
  if (a->max_norm > 0.0f) {
    if (a->grad_sumsq) {
      if ((st = check_scalar(ctx, a->grad_sumsq, "grad_sumsq"))) return st;
      sumsq = (const float *)a->grad_sumsq->data;
    } else {
      /* Sum of squares over this optimizer's gradients, in one launch. */
      nt_tensor out = nt_tensor_view(b->sumsq, NT_F32, b->device, 0, NULL);
      if ((st = nt_sum_squares(ctx, b->grad_list, b->n_units, &out))) return st;
      sumsq = b->sumsq;
    }
  }
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx))
    return nt_optim_prepare_cuda(ctx, b->rec, found, grad_scale, sumsq, a->max_norm, beta1, beta2,
                                 lr, lr_dev, &b->groups);
#endif
  if (b->device.type != NT_DEV_CPU)
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "optimizer on a CUDA device without the backend");
  nt_optim_prepare_rule(b->rec, found, grad_scale, sumsq, a->max_norm, beta1, beta2, lr, lr_dev,
                        &b->groups);
  return NT_OK;
}

/* State files: magic, kind, n_units, n_bufs, numel per unit, step, then per unit and buffer
 * its fp32 values. Buffers move through a bounded host staging area. */
#define NT_OPTIM_MAGIC "NTOPTIM1"
#define NT_OPTIM_STAGE ((int64_t)1 << 22)

typedef struct {
  char magic[8];
  char kind[8];
  int32_t n_units, n_bufs;
  int32_t step, pad;
} file_header;

static nt_status move_buffer(nt_ctx *ctx, FILE *f, float *dev, int64_t n, float *stage, bool save,
                             const char *path) {
  bool host = nt_ctx_device(ctx).type == NT_DEV_CPU;
  for (int64_t i = 0; i < n; i += NT_OPTIM_STAGE) {
    int64_t k = n - i < NT_OPTIM_STAGE ? n - i : NT_OPTIM_STAGE;
    size_t bytes = sizeof(float) * (size_t)k;
    nt_status st;
    if (save) {
      if ((st = nt_optim_copy(ctx, stage, true, dev + i, host, bytes))) return st;
      if (fwrite(stage, 1, bytes, f) != bytes)
        return NT_ERROR(ctx, NT_ERR_IO, "cannot write optimizer state to %s", path);
    } else {
      if (fread(stage, 1, bytes, f) != bytes)
        return NT_ERROR(ctx, NT_ERR_FORMAT, "optimizer state %s is truncated", path);
      if ((st = nt_optim_copy(ctx, dev + i, host, stage, true, bytes))) return st;
    }
  }
  return NT_OK;
}

static nt_status transfer(nt_ctx *ctx, nt_optim_base *b, const char *path, const char *kind,
                          float **const *bufs, int n_bufs, bool save) {
  FILE *f = fopen(path, save ? "wb" : "rb");
  float *stage = NULL;
  nt_status st = NT_OK;
  nt_optim_record rec;
  file_header h;
  if (!f)
    return NT_ERROR(ctx, NT_ERR_IO, "cannot open optimizer state %s for %s", path,
                    save ? "writing" : "reading");
  if ((st = nt_optim_base_read(ctx, b, &rec))) goto done;
  memset(&h, 0, sizeof h);
  if (save) {
    memcpy(h.magic, NT_OPTIM_MAGIC, 8);
    strncpy(h.kind, kind, sizeof h.kind - 1);
    h.n_units = b->n_units;
    h.n_bufs = n_bufs;
    h.step = rec.step;
    if (fwrite(&h, sizeof h, 1, f) != 1) goto io_error;
  } else {
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, NT_OPTIM_MAGIC, 8) != 0) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s is not a nanotrain optimizer state file", path);
      goto done;
    }
    h.kind[7] = 0;
    if (strcmp(h.kind, kind) != 0 || h.n_units != b->n_units || h.n_bufs != n_bufs || h.step < 0) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT,
                    "%s holds %s state for %d units (%d buffers), this optimizer is %s with %d "
                    "units (%d buffers)", path, h.kind, h.n_units, h.n_bufs, kind, b->n_units,
                    n_bufs);
      goto done;
    }
  }
  for (int u = 0; u < b->n_units; u++) {
    int64_t numel = nt_tensor_numel(&b->units[u].params), stored = numel;
    if (save) {
      if (fwrite(&stored, sizeof stored, 1, f) != 1) goto io_error;
    } else if (fread(&stored, sizeof stored, 1, f) != 1 || stored != numel) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: unit %d has %lld elements, expected %lld", path, u,
                    (long long)stored, (long long)numel);
      goto done;
    }
  }
  stage = malloc(sizeof(float) * (size_t)NT_OPTIM_STAGE);
  if (!stage) { st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory staging optimizer state"); goto done; }
  for (int u = 0; u < b->n_units; u++) {
    int64_t numel = nt_tensor_numel(&b->units[u].params);
    for (int k = 0; k < n_bufs; k++)
      if ((st = move_buffer(ctx, f, bufs[k][u], numel, stage, save, path))) goto done;
  }
  if (!save) {
    rec.step = h.step;
    rec.skip = 0;
    st = nt_optim_base_write(ctx, b, &rec);
  }
  goto done;
io_error:
  st = NT_ERROR(ctx, NT_ERR_IO, "cannot write optimizer state to %s", path);
done:
  free(stage);
  if (fclose(f) != 0 && save && !st)
    st = NT_ERROR(ctx, NT_ERR_IO, "cannot write optimizer state to %s", path);
  return st;
}

nt_status nt_optim_save(nt_ctx *ctx, nt_optim_base *b, const char *path, const char *kind,
                        float **const *bufs, int n_bufs) {
  return transfer(ctx, b, path, kind, bufs, n_bufs, true);
}

nt_status nt_optim_load(nt_ctx *ctx, nt_optim_base *b, const char *path, const char *kind,
                        float **const *bufs, int n_bufs) {
  return transfer(ctx, b, path, kind, bufs, n_bufs, false);
}
