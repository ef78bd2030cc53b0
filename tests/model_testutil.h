/* Checks shared by the whole-model tests (test_gpt, test_cnn): every parameter tensor's
 * gradient against a central finite difference of the loss, and gradient accumulation. */
#ifndef NT_MODEL_TESTUTIL_H
#define NT_MODEL_TESTUTIL_H
#include "tests/testutil.h"
#include "models/module.h"

/* The model's loss at its current master weights (NAN when the evaluation fails). */
typedef double (*nt_test_loss_fn)(void *arg);

/* For every parameter tensor of p (fp32 masters holding the gradients of the last backward):
 * a random +-1 direction d from r, the analytic derivative <grad, d> against
 * (loss(w + eps d) - loss(w - eps d)) / (2 eps), relative to max(|analytic|, 1e-2) (fp32
 * losses quantise the quotient to ~1e-4), one CHECK per tensor at `tol`. The weights are
 * restored. Returns how many tensors were checked; *worst gets the largest relative error. */
int nt_test_gradcheck_params(nt_params *p, nt_test_rng *r, double eps, double tol,
                             nt_test_loss_fn loss, void *arg, double *worst);

/* ||now - k before|| / ||k before|| in double: k = 2 after a second backward without zeroing
 * (gradients accumulate), k = s after a backward with loss scale s. */
double nt_test_scaled_rel_err(const float *now, const float *before, int64_t n, double k);

#endif
