/* Conv2d as torch.nn.Conv2d (NCHW, groups 1, dilation 1; channels-last tensors and the CNN's
 * tensor-core kernels: ops/conv2d_nhwc.h): x [N, Cin, H, W], w [Cout, Cin, KH, KW], b [Cout]
 * or NULL, y [N, Cout, OH, OW], OH = (H + 2*pad - KH) / stride + 1 (same for OW).
 * x, w, y, dy, dx share one dtype (F32, F16, BF16); b, db and dw are that dtype or F32 (an F32
 * dw takes the fp32 weight gradient directly: no compute-dtype copy to add). All tensors
 * contiguous. CPU: direct loops (fp64 sums); CUDA: im2col in the compute dtype (K = Cin*KH*KW
 * padded to a multiple of 8) + one cuBLASLt GEMM per product (fp32 accumulation, written once
 * in the output dtype; F32 uses TF32 when the context allows it); the bias rides in the GEMM
 * as an extra column of ones (on the GPU a b of F32 is rounded to the compute dtype first).
 * Backward accumulates (+=) into dx, dw, db (each may be NULL). Scratch from the context's
 * pool per call, bounded whatever the batch: the GPU works through the batch in chunks of
 * images (about 8 MiB of scratch or 16k output positions each, at most 16 MiB; see
 * ops/conv2d_internal.h) with the same results; the context option conv_l2_mb = m (m > 0)
 * bounds each chunk's scratch to m MiB instead, m = 0 takes the whole batch at once (im2col
 * of N*OH*OW x Cin*KH*KW elements). Backward with stride 1 computes dx as a conv of dy with
 * the flipped weight, added into dx by the GEMM; other strides go through an fp32 col2im
 * buffer.
 *
 * Flatten ([N, C, H, W] -> [N, C*H*W]) is not an op: it is a view, nt_tensor_reshape, and its
 * backward is the same reshape of the gradient. */
#ifndef NT_OPS_CONV2D_H
#define NT_OPS_CONV2D_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct { int stride, pad; } nt_conv2d_params;

nt_status nt_conv2d_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                            const nt_tensor *b, nt_tensor *y, nt_conv2d_params p);
/* y = relu(conv2d(x, w) + b): ReLU fused into the GEMM's epilogue on the GPU. Backward:
 * nt_conv2d_relu_backward (or nt_relu_backward from y, then nt_conv2d_backward). */
nt_status nt_conv2d_relu_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p);
nt_status nt_conv2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                             nt_conv2d_params p);
/* Backward of y = relu(conv2d(x, w) + b) given y and dy = dL/dy: as nt_conv2d_backward of
 * relu'(y) * dy (relu' = y > 0), with the mask applied while the GPU permutes / unfolds dy
 * (no dz buffer, no separate ReLU backward pass). Accumulates into dx, dw, db. */
nt_status nt_conv2d_relu_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  nt_tensor *dw, nt_tensor *db, nt_conv2d_params p);
/* MaxPool2d (kernel k, stride k, no padding, floor): y [N, C, H/k, W/k]; argmax I32 (same shape
 * as y) keeps the index (ih * W + iw) of each maximum within its input plane for backward. The
 * first maximum of a window wins; NaN counts as the maximum (as torch). Backward accumulates
 * dy into dx at those indices. F32, F16, BF16. */
nt_status nt_maxpool2d_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, nt_tensor *argmax,
                               int k);
nt_status nt_maxpool2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                nt_tensor *dx);

NT_EXTERN_C_END
#endif
