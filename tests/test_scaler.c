/* Loss scaler: docs/semantics.md's vectors A-E bit-exact, the misuse errors, the extras (min/max
 * scale, hysteresis), presets, state save/load, disabled scaler, unscale arithmetic.
 * Compiled twice: as the CPU test, and with NT_TEST_GPU (gpu_test_scaler.c) on the GPU. */
#include "testutil.h"
#include "amp/scaler.h"
#include <math.h>
#include <string.h>

/* A 7-element F32 gradient on ctx's device; `bad` puts a non-finite value at index 3. */
typedef struct { nt_tensor t; } grad_buf;

static bool grads_set(nt_ctx *ctx, grad_buf *g, float bad, bool inject) {
  float h[7] = {0.5f, -1.0f, 2.0f, 3.0f, -0.25f, 8.0f, 1e-3f};
  if (inject) h[3] = bad;
  int64_t n = 7;
  nt_tensor src = nt_tensor_view(h, NT_F32, nt_cpu(), 1, &n);
  return CHECK_OK(ctx, nt_tensor_copy(ctx, &g->t, &src));
}

/* One full step: unscale (with overflow or not), step, update; returns (scale, tracker). */
static bool one_step(nt_ctx *ctx, nt_scaler *s, grad_buf *g, bool overflow, float *scale,
                     int *tracker) {
  nt_tensor *gl[1] = {&g->t};
  const nt_tensor *found = NULL;
  if (!grads_set(ctx, g, INFINITY, overflow)) return false;
  if (!CHECK_OK(ctx, nt_scaler_unscale(ctx, s, gl, 1))) return false;
  if (!CHECK_OK(ctx, nt_scaler_step(ctx, s, NULL, 0, &found))) return false;
  CHECK(found != NULL, "step hands out found_inf");
  if (!CHECK_OK(ctx, nt_scaler_update(ctx, s))) return false;
  nt_scaler_values v;
  if (!CHECK_OK(ctx, nt_scaler_read(ctx, s, &v))) return false;
  *scale = v.scale;
  *tracker = v.growth_tracker;
  return true;
}

static void run_vector(nt_ctx *ctx, grad_buf *g, const char *name, float init, int interval,
                       const char *pattern, const float *scales, const int *trackers) {
  nt_scaler_options o = nt_scaler_defaults();
  nt_scaler *s = NULL;
  o.init_scale = init;
  o.growth_interval = interval;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) return;
  for (int i = 0; pattern[i]; i++) {
    float sc;
    int tr;
    if (!one_step(ctx, s, g, pattern[i] == 'T', &sc, &tr)) break;
    CHECK(memcmp(&sc, &scales[i], 4) == 0 && tr == trackers[i],
          "vector %s step %d: got (%g,%d), expected (%g,%d)", name, i, (double)sc, tr,
          (double)scales[i], trackers[i]);
  }
  nt_scaler_free(ctx, s);
}

static void test_vectors(nt_ctx *ctx, grad_buf *g) {
  const float a_s[] = {8, 8, 16, 16, 16, 32, 32};
  const int a_t[] = {1, 2, 0, 1, 2, 0, 1};
  run_vector(ctx, g, "A", 8, 3, "FFFFFFF", a_s, a_t);
  const float b_s[] = {4, 4, 4, 8, 4, 4};
  const int b_t[] = {0, 1, 2, 0, 0, 1};
  run_vector(ctx, g, "B", 8, 3, "TFFFTF", b_s, b_t);
  const float c_s[] = {8, 8, 4, 4, 4, 8, 4, 2};
  const int c_t[] = {1, 2, 0, 1, 2, 0, 0, 0};
  run_vector(ctx, g, "C", 8, 3, "FFTFFFTT", c_s, c_t);
  const float d_s[] = {ldexpf(1, 127), ldexpf(1, 127), ldexpf(1, 126)};
  const int d_t[] = {0, 0, 0};
  run_vector(ctx, g, "D", ldexpf(1, 127), 1, "FFT", d_s, d_t);

  /* E: init 1, every step overflows: 2^-149 (bits 0x1) after 149, exactly 0 after 150. */
  nt_scaler_options o = nt_scaler_defaults();
  nt_scaler *s = NULL;
  o.init_scale = 1.0f;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) return;
  for (int i = 1; i <= 150; i++) {
    float sc;
    int tr;
    if (!one_step(ctx, s, g, true, &sc, &tr)) break;
    uint32_t bits;
    memcpy(&bits, &sc, 4);
    if (i == 149) CHECK(bits == 1u, "E after 149: %g (bits %08x), expected 1.401298e-45", (double)sc, bits);
    if (i == 150) CHECK(bits == 0u, "E after 150: %g (bits %08x), expected 0", (double)sc, bits);
    if (i < 149) CHECK(sc == ldexpf(1.0f, -i), "E after %d: %g", i, (double)sc);
  }
  nt_scaler_values v;
  if (CHECK_OK(ctx, nt_scaler_read(ctx, s, &v)))
    CHECK(v.skipped_total == 150 && v.updates == 150 && v.last_skipped == 149,
          "E counters: skipped %lld updates %lld last %lld", (long long)v.skipped_total,
          (long long)v.updates, (long long)v.last_skipped);
  nt_scaler_free(ctx, s);
}

/* Reads a device F32 scalar. */
static float read_scalar(nt_ctx *ctx, const nt_tensor *t) {
  float x = NAN;
  nt_tensor h = nt_tensor_view(&x, NT_F32, nt_cpu(), 0, NULL);
  CHECK_OK(ctx, nt_tensor_copy(ctx, &h, t));
  return x;
}

static void test_unscale_values(nt_ctx *ctx, grad_buf *g) {
  nt_scaler_options o = nt_scaler_defaults();
  nt_scaler *s = NULL;
  nt_tensor *gl[1] = {&g->t};
  o.init_scale = 3.0f;   /* inv = (float)(1/3.0) is not a power of two: exercises the rounding */
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) return;
  nt_tensor inv_t = nt_scaler_inv_scale_tensor(s), sc_t = nt_scaler_scale_tensor(s);
  float inv = read_scalar(ctx, &inv_t);
  CHECK(inv == (float)(1.0 / 3.0) && read_scalar(ctx, &sc_t) == 3.0f, "inv_scale %.9g", (double)inv);
  grads_set(ctx, g, 0, false);
  float h[7], out[7];
  int64_t n = 7;
  nt_tensor ht = nt_tensor_view(out, NT_F32, nt_cpu(), 1, &n);
  nt_tensor src = nt_tensor_view(h, NT_F32, nt_cpu(), 1, &n);
  CHECK_OK(ctx, nt_tensor_copy(ctx, &src, &g->t));
  CHECK_OK(ctx, nt_scaler_unscale(ctx, s, gl, 1));
  CHECK_OK(ctx, nt_tensor_copy(ctx, &ht, &g->t));
  int bad = 0;
  for (int i = 0; i < 7; i++) bad += out[i] != h[i] * inv;
  CHECK(bad == 0, "%d unscaled values differ from g * inv_scale", bad);
  nt_tensor found_t = nt_scaler_found_inf_tensor(s);
  CHECK(read_scalar(ctx, &found_t) == 0.0f, "no overflow recorded for finite grads");
  CHECK_OK(ctx, nt_scaler_update(ctx, s));
  /* NaN and -inf count as overflow too. */
  const float bads[2] = {NAN, -INFINITY};
  for (int k = 0; k < 2; k++) {
    grads_set(ctx, g, bads[k], true);
    CHECK_OK(ctx, nt_scaler_unscale(ctx, s, gl, 1));
    CHECK(read_scalar(ctx, &found_t) != 0.0f, "non-finite value %g sets found_inf", (double)bads[k]);
    CHECK_OK(ctx, nt_scaler_update(ctx, s));
  }
  CHECK(read_scalar(ctx, &sc_t) == 0.75f, "two overflows from 3: %g", (double)read_scalar(ctx, &sc_t));
  /* found_inf is zeroed by the next step's unscale. */
  grads_set(ctx, g, 0, false);
  CHECK_OK(ctx, nt_scaler_unscale(ctx, s, gl, 1));
  CHECK(read_scalar(ctx, &found_t) == 0.0f, "found_inf reset at the next unscale");
  CHECK_OK(ctx, nt_scaler_update(ctx, s));
  nt_scaler_free(ctx, s);
}

static void test_misuse(nt_ctx *ctx, grad_buf *g) {
  nt_scaler *s = NULL;
  nt_tensor *gl[1] = {&g->t};
  const nt_tensor *found = NULL;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, NULL, &s))) return;
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_update(ctx, s));            /* no inf check */
  CHECK_OK(ctx, nt_scaler_unscale(ctx, s, gl, 1));
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_unscale(ctx, s, gl, 1));   /* unscale twice */
  CHECK_OK(ctx, nt_scaler_step(ctx, s, NULL, 0, &found));
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_unscale(ctx, s, gl, 1));   /* unscale after step */
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_step(ctx, s, NULL, 0, &found));  /* step twice */
  CHECK_OK(ctx, nt_scaler_update(ctx, s));
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_update(ctx, s));           /* update twice */
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_step(ctx, s, NULL, 0, &found));  /* step, no grads */
  CHECK_OK(ctx, nt_scaler_step(ctx, s, gl, 1, &found));             /* step unscales itself */
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_unscale(ctx, s, gl, 1));
  nt_scaler_state st;
  memset(&st, 0, sizeof st);
  CHECK_ERR(ctx, NT_ERR_STATE, nt_scaler_state_set(ctx, s, &st));  /* mid-step */
  CHECK_OK(ctx, nt_scaler_update(ctx, s));
  nt_scaler_free(ctx, s);

  nt_scaler_options o = nt_scaler_defaults();
  o.growth_factor = 1.0f;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_create(ctx, &o, &s));
  o = nt_scaler_defaults();
  o.backoff_factor = 1.0f;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_create(ctx, &o, &s));
  o = nt_scaler_defaults();
  o.growth_interval = 0;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_create(ctx, &o, &s));
  o = nt_scaler_defaults();
  o.min_scale = 10.0f;
  o.max_scale = 5.0f;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_create(ctx, &o, &s));
  CHECK(s == NULL, "no scaler on error");
}

static void test_extras(nt_ctx *ctx, grad_buf *g) {
  nt_scaler_options o = nt_scaler_defaults();
  nt_scaler *s = NULL;
  float sc;
  int tr;
  /* Hysteresis 2: the 2nd consecutive overflow backs off, further ones too, a clean step
   * re-arms. Steps are skipped on every overflow (skipped_total). */
  o.init_scale = 64.0f;
  o.growth_interval = 100;
  o.hysteresis = 2;
  if (CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) {
    const char *pat = "TTTFTFTT";
    const float exp[] = {64, 32, 16, 16, 16, 16, 16, 8};
    const int exp_t[] = {0, 0, 0, 1, 0, 1, 0, 0};
    for (int i = 0; pat[i]; i++) {
      if (!one_step(ctx, s, g, pat[i] == 'T', &sc, &tr)) break;
      CHECK(sc == exp[i] && tr == exp_t[i], "hysteresis step %d: (%g,%d) expected (%g,%d)", i,
            (double)sc, tr, (double)exp[i], exp_t[i]);
    }
    nt_scaler_values v;
    if (CHECK_OK(ctx, nt_scaler_read(ctx, s, &v)))
      CHECK(v.skipped_total == 6, "hysteresis: every overflow skips (%lld)", (long long)v.skipped_total);
    nt_scaler_free(ctx, s);
  }
  /* min_scale bounds the backoff; max_scale the growth. */
  o = nt_scaler_defaults();
  o.init_scale = 8.0f;
  o.min_scale = 3.0f;
  if (CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) {
    const float exp[] = {4, 3, 3};
    for (int i = 0; i < 3; i++) {
      if (!one_step(ctx, s, g, true, &sc, &tr)) break;
      CHECK(sc == exp[i], "min_scale step %d: %g", i, (double)sc);
    }
    nt_scaler_free(ctx, s);
  }
  o = nt_scaler_defaults();
  o.init_scale = 8.0f;
  o.growth_interval = 1;
  o.max_scale = 20.0f;
  if (CHECK_OK(ctx, nt_scaler_create(ctx, &o, &s))) {
    const float exp[] = {16, 20, 20};
    for (int i = 0; i < 3; i++) {
      if (!one_step(ctx, s, g, false, &sc, &tr)) break;
      CHECK(sc == exp[i], "max_scale step %d: %g", i, (double)sc);
    }
    nt_scaler_free(ctx, s);
  }
  /* Presets. */
  nt_scaler_options p;
  CHECK(nt_scaler_preset(ctx, "transformer", &p) == NT_OK && p.init_scale == 65536.0f &&
            p.growth_interval == 2000, "transformer preset");
  CHECK(nt_scaler_preset(ctx, "cnn", &p) == NT_OK && p.growth_interval == 1000 &&
            p.init_scale == 65536.0f, "cnn preset");
  CHECK(nt_scaler_preset(ctx, "pointcloud", &p) == NT_OK && p.init_scale == 32768.0f &&
            p.growth_interval == 2000, "pointcloud preset");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_preset(ctx, "resnet", &p));
  nt_scaler_options d = nt_scaler_defaults();
  CHECK(d.init_scale == 65536.0f && d.growth_factor == 2.0f && d.backoff_factor == 0.5f &&
            d.growth_interval == 2000 && d.enabled && d.min_scale == 0 && d.max_scale == 0 &&
            d.hysteresis == 1, "PyTorch defaults");
}

static void test_state(nt_ctx *ctx, grad_buf *g) {
  nt_scaler_options o = nt_scaler_defaults();
  nt_scaler *a = NULL, *b = NULL;
  o.init_scale = 8.0f;
  o.growth_interval = 3;
  o.hysteresis = 2;
  if (!CHECK_OK(ctx, nt_scaler_create(ctx, &o, &a))) return;
  const char *pat = "FFTFFFTTFFFF";
  float sa, sb;
  int ta, tb;
  for (int i = 0; i < 5; i++) one_step(ctx, a, g, pat[i] == 'T', &sa, &ta);
  nt_scaler_state st;
  CHECK_OK(ctx, nt_scaler_state_get(ctx, a, &st));
  CHECK(st.growth_factor == 2.0f && st.backoff_factor == 0.5f && st.growth_interval == 3 &&
            st.hysteresis == 2 && st.updates == 5, "state fields");
  /* Restore into a scaler created with other options: the state carries them. */
  if (CHECK_OK(ctx, nt_scaler_create(ctx, NULL, &b)) && CHECK_OK(ctx, nt_scaler_state_set(ctx, b, &st))) {
    for (int i = 5; pat[i]; i++) {
      one_step(ctx, a, g, pat[i] == 'T', &sa, &ta);
      one_step(ctx, b, g, pat[i] == 'T', &sb, &tb);
      CHECK(memcmp(&sa, &sb, 4) == 0 && ta == tb, "restored scaler step %d: (%g,%d) vs (%g,%d)",
            i, (double)sb, tb, (double)sa, ta);
    }
  }
  st.growth_factor = 0.5f;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_scaler_state_set(ctx, b, &st));
  nt_scaler_free(ctx, a);
  nt_scaler_free(ctx, b);

  /* Disabled: no-ops, no found_inf, scale 1. */
  o = nt_scaler_defaults();
  o.enabled = false;
  nt_tensor *gl[1] = {&g->t};
  const nt_tensor *found = (const nt_tensor *)&o;
  if (CHECK_OK(ctx, nt_scaler_create(ctx, &o, &a))) {
    grads_set(ctx, g, INFINITY, true);
    CHECK_OK(ctx, nt_scaler_unscale(ctx, a, gl, 1));
    CHECK_OK(ctx, nt_scaler_step(ctx, a, gl, 1, &found));
    CHECK(found == NULL, "disabled scaler gives no found_inf");
    CHECK_OK(ctx, nt_scaler_update(ctx, a));
    nt_scaler_values v;
    CHECK_OK(ctx, nt_scaler_read(ctx, a, &v));
    CHECK(v.scale == 1.0f && v.skipped_total == 0, "disabled scaler state");
    CHECK_OK(ctx, nt_scaler_log(ctx, a));
    nt_scaler_free(ctx, a);
  }
  nt_scaler_free(ctx, NULL);
}

static void run_all(nt_ctx *ctx) {
  grad_buf g;
  int64_t n = 7;
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &g.t, NT_F32, 1, &n))) return;
  test_vectors(ctx, &g);
  test_unscale_values(ctx, &g);
  test_misuse(ctx, &g);
  test_extras(ctx, &g);
  test_state(ctx, &g);
  nt_tensor_free(ctx, &g.t);
}

int main(void) {
#ifdef NT_TEST_GPU
  nt_ctx *ctx = nt_test_cuda_ctx();
  if (!ctx) return nt_test_skip("no GPU");
#else
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu()) != NT_OK) return 1;
#endif
  run_all(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
