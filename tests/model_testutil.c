#include "tests/model_testutil.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int nt_test_gradcheck_params(nt_params *p, nt_test_rng *r, double eps, double tol,
                             nt_test_loss_fn loss, void *arg, double *worst) {
  int checked = 0;
  *worst = 0;
  for (int u = 0; u < p->n_units; u++) {
    for (int i = 0; i < p->units[u].n_params; i++) {
      nt_tensor w = nt_params_view(p, u, i, NT_VIEW_MASTER);
      nt_tensor gr = nt_params_view(p, u, i, NT_VIEW_GRAD);
      int64_t n = nt_tensor_numel(&w);
      float *wd = w.data, *gd = gr.data;
      float *dir = malloc((size_t)n * sizeof *dir), *save = malloc((size_t)n * sizeof *save);
      double expect = 0;
      for (int64_t k = 0; k < n; k++) {
        dir[k] = nt_test_uniform(r, 0, 1) < 0.5 ? -1.0f : 1.0f;
        expect += (double)gd[k] * dir[k];
      }
      memcpy(save, wd, (size_t)n * sizeof *save);
      for (int64_t k = 0; k < n; k++) wd[k] = (float)(save[k] + eps * dir[k]);
      double lp = loss(arg);
      for (int64_t k = 0; k < n; k++) wd[k] = (float)(save[k] - eps * dir[k]);
      double lm = loss(arg);
      memcpy(wd, save, (size_t)n * sizeof *save);
      double fd = (lp - lm) / (2 * eps);
      double err = fabs(fd - expect) / fmax(fabs(expect), 1e-2);
      if (err > *worst) *worst = err;
      CHECK(err < tol, "%s: analytic %.6g vs finite difference %.6g (rel %.3g)",
            p->units[u].params[i].name, expect, fd, err);
      checked++;
      free(dir);
      free(save);
    }
  }
  return checked;
}

double nt_test_scaled_rel_err(const float *now, const float *before, int64_t n, double k) {
  double e = 0, ref = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = now[i] - k * before[i];
    e += d * d;
    ref += k * k * before[i] * before[i];
  }
  return sqrt(e / ref);
}
