/* The GPT as a trained model (train/model.h): tiny shakespeare (character level, nanoGPT's
 * split), an llm.c token shard, or synthetic tokens; batches of random windows as nanoGPT's
 * get_batch, drawn from a counter-based stream keyed by the iteration (so a resumed run sees the
 * same batches); evaluation as nanoGPT's estimate_loss; text sampling after training.
 *
 * Training batches come through data/'s loader (worker threads, pinned slots, the copy
 * stream): its dataset is the window stream, cut into loader epochs of CHUNK_ITERS
 * iterations. Sample `index` of loader epoch e is the window of counter
 * e * CHUNK_ITERS * B * world + index, and the loader's sampler gives rank r the indices
 * r, r + world, ...: at world size 1 batch k holds counters k * B .. k * B + B - 1, the
 * windows the single-process trainer always drew; other ranks draw other windows. */
#include "train/model.h"
#include "models/gpt.h"
#include "data/shards.h"
#include "data/text.h"
#include "models/state.h"
#include "train/preflight.h"
#include "core/stop.h"
#include "dist/comm.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  nt_model base;
  const nt_train_options *o;
  nt_gpt *g;
  nt_tensor tokens, targets;        /* device [B, T] */
  int32_t *hx, *hy;                 /* host batch */
  int32_t *data;                    /* all token ids */
  int64_t n, split;                 /* train [0, split), val [split, n) */
  nt_vocab vocab;
  bool have_vocab;
  nt_data_id data_id;               /* what it trains on (the checkpoint records it) */
  uint64_t data_seed;
  int64_t S;                        /* the window length (block size) */
  uint64_t chunk_samples;           /* dataset samples per loader epoch */
  nt_loader *loader;
  int64_t next_iter;                /* the iteration the loader's next batch belongs to (-1:
                                     * not positioned) */
  uint64_t waited_ns;
} gpt_run;

/* Iterations per loader epoch: a resume skips at most this many batches to find its place. */
#define CHUNK_ITERS 256

static nt_status micro_step(nt_ctx *ctx, nt_model *m, const nt_model_batch *b,
                            const float *loss_scale, const nt_unit_hooks *hooks) {
  gpt_run *r = m->impl;
  return nt_gpt_train_step(ctx, r->g, &b->inputs, &b->targets, loss_scale, hooks);
}

static const nt_tensor *loss(const nt_model *m) {
  const gpt_run *r = m->impl;
  return nt_gpt_loss(r->g);
}

/* Fills the host batch with b windows of length t from [lo, hi) and copies it to the device. */
static nt_status load_batch(nt_ctx *ctx, gpt_run *r, int64_t b, int64_t t, int64_t lo,
                            int64_t hi, uint64_t seed, uint64_t counter) {
  int64_t span = hi - lo - t;
  if (span < 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "a split of %lld tokens is too short for block %lld",
                    (long long)(hi - lo), (long long)t);
  for (int64_t i = 0; i < b; i++) {
    int64_t ix = lo + (int64_t)(nt_rng_u32(seed, counter + (uint64_t)i) % (uint64_t)span);
    memcpy(r->hx + i * t, r->data + ix, (size_t)t * sizeof(int32_t));
    memcpy(r->hy + i * t, r->data + ix + 1, (size_t)t * sizeof(int32_t));
  }
  int64_t shape[2] = {b, t};
  nt_tensor hx = nt_tensor_view(r->hx, NT_I32, nt_cpu(), 2, shape);
  nt_tensor hy = nt_tensor_view(r->hy, NT_I32, nt_cpu(), 2, shape);
  nt_tensor dx = nt_prefix_view(&r->tokens, 2, shape), dy = nt_prefix_view(&r->targets, 2, shape);
  nt_status st = nt_tensor_copy(ctx, &dx, &hx);
  if (!st) st = nt_tensor_copy(ctx, &dy, &hy);
  return st;
}

/* The loader's sample: a training window (x, y = x shifted by one) from [0, split). Runs on
 * worker threads; reads only what create set up. */
static nt_status window_sample(void *user, const nt_sample_info *info, void *const *dst) {
  const gpt_run *r = user;
  uint64_t counter = info->epoch * r->chunk_samples + (uint64_t)info->index;
  int64_t span = r->split - r->S;
  int64_t ix = (int64_t)(nt_rng_u32(r->data_seed, counter) % (uint64_t)span);
  memcpy(dst[0], r->data + ix, (size_t)r->S * sizeof(int32_t));
  memcpy(dst[1], r->data + ix + 1, (size_t)r->S * sizeof(int32_t));
  return NT_OK;
}

static nt_status load_data(nt_ctx *ctx, const nt_train_options *o, gpt_run *r,
                           nt_gpt_config *cfg) {
  nt_status st = NT_OK;
  const char *src = o->gpt_data ? o->gpt_data : "shakespeare";
  if (!strcmp(src, "synthetic")) {
    /* random tokens: a throughput workload with the real vocabulary size */
    r->n = 4 * 1024 * 1024;
    r->data = malloc((size_t)r->n * sizeof(int32_t));
    if (!r->data) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for synthetic tokens");
    for (int64_t i = 0; i < r->n; i++)
      r->data[i] = (int32_t)(nt_rng_u32(o->seed + 7, (uint64_t)i) % (uint32_t)cfg->vocab_size);
  } else if (strcmp(src, "shakespeare")) {
    nt_shard sh;
    st = nt_shard_read(ctx, src, &sh);
    if (st) return st;
    r->n = sh.n;
    r->data = malloc((size_t)r->n * sizeof(int32_t));
    if (!r->data) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for %s", src);
    for (int64_t i = 0; !st && i < r->n; i++) {
      r->data[i] = sh.tokens[i];
      if (sh.tokens[i] >= cfg->vocab_size)
        st = NT_ERROR(ctx, NT_ERR_FORMAT, "%s: token %u at %lld exceeds the vocabulary (%d)", src,
                      sh.tokens[i], (long long)i, cfg->vocab_size);
    }
    nt_shard_free(&sh);
  } else {
    char path[4096];
    if (!nt_tinyshakespeare_path(o->data_dir, path, sizeof path))
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                      "tiny shakespeare: pass --data-dir or set NT_DATA_DIR to the directory "
                      "holding tinyshakespeare.txt");
    nt_text text;
    st = nt_text_load(ctx, path, &text);
    if (st) return st;
    nt_vocab_build(&text, &r->vocab);
    r->have_vocab = true;
    r->n = text.n;
    r->data = malloc((size_t)r->n * sizeof(int32_t));
    if (!r->data) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for %s", path);
    if (!st) st = nt_vocab_encode(ctx, &r->vocab, text.bytes, text.n, r->data);
    nt_text_free(&text);
    /* a resume compares the whole vocabulary with the checkpoint's (check_vocab) */
    if (!st && o->resume == NULL) cfg->vocab_size = r->vocab.size;
  }
  if (!st) {
    r->split = nt_text_split_point(r->n);
    r->data_id = (nt_data_id){src, r->n,
                              nt_fnv1a(NT_FNV_OFFSET, r->data, (size_t)r->n * sizeof *r->data)};
  }
  return st;
}

/* Mean loss over eval_iters batches of each split (train, val), windows from their own stream. */
static nt_status evaluate(nt_ctx *ctx, nt_model *m, nt_eval_result *e) {
  gpt_run *r = m->impl;
  const nt_train_options *o = r->o;
  int64_t B = o->batch_size, S = r->g ? nt_gpt_get_config(r->g)->block_size : 0;
  int64_t iters = o->eval_iters > 0 ? o->eval_iters : 1;
  double out[2];
  for (int split = 0; split < 2; split++) {
    double sum = 0;
    for (int64_t i = 0; i < iters; i++) {
      if (nt_stop_requested()) return NT_OK;   /* the trainer drops a stopped evaluation */
      uint64_t ctr = (((uint64_t)e->round * 2 + (uint64_t)split) << 32) + (uint64_t)(i * B);
      int64_t lo = split ? r->split : 0, hi = split ? r->n : r->split;
      int64_t shape[2] = {B, S};
      nt_tensor x = nt_prefix_view(&r->tokens, 2, shape), y = nt_prefix_view(&r->targets, 2, shape);
      float l;
      nt_status st = load_batch(ctx, r, B, S, lo, hi, r->data_seed ^ 0x5eed5eedULL, ctr);
      if (!st) st = nt_gpt_eval_loss(ctx, r->g, &x, &y);
      if (!st) st = nt_model_read_scalar(ctx, nt_gpt_loss(r->g), &l);
      if (st) return st;
      sum += l;
    }
    out[split] = sum / (double)iters;
  }
  e->train_loss = out[0];
  e->val_loss = out[1];
  e->has_val = true;
  return NT_OK;
}

static int desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static nt_status sample_text(nt_ctx *ctx, gpt_run *r, int n, char **text) {
  const nt_gpt_config *c = nt_gpt_get_config(r->g);
  int V = c->vocab_size, Vp = nt_gpt_padded_vocab(c);
  int64_t S = c->block_size;
  int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
  float *probs = malloc((size_t)V * sizeof *probs), *sorted = malloc((size_t)V * sizeof *probs);
  void *row = malloc((size_t)Vp * 4);
  char *out = malloc((size_t)n * 8 + 1);
  nt_status st = NT_OK;
  if (!ids || !probs || !sorted || !row || !out) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory");
  int len = 1, k = r->o->top_k > 0 && r->o->top_k < V ? r->o->top_k : V;
  ids[0] = r->have_vocab && r->vocab.ids['\n'] >= 0 ? r->vocab.ids['\n'] : 0;
  float temp = r->o->temperature > 0 ? r->o->temperature : 1.0f;
  size_t olen = 0;
  for (int i = 0; i < n && !st; i++) {
    int64_t t = len < S ? len : S;
    int64_t shape[2] = {1, t};
    nt_tensor hx = nt_tensor_view(ids + len - t, NT_I32, nt_cpu(), 2, shape);
    nt_tensor dx = nt_prefix_view(&r->tokens, 2, shape), logits;
    st = nt_tensor_copy(ctx, &dx, &hx);
    if (!st) st = nt_gpt_logits(ctx, r->g, &dx, &logits);
    if (st) break;
    nt_tensor last = nt_tensor_slice0(&logits, t - 1, 1);
    int64_t vs[2] = {1, Vp};
    nt_tensor hrow = nt_tensor_view(row, logits.dtype, nt_cpu(), 2, vs);
    last = nt_prefix_view(&last, 2, vs);
    st = nt_tensor_copy(ctx, &hrow, &last);
    if (st) break;
    /* temperature, top-k, softmax, one draw */
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) {
      probs[v] = nt_load_f32(row, logits.dtype, v) / temp;
      if (probs[v] > mx) mx = probs[v];
    }
    float kth = -INFINITY;
    if (k < V) {   /* the k-th largest logit */
      memcpy(sorted, probs, (size_t)V * sizeof *probs);
      qsort(sorted, (size_t)V, sizeof *sorted, desc);
      kth = sorted[k - 1];
    }
    double sum = 0;
    for (int v = 0; v < V; v++) sum += probs[v] >= kth ? exp((double)(probs[v] - mx)) : 0.0;
    double u = nt_rng_u32_to_uniform(nt_rng_u32(r->o->seed + 3, (uint64_t)i)) * sum, acc = 0;
    int pick = V - 1;
    for (int v = 0; v < V; v++) {
      if (probs[v] < kth) continue;
      acc += exp((double)(probs[v] - mx));
      if (acc >= u) {
        pick = v;
        break;
      }
    }
    ids[len++] = pick;
    if (!r->have_vocab) {
      olen += (size_t)snprintf(out + olen, 8, "%d ", pick);
    } else if (pick >= r->vocab.size) {   /* the model and the vocabulary disagree */
      st = NT_ERROR(ctx, NT_ERR_STATE, "sampled id %d is outside the vocabulary of %d "
                    "characters", pick, r->vocab.size);
    } else {
      /* control bytes (a NUL in the corpus) as \xHH: the sample is text */
      uint8_t ch = r->vocab.chars[pick];
      if ((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f)
        olen += (size_t)snprintf(out + olen, 8, "\\x%02x", ch);
      else
        out[olen++] = (char)ch;
    }
  }
  if (out) out[olen] = 0;
  free(ids);
  free(probs);
  free(sorted);
  free(row);
  if (st) {
    free(out);
    return st;
  }
  *text = out;
  return NT_OK;
}

static nt_status after_training(nt_ctx *ctx, nt_model *m, nt_train_result *res, FILE *out) {
  gpt_run *r = m->impl;
  if (r->o->sample_tokens <= 0) return NT_OK;
  nt_status st = sample_text(ctx, r, r->o->sample_tokens, &res->sample);
  if (!st && out) fprintf(out, "---- sample ----\n%s\n----------------\n", res->sample);
  return st;
}

static nt_status start_epoch(nt_ctx *ctx, nt_model *m, uint64_t epoch, int64_t skip) {
  (void)ctx;
  (void)m;
  (void)epoch;
  (void)skip;
  return NT_OK;   /* next_batch positions the loader by the iteration itself */
}

/* Stages the batch of iteration `iter` from the loader into the fixed token buffers (a captured
 * step reads them). The loader runs ahead sequentially; a jump (the first batch, a resume)
 * repositions it: its epoch, then the batches before `iter` in that epoch are skipped. */
static nt_status next_batch(nt_ctx *ctx, nt_model *m, int64_t iter, nt_model_batch *b,
                            bool *end, double *wait_s) {
  gpt_run *r = m->impl;
  nt_status st = NT_OK;
  *end = false;
  *wait_s = 0;
  if (iter != r->next_iter || iter % CHUNK_ITERS == 0) {
    st = nt_loader_set_epoch(r->loader, (uint64_t)(iter / CHUNK_ITERS));
    for (int64_t k = 0; !st && k < iter % CHUNK_ITERS; k++) {
      nt_batch skip;
      bool e;
      st = nt_loader_next(r->loader, &skip, &e);
    }
    nt_loader_reset_stats(r->loader);
    r->waited_ns = 0;
  }
  nt_batch lb;
  bool done = false;
  if (!st) st = nt_model_loader_next(r->loader, &r->waited_ns, &lb, &done, wait_s);
  if (!st && done)
    st = NT_ERROR(ctx, NT_ERR_STATE, "GPT loader: epoch %lld ended early",
                  (long long)(iter / CHUNK_ITERS));
  if (st) return st;
  r->next_iter = iter + 1;
  b->inputs = r->tokens;
  b->targets = r->targets;
  b->size = lb.size;
  int64_t shape[2] = {lb.size, r->S};
  nt_tensor x = nt_tensor_view(lb.field[0].data, NT_I32, lb.field[0].device, 2, shape);
  nt_tensor y = nt_tensor_view(lb.field[1].data, NT_I32, lb.field[1].device, 2, shape);
  st = nt_tensor_copy(ctx, &b->inputs, &x);
  if (!st) st = nt_tensor_copy(ctx, &b->targets, &y);
  return st;
}

static void write_config(nt_jw *w, const nt_model *m) {
  const gpt_run *r = m->impl;
  const nt_gpt_config *c = nt_gpt_get_config(r->g);
  nt_jw_key(w, "n_layer");
  nt_jw_i64(w, c->n_layer);
  nt_jw_key(w, "n_head");
  nt_jw_i64(w, c->n_head);
  nt_jw_key(w, "n_embd");
  nt_jw_i64(w, c->n_embd);
  nt_jw_key(w, "block_size");
  nt_jw_i64(w, c->block_size);
  nt_jw_key(w, "vocab_size");
  nt_jw_i64(w, c->vocab_size);
  nt_jw_key(w, "dropout");
  nt_jw_num(w, c->dropout);
  if (r->have_vocab) {
    nt_jw_key(w, "vocab");   /* the characters of ids 0..V-1: a resume checks its corpus */
    nt_vocab_write_json(w, &r->vocab);
  }
  nt_data_id_write(w, &r->data_id);
}

/* Resume: the corpus must be the one the checkpoint was trained on (its vocabulary, then its
 * contents); samples are decoded with the checkpoint's vocabulary. */
static nt_status check_vocab(nt_ctx *ctx, gpt_run *r, const nt_json *config) {
  const nt_json *saved = nt_json_get(config, "vocab");
  if (r->have_vocab) {
    nt_status st = nt_vocab_check_json(ctx, saved, &r->vocab);
    if (!st) st = nt_vocab_read_json(ctx, saved, &r->vocab);
    if (!st) st = nt_preflight_data(ctx, config, &r->data_id, r->o->data_dir);
    return st;
  }
  if (saved)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "--resume: the checkpoint was trained on a text "
                    "corpus (its vocabulary is saved); this run reads '%s' tokens",
                    r->o->gpt_data);
  return nt_preflight_data(ctx, config, &r->data_id, r->o->data_dir);
}


static void gpt_free(nt_ctx *ctx, nt_model *m) {
  gpt_run *r = m->impl;
  nt_loader_free(r->loader);   /* first: its workers read the data */
  nt_tensor_free(ctx, &r->tokens);
  nt_tensor_free(ctx, &r->targets);
  nt_gpt_free(ctx, r->g);
  free(r->hx);
  free(r->hy);
  free(r->data);
  free(r);
}

static const nt_model_ops gpt_ops = {"gpt",        "tokens",       micro_step,  loss,
                                     evaluate,     start_epoch,    next_batch,  write_config,
                                     after_training, gpt_free};

nt_status nt_model_gpt_create(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                              const nt_json *config, nt_model **out) {
  *out = NULL;
  gpt_run *r = calloc(1, sizeof *r);
  if (!r) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the GPT run");
  r->base.ops = &gpt_ops;
  r->base.impl = r;
  r->o = o;
  nt_gpt_config cfg = o->gpt;
  /* a resume's shape is in o already (train_checkpoint.c merges it); config is the
   * checkpoint's model_config */
  nt_status st = load_data(ctx, o, r, &cfg);
  if (!st && config) st = check_vocab(ctx, r, config);
  /* each split must hold one sample (block + 1 tokens): said now, not after minutes */
  if (!st) st = nt_preflight_block(ctx, r->split, r->n - r->split, cfg.block_size);
  nt_dtype dt = pol->compute_dtype;
  int64_t B = o->batch_size, S = cfg.block_size;
  nt_model *m = &r->base;
  nt_model_sizes sizes;
  if (!st) st = nt_gpt_estimate(ctx, &cfg, dt, (int)B, (int)S, &sizes);
  if (!st) {
    /* memest's figures against free memory before anything large is allocated (the tokens
     * are loaded already); on the host: the batch buffers and the loader's slots of x and y */
    nt_memest_compute(&sizes, dt, B, S, S * cfg.vocab_size, o->dist.fsdp.strategy,
                      o->world_size, nt_ctx_is_cuda(ctx) ? NT_MEMEST_WORKSPACE_BYTES : 0,
                      &m->estimate);
    double batch = (double)B * (double)S * 2 * sizeof(int32_t);
    st = nt_preflight_run_memory(ctx, &m->estimate, batch * (1 + 2 * o->num_workers + 2));
  }
  if (!st) st = nt_gpt_create(ctx, &cfg, dt, (int)B, (int)S, &r->g);
  if (!st) st = nt_params_init(ctx, nt_gpt_params(r->g), o->seed);
  if (!st && pol->fp8) st = nt_gpt_enable_fp8(ctx, r->g, false);
  int64_t bt[2] = {B, S};
  if (!st) st = nt_tensor_alloc(ctx, &r->tokens, NT_I32, 2, bt);
  if (!st) st = nt_tensor_alloc(ctx, &r->targets, NT_I32, 2, bt);
  r->hx = malloc((size_t)(B * S) * sizeof(int32_t));
  r->hy = malloc((size_t)(B * S) * sizeof(int32_t));
  if (!st && (!r->hx || !r->hy)) st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for batches");
  r->data_seed = o->seed + 1;
  r->S = S;
  r->next_iter = -1;
  if (!st) {
    nt_dataset ds;
    memset(&ds, 0, sizeof ds);
    r->chunk_samples = (uint64_t)CHUNK_ITERS * (uint64_t)B * (uint64_t)o->world_size;
    ds.len = (int64_t)r->chunk_samples;
    ds.n_fields = 2;
    ds.fields[0] = (nt_field_spec){NT_I32, 1, {S}};
    ds.fields[1] = (nt_field_spec){NT_I32, 1, {S}};
    ds.get = window_sample;
    ds.user = r;
    nt_loader_opts lo = nt_loader_default_opts();
    lo.batch_size = B;
    lo.drop_last = true;
    lo.num_workers = o->num_workers;
    lo.rank = o->rank;
    lo.world_size = o->world_size;
    st = nt_loader_create(ctx, &ds, &lo, &r->loader);
  }
  if (st) {
    gpt_free(ctx, m);
    return st;
  }
  m->params = nt_gpt_params(r->g);
  m->compute = dt;
  m->items_per_step = B * S;
  m->flops_per_item = nt_gpt_flops_per_token(r->g, (int)S);
  snprintf(m->summary, sizeof m->summary,
           "gpt: %d layers, %d heads, %d wide, block %d, vocab %d, %.2fM parameters, %s on %s, "
           "batch %lld, %lld iterations", cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size,
           cfg.vocab_size, (double)nt_gpt_num_params(r->g, true) / 1e6,
           nt_precision_name(pol->precision), nt_ctx_is_cuda(ctx) ? "cuda" : "cpu",
           (long long)B, (long long)o->max_iters);
  *out = m;
  return NT_OK;
}
