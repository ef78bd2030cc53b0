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

nt_status nt_fsdp_optimizer(nt_ctx *ctx, nt_fsdp *f, const nt_optimizer_options *o,
                            nt_optimizer *out) {
  memset(out, 0, sizeof *out);
  nt_params *p = nt_fsdp_params(f);
  int nu = p->n_units;
  nt_param_unit *units = calloc((size_t)nu, sizeof *units);
  nt_param_range *ranges = calloc((size_t)(4 * nu), sizeof *ranges);
  if (!units || !ranges) {
    free(units);
    free(ranges);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the optimizer's units");
  }
  nt_param_range *dec = ranges, *nodec = ranges + nu, *mdec = ranges + 2 * nu,
                 *mnodec = ranges + 3 * nu;
  int nd = 0, nn = 0;
  for (int u = 0; u < nu; u++) {
    nt_unit *un = &p->units[u];
    if (un->n_decay) dec[nd++] = (nt_param_range){u, 0, un->n_decay};
    if (un->numel > un->n_decay)
      nodec[nn++] = (nt_param_range){u, un->n_decay, un->numel - un->n_decay};
  }
  nd = nt_fsdp_map_ranges(f, dec, nd, mdec);
  nn = nt_fsdp_map_ranges(f, nodec, nn, mnodec);
  nt_param_group groups[2] = {{1.0f, o->adamw.weight_decay, nd ? mdec : NULL, nd},
                              {1.0f, 0.0, nn ? mnodec : NULL, nn}};
  nt_status st = nt_fsdp_param_units(f, units);
  if (!st) st = nt_adamw_create(ctx, &o->adamw, units, nu, groups, 2, &out->adamw);
  if (!st) nt_fsdp_drop_master_init(ctx, f);
  /* NO_SHARD: the units point at the optimizer's master weights (as nt_optimizer_for_params);
   * the sharded strategies' masters exist only as the optimizer's shards. */
  bool whole = nt_fsdp_strategy(f) == NT_SHARD_NO_SHARD;
  for (int u = 0; u < nu && !st && whole; u++) {
    nt_tensor master;
    st = nt_adamw_state_views(out->adamw, u, &master, NULL, NULL);
    if (!st) st = nt_params_adopt_master(ctx, p, u, &master);
  }
  free(units);
  free(ranges);
  if (!st) st = nt_scaler_create(ctx, &o->scaler, &out->scaler);
  if (st) nt_optimizer_free(ctx, out);
  return st;
}
