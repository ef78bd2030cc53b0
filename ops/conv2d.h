/* Conv2d as torch.nn.Conv2d (NCHW, groups 1, dilation 1): x [N, Cin, H, W], w [Cout, Cin, KH,
 * KW], b [Cout] or NULL, y [N, Cout, OH, OW], OH = (H + 2*pad - KH) / stride + 1 (same for OW).
 * x, w, y, dy, dx, dw share one dtype (F32, F16, BF16); b and db are that dtype or F32.
 * All tensors contiguous. CPU: direct loops (fp64 sums); CUDA: im2col + cuBLASLt GEMM (fp32
 * accumulation; F32 uses TF32 when the context allows it). Backward accumulates (+=) into
 * dx, dw, db (each may be NULL). Scratch: the CUDA path takes (Cin*KH*KW + Cout) * N*OH*OW
 * elements from the context's pool per call.
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
nt_status nt_conv2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                             nt_conv2d_params p);
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
