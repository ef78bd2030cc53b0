/* LayerNorm over the last dim C (eps 1e-5, as torch.nn.LayerNorm):
 *   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps) (biased variance).
 * x, y (dy, dx) [.., C] in F32/F16/BF16, one dtype, contiguous; weight, bias [C] (F32 or x's
 * dtype, both the same; bias may be NULL); mean, rstd [rows] F32 (rows = numel / C), saved for
 * backward (both may be NULL in forward when no backward follows). Statistics in fp32.
 * Backward accumulates (+=) into dx, dweight and dbias (F32 [C]; dbias may be NULL). The sums
 * over rows for dweight and dbias use a fixed order (deterministic). On the GPU C is at most
 * 12800.
 *
 * nt_layernorm_backward_ex also forms, from the finished dx, what a transformer's next branch
 * reads (both optional; the GPU does it in the backward's own pass for bf16 and fp16 rows
 * with C a multiple of 8 up to 1024 and 16-byte aligned data, otherwise with the ops one after
 * another):
 *   dropped = dropout(dx) with (p, seed, offset): nt_dropout_forward's mask and values;
 *   colsum  = the column sums of dropped, or of dx without `dropped` (F32 [C], written, not
 *             accumulated; sums in a fixed order): the bias gradient of the linear layer
 *             whose output gradient dx (or dropped) is. */
#ifndef NT_OPS_LAYERNORM_H
#define NT_OPS_LAYERNORM_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

#define NT_LAYERNORM_EPS 1e-5f

nt_status nt_layernorm_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                               const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                               nt_tensor *rstd);
nt_status nt_layernorm_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                const nt_tensor *weight, const nt_tensor *mean,
                                const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                nt_tensor *dbias);

typedef struct {
  nt_tensor *dropped;        /* like dx, or NULL */
  float p;                   /* dropped's dropout probability, in [0, 1) */
  uint64_t seed, offset;     /* dropped's stream (ops/dropout.h) */
  nt_tensor *colsum;         /* F32 [C], or NULL */
} nt_layernorm_bwd_opts;

nt_status nt_layernorm_backward_ex(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                   const nt_tensor *weight, const nt_tensor *mean,
                                   const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                   nt_tensor *dbias, const nt_layernorm_bwd_opts *opts);

NT_EXTERN_C_END
#endif
