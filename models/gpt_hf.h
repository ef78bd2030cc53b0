/* GPT-2 weights in Hugging Face's layout (transformers' GPT2Model / GPT2LMHeadModel saved as
 * model.safetensors) into models/gpt.h's GPT.
 *
 * What differs from the GPT's own parameters, and how the loader maps it:
 *  - names: "wte.weight", "wpe.weight", "h.<i>.ln_1.weight", "h.<i>.attn.c_attn.weight", ...,
 *    "ln_f.bias", optionally under "transformer." (GPT2LMHeadModel's state_dict); the GPT's
 *    are nanoGPT's "transformer.<same>".
 *  - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D layers: their weights are
 *    stored [in, out], the transpose of nn.Linear's [out, in] the GPT uses; they are loaded
 *    transposed. Biases and LayerNorm parameters load as they are.
 *  - wte has vocab_size rows; the GPT's may be padded (nt_gpt_padded_vocab): the extra rows
 *    are set to zero. wpe may have more rows than block_size (n_positions 1024 for a model
 *    built with a shorter block): its first block_size rows are loaded, as nanoGPT's
 *    crop_block_size keeps.
 *  - lm_head.weight, when present, must equal wte.weight (GPT-2 ties them; the GPT has no
 *    separate head); an untied head is NT_ERR_UNSUPPORTED. The attention mask buffers
 *    ("h.<i>.attn.bias", "h.<i>.attn.masked_bias") are skipped.
 * Any other tensor in the file, or a missing one, is NT_ERR_FORMAT listing them; so is a file
 * whose wte/wpe width or vocabulary differs from the GPT's config. Every float dtype loads
 * (F32, F16, BF16 files into the fp32 masters); the compute copies are refreshed.
 * Numerics: the GPT uses GELU's tanh form and LayerNorm eps 1e-5, as GPT-2 does ("gelu_new",
 * layer_norm_epsilon 1e-5), so logits match transformers' up to rounding. */
#ifndef NT_MODELS_GPT_HF_H
#define NT_MODELS_GPT_HF_H
#include "core/nt.h"
#include "models/gpt.h"
NT_EXTERN_C_BEGIN

nt_status nt_gpt_load_hf(nt_ctx *ctx, nt_gpt *g, const char *path);

NT_EXTERN_C_END
#endif
