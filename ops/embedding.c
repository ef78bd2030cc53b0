#include "ops/embedding.h"
#include "ops/memops_impl.h"

/* tokens I32 [B, T] on ctx's device; sets B and T. */
static nt_status check_tokens(nt_ctx *ctx, const char *name, const nt_tensor *tokens, int64_t *B,
                              int64_t *T) {
  if (!tokens || !tokens->data)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: tokens is NULL", name);
  nt_status st = nt_check_device(ctx, tokens, "embedding tokens");
  if (!st) st = nt_check_dtype(ctx, tokens, NT_I32, "embedding tokens");
  if (!st) st = nt_check_ndim(ctx, tokens, 2, "embedding tokens [B, T]");
  if (!st) st = nt_check_contiguous(ctx, tokens, "embedding tokens");
  if (st) return st;
  *B = tokens->shape[0];
  *T = tokens->shape[1];
  return NT_OK;
}

/* A [rows, C] table: 2 dims, C columns, at least min_rows rows. */
static nt_status check_table(nt_ctx *ctx, const nt_tensor *t, int64_t C, int64_t min_rows,
                             const char *what) {
  nt_status st = nt_check_ndim(ctx, t, 2, what);
  if (!st) st = nt_check_dim(ctx, t, 1, C, what);
  if (st) return st;
  if (t->shape[0] < min_rows)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: %lld rows, at least %lld needed (sequence length)",
                    what, (long long)t->shape[0], (long long)min_rows);
  return NT_OK;
}

static nt_status check_ids(nt_ctx *ctx, const char *name, const int32_t *tok, int64_t n,
                           int64_t V) {
  for (int64_t i = 0; i < n; i++)
    if (tok[i] < 0 || tok[i] >= V)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: token id %d at position %lld is outside [0, %lld)",
                      name, tok[i], (long long)i, (long long)V);
  return NT_OK;
}

nt_status nt_embedding_forward(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *wte,
                               const nt_tensor *wpe, nt_tensor *out) {
  const char *name = "embedding_forward";
  int64_t B = 0, T = 0;
  nt_status st = check_tokens(ctx, name, tokens, &B, &T);
  if (!st) st = nt_memops_check_act(ctx, wte, "embedding wte");
  if (!st && wpe) st = nt_memops_check_act(ctx, wpe, "embedding wpe");
  if (!st) st = nt_memops_check_act(ctx, out, "embedding out");
  if (st) return st;
  st = nt_check_ndim(ctx, out, 3, "embedding out [B, T, C]");
  if (!st) st = nt_check_dim(ctx, out, 0, B, "embedding out [B, T, C]");
  if (!st) st = nt_check_dim(ctx, out, 1, T, "embedding out [B, T, C]");
  if (st) return st;
  int64_t C = out->shape[2];
  st = check_table(ctx, wte, C, 1, "embedding wte [V, C]");
  if (!st && wpe) st = check_table(ctx, wpe, C, T, "embedding wpe [Tmax, C]");
  if (st) return st;
  if (wte->dtype != out->dtype || (wpe && wpe->dtype != out->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: wte %s, wpe %s and out %s must have one dtype", name,
                    nt_dtype_name(wte->dtype), wpe ? nt_dtype_name(wpe->dtype) : "-",
                    nt_dtype_name(out->dtype));
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_embedding_forward_cuda(ctx, tokens, wte, wpe, out);
#else
    return nt_memops_no_cuda(ctx, name);
#endif
  }
  const int32_t *tok = (const int32_t *)tokens->data;
  st = check_ids(ctx, name, tok, B * T, wte->shape[0]);
  if (st) return st;
  for (int64_t i = 0; i < B * T; i++) {
    int64_t t = i % T;
    for (int64_t c = 0; c < C; c++) {
      float v = nt_load_f32(wte->data, wte->dtype, (int64_t)tok[i] * C + c);
      if (wpe) v += nt_load_f32(wpe->data, wpe->dtype, t * C + c);
      nt_store_f32(out->data, out->dtype, i * C + c, v);
    }
  }
  return NT_OK;
}

nt_status nt_embedding_backward(nt_ctx *ctx, const nt_tensor *tokens, const nt_tensor *dout,
                                nt_tensor *dwte, nt_tensor *dwpe) {
  const char *name = "embedding_backward";
  int64_t B = 0, T = 0;
  nt_status st = check_tokens(ctx, name, tokens, &B, &T);
  if (!st) st = nt_memops_check_act(ctx, dout, "embedding dout");
  if (st) return st;
  st = nt_check_ndim(ctx, dout, 3, "embedding dout [B, T, C]");
  if (!st) st = nt_check_dim(ctx, dout, 0, B, "embedding dout [B, T, C]");
  if (!st) st = nt_check_dim(ctx, dout, 1, T, "embedding dout [B, T, C]");
  if (st) return st;
  int64_t C = dout->shape[2];
  nt_tensor *grads[2] = {dwte, dwpe};
  const char *what[2] = {"embedding dwte [V, C]", "embedding dwpe [Tmax, C]"};
  for (int k = 0; k < 2; k++) {
    if (!grads[k]) continue;
    st = nt_check_device(ctx, grads[k], what[k]);
    if (!st) st = nt_check_dtype(ctx, grads[k], NT_F32, what[k]);
    if (!st) st = nt_check_contiguous(ctx, grads[k], what[k]);
    if (!st) st = check_table(ctx, grads[k], C, k == 1 ? T : 1, what[k]);
    if (st) return st;
  }
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_embedding_backward_cuda(ctx, tokens, dout, dwte, dwpe);
#else
    return nt_memops_no_cuda(ctx, name);
#endif
  }
  const int32_t *tok = (const int32_t *)tokens->data;
  if (dwte) {
    st = check_ids(ctx, name, tok, B * T, dwte->shape[0]);
    if (st) return st;
  }
  for (int64_t i = 0; i < B * T; i++) {
    int64_t t = i % T;
    for (int64_t c = 0; c < C; c++) {
      float d = nt_load_f32(dout->data, dout->dtype, i * C + c);
      if (dwte) ((float *)dwte->data)[(int64_t)tok[i] * C + c] += d;
      if (dwpe) ((float *)dwpe->data)[t * C + c] += d;
    }
  }
  return NT_OK;
}
