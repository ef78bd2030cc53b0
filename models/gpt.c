#include "models/gpt.h"
#include "core/convert.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "amp/fp8_linear.h"
#include "ops/gemm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { nt_tensor w, g; } pv;   /* a parameter's compute view and gradient view */

enum { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCP_W, FCP_B, NP };

typedef struct {
  pv p[NP];
  int unit, pidx[NP];             /* the block's nt_params unit and its parameters' indices */
  /* saved activations; fc_pre is c_fc's output, act = gelu(fc_pre) (both kept: backward
   * needs fc_pre for GELU's derivative and act for mlp.c_proj's weight gradient) */
  nt_tensor ln1, ln1_mean, ln1_rstd, qkv, lse, ym, x1, ln2, ln2_mean, ln2_rstd;
  nt_tensor fc_pre, act, x2;
  /* qkv [B, T, 3C] is the attention's input and ym [B, T, C] its output: the kernels read and
   * write head views of them in place (no split or merge copies). */
  uint64_t att_off, mlp_off, attp_off;   /* dropout stream offsets of the last training
                                            forward (residual branches, attention probs) */
} gpt_layer;

struct nt_gpt {
  nt_gpt_config cfg;
  int B, T;
  nt_params params;
  int emb_unit, lnf_unit;         /* nt_params units of wte/wpe and ln_f (blocks: layers[l].unit) */
  pv wte, wpe, lnf_w, lnf_b;
  gpt_layer *layers;
  nt_arena arena;
  nt_tensor x0, lnf, lnf_mean, lnf_rstd, logits, losses, loss;
  int Vp;                         /* vocabulary padded for the head's GEMMs */
  int64_t R;                      /* rows of logits formed at once (nt_gpt_head_rows) */
  int Ls;                         /* the logits' row stride: Vp, rounded up to 8 on the GPU (a
                                     16-byte aligned row for cuBLASLt's tensor-core kernels when
                                     Vp is not, e.g. the char model's 65) */
  nt_tensor vmask;                /* [Vp] in the compute dtype (so cuBLASLt fuses it as the head
                                     GEMM's bias): 0, then a large negative on the padding */
  /* scratch shared by all layers: dres, dtmp, dc, and views into `shared` (see
   * build_activations) */
  nt_tensor dres, dtmp, dc, shared;
  nt_tensor bsum;                   /* F32 [C]: the next projection's bias gradient, summed by
                                       the LayerNorm backward before it (ln_bwd) */
  nt_tensor tmp;                    /* forward */
  nt_tensor dpre;                   /* MLP backward */
  nt_tensor dqkv;                   /* attention backward */
  uint64_t emb_off;
  int b, t;                       /* sizes of the last forward */
  nt_fp8_state *fp8;              /* FP8 delayed scaling for the block's linear layers, or NULL */
  bool fp8_emulate;
};

/* Linear layer k of block l (0 c_attn, 1 attn.c_proj, 2 c_fc, 3 mlp.c_proj), in FP8 when the
 * model has an FP8 state (the head stays in the compute dtype). */
static nt_status lin_fwd(nt_ctx *ctx, const nt_gpt *g, int l, int k, const nt_tensor *x,
                         const nt_tensor *w, const nt_tensor *b, nt_tensor *y, nt_activation act,
                         nt_tensor *pre) {
  if (!g->fp8) return nt_linear_forward(ctx, x, w, b, y, act, pre);
  nt_fp8_linear_cfg c = {g->fp8, (4 * l + k) * NT_FP8_LINEAR_TENSORS, g->fp8_emulate};
  return nt_fp8_linear_forward(ctx, &c, x, w, b, y, act, pre);
}

/* A residual branch's output projection (linear layer k of block l) and the residual add:
 * out = res + dropout(x W^T + b). Without dropout the add rides on the GEMM (res is its C
 * operand: one launch, one rounding); with dropout, or in FP8, the projection goes to `tmp`,
 * then the dropout and the add follow in one pass (nt_dropout_add; a plain add at p = 0). */
static nt_status proj_residual(nt_ctx *ctx, const nt_gpt *g, int l, int k, float p,
                               uint64_t off, const nt_tensor *x, const nt_tensor *w,
                               const nt_tensor *b, const nt_tensor *res, nt_tensor *tmp,
                               nt_tensor *out) {
  if (p <= 0.0f && !g->fp8) {
    nt_linear_fwd_opts o = {.residual = res};
    return nt_linear_forward_ex(ctx, x, w, b, out, NT_ACT_NONE, NULL, &o);
  }
  nt_status st = lin_fwd(ctx, g, l, k, x, w, b, tmp, NT_ACT_NONE, NULL);
  if (st) return st;
  if (p <= 0.0f) return nt_add(ctx, res, tmp, out);
  return nt_dropout_add(ctx, tmp, res, out, p, nt_ctx_seed(ctx), off);
}

/* Backward of linear layer k of block l: dx = dy W (overwritten: every dx in the model is a
 * scratch gradient), dW += dy^T x, db += column sums of dy. gelu_pre (FP8 only): dy is the
 * gradient of gelu(gelu_pre), whose backward the FP8 backward's quantization pass forms. */
static nt_status lin_bwd(nt_ctx *ctx, const nt_gpt *g, int l, int k, const nt_tensor *dy,
                         const nt_tensor *x, const nt_tensor *w, nt_tensor *dx, nt_tensor *dw,
                         nt_tensor *db, const nt_tensor *gelu_pre) {
  if (!g->fp8) {
    nt_linear_bwd_opts o = {.overwrite_dx = true};
    return nt_linear_backward_ex(ctx, dy, x, w, dx, dw, db, &o);
  }
  nt_fp8_linear_cfg c = {g->fp8, (4 * l + k) * NT_FP8_LINEAR_TENSORS, g->fp8_emulate};
  nt_fp8_linear_bwd_opts o = {.overwrite_dx = true, .dy_gelu_pre = gelu_pre};
  return nt_fp8_linear_backward_ex(ctx, &c, dy, x, w, dx, dw, db, &o);
}

/* Backward of block l's MLP, act = gelu(pre) between mlp.c_fc and mlp.c_proj: dy is the
 * gradient of c_proj's output, dx receives that of c_fc's input, dact is scratch. Where the
 * GELU backward happens:
 *   bf16/fp16/fp32: in the epilogue of c_proj's dx GEMM, so dact holds the gradient of pre;
 *   FP8: dact holds the gradient of act, and c_fc's backward forms the GELU backward while it
 *        quantizes dact (amp/fp8_linear.h, dy_gelu_pre).
 * c_proj's bias gradient: outside FP8, the LayerNorm backward before summed it into g->bsum
 * (ln_bwd); FP8's backward sums it while quantizing dy. */
static nt_status mlp_bwd(nt_ctx *ctx, nt_gpt *g, int l, const nt_tensor *dy, const nt_tensor *x,
                         const nt_tensor *pre, const nt_tensor *act, nt_tensor *dact,
                         nt_tensor *dx) {
  pv *P = g->layers[l].p;
  nt_status st;
  if (g->fp8) {
    st = lin_bwd(ctx, g, l, 3, dy, act, &P[FCP_W].w, dact, &P[FCP_W].g, &P[FCP_B].g, NULL);
  } else {
    nt_linear_bwd_opts o = {.overwrite_dx = true, .dgelu_pre = pre};
    st = nt_linear_backward_ex(ctx, dy, act, &P[FCP_W].w, dact, &P[FCP_W].g, NULL, &o);
    if (!st) st = nt_add(ctx, &P[FCP_B].g, &g->bsum, &P[FCP_B].g);
  }
  if (st) return st;
  return lin_bwd(ctx, g, l, 2, dact, x, &P[FC_W].w, dx, &P[FC_W].g, &P[FC_B].g,
                 g->fp8 ? pre : NULL);
}

nt_gpt_config nt_gpt_config_shakespeare_char(void) {
  nt_gpt_config c = {6, 6, 384, 256, 65, 0.2f, 0};
  return c;
}

int nt_gpt_padded_vocab(const nt_gpt_config *c) {
  return c->vocab_size >= 1024 ? (c->vocab_size + 63) / 64 * 64 : c->vocab_size;
}

nt_gpt_config nt_gpt_config_gpt2(void) {
  nt_gpt_config c = {12, 12, 768, 1024, 50257, 0.0f, 0};
  return c;
}

nt_status nt_gpt_config_check(nt_ctx *ctx, const nt_gpt_config *c) {
  if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->block_size < 1 || c->vocab_size < 2)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "GPT config: n_layer %d, n_head %d, n_embd %d, block_size %d, vocab %d must "
                    "all be positive (vocab >= 2)",
                    c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size);
  if (c->n_embd % c->n_head)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "GPT config: n_embd %d is not a multiple of n_head %d",
                    c->n_embd, c->n_head);
  if (c->n_embd / c->n_head > 128)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "GPT config: head size %d exceeds 128 (the attention kernel's limit)",
                    c->n_embd / c->n_head);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "GPT config: dropout %g must be in [0, 1)",
                    (double)c->dropout);
  if (c->head_rows < 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "GPT config: head_rows %d is negative (0: auto)",
                    c->head_rows);
  return NT_OK;
}

static nt_status add_param(nt_ctx *ctx, nt_gpt *g, int unit, const char *name, int ndim,
                           int64_t d0, int64_t d1, nt_init_kind init, float a, int *idx) {
  int64_t shape[2] = {d0, d1};
  return nt_params_add(ctx, &g->params, unit, name, ndim, shape, ndim >= 2, init, a, idx);
}

static pv param_views(nt_gpt *g, int unit, int idx) {
  pv v = {nt_params_view(&g->params, unit, idx, NT_VIEW_COMPUTE),
          nt_params_view(&g->params, unit, idx, NT_VIEW_GRAD)};
  return v;
}

/* The parameter views, taken again: data parallelism (dist/fsdp.h) moves a unit's buffers
 * while training (gathered, freed, whole gradients allocated per step), so the views are
 * refreshed before every forward and after every unit hook. wte/wpe and ln_f's weight/bias are
 * their units' parameters 0 and 1 (build_params adds them first). */
static void refresh_views(nt_gpt *g) {
  g->wte = param_views(g, g->emb_unit, 0);
  g->wpe = param_views(g, g->emb_unit, 1);
  g->lnf_w = param_views(g, g->lnf_unit, 0);
  g->lnf_b = param_views(g, g->lnf_unit, 1);
  for (int l = 0; l < g->cfg.n_layer; l++) {
    gpt_layer *L = &g->layers[l];
    for (int j = 0; j < NP; j++) L->p[j] = param_views(g, L->unit, L->pidx[j]);
  }
}

static nt_status unit_hook(nt_ctx *ctx, nt_gpt *g, const nt_unit_hooks *h, int unit,
                           nt_status (*call)(nt_ctx *, const nt_unit_hooks *, int)) {
  nt_status st = call(ctx, h, unit);
  if (h) refresh_views(g);
  return st;
}

static nt_status build_params(nt_ctx *ctx, nt_gpt *g, nt_dtype dt, bool alloc) {
  const nt_gpt_config *c = &g->cfg;
  int64_t C = c->n_embd;
  float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
  int u, iwte, iwpe, iw, ib;
  nt_status st = nt_params_add_unit(ctx, &g->params, "embeddings", &u);
  if (!st) st = add_param(ctx, g, u, "transformer.wte.weight", 2, g->Vp, C,
                          NT_INIT_NORMAL, std, &iwte);
  if (!st) st = add_param(ctx, g, u, "transformer.wpe.weight", 2, c->block_size, C,
                          NT_INIT_NORMAL, std, &iwpe);
  static const char *const names[NP] = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
      "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
  const int64_t rows[NP] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
  const int64_t cols[NP] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
  for (int l = 0; l < c->n_layer && !st; l++) {
    char name[NT_PARAM_NAME_MAX];
    snprintf(name, sizeof name, "h.%d", l);
    gpt_layer *L = &g->layers[l];
    st = nt_params_add_unit(ctx, &g->params, name, &L->unit);
    for (int j = 0; j < NP && !st; j++) {
      snprintf(name, sizeof name, "transformer.h.%d.%s", l, names[j]);
      nt_init_kind init = cols[j] ? NT_INIT_NORMAL
                          : (j == LN1_W || j == LN2_W) ? NT_INIT_ONES : NT_INIT_ZEROS;
      float a = (j == PROJ_W || j == FCP_W) ? proj_std : std;
      st = add_param(ctx, g, L->unit, name, cols[j] ? 2 : 1, rows[j], cols[j], init, a,
                     &L->pidx[j]);
    }
  }
  int uf = 0;
  if (!st) st = nt_params_add_unit(ctx, &g->params, "ln_f", &uf);
  if (!st) st = add_param(ctx, g, uf, "transformer.ln_f.weight", 1, C, 0, NT_INIT_ONES, 0, &iw);
  if (!st) st = add_param(ctx, g, uf, "transformer.ln_f.bias", 1, C, 0, NT_INIT_ZEROS, 0, &ib);
  if (!st && !alloc) nt_params_layout(&g->params);
  if (!st && alloc) st = nt_params_alloc(ctx, &g->params, dt);
  g->emb_unit = u;
  g->lnf_unit = uf;
  if (st || !alloc) return st;
  if (iwte != 0 || iwpe != 1 || iw != 0 || ib != 1)
    return NT_ERROR(ctx, NT_ERR_STATE, "gpt: unexpected parameter order");
  refresh_views(g);
  return NT_OK;
}

/* Rows of logits the head forms at once (nt_gpt_config.head_rows). */
static int64_t head_rows(const nt_gpt *g, nt_dtype dt) {
  int64_t N = (int64_t)g->B * g->T, r = g->cfg.head_rows;
  if (r == 0) {
    size_t row = (size_t)g->Ls * nt_dtype_size(dt);
    for (r = N; r > g->T && (size_t)r * row > NT_GPT_HEAD_BYTES;) r = (r + 1) / 2;
  }
  return r < g->T ? g->T : r > N ? N : r;
}

static nt_status build_activations(nt_ctx *ctx, nt_gpt *g, nt_dtype dt, bool alloc) {
  const nt_gpt_config *c = &g->cfg;
  g->Ls = nt_ctx_is_cuda(ctx) ? (g->Vp + 7) / 8 * 8 : g->Vp;
  g->R = head_rows(g, dt);
  int64_t B = g->B, T = g->T, C = c->n_embd, H = c->n_head, N = B * T;
  int64_t sC[3] = {B, T, C}, s3C[3] = {B, T, 3 * C}, s4C[3] = {B, T, 4 * C};
  int64_t sL[3] = {B, H, T}, sN[1] = {N};
  int64_t sV[2] = {g->R, g->Ls}, sVp[1] = {g->Vp};
  nt_arena *a = &g->arena;
  nt_status st = NT_OK;
#define ADD(t, dtype, nd, shp) \
  if (!st) st = nt_arena_add(ctx, a, &(t), (dtype), (nd), (shp))
  ADD(g->x0, dt, 3, sC);
  for (int l = 0; l < c->n_layer; l++) {
    gpt_layer *L = &g->layers[l];
    ADD(L->ln1, dt, 3, sC);
    ADD(L->ln1_mean, NT_F32, 1, sN);
    ADD(L->ln1_rstd, NT_F32, 1, sN);
    ADD(L->qkv, dt, 3, s3C);
    ADD(L->lse, NT_F32, 3, sL);
    ADD(L->ym, dt, 3, sC);
    ADD(L->x1, dt, 3, sC);
    ADD(L->ln2, dt, 3, sC);
    ADD(L->ln2_mean, NT_F32, 1, sN);
    ADD(L->ln2_rstd, NT_F32, 1, sN);
    ADD(L->fc_pre, dt, 3, s4C);
    ADD(L->act, dt, 3, s4C);
    ADD(L->x2, dt, 3, sC);
  }
  ADD(g->lnf, dt, 3, sC);
  ADD(g->lnf_mean, NT_F32, 1, sN);
  ADD(g->lnf_rstd, NT_F32, 1, sN);
  ADD(g->logits, dt, 2, sV);
  if (g->Vp != c->vocab_size) ADD(g->vmask, dt, 1, sVp);
  ADD(g->losses, NT_F32, 1, sN);
  ADD(g->loss, NT_F32, 0, sN);
  ADD(g->dres, dt, 3, sC);
  ADD(g->dtmp, dt, 3, sC);
  ADD(g->dc, dt, 3, sC);
  int64_t s1C[1] = {C};
  ADD(g->bsum, NT_F32, 1, s1C);
  /* The forward, the MLP branch's backward and the attention branch's backward never hold
   * live scratch at the same time (one stream, one after the other): their buffers are
   * carved from one region, each phase's laid out from its start. */
  struct { nt_tensor *t; int nd; const int64_t *shape; bool first; } carve[] = {
      {&g->tmp, 3, sC, true}, {&g->dpre, 3, s4C, true}, {&g->dqkv, 3, s3C, true}};
  enum { NCARVE = sizeof carve / sizeof carve[0] };
  size_t offs[NCARVE], off = 0, region = 0, es = nt_dtype_size(dt);
  for (int i = 0; i < NCARVE; i++) {
    int64_t n = 1;
    for (int d = 0; d < carve[i].nd; d++) n *= carve[i].shape[d];
    if (carve[i].first) off = 0;
    offs[i] = off;
    off += ((size_t)n * es + 255) & ~(size_t)255;   /* 256-byte aligned views */
    if (off > region) region = off;
  }
  int64_t sR[1] = {(int64_t)(region / es)};
  ADD(g->shared, dt, 1, sR);
#undef ADD
  if (!st && alloc) st = nt_arena_alloc(ctx, a);
  /* The logits' row padding (columns Vp..Ls) is never written by the head GEMM or the loss,
   * but the 16-byte loads of the GEMM that reads the logits' gradient cover it (initcheck
   * reported those reads in cuBLASLt's kernel until this zeroing): defined values, once. */
  if (!st && alloc && g->Ls != g->Vp) st = nt_tensor_zero(ctx, &g->logits);
  for (int i = 0; i < NCARVE && !st && alloc; i++)
    *carve[i].t = nt_tensor_view((char *)g->shared.data + offs[i], dt, g->shared.device,
                                 carve[i].nd, carve[i].shape);
  return st;
}

nt_status nt_gpt_create(nt_ctx *ctx, const nt_gpt_config *cfg, nt_dtype compute_dtype,
                        int batch, int seq, nt_gpt **out) {
  *out = NULL;
  nt_status st = nt_gpt_config_check(ctx, cfg);
  if (st) return st;
  if (batch < 1 || seq < 1 || seq > cfg->block_size)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "GPT: batch %d x seq %d (seq must be 1..%d)", batch,
                    seq, cfg->block_size);
  nt_gpt *g = calloc(1, sizeof *g);
  if (!g) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the GPT");
  g->cfg = *cfg;
  g->Vp = nt_gpt_padded_vocab(cfg);
  g->B = batch;
  g->T = seq;
  g->layers = calloc((size_t)cfg->n_layer, sizeof *g->layers);
  if (!g->layers) {
    free(g);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the GPT layers");
  }
  st = build_params(ctx, g, compute_dtype, true);
  if (!st) st = build_activations(ctx, g, compute_dtype, true);
  if (!st && g->Vp != cfg->vocab_size) {
    void *m = malloc((size_t)g->Vp * nt_dtype_size(compute_dtype));
    if (!m) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
    for (int i = 0; m && i < g->Vp; i++)
      nt_store_f32(m, compute_dtype, i, i < cfg->vocab_size ? 0.0f : -30000.0f);
    nt_tensor hm = nt_tensor_view(m, compute_dtype, nt_cpu(), 1, g->vmask.shape);
    if (!st) st = nt_tensor_copy(ctx, &g->vmask, &hm);
    free(m);
  }
  if (st) {
    nt_gpt_free(ctx, g);
    return st;
  }
  *out = g;
  return NT_OK;
}

void nt_gpt_free(nt_ctx *ctx, nt_gpt *g) {
  if (!g) return;
  nt_fp8_state_free(ctx, g->fp8);
  nt_arena_free(ctx, &g->arena);
  nt_params_free(ctx, &g->params);
  free(g->layers);
  free(g);
}

nt_status nt_gpt_estimate(nt_ctx *ctx, const nt_gpt_config *cfg, nt_dtype compute_dtype,
                          int batch, int seq, nt_model_sizes *out) {
  nt_status st = nt_gpt_config_check(ctx, cfg);
  if (st) return st;
  nt_gpt g;
  memset(&g, 0, sizeof g);
  g.cfg = *cfg;
  g.Vp = nt_gpt_padded_vocab(cfg);
  g.B = batch;
  g.T = seq;
  g.layers = calloc((size_t)cfg->n_layer, sizeof *g.layers);
  if (!g.layers) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  st = build_params(ctx, &g, compute_dtype, false);
  if (!st) st = build_activations(ctx, &g, compute_dtype, false);
  if (!st) nt_model_sizes_of(&g.params, g.arena.bytes, out);
  nt_arena_free(ctx, &g.arena);
  nt_params_free(ctx, &g.params);
  free(g.layers);
  return st;
}

nt_params *nt_gpt_params(nt_gpt *g) { return &g->params; }
const nt_gpt_config *nt_gpt_get_config(const nt_gpt *g) { return &g->cfg; }
const nt_tensor *nt_gpt_loss(const nt_gpt *g) { return &g->loss; }
int64_t nt_gpt_head_rows(const nt_gpt *g) { return g->R; }
size_t nt_gpt_activation_bytes(const nt_gpt *g) { return g->arena.bytes; }

int64_t nt_gpt_num_params(const nt_gpt *g, bool non_embedding) {
  int64_t n = g->params.n_real - (int64_t)(g->Vp - g->cfg.vocab_size) * g->cfg.n_embd;
  if (non_embedding) n -= (int64_t)g->cfg.block_size * g->cfg.n_embd;
  return n;
}

double nt_gpt_flops_per_token(const nt_gpt *g, int seq) {
  const nt_gpt_config *c = &g->cfg;
  return 6.0 * (double)nt_gpt_num_params(g, true) +
         12.0 * c->n_layer * (double)c->n_embd * (double)seq;
}

/* Views of a buffer with the runtime sizes b x t. */
static nt_tensor v3(const nt_tensor *t, int64_t b, int64_t s, int64_t c) {
  int64_t sh[3] = {b, s, c};
  return nt_prefix_view(t, 3, sh);
}
static nt_tensor v1(const nt_tensor *t, int64_t n) { return nt_prefix_view(t, 1, &n); }
static nt_tensor v2(const nt_tensor *t, int64_t n, int64_t c) {
  int64_t sh[2] = {n, c};
  return nt_prefix_view(t, 2, sh);
}
/* The logits of n rows: [n, Vp], rows Ls apart. */
static nt_tensor logits_view(const nt_gpt *g, int64_t n) {
  nt_tensor t = v2(&g->logits, n, g->Ls);
  t.shape[1] = g->Vp;
  return t;
}

/* Head h of part `part` (0 q, 1 k, 2 v; 0 for a [B, T, C] tensor) of x [b, t, W] as a
 * [b, H, t, D] view: columns part*H*D + h*D .. + D of every row, no copy. */
static nt_tensor heads(const nt_tensor *x, int64_t H, int64_t D, int part) {
  nt_tensor h = *x;
  int64_t W = x->shape[2];
  h.data = (char *)x->data + (size_t)(part * H * D) * nt_dtype_size(x->dtype);
  h.ndim = 4;
  h.shape[0] = x->shape[0];
  h.shape[1] = H;
  h.shape[2] = x->shape[1];
  h.shape[3] = D;
  h.stride[0] = x->shape[1] * W;
  h.stride[1] = D;
  h.stride[2] = W;
  h.stride[3] = 1;
  h.owner = NULL;
  return h;
}

/* Attention-probability dropout p (0 in evaluation) on the stream reserved at `off`. */
static nt_attention_opts attention_opts(nt_ctx *ctx, float p, uint64_t off) {
  nt_attention_opts o = {p, nt_ctx_seed(ctx), off, false};
  return o;
}

static nt_status forward(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens, bool train,
                         const nt_unit_hooks *hooks) {
  const nt_gpt_config *c = &g->cfg;
  if (tokens->ndim != 2 || tokens->dtype != NT_I32)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "GPT tokens must be I32 [batch, seq]");
  int64_t b = tokens->shape[0], t = tokens->shape[1];
  if (b < 1 || b > g->B || t < 1 || t > g->T)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "GPT input [%lld, %lld] exceeds the allocated [%d, %d]",
                    (long long)b, (long long)t, g->B, g->T);
  g->b = (int)b;
  g->t = (int)t;
  refresh_views(g);
  int64_t C = c->n_embd, H = c->n_head, D = C / H, N = b * t;
  float p = train ? c->dropout : 0.0f;
  nt_tensor x0 = v3(&g->x0, b, t, C), tmp = v3(&g->tmp, b, t, C);
  nt_status st = unit_hook(ctx, g, hooks, g->emb_unit, nt_unit_before_forward);
  if (st) return st;
  if (p > 0.0f) {
    g->emb_off = nt_ctx_rng_reserve(ctx, (uint64_t)N * (uint64_t)C);
    st = nt_embedding_forward(ctx, tokens, &g->wte.w, &g->wpe.w, &tmp);
    if (!st) st = nt_dropout_forward(ctx, &tmp, &x0, p, nt_ctx_seed(ctx), g->emb_off);
  } else {
    st = nt_embedding_forward(ctx, tokens, &g->wte.w, &g->wpe.w, &x0);
  }
  nt_tensor x = x0;
  for (int l = 0; l < c->n_layer && !st; l++) {
    gpt_layer *L = &g->layers[l];
    nt_tensor ln1 = v3(&L->ln1, b, t, C), m1 = v1(&L->ln1_mean, N), r1 = v1(&L->ln1_rstd, N);
    nt_tensor qkv = v3(&L->qkv, b, t, 3 * C), ym = v3(&L->ym, b, t, C);
    nt_tensor q = heads(&qkv, H, D, 0), k = heads(&qkv, H, D, 1), v = heads(&qkv, H, D, 2);
    nt_tensor att = heads(&ym, H, D, 0);
    int64_t lsh[3] = {b, H, t};
    nt_tensor lse = nt_prefix_view(&L->lse, 3, lsh);
    nt_tensor x1 = v3(&L->x1, b, t, C), ln2 = v3(&L->ln2, b, t, C);
    nt_tensor m2 = v1(&L->ln2_mean, N), r2 = v1(&L->ln2_rstd, N);
    nt_tensor pre = v3(&L->fc_pre, b, t, 4 * C), act = v3(&L->act, b, t, 4 * C);
    nt_tensor x2 = v3(&L->x2, b, t, C);
    if (p > 0.0f) {
      L->att_off = nt_ctx_rng_reserve(ctx, (uint64_t)N * (uint64_t)C);
      L->mlp_off = nt_ctx_rng_reserve(ctx, (uint64_t)N * (uint64_t)C);
      L->attp_off = nt_ctx_rng_reserve(ctx, nt_attention_rng_numbers(b, H, t));
    }
    nt_attention_opts ao = attention_opts(ctx, p, L->attp_off);
    st = unit_hook(ctx, g, hooks, L->unit, nt_unit_before_forward);
    if (!st) st = nt_layernorm_forward(ctx, &x, &L->p[LN1_W].w, &L->p[LN1_B].w, &ln1, &m1, &r1);
    if (!st) st = lin_fwd(ctx, g, l, 0, &ln1, &L->p[QKV_W].w, &L->p[QKV_B].w, &qkv,
                                    NT_ACT_NONE, NULL);
    if (!st) st = nt_attention_forward_ex(ctx, &q, &k, &v, &att, &lse, &ao);
    if (!st) st = proj_residual(ctx, g, l, 1, p, L->att_off, &ym, &L->p[PROJ_W].w,
                                &L->p[PROJ_B].w, &x, &tmp, &x1);
    if (!st) st = nt_layernorm_forward(ctx, &x1, &L->p[LN2_W].w, &L->p[LN2_B].w, &ln2, &m2, &r2);
    if (!st) st = lin_fwd(ctx, g, l, 2, &ln2, &L->p[FC_W].w, &L->p[FC_B].w, &act, NT_ACT_GELU,
                                    &pre);
    if (!st) st = proj_residual(ctx, g, l, 3, p, L->mlp_off, &act, &L->p[FCP_W].w,
                                &L->p[FCP_B].w, &x1, &tmp, &x2);
    x = x2;
  }
  nt_tensor lnf = v3(&g->lnf, b, t, C), mf = v1(&g->lnf_mean, N), rf = v1(&g->lnf_rstd, N);
  if (!st) st = unit_hook(ctx, g, hooks, g->lnf_unit, nt_unit_before_forward);
  if (!st) st = nt_layernorm_forward(ctx, &x, &g->lnf_w.w, &g->lnf_b.w, &lnf, &mf, &rf);
  /* the head reads the embeddings unit again (FULL_SHARD may have freed it after its forward);
   * the callers run it on groups of rows (head_forward) */
  if (!st) st = unit_hook(ctx, g, hooks, g->emb_unit, nt_unit_before_forward);
  return st;
}

/* The group of the last forward's rows from r0 on (at most R of them, n), as views: ln_f's
 * output x and, in the logits buffer's first n rows, their logits; tg and losses: the same rows
 * of the targets and of g->losses (tg NULL: none). */
typedef struct {
  int64_t n;
  nt_tensor x, logits, tg, losses;
} head_group;

static head_group head_group_of(const nt_gpt *g, int64_t r0, const nt_tensor *tg) {
  int64_t N = (int64_t)g->b * g->t, n = N - r0 < g->R ? N - r0 : g->R;
  nt_tensor lnf2 = v2(&g->lnf, N, g->cfg.n_embd), losses = v1(&g->losses, N);
  head_group h = {n, nt_tensor_slice0(&lnf2, r0, n), logits_view(g, n), {0},
                  nt_tensor_slice0(&losses, r0, n)};
  if (tg) h.tg = nt_tensor_slice0(tg, r0, n);
  return h;
}

/* Tied head: logits = x @ wte^T. With a padded vocabulary the bias epilogue pushes the padded
 * columns to -30000: softmax gives them exactly 0, so neither the loss nor any gradient sees
 * them. */
static nt_status head_forward(nt_ctx *ctx, const nt_gpt *g, head_group *h) {
  nt_gemm_opts o = nt_gemm_defaults();
  o.trans_b = true;
  if (g->Vp != g->cfg.vocab_size) {
    o.epilogue = NT_EPI_BIAS;
    o.bias = &g->vmask;
  }
  return nt_gemm(ctx, &h->x, &g->wte.w, &h->logits, &o);
}

static nt_status check_targets(nt_ctx *ctx, const nt_gpt *g, const nt_tensor *targets) {
  if (targets->ndim != 2 || targets->dtype != NT_I32 || targets->shape[0] != g->b ||
      targets->shape[1] != g->t)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "GPT targets must be I32 [%d, %d] like the tokens", g->b,
                    g->t);
  return NT_OK;
}

nt_status nt_gpt_logits(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens, nt_tensor *logits) {
  nt_status st = forward(ctx, g, tokens, false, NULL);
  if (st) return st;
  int64_t N = (int64_t)g->b * g->t;
  if (N > g->R)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "GPT logits of %lld rows: the head forms at most %lld "
                    "at once (nt_gpt_config.head_rows)", (long long)N, (long long)g->R);
  head_group h = head_group_of(g, 0, NULL);
  st = head_forward(ctx, g, &h);
  if (!st) *logits = h.logits;
  return st;
}

nt_status nt_gpt_eval_loss(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens,
                           const nt_tensor *targets) {
  nt_status st = forward(ctx, g, tokens, false, NULL);
  if (!st) st = check_targets(ctx, g, targets);
  if (st) return st;
  int64_t N = (int64_t)g->b * g->t;
  nt_tensor losses = v1(&g->losses, N), tg = v1(targets, N);
  for (int64_t r0 = 0; r0 < N && !st; r0 += g->R) {
    head_group h = head_group_of(g, r0, &tg);
    st = head_forward(ctx, g, &h);
    if (!st) st = nt_cross_entropy_forward(ctx, &h.logits, &h.tg, &h.losses);
  }
  if (!st) st = nt_mean(ctx, &losses, &g->loss);
  return st;
}

/* The backward of a LayerNorm on the residual stream, x its input: dres += its dx. In the same
 * pass (ops/layernorm.h's extras) it prepares what the branch below reads: with dropout p > 0,
 * that branch's output gradient dtmp = dres through the branch's mask (the stream at next_off);
 * with `sums`, g->bsum = the column sums of that gradient, the branch's bias gradient (outside
 * FP8, whose backward sums it while quantizing). */
static nt_status ln_bwd(nt_ctx *ctx, nt_gpt *g, const nt_tensor *x, pv *w, pv *b,
                        const nt_tensor *mean, const nt_tensor *rstd, uint64_t next_off,
                        bool sums) {
  int64_t bb = g->b, t = g->t, C = g->cfg.n_embd;
  nt_tensor dres = v3(&g->dres, bb, t, C), dtmp = v3(&g->dtmp, bb, t, C), dc = v3(&g->dc, bb, t, C);
  float p = g->cfg.dropout;
  nt_layernorm_bwd_opts o = {NULL, p, nt_ctx_seed(ctx), next_off, sums ? &g->bsum : NULL};
  if (p > 0.0f) o.dropped = &dtmp;
  return nt_layernorm_backward_ex(ctx, &dc, x, &w->w, mean, rstd, &dres, &w->g, &b->g, &o);
}

/* On entry dres holds d(block output) and the LayerNorm backward above has prepared the MLP
 * branch's output gradient (dtmp with dropout, else dres itself) and, outside FP8, its bias
 * gradient in bsum (ln_bwd); on return the same holds for the block below, whose MLP branch
 * draws its mask at next_off (the embeddings' dropout for block 0, which has no bias).
 * Gradients of activations are overwritten, not accumulated, wherever the op can (GEMMs with
 * beta 0). */
static nt_status block_backward(nt_ctx *ctx, nt_gpt *g, gpt_layer *L, const nt_tensor *x,
                                uint64_t next_off) {
  int64_t b = g->b, t = g->t, C = g->cfg.n_embd, H = g->cfg.n_head, D = C / H, N = b * t;
  float p = g->cfg.dropout;
  nt_tensor dres = v3(&g->dres, b, t, C), dtmp = v3(&g->dtmp, b, t, C), dc = v3(&g->dc, b, t, C);
  nt_tensor act = v3(&L->act, b, t, 4 * C), dpre = v3(&g->dpre, b, t, 4 * C);
  nt_tensor dqkv = v3(&g->dqkv, b, t, 3 * C), datt = heads(&dc, H, D, 0);
  nt_tensor dq = heads(&dqkv, H, D, 0), dk = heads(&dqkv, H, D, 1), dv = heads(&dqkv, H, D, 2);
  nt_tensor ln1 = v3(&L->ln1, b, t, C), m1 = v1(&L->ln1_mean, N), r1 = v1(&L->ln1_rstd, N);
  nt_tensor qkv = v3(&L->qkv, b, t, 3 * C), ym = v3(&L->ym, b, t, C);
  nt_tensor q = heads(&qkv, H, D, 0), k = heads(&qkv, H, D, 1), v = heads(&qkv, H, D, 2);
  nt_tensor att = heads(&ym, H, D, 0);
  int64_t lsh[3] = {b, H, t};
  nt_tensor lse = nt_prefix_view(&L->lse, 3, lsh);
  nt_tensor x1 = v3(&L->x1, b, t, C), ln2 = v3(&L->ln2, b, t, C);
  nt_tensor m2 = v1(&L->ln2_mean, N), r2 = v1(&L->ln2_rstd, N);
  nt_tensor pre = v3(&L->fc_pre, b, t, 4 * C);
  pv *P = L->p;
  int l = (int)(L - g->layers);
  const bool sums = !g->fp8;
  const nt_tensor *dbranch = p > 0.0f ? &dtmp : &dres;
  /* MLP branch: x2 = x1 + drop(fc_proj(gelu(fc(ln2(x1))))) */
  nt_status st = mlp_bwd(ctx, g, l, dbranch, &ln2, &pre, &act, &dpre, &dc);
  if (!st) st = ln_bwd(ctx, g, &x1, &P[LN2_W], &P[LN2_B], &m2, &r2, L->att_off, sums);
  /* attention branch: x1 = x + drop(c_proj(attn(c_attn(ln1(x))))), attn on head views */
  if (!st) st = lin_bwd(ctx, g, l, 1, dbranch, &ym, &P[PROJ_W].w, &dc, &P[PROJ_W].g,
                        sums ? NULL : &P[PROJ_B].g, NULL);
  if (!st && sums) st = nt_add(ctx, &P[PROJ_B].g, &g->bsum, &P[PROJ_B].g);
  nt_attention_opts ao = attention_opts(ctx, p, L->attp_off);
  ao.overwrite = true;
  if (!st) st = nt_attention_backward_ex(ctx, &datt, &q, &k, &v, &att, &lse, &dq, &dk, &dv, &ao);
  if (!st) st = lin_bwd(ctx, g, l, 0, &dqkv, &ln1, &P[QKV_W].w, &dc, &P[QKV_W].g,
                                   &P[QKV_B].g, NULL);
  if (!st) st = ln_bwd(ctx, g, x, &P[LN1_W], &P[LN1_B], &m1, &r1, next_off, sums && l > 0);
  return st;
}

nt_status nt_gpt_train_step(nt_ctx *ctx, nt_gpt *g, const nt_tensor *tokens,
                            const nt_tensor *targets, const float *dloss_scale,
                            const nt_unit_hooks *hooks) {
  nt_status st = forward(ctx, g, tokens, true, hooks);
  if (!st) st = check_targets(ctx, g, targets);
  if (st) return st;
  const nt_gpt_config *c = &g->cfg;
  int64_t b = g->b, t = g->t, C = c->n_embd, N = b * t;
  nt_tensor losses = v1(&g->losses, N), tg = v1(targets, N);
  nt_tensor dc2 = v2(&g->dc, N, C), dres = v3(&g->dres, b, t, C);
  /* The head, forward and backward, on groups of rows (head_rows): the logits of a group,
   * then its losses and their gradient in place of the logits, then dlnf = dlogits @ wte and
   * dwte += dlogits^T @ lnf (the tied weight is the embeddings unit's, whose gradient is final
   * only after the embedding backward). */
  nt_gemm_opts dx_o = nt_gemm_defaults(), dw_o = nt_gemm_defaults();
  dw_o.trans_a = true;
  dw_o.beta = 1.0f;
  st = unit_hook(ctx, g, hooks, g->emb_unit, nt_unit_before_backward);
  for (int64_t r0 = 0; r0 < N && !st; r0 += g->R) {
    head_group h = head_group_of(g, r0, &tg);
    nt_tensor dx = nt_tensor_slice0(&dc2, r0, h.n);
    st = head_forward(ctx, g, &h);
    if (!st) st = nt_cross_entropy_fused(ctx, &h.logits, &h.tg, dloss_scale, N, &h.losses,
                                         &h.logits);
    if (!st) st = nt_gemm(ctx, &h.logits, &g->wte.w, &dx, &dx_o);
    if (!st) st = nt_gemm(ctx, &h.logits, &h.x, &g->wte.g, &dw_o);
  }
  if (!st) st = nt_mean(ctx, &losses, &g->loss);
  const nt_tensor *xl = c->n_layer ? &g->layers[c->n_layer - 1].x2 : &g->x0;
  nt_tensor xL = v3(xl, b, t, C), mf = v1(&g->lnf_mean, N), rf = v1(&g->lnf_rstd, N);
  /* the residual stream's gradient starts at ln_f's backward (every later one adds to it) */
  if (!st) st = nt_tensor_zero(ctx, &dres);
  if (!st) st = unit_hook(ctx, g, hooks, g->lnf_unit, nt_unit_before_backward);
  int n = c->n_layer;
  if (!st) st = ln_bwd(ctx, g, &xL, &g->lnf_w, &g->lnf_b, &mf, &rf,
                       n ? g->layers[n - 1].mlp_off : g->emb_off, n > 0 && !g->fp8);
  if (!st) st = unit_hook(ctx, g, hooks, g->lnf_unit, nt_unit_grads_ready);
  for (int l = n - 1; l >= 0 && !st; l--) {
    nt_tensor xin = v3(l ? &g->layers[l - 1].x2 : &g->x0, b, t, C);
    st = unit_hook(ctx, g, hooks, g->layers[l].unit, nt_unit_before_backward);
    if (!st) st = block_backward(ctx, g, &g->layers[l], &xin,
                                 l ? g->layers[l - 1].mlp_off : g->emb_off);
    if (!st) st = unit_hook(ctx, g, hooks, g->layers[l].unit, nt_unit_grads_ready);
  }
  /* the embeddings' output gradient: through their dropout (prepared by the last ln_bwd) */
  nt_tensor dtmp = v3(&g->dtmp, b, t, C);
  const nt_tensor *demb = c->dropout > 0.0f ? &dtmp : &dres;
  if (!st) st = nt_embedding_backward(ctx, tokens, demb, &g->wte.g, &g->wpe.g);
  if (!st) st = unit_hook(ctx, g, hooks, g->emb_unit, nt_unit_grads_ready);
  /* the amaxes recorded this step become the next step's FP8 scales */
  if (!st && g->fp8) st = nt_fp8_update(ctx, g->fp8);
  return st;
}

nt_status nt_gpt_enable_fp8(nt_ctx *ctx, nt_gpt *g, bool emulate) {
  if (g->fp8) return NT_OK;
  g->fp8_emulate = emulate;
  return nt_fp8_linear_state_create(ctx, NULL, 4 * g->cfg.n_layer, &g->fp8);
}
