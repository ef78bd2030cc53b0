/* Sharded checkpoints (docs/sharding.md "Checkpoints"; PyTorch FSDP's SHARDED_STATE_DICT).
 *
 * Inside one ckpt-<step>/ directory every rank r of N writes shard-<r>-of-<N>.safetensors: for
 * each unit the real elements [lo, hi) of the unit's flat buffer that the rank owns at world N
 * (nt_shard_layout_of: padding is never written), as three F32 tensors "master.<unit>",
 * "exp_avg.<unit>" and "exp_avg_sq.<unit>". The ranges are the same for every strategy (under
 * NO_SHARD each rank writes its 1/N slice of the state it holds whole), so a checkpoint does not
 * depend on how its ranks held the state. Rank 0 creates the temporary directory, every rank
 * writes and fsyncs its file and reports its size and SHA-256, and only when every rank has
 * succeeded rank 0 writes the sidecar and the manifest (files, sizes, hashes, and a "sharded"
 * member: world size, strategy, each unit's name, size, parameters and per-rank ranges) and
 * renames the directory into place (models/checkpoint.h's staged save). So a kill at any moment
 * leaves the previous checkpoint or the complete new one.
 *
 * Resume at any world size and strategy: each rank takes the elements it now owns (its shard,
 * or the whole unit when it keeps units whole) from the old files whose ranges overlap them,
 * after checking those files' SHA-256 and that each tensor read is the F32 vector of its range;
 * a missing file, a wrong size (any rank), a wrong hash or tensor (the ranks reading it) refuses
 * the checkpoint, and the ranks agree on the outcome. */
#include "train/train_internal.h"
#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "models/sha256.h"
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const kinds[3] = {"master", "exp_avg", "exp_avg_sq"};

bool nt_checkpoint_format_parse(const char *s, nt_checkpoint_format *out) {
  static const char *const names[] = {"auto", "consolidated", "sharded", "both"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(s, names[i])) {
      *out = (nt_checkpoint_format)i;
      return true;
    }
  return false;
}

const char *nt_checkpoint_format_name(nt_checkpoint_format f) {
  return f == NT_CKPT_CONSOLIDATED ? "consolidated" : f == NT_CKPT_SHARDED ? "sharded"
         : f == NT_CKPT_BOTH       ? "both"
                                   : "auto";
}

nt_checkpoint_format nt_trainer_checkpoint_format(const nt_trainer *T) {
  if (T->o->checkpoint_format != NT_CKPT_AUTO) return T->o->checkpoint_format;
  bool shards = T->fsdp && T->o->dist.fsdp.strategy != NT_SHARD_NO_SHARD && T->world > 1;
  return shards ? NT_CKPT_SHARDED : NT_CKPT_CONSOLIDATED;
}

/* The real elements [lo, hi) of a unit of numel elements that rank r of `world` owns. */
static void range_of(int64_t numel, int r, int world, int64_t *lo, int64_t *hi) {
  nt_shard_layout l = nt_shard_layout_of(numel, r, world);
  *lo = l.lo < numel ? l.lo : numel;
  *hi = l.real_hi > *lo ? l.real_hi : *lo;
}

static void shard_file(char *buf, size_t len, int r, int world) {
  snprintf(buf, len, "shard-%05d-of-%05d.safetensors", r, world);
}

/* ---- saving ---- */

/* This rank's file: the owned real elements of every unit's master and moments. */
static nt_status write_shard(nt_trainer *T, const char *dir, nt_checkpoint_file *out) {
  const nt_params *p = T->model->params;
  nt_named_tensor *ts = calloc((size_t)(3 * p->n_units + 1), sizeof *ts);
  char (*names)[NT_PARAM_NAME_MAX + 16] = calloc((size_t)(3 * p->n_units + 1), sizeof *names);
  nt_status st = ts && names ? NT_OK : NT_ERROR(T->ctx, NT_ERR_OOM, "out of host memory");
  int n = 0;
  for (int u = 0; u < p->n_units && !st; u++) {
    int64_t lo, hi;
    range_of(p->units[u].numel, T->rank, T->world, &lo, &hi);
    if (hi == lo) continue;
    nt_tensor v[3];
    st = nt_adamw_state_views(T->opt.adamw, u, &v[0], &v[1], &v[2]);
    for (int k = 0; k < 3 && !st; k++, n++) {
      snprintf(names[n], sizeof names[n], "%s.%s", kinds[k], p->units[u].name);
      ts[n].name = names[n];
      ts[n].t = nt_flat_view(&v[k], nt_trainer_shard_views(T) ? 0 : lo, hi - lo);
    }
  }
  char path[PATH_MAX], rank[16], world[16];
  snprintf(rank, sizeof rank, "%d", T->rank);
  snprintf(world, sizeof world, "%d", T->world);
  const char *meta[] = {"format", "pt", "producer", "nanotrain", "rank", rank, "world_size",
                        world, NULL};
  shard_file(out->name, sizeof out->name, T->rank, T->world);
  if (!st && (size_t)snprintf(path, sizeof path, "%s/%s", dir, out->name) >= sizeof path)
    st = NT_ERROR(T->ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  if (!st) st = nt_safetensors_save(T->ctx, path, ts, n, meta);
  if (!st) st = nt_sha256_file(T->ctx, path, out->sha256, &out->size);
  free(ts);
  free(names);
  return st;
}

/* The manifest's "sharded" member: enough to read the shards back without nanotrain (the
 * parameters' places in their unit, every rank's range). */
static char *layout_json(nt_trainer *T) {
  const nt_params *p = T->model->params;
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "world_size");
  nt_jw_i64(&w, T->world);
  nt_jw_key(&w, "strategy");
  nt_jw_str(&w, nt_sharding_name(T->o->dist.fsdp.strategy));
  nt_jw_key(&w, "tensors");
  nt_jw_begin(&w, '[');
  for (int k = 0; k < 3; k++) nt_jw_str(&w, kinds[k]);
  nt_jw_end(&w, ']');
  nt_jw_key(&w, "files");
  nt_jw_begin(&w, '[');
  for (int r = 0; r < T->world; r++) {
    char name[64];
    shard_file(name, sizeof name, r, T->world);
    nt_jw_str(&w, name);
  }
  nt_jw_end(&w, ']');
  nt_jw_key(&w, "units");
  nt_jw_begin(&w, '[');
  for (int u = 0; u < p->n_units; u++) {
    const nt_unit *un = &p->units[u];
    nt_jw_begin(&w, '{');
    nt_jw_key(&w, "name");
    nt_jw_str(&w, un->name);
    nt_jw_key(&w, "numel");
    nt_jw_i64(&w, un->numel);
    nt_jw_key(&w, "ranges");
    nt_jw_begin(&w, '[');
    for (int r = 0; r < T->world; r++) {
      int64_t lo, hi;
      range_of(un->numel, r, T->world, &lo, &hi);
      nt_jw_begin(&w, '[');
      nt_jw_i64(&w, lo);
      nt_jw_i64(&w, hi);
      nt_jw_end(&w, ']');
    }
    nt_jw_end(&w, ']');
    nt_jw_key(&w, "params");
    nt_jw_begin(&w, '[');
    for (int i = 0; i < un->n_params; i++) {
      const nt_param_desc *d = &un->params[i];
      nt_jw_begin(&w, '{');
      nt_jw_key(&w, "name");
      nt_jw_str(&w, d->name);
      nt_jw_key(&w, "offset");
      nt_jw_i64(&w, d->offset);
      nt_jw_key(&w, "shape");
      nt_jw_begin(&w, '[');
      for (int k = 0; k < d->ndim; k++) nt_jw_i64(&w, d->shape[k]);
      nt_jw_end(&w, ']');
      nt_jw_end(&w, '}');
    }
    nt_jw_end(&w, ']');
    nt_jw_end(&w, '}');
  }
  nt_jw_end(&w, ']');
  nt_jw_end(&w, '}');
  return nt_jw_finish(&w);
}

/* What one rank tells the others at a stage of the save. */
typedef struct {
  int32_t st;
  nt_checkpoint_file file;
  char tmp[PATH_MAX];
} shard_report;
_Static_assert(sizeof(shard_report) <= NT_TRAINER_REPORT_MAX, "a report fits T->gathered");

nt_status nt_trainer_save_sharded(nt_trainer *T, nt_status pre, const char *sidecar,
                                  nt_trainer_whole *whole, char *saved, bool *warned) {
  nt_ctx *ctx = T->ctx;
  const nt_train_options *o = T->o;
  bool many = T->comm && T->world > 1;
  shard_report mine, *all = T->gathered;
  memset(&mine, 0, sizeof mine);
  /* 1. rank 0 creates the temporary directory; everyone learns its name */
  nt_status st = pre;
  if (!st && T->rank == 0) st = nt_checkpoint_stage_begin(ctx, o->out_dir, mine.tmp);
  mine.st = (int32_t)st;
  bool created = T->rank == 0 && !st;
  nt_status g = many ? nt_comm_gather_bytes(T->comm, ctx, &mine, sizeof mine, all) : NT_OK;
  if (!many) all[0] = mine;
  if (!g && !st && all[0].st)
    st = NT_ERROR(ctx, (nt_status)all[0].st, "rank 0 could not start the checkpoint");
  char tmp[PATH_MAX];   /* rank 0's own (all[0] is unset when the gather failed) */
  snprintf(tmp, sizeof tmp, "%s", T->rank == 0 ? mine.tmp : all[0].tmp);
  /* 2. every rank writes its file (rank 0 also the consolidated one for BOTH) */
  if (!g && !st && access(tmp, F_OK))
    st = NT_ERROR(ctx, NT_ERR_IO, "rank %d does not see %s, which rank 0 created: a sharded "
                  "checkpoint needs a file system every rank shares (else use "
                  "--checkpoint-format consolidated)", T->rank, tmp);
  if (!g && !st) st = write_shard(T, tmp, &mine.file);
  if (!g && !st && whole && T->rank == 0) {
    if (whole->adamw)   /* the gathered whole state, in host memory */
      st = nt_trainer_host_error(T, nt_checkpoint_write_tensors(T->host, tmp, &whole->params,
                                                                 whole->adamw));
    else   /* rank 0 holds the whole state already */
      st = nt_checkpoint_write_tensors(ctx, tmp, T->model->params, T->opt.adamw);
  }
  mine.st = (int32_t)st;
  if (!g && many) g = nt_comm_gather_bytes(T->comm, ctx, &mine, sizeof mine, all);
  if (!many) all[0] = mine;
  int bad = -1;
  for (int r = 0; !g && r < T->world && bad < 0; r++)
    if (all[r].st) bad = r;
  if (g || bad >= 0) {   /* no commit; every rank fails alike, without another collective */
    if (created) nt_checkpoint_stage_abort(tmp);
    nt_status code = g ? g : (nt_status)all[bad].st;
    if (g || st) return g ? g : st;
    return NT_ERROR(ctx, code, "checkpoint not saved: rank %d could not write its part", bad);
  }
  /* 3. every rank succeeded: rank 0 writes the manifest last and renames the directory */
  if (T->rank == 0) {
    nt_checkpoint_file *files = calloc((size_t)T->world, sizeof *files);
    char *layout = layout_json(T);
    for (int r = 0; files && r < T->world; r++) files[r] = all[r].file;
    if (files && layout)
      st = nt_checkpoint_stage_commit(ctx, o->out_dir, tmp, sidecar, files, T->world, layout,
                                      o->keep_checkpoints, saved, warned);
    else
      nt_checkpoint_stage_abort(tmp);
    if (!files || !layout) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the manifest");
    free(files);
    free(layout);
  }
  return nt_trainer_agree(T, st, "committing the checkpoint");
}

/* ---- loading ---- */

bool nt_trainer_manifest_sharded(const nt_json *manifest) {
  return nt_json_get(manifest, "sharded") != NULL;
}

/* The old layout, checked against the model: every unit by name and size, ranges that tile
 * [0, numel) in rank order, one file per rank. */
static nt_status check_layout(nt_trainer *T, const char *dir, const nt_json *lay, int *world) {
  nt_ctx *ctx = T->ctx;
  const nt_params *p = T->model->params;
  const nt_json *files = nt_json_get(lay, "files"), *units = nt_json_get(lay, "units");
  int64_t w = nt_json_get_i64(lay, "world_size", 0);
  if (w < 1 || !files || files->type != NT_JSON_ARR || files->n != w || !units ||
      units->type != NT_JSON_ARR)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s: malformed shard layout in its manifest",
                    dir);
  if (units->n != p->n_units)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s has %d units, the model %d", dir,
                    units->n, p->n_units);
  for (int u = 0; u < p->n_units; u++) {
    const nt_json *uj = &units->items[u], *ranges = nt_json_get(uj, "ranges");
    const nt_unit *un = &p->units[u];
    if (strcmp(nt_json_str(nt_json_get(uj, "name"), ""), un->name) ||
        nt_json_get_i64(uj, "numel", -1) != un->numel)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s: unit %d is '%s' of %lld elements, the "
                      "model's '%s' of %lld", dir, u, nt_json_str(nt_json_get(uj, "name"), "?"),
                      (long long)nt_json_get_i64(uj, "numel", -1), un->name,
                      (long long)un->numel);
    int64_t at = 0;
    for (int r = 0; ranges && ranges->type == NT_JSON_ARR && r < ranges->n; r++) {
      const nt_json *rg = &ranges->items[r];
      int64_t lo = rg->type == NT_JSON_ARR && rg->n == 2 ? nt_json_i64(&rg->items[0], -1) : -1;
      int64_t hi = lo >= 0 ? nt_json_i64(&rg->items[1], -1) : -1;
      if (lo != at || hi < lo || hi > un->numel) at = -1;
      if (at < 0) break;
      at = hi;
    }
    if (!ranges || ranges->type != NT_JSON_ARR || ranges->n != w || at != un->numel)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s: the shard ranges of unit '%s' do not "
                      "cover it once in rank order", dir, un->name);
  }
  *world = (int)w;
  return NT_OK;
}

/* Old rank r's file, opened once (after its SHA-256 is checked). */
static nt_status open_shard(nt_trainer *T, const char *dir, const nt_json *m, int r,
                            nt_safetensors **f) {
  if (*f) return NT_OK;
  const nt_json *files = nt_json_get(nt_json_get(m, "sharded"), "files");
  const char *name = nt_json_str(&files->items[r], "");
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return NT_ERROR(T->ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  nt_status st = nt_checkpoint_verify_file(T->ctx, dir, m, name);
  if (!st) st = nt_safetensors_open(T->ctx, path, f);
  return st;
}

/* Tensor `name` of old rank r's file must be the F32 vector of its range's n elements (loading
 * alone would take a longer one, or convert another float dtype). */
static nt_status check_tensor(nt_trainer *T, const char *dir, const nt_json *m, int r,
                              const nt_safetensors *f, const char *name, int64_t n) {
  const nt_safetensors_info *t = nt_safetensors_find(f, name);
  if (t && t->dtype == NT_F32 && t->ndim == 1 && t->numel == n) return NT_OK;
  const nt_json *files = nt_json_get(nt_json_get(m, "sharded"), "files");
  const char *file = nt_json_str(&files->items[r], "");
  if (!t)
    return NT_ERROR(T->ctx, NT_ERR_FORMAT, "checkpoint %s: %s has no tensor %s", dir, file, name);
  return NT_ERROR(T->ctx, NT_ERR_FORMAT, "checkpoint %s: %s in %s is %s with %lld element(s) in "
                  "%d dimension(s); its range in the manifest needs F32 [%lld]", dir, name, file,
                  t->dtype_name, (long long)t->numel, t->ndim, (long long)n);
}

/* The elements this rank needs of every unit, from the old files that hold them. */
static nt_status read_owned(nt_trainer *T, const char *dir, const nt_json *m, int old) {
  const nt_params *p = T->model->params;
  const nt_json *units = nt_json_get(nt_json_get(m, "sharded"), "units");
  nt_safetensors **open = calloc((size_t)old, sizeof *open);
  nt_status st = open ? NT_OK : NT_ERROR(T->ctx, NT_ERR_OOM, "out of host memory");
  for (int u = 0; u < p->n_units && !st; u++) {
    const nt_unit *un = &p->units[u];
    const nt_json *ranges = nt_json_get(&units->items[u], "ranges");
    nt_tensor v[3];
    int64_t a = 0, b = un->numel;   /* whole views: the whole unit */
    if (nt_trainer_shard_views(T)) range_of(un->numel, T->rank, T->world, &a, &b);
    st = nt_adamw_state_views(T->opt.adamw, u, &v[0], &v[1], &v[2]);
    for (int k = 0; k < 3 && !st; k++) st = nt_tensor_zero(T->ctx, &v[k]);   /* padding */
    for (int r = 0; r < old && !st; r++) {
      int64_t lo = nt_json_i64(&ranges->items[r].items[0], 0);
      int64_t hi = nt_json_i64(&ranges->items[r].items[1], 0);
      int64_t x = a > lo ? a : lo, y = b < hi ? b : hi;
      if (y <= x) continue;
      st = open_shard(T, dir, m, r, &open[r]);
      for (int k = 0; k < 3 && !st; k++) {
        char name[NT_PARAM_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s.%s", kinds[k], un->name);
        nt_tensor dst = nt_flat_view(&v[k], x - a, y - x);
        nt_safetensors_load_opts lo_opts = {false, x - lo, y - x, false};
        st = check_tensor(T, dir, m, r, open[r], name, hi - lo);
        if (!st) st = nt_safetensors_load(T->ctx, open[r], name, &dst, &lo_opts);
      }
    }
  }
  for (int r = 0; open && r < old; r++) nt_safetensors_close(open[r]);
  free(open);
  return st;
}

nt_status nt_trainer_load_sharded(nt_trainer *T, const char *dir, const nt_json *manifest) {
  int old = 0;
  nt_status st = check_layout(T, dir, nt_json_get(manifest, "sharded"), &old);
  if (!st) st = read_owned(T, dir, manifest, old);
  if (!st) st = nt_ctx_synchronize(T->ctx);
  st = nt_trainer_agree(T, st, "reading the sharded checkpoint");
  if (st) return st;
  /* the compute copies from the loaded masters (SHARD_GRAD_OP gathers: collective) */
  if (!nt_trainer_shard_views(T)) return nt_params_sync_compute(T->ctx, T->model->params);
  for (int u = 0; u < T->model->params->n_units && !st; u++) {
    nt_tensor master;
    st = nt_adamw_state_views(T->opt.adamw, u, &master, NULL, NULL);
    if (!st) st = nt_fsdp_load_owned(T->ctx, T->fsdp, u, &master);
  }
  return st;
}
