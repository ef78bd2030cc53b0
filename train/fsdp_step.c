/* The FSDP runtime plugged into the step pipeline (train/fsdp_step.h). */
#include "train/fsdp_step.h"
#include <stdlib.h>
#include <string.h>

static nt_status zero_grad(nt_ctx *ctx, void *arg) { return nt_fsdp_zero_grad(ctx, arg); }

void nt_fsdp_hooks(nt_fsdp *f, nt_unit_hooks *unit, nt_step_hooks *step) {
  unit->arg = f;
  unit->before_forward = nt_fsdp_before_forward;
  unit->before_backward = nt_fsdp_before_backward;
  unit->grads_ready = nt_fsdp_grads_ready;
  step->arg = f;
  step->unit = unit;
  step->global_reduce = nt_fsdp_global_reduce;
  step->params_updated = nt_fsdp_params_updated;
  step->zero_grad = zero_grad;
}

nt_status nt_fsdp_grad_ranges(nt_ctx *ctx, nt_fsdp *f, nt_grad_range *out, int *n) {
  int nu = nt_fsdp_params(f)->n_units;
  nt_tensor *views = calloc((size_t)(nu ? nu : 1), sizeof *views);
  if (!views) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for gradient ranges");
  nt_status st = nt_fsdp_owned_grads(f, views, n);
  for (int i = 0; i < *n && !st; i++) {
    out[i].grad = views[i];
    out[i].lo = 0;
    out[i].hi = nt_tensor_numel(&views[i]);
  }
  free(views);
  return st;
}

static int map_ranges(void *f, const nt_param_range *in, int n, nt_param_range *out) {
  return nt_fsdp_map_ranges(f, in, n, out);
}

nt_status nt_fsdp_optimizer(nt_ctx *ctx, nt_fsdp *f, const nt_optimizer_options *o,
                            nt_optimizer *out) {
  memset(out, 0, sizeof *out);
  nt_params *p = nt_fsdp_params(f);
  nt_param_unit *units = calloc((size_t)p->n_units, sizeof *units);
  if (!units) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the optimizer's units");
  /* NO_SHARD: the views are the whole units, which then point at the optimizer's master
   * weights; the sharded strategies' masters exist only as the optimizer's shards. */
  bool whole = nt_fsdp_strategy(f) == NT_SHARD_NO_SHARD;
  nt_status st = nt_fsdp_param_units(f, units);
  if (!st) st = nt_optimizer_for_units(ctx, p, units, map_ranges, f, whole, o, out);
  if (!st) nt_fsdp_drop_master_init(ctx, f);
  free(units);
  return st;
}
