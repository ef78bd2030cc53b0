#include "data/idx.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t be32(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Reads exactly n bytes; a short read is truncation, a negative one an I/O error. */
static nt_status read_exact(nt_ctx *ctx, gzFile f, const char *path, void *dst, size_t n,
                            const char *what) {
  unsigned char *p = dst;
  while (n > 0) {
    unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
    int got = gzread(f, p, chunk);
    if (got < 0) {
      int zerr = 0;
      const char *msg = gzerror(f, &zerr);
      return NT_ERROR(ctx, NT_ERR_FORMAT,
                      "%s: truncated or corrupt file while reading the %s: %s", path, what, msg);
    }
    if (got == 0)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: truncated file: %zu bytes missing from the %s",
                      path, n, what);
    p += got;
    n -= (size_t)got;
  }
  return NT_OK;
}

nt_status nt_idx_read(nt_ctx *ctx, const char *path, int expect_ndim, nt_idx *out) {
  memset(out, 0, sizeof *out);
  gzFile f = gzopen(path, "rb");
  if (!f)
    return NT_ERROR(ctx, NT_ERR_IO, "%s: cannot open the IDX file: %s", path,
                    errno ? strerror(errno) : "gzopen failed");
  nt_status st;
  unsigned char head[4 + 4 * NT_IDX_MAX_DIMS];
  if ((st = read_exact(ctx, f, path, head, 4, "header"))) goto fail;
  uint32_t magic = be32(head);
  int ndim = head[3];
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || ndim < 1 || ndim > NT_IDX_MAX_DIMS ||
      (expect_ndim > 0 && ndim != expect_ndim)) {
    st = expect_ndim > 0
             ? NT_ERROR(ctx, NT_ERR_FORMAT,
                        "%s: wrong magic 0x%08x (expected 0x%08x: unsigned-byte IDX with %d dims)",
                        path, magic, 0x800u + (unsigned)expect_ndim, expect_ndim)
             : NT_ERROR(ctx, NT_ERR_FORMAT,
                        "%s: wrong magic 0x%08x (expected 0x0000080N: unsigned-byte IDX)", path,
                        magic);
    goto fail;
  }
  if ((st = read_exact(ctx, f, path, head + 4, 4 * (size_t)ndim, "header dims"))) goto fail;
  out->ndim = ndim;
  out->numel = 1;
  for (int d = 0; d < ndim; d++) {
    out->dims[d] = be32(head + 4 + 4 * d);
    /* Dims come from an untrusted file: cap the product well below SIZE_MAX. */
    if (out->dims[d] > 0 && out->numel > ((int64_t)1 << 40) / out->dims[d]) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: dims too large", path);
      goto fail;
    }
    out->numel *= out->dims[d];
  }
  if (out->dims[0] == 0 || out->numel == 0) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: empty dataset (zero items)", path);
    goto fail;
  }
  /* The header's size is untrusted (and a gzip stream's length unknown before reading): the
   * buffer grows with the data that actually arrives, so a short file claiming terabytes
   * fails as truncated instead of allocating them. */
  size_t want = (size_t)out->numel, have = 0, cap = 0;
  while (have < want) {
    if (have == cap) {
      size_t grown = cap ? (cap > want / 2 ? want : 2 * cap) : (want < (1u << 20) ? want : 1u << 20);
      unsigned char *p = realloc(out->data, grown);
      if (!p) {
        st = NT_ERROR(ctx, NT_ERR_OOM, "%s: out of memory for %zu bytes", path, grown);
        goto fail;
      }
      out->data = p;
      cap = grown;
    }
    if ((st = read_exact(ctx, f, path, out->data + have, cap - have, "data"))) {
      if (st == NT_ERR_FORMAT && strstr(nt_last_error(ctx), "bytes missing"))
        st = NT_ERROR(ctx, NT_ERR_FORMAT,
                      "%s: truncated file: the header declares %zu data bytes, fewer are present",
                      path, want);
      goto fail;
    }
    have = cap;
  }
  gzclose(f);
  return NT_OK;
fail:
  gzclose(f);
  nt_idx_free(out);
  return st;
}

void nt_idx_free(nt_idx *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

nt_status nt_image_set_load(nt_ctx *ctx, const char *images_path, const char *labels_path,
                            int num_classes, nt_image_set *out) {
  memset(out, 0, sizeof *out);
  if (num_classes < 1 || num_classes > 256)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "num_classes %d must be in 1..256", num_classes);
  nt_idx labels = {0};
  nt_status st = nt_idx_read(ctx, images_path, 3, &out->images);
  if (st) goto fail;
  if ((st = nt_idx_read(ctx, labels_path, 1, &labels))) goto fail;
  if (labels.dims[0] != out->images.dims[0]) {
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s has %lld labels but %s has %lld images", labels_path,
                  (long long)labels.dims[0], images_path, (long long)out->images.dims[0]);
    goto fail;
  }
  out->n = out->images.dims[0];
  out->h = out->images.dims[1];
  out->w = out->images.dims[2];
  out->num_classes = num_classes;
  out->labels = malloc((size_t)out->n * sizeof *out->labels);
  if (!out->labels) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of memory for %lld labels", (long long)out->n);
    goto fail;
  }
  for (int64_t i = 0; i < out->n; i++) {
    if (labels.data[i] >= num_classes) {
      st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: label %d at index %lld is out of range [0, %d)",
                    labels_path, labels.data[i], (long long)i, num_classes);
      goto fail;
    }
    out->labels[i] = labels.data[i];
  }
  nt_idx_free(&labels);
  return NT_OK;
fail:
  nt_idx_free(&labels);
  nt_image_set_free(out);
  return st;
}

void nt_image_set_free(nt_image_set *s) {
  if (!s) return;
  nt_idx_free(&s->images);
  free(s->labels);
  memset(s, 0, sizeof *s);
}

nt_tensor nt_image_set_images(const nt_image_set *s) {
  int64_t shape[3] = {s->n, s->h, s->w};
  return nt_tensor_view(s->images.data, NT_U8, nt_cpu(), 3, shape);
}

nt_tensor nt_image_set_labels(const nt_image_set *s) {
  int64_t shape[1] = {s->n};
  return nt_tensor_view(s->labels, NT_I32, nt_cpu(), 1, shape);
}

nt_status nt_fashion_mnist_load(nt_ctx *ctx, const char *dir, bool train, nt_image_set *out) {
  if (!dir) dir = NT_FASHION_DEFAULT_DIR;
  const char *split = train ? "train" : "t10k";
  char img[4096], lab[4096];
  snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", dir, split);
  snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", dir, split);
  return nt_image_set_load(ctx, img, lab, 10, out);
}
