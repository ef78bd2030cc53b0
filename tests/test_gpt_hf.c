/* GPT-2 weights in Hugging Face's layout (models/gpt_hf.h): the test writes a tiny GPT-2 as
 * transformers would save it (Conv1D weights [in, out], names without "transformer.", the
 * attention mask buffers, 16 positions for a block of 8, a vocabulary of 1030 that the GPT pads
 * to 1088 rows), loads it, and checks the GPT's logits against a plain double-precision GPT-2
 * forward computed from the file's arrays in this file. Then the same weights as BF16 under
 * "transformer." with a tied lm_head give bit-identical logits, and broken files are refused
 * with errors that name the problem. Compiled twice: the CPU test and, with NT_TEST_GPU,
 * gpu_test_gpt_hf.c (a CUDA model: the loader's copies to the device). */
#include "tests/testutil.h"
#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "models/safetensors.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { L = 2, H = 2, C = 16, T = 8, NPOS = 16, V = 1030, B = 2 };
enum { LN1W, LN1B, QKVW, QKVB, PRW, PRB, LN2W, LN2B, FCW, FCB, FPW, FPB, NP };

static const char *const pnames[NP] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias"};
/* HF shapes: Conv1D weights [in, out] */
static const int64_t prow[NP] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
static const int64_t pcol[NP] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};

typedef struct {
  float *wte, *wpe, *lnfw, *lnfb, *p[L][NP], *mask;
} hf_weights;

static float *rnd(nt_test_rng *r, int64_t n, float center, float scale) {
  float *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    /* values representable in bf16, so F32 and BF16 files hold the same numbers */
    x[i] = nt_bf16_to_f32(nt_f32_to_bf16(center + scale * (float)nt_test_normal(r)));
  }
  return x;
}

static void make_weights(hf_weights *w) {
  nt_test_rng r = {42};
  w->wte = rnd(&r, (int64_t)V * C, 0, 0.3f);
  w->wpe = rnd(&r, (int64_t)NPOS * C, 0, 0.1f);
  w->lnfw = rnd(&r, C, 1, 0.1f);
  w->lnfb = rnd(&r, C, 0, 0.1f);
  for (int l = 0; l < L; l++)
    for (int j = 0; j < NP; j++) {
      bool lnw = j == LN1W || j == LN2W;
      int64_t n = prow[j] * (pcol[j] ? pcol[j] : 1);
      w->p[l][j] = rnd(&r, n, lnw ? 1.0f : 0.0f, pcol[j] ? 0.25f : 0.1f);
    }
  w->mask = calloc(T * T, sizeof *w->mask);
  for (int i = 0; i < T; i++)
    for (int j = 0; j <= i; j++) w->mask[i * T + j] = 1;
}

static void free_weights(hf_weights *w) {
  free(w->wte);
  free(w->wpe);
  free(w->lnfw);
  free(w->lnfb);
  free(w->mask);
  for (int l = 0; l < L; l++)
    for (int j = 0; j < NP; j++) free(w->p[l][j]);
}

/* Writes the weights as a HF checkpoint. extra: one more tensor name (or NULL); head: add
 * lm_head.weight (its first element changed when untied). */
static bool write_hf(nt_ctx *ctx, const char *path, const hf_weights *w, const char *prefix,
                     nt_dtype dt, bool head, bool untied, const char *extra) {
  enum { MAXT = 4 + L * (NP + 1) + 2 };
  nt_named_tensor ts[MAXT];
  char names[MAXT][96];
  int n = 0;
  int64_t se[2] = {V, C}, sp[2] = {NPOS, C}, sc[1] = {C}, sm[4] = {1, 1, T, T};
#define ADD(nm, ptr, nd, shp)                                                  \
  do {                                                                       \
    snprintf(names[n], sizeof names[n], "%s%s", prefix, nm);                 \
    ts[n].name = names[n];                                                   \
    ts[n++].t = nt_tensor_view((void *)(ptr), NT_F32, nt_cpu(), (nd), (shp)); \
  } while (0)
  ADD("wte.weight", w->wte, 2, se);
  ADD("wpe.weight", w->wpe, 2, sp);
  for (int l = 0; l < L; l++) {
    char nm[64];
    for (int j = 0; j < NP; j++) {
      int64_t s[2] = {prow[j], pcol[j]};
      snprintf(nm, sizeof nm, "h.%d.%s", l, pnames[j]);
      ADD(nm, w->p[l][j], pcol[j] ? 2 : 1, s);
    }
    snprintf(nm, sizeof nm, "h.%d.attn.bias", l);
    ADD(nm, w->mask, 4, sm);
  }
  ADD("ln_f.weight", w->lnfw, 1, sc);
  ADD("ln_f.bias", w->lnfb, 1, sc);
  float *lm = NULL;
  if (head) {
    lm = malloc((size_t)V * C * sizeof *lm);
    memcpy(lm, w->wte, (size_t)V * C * sizeof *lm);
    if (untied) lm[0] += 1.0f;
    snprintf(names[n], sizeof names[n], "lm_head.weight");
    ts[n].name = names[n];
    ts[n++].t = nt_tensor_view(lm, NT_F32, nt_cpu(), 2, se);
  }
  if (extra) ADD(extra, w->lnfb, 1, sc);
#undef ADD
  bool ok = CHECK_OK(ctx, nt_safetensors_save_as(ctx, path, ts, n, NULL, dt));
  free(lm);
  return ok;
}

static void layernorm(const double *x, const float *w, const float *b, double *y) {
  double mean = 0, var = 0;
  for (int i = 0; i < C; i++) mean += x[i];
  mean /= C;
  for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
  var /= C;
  double rstd = 1.0 / sqrt(var + 1e-5);
  for (int i = 0; i < C; i++) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
}

/* y[out] = x[in] @ W[in, out] + b (Conv1D) */
static void conv1d(const double *x, const float *W, const float *b, int in, int out, double *y) {
  for (int o = 0; o < out; o++) {
    double s = b[o];
    for (int i = 0; i < in; i++) s += x[i] * W[(size_t)i * out + o];
    y[o] = s;
  }
}

static double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* GPT-2's forward for one sequence, from the HF arrays: logits [T, V]. */
static void reference(const hf_weights *w, const int32_t *tok, double *logits) {
  static double x[T][C], h[T][C], qkv[T][3 * C], y[T][C], t1[4 * C], t2[C];
  for (int t = 0; t < T; t++)
    for (int i = 0; i < C; i++) x[t][i] = (double)w->wte[tok[t] * C + i] + w->wpe[t * C + i];
  const int D = C / H;
  for (int l = 0; l < L; l++) {
    float *const *p = w->p[l];
    for (int t = 0; t < T; t++) {
      layernorm(x[t], p[LN1W], p[LN1B], h[t]);
      conv1d(h[t], p[QKVW], p[QKVB], C, 3 * C, qkv[t]);
    }
    for (int hd = 0; hd < H; hd++)
      for (int t = 0; t < T; t++) {
        double s[T], mx = -1e300, z = 0;
        for (int u = 0; u <= t; u++) {
          s[u] = 0;
          for (int d = 0; d < D; d++) s[u] += qkv[t][hd * D + d] * qkv[u][C + hd * D + d];
          s[u] /= sqrt((double)D);
          mx = fmax(mx, s[u]);
        }
        for (int u = 0; u <= t; u++) z += (s[u] = exp(s[u] - mx));
        for (int d = 0; d < D; d++) {
          double a = 0;
          for (int u = 0; u <= t; u++) a += s[u] / z * qkv[u][2 * C + hd * D + d];
          y[t][hd * D + d] = a;
        }
      }
    for (int t = 0; t < T; t++) {
      conv1d(y[t], p[PRW], p[PRB], C, C, t2);
      for (int i = 0; i < C; i++) x[t][i] += t2[i];
      layernorm(x[t], p[LN2W], p[LN2B], h[t]);
      conv1d(h[t], p[FCW], p[FCB], C, 4 * C, t1);
      for (int i = 0; i < 4 * C; i++) t1[i] = gelu_tanh(t1[i]);
      conv1d(t1, p[FPW], p[FPB], 4 * C, C, t2);
      for (int i = 0; i < C; i++) x[t][i] += t2[i];
    }
  }
  for (int t = 0; t < T; t++) {
    layernorm(x[t], w->lnfw, w->lnfb, h[t]);
    for (int v = 0; v < V; v++) {
      double s = 0;
      for (int i = 0; i < C; i++) s += h[t][i] * w->wte[v * C + i];
      logits[t * V + v] = s;
    }
  }
}

/* Loads `path` into a fresh GPT (vocab `vocab`, `layers` layers) on ctx's device; logits
 * [B*T, V] as float, and whether wte's padded rows are zero. */
static nt_status load_and_run(nt_ctx *ctx, const char *path, int layers, int vocab,
                              const int32_t *tok, float *out, bool *pad_zero) {
  nt_gpt_config cfg = {layers, H, C, T, vocab, 0.0f, 0};
  int Vp = nt_gpt_padded_vocab(&cfg);
  nt_gpt *g;
  nt_status st = nt_gpt_create(ctx, &cfg, NT_F32, B, T, &g);
  if (st) return st;
  st = nt_gpt_load_hf(ctx, g, path);
  int64_t s[2] = {B, T};
  nt_tensor tk = {0}, lg;
  float *all = malloc(sizeof(float) * B * T * Vp), *wte = malloc(sizeof(float) * Vp * C);
  if (!st && out) st = nt_tensor_alloc(ctx, &tk, NT_I32, 2, s);
  if (!st && out) {
    nt_tensor ht = nt_tensor_view((void *)tok, NT_I32, nt_cpu(), 2, s);
    st = nt_tensor_copy(ctx, &tk, &ht);
    if (!st) st = nt_gpt_logits(ctx, g, &tk, &lg);
    nt_tensor hl = nt_tensor_view(all, NT_F32, nt_cpu(), 2, lg.shape);
    if (!st) st = nt_tensor_copy(ctx, &hl, &lg);
    for (int r = 0; !st && r < B * T; r++)
      for (int v = 0; v < V; v++) out[r * V + v] = all[(int64_t)r * Vp + v];
    int u, i;
    if (!st && nt_params_find(nt_gpt_params(g), "transformer.wte.weight", &u, &i)) {
      nt_tensor m = nt_params_view(nt_gpt_params(g), u, i, NT_VIEW_MASTER);
      nt_tensor hw = nt_tensor_view(wte, NT_F32, nt_cpu(), 2, m.shape);
      st = nt_tensor_copy(ctx, &hw, &m);
      *pad_zero = Vp > V;
      for (int64_t k = (int64_t)V * C; !st && k < (int64_t)Vp * C; k++)
        *pad_zero = *pad_zero && wte[k] == 0.0f;
    }
  }
  nt_tensor_free(ctx, &tk);
  free(all);
  free(wte);
  nt_gpt_free(ctx, g);
  return st;
}

int main(void) {
  nt_ctx *ctx;
#ifdef NT_TEST_GPU
  if (!(ctx = nt_test_cuda_ctx())) return nt_test_skip("no GPU");
  const double tol = 1e-4;   /* other summation orders than the double reference */
#else
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  const double tol = 1e-5;
#endif
  char dir[64] = "/tmp/nt_test_gpt_hf_XXXXXX", p1[128], p2[128], bad[128];
  if (!mkdtemp(dir)) return 1;
  snprintf(p1, sizeof p1, "%s/gpt2.safetensors", dir);
  snprintf(p2, sizeof p2, "%s/gpt2_bf16.safetensors", dir);
  snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
  hf_weights w;
  make_weights(&w);
  int32_t tok[B * T];
  nt_test_rng r = {7};
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)nt_test_uniform(&r, 0, V);
  tok[3] = V - 1;   /* the last real row */
  double *ref = malloc(sizeof(double) * B * T * V);
  float *got = malloc(sizeof(float) * B * T * V), *got2 = malloc(sizeof(float) * B * T * V);
  for (int b = 0; b < B; b++) reference(&w, tok + b * T, ref + (size_t)b * T * V);

  bool pad_zero = false;
  if (write_hf(ctx, p1, &w, "", NT_F32, false, false, NULL) &&
      CHECK_OK(ctx, load_and_run(ctx, p1, L, V, tok, got, &pad_zero))) {
    double num = 0, den = 0, mx = 0;
    for (int i = 0; i < B * T * V; i++) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
      mx = fmax(mx, fabs(got[i] - ref[i]));
    }
    double rel = sqrt(num / den);
    printf("HF GPT-2 logits against the reference: rel err %.2e, max abs %.2e\n", rel, mx);
    CHECK(rel < tol, "logits match the GPT-2 reference (rel err %.2e)", rel);
    CHECK(pad_zero, "wte's padded rows 1030..1087 are zero");
  }
  /* BF16 under "transformer.", with the tied head: the same numbers, so identical logits */
  if (write_hf(ctx, p2, &w, "transformer.", NT_BF16, true, false, NULL) &&
      CHECK_OK(ctx, load_and_run(ctx, p2, L, V, tok, got2, &pad_zero)))
    CHECK(!memcmp(got, got2, sizeof(float) * B * T * V), "BF16 + prefix + tied head: identical");

  /* refusals */
  if (write_hf(ctx, bad, &w, "", NT_F32, true, true, NULL))
    CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, load_and_run(ctx, bad, L, V, tok, NULL, NULL));
  if (write_hf(ctx, bad, &w, "", NT_F32, false, false, "h.0.attn.rotary")) {
    CHECK_ERR(ctx, NT_ERR_FORMAT, load_and_run(ctx, bad, L, V, tok, NULL, NULL));
    CHECK(strstr(nt_last_error(ctx), "h.0.attn.rotary") != NULL, "names the extra tensor");
  }
  CHECK_ERR(ctx, NT_ERR_FORMAT, load_and_run(ctx, p1, L + 1, V, tok, NULL, NULL));
  CHECK(strstr(nt_last_error(ctx), "h.2.ln_1.weight") != NULL, "names a missing tensor");
  CHECK_ERR(ctx, NT_ERR_SHAPE, load_and_run(ctx, p1, L - 1, V, tok, NULL, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, load_and_run(ctx, p1, L, V + 1, tok, NULL, NULL));
  CHECK(strstr(nt_last_error(ctx), "vocab_size 1031") != NULL, "names the vocabulary");

  free(ref);
  free(got);
  free(got2);
  free_weights(&w);
  unlink(p1);
  unlink(p2);
  unlink(bad);
  rmdir(dir);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
