/* Conv2d internals shared by ops/conv2d.c, ops/conv2d.cu and ops/conv2d_nhwc.c (and tested on
 * the CPU). */
#ifndef NT_OPS_CONV2D_INTERNAL_H
#define NT_OPS_CONV2D_INTERNAL_H
#include <stdbool.h>
#include <stdint.h>
#include "core/nt.h"
#include "ops/conv2d.h"
NT_EXTERN_C_BEGIN

typedef struct { int64_t N, Cin, H, W, Cout, KH, KW, OH, OW; } nt_conv_dims;

/* The checks every conv entry point makes on x, w and y (or dy): float dtypes, 4-D contiguous
 * on ctx's device, stride >= 1, pad >= 0, the kernel inside the padded input, y's shape; x
 * [N, Cin, H, W] and y [N, Cout, OH, OW], or with nhwc x [N, H, W, Cin] and y [N, OH, OW,
 * Cout]. Fills d. */
nt_status nt_conv2d_check(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                          const nt_tensor *y, nt_conv2d_params p, bool nhwc, nt_conv_dims *d,
                          const char *what);
/* t: `ndim` dims, on ctx's device, of dtype dt, contiguous. */
nt_status nt_conv2d_check_t(nt_ctx *ctx, const nt_tensor *t, int ndim, nt_dtype dt,
                            const char *what);
/* A bias or its gradient: [cout], of the input dtype dt or F32. */
nt_status nt_conv2d_check_bias(nt_ctx *ctx, const nt_tensor *b, nt_dtype dt, int64_t cout,
                               const char *what);

/* A tensor argument and its name for messages; t may be NULL (an argument not given). */
typedef struct { const nt_tensor *t; const char *name; } nt_conv_arg;
/* NT_ERR_INVALID_ARG naming the pair when an output shares memory with one of the inputs or
 * with an earlier output (NULL tensors are skipped). All must be contiguous (checked before). */
nt_status nt_conv2d_check_apart(nt_ctx *ctx, const nt_conv_arg *outs, int n_out,
                                const nt_conv_arg *ins, int n_in, const char *what);

/* A host copy of t's elements as fp32 (malloc; NULL when out of memory). */
float *nt_conv2d_widen(const nt_tensor *t);

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
