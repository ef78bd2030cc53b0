/* LayerNorm over the last dim C (eps 1e-5, as torch.nn.LayerNorm):
 *   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps) (biased variance).
 * x, y [.., C] in F32/F16/BF16; weight, bias [C] (F32 or x's dtype); mean, rstd [rows] F32,
 * saved for backward. Statistics in fp32. Backward accumulates into dx, dweight, dbias. */
#ifndef NT_OPS_LAYERNORM_H
#define NT_OPS_LAYERNORM_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_layernorm_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *weight,
                               const nt_tensor *bias, nt_tensor *y, nt_tensor *mean,
                               nt_tensor *rstd);
nt_status nt_layernorm_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                                const nt_tensor *weight, const nt_tensor *mean,
                                const nt_tensor *rstd, nt_tensor *dx, nt_tensor *dweight,
                                nt_tensor *dbias);

NT_EXTERN_C_END
#endif
