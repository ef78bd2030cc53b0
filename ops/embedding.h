/* Token + position embedding (GPT): out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
 * tokens: I32 [B, T]; wte [V, C]; wpe [Tmax, C] with T <= Tmax, or NULL; out [B, T, C].
 * A token id outside [0, V) is NT_ERR_INVALID_ARG on the CPU; on the GPU the kernel sets a
 * device flag that nt_embedding_forward's next host check reports (no sync in the hot path).
 * Backward: dwte, dwpe += (F32), deterministic. */
#ifndef NT_OPS_EMBEDDING_H
#define NT_OPS_EMBEDDING_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

nt_status nt_embedding_forward(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *wte,
                               const nt_tensor *wpe, nt_tensor *out);
nt_status nt_embedding_backward(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *dout,
                                nt_tensor *dwte, nt_tensor *dwpe);

NT_EXTERN_C_END
#endif
