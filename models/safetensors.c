#include "models/safetensors.h"
#include "models/json.h"
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const st_names[NT_DTYPE_COUNT] = {
    [NT_F32] = "F32",         [NT_F16] = "F16",         [NT_BF16] = "BF16",
    [NT_FP8_E4M3] = "F8_E4M3", [NT_FP8_E5M2] = "F8_E5M2", [NT_I32] = "I32",
    [NT_I64] = "I64",         [NT_U8] = "U8"};

const char *nt_safetensors_dtype_name(nt_dtype dt) {
  return (unsigned)dt < NT_DTYPE_COUNT ? st_names[dt] : NULL;
}

static bool parse_dtype(const char *s, nt_dtype *out) {
  for (int i = 0; i < NT_DTYPE_COUNT; i++)
    if (st_names[i] && !strcmp(st_names[i], s)) {
      *out = (nt_dtype)i;
      return true;
    }
  return false;
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

static void fsync_dir(const char *path) {
  char *copy = strdup(path);
  if (!copy) return;
  int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(copy);
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
  else fsync_dir(path);
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

nt_status nt_safetensors_save(nt_ctx *ctx, const char *path, const nt_named_tensor *ts, int n,
                              const char *const *metadata) {
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
    const char *dn = nt_safetensors_dtype_name(t->dtype);
    if (!dn || !nt_tensor_is_contiguous(t)) {
      free(nt_jw_finish(&w));
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tensor '%s' is not contiguous or has dtype %s",
                      path, ts[i].name, nt_dtype_name(t->dtype));
    }
    size_t bytes = nt_tensor_nbytes(t);
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
  }
  nt_jw_end(&w, '}');
  /* pad the header with spaces to a multiple of 8, as the reference writer does */
  while (w.len % 8) nt_jw_printf(&w, " ");
  size_t hlen = w.len;
  char *header = nt_jw_finish(&w);
  if (!header) return NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory for the header", path);
  char tmp[4096];
  int fd = -1;
  void *host = NULL;
  nt_status st = open_tmp(ctx, path, tmp, sizeof tmp, &fd);
  if (st) {
    free(header);
    return st;
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  st = write_all(ctx, fd, len8, 8, tmp);
  if (!st) st = write_all(ctx, fd, header, hlen, tmp);
  if (!st && !(host = malloc(maxbytes ? maxbytes : 1)))
    st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of host memory for a %zu-byte tensor", path, maxbytes);
  for (int i = 0; i < n && !st; i++) {
    const nt_tensor *t = &ts[i].t;
    const void *src = t->data;
    if (t->device.type != NT_DEV_CPU) {
      nt_tensor h = nt_tensor_view(host, t->dtype, nt_cpu(), t->ndim, t->shape);
      st = nt_tensor_copy(ctx, &h, t);
      src = host;
    }
    if (!st) st = write_all(ctx, fd, src, nt_tensor_nbytes(t), tmp);
  }
  free(host);
  free(header);
  return finish_atomic(ctx, fd, tmp, path, st);
}

struct nt_safetensors {
  char *path;
  char *raw;            /* the whole file */
  size_t len;
  size_t data_start;
  nt_json header;
};

nt_status nt_safetensors_open(nt_ctx *ctx, const char *path, nt_safetensors **out) {
  *out = NULL;
  nt_safetensors *f = calloc(1, sizeof *f);
  if (!f) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory opening %s", path);
  f->path = strdup(path);
  nt_status st = f->path ? nt_read_file(ctx, path, &f->raw, &f->len)
                         : NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  uint64_t hlen = 0;
  if (!st && f->len < 8) st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: too short for safetensors", path);
  if (!st) {
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(uint8_t)f->raw[i] << (8 * i);
    if (hlen > f->len - 8)
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes)",
                    path, (unsigned long long)hlen, f->len);
  }
  if (!st) st = nt_json_parse(ctx, f->raw + 8, (size_t)hlen, path, &f->header);
  if (!st && f->header.type != NT_JSON_OBJ)
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: header is not a JSON object", path);
  f->data_start = 8 + (size_t)hlen;
  /* validate every entry so reads can trust it */
  for (int i = 0; !st && i < f->header.n; i++) {
    if (!strcmp(f->header.keys[i], "__metadata__")) continue;
    const nt_json *e = &f->header.items[i];
    const nt_json *dt = nt_json_get(e, "dtype"), *sh = nt_json_get(e, "shape");
    const nt_json *of = nt_json_get(e, "data_offsets");
    nt_dtype d;
    if (!dt || !sh || !of || sh->type != NT_JSON_ARR || of->type != NT_JSON_ARR || of->n != 2 ||
        !parse_dtype(nt_json_str(dt, ""), &d)) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: bad header entry for '%s'", path, f->header.keys[i]);
      break;
    }
    /* offsets and dims: plain non-negative integers; the element count must not overflow */
    uint64_t b = 0, en = 0, numel = 1;
    bool ok = !nt_json_uint_in(ctx, &of->items[0], "data_offsets[0]", 0, INT64_MAX, &b) &&
              !nt_json_uint_in(ctx, &of->items[1], "data_offsets[1]", 0, INT64_MAX, &en);
    const char *why = ok ? "element count overflows" : "";
    for (int k = 0; ok && k < sh->n; k++) {
      uint64_t dim = 0;
      ok = !nt_json_uint_in(ctx, &sh->items[k], "shape", 0, INT64_MAX, &dim);
      if (!ok) why = "";
      ok = ok && (dim == 0 || numel <= (uint64_t)INT64_MAX / 8 / dim);
      numel *= dim;
    }
    if (!ok) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' has a bad shape or offsets (%s)", path,
                    f->header.keys[i], *why ? why : nt_last_error(ctx));
      break;
    }
    if (en < b || en > f->len - f->data_start || en - b != numel * nt_dtype_size(d))
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' offsets [%llu, %llu) do not fit",
                    path, f->header.keys[i], (unsigned long long)b, (unsigned long long)en);
  }
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
  free(f->raw);
  free(f->path);
  free(f);
}

bool nt_safetensors_has(const nt_safetensors *f, const char *name) {
  return nt_json_get(&f->header, name) != NULL;
}

const char *nt_safetensors_metadata(const nt_safetensors *f, const char *key) {
  return nt_json_str(nt_json_get(nt_json_get(&f->header, "__metadata__"), key), NULL);
}

nt_status nt_safetensors_read(nt_ctx *ctx, const nt_safetensors *f, const char *name,
                              nt_tensor *dst) {
  const nt_json *e = nt_json_get(&f->header, name);
  if (!e) return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: no tensor '%s'", f->path, name);
  nt_dtype d = NT_F32;
  parse_dtype(nt_json_str(nt_json_get(e, "dtype"), ""), &d);
  const nt_json *sh = nt_json_get(e, "shape");
  bool ok = d == dst->dtype && sh->n == dst->ndim;
  for (int k = 0; ok && k < sh->n; k++) ok = nt_json_i64(&sh->items[k], -1) == dst->shape[k];
  if (!ok) {
    char want[96];
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: tensor '%s' is %s with %d dims, expected %s",
                    f->path, name, nt_json_str(nt_json_get(e, "dtype"), "?"), sh->n,
                    nt_tensor_describe(dst, want, sizeof want));
  }
  const nt_json *of = nt_json_get(e, "data_offsets");
  size_t b = (size_t)nt_json_u64(&of->items[0], 0);
  nt_tensor src = nt_tensor_view(f->raw + f->data_start + b, d, nt_cpu(), dst->ndim, dst->shape);
  return nt_tensor_copy(ctx, dst, &src);
}
