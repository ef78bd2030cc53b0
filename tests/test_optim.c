/* Optimizers: the Adam/AdamW vectors of docs/semantics.md, Adam/AdamW/SGD against a
 * double-precision reference on odd sizes with parameter groups and clipping, the device skip
 * on found_inf (bitwise untouched state), the F16/BF16 compute copy written by the kernel,
 * save/load resuming bit-identically, standalone clipping, LR schedules and argument errors
 * (a loss scale folded into the clipping coefficient: test_grad_scale.c).
 * Compiled twice: the CPU test, and with NT_TEST_GPU (gpu_test_optim.c), where every scenario
 * also runs on the GPU and must give the CPU's bits. */
#include "testutil.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "amp/scaler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The CPU and GPU builds of this test may run at once (ctest -j): distinct file names. */
#ifdef NT_TEST_GPU
#define STATE_PREFIX "gpu_"
#else
#define STATE_PREFIX ""
#endif

#define N0 1003   /* unit sizes: odd, not multiples of 4 or 8 */
#define N1 4101   /* more than one 4096-element chunk */
#define STEPS 5

static bool set_scalar(nt_ctx *ctx, nt_tensor *t, float x) { return nt_test_upload(ctx, t, &x); }

/* ---- The vectors ------------------------------------------------------------------------ */

static void test_vector(nt_ctx *ctx, bool decoupled) {
  const float p0[3] = {1, -2, 3}, g1[3] = {0.5f, -0.1f, 2}, g2[3] = {0.1f, 0.2f, -1};
  const double adam_p[3] = {0.818915129, -1.925017834, 2.871681690};
  const double adam_v[3] = {2.71720899e-4, 4.71466083e-5, 5.05962037e-3};
  const double adamw_p[3] = {0.817796886, -1.932712436, 2.867469311};
  const double adamw_v[3] = {2.59749999e-4, 4.99900052e-5, 4.99600032e-3};
  const double *ep = decoupled ? adamw_p : adam_p, *ev = decoupled ? adamw_v : adam_v;
  int64_t n = 3;
  nt_param_unit u;
  memset(&u, 0, sizeof u);
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F32, 1, &n))) return;
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &n))) return;
  nt_test_upload(ctx, &u.params, p0);
  nt_adamw_options o = decoupled ? nt_adamw_defaults() : nt_adam_defaults();
  o.lr = 0.1;
  o.weight_decay = 0.01;
  nt_adamw *opt = NULL;
  if (CHECK_OK(ctx, nt_adamw_create(ctx, &o, &u, 1, NULL, 0, &opt))) {
    nt_test_upload(ctx, &u.grads, g1);
    CHECK_OK(ctx, nt_adamw_step(ctx, opt, NULL));
    nt_test_upload(ctx, &u.grads, g2);
    CHECK_OK(ctx, nt_adamw_step(ctx, opt, NULL));
    float p[3], v[3];
    nt_tensor master, vt;
    nt_adamw_state_views(opt, 0, &master, NULL, &vt);
    nt_test_download(ctx, &master, p);
    nt_test_download(ctx, &vt, v);
    for (int i = 0; i < 3; i++) {
      double rp = fabs(p[i] - ep[i]) / fabs(ep[i]), rv = fabs(v[i] - ev[i]) / fabs(ev[i]);
      /* The vector is printed to 9 digits; 3e-8 relative is below one fp32 ulp there. */
      CHECK(rp < 3e-8 && rv < 3e-8, "%s vector [%d]: p %.9f (torch %.9f, rel %.2g) v %.9g (torch %.9g, rel %.2g)",
            decoupled ? "AdamW" : "Adam", i, (double)p[i], ep[i], rp, (double)v[i], ev[i], rv);
    }
    int32_t step = -1;
    CHECK_OK(ctx, nt_adamw_get_step(ctx, opt, &step));
    CHECK(step == 2, "step counter %d after 2 steps", step);
  }
  nt_adamw_free(ctx, opt);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
}

/* ---- A two-unit scenario with groups -------------------------------------------------- */

typedef struct {
  bool sgd;
  bool decoupled;
  nt_dtype pdt, gdt;
  float max_norm;        /* 0: no clipping */
  int inf_step;          /* step index whose found_inf is 1 (-1: none) */
  double momentum, dampening;
  bool nesterov;
} scenario;

typedef struct {
  float *master[2], *s1[2], *s2[2], *lp[2];   /* final state per unit */
  int32_t step;
} result;

static const int64_t unit_n[2] = {N0, N1};

static void result_free(result *r) {
  for (int u = 0; u < 2; u++) { free(r->master[u]); free(r->s1[u]); free(r->s2[u]); free(r->lp[u]); }
}

/* Deterministic data: initial params and per-step grads. */
static void data_init(float *p, int u) {
  nt_test_rng r = {1234u + (uint64_t)u};
  nt_test_fill_uniform(&r, p, unit_n[u], -1.0f, 1.0f);
}
static void data_grad(float *g, int u, int step) {
  nt_test_rng r = {777u + 31u * (uint64_t)u + 1000u * (uint64_t)step};
  nt_test_fill_uniform(&r, g, unit_n[u], -0.5f, 0.5f);
}

/* Groups: "decay" = unit 0 [0, 700) and unit 1 [5, 4000); "no decay" (lr x0.5) = unit 0
 * [700, 1003) and unit 1 [4000, 4101); unit 1 [0, 5) is frozen. */
static const nt_param_range decay_r[2] = {{0, 0, 700}, {1, 5, 3995}};
static const nt_param_range nodecay_r[2] = {{0, 700, 303}, {1, 4000, 101}};
static int group_of(int u, int64_t i) {
  if (u == 0) return i < 700 ? 0 : 1;
  if (i < 5) return -1;
  return i < 4000 ? 0 : 1;
}
static const double group_wd[2] = {0.05, 0.0};
static const float group_lr_mult[2] = {1.0f, 0.5f};
static double lr_at(int step) { return 0.01 * (1.0 + 0.1 * step); }

static bool run_scenario(nt_ctx *ctx, const scenario *sc, result *res, int steps) {
  nt_param_unit units[2];
  nt_tensor found, master_init[2];
  nt_adamw *adam = NULL;
  nt_sgd *sgd = NULL;
  bool ok = false;
  float *h = malloc(sizeof(float) * N1);
  memset(units, 0, sizeof units);
  memset(res, 0, sizeof *res);
  memset(master_init, 0, sizeof master_init);
  memset(&found, 0, sizeof found);
  for (int u = 0; u < 2; u++) {
    if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &units[u].params, sc->pdt, 1, &unit_n[u])) ||
        !CHECK_OK(ctx, nt_tensor_alloc(ctx, &units[u].grads, sc->gdt, 1, &unit_n[u])) ||
        !CHECK_OK(ctx, nt_tensor_alloc(ctx, &master_init[u], NT_F32, 1, &unit_n[u])))
      goto done;
    data_init(h, u);
    nt_test_upload(ctx, &master_init[u], h);
    units[u].master_init = &master_init[u];
  }
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &found, NT_F32, 0, NULL))) goto done;
  nt_param_group groups[2] = {{group_lr_mult[0], group_wd[0], decay_r, 2},
                              {group_lr_mult[1], group_wd[1], nodecay_r, 2}};
  if (sc->sgd) {
    nt_sgd_options o = nt_sgd_defaults(0.01);
    o.momentum = sc->momentum;
    o.dampening = sc->dampening;
    o.nesterov = sc->nesterov;
    if (!CHECK_OK(ctx, nt_sgd_create(ctx, &o, units, 2, groups, 2, &sgd))) goto done;
  } else {
    nt_adamw_options o = sc->decoupled ? nt_adamw_defaults() : nt_adam_defaults();
    if (!CHECK_OK(ctx, nt_adamw_create(ctx, &o, units, 2, groups, 2, &adam))) goto done;
  }
  for (int s = 0; s < steps; s++) {
    for (int u = 0; u < 2; u++) {
      data_grad(h, u, s);
      nt_test_upload(ctx, &units[u].grads, h);
    }
    set_scalar(ctx, &found, s == sc->inf_step ? 1.0f : 0.0f);
    nt_optim_step_args a = nt_optim_args(lr_at(s));
    a.found_inf = &found;
    a.max_norm = sc->max_norm;
    nt_status st = sc->sgd ? nt_sgd_step(ctx, sgd, &a) : nt_adamw_step(ctx, adam, &a);
    if (!CHECK_OK(ctx, st)) goto done;
  }
  for (int u = 0; u < 2; u++) {
    nt_tensor m, s1, s2;
    for (int k = 0; k < 4; k++) {
      float **dst = k == 0 ? res->master : k == 1 ? res->s1 : k == 2 ? res->s2 : res->lp;
      dst[u] = calloc((size_t)unit_n[u], sizeof(float));
    }
    if (sc->sgd) {
      nt_sgd_state_views(sgd, u, &m, &s1);
      nt_test_download(ctx, &s1, res->s1[u]);
    } else {
      nt_adamw_state_views(adam, u, &m, &s1, &s2);
      nt_test_download(ctx, &s1, res->s1[u]);
      nt_test_download(ctx, &s2, res->s2[u]);
    }
    nt_test_download(ctx, &m, res->master[u]);
    nt_test_download(ctx, &units[u].params, res->lp[u]);
  }
  CHECK_OK(ctx, sc->sgd ? nt_sgd_get_step(ctx, sgd, &res->step) : nt_adamw_get_step(ctx, adam, &res->step));
  ok = true;
done:
  nt_adamw_free(ctx, adam);
  nt_sgd_free(ctx, sgd);
  for (int u = 0; u < 2; u++) {
    nt_tensor_free(ctx, &units[u].params);
    nt_tensor_free(ctx, &units[u].grads);
    nt_tensor_free(ctx, &master_init[u]);
  }
  nt_tensor_free(ctx, &found);
  free(h);
  return ok;
}

/* The same run in double precision, straight from docs/semantics.md's formulas. */
static void reference(const scenario *sc, int steps, double *p[2], double *s1[2], double *s2[2]) {
  float *h = malloc(sizeof(float) * N1);
  float *g[2] = {malloc(sizeof(float) * N0), malloc(sizeof(float) * N1)};
  int t = 0;
  for (int u = 0; u < 2; u++) {
    data_init(h, u);
    for (int64_t i = 0; i < unit_n[u]; i++) { p[u][i] = h[i]; s1[u][i] = 0; s2[u][i] = 0; }
  }
  for (int s = 0; s < steps; s++) {
    double sumsq = 0;
    for (int u = 0; u < 2; u++) {
      data_grad(g[u], u, s);
      /* A gradient passed as F16/BF16 is what the kernel reads. */
      for (int64_t i = 0; i < unit_n[u]; i++) {
        float x = g[u][i];
        if (sc->gdt == NT_BF16) x = nt_bf16_to_f32(nt_f32_to_bf16(x));
        if (sc->gdt == NT_F16) x = nt_f16_to_f32(nt_f32_to_f16(x));
        g[u][i] = x;
        sumsq += (double)x * x;
      }
    }
    if (s == sc->inf_step) continue;
    t++;
    double coef = 1.0;
    if (sc->max_norm > 0) {
      coef = sc->max_norm / (sqrt(sumsq) + 1e-6);
      if (coef > 1) coef = 1;
    }
    for (int u = 0; u < 2; u++)
      for (int64_t i = 0; i < unit_n[u]; i++) {
        int grp = group_of(u, i);
        if (grp < 0) continue;
        double lr = lr_at(s) * group_lr_mult[grp], wd = group_wd[grp], gg = g[u][i] * coef;
        double *pp = &p[u][i], *m = &s1[u][i], *v = &s2[u][i];
        if (sc->sgd) {
          gg += wd * *pp;
          if (sc->momentum != 0) {
            *m = t == 1 ? gg : sc->momentum * *m + (1 - sc->dampening) * gg;
            gg = sc->nesterov ? gg + sc->momentum * *m : *m;
          }
          *pp -= lr * gg;
        } else {
          if (sc->decoupled) *pp *= 1 - lr * wd;
          else gg += wd * *pp;
          *m = 0.9 * *m + 0.1 * gg;
          *v = 0.999 * *v + 0.001 * gg * gg;
          double bc1 = 1 - pow(0.9, t), bc2 = 1 - pow(0.999, t);
          *pp -= (lr / bc1) * *m / (sqrt(*v) / sqrt(bc2) + 1e-8);
        }
      }
  }
  free(h);
  free(g[0]);
  free(g[1]);
}

static double rel_err_fd(const float *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_scenario(nt_ctx *ctx, nt_ctx *cpu, const char *name, const scenario *sc) {
  result r, rc;
  if (!run_scenario(ctx, sc, &r, STEPS)) return;
  double *p[2], *s1[2], *s2[2];
  for (int u = 0; u < 2; u++) {
    p[u] = malloc(sizeof(double) * (size_t)unit_n[u]);
    s1[u] = malloc(sizeof(double) * (size_t)unit_n[u]);
    s2[u] = malloc(sizeof(double) * (size_t)unit_n[u]);
  }
  reference(sc, STEPS, p, s1, s2);
  int expected_steps = STEPS - (sc->inf_step >= 0 && sc->inf_step < STEPS);
  CHECK(r.step == expected_steps, "%s: step counter %d, expected %d", name, r.step, expected_steps);
  for (int u = 0; u < 2; u++) {
    double e = rel_err_fd(r.master[u], p[u], unit_n[u]);
    double em = rel_err_fd(r.s1[u], s1[u], unit_n[u]);
    CHECK(e < 1e-5 && em < 1e-5, "%s unit %d: params rel err %.3g, state rel err %.3g", name, u, e, em);
    if (!sc->sgd) {
      double ev = rel_err_fd(r.s2[u], s2[u], unit_n[u]);
      CHECK(ev < 1e-5, "%s unit %d: v rel err %.3g", name, u, ev);
    }
    /* Frozen elements (unit 1 [0, 5)) never change. */
    if (u == 1) {
      float h[N1];
      data_init(h, 1);
      int moved = 0;
      for (int i = 0; i < 5; i++) moved += memcmp(&r.master[1][i], &h[i], 4) != 0;
      CHECK(moved == 0, "%s: %d frozen elements changed", name, moved);
    }
    /* The compute copy is exactly the master weights converted (written by the kernel). */
    int bad = 0;
    for (int64_t i = 0; i < unit_n[u]; i++) {
      float want = r.master[u][i];
      if (sc->pdt == NT_BF16) want = nt_bf16_to_f32(nt_f32_to_bf16(want));
      if (sc->pdt == NT_F16) want = nt_f16_to_f32(nt_f32_to_f16(want));
      bad += memcmp(&want, &r.lp[u][i], 4) != 0;
    }
    CHECK(bad == 0, "%s unit %d: %d compute-copy elements differ from the converted master", name,
          u, bad);
  }
  /* On the GPU: the same bits as the CPU (clipping aside: its sum of squares is reduced in a
   * different order on each device). */
  if (cpu && run_scenario(cpu, sc, &rc, STEPS)) {
    for (int u = 0; u < 2; u++) {
      size_t bytes = sizeof(float) * (size_t)unit_n[u];
      if (sc->max_norm > 0) {
        double e = nt_test_rel_err(r.master[u], rc.master[u], unit_n[u]);
        CHECK(e < 1e-6, "%s unit %d: GPU vs CPU rel err %.3g", name, u, e);
      } else {
        CHECK(memcmp(r.master[u], rc.master[u], bytes) == 0 &&
                  memcmp(r.s1[u], rc.s1[u], bytes) == 0 && memcmp(r.s2[u], rc.s2[u], bytes) == 0 &&
                  memcmp(r.lp[u], rc.lp[u], bytes) == 0,
              "%s unit %d: GPU and CPU results are not bit-identical", name, u);
      }
    }
    result_free(&rc);
  }
  for (int u = 0; u < 2; u++) { free(p[u]); free(s1[u]); free(s2[u]); }
  result_free(&r);
}

/* An overflow step leaves everything bitwise untouched: compare a run of k steps with a run of
 * k+1 steps whose last step overflows. */
static void test_skip(nt_ctx *ctx) {
  scenario sc = {false, true, NT_BF16, NT_F32, 0.0f, -1, 0, 0, false};
  result a, b;
  if (!run_scenario(ctx, &sc, &a, 3)) return;
  sc.inf_step = 3;
  if (run_scenario(ctx, &sc, &b, 4)) {
    for (int u = 0; u < 2; u++) {
      size_t bytes = sizeof(float) * (size_t)unit_n[u];
      CHECK(memcmp(a.master[u], b.master[u], bytes) == 0 && memcmp(a.s1[u], b.s1[u], bytes) == 0 &&
                memcmp(a.s2[u], b.s2[u], bytes) == 0 && memcmp(a.lp[u], b.lp[u], bytes) == 0,
            "unit %d: the skipped step changed parameters, moments or the compute copy", u);
    }
    CHECK(a.step == 3 && b.step == 3, "skipped step advanced t: %d, %d", a.step, b.step);
    result_free(&b);
  }
  result_free(&a);
}

/* Save after 3 steps, continue 3 more; a fresh optimizer that loads the file and runs the
 * same 3 steps must end with the same bits (master, moments, compute copy, step). */
static void run_steps(nt_ctx *ctx, nt_param_unit *u, void *opt, bool sgd, int from, int to) {
  float h[N1];
  for (int s = from; s < to; s++) {
    data_grad(h, 1, s);
    nt_test_upload(ctx, &u->grads, h);
    nt_optim_step_args a = nt_optim_args(lr_at(s));
    CHECK_OK(ctx, sgd ? nt_sgd_step(ctx, opt, &a) : nt_adamw_step(ctx, opt, &a));
  }
}

static void snapshot(nt_ctx *ctx, nt_param_unit *u, void *opt, bool sgd, float *out /* 4*N1 */) {
  nt_tensor m, s1, s2;
  if (sgd) {
    nt_sgd_state_views(opt, 0, &m, &s1);
    s2 = s1;
  } else {
    nt_adamw_state_views(opt, 0, &m, &s1, &s2);
  }
  nt_test_download(ctx, &m, out);
  nt_test_download(ctx, &s1, out + N1);
  nt_test_download(ctx, &s2, out + 2 * N1);
  nt_test_download(ctx, &u->params, out + 3 * N1);
}

static void test_save_load(nt_ctx *ctx, bool sgd) {
  const char *path = sgd ? STATE_PREFIX "test_optim_sgd.state" : STATE_PREFIX "test_optim_adamw.state";
  nt_param_unit u[2];
  void *opt[2] = {NULL, NULL};
  float *snap = malloc(sizeof(float) * 8 * N1), h[N1];
  int64_t n = N1;
  memset(u, 0, sizeof u);
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].params, NT_BF16, 1, &n));
    CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].grads, NT_F32, 1, &n));
    data_init(h, k);   /* the second optimizer starts elsewhere: the load must overwrite it */
    nt_test_upload(ctx, &u[k].params, h);
    nt_status st;
    if (sgd) {
      nt_sgd_options o = nt_sgd_defaults(0.05);
      o.momentum = 0.9;
      o.weight_decay = 1e-3;
      st = nt_sgd_create(ctx, &o, &u[k], 1, NULL, 0, (nt_sgd **)&opt[k]);
    } else {
      st = nt_adamw_create(ctx, NULL, &u[k], 1, NULL, 0, (nt_adamw **)&opt[k]);
    }
    if (!CHECK_OK(ctx, st)) goto done;
  }
  run_steps(ctx, &u[0], opt[0], sgd, 0, 3);
  if (!CHECK_OK(ctx, sgd ? nt_sgd_save(ctx, opt[0], path) : nt_adamw_save(ctx, opt[0], path))) goto done;
  run_steps(ctx, &u[0], opt[0], sgd, 3, 6);
  snapshot(ctx, &u[0], opt[0], sgd, snap);
  if (!CHECK_OK(ctx, sgd ? nt_sgd_load(ctx, opt[1], path) : nt_adamw_load(ctx, opt[1], path))) goto done;
  run_steps(ctx, &u[1], opt[1], sgd, 3, 6);
  snapshot(ctx, &u[1], opt[1], sgd, snap + 4 * N1);
  CHECK(memcmp(snap, snap + 4 * N1, sizeof(float) * 4 * N1) == 0,
        "%s: resumed run is not bit-identical", sgd ? "sgd" : "adamw");
  int32_t s0 = 0, s1 = 0;
  if (!sgd) {
    nt_adamw_get_step(ctx, opt[0], &s0);
    nt_adamw_get_step(ctx, opt[1], &s1);
    CHECK(s0 == 6 && s1 == 6, "steps after resume: %d %d", s0, s1);
    /* A state file of another kind or layout is refused. */
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_adamw_load(ctx, opt[1], STATE_PREFIX "test_optim_sgd.state"));
    CHECK_ERR(ctx, NT_ERR_IO, nt_adamw_load(ctx, opt[1], "/nonexistent/dir/x.state"));
  }
done:
  if (sgd) { nt_sgd_free(ctx, opt[0]); nt_sgd_free(ctx, opt[1]); }
  else { nt_adamw_free(ctx, opt[0]); nt_adamw_free(ctx, opt[1]); }
  for (int k = 0; k < 2; k++) { nt_tensor_free(ctx, &u[k].params); nt_tensor_free(ctx, &u[k].grads); }
  free(snap);
}

/* nt_clip_grad_norm scales in place by min(1, max_norm / (total + 1e-6)). */
static void test_clip(nt_ctx *ctx) {
  int64_t n[2] = {37, 1001};
  nt_tensor g[2], total;
  float *h[2], *out[2];
  double sumsq = 0;
  for (int k = 0; k < 2; k++) {
    h[k] = malloc(sizeof(float) * (size_t)n[k]);
    out[k] = malloc(sizeof(float) * (size_t)n[k]);
    nt_test_rng r = {99u + (uint64_t)k};
    nt_test_fill_uniform(&r, h[k], n[k], -2, 2);
    for (int64_t i = 0; i < n[k]; i++) sumsq += (double)h[k][i] * h[k][i];
    CHECK_OK(ctx, nt_tensor_alloc(ctx, &g[k], NT_F32, 1, &n[k]));
  }
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &total, NT_F32, 0, NULL));
  const float norms[2] = {1.0f, 1e6f};   /* clipped, and untouched (coef clamps to 1) */
  for (int c = 0; c < 2; c++) {
    nt_tensor *gl[2] = {&g[0], &g[1]};
    for (int k = 0; k < 2; k++) nt_test_upload(ctx, &g[k], h[k]);
    CHECK_OK(ctx, nt_clip_grad_norm(ctx, gl, 2, norms[c], &total));
    double coef = norms[c] / (sqrt(sumsq) + 1e-6);
    if (coef > 1) coef = 1;
    float tn;
    nt_test_download(ctx, &total, &tn);
    CHECK(fabs(tn - sqrt(sumsq)) < 1e-5 * sqrt(sumsq), "total norm %g vs %g", (double)tn, sqrt(sumsq));
    for (int k = 0; k < 2; k++) {
      nt_test_download(ctx, &g[k], out[k]);
      double num = 0, den = 0;
      for (int64_t i = 0; i < n[k]; i++) {
        double want = h[k][i] * coef;
        num += (out[k][i] - want) * (out[k][i] - want);
        den += want * want;
      }
      CHECK(sqrt(num / den) < 1e-6, "clip max_norm %g tensor %d: rel err %.3g", (double)norms[c], k,
            sqrt(num / den));
    }
  }
  CHECK(nt_clip_coef(4.0f, 1.0f) == 1.0f / (2.0f + 1e-6f), "clip coef formula");
  CHECK(nt_clip_coef(4.0f, 10.0f) == 1.0f, "clip coef clamps to 1");
  CHECK(isnan(nt_clip_coef(NAN, 1.0f)), "NaN norm propagates");
  nt_tensor *gl[1] = {&g[0]};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_clip_grad_norm(ctx, gl, 1, 0.0f, NULL));
  for (int k = 0; k < 2; k++) { nt_tensor_free(ctx, &g[k]); free(h[k]); free(out[k]); }
  nt_tensor_free(ctx, &total);
}

/* The scaled step (nt_scaler_step + nt_adamw_step): the scaler unscales, the optimizer skips on overflow, t stays. */
static void test_scaled_step(nt_ctx *ctx) {
  int64_t n = 11;
  nt_param_unit u;
  nt_adamw *opt = NULL;
  nt_scaler *sc = NULL;
  nt_scaler_options so = nt_scaler_defaults();
  float g[11], p0[11], p1[11];
  memset(&u, 0, sizeof u);
  so.init_scale = 1024.0f;
  for (int i = 0; i < 11; i++) { g[i] = 1024.0f * (float)(i - 5) / 8.0f; p0[i] = (float)i / 10.0f; }
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F16, 1, &n));
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F16, 1, &n));
  nt_test_upload(ctx, &u.params, p0);
  if (!CHECK_OK(ctx, nt_adamw_create(ctx, NULL, &u, 1, NULL, 0, &opt)) ||
      !CHECK_OK(ctx, nt_scaler_create(ctx, &so, &sc)))
    goto done;
  nt_test_upload(ctx, &u.grads, g);
  CHECK_OK(ctx, nt_test_scaled_step(ctx, opt, sc, &u.grads, NULL));
  CHECK_ERR(ctx, NT_ERR_STATE, nt_test_scaled_step(ctx, opt, sc, &u.grads, NULL));   /* step twice */
  CHECK_OK(ctx, nt_scaler_update(ctx, sc));
  float unscaled[11];
  nt_test_download(ctx, &u.grads, unscaled);
  CHECK(unscaled[6] == 0.125f && unscaled[0] == -0.625f, "f16 grads unscaled: %g %g",
        (double)unscaled[6], (double)unscaled[0]);
  nt_tensor master;
  nt_adamw_state_views(opt, 0, &master, NULL, NULL);
  nt_test_download(ctx, &master, p0);
  g[3] = INFINITY;
  nt_test_upload(ctx, &u.grads, g);
  CHECK_OK(ctx, nt_test_scaled_step(ctx, opt, sc, &u.grads, NULL));
  CHECK_OK(ctx, nt_scaler_update(ctx, sc));
  nt_test_download(ctx, &master, p1);
  int32_t t = 0;
  nt_adamw_get_step(ctx, opt, &t);
  nt_scaler_values v;
  nt_scaler_read(ctx, sc, &v);
  CHECK(memcmp(p0, p1, sizeof p0) == 0 && t == 1 && v.scale == 512.0f && v.skipped_total == 1,
        "overflow step: params changed %d, t %d, scale %g", memcmp(p0, p1, sizeof p0) != 0, t,
        (double)v.scale);
done:
  nt_adamw_free(ctx, opt);
  nt_scaler_free(ctx, sc);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
}

/* The lr read from a device tensor (CUDA-graph friendly) gives the host lr's bits. */
static void test_lr_tensor(nt_ctx *ctx) {
  int64_t n = 101;
  nt_param_unit u[2];
  nt_adamw *opt[2] = {NULL, NULL};
  nt_tensor lr_t;
  float h[N0], out[2][101];   /* data_init/data_grad fill unit 0 (N0 values) */
  memset(u, 0, sizeof u);
  memset(&lr_t, 0, sizeof lr_t);
  if (!CHECK_OK(ctx, nt_tensor_alloc(ctx, &lr_t, NT_F32, 0, NULL))) return;
  set_scalar(ctx, &lr_t, 0.015625f);
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].params, NT_F32, 1, &n));
    CHECK_OK(ctx, nt_tensor_alloc(ctx, &u[k].grads, NT_F32, 1, &n));
    data_init(h, 0);
    nt_test_upload(ctx, &u[k].params, h);
    if (!CHECK_OK(ctx, nt_adamw_create(ctx, NULL, &u[k], 1, NULL, 0, &opt[k]))) goto done;
  }
  for (int s = 0; s < 3; s++)
    for (int k = 0; k < 2; k++) {
      data_grad(h, 0, s);
      nt_test_upload(ctx, &u[k].grads, h);
      nt_optim_step_args a = nt_optim_args(k == 0 ? 0.015625 : 123.0);
      if (k == 1) a.lr_tensor = &lr_t;
      CHECK_OK(ctx, nt_adamw_step(ctx, opt[k], &a));
    }
  nt_test_download(ctx, &u[0].params, out[0]);
  nt_test_download(ctx, &u[1].params, out[1]);
  CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "lr_tensor run differs from the host-lr run");
  nt_optim_step_args bad = nt_optim_args(0.1);
  bad.lr_tensor = &u[0].grads;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_adamw_step(ctx, opt[0], &bad));
done:
  for (int k = 0; k < 2; k++) {
    nt_adamw_free(ctx, opt[k]);
    nt_tensor_free(ctx, &u[k].params);
    nt_tensor_free(ctx, &u[k].grads);
  }
  nt_tensor_free(ctx, &lr_t);
}

static void test_schedules(nt_ctx *ctx) {
  nt_schedule s = nt_schedule_warmup_cosine(6e-4, 6e-5, 10, 110);
  CHECK_OK(ctx, nt_schedule_check(ctx, &s));
  CHECK(fabs(nt_schedule_lr(&s, 0) - 6e-4 / 11) < 1e-15, "warmup it 0");
  CHECK(fabs(nt_schedule_lr(&s, 9) - 6e-4 * 10 / 11) < 1e-15, "warmup it 9");
  CHECK(fabs(nt_schedule_lr(&s, 10) - 6e-4) < 1e-15, "peak at the end of warmup");
  CHECK(fabs(nt_schedule_lr(&s, 60) - (6e-5 + 0.5 * (6e-4 - 6e-5))) < 1e-15, "cosine midpoint");
  CHECK(fabs(nt_schedule_lr(&s, 110) - 6e-5) < 1e-15 && nt_schedule_lr(&s, 500) == 6e-5, "floor");
  s = nt_schedule_step(0.1, 30, 0.1);
  CHECK(nt_schedule_lr(&s, 29) == 0.1 && fabs(nt_schedule_lr(&s, 30) - 0.01) < 1e-15 &&
            fabs(nt_schedule_lr(&s, 65) - 0.001) < 1e-15, "step decay");
  s = nt_schedule_constant(0.3);
  CHECK(nt_schedule_lr(&s, 12345) == 0.3, "constant");
  nt_schedule bad = nt_schedule_warmup_cosine(1e-3, 1e-4, 100, 50);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_schedule_check(ctx, &bad));
  bad = nt_schedule_step(0.1, 0, 0.5);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_schedule_check(ctx, &bad));
  nt_schedule_kind k;
  CHECK(nt_schedule_parse_kind(ctx, "cosine", &k) == NT_OK && k == NT_SCHED_WARMUP_COSINE, "parse");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_schedule_parse_kind(ctx, "linear", &k));
}

static void test_errors(nt_ctx *ctx) {
  int64_t n = 10, m = 9;
  nt_param_unit u;
  nt_adamw *opt = NULL;
  memset(&u, 0, sizeof u);
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.params, NT_F32, 1, &n));
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &m));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_adamw_create(ctx, NULL, &u, 1, NULL, 0, &opt));
  nt_tensor_free(ctx, &u.grads);
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_I32, 1, &n));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_adamw_create(ctx, NULL, &u, 1, NULL, 0, &opt));
  nt_tensor_free(ctx, &u.grads);
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &u.grads, NT_F32, 1, &n));
  nt_param_range r[2] = {{0, 0, 6}, {0, 5, 5}};
  nt_param_group gr[2] = {{1.0f, 0.1, &r[0], 1}, {1.0f, 0.0, &r[1], 1}};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_create(ctx, NULL, &u, 1, gr, 2, &opt));  /* overlap */
  r[1].offset = 6;
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_adamw_create(ctx, NULL, &u, 1, gr, 2, &opt));  /* past the end */
  r[1].length = 4;
  r[1].unit = 3;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_create(ctx, NULL, &u, 1, gr, 2, &opt));
  nt_adamw_options o = nt_adamw_defaults();
  o.beta1 = 1.0;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_adamw_create(ctx, &o, &u, 1, NULL, 0, &opt));
  nt_sgd_options so = nt_sgd_defaults(0.1);
  so.nesterov = true;
  nt_sgd *sgd = NULL;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_sgd_create(ctx, &so, &u, 1, NULL, 0, &sgd));
  CHECK(opt == NULL && sgd == NULL, "no optimizer on error");
  nt_adamw_free(ctx, NULL);
  nt_sgd_free(ctx, NULL);
  nt_tensor_free(ctx, &u.params);
  nt_tensor_free(ctx, &u.grads);
}

static void run_all(nt_ctx *ctx, nt_ctx *cpu) {
  test_vector(ctx, false);
  test_vector(ctx, true);
  const struct { const char *name; scenario sc; } cases[] = {
      {"adamw f32", {false, true, NT_F32, NT_F32, 0.0f, -1, 0, 0, false}},
      {"adam bf16/f32 grads", {false, false, NT_BF16, NT_F32, 0.0f, -1, 0, 0, false}},
      {"adamw f16/f16 grads skip@2", {false, true, NT_F16, NT_F16, 0.0f, 2, 0, 0, false}},
      {"adamw bf16/bf16 grads clip", {false, true, NT_BF16, NT_BF16, 0.5f, -1, 0, 0, false}},
      {"adamw f32 clip no-op", {false, true, NT_F32, NT_F32, 1e4f, -1, 0, 0, false}},
      {"sgd plain", {true, false, NT_F32, NT_F32, 0.0f, -1, 0, 0, false}},
      {"sgd momentum dampening", {true, false, NT_BF16, NT_F32, 0.0f, 1, 0.9, 0.1, false}},
      {"sgd nesterov clip", {true, false, NT_F16, NT_F32, 0.3f, -1, 0.8, 0, true}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_scenario(ctx, cpu, cases[i].name, &cases[i].sc);
  test_skip(ctx);
  test_save_load(ctx, true);   /* writes the sgd file the adamw case then refuses */
  test_save_load(ctx, false);
  remove(STATE_PREFIX "test_optim_sgd.state");
  remove(STATE_PREFIX "test_optim_adamw.state");
  test_clip(ctx);
  test_scaled_step(ctx);
  test_lr_tensor(ctx);
  test_schedules(ctx);
  test_errors(ctx);
}

int main(void) { return nt_test_main_on_device(NT_TEST_ON_GPU, run_all); }
