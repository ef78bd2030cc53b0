/* Token + position embedding (GPT): out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
 * tokens: I32 [B, T] (contiguous); wte [V, C]; wpe [Tmax, C] with T <= Tmax, or NULL; out
 * [B, T, C]; wte, wpe and out F32/F16/BF16 of one dtype, contiguous; sums in fp32.
 * A token id outside [0, V) is NT_ERR_INVALID_ARG on the CPU; on the GPU (no host sync in the
 * hot path) the kernel writes NaN into that token's output row, so the loss becomes NaN and the
 * AMP non-finite check sees it.
 * Backward: dwte, dwpe += (F32 [V, C], [Tmax, C]; either may be NULL), dout in out's dtype.
 * Deterministic on the GPU too: the positions are stably sorted by token and each token's rows
 * are summed in position order (no atomics). Out-of-range ids contribute nothing. */
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
