#include "models/checkpoint.h"
#include "models/json.h"
#include "models/safetensors.h"
#include "models/sha256.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TENSORS "ckpt.safetensors"
#define SIDECAR "ckpt.json"
#define MANIFEST "MANIFEST.json"
#define LATEST "latest"
#define TMP_DIR_PREFIX ".tmp-ckpt-"
#define TMP_LATEST_PREFIX ".tmp-latest-"
#define MANIFEST_FORMAT "nanotrain-checkpoint-manifest"

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
    snprintf(tensors, len, "%s/" TENSORS, where);
    snprintf(sidecar, len, "%s/" SIDECAR, where);
  }
}

nt_status nt_make_dirs(nt_ctx *ctx, const char *dir) {
  char buf[PATH_MAX];
  if ((size_t)snprintf(buf, sizeof buf, "%s", dir) >= sizeof buf)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %.64s...", dir);
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

/* dir/name into out; false when it does not fit. */
static bool join(char *out, size_t len, const char *dir, const char *name) {
  return (size_t)snprintf(out, len, "%s/%s", dir, name) < len;
}

static nt_status fsync_path(nt_ctx *ctx, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc) return NT_ERROR(ctx, NT_ERR_IO, "%s: fsync: %s", path, strerror(err));
  return NT_OK;
}

/* Removes a directory and the files in it (checkpoint directories hold files only). */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
          join(path, sizeof path, dir, e->d_name))
        unlink(path);
    closedir(d);
  }
  rmdir(dir);
}

static void random_hex(char *out, size_t nbytes) {
  unsigned char r[16] = {0};
  if (nbytes > sizeof r) nbytes = sizeof r;
  if (getrandom(r, nbytes, 0) != (ssize_t)nbytes) {
    /* no entropy source: the pid already separates processes, the address and clock vary */
    uint64_t x = (uint64_t)(uintptr_t)&r ^ (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < nbytes; i++, x = x * 6364136223846793005ULL + 1) r[i] ^= x >> 56;
  }
  for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", r[i]);
}

/* Writes data to dir/name through a temporary name unique to this process, fsynced, renamed. */
static nt_status write_atomic_unique(nt_ctx *ctx, const char *dir, const char *name,
                                     const void *data, size_t len) {
  char rnd[17], tmp[PATH_MAX], path[PATH_MAX], tname[96];
  random_hex(rnd, 8);
  snprintf(tname, sizeof tname, TMP_LATEST_PREFIX "%ld-%s", (long)getpid(), rnd);
  if (!join(tmp, sizeof tmp, dir, tname) || !join(path, sizeof path, dir, name))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  nt_status st = NT_OK;
  if (write(fd, data, len) != (ssize_t)len)
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
  if (!st && fsync(fd)) st = NT_ERROR(ctx, NT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
  if (close(fd) && !st) st = NT_ERROR(ctx, NT_ERR_IO, "%s: close: %s", tmp, strerror(errno));
  if (!st && rename(tmp, path))
    st = NT_ERROR(ctx, NT_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
  if (st) unlink(tmp);
  else st = fsync_path(ctx, dir);
  return st;
}

/* ---- manifests ---- */

typedef struct {
  int64_t step;
  uint64_t seq;
} ckpt_info;

static nt_status read_manifest(nt_ctx *ctx, const char *dir, nt_json *m, ckpt_info *info) {
  char path[PATH_MAX], *text = NULL;
  size_t len;
  if (!join(path, sizeof path, dir, MANIFEST))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %.64s...", dir);
  struct stat sb;
  if (stat(path, &sb))
    return NT_ERROR(ctx, NT_ERR_FORMAT,
                    "%s: no manifest (%s): not a complete nanotrain checkpoint (a partial write, "
                    "or one from a nanotrain before manifests); refusing it", dir, MANIFEST);
  nt_status st = nt_read_file(ctx, path, &text, &len);
  if (st) return st;
  st = nt_json_parse(ctx, text, len, path, m);
  free(text);
  if (st) return st;
  if (strcmp(nt_json_str(nt_json_get(m, "format"), ""), MANIFEST_FORMAT))
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: not a nanotrain checkpoint manifest", path);
  const nt_json *files = nt_json_get(m, "files");
  if (!st && (!files || files->type != NT_JSON_ARR))
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: no file list", path);
  if (!st) st = nt_json_get_int_in(ctx, m, "step", 0, INT64_MAX, &info->step);
  if (!st) st = nt_json_get_uint_in(ctx, m, "seq", 1, INT64_MAX, &info->seq);
  if (st) {
    if (!strstr(nt_last_error(ctx), path))
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: %s", path, nt_last_error(ctx));
    nt_json_free(m);
  }
  return st;
}

/* A listed name a manifest may hold: the two files of a consolidated checkpoint, or (a sharded
 * one) a plain file name ending in .safetensors. */
static bool allowed_name(const char *name, bool sharded) {
  if (!strcmp(name, TENSORS) || !strcmp(name, SIDECAR)) return true;
  return sharded && name[0] && name[0] != '.' && !strchr(name, '/') &&
         ends_with(name, ".safetensors") && strlen(name) < 64;
}

/* One entry of a manifest's file list: present with its size, and its SHA-256 when `hash`. */
static nt_status check_file(nt_ctx *ctx, const char *dir, const nt_json *f, bool hash) {
  const char *name = nt_json_str(nt_json_get(f, "name"), "");
  const char *want = nt_json_str(nt_json_get(f, "sha256"), "");
  uint64_t size = 0;
  nt_status st = nt_json_get_uint_in(ctx, f, "size", 0, INT64_MAX, &size);
  if (st) return st;
  char path[PATH_MAX], hex[65];
  if (!join(path, sizeof path, dir, name))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  struct stat sb;
  if (stat(path, &sb))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s is incomplete: %s is missing", dir, name);
  if ((uint64_t)sb.st_size != size)
    return NT_ERROR(ctx, NT_ERR_FORMAT,
                    "checkpoint %s is damaged: %s has %lld bytes, its manifest says %llu", dir,
                    name, (long long)sb.st_size, (unsigned long long)size);
  if (!hash) return NT_OK;
  uint64_t got;
  st = nt_sha256_file(ctx, path, hex, &got);
  if (!st && (got != size || strcmp(hex, want)))
    st = NT_ERROR(ctx, NT_ERR_FORMAT,
                  "checkpoint %s is damaged or was modified: the SHA-256 of %s does not match "
                  "its manifest", dir, name);
  return st;
}

/* Every listed file's size (and SHA-256 when hash_all; the sidecar's always). */
static nt_status verify_manifest(nt_ctx *ctx, const char *dir, const nt_json *m, bool hash_all) {
  const nt_json *files = nt_json_get(m, "files");
  bool sharded = nt_json_get(m, "sharded") != NULL, have_tensors = false;
  nt_status st = NT_OK;
  for (int i = 0; !st && i < files->n; i++) {
    const nt_json *f = &files->items[i];
    const char *name = nt_json_str(nt_json_get(f, "name"), "");
    if (!allowed_name(name, sharded))
      return NT_ERROR(ctx, NT_ERR_FORMAT, "%s/%s: lists an unexpected file '%.64s'", dir,
                      MANIFEST, name);
    have_tensors |= !strcmp(name, TENSORS);
    st = check_file(ctx, dir, f, hash_all || !strcmp(name, SIDECAR));
  }
  if (!st && !have_tensors && !sharded)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s/%s does not list %s", dir, MANIFEST, TENSORS);
  return st;
}

nt_status nt_checkpoint_verify(nt_ctx *ctx, const char *dir, bool hash_all) {
  nt_json m;
  ckpt_info info;
  nt_status st = read_manifest(ctx, dir, &m, &info);
  if (st) return st;
  st = verify_manifest(ctx, dir, &m, hash_all);
  nt_json_free(&m);
  return st;
}

nt_status nt_checkpoint_verify_file(nt_ctx *ctx, const char *dir, const nt_json *manifest,
                                    const char *name) {
  const nt_json *files = nt_json_get(manifest, "files");
  for (int i = 0; files && i < files->n; i++)
    if (!strcmp(nt_json_str(nt_json_get(&files->items[i], "name"), ""), name))
      return check_file(ctx, dir, &files->items[i], true);
  return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s: its manifest does not list %s", dir, name);
}

/* The manifest, written last: the local ckpt.safetensors / ckpt.json hashed here, `files`
 * (other writers' files) as reported, and `layout` (JSON text) as the "sharded" member. */
static nt_status write_manifest(nt_ctx *ctx, const char *dir, int64_t step, uint64_t seq,
                                const nt_checkpoint_file *files, int n_files,
                                const char *layout) {
  static const char *const names[] = {TENSORS, SIDECAR};
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "format");
  nt_jw_str(&w, MANIFEST_FORMAT);
  nt_jw_key(&w, "version");
  nt_jw_i64(&w, 1);
  nt_jw_key(&w, "step");
  nt_jw_i64(&w, step);
  nt_jw_key(&w, "seq");
  nt_jw_u64(&w, seq);
  nt_jw_key(&w, "files");
  nt_jw_begin(&w, '[');
  nt_status st = NT_OK;
  for (int i = 0; i < 2 + n_files && !st; i++) {
    char path[PATH_MAX], hex[65];
    uint64_t size;
    const char *name = i < 2 ? names[i] : files[i - 2].name;
    join(path, sizeof path, dir, name);
    struct stat sb;
    if (i < 2) {
      if (access(path, F_OK)) continue;     /* no sidecar (or no consolidated tensors) */
      st = nt_sha256_file(ctx, path, hex, &size);
    } else {   /* another writer's file: its report, checked against what is on disk */
      size = files[i - 2].size;
      snprintf(hex, sizeof hex, "%s", files[i - 2].sha256);
      if (stat(path, &sb) || (uint64_t)sb.st_size != size)
        st = NT_ERROR(ctx, NT_ERR_IO, "checkpoint file %s is missing or not %llu bytes", path,
                      (unsigned long long)size);
    }
    nt_jw_begin(&w, '{');
    nt_jw_key(&w, "name");
    nt_jw_str(&w, name);
    nt_jw_key(&w, "size");
    nt_jw_u64(&w, size);
    nt_jw_key(&w, "sha256");
    nt_jw_str(&w, st ? "" : hex);
    nt_jw_end(&w, '}');
  }
  nt_jw_end(&w, ']');
  if (layout) {
    nt_jw_key(&w, "sharded");
    for (size_t at = 0, n = strlen(layout); at < n; at += 256)   /* printf takes < 512 bytes */
      nt_jw_printf(&w, "%.256s", layout + at);
    w.need_comma = true;
  }
  nt_jw_end(&w, '}');
  nt_jw_printf(&w, "\n");
  char *text = nt_jw_finish(&w);
  if (!st && !text) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory writing a manifest");
  if (!st) st = write_atomic_unique(ctx, dir, MANIFEST, text, strlen(text));
  free(text);
  return st;
}

/* ---- listing ---- */

typedef struct {
  char name[64];
  ckpt_info info;
} ckpt_entry;

/* The complete checkpoints (a readable manifest) in out_dir; caller frees *list. */
static nt_status list_checkpoints(nt_ctx *ctx, const char *out_dir, ckpt_entry **list, int *n) {
  *list = NULL;
  *n = 0;
  DIR *d = opendir(out_dir);
  if (!d) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot list: %s", out_dir, strerror(errno));
  struct dirent *e;
  int cap = 0;
  nt_status st = NT_OK;
  while ((e = readdir(d)) && !st) {
    if (strncmp(e->d_name, "ckpt-", 5) || strlen(e->d_name) >= sizeof(*list)->name) continue;
    char dir[PATH_MAX];
    nt_json m;
    ckpt_info info;
    if (!join(dir, sizeof dir, out_dir, e->d_name)) continue;
    nt_ctx *quiet = NULL;     /* unreadable manifests are skipped, their errors not kept */
    if (nt_ctx_create(&quiet, nt_cpu())) quiet = ctx;
    nt_status mst = read_manifest(quiet, dir, &m, &info);
    if (quiet != ctx) nt_ctx_free(quiet);
    if (mst) continue;
    nt_json_free(&m);
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      ckpt_entry *l = realloc(*list, (size_t)cap * sizeof *l);
      if (!l) {
        st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory listing %s", out_dir);
        break;
      }
      *list = l;
    }
    snprintf((*list)[*n].name, sizeof(*list)->name, "%s", e->d_name);
    (*list)[(*n)++].info = info;
  }
  closedir(d);
  return st;
}

static int by_seq_desc(const void *a, const void *b) {
  uint64_t x = ((const ckpt_entry *)a)->info.seq, y = ((const ckpt_entry *)b)->info.seq;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* latest's target name into name[len]; false when absent or unusable. */
static bool read_latest(const char *out_dir, char *name, size_t len) {
  char path[PATH_MAX];
  if (!join(path, sizeof path, out_dir, LATEST)) return false;
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool ok = fgets(name, (int)len, f) != NULL;
  fclose(f);
  if (!ok) return false;
  name[strcspn(name, "\n")] = 0;
  return !strncmp(name, "ckpt-", 5) && !strchr(name, '/') && !strstr(name, "..");
}

static bool is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

nt_status nt_checkpoint_resolve(nt_ctx *ctx, const char *where, char *dir, size_t len) {
  char base[PATH_MAX], path[PATH_MAX];
  if ((size_t)snprintf(base, sizeof base, "%s", where) >= sizeof base)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %.64s...", where);
  if (!is_dir(base)) {
    /* a file inside a checkpoint directory */
    char *slash = strrchr(base, '/');
    if (slash && slash != base) *slash = 0;
    else snprintf(base, sizeof base, ".");
    if (access(where, F_OK) || !is_dir(base))
      return NT_ERROR(ctx, NT_ERR_IO, "no checkpoint at %s: %s", where, strerror(ENOENT));
  }
  if (join(path, sizeof path, base, MANIFEST) && !access(path, F_OK)) {
    if ((size_t)snprintf(dir, len, "%s", base) >= len)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %.64s...", base);
    return NT_OK;
  }
  /* an out-dir: its newest complete checkpoint (`latest` may lag behind: a save whose update of
   * it failed, or a kill between the rename and the update) */
  ckpt_entry *list;
  int n;
  nt_status st = list_checkpoints(ctx, base, &list, &n);
  if (st) return st;
  if (n > 0) {
    qsort(list, (size_t)n, sizeof *list, by_seq_desc);
    snprintf(dir, len, "%s/%s", base, list[0].name);
  }
  free(list);
  if (n > 0) return NT_OK;
  if (join(path, sizeof path, base, SIDECAR) && !access(path, F_OK))
    return NT_ERROR(ctx, NT_ERR_FORMAT,
                    "%s: a checkpoint without a manifest (from a nanotrain before manifests, or "
                    "a partial write): refusing to resume from it", base);
  return NT_ERROR(ctx, NT_ERR_IO, "no checkpoint in %s", base);
}

/* ---- saving ---- */

void nt_checkpoint_clean_stale(const char *out_dir, bool all) {
  DIR *d = opendir(out_dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    bool is_tmp_dir = !strncmp(e->d_name, TMP_DIR_PREFIX, strlen(TMP_DIR_PREFIX));
    bool is_tmp_file = !strncmp(e->d_name, TMP_LATEST_PREFIX, strlen(TMP_LATEST_PREFIX));
    if (!is_tmp_dir && !is_tmp_file) continue;
    long pid = strtol(e->d_name + strlen(is_tmp_dir ? TMP_DIR_PREFIX : TMP_LATEST_PREFIX), NULL,
                      10);
    bool dead = pid <= 0 || (kill((pid_t)pid, 0) && errno == ESRCH);
    if (!all && !dead) continue;
    char path[PATH_MAX];
    if (!join(path, sizeof path, out_dir, e->d_name)) continue;
    if (is_tmp_dir) remove_dir(path);
    else unlink(path);
  }
  closedir(d);
}

static void moment_name(char *buf, size_t len, const char *unit, const char *which) {
  snprintf(buf, len, "optimizer.%s.%s", unit, which);
}

nt_status nt_checkpoint_write_tensors(nt_ctx *ctx, const char *dir, const nt_params *p,
                                      nt_adamw *opt) {
  char path[PATH_MAX];
  if (!join(path, sizeof path, dir, TENSORS))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  int cap = 0;
  for (int u = 0; u < p->n_units; u++) cap += p->units[u].n_params + 2;
  nt_named_tensor *ts = calloc((size_t)cap + 1, sizeof *ts);
  char (*names)[NT_PARAM_NAME_MAX + 32] = calloc((size_t)cap + 1, sizeof *names);
  nt_status st = NT_OK;
  if (!ts || !names) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory saving a checkpoint");
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
  if (!st) st = nt_safetensors_save(ctx, path, ts, n, meta);
  free(ts);
  free(names);
  return st;
}

/* The sidecar's "iter" when it is a plain non-negative integer, else -1. */
static int64_t sidecar_step(const char *json) {
  nt_ctx *quiet;
  if (!json || nt_ctx_create(&quiet, nt_cpu())) return -1;
  nt_json j;
  int64_t step = -1;
  if (!nt_json_parse(quiet, json, strlen(json), "sidecar", &j)) {
    if (nt_json_get_int_in(quiet, &j, "iter", 0, INT64_MAX, &step)) step = -1;
    nt_json_free(&j);
  }
  nt_ctx_free(quiet);
  return step;
}

/* Moves the finished temporary directory to out_dir/name; an existing checkpoint of that name
 * is exchanged atomically (then removed), so the name never designates a partial one. */
static nt_status install(nt_ctx *ctx, const char *out_dir, const char *tmp, const char *name) {
  char dst[PATH_MAX];
  if (!join(dst, sizeof dst, out_dir, name))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", out_dir);
  if (!rename(tmp, dst)) return NT_OK;
  if (errno != EEXIST && errno != ENOTEMPTY)
    return NT_ERROR(ctx, NT_ERR_IO, "rename %s -> %s: %s", tmp, dst, strerror(errno));
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE))
    return NT_ERROR(ctx, NT_ERR_IO, "cannot replace checkpoint %s: %s", dst, strerror(errno));
  remove_dir(tmp);   /* now the previous checkpoint of this name */
  return NT_OK;
}

nt_status nt_checkpoint_stage_begin(nt_ctx *ctx, const char *out_dir, char *tmp) {
  nt_status st = nt_make_dirs(ctx, out_dir);
  if (st) return st;
  nt_checkpoint_clean_stale(out_dir, false);
  char tname[96], rnd[17];
  random_hex(rnd, 8);
  snprintf(tname, sizeof tname, TMP_DIR_PREFIX "%ld-%s", (long)getpid(), rnd);
  if (!join(tmp, PATH_MAX, out_dir, tname) || strlen(tmp) + 80 >= PATH_MAX)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", out_dir);
  if (mkdir(tmp, 0755))
    return NT_ERROR(ctx, NT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  return NT_OK;
}

void nt_checkpoint_stage_abort(const char *tmp) { remove_dir(tmp); }

nt_status nt_checkpoint_stage_commit(nt_ctx *ctx, const char *out_dir, const char *tmp,
                                     const char *sidecar_json, const nt_checkpoint_file *files,
                                     int n_files, const char *layout, int keep, char *saved,
                                     bool *warned) {
  ckpt_entry *list;
  int n;
  nt_status st = list_checkpoints(ctx, out_dir, &list, &n);
  if (st) {
    remove_dir(tmp);
    return st;
  }
  uint64_t seq = 1;
  for (int i = 0; i < n; i++)
    if (list[i].info.seq >= seq) seq = list[i].info.seq + 1;
  free(list);
  int64_t step = sidecar_step(sidecar_json);
  char name[64], path[PATH_MAX];
  snprintf(name, sizeof name, "ckpt-%lld", (long long)(step >= 0 ? step : (int64_t)seq));
  if (sidecar_json) {
    join(path, sizeof path, tmp, SIDECAR);
    st = nt_write_file_atomic(ctx, path, sidecar_json, strlen(sidecar_json));
  }
  if (!st) st = write_manifest(ctx, tmp, step >= 0 ? step : 0, seq, files, n_files, layout);
  if (!st) st = install(ctx, out_dir, tmp, name);
  if (st) {
    remove_dir(tmp);
    return st;
  }
  /* saved: what follows makes the rename durable, points `latest` at it and prunes; a failure
   * there is reported, not returned */
  if (saved) snprintf(saved, PATH_MAX, "%s/%s", out_dir, name);
  char line[80];
  snprintf(line, sizeof line, "%s\n", name);
  const char *what = "syncing the out-dir (`latest` not updated)";
  st = fsync_path(ctx, out_dir);
  if (!st) {
    what = "updating `latest` (it names an older checkpoint)";
    st = write_atomic_unique(ctx, out_dir, LATEST, line, strlen(line));
  }
  if (!st) {
    what = "pruning old checkpoints";
    st = nt_checkpoint_prune(ctx, out_dir, keep);
  }
  if (st)
    NT_ERROR(ctx, st, "checkpoint %s/%s is complete, but %s failed: %s", out_dir, name, what,
             nt_last_error(ctx));
  if (warned) *warned = st != NT_OK;
  return NT_OK;
}

nt_status nt_checkpoint_save_keep(nt_ctx *ctx, const char *out_dir, const nt_params *p,
                                  nt_adamw *opt, const char *sidecar_json, int keep,
                                  char *saved, bool *warned) {
  char tmp[PATH_MAX];
  nt_status st = nt_checkpoint_stage_begin(ctx, out_dir, tmp);
  if (st) return st;
  st = nt_checkpoint_write_tensors(ctx, tmp, p, opt);
  if (st) {
    remove_dir(tmp);
    return st;
  }
  return nt_checkpoint_stage_commit(ctx, out_dir, tmp, sidecar_json, NULL, 0, NULL, keep, saved,
                                    warned);
}

nt_status nt_checkpoint_save(nt_ctx *ctx, const char *out_dir, const nt_params *p,
                             nt_adamw *opt, const char *sidecar_json) {
  return nt_checkpoint_save_keep(ctx, out_dir, p, opt, sidecar_json, NT_CHECKPOINT_KEEP_DEFAULT,
                                 NULL, NULL);
}

nt_status nt_checkpoint_prune(nt_ctx *ctx, const char *out_dir, int keep) {
  if (keep <= 0) return NT_OK;
  ckpt_entry *list;
  int n;
  nt_status st = list_checkpoints(ctx, out_dir, &list, &n);
  if (st) return st;
  qsort(list, (size_t)n, sizeof *list, by_seq_desc);
  char latest[128] = "";
  read_latest(out_dir, latest, sizeof latest);
  /* directories named like checkpoints but without a manifest: an interrupted removal */
  DIR *d = opendir(out_dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char dir[PATH_MAX], path[PATH_MAX];
    if (strncmp(e->d_name, "ckpt-", 5) || !join(dir, sizeof dir, out_dir, e->d_name) ||
        !is_dir(dir) || !join(path, sizeof path, dir, MANIFEST) || !access(path, F_OK))
      continue;
    remove_dir(dir);
  }
  if (d) closedir(d);
  for (int i = keep; i < n; i++) {
    char dir[PATH_MAX];
    if (!strcmp(list[i].name, latest) || !join(dir, sizeof dir, out_dir, list[i].name)) continue;
    /* the manifest goes first, so a half-removed directory is never taken for complete */
    char path[PATH_MAX];
    if (join(path, sizeof path, dir, MANIFEST)) unlink(path);
    remove_dir(dir);
  }
  free(list);
  return NT_OK;
}

/* ---- loading ---- */

nt_status nt_checkpoint_manifest(nt_ctx *ctx, const char *where, char *dir, size_t len,
                                 nt_json *manifest) {
  ckpt_info info;
  nt_status st = nt_checkpoint_resolve(ctx, where, dir, len);
  if (!st) st = read_manifest(ctx, dir, manifest, &info);
  if (st) return st;
  st = verify_manifest(ctx, dir, manifest, false);
  if (st) nt_json_free(manifest);
  return st;
}

nt_status nt_checkpoint_read_sidecar(nt_ctx *ctx, const char *where, char **json) {
  char dir[PATH_MAX], path[PATH_MAX];
  *json = NULL;
  nt_status st = nt_checkpoint_resolve(ctx, where, dir, sizeof dir);
  if (!st) st = nt_checkpoint_verify(ctx, dir, false);
  if (st) return st;
  if (!join(path, sizeof path, dir, SIDECAR))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  size_t len;
  return nt_read_file(ctx, path, json, &len);
}

nt_status nt_checkpoint_load_tensors(nt_ctx *ctx, const char *where, nt_params *p,
                                     nt_adamw *opt) {
  char dir[PATH_MAX], path[PATH_MAX];
  nt_status st = nt_checkpoint_resolve(ctx, where, dir, sizeof dir);
  if (!st) st = nt_checkpoint_verify(ctx, dir, true);
  if (st) return st;
  if (!join(path, sizeof path, dir, TENSORS))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", dir);
  if (access(path, F_OK))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "checkpoint %s is sharded (one file per rank, no %s): "
                    "resume it with nanotrain, which reshards it", dir, TENSORS);
  nt_safetensors *f;
  st = nt_safetensors_open(ctx, path, &f);
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

/* ---- the out-dir lock ---- */

struct nt_outdir_lock {
  int fd;
};

nt_status nt_outdir_lock_take(nt_ctx *ctx, const char *out_dir, nt_outdir_lock **out) {
  *out = NULL;
  nt_status st = nt_make_dirs(ctx, out_dir);
  if (st) return st;
  char path[PATH_MAX];
  if (!join(path, sizeof path, out_dir, ".lock"))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long under %.64s", out_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB)) {
    int err = errno;
    char buf[32] = "";
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    long pid = got > 0 ? strtol(buf, NULL, 10) : 0;
    if (err != EWOULDBLOCK)
      return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
    if (pid > 0)
      return NT_ERROR(ctx, NT_ERR_STATE,
                      "out-dir %s is in use by another nanotrain run (pid %ld); wait for it to "
                      "end or choose another --out-dir", out_dir, pid);
    return NT_ERROR(ctx, NT_ERR_STATE,
                    "out-dir %s is in use by another nanotrain run (pid not yet recorded); wait "
                    "for it to end or choose another --out-dir", out_dir);
  }
  char line[32];
  int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)len, 0) != len) {
    int err = errno;
    close(fd);
    return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot write: %s", path, strerror(err));
  }
  nt_outdir_lock *lk = malloc(sizeof *lk);
  if (!lk) {
    close(fd);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  }
  lk->fd = fd;
  nt_checkpoint_clean_stale(out_dir, true);
  *out = lk;
  return NT_OK;
}

void nt_outdir_unlock(nt_outdir_lock *lk) {
  if (!lk) return;
  close(lk->fd);
  free(lk);
}
