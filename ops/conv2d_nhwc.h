/* Conv2d and MaxPool2d in channels-last (NHWC) layout, the CNN's layout.
 *
 * Conv2d as torch.nn.Conv2d on a channels_last tensor (groups 1, dilation 1):
 *   x [N, H, W, Cin], w [Cout, Cin, KH, KW] (PyTorch's weight layout, so checkpoints are
 *   unchanged), b [Cout] or NULL, y [N, OH, OW, Cout], OH = (H + 2*pad - KH) / stride + 1.
 * x, w, y, dy, dx share one dtype (F32, F16, BF16); b and db are that dtype or F32; dw is that
 * dtype or F32. relu: y = relu(conv + b) (forward); relu_y (backward, or NULL): the forward's
 * ReLU output, dy counts only where relu_y > 0 (the mask is applied as dy is read); dx_mask
 * (backward, or NULL; x's shape and dtype): dx is written only where dx_mask > 0, 0 elsewhere
 * (pass x when x is a ReLU's output: dx is then the gradient of that ReLU's input, the mask
 * applied as dx is written, so the next backward needs no relu_y).
 * Backward OVERWRITES dx (an activation gradient: no zeroing needed) and ACCUMULATES (+=) into
 * dw and db (parameter gradients); each may be NULL. Outputs share no memory with the inputs or
 * with each other: y none with x, w, b; dx, dw, db none with dy, relu_y, x, w, dx_mask
 * (NT_ERR_INVALID_ARG otherwise).
 * CPU: direct loops (fp64 sums). CUDA, F16 / BF16: implicit GEMM on tensor cores (ops/
 * conv2d_nhwc.cu: mma.sync m16n8k16, fp32 accumulation, no im2col buffer); the weight gradient
 * reduces its split-K partials in a fixed order (bit-identical run to run). Forward and dw take
 * any stride and pad there; dx needs stride 1 and pad < kernel size: other dx, and db without
 * dw, run in direct kernels (ops/conv2d_nhwc_direct.cu: correct, not fast), as all of F32 on
 * CUDA does. */
#ifndef NT_OPS_CONV2D_NHWC_H
#define NT_OPS_CONV2D_NHWC_H
#include "core/nt.h"
#include "ops/conv2d.h"
NT_EXTERN_C_BEGIN

nt_status nt_conv2d_nhwc_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                 bool relu);
nt_status nt_conv2d_nhwc_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                                  nt_conv2d_params p);

/* y = maxpool2d(conv2d(x, w) + b [, ReLU], kernel 2) without storing the conv's output: the
 * same y and argmax as nt_conv2d_nhwc_forward followed by nt_maxpool2d_nhwc_forward(k = 2,
 * y_nchw) (the conv's output rounded to the dtype before the max; argmax indexes the conv's
 * output plane). CUDA F16 / BF16: one kernel (the pool in the GEMM's epilogue); elsewhere the
 * two ops through `scratch` (contiguous, x's dtype, at least N*OH*OW*Cout elements; NULL:
 * allocated per call). y, argmax and the part of scratch used share no memory with x, w, b or
 * each other (NT_ERR_INVALID_ARG). The CUDA kernel numbers its GEMM rows, 4*N*(OH/2)*(OW/2),
 * in int: past 2e9 of them, NT_ERR_UNSUPPORTED. Backward: nt_maxpool2d_nhwc_backward with the
 * mask y (for the ReLU), then nt_conv2d_nhwc_backward. */
nt_status nt_conv2d_nhwc_pool_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                      const nt_tensor *b, nt_tensor *y, nt_tensor *argmax,
                                      nt_conv2d_params p, bool relu, bool y_nchw,
                                      nt_tensor *scratch);

/* MaxPool2d (kernel k, stride k, no padding, floor) of x [N, H, W, C]. y and argmax (I32) are
 * [N, H/k, W/k, C], or [N, C, H/k, W/k] when y_nchw (the CNN's last pool writes PyTorch's
 * flatten order for fc1). argmax holds ih * W + iw of each window's maximum within its channel
 * plane; the first maximum wins, a NaN is the maximum (as torch).
 * Backward OVERWRITES dx [N, H, W, C]: dy at each argmax, 0 elsewhere; with mask (or NULL;
 * the shape of dy) dy counts only where mask > 0 (pass the pool's y when it pools a ReLU
 * output that is not kept: relu' there is y > 0). F32, F16, BF16. */
nt_status nt_maxpool2d_nhwc_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y,
                                    nt_tensor *argmax, int k, bool y_nchw);
nt_status nt_maxpool2d_nhwc_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *argmax,
                                     const nt_tensor *mask, nt_tensor *dx, int k, bool y_nchw);

NT_EXTERN_C_END
#endif
