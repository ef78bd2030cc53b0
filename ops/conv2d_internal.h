/* Conv2d internals shared by ops/conv2d.c and ops/conv2d.cu (and tested on the CPU). */
#ifndef NT_OPS_CONV2D_INTERNAL_H
#define NT_OPS_CONV2D_INTERNAL_H
#include <stdint.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

/* The CUDA path works through a batch in chunks of images so that its scratch (im2col columns,
 * the permuted dy) stays bounded instead of growing with the batch. A chunk takes as many
 * images as fit in NT_CONV_CHUNK_BYTES of scratch, but at least enough for NT_CONV_CHUNK_ROWS
 * GEMM rows (output positions: fewer leave an H200's SMs idle), and never more than
 * NT_CONV_CHUNK_MAX_BYTES; the batch is then split into that many chunks of equal size (the
 * last one may be shorter), so no chunk is larger than it needs to be. */
#define NT_CONV_CHUNK_BYTES ((double)(8 << 20))
#define NT_CONV_CHUNK_ROWS 16384
#define NT_CONV_CHUNK_MAX_BYTES ((double)(16 << 20))

/* Images per chunk for a batch of n images, each adding `rows` GEMM rows and `bytes` of
 * scratch. l2_mb (the context option conv_l2_mb) < 0: the default above; l2_mb > 0 bounds a
 * chunk's scratch to that many MiB (down to one image per chunk); 0 takes the whole batch in
 * one chunk (no bound). Always in 1..n (1 when n < 1). */
int nt_conv2d_chunk_images(int n, int64_t rows, double bytes, double l2_mb);

NT_EXTERN_C_END
#endif
