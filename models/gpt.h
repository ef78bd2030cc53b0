/* GPT (as nanoGPT / GPT-2): token + position embedding, n_layer pre-LayerNorm blocks (causal
 * self-attention, MLP with GELU), final LayerNorm, output head tied to the token embedding.
 * Parameters in flat units: "embeddings" (wte, wpe), "h.<i>" (one per block), "ln_f"; names as
 * nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight"). All activations are allocated
 * at create for a maximum batch x sequence; calls may use smaller ones (evaluation, sampling).
 * Activations are in the compute dtype; LayerNorm statistics, the loss and all gradients of
 * parameters in fp32. The MLP keeps both its pre-activation and its GELU output per layer:
 * backward reads gelu(pre) as the input of mlp.c_proj's weight gradient and pre for the
 * GELU's derivative, fused into mlp.c_proj's input-gradient GEMM. Attention reads q, k, v as
 * head views of the QKV projection's output and writes its [B, T, C] output in place (no
 * split/merge copies). Dropout (p > 0, training only) after the embedding, on the attention
 * probabilities (as nanoGPT's SDPA dropout_p) and on both residual branches; its masks come
 * from Philox offsets relative to the context's per-step RNG base, so a CUDA graph of the step
 * draws new masks on every replay. */
#ifndef NT_MODELS_GPT_H
#define NT_MODELS_GPT_H
#include "core/nt.h"
#include "models/module.h"
NT_EXTERN_C_BEGIN

typedef struct {
  int n_layer, n_head, n_embd, block_size, vocab_size;
  float dropout;
  /* Rows of logits the head forms at once; not part of the model (the math is the same, up
   * to the order in which the tied embedding's gradient sums its rows). 0: every row of the
   * batch while the logits take at most NT_GPT_HEAD_BYTES, else the batch's rows halved until
   * they do. A step forms the logits of each group of rows, then its loss, gradient and the
   * head's backward, before the next group, so only one group's logits are ever held (GPT-2
   * at 16 x 1024 in bf16: 1.5 GiB whole, 786 MiB in each of two groups). Each further group costs
   * about 0.5% of GPT-2's step (docs/gpt_step.md, "Memory"). The value used is at least the
   * sequence length, at most batch x sequence. */
  int head_rows;
} nt_gpt_config;

#define NT_GPT_HEAD_BYTES ((size_t)1 << 30)

/* nanoGPT's config/train_shakespeare_char.py: 6 layers, 6 heads, 384 wide, block 256, 65
 * characters, dropout 0.2. */
nt_gpt_config nt_gpt_config_shakespeare_char(void);
/* GPT-2 small (124M): 12/12/768, block 1024, vocab 50257, dropout 0. */
nt_gpt_config nt_gpt_config_gpt2(void);
nt_status nt_gpt_config_check(nt_ctx *ctx, const nt_gpt_config *c);
/* The head's padded vocabulary: vocab_size rounded up to a multiple of 64 when it is >= 1024
 * (GPT-2: 50257 -> 50304, aligned GEMMs), else vocab_size. wte has that many rows; the padded
 * rows never get a gradient and their logits are masked before the loss. */
int nt_gpt_padded_vocab(const nt_gpt_config *c);

typedef struct nt_gpt nt_gpt;

/* batch x seq is the largest input a call may pass (seq <= block_size). */
nt_status nt_gpt_create(nt_ctx *ctx, const nt_gpt_config *cfg, nt_dtype compute_dtype,
                        int batch, int seq, nt_gpt **out);
void nt_gpt_free(nt_ctx *ctx, nt_gpt *g);
nt_params *nt_gpt_params(nt_gpt *g);
const nt_gpt_config *nt_gpt_get_config(const nt_gpt *g);
/* Parameter count as nanoGPT reports it (without position embeddings). */
int64_t nt_gpt_num_params(const nt_gpt *g, bool non_embedding);
/* Training FLOPs per token (6N + 12 L C T, as nanoGPT's estimate_mfu). */
double nt_gpt_flops_per_token(const nt_gpt *g, int seq);
/* Bytes of activation memory allocated at create. */
size_t nt_gpt_activation_bytes(const nt_gpt *g);

/* Sizes of a model that is not built (memory estimates): parameter counts and the bytes of
 * activations create would allocate. */
nt_status nt_gpt_estimate(nt_ctx *ctx, const nt_gpt_config *cfg, nt_dtype compute_dtype,
                          int batch, int seq, nt_model_sizes *out);

/* Runs the blocks' linear layers (c_attn, c_proj, c_fc, mlp c_proj) as FP8 GEMMs with
 * delayed scaling (ops/fp8_linear.h; the head, LayerNorms and attention stay in the compute
 * dtype); each training step updates the scales after its backward. emulate: the FP8
 * quantization with fp32 GEMMs (CPU, tests). */
nt_status nt_gpt_enable_fp8(nt_ctx *ctx, nt_gpt *g, bool emulate);

/* One training micro-step: forward (dropout on), loss, and backward accumulating into the
 * parameter gradients. tokens, targets: I32 [b, t] on ctx's device. The loss gradient is
 * multiplied by *dloss_scale (device pointer on the GPU, host on the CPU; NULL = 1): AMP's
 * loss scale. The mean loss lands in nt_gpt_loss (unscaled). hooks (NULL: none) are called
 * around the units (models/module.h): before_forward for the embeddings, each block, ln_f;
 * in backward, before_backward for the embeddings (the tied head reads wte), ln_f, each block
 * (last first), and grads_ready for ln_f, each block (last first), then the embeddings. The
 * tied head reads the embeddings unit's wte again after ln_f: before_forward, then
 * before_backward for the embeddings, then the head's forward and backward, a group of rows
 * at a time (head_rows). */
nt_status nt_gpt_train_step(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens,
                            const nt_tensor *targets, const float *dloss_scale,
                            const nt_unit_hooks *hooks);
/* Forward without dropout and the mean loss (evaluation). */
nt_status nt_gpt_eval_loss(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens,
                           const nt_tensor *targets);
/* Forward without dropout; *logits views [b * t, padded vocab] (compute dtype, ctx's device;
 * columns from vocab_size on are masked to -30000), valid until the next call. On the GPU its
 * rows may be padded (row stride rounded up to 8 elements); read it through its strides.
 * b * t may not exceed nt_gpt_head_rows (one full sequence always fits). */
nt_status nt_gpt_logits(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens, nt_tensor *logits);
/* Rows of logits the head forms at once (nt_gpt_config.head_rows as created). */
int64_t nt_gpt_head_rows(const nt_gpt *g);
/* The F32 scalar mean loss of the last train/eval call, on ctx's device. */
const nt_tensor *nt_gpt_loss(const nt_gpt *g);

NT_EXTERN_C_END
#endif
