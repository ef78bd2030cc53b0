/* Linear layer as torch.nn.Linear: y[.., out] = x[.., in] @ W^T + b, W is [out, in].
 * x and y may have any leading dims (flattened to rows; with more than 2 dims they must be
 * contiguous). Backward accumulates (+=) into dx, dW and db (each may be NULL to skip);
 * nt_linear_backward_ex can overwrite dx instead and fuse a preceding GELU's backward.
 * Built on nt_gemm (ops/gemm.h), whose dtype rules apply: x, W and dy share one dtype; y, dx
 * and dW are that dtype or F32; b is F32 or y's dtype. The forward fuses bias, activation and
 * (optionally) a residual into the GEMM's epilogue; the backward's bias gradient is an F32 db's
 * column sums of dy (nt_gemm_bias_grad: one read of dy, an order fixed for a given GPU), or,
 * for a db in another dtype, a GEMM against a vector of ones. */
#ifndef NT_OPS_LINEAR_H
#define NT_OPS_LINEAR_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum { NT_ACT_NONE = 0, NT_ACT_GELU, NT_ACT_RELU } nt_activation;

/* act GELU: y = gelu(x W^T + b) and `pre` (same shape as y) keeps the pre-activation for
 * backward; act RELU: y = relu(..) (pre unused: relu' is read off y). */
nt_status nt_linear_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                            const nt_tensor *b, nt_tensor *y, nt_activation act, nt_tensor *pre);
/* Options of nt_linear_forward_ex; all zero (or NULL options) is nt_linear_forward. */
typedef struct {
  /* y = act(x W^T + b + residual): a tensor of y's shape, strides and dtype added in the
   * GEMM (its C operand: one launch, one rounding), e.g. a transformer block's residual
   * stream. It may be y itself (in-place accumulation). */
  const nt_tensor *residual;
} nt_linear_fwd_opts;

nt_status nt_linear_forward_ex(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                               const nt_tensor *b, nt_tensor *y, nt_activation act,
                               nt_tensor *pre, const nt_linear_fwd_opts *opts);

/* dy is the gradient of the layer's output before any activation (apply nt_gelu_backward /
 * nt_relu_backward first, or fuse with act). */
nt_status nt_linear_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db);

/* Options of nt_linear_backward_ex; all zero (or NULL options) is nt_linear_backward. They
 * concern dx only: dW and db always accumulate (+=), as parameter gradients must. */
typedef struct {
  /* dx = dy W: the GEMM writes dx without reading it (beta 0; stale contents, NaN included,
   * do not matter), which spares zeroing a scratch buffer before an accumulating call. */
  bool overwrite_dx;
  /* The layer's input was x = gelu_tanh(x_pre) (e.g. an MLP's second linear layer): dx
   * receives the gradient of x_pre instead, dx = (dy W) * gelu_tanh'(x_pre), the GELU
   * backward fused into the dx GEMM's epilogue (NT_EPI_DGELU): no separate pass and no
   * buffer for the gradient of x. x_pre has x's shape and dx's dtype (contiguous when more
   * than 2-D); it must not alias dx. Needs overwrite_dx (the epilogue scales the whole
   * product, so it cannot add to what dx held). x itself is still read for dW. */
  const nt_tensor *dgelu_pre;
} nt_linear_bwd_opts;

nt_status nt_linear_backward_ex(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                                const nt_linear_bwd_opts *opts);

NT_EXTERN_C_END
#endif
