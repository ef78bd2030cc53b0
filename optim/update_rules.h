/* The per-element update rules of Adam/AdamW and SGD, shared by the CPU loops and the CUDA
 * kernels. Every multiply/add/divide is an explicitly rounded fp32 operation (NT_FMUL and the
 * others of optim/optim_common.h: no contraction into FMA on the device; the one FMA is
 * explicit on both sides), so the CPU and the GPU produce the same bits. The order of
 * operations is torch.optim's: it reproduces the Adam and AdamW vectors of docs/semantics.md
 * bit for bit. Private. */
#ifndef NT_OPTIM_UPDATE_RULES_H
#define NT_OPTIM_UPDATE_RULES_H
#include <math.h>
#include "optim/optim_common.h"

typedef struct {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  int decoupled;                        /* AdamW (1) or Adam with L2 (0) */
} nt_adam_hyper;

typedef struct {
  float neg_step_size, bias2_sqrt, decay, wd;
  int use_wd;
} nt_adam_coefs;

/* The group's values of this step, from the record (global memory on the device). */
static inline NT_HD nt_adam_coefs nt_adam_coefs_make(const nt_optim_record *r, int group) {
  nt_adam_coefs k;
  k.neg_step_size = r->neg_step[group];
  k.bias2_sqrt = r->bias2_sqrt;
  k.decay = r->decay[group];
  k.wd = r->wd[group];
  k.use_wd = k.wd != 0.0f;
  return k;
}

/* One element: p (fp32 master), m, v updated in place; g * clip is the gradient the step
 * applies (clip is the record's clip_coef: the clipping coefficient, times grad_scale when the
 * unscale is folded into it, so g may still be scaled). */
static inline NT_HD void nt_adam_update(float *p, float *m, float *v, float g, float clip,
                                        const nt_adam_hyper *h, const nt_adam_coefs *k) {
  float pp = *p;
  g = NT_FMUL(g, clip);
  if (k->use_wd) {
    if (h->decoupled) pp = NT_FMUL(pp, k->decay);
    else g = NT_FFMA(k->wd, pp, g);   /* g.add(p, alpha=wd) */
  }
  /* m.lerp_(g, 1 - beta1) and v.mul_(beta2).addcmul_(g, g, value=1 - beta2), the latter as
   * torch evaluates it: fma(value, g * g, v * beta2) */
  float mm = NT_FADD(*m, NT_FMUL(h->one_minus_beta1, NT_FSUB(g, *m)));
  float vv = NT_FFMA(h->one_minus_beta2, NT_FMUL(g, g), NT_FMUL(*v, h->beta2));
  float denom = NT_FADD(NT_FDIV(NT_FSQRT(vv), k->bias2_sqrt), h->eps);
  /* p.addcdiv_(m, denom, value=-step_size): torch computes value * m / denom, left to right */
  *p = NT_FADD(pp, NT_FDIV(NT_FMUL(k->neg_step_size, mm), denom));
  *m = mm;
  *v = vv;
}

typedef struct {
  float momentum, one_minus_dampening;
  int nesterov;
} nt_sgd_hyper;

/* One element of SGD; buf is NULL without momentum. first: this is the first applied step.
 * torch's x.add(y, alpha=a) is fma(a, y, x) here, as its CUDA kernels evaluate it. */
static inline NT_HD void nt_sgd_update(float *p, float *buf, float g, float clip, float wd,
                                       float neg_lr, int first, const nt_sgd_hyper *h) {
  float pp = *p;
  g = NT_FMUL(g, clip);
  if (wd != 0.0f) g = NT_FFMA(wd, pp, g);
  if (buf) {
    float b = first ? g : NT_FFMA(h->one_minus_dampening, g, NT_FMUL(*buf, h->momentum));
    *buf = b;
    g = h->nesterov ? NT_FFMA(h->momentum, b, g) : b;
  }
  *p = NT_FFMA(neg_lr, g, pp);
}

#endif
