/* IDX files (the MNIST / Fashion-MNIST format): a big-endian header (two zero bytes, a type
 * byte, the number of dims) then big-endian dims and the raw data. Files may be gzip
 * compressed or plain (zlib's gzread reads both). Only unsigned-byte data (type 0x08) is
 * supported: magic 0x00000801 for label files, 0x00000803 for image files. */
#ifndef NT_DATA_IDX_H
#define NT_DATA_IDX_H
#include <stdint.h>
#include "core/ctx.h"
#include "core/tensor.h"
NT_EXTERN_C_BEGIN

#define NT_IDX_MAX_DIMS 4

/* An IDX array of unsigned bytes, row-major: dims[0] items of dims[1] * ... bytes each. */
typedef struct {
  uint8_t *data;
  int ndim;
  int64_t dims[NT_IDX_MAX_DIMS];
  int64_t numel;
} nt_idx;

/* Reads `path` (gzip or plain). `expect_ndim` (1 for labels, 3 for images; 0 accepts any)
 * is checked against the magic. Errors: NT_ERR_IO (missing or unreadable file),
 * NT_ERR_FORMAT (wrong magic, a truncated header or data, zero items). */
nt_status nt_idx_read(nt_ctx *ctx, const char *path, int expect_ndim, nt_idx *out);
void nt_idx_free(nt_idx *a);                      /* NULL or zeroed is a no-op */

/* A labelled image set: images U8 [n, h, w] and labels as I32 in [0, num_classes). */
typedef struct {
  nt_idx images;
  int32_t *labels;
  int64_t n, h, w;
  int num_classes;
} nt_image_set;

/* Reads an image file and its label file; checks that the counts agree and every label is
 * below num_classes (an out-of-range label is NT_ERR_FORMAT naming the file and index). */
nt_status nt_image_set_load(nt_ctx *ctx, const char *images_path, const char *labels_path,
                            int num_classes, nt_image_set *out);
void nt_image_set_free(nt_image_set *s);
/* CPU views: images U8 [n, h, w], labels I32 [n]. */
nt_tensor nt_image_set_images(const nt_image_set *s);
nt_tensor nt_image_set_labels(const nt_image_set *s);

/* Fashion-MNIST from `dir` ({train,t10k}-{images-idx3,labels-idx1}-ubyte.gz): dir NULL means
 * NT_FASHION_DEFAULT_DIR (the programs take dir from --data-dir or NT_FASHION_DIR). 60000
 * train / 10000 test images, 28x28, 10 classes. */
#define NT_FASHION_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
nt_status nt_fashion_mnist_load(nt_ctx *ctx, const char *dir, bool train, nt_image_set *out);

NT_EXTERN_C_END
#endif
