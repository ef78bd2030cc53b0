#include "train/metrics.h"
#include "models/json.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

nt_train_metrics nt_train_metrics_empty(void) {
  nt_train_metrics m;
  memset(&m, 0, sizeof m);
  m.model = "";
  m.kind = "train";
  m.items = "items";
  m.epoch = m.loss = m.lr = m.scale = m.grad_norm = m.items_per_sec = m.step_ms = m.mfu = NAN;
  m.mem_allocated = m.mem_reserved = m.mem_peak = m.data_wait_ms = NAN;
  m.val_loss = m.accuracy = m.elapsed_s = NAN;
  return m;
}

struct nt_metrics_log {
  FILE *f;
};

nt_status nt_metrics_log_open(nt_ctx *ctx, const char *path, bool append, nt_metrics_log **out) {
  *out = NULL;
  FILE *f = fopen(path, append ? "a" : "w");
  if (!f) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open the metrics log: %s", path,
                          strerror(errno));
  nt_metrics_log *l = calloc(1, sizeof *l);
  if (!l) {
    fclose(f);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  }
  l->f = f;
  *out = l;
  return NT_OK;
}

void nt_metrics_log_close(nt_metrics_log *l) {
  if (!l) return;
  fclose(l->f);
  free(l);
}

typedef struct { const char *name; double v; } field;

static int fields_of(const nt_train_metrics *m, field *f) {
  int n = 0;
  f[n++] = (field){"epoch", m->epoch};
  f[n++] = (field){"loss", m->loss};
  f[n++] = (field){"lr", m->lr};
  f[n++] = (field){"scale", m->scale};
  f[n++] = (field){"grad_norm", m->grad_norm};
  f[n++] = (field){"skipped_steps", (double)m->skipped_steps};
  f[n++] = (field){"items_per_sec", m->items_per_sec};
  f[n++] = (field){"step_ms", m->step_ms};
  f[n++] = (field){"mfu", m->mfu};
  f[n++] = (field){"mem_allocated_bytes", m->mem_allocated};
  f[n++] = (field){"mem_reserved_bytes", m->mem_reserved};
  f[n++] = (field){"mem_peak_bytes", m->mem_peak};
  f[n++] = (field){"data_wait_ms", m->data_wait_ms};
  f[n++] = (field){"val_loss", m->val_loss};
  f[n++] = (field){"accuracy", m->accuracy};
  f[n++] = (field){"elapsed_s", m->elapsed_s};
  return n;
}

nt_status nt_metrics_log_write(nt_ctx *ctx, nt_metrics_log *l, const nt_train_metrics *m) {
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "kind");
  nt_jw_str(&w, m->kind);
  nt_jw_key(&w, "model");
  nt_jw_str(&w, m->model);
  nt_jw_key(&w, "step");
  nt_jw_i64(&w, m->step);
  field f[24];
  int n = fields_of(m, f);
  for (int i = 0; i < n; i++) {
    if (isnan(f[i].v) && strcmp(f[i].name, "loss")) continue;
    /* throughput gets its unit in the key: tokens_per_sec / images_per_sec */
    if (!strcmp(f[i].name, "items_per_sec")) {
      char key[48];
      snprintf(key, sizeof key, "%s_per_sec", m->items);
      nt_jw_key(&w, key);
    } else {
      nt_jw_key(&w, f[i].name);
    }
    nt_jw_num(&w, f[i].v);
  }
  const double *per_rank[2] = {m->rank_loss, m->rank_mem_peak};
  static const char *const per_rank_key[2] = {"rank_loss", "rank_mem_peak"};
  for (int k = 0; k < 2 && m->world > 1; k++) {
    if (!per_rank[k]) continue;
    nt_jw_key(&w, per_rank_key[k]);
    nt_jw_begin(&w, '[');
    for (int r = 0; r < m->world; r++) nt_jw_num(&w, per_rank[k][r]);
    nt_jw_end(&w, ']');
  }
  nt_jw_end(&w, '}');
  char *line = nt_jw_finish(&w);
  if (!line) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a metrics record");
  int ok = fprintf(l->f, "%s\n", line) > 0 && fflush(l->f) == 0;
  free(line);
  return ok ? NT_OK : NT_ERROR(ctx, NT_ERR_IO, "metrics log: write failed: %s", strerror(errno));
}

nt_status nt_metrics_prometheus_write(nt_ctx *ctx, const char *path, const nt_train_metrics *m) {
  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= sizeof tmp)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %s", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  field fs[24];
  int n = fields_of(m, fs);
  fprintf(f, "# HELP nanotrain_step Optimizer steps taken.\n# TYPE nanotrain_step gauge\n");
  fprintf(f, "nanotrain_step{model=\"%s\"} %lld\n", m->model, (long long)m->step);
  for (int i = 0; i < n; i++) {
    if (isnan(fs[i].v)) continue;
    char name[64];
    if (!strcmp(fs[i].name, "items_per_sec"))
      snprintf(name, sizeof name, "nanotrain_%s_per_second", m->items);
    else
      snprintf(name, sizeof name, "nanotrain_%s", fs[i].name);
    fprintf(f, "# TYPE %s gauge\n%s{model=\"%s\"} %.9g\n", name, name, m->model, fs[i].v);
  }
  bool ok = !ferror(f);
  if (fclose(f)) ok = false;
  if (!ok || rename(tmp, path)) {
    nt_status st = NT_ERROR(ctx, NT_ERR_IO, "%s: cannot write the Prometheus file: %s", path,
                            strerror(errno));
    remove(tmp);
    return st;
  }
  return NT_OK;
}
