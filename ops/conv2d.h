/* Conv2d as torch.nn.Conv2d (NCHW, groups 1, dilation 1): x [N, Cin, H, W], w [Cout, Cin, KH,
 * KW], b [Cout] or NULL, y [N, Cout, OH, OW], OH = (H + 2*pad - KH) / stride + 1. Implicit
 * GEMM or im2col + GEMM. Backward accumulates dx, dw, db (each may be NULL). */
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
/* MaxPool2d (kernel k, stride k, no padding): y [N, C, H/k, W/k]; argmax I32 (same shape as
 * y) keeps the index of each maximum within the input plane for backward. */
nt_status nt_maxpool2d_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, nt_tensor *argmax,
                               int k);
nt_status nt_maxpool2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                nt_tensor *dx);

NT_EXTERN_C_END
#endif
