/* Private to ops/conv2d_nhwc.cu and ops/conv2d_nhwc_direct.cu: the direct (one thread or one
 * block per output element) NHWC kernels, for F32 and for what the tensor-core kernels do not
 * take (dx with stride != 1 or pad >= kernel size, db without dw). Same contract as
 * ops/conv2d_nhwc.h: dx is overwritten, dw and db (either may be NULL) accumulate; sums in fp32
 * in a fixed order. */
#ifndef NT_OPS_CONV2D_NHWC_CUDA_CUH
#define NT_OPS_CONV2D_NHWC_CUDA_CUH
#include "ops/conv2d_nhwc.h"

/* F32 only (F16 / BF16 forwards all run on tensor cores). */
nt_status nt_conv2d_nhwc_forward_direct(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                        const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                        bool relu);
nt_status nt_conv2d_nhwc_dgrad_direct(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                      const nt_tensor *w, nt_tensor *dx, const nt_tensor *dx_mask,
                                      nt_conv2d_params p);
nt_status nt_conv2d_nhwc_wgrad_direct(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                      const nt_tensor *x, nt_tensor *dw, nt_tensor *db,
                                      nt_conv2d_params p);

#endif
