/* Private to the memory-bound ops (elementwise, embedding, layernorm, dropout, cross_entropy,
 * reduce): the CUDA entry points their dispatch functions call. Arguments are already checked
 * (devices, dtypes, shapes, contiguity) by the caller in <op>.c. Not part of the public API. */
#ifndef NT_OPS_MEMOPS_IMPL_H
#define NT_OPS_MEMOPS_IMPL_H
#include "core/nt.h"
#include "ops/layernorm.h"
NT_EXTERN_C_BEGIN

/* The elementwise maps: out = f(a, b[, out]). */
typedef enum {
  NT_EW_GELU_FWD = 0, /* out = gelu(a) */
  NT_EW_GELU_BWD,     /* out += b * gelu'(a)      (a = x, b = dy) */
  NT_EW_RELU_FWD,     /* out = max(a, 0) */
  NT_EW_RELU_BWD,     /* out += b * (a > 0)       (a = y, b = dy) */
  NT_EW_ADD,          /* out = a + b */
  NT_EW_AXPY,         /* out += alpha * a */
  NT_EW_SCALE         /* out = alpha * a           (a aliases out) */
} nt_ew_op;

#ifdef NT_HAVE_CUDA
nt_status nt_elementwise_map_cuda(nt_ctx *ctx, nt_ew_op op, float alpha, const nt_tensor *a,
                                  const nt_tensor *b, nt_tensor *out);
/* y = dropout(x), y += dropout(x) (accumulate) or y = res + dropout(x) (res not NULL). */
nt_status nt_dropout_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *res, nt_tensor *y,
                          float p, uint64_t seed, uint64_t offset, bool accumulate);
nt_status nt_layernorm_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                                    const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                                    nt_tensor *rstd);
/* opts (NULL: none) are done in the same pass when the shapes allow: *fused says whether. */
nt_status nt_layernorm_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                     const nt_tensor *weight, const nt_tensor *mean,
                                     const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                     nt_tensor *dbias, const nt_layernorm_bwd_opts *opts,
                                     bool *fused);
nt_status nt_embedding_forward_cuda(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *wte,
                                    const nt_tensor *wpe, nt_tensor *out);
nt_status nt_embedding_backward_cuda(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *dout,
                                     nt_tensor *dwte, nt_tensor *dwpe);
/* losses and dlogits may each be NULL (forward only / backward only). ld, ldd: the elements
 * from one row of logits / dlogits to the next (ldd is unused without dlogits). */
nt_status nt_cross_entropy_cuda(nt_ctx *ctx, const nt_tensor *logits, int64_t ld,
                                const nt_tensor *targets, const float *dloss_scale, int64_t count,
                                nt_tensor *losses, nt_tensor *dlogits, int64_t ldd);
nt_status nt_sum_squares_cuda(nt_ctx *ctx, const nt_tensor *const *xs, int n, nt_tensor *out);
nt_status nt_unscale_and_check_cuda(nt_ctx *ctx, nt_tensor *const *xs, int n,
                                    const nt_tensor *inv_scale, nt_tensor *found_inf);
nt_status nt_mean_cuda(nt_ctx *ctx, const nt_tensor *x, nt_tensor *out);
#endif

/* Shared argument checks. */
/* F32, F16 or BF16, on ctx's device, contiguous. */
nt_status nt_memops_check_act(nt_ctx *ctx, const nt_tensor *t, const char *what);
/* An F32 tensor of one element on ctx's device. */
nt_status nt_memops_check_scalar(nt_ctx *ctx, const nt_tensor *t, const char *what);
/* Without the CUDA backend a CUDA context cannot exist; kept for a clear message anyway. */
nt_status nt_memops_no_cuda(nt_ctx *ctx, const char *op);

NT_EXTERN_C_END
#endif
