#include "models/checkpoint.h"
#include "models/safetensors.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

void nt_checkpoint_paths(const char *where, char *tensors, char *sidecar, size_t len) {
  size_t n = strlen(where);
  const char *ext = ends_with(where, ".safetensors") ? ".safetensors"
                    : ends_with(where, ".json")      ? ".json"
                                                     : NULL;
  if (ext) {
    int stem = (int)(n - strlen(ext));
    snprintf(tensors, len, "%.*s.safetensors", stem, where);
    snprintf(sidecar, len, "%.*s.json", stem, where);
  } else {
    snprintf(tensors, len, "%s/ckpt.safetensors", where);
    snprintf(sidecar, len, "%s/ckpt.json", where);
  }
}

nt_status nt_make_dirs(nt_ctx *ctx, const char *dir) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", dir);
  for (char *c = buf + 1;; c++) {
    bool last = *c == 0;
    if (*c == '/' || last) {
      *c = 0;
      if (mkdir(buf, 0755) && errno != EEXIST)
        return NT_ERROR(ctx, NT_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
      if (last) break;
      *c = '/';
    }
  }
  return NT_OK;
}

static void moment_name(char *buf, size_t len, const char *unit, const char *which) {
  snprintf(buf, len, "optimizer.%s.%s", unit, which);
}

nt_status nt_checkpoint_save(nt_ctx *ctx, const char *dir, const nt_params *p, nt_adamw *opt,
                             const char *sidecar_json) {
  char tpath[4096], spath[4096];
  nt_status st = nt_make_dirs(ctx, dir);
  if (st) return st;
  nt_checkpoint_paths(dir, tpath, spath, sizeof tpath);
  int cap = 0;
  for (int u = 0; u < p->n_units; u++) cap += p->units[u].n_params + 2;
  nt_named_tensor *ts = calloc((size_t)cap, sizeof *ts);
  char (*names)[NT_PARAM_NAME_MAX + 32] = calloc((size_t)cap, sizeof *names);
  if (!ts || !names) {
    free(ts);
    free(names);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory saving a checkpoint");
  }
  int n = 0;
  for (int u = 0; u < p->n_units && !st; u++) {
    for (int i = 0; i < p->units[u].n_params; i++) {
      ts[n].name = p->units[u].params[i].name;
      ts[n++].t = nt_params_view(p, u, i, NT_VIEW_MASTER);
    }
    if (opt) {
      nt_tensor master, m, v;
      st = nt_adamw_state_views(opt, u, &master, &m, &v);
      if (st) break;
      moment_name(names[n], sizeof names[n], p->units[u].name, "exp_avg");
      ts[n].name = names[n];
      ts[n++].t = m;
      moment_name(names[n], sizeof names[n], p->units[u].name, "exp_avg_sq");
      ts[n].name = names[n];
      ts[n++].t = v;
    }
  }
  static const char *const meta[] = {"format", "pt", "producer", "nanotrain", NULL};
  if (!st) st = nt_safetensors_save(ctx, tpath, ts, n, meta);
  free(ts);
  free(names);
  if (!st && sidecar_json)
    st = nt_write_file_atomic(ctx, spath, sidecar_json, strlen(sidecar_json));
  return st;
}

nt_status nt_checkpoint_read_sidecar(nt_ctx *ctx, const char *where, char **json) {
  char tpath[4096], spath[4096];
  nt_checkpoint_paths(where, tpath, spath, sizeof tpath);
  size_t len;
  return nt_read_file(ctx, spath, json, &len);
}

nt_status nt_checkpoint_load_tensors(nt_ctx *ctx, const char *where, nt_params *p,
                                     nt_adamw *opt) {
  char tpath[4096], spath[4096];
  nt_checkpoint_paths(where, tpath, spath, sizeof tpath);
  nt_safetensors *f;
  nt_status st = nt_safetensors_open(ctx, tpath, &f);
  if (st) return st;
  for (int u = 0; u < p->n_units && !st; u++) {
    for (int i = 0; i < p->units[u].n_params && !st; i++) {
      nt_tensor dst = nt_params_view(p, u, i, NT_VIEW_MASTER);
      st = nt_safetensors_read(ctx, f, p->units[u].params[i].name, &dst);
    }
    if (opt && !st) {
      nt_tensor master, m, v;
      char name[NT_PARAM_NAME_MAX + 32];
      st = nt_adamw_state_views(opt, u, &master, &m, &v);
      moment_name(name, sizeof name, p->units[u].name, "exp_avg");
      if (!st) st = nt_safetensors_read(ctx, f, name, &m);
      moment_name(name, sizeof name, p->units[u].name, "exp_avg_sq");
      if (!st) st = nt_safetensors_read(ctx, f, name, &v);
    }
  }
  nt_safetensors_close(f);
  if (!st) st = nt_params_sync_compute(ctx, p);
  return st;
}
