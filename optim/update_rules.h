/* The per-element update rules of Adam/AdamW and SGD, shared by the CPU loops and the CUDA
 * kernels. Every multiply/add/divide is an explicitly rounded fp32 operation (no contraction
 * into FMA on the device), so the CPU and the GPU produce the same bits. The order of
 * operations follows torch.optim's single-tensor implementations. Private. */
#ifndef NT_OPTIM_UPDATE_RULES_H
#define NT_OPTIM_UPDATE_RULES_H
#include <math.h>
#include "optim/optim_common.h"

#ifdef __CUDA_ARCH__
#define NT_FMUL(a, b) __fmul_rn((a), (b))
#define NT_FADD(a, b) __fadd_rn((a), (b))
#define NT_FSUB(a, b) __fsub_rn((a), (b))
#define NT_FDIV(a, b) __fdiv_rn((a), (b))
#define NT_FSQRT(a) __fsqrt_rn(a)
#else
#define NT_FMUL(a, b) ((a) * (b))
#define NT_FADD(a, b) ((a) + (b))
#define NT_FSUB(a, b) ((a) - (b))
#define NT_FDIV(a, b) ((a) / (b))
#define NT_FSQRT(a) sqrtf(a)
#endif

/* Per-group step values computed on the host (they depend on the lr, not on the device step). */
typedef struct {
  double lr[NT_OPTIM_MAX_GROUPS];       /* the group's lr (step lr * lr_mult) */
  float decay[NT_OPTIM_MAX_GROUPS];     /* AdamW: (float)(1 - lr * wd) */
  float wd[NT_OPTIM_MAX_GROUPS];        /* Adam/SGD: (float)wd */
} nt_optim_group_coefs;

typedef struct {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  int decoupled;                        /* AdamW (1) or Adam with L2 (0) */
} nt_adam_hyper;

typedef struct {
  float neg_step_size, bias2_sqrt, decay, wd;
  int use_wd;
} nt_adam_coefs;

/* Reads group `group`'s values with compile-time indices only: a kernel indexing its parameter
 * arrays with a runtime index would copy them to local memory in every thread. */
static inline NT_HD void nt_optim_group_select(const nt_optim_group_coefs *g, int group,
                                               double *lr, float *decay, float *wd) {
  *lr = g->lr[0];
  *decay = g->decay[0];
  *wd = g->wd[0];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 1; i < NT_OPTIM_MAX_GROUPS; i++)
    if (i == group) {
      *lr = g->lr[i];
      *decay = g->decay[i];
      *wd = g->wd[i];
    }
}

static inline NT_HD nt_adam_coefs nt_adam_coefs_make(const nt_optim_group_coefs *g, int group,
                                                     const nt_optim_record *r) {
  nt_adam_coefs k;
  double lr;
  nt_optim_group_select(g, group, &lr, &k.decay, &k.wd);
  k.neg_step_size = (float)(-(lr / r->bias1));
  k.bias2_sqrt = (float)r->bias2_sqrt;
  k.use_wd = k.wd != 0.0f;
  return k;
}

/* One element: p (fp32 master), m, v updated in place; g already unscaled. */
static inline NT_HD void nt_adam_update(float *p, float *m, float *v, float g, float clip,
                                        const nt_adam_hyper *h, const nt_adam_coefs *k) {
  float pp = *p;
  g = NT_FMUL(g, clip);
  if (k->use_wd) {
    if (h->decoupled) pp = NT_FMUL(pp, k->decay);
    else g = NT_FADD(g, NT_FMUL(k->wd, pp));
  }
  /* m.lerp_(g, 1 - beta1) and v.mul_(beta2).addcmul_(g, g, value=1 - beta2) */
  float mm = NT_FADD(*m, NT_FMUL(h->one_minus_beta1, NT_FSUB(g, *m)));
  float vv = NT_FADD(NT_FMUL(*v, h->beta2), NT_FMUL(NT_FMUL(h->one_minus_beta2, g), g));
  float denom = NT_FADD(NT_FDIV(NT_FSQRT(vv), k->bias2_sqrt), h->eps);
  *p = NT_FADD(pp, NT_FMUL(k->neg_step_size, NT_FDIV(mm, denom)));
  *m = mm;
  *v = vv;
}

typedef struct {
  float momentum, one_minus_dampening;
  int nesterov;
} nt_sgd_hyper;

/* One element of SGD; buf is NULL without momentum. first: this is the first applied step. */
static inline NT_HD void nt_sgd_update(float *p, float *buf, float g, float clip, float wd,
                                       float neg_lr, int first, const nt_sgd_hyper *h) {
  float pp = *p;
  g = NT_FMUL(g, clip);
  if (wd != 0.0f) g = NT_FADD(g, NT_FMUL(wd, pp));
  if (buf) {
    float b = first ? g : NT_FADD(NT_FMUL(*buf, h->momentum), NT_FMUL(h->one_minus_dampening, g));
    *buf = b;
    g = h->nesterov ? NT_FADD(g, NT_FMUL(h->momentum, b)) : b;
  }
  *p = NT_FADD(pp, NT_FMUL(neg_lr, g));
}

#endif
