/* The trainer's side of sharded data parallelism (dist/fsdp.h, docs/sharding.md): the FSDP
 * runtime over the model's units with the step's hooks and AdamW over the owned shards
 * (train/fsdp_step.h), the configuration check, per-rank figures for the logs, whole
 * parameters for evaluation under FULL_SHARD, and the whole fp32 state for consolidated
 * checkpoints. */
#include "train/train_internal.h"
#include "train/fsdp_step.h"
#include "core/stop.h"
#include <stdlib.h>
#include <string.h>

nt_status nt_trainer_dist_buffers(nt_trainer *T) {
  size_t w = (size_t)T->world;
  T->gathered = calloc(w, NT_TRAINER_REPORT_MAX);
  T->rank_loss = calloc(w, sizeof *T->rank_loss);
  T->rank_peak = calloc(w, sizeof *T->rank_peak);
  if (!T->gathered || !T->rank_loss || !T->rank_peak)
    return NT_ERROR(T->ctx, NT_ERR_OOM, "out of host memory for the gathers of %d rank(s)",
                    T->world);
  return NT_OK;
}

nt_status nt_trainer_dist_init(nt_trainer *T, const nt_optimizer_options *oo,
                               nt_step_options *so) {
  const nt_train_options *o = T->o;
  nt_ctx *ctx = T->ctx;
  nt_fsdp_options fo = o->dist.fsdp;
  if (o->dist.param_dtype_given && fo.param_dtype != T->model->compute)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "--param-dtype %s but the precision %s computes in "
                    "%s", nt_dtype_name(fo.param_dtype), nt_precision_name(T->pol.precision),
                    nt_dtype_name(T->model->compute));
  fo.param_dtype = T->model->compute;
  so->grad_divisor = T->world * T->accum;
  /* one process: no communicator (a program passes one at world 1 only when asked to) */
  if (!T->comm && fo.strategy == NT_SHARD_NO_SHARD) return NT_OK;
  nt_status st = NT_OK;
  if (!T->comm) {
    nt_comm_options co = {NT_COMM_LOCAL, NULL, NT_DIST_DEFAULT_TIMEOUT_S, false};
    st = nt_comm_create(ctx, &co, &T->comm);
    T->own_comm = !st;
  }
  if (!st) st = nt_fsdp_create(ctx, T->comm, T->model->params, &fo, &T->fsdp);
  if (!st) st = nt_fsdp_optimizer(ctx, T->fsdp, oo, &T->opt);
  int n = 0;
  T->ranges = calloc((size_t)T->model->params->n_units, sizeof *T->ranges);
  if (!st && !T->ranges)
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the owned gradient ranges");
  if (!st) st = nt_fsdp_grad_ranges(ctx, T->fsdp, T->ranges, &n);
  if (st) return st;
  nt_fsdp_hooks(T->fsdp, &T->unit_hooks, &T->step_hooks);
  so->hooks = &T->step_hooks;
  so->ranges = T->ranges;
  so->n_ranges = n;
  /* The forward + backward under the FSDP runtime is captured as a CUDA graph only when asked
   * (--cuda-graph; by default it runs eagerly) and only when every collective is enqueued on a
   * stream: NCCL (its wait path is capture-aware, dist/comm_nccl.c) or the LOCAL backend of one
   * rank. The MPI backend's collectives run on the host, which a capture cannot hold. */
  if (so->cuda_graph > 0 && nt_ctx_is_cuda(ctx) && nt_comm_backend_of(T->comm) == NT_COMM_MPI)
    return NT_ERROR(T->ctx, NT_ERR_UNSUPPORTED, "--cuda-graph with the MPI backend: its "
                    "collectives run on the host and cannot be captured; drop the flag");
  so->cuda_graph = so->cuda_graph > 0 ? 1 : 0;
  return NT_OK;
}

void nt_trainer_dist_free(nt_trainer *T) {
  nt_trainer_reshard(T);
  nt_ctx_free(T->host);
  T->host = NULL;
  nt_fsdp_free(T->ctx, T->fsdp);
  if (T->own_comm) nt_comm_free(T->ctx, T->comm);
  free(T->ranges);
  free(T->gathered);
  free(T->rank_loss);
  free(T->rank_peak);
  T->fsdp = NULL;
  T->ranges = NULL;
  T->gathered = NULL;
  T->rank_loss = T->rank_peak = NULL;
}

nt_status nt_trainer_agree(nt_trainer *T, nt_status st, const char *what) {
  if (!T->comm || T->world < 2) return st;
  int32_t mine = (int32_t)st, *all = T->gathered;
  nt_status g = nt_comm_gather_bytes(T->comm, T->ctx, &mine, sizeof mine, all);
  int bad = -1;
  for (int r = 0; !g && r < T->world && bad < 0; r++)
    if (all[r]) bad = r;
  if (g || st) return g ? g : st;   /* a successful gather leaves this rank's message */
  if (bad >= 0)
    return NT_ERROR(T->ctx, (nt_status)all[bad], "%s failed on rank %d (its message above)", what,
                    bad);
  return NT_OK;
}

nt_status nt_trainer_check_config(nt_trainer *T) {
  if (!T->comm || T->world < 2) return NT_OK;
  const nt_train_options *o = T->o;
  const nt_fsdp_options *f = &o->dist.fsdp;
  char cfg[1024];
  /* what every rank must agree on (not the device, which is per rank) */
  int len = snprintf(cfg, sizeof cfg,
      "model %d prec %d batch %lld iters %lld epochs %d lr %.17g/%.17g wd %.17g betas %.17g/%.17g "
      "eps %.17g clip %.17g warmup %lld decay %lld/%d seed %llu gpt %d/%d/%d/%d/%d/%.9g "
      "data %s cnn %d/%d/%d/%.9g subset %lld/%lld augment %d shard %d/%d/%d/%d/%d/%d accum %d "
      "resume %s scale %.9g/%.9g/%.9g/%d",
      (int)o->model, (int)o->precision, (long long)o->batch_size, (long long)o->max_iters,
      o->epochs, o->lr, o->min_lr, o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_clip,
      (long long)o->warmup_iters, (long long)o->lr_decay_iters, (int)o->decay_lr,
      (unsigned long long)o->seed, o->gpt.n_layer, o->gpt.n_head, o->gpt.n_embd,
      o->gpt.block_size, o->gpt.vocab_size, (double)o->gpt.dropout,
      o->gpt_data ? o->gpt_data : "", o->cnn.c1, o->cnn.c2, o->cnn.hidden,
      (double)o->cnn.dropout, (long long)o->train_subset, (long long)o->test_subset,
      (int)o->augment, (int)f->strategy, (int)f->reduce_dtype, (int)f->reshard_after_forward,
      (int)f->limit_all_gathers, (int)f->backward_prefetch, (int)f->forward_prefetch, T->accum,
      o->resume ? o->resume : "", (double)o->init_scale, (double)o->growth_factor,
      (double)o->backoff_factor, o->growth_interval);
  return nt_comm_check_config(T->comm, T->ctx, cfg, (size_t)len);
}

/* Every gather also carries each rank's pending stop signal: the first time any rank has one,
 * every rank adopts the lowest rank's (nt_stop_request), so all of them stop after the same
 * step and exit with the same status. */
nt_status nt_trainer_gather(nt_trainer *T, double x, double *all) {
  if (!T->comm || T->world < 2) {
    if (all) all[0] = x;
    return NT_OK;
  }
  T->last_gather_iter = T->iter;
  double mine[2] = {x, (double)nt_stop_requested()}, *both = T->gathered;
  nt_status st = nt_comm_gather_bytes(T->comm, T->ctx, mine, sizeof mine, both);
  int sig = 0;
  for (int r = 0; !st && r < T->world; r++) {
    if (all) all[r] = both[2 * r];
    if (!sig) sig = (int)both[2 * r + 1];
  }
  if (!st && sig && !T->stop_sig) {
    T->stop_sig = sig;
    nt_stop_request(sig);
  }
  return st;
}

bool nt_trainer_stop_requested(nt_trainer *T) {
  int mine = nt_stop_requested();   /* also arms the handler: a first signal only requests */
  return T->comm && T->world > 1 ? T->stop_sig != 0 : mine != 0;
}

nt_status nt_trainer_agree_stop(nt_trainer *T) {
  if (!T->comm || T->world < 2 || T->stop_sig) return NT_OK;
  return nt_trainer_gather(T, 0, NULL);
}

/* ---- whole parameters for an evaluation (FULL_SHARD keeps only shards between steps) ---- */

nt_status nt_trainer_unshard(nt_trainer *T) {
  if (!T->fsdp || T->o->dist.fsdp.strategy != NT_SHARD_FULL || T->unsharded) return NT_OK;
  nt_ctx *ctx = T->ctx;
  nt_params *p = T->model->params;
  int nu = p->n_units;
  nt_param_unit *units = calloc((size_t)nu, sizeof *units);
  T->unsharded = calloc((size_t)nu, sizeof *T->unsharded);
  if (!units || !T->unsharded) {
    free(units);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory gathering the parameters");
  }
  nt_status st = nt_fsdp_param_units(T->fsdp, units);
  for (int u = 0; u < nu && !st; u++) {
    const nt_shard_layout *lay = nt_fsdp_layout(T->fsdp, u);
    st = nt_tensor_alloc(ctx, &T->unsharded[u], p->compute_dtype, 1, &lay->padded);
    if (!st) st = nt_comm_all_gather(T->comm, ctx, &units[u].params, &T->unsharded[u]);
    if (st) break;
    nt_unit *un = &p->units[u];
    un->compute = nt_tensor_view(T->unsharded[u].data, p->compute_dtype, un->compute.device, 1,
                                 &un->numel);
    if (p->compute_dtype == NT_F32) un->master = un->compute;
  }
  free(units);
  if (!st) st = nt_comm_wait_seq(T->comm, ctx, nt_comm_seq(T->comm));
  return st;
}

void nt_trainer_reshard(nt_trainer *T) {
  if (!T->unsharded) return;
  nt_params *p = T->model->params;
  (void)nt_ctx_synchronize(T->ctx);
  for (int u = 0; u < p->n_units; u++) {
    nt_tensor_free(T->ctx, &T->unsharded[u]);
    p->units[u].compute.data = NULL;
    if (p->compute_dtype == NT_F32) p->units[u].master.data = NULL;
  }
  free(T->unsharded);
  T->unsharded = NULL;
}

/* ---- the whole fp32 state (consolidated checkpoints) ---- */

void nt_trainer_whole_free(nt_trainer *T, nt_trainer_whole *w) {
  nt_adamw_free(T->host, w->adamw);
  for (int u = 0; w->whole && u < w->params.n_units; u++) nt_tensor_free(T->host, &w->whole[u]);
  free(w->whole);
  free(w->params.units);   /* the parameter descriptions are the model's */
  memset(w, 0, sizeof *w);
}

/* A parameter set shaped as the model's whose units are whole F32 buffers, and an AdamW over
 * it (its moments); gather: filled from every rank's shards (collective). */
nt_status nt_trainer_host_error(nt_trainer *T, nt_status st) {
  return st ? NT_ERROR(T->ctx, st, "%s", nt_last_error(T->host)) : NT_OK;
}

nt_status nt_trainer_consolidate(nt_trainer *T, nt_trainer_whole *w, bool gather) {
  const nt_params *p = T->model->params;
  int nu = p->n_units;
  memset(w, 0, sizeof *w);
  if (!T->host && nt_ctx_create(&T->host, nt_cpu()))
    return NT_ERROR(T->ctx, NT_ERR_OOM, "cannot create a CPU context for the checkpoint");
  nt_ctx *ctx = T->host;
  w->params = *p;
  w->params.compute_dtype = NT_F32;
  w->params.units = calloc((size_t)nu, sizeof *w->params.units);
  w->whole = calloc((size_t)nu, sizeof *w->whole);
  nt_param_unit *units = calloc((size_t)nu, sizeof *units);
  nt_param_range *all = calloc((size_t)nu, sizeof *all);
  nt_status st = NT_OK;
  if (!w->params.units || !w->whole || !units || !all)
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the consolidated state");
  for (int u = 0; u < nu && !st; u++) {
    nt_unit *un = &w->params.units[u];
    *un = p->units[u];
    st = nt_tensor_alloc(ctx, &w->whole[u], NT_F32, 1, &un->numel);
    if (!st) st = nt_tensor_zero(ctx, &w->whole[u]);
    un->master = un->compute = un->grad =
        nt_tensor_view(w->whole[u].data, NT_F32, nt_cpu(), 1, &un->numel);
    units[u] = (nt_param_unit){un->master, un->master, NULL};
    all[u] = (nt_param_range){u, 0, un->numel};
  }
  nt_param_group g = {1.0f, 0.0, all, nu};
  nt_adamw_options ao = nt_adamw_defaults();
  if (!st) st = nt_adamw_create(ctx, &ao, units, nu, &g, 1, &w->adamw);
  free(units);
  free(all);
  for (int u = 0; u < nu && gather && !st; u++) {
    nt_tensor src[3], dst[3];
    st = nt_adamw_state_views(T->opt.adamw, u, &src[0], &src[1], &src[2]);
    if (!st) st = nt_adamw_state_views(w->adamw, u, &dst[0], &dst[1], &dst[2]);
    for (int k = 0; k < 3 && !st; k++) {
      st = nt_fsdp_gather_unit(T->ctx, T->fsdp, u, &src[k], &dst[k]);
      if (st) {   /* T->ctx holds the error */
        nt_trainer_whole_free(T, w);
        return st;
      }
    }
  }
  if (st) nt_trainer_whole_free(T, w);
  return nt_trainer_host_error(T, st);
}

nt_status nt_trainer_scatter(nt_trainer *T, nt_trainer_whole *w) {
  nt_status st = NT_OK;
  for (int u = 0; u < w->params.n_units && !st; u++) {
    nt_tensor src[3], dst[3];
    st = nt_adamw_state_views(w->adamw, u, &src[0], &src[1], &src[2]);
    if (!st) st = nt_adamw_state_views(T->opt.adamw, u, &dst[0], &dst[1], &dst[2]);
    for (int k = 0; k < 3 && !st; k++) st = nt_fsdp_scatter_unit(T->ctx, T->fsdp, u, &src[k], &dst[k]);
    if (!st) st = nt_fsdp_load_unit(T->ctx, T->fsdp, u, &src[0]);
  }
  if (!st) st = nt_ctx_synchronize(T->ctx);
  return st;
}
