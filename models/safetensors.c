#include "models/safetensors.h"
#include "models/json.h"
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The format's dtype names with their element sizes; those nanotrain has no type for are
 * listed (so a file holding them can be read and checked) but not loadable. */
static const struct {
  const char *name;
  size_t size;
  nt_dtype dt;
} file_dtypes[] = {
    {"F32", 4, NT_F32},      {"F16", 2, NT_F16},         {"BF16", 2, NT_BF16},
    {"F8_E4M3", 1, NT_FP8_E4M3}, {"F8_E5M2", 1, NT_FP8_E5M2}, {"I32", 4, NT_I32},
    {"I64", 8, NT_I64},      {"U8", 1, NT_U8},           {"F64", 8, NT_DTYPE_COUNT},
    {"I8", 1, NT_DTYPE_COUNT}, {"I16", 2, NT_DTYPE_COUNT}, {"U16", 2, NT_DTYPE_COUNT},
    {"U32", 4, NT_DTYPE_COUNT}, {"U64", 8, NT_DTYPE_COUNT}, {"BOOL", 1, NT_DTYPE_COUNT}};
#define N_FILE_DTYPES (int)(sizeof file_dtypes / sizeof file_dtypes[0])

const char *nt_safetensors_dtype_name(nt_dtype dt) {
  for (int i = 0; i < N_FILE_DTYPES; i++)
    if (file_dtypes[i].dt == dt && dt != NT_DTYPE_COUNT) return file_dtypes[i].name;
  return NULL;
}

static nt_status write_all(nt_ctx *ctx, int fd, const void *data, size_t len, const char *path) {
  const char *p = data;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return NT_ERROR(ctx, NT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    p += w;
    len -= (size_t)w;
  }
  return NT_OK;
}

/* Syncs the directory holding path (so that a rename into it is durable). */
static nt_status fsync_dir(nt_ctx *ctx, const char *path) {
  char *copy = strdup(path);
  if (!copy) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory syncing %s", path);
  const char *dir = dirname(copy);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  nt_status st = NT_OK;
  if (fd < 0) st = NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open to sync: %s", dir, strerror(errno));
  else if (fsync(fd)) st = NT_ERROR(ctx, NT_ERR_IO, "%s: fsync: %s", dir, strerror(errno));
  if (fd >= 0) close(fd);
  free(copy);
  return st;
}

/* Opens path.tmp; the caller writes, then finish_atomic syncs and renames. */
static nt_status open_tmp(nt_ctx *ctx, const char *path, char *tmp, size_t tmplen, int *fd) {
  if ((size_t)snprintf(tmp, tmplen, "%s.tmp", path) >= tmplen)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "path too long: %s", path);
  *fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (*fd < 0) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  return NT_OK;
}

static nt_status finish_atomic(nt_ctx *ctx, int fd, const char *tmp, const char *path,
                               nt_status st) {
  if (!st && fsync(fd)) st = NT_ERROR(ctx, NT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
  if (close(fd) && !st) st = NT_ERROR(ctx, NT_ERR_IO, "%s: close: %s", tmp, strerror(errno));
  if (!st && rename(tmp, path))
    st = NT_ERROR(ctx, NT_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
  if (st) unlink(tmp);
  else st = fsync_dir(ctx, path);
  return st;
}

nt_status nt_write_file_atomic(nt_ctx *ctx, const char *path, const void *data, size_t len) {
  char tmp[4096];
  int fd;
  nt_status st = open_tmp(ctx, path, tmp, sizeof tmp, &fd);
  if (st) return st;
  st = write_all(ctx, fd, data, len, tmp);
  return finish_atomic(ctx, fd, tmp, path, st);
}

nt_status nt_read_file(nt_ctx *ctx, const char *path, char **data, size_t *len) {
  *data = NULL;
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  nt_status st = NT_OK;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET)) {
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: cannot determine its size", path);
  } else if (!(buf = malloc((size_t)n + 1))) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory reading %ld bytes", path, n);
  } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
    st = NT_ERROR(ctx, NT_ERR_IO, "%s: short read", path);
  }
  fclose(f);
  if (st) {
    free(buf);
    return st;
  }
  buf[n] = 0;
  *data = buf;
  *len = (size_t)n;
  return NT_OK;
}

static bool is_f32_f16_bf16(nt_dtype d) { return d == NT_F32 || d == NT_F16 || d == NT_BF16; }

/* The dtype tensor t is stored as. */
static nt_dtype stored_dtype(const nt_tensor *t, nt_dtype float_dtype) {
  return float_dtype != NT_DTYPE_COUNT && is_f32_f16_bf16(t->dtype) ? float_dtype : t->dtype;
}

/* float_dtype NT_DTYPE_COUNT: every tensor as it is. */
static nt_status save(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                      const char *const *metadata, nt_dtype float_dtype) {
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  if (metadata && metadata[0]) {
    nt_jw_key(&w, "__metadata__");
    nt_jw_begin(&w, '{');
    for (int i = 0; metadata[i] && metadata[i + 1]; i += 2) {
      nt_jw_key(&w, metadata[i]);
      nt_jw_str(&w, metadata[i + 1]);
    }
    nt_jw_end(&w, '}');
  }
  size_t off = 0, maxbytes = 0;
  for (int i = 0; i < n; i++) {
    const nt_tensor *t = &ts[i].t;
    nt_dtype sd = stored_dtype(t, float_dtype);
    const char *dn = nt_safetensors_dtype_name(sd);
    if (!dn || !nt_tensor_is_contiguous(t)) {
      free(nt_jw_finish(&w));
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor '%s' is not contiguous or has dtype %s",
                      path, ts[i].name, nt_dtype_name(t->dtype));
    }
    size_t bytes = (size_t)nt_tensor_numel(t) * nt_dtype_size(sd);
    nt_jw_key(&w, ts[i].name);
    nt_jw_begin(&w, '{');
    nt_jw_key(&w, "dtype");
    nt_jw_str(&w, dn);
    nt_jw_key(&w, "shape");
    nt_jw_begin(&w, '[');
    for (int d = 0; d < t->ndim; d++) nt_jw_i64(&w, t->shape[d]);
    nt_jw_end(&w, ']');
    nt_jw_key(&w, "data_offsets");
    nt_jw_begin(&w, '[');
    nt_jw_u64(&w, off);
    nt_jw_u64(&w, off + bytes);
    nt_jw_end(&w, ']');
    nt_jw_end(&w, '}');
    off += bytes;
    if (bytes > maxbytes) maxbytes = bytes;
    if (nt_tensor_nbytes(t) > maxbytes) maxbytes = nt_tensor_nbytes(t);
  }
  nt_jw_end(&w, '}');
  /* pad the header with spaces to a multiple of 8, as the reference writer does */
  while (w.len % 8) nt_jw_printf(&w, " ");
  size_t hlen = w.len;
  char *header = nt_jw_finish(&w);
  if (!header) return NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory for the header", path);
  char tmp[4096];
  int fd = -1;
  void *host = NULL, *conv = NULL;
  nt_status st = open_tmp(ctx, path, tmp, sizeof tmp, &fd);
  if (st) {
    free(header);
    return st;
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  st = write_all(ctx, fd, len8, 8, tmp);
  if (!st) st = write_all(ctx, fd, header, hlen, tmp);
  size_t buf_bytes = maxbytes ? maxbytes : 1;
  if (!st && (!(host = malloc(buf_bytes)) || !(conv = malloc(buf_bytes))))
    st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of host memory for a %zu-byte tensor", path, maxbytes);
  for (int i = 0; i < n && !st; i++) {
    const nt_tensor *t = &ts[i].t;
    const void *src = t->data;
    if (t->device.type != NT_DEV_CPU) {
      nt_tensor h = nt_tensor_view(host, t->dtype, nt_cpu(), t->ndim, t->shape);
      st = nt_tensor_copy(ctx, &h, t);
      src = host;
    }
    nt_dtype sd = stored_dtype(t, float_dtype);
    int64_t numel = nt_tensor_numel(t);
    if (!st && sd != t->dtype) {
      for (int64_t k = 0; k < numel; k++) nt_store_f32(conv, sd, k, nt_load_f32(src, t->dtype, k));
      src = conv;
    }
    if (!st) st = write_all(ctx, fd, src, (size_t)numel * nt_dtype_size(sd), tmp);
  }
  free(host);
  free(conv);
  free(header);
  return finish_atomic(ctx, fd, tmp, path, st);
}

nt_status nt_safetensors_save(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                              const char *const *metadata) {
  return save(ctx, path, ts, n, metadata, NT_DTYPE_COUNT);
}

nt_status nt_safetensors_save_as(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                                 const char *const *metadata, nt_dtype float_dtype) {
  if (!is_f32_f16_bf16(float_dtype))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "%s: tensors can be stored as F32, F16 or BF16, not %s", path,
                    nt_dtype_name(float_dtype));
  return save(ctx, path, ts, n, metadata, float_dtype);
}

nt_status nt_safetensors_save_params(nt_ctx *ctx, const char *path, const nt_params *p,
                                     nt_dtype float_dtype, const char *const *metadata) {
  int n = 0;
  for (int u = 0; u < p->n_units; u++) n += p->units[u].n_params;
  nt_named_tensor *ts = calloc((size_t)(n ? n : 1), sizeof *ts);
  if (!ts) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory saving %s", path);
  n = 0;
  for (int u = 0; u < p->n_units; u++)
    for (int i = 0; i < p->units[u].n_params; i++) {
      ts[n].name = p->units[u].params[i].name;
      ts[n++].t = nt_params_view(p, u, i, NT_VIEW_MASTER);
    }
  nt_status st = nt_safetensors_save_as(ctx, path, ts, n, metadata, float_dtype);
  free(ts);
  return st;
}

/* ---- reading ---- */

typedef struct {
  nt_safetensors_info info;
  uint64_t begin, end;            /* byte range in the data section */
} st_entry;

struct nt_safetensors {
  char *path;
  char *raw;                      /* the whole file */
  size_t len;
  size_t data_start;
  nt_json header;
  st_entry *e;                    /* the tensors, in header order */
  int n;
  int *by_name;                   /* indices of e sorted by name */
  bool *loaded;
};

/* A JSON number that is a plain non-negative integer <= max (models/json.h's range-checked
 * getter; its message is replaced by the caller's, which names the tensor). */
static bool json_uint(nt_ctx *ctx, const nt_json *j, uint64_t max, uint64_t *out) {
  return nt_json_uint_in(ctx, j, "safetensors header", 0, max, out) == NT_OK;
}

/* Checks header entry `name` and fills e. */
static nt_status parse_entry(nt_ctx *ctx, const char *path, const char *name, const nt_json *j,
                             size_t data_len, st_entry *e) {
  if (j->type != NT_JSON_OBJ)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: header entry '%s' is not an object", path, name);
  const nt_json *dt = nt_json_get(j, "dtype"), *sh = nt_json_get(j, "shape");
  const nt_json *of = nt_json_get(j, "data_offsets");
  const char *dn = nt_json_str(dt, NULL);
  int k = 0;
  while (dn && k < N_FILE_DTYPES && strcmp(file_dtypes[k].name, dn)) k++;
  if (!dn || k == N_FILE_DTYPES)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': %s%s%s", path, name,
                    dn ? "unknown dtype '" : "no dtype string", dn ? dn : "", dn ? "'" : "");
  if (!sh || sh->type != NT_JSON_ARR)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': no shape array", path, name);
  if (sh->n > NT_SAFETENSORS_MAX_DIMS)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' has %d dims (at most %d are read)", path,
                    name, sh->n, NT_SAFETENSORS_MAX_DIMS);
  size_t esz = file_dtypes[k].size;
  uint64_t numel = 1;
  for (int d = 0; d < sh->n; d++) {
    uint64_t v;
    if (!json_uint(ctx, &sh->items[d], (uint64_t)INT64_MAX, &v))
      return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': shape entry %d is not a non-negative "
                      "integer", path, name, d);
    if (v && numel > (uint64_t)INT64_MAX / esz / v)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': its shape's size overflows", path,
                      name);
    numel *= v;
    e->info.shape[d] = (int64_t)v;
  }
  uint64_t b, en;
  if (!of || of->type != NT_JSON_ARR || of->n != 2 ||
      !json_uint(ctx, &of->items[0], UINT64_MAX, &b) ||
      !json_uint(ctx, &of->items[1], UINT64_MAX, &en))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': data_offsets is not a pair of "
                    "non-negative integers", path, name);
  if (b > en || en > data_len)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) outside the "
                    "%zu data bytes", path, name, (unsigned long long)b, (unsigned long long)en,
                    data_len);
  if (en - b != numel * esz)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s': data_offsets span %llu bytes, its %s "
                    "shape needs %llu", path, name, (unsigned long long)(en - b), dn,
                    (unsigned long long)(numel * esz));
  e->info.name = name;
  e->info.dtype_name = file_dtypes[k].name;
  e->info.dtype = file_dtypes[k].dt;
  e->info.ndim = sh->n;
  e->info.numel = (int64_t)numel;
  e->info.nbytes = (size_t)(numel * esz);
  e->begin = b;
  e->end = en;
  return NT_OK;
}

/* Sort keys that carry what they compare (qsort has no context argument). */
typedef struct {
  const char *name;
  uint64_t begin, end;
  int index;
} sort_key;
static int by_name_cmp(const void *a, const void *b) {
  return strcmp(((const sort_key *)a)->name, ((const sort_key *)b)->name);
}
static int by_offset_cmp(const void *a, const void *b) {
  const sort_key *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* No duplicate names; data ranges back to back from 0 to the end of the file (the format
 * allows neither holes nor overlaps). Fills f->by_name. */
static nt_status check_layout(nt_ctx *ctx, nt_safetensors *f) {
  size_t data_len = f->len - f->data_start;
  size_t n = (size_t)(f->n ? f->n : 1);
  sort_key *k = malloc(n * sizeof *k);
  f->by_name = malloc(n * sizeof *f->by_name);
  if (!k || !f->by_name) {
    free(k);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory opening %s", f->path);
  }
  for (int i = 0; i < f->n; i++) {
    sort_key key = {f->e[i].info.name, f->e[i].begin, f->e[i].end, i};
    k[i] = key;
  }
  qsort(k, (size_t)f->n, sizeof *k, by_name_cmp);
  nt_status st = NT_OK;
  for (int i = 0; i < f->n; i++) {
    f->by_name[i] = k[i].index;
    if (i && !st && !strcmp(k[i].name, k[i - 1].name))
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path,
                    k[i].name);
  }
  qsort(k, (size_t)f->n, sizeof *k, by_offset_cmp);
  uint64_t at = 0;
  for (int i = 0; i < f->n && !st; i++) {
    if (k[i].begin != at)
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' starts at data byte %llu: %s byte %llu",
                    f->path, k[i].name, (unsigned long long)k[i].begin,
                    k[i].begin < at ? "it overlaps the tensor ending at" : "a hole after",
                    (unsigned long long)at);
    at = k[i].end;
  }
  if (!st && at != data_len)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: %llu bytes after the last tensor's data", f->path,
                  (unsigned long long)(data_len - at));
  free(k);
  return st;
}

nt_status nt_safetensors_open(nt_ctx *ctx, const char *path, nt_safetensors **out) {
  *out = NULL;
  nt_safetensors *f = calloc(1, sizeof *f);
  if (!f) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory opening %s", path);
  f->path = strdup(path);
  nt_status st = f->path ? nt_read_file(ctx, path, &f->raw, &f->len)
                         : NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  uint64_t hlen = 0;
  if (!st && f->len < 8)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: %zu bytes, too short for safetensors", path, f->len);
  if (!st) {
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(uint8_t)f->raw[i] << (8 * i);
    if (hlen > f->len - 8)
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes)",
                    path, (unsigned long long)hlen, f->len);
    else if (hlen < 2 || f->raw[8] != '{')
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: the header (%llu bytes) does not start with '{'",
                    path, (unsigned long long)hlen);
  }
  if (!st) st = nt_json_parse(ctx, f->raw + 8, (size_t)hlen, path, &f->header);
  if (!st && f->header.type != NT_JSON_OBJ)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: header is not a JSON object", path);
  f->data_start = 8 + (size_t)hlen;
  if (!st && !(f->e = calloc((size_t)f->header.n + 1, sizeof *f->e)))
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory opening %s", path);
  for (int i = 0; !st && i < f->header.n; i++) {
    const char *key = f->header.keys[i];
    const nt_json *v = &f->header.items[i];
    if (strcmp(key, "__metadata__")) {
      st = parse_entry(ctx, path, key, v, f->len - f->data_start, &f->e[f->n++]);
      continue;
    }
    if (v->type != NT_JSON_OBJ) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: __metadata__ is not an object", path);
    }
    for (int k = 0; !st && k < v->n; k++)
      if (v->items[k].type != NT_JSON_STR)
        st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", path,
                      v->keys[k]);
  }
  if (!st) st = check_layout(ctx, f);
  if (!st && !(f->loaded = calloc((size_t)f->n + 1, sizeof *f->loaded)))
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory opening %s", path);
  if (st) {
    nt_safetensors_close(f);
    return st;
  }
  *out = f;
  return NT_OK;
}

void nt_safetensors_close(nt_safetensors *f) {
  if (!f) return;
  nt_json_free(&f->header);
  free(f->e);
  free(f->by_name);
  free(f->loaded);
  free(f->raw);
  free(f->path);
  free(f);
}

int nt_safetensors_count(const nt_safetensors *f) { return f->n; }

const nt_safetensors_info *nt_safetensors_info_at(const nt_safetensors *f, int i) {
  return i >= 0 && i < f->n ? &f->e[i].info : NULL;
}

/* Index of tensor `name`, or -1 (binary search over the sorted names). */
static int find_index(const nt_safetensors *f, const char *name) {
  int lo = 0, hi = f->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(f->e[f->by_name[mid]].info.name, name);
    if (!c) return f->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

const nt_safetensors_info *nt_safetensors_find(const nt_safetensors *f, const char *name) {
  int i = find_index(f, name);
  return i < 0 ? NULL : &f->e[i].info;
}

bool nt_safetensors_has(const nt_safetensors *f, const char *name) {
  return find_index(f, name) >= 0;
}

const char *nt_safetensors_metadata(const nt_safetensors *f, const char *key) {
  return nt_json_str(nt_json_get(nt_json_get(&f->header, "__metadata__"), key), NULL);
}

bool nt_safetensors_loaded(const nt_safetensors *f, int i) {
  return i >= 0 && i < f->n && f->loaded[i];
}

void nt_safetensors_mark_loaded(nt_safetensors *f, const char *name) {
  int i = find_index(f, name);
  if (i >= 0) f->loaded[i] = true;
}

/* "[a, b, c]" into buf. */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = 0;
  at += (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && at < len; d++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}

/* Element of a file dtype at an address of any alignment, as float. */
static float load_unaligned(const char *p, nt_dtype dt) {
  union {
    float f;
    uint16_t h;
    uint8_t b;
  } u;
  memcpy(&u, p, nt_dtype_size(dt));
  return nt_load_f32(&u, dt, 0);
}

nt_status nt_safetensors_load(nt_ctx *ctx, nt_safetensors *f, const char *name, nt_tensor *dst,
                              const nt_safetensors_load_opts *opts) {
  nt_safetensors_load_opts o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  int idx = find_index(f, name);
  if (idx < 0) return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: no tensor '%s'", f->path, name);
  const st_entry *e = &f->e[idx];
  const nt_safetensors_info *in = &e->info;
  char a[128], b[128], d_str[128];
  nt_dtype sd = in->dtype;
  bool conv = sd != dst->dtype;
  if (sd == NT_DTYPE_COUNT || (conv && !(nt_dtype_is_float(sd) && nt_dtype_is_float(dst->dtype))))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: tensor '%s' is %s, which does not load into %s",
                    f->path, name, in->dtype_name, nt_tensor_describe(dst, a, sizeof a));
  if (!nt_tensor_is_contiguous(dst))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: loading '%s' into a non-contiguous %s", f->path,
                    name, nt_tensor_describe(dst, a, sizeof a));
  /* S: the file tensor as read (transposed if asked) */
  int nd = in->ndim;
  int64_t s[NT_SAFETENSORS_MAX_DIMS];
  memcpy(s, in->shape, sizeof s);
  if (o.transpose) {
    if (nd != 2)
      return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: tensor '%s' %s is not 2-D: it cannot be transposed",
                      f->path, name, shape_str(in->shape, nd, a, sizeof a));
    s[0] = in->shape[1];
    s[1] = in->shape[0];
  }
  if (nd == 0 && (o.row_begin || o.rows || o.pad_rows))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: tensor '%s' is a scalar: it has no rows", f->path,
                    name);
  int64_t total = nd ? s[0] : 1;
  if (o.row_begin < 0 || o.rows < 0 || o.row_begin > total || o.rows > total - o.row_begin)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: rows from %lld (count %lld) are outside tensor '%s' "
                    "%s%s", f->path, (long long)o.row_begin, (long long)o.rows, name,
                    shape_str(s, nd, a, sizeof a), o.transpose ? " (transposed)" : "");
  int64_t rows = o.rows ? o.rows : total - o.row_begin;
  bool fits = dst->ndim == nd && nd <= NT_MAX_DIMS;
  for (int d = 1; fits && d < nd; d++) fits = dst->shape[d] == s[d];
  if (fits && nd) fits = dst->shape[0] == rows || (o.pad_rows && dst->shape[0] > rows);
  if (!fits) {
    int64_t want[NT_SAFETENSORS_MAX_DIMS];
    memcpy(want, s, sizeof want);
    if (nd) want[0] = rows;
    bool same = !o.transpose && (!nd || rows == in->shape[0]);
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: tensor '%s' %s%s%s%s does not fit %s", f->path,
                    name, shape_str(in->shape, nd, a, sizeof a), same ? "" : ", read as ",
                    same ? "" : shape_str(want, nd, b, sizeof b),
                    o.pad_rows ? " (rows padded)" : "",
                    nt_tensor_describe(dst, d_str, sizeof d_str));
  }
  const char *src = f->raw + f->data_start + e->begin;
  size_t esz = nt_dtype_size(sd), dsz = nt_dtype_size(dst->dtype);
  int64_t inner = 1;
  for (int d = 1; d < nd; d++) inner *= s[d];
  nt_status st;
  char *host = NULL;
  if (!conv && !o.transpose && (!nd || dst->shape[0] == rows)) {
    /* the bytes as they are: a view into the file */
    nt_tensor v = nt_tensor_view((void *)(src + (size_t)(o.row_begin * inner) * esz), sd,
                                 nt_cpu(), dst->ndim, dst->shape);
    st = nt_tensor_copy(ctx, dst, &v);
  } else {
    int64_t numel = nt_tensor_numel(dst);
    host = calloc((size_t)(numel ? numel : 1), dsz);
    if (!host) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory loading '%s'", name);
    /* element (r, c) of D is element (row_begin + r, c) of S: file element
     * (row_begin + r) * inner + c, or, transposed (the file is [s[1], s[0]]),
     * c * s[0] + row_begin + r; D's rows from `rows` on stay zero */
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < inner; c++) {
        int64_t fi = o.transpose ? c * s[0] + o.row_begin + r : (o.row_begin + r) * inner + c;
        int64_t di = r * inner + c;
        if (conv) nt_store_f32(host, dst->dtype, di, load_unaligned(src + fi * (int64_t)esz, sd));
        else memcpy(host + di * (int64_t)dsz, src + fi * (int64_t)esz, esz);
      }
    nt_tensor h = nt_tensor_view(host, dst->dtype, nt_cpu(), dst->ndim, dst->shape);
    st = nt_tensor_copy(ctx, dst, &h);
  }
  /* a copy to the GPU reads the host memory (the file's or ours) after it is enqueued: wait
   * for it before either can be freed */
  if (!st && dst->device.type != NT_DEV_CPU) st = nt_ctx_synchronize(ctx);
  free(host);
  if (!st) f->loaded[idx] = true;
  return st;
}

nt_status nt_safetensors_read(nt_ctx *ctx, nt_safetensors *f, const char *name,
                              nt_tensor *dst) {
  const nt_safetensors_info *in = nt_safetensors_find(f, name);
  if (!in) return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: no tensor '%s'", f->path, name);
  bool ok = in->dtype == dst->dtype && in->ndim == dst->ndim;
  for (int k = 0; ok && k < in->ndim; k++) ok = in->shape[k] == dst->shape[k];
  if (!ok) {
    char want[96], have[96];
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' is %s %s, expected %s", f->path, name,
                    in->dtype_name, shape_str(in->shape, in->ndim, have, sizeof have),
                    nt_tensor_describe(dst, want, sizeof want));
  }
  return nt_safetensors_load(ctx, f, name, dst, NULL);
}

/* A list of names for an error message, cut short (with its count kept) past the buffer. */
typedef struct {
  char text[640];
  size_t len;
  int count;
} name_list;

static void list_add(name_list *l, const char *name) {
  if (l->count++ && l->len < sizeof l->text)
    l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, ", ");
  if (l->len < sizeof l->text)
    l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, "%s", name);
  if (l->len >= sizeof l->text) memcpy(l->text + sizeof l->text - 5, " ...", 5);
}

/* The tensors neither loaded nor marked nor in `taken` (may be NULL). */
static nt_status check_extra(nt_ctx *ctx, const nt_safetensors *f, const bool *taken) {
  name_list l = {{0}, 0, 0};
  for (int i = 0; i < f->n; i++)
    if (!f->loaded[i] && !(taken && taken[i])) list_add(&l, f->e[i].info.name);
  if (!l.count) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: %d tensor%s that nothing loads: %s", f->path, l.count,
                  l.count > 1 ? "s" : "", l.text);
}

nt_status nt_safetensors_check_all_loaded(nt_ctx *ctx, const nt_safetensors *f) {
  return check_extra(ctx, f, NULL);
}

nt_status nt_safetensors_load_params(nt_ctx *ctx, nt_safetensors *f, nt_params *p,
                                     const nt_safetensors_params_opts *opts) {
  if (!p->allocated)
    return NT_ERROR(ctx, NT_ERR_STATE, "%s: loading into parameters that are not allocated",
                    f->path);
  int n = 0;
  for (int u = 0; u < p->n_units; u++) n += p->units[u].n_params;
  /* per parameter: the file's tensor index (-1: the map skips it) and its options */
  int *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
  nt_safetensors_load_opts *lo = calloc((size_t)(n ? n : 1), sizeof *lo);
  bool *taken = calloc((size_t)f->n + 1, sizeof *taken);
  nt_status st = NT_OK;
  if (!idx || !lo || !taken) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory loading %s",
                                           f->path);
  name_list missing = {{0}, 0, 0};
  for (int u = 0, k = 0; u < p->n_units && !st; u++)
    for (int i = 0; i < p->units[u].n_params; i++, k++) {
      const char *pname = p->units[u].params[i].name;
      char name[256];
      snprintf(name, sizeof name, "%s", pname);
      idx[k] = -1;
      if (opts && opts->map && !opts->map(opts->arg, pname, name, sizeof name, &lo[k])) continue;
      idx[k] = find_index(f, name);
      if (idx[k] < 0) list_add(&missing, name);
      else taken[idx[k]] = true;
    }
  if (!st && missing.count)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: %d tensor%s missing: %s", f->path, missing.count,
                  missing.count > 1 ? "s" : "", missing.text);
  if (!st && !(opts && opts->allow_extra)) st = check_extra(ctx, f, taken);
  for (int u = 0, k = 0; u < p->n_units && !st; u++)
    for (int i = 0; i < p->units[u].n_params && !st; i++, k++) {
      if (idx[k] < 0) continue;
      nt_tensor dst = nt_params_view(p, u, i, NT_VIEW_MASTER);
      st = nt_safetensors_load(ctx, f, f->e[idx[k]].info.name, &dst, &lo[k]);
    }
  if (!st) st = nt_params_sync_compute(ctx, p);
  free(idx);
  free(lo);
  free(taken);
  return st;
}
