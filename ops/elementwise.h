/* Elementwise ops: GELU (tanh form, as GPT-2 and torch's approximate='tanh'), ReLU, residual
 * add, scaling. Any float dtype (F32, F16, BF16), all tensors of one call in the same dtype and
 * shape, contiguous; math in fp32; outputs rounded to their dtype. Backward accumulates (+=)
 * into the input gradient. */
#ifndef NT_OPS_ELEMENTWISE_H
#define NT_OPS_ELEMENTWISE_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_gelu_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y);
nt_status nt_gelu_backward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *dy, nt_tensor *dx);
nt_status nt_relu_forward(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y);
/* y is the forward output (relu' = y > 0). */
nt_status nt_relu_backward(nt_ctx *ctx, const nt_tensor *y, const nt_tensor *dy, nt_tensor *dx);
/* out = a + b (out may alias a or b). Its backward is the identity: the caller adds dout to
 * both inputs' gradients with nt_axpy(ctx, 1, dout, da). */
nt_status nt_add(nt_ctx *ctx, const nt_tensor *a, const nt_tensor *b, nt_tensor *out);
/* y += alpha * x */
nt_status nt_axpy(nt_ctx *ctx, float alpha, const nt_tensor *x, nt_tensor *y);
/* x *= alpha */
nt_status nt_scale(nt_ctx *ctx, float alpha, nt_tensor *x);

NT_EXTERN_C_END
#endif
