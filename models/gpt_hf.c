#include "models/gpt_hf.h"
#include "models/safetensors.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *prefix;             /* "" or "transformer." in the file */
  int vocab, block;
} hf_map;

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* The GPT's "transformer.X" is the file's prefix + "X"; Conv1D weights are transposed. */
static bool map_name(void *arg, const char *param, char *name, size_t len,
                     nt_safetensors_load_opts *o) {
  const hf_map *m = arg;
  const char *x = param + strlen("transformer.");
  snprintf(name, len, "%s%s", m->prefix, x);
  if (!strcmp(x, "wte.weight")) {
    o->rows = m->vocab;
    o->pad_rows = true;
  } else if (!strcmp(x, "wpe.weight")) {
    o->rows = m->block;
  } else {
    o->transpose = ends_with(x, ".attn.c_attn.weight") || ends_with(x, ".attn.c_proj.weight") ||
                   ends_with(x, ".mlp.c_fc.weight") || ends_with(x, ".mlp.c_proj.weight");
  }
  return true;
}

/* "<prefix>h.<digits>.attn.bias" / ".attn.masked_bias": the causal-mask buffers. */
static bool is_mask_buffer(const char *name, const char *prefix) {
  size_t p = strlen(prefix);
  if (strncmp(name, prefix, p) || strncmp(name + p, "h.", 2)) return false;
  const char *s = name + p + 2;
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') s++;
  return !strcmp(s, ".attn.bias") || !strcmp(s, ".attn.masked_bias");
}

/* A 2-D file tensor as host F32 (caller frees), or NULL with the error set. */
static float *load_host(nt_ctx *ctx, nt_safetensors *f, const nt_safetensors_info *in) {
  float *h = malloc((size_t)(in->numel ? in->numel : 1) * sizeof *h);
  if (!h) {
    NT_ERROR(ctx, NT_ERR_OOM, "out of host memory reading '%s'", in->name);
    return NULL;
  }
  nt_tensor t = nt_tensor_view(h, NT_F32, nt_cpu(), 2, in->shape);
  if (nt_safetensors_load(ctx, f, in->name, &t, NULL)) {
    free(h);
    return NULL;
  }
  return h;
}

/* lm_head.weight must be wte.weight (tied, as GPT-2 is). */
static nt_status check_tied_head(nt_ctx *ctx, nt_safetensors *f, const char *path,
                                 const nt_safetensors_info *wte, const char *prefix) {
  const nt_safetensors_info *head = nt_safetensors_find(f, "lm_head.weight");
  if (!head) return NT_OK;
  bool same = head->ndim == 2 && head->shape[0] == wte->shape[0] &&
              head->shape[1] == wte->shape[1];
  float *a = same ? load_host(ctx, f, head) : NULL;
  float *b = a ? load_host(ctx, f, wte) : NULL;
  if (same && !b) {
    free(a);
    return nt_last_status(ctx);
  }
  same = same && !memcmp(a, b, (size_t)head->numel * sizeof *a);
  free(a);
  free(b);
  if (!same)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "%s: lm_head.weight differs from %swte.weight: an "
                    "untied output head, which the GPT (tied to wte) cannot hold", path, prefix);
  return NT_OK;
}

/* The file's embeddings against the GPT's config. */
static nt_status check_config(nt_ctx *ctx, nt_safetensors *f, const char *path,
                              const nt_gpt_config *c, const char *prefix,
                              const nt_safetensors_info **wte_out) {
  char name[96];
  snprintf(name, sizeof name, "%swte.weight", prefix);
  const nt_safetensors_info *wte = nt_safetensors_find(f, name);
  snprintf(name, sizeof name, "%swpe.weight", prefix);
  const nt_safetensors_info *wpe = nt_safetensors_find(f, name);
  if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: no 2-D %swte.weight and %swpe.weight", path, prefix,
                    prefix);
  if (wte->shape[0] != c->vocab_size || wte->shape[1] != c->n_embd)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: wte is [%lld, %lld]: vocabulary %lld x width %lld, "
                    "the GPT's config has vocab_size %d, n_embd %d", path,
                    (long long)wte->shape[0], (long long)wte->shape[1], (long long)wte->shape[0],
                    (long long)wte->shape[1], c->vocab_size, c->n_embd);
  if (wpe->shape[0] < c->block_size || wpe->shape[1] != c->n_embd)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: wpe is [%lld, %lld]: the GPT needs at least "
                    "block_size %d positions of width %d", path, (long long)wpe->shape[0],
                    (long long)wpe->shape[1], c->block_size, c->n_embd);
  snprintf(name, sizeof name, "%sh.%d.ln_1.weight", prefix, c->n_layer);
  if (nt_safetensors_has(f, name))
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: the file has more layers than the GPT's n_layer "
                    "%d (it holds %s)", path, c->n_layer, name);
  *wte_out = wte;
  return NT_OK;
}

nt_status nt_gpt_load_hf(nt_ctx *ctx, nt_gpt *g, const char *path) {
  nt_safetensors *f;
  nt_status st = nt_safetensors_open(ctx, path, &f);
  if (st) return st;
  const nt_gpt_config *c = nt_gpt_get_config(g);
  hf_map m = {"", c->vocab_size, c->block_size};
  if (!nt_safetensors_has(f, "wte.weight") && nt_safetensors_has(f, "transformer.wte.weight"))
    m.prefix = "transformer.";
  const nt_safetensors_info *wte = NULL;
  st = check_config(ctx, f, path, c, m.prefix, &wte);
  if (!st) st = check_tied_head(ctx, f, path, wte, m.prefix);
  for (int i = 0; i < nt_safetensors_count(f) && !st; i++) {
    const char *name = nt_safetensors_info_at(f, i)->name;
    if (is_mask_buffer(name, m.prefix) || !strcmp(name, "lm_head.weight"))
      nt_safetensors_mark_loaded(f, name);
  }
  nt_safetensors_params_opts o = {map_name, &m, false};
  if (!st) st = nt_safetensors_load_params(ctx, f, nt_gpt_params(g), &o);
  nt_safetensors_close(f);
  return st;
}
