/* Shared machinery of the fused optimizers (private): the chunk table that maps parameter
 * groups onto blocks of one launch per unit, the device step record, and the per-step
 * "prepare" (skip flag, step counter, clip coefficient, bias corrections) that one tiny kernel
 * computes on the device, so no host sync is needed. */
#ifndef NT_OPTIM_COMMON_H
#define NT_OPTIM_COMMON_H
#include <stdint.h>
#include <math.h>
#include "core/nt.h"
#include "optim/optimizer.h"
#include "core/hd.h"
NT_EXTERN_C_BEGIN

/* One block's work: `length` (<= NT_OPTIM_CHUNK) consecutive elements of one group. */
typedef struct {
  int64_t offset;
  int32_t length;
  int32_t group;
} nt_optim_chunk;
#define NT_OPTIM_CHUNK 4096

/* Per-step values computed on the device by the prepare step; the update kernels read them
 * (nothing per step is a kernel argument, so a captured CUDA graph replays correctly when the
 * lr comes from a device tensor). */
typedef struct {
  int32_t step;        /* completed steps (the step being applied when !skip) */
  int32_t skip;        /* this step is skipped (found_inf != 0) */
  float clip_coef;     /* gradients are multiplied by this (1 without clipping) */
  float total_norm;    /* sqrt(sumsq) of the latest clipped step (0 without clipping) */
  float bias1;         /* (float)(1 - beta1^step), beta^step in double (AdamW) */
  float bias2_sqrt;    /* sqrtf((float)(1 - beta2^step)) */
  /* Per group: */
  float neg_step[NT_OPTIM_MAX_GROUPS];   /* AdamW: -((float)lr / bias1), a float division */
  float decay[NT_OPTIM_MAX_GROUPS];      /* AdamW: (float)(1 - lr * wd) */
  float wd[NT_OPTIM_MAX_GROUPS];         /* (float)wd */
  float neg_lr[NT_OPTIM_MAX_GROUPS];     /* SGD: (float)-lr */
} nt_optim_record;

/* Static per-group configuration (a kernel argument of the prepare step). */
typedef struct {
  double lr_mult[NT_OPTIM_MAX_GROUPS];
  double weight_decay[NT_OPTIM_MAX_GROUPS];
  int32_t n;
} nt_optim_groups;

/* Host-side state common to every optimizer. */
typedef struct {
  int n_units;
  nt_param_unit *units;          /* copies of the caller's views (master_init cleared) */
  float **master;                /* per unit: fp32 master (aliases params when F32) */
  bool *master_owned;
  int n_groups;
  nt_optim_groups groups;   /* groups.n == n_groups */
  nt_optim_chunk **chunks;       /* per unit, on the ctx's device */
  int64_t *n_chunks;
  nt_optim_record *rec;          /* on the ctx's device */
  float *sumsq;                  /* scratch F32 scalar on the ctx's device */
  nt_tensor *grad_views;         /* per unit: a flat view of its gradients (the sum of squares
                                  * when no grad_sumsq is given) */
  const nt_tensor **grad_list;   /* pointers to grad_views */
  nt_device device;
} nt_optim_base;

nt_status nt_optim_base_init(nt_ctx *ctx, nt_optim_base *b, const nt_param_unit *units,
                             int n_units, const nt_param_group *groups, int n_groups,
                             double default_weight_decay);
void nt_optim_base_free(nt_ctx *ctx, nt_optim_base *b);
/* Skip flag, step counter, clip coefficient, bias corrections and the groups' step values:
 * one tiny launch (or host code). default_lr is used when a->lr < 0 and no lr_tensor. */
nt_status nt_optim_base_prepare(nt_ctx *ctx, nt_optim_base *b, const nt_optim_step_args *a,
                                double beta1, double beta2, double default_lr);
/* Allocates n floats per unit on the device, zeroed (moments). */
nt_status nt_optim_base_alloc_state(nt_ctx *ctx, nt_optim_base *b, float ***out);
void nt_optim_base_free_state(nt_ctx *ctx, nt_optim_base *b, float **bufs);
/* Record <-> host (synchronizes). */
nt_status nt_optim_base_read(nt_ctx *ctx, nt_optim_base *b, nt_optim_record *out);
nt_status nt_optim_base_write(nt_ctx *ctx, nt_optim_base *b, const nt_optim_record *in);
/* Raw byte copies between host memory and the ctx's device. */
nt_status nt_optim_copy(nt_ctx *ctx, void *dst, bool dst_host, const void *src, bool src_host,
                        size_t bytes);
/* Save/load of named fp32 per-unit buffers in a small binary file (see adamw.h). */
nt_status nt_optim_save(nt_ctx *ctx, nt_optim_base *b, const char *path, const char *kind,
                        float **const *bufs, int n_bufs);
nt_status nt_optim_load(nt_ctx *ctx, nt_optim_base *b, const char *path, const char *kind,
                        float **const *bufs, int n_bufs);
/* Rewrites the F16/BF16 compute copies from the master weights (after a load). */
nt_status nt_optim_base_refresh_params(nt_ctx *ctx, nt_optim_base *b);

/* beta^t by squaring in double: the same bits on the host and the device. */
static inline NT_HD double nt_optim_powi(double base, int32_t t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r *= base;
    base *= base;
    t >>= 1;
  }
  return r;
}

/* Explicitly rounded fp32 and fp64 arithmetic for the rules shared by the host and the device:
 * on the device no multiply-add is contracted into an FMA (the one FMA, NT_FFMA, is explicit on
 * both sides), so both compute the same bits. */
#ifdef __CUDA_ARCH__
#define NT_FMUL(a, b) __fmul_rn((a), (b))
#define NT_FADD(a, b) __fadd_rn((a), (b))
#define NT_FSUB(a, b) __fsub_rn((a), (b))
#define NT_FDIV(a, b) __fdiv_rn((a), (b))
#define NT_FSQRT(a) __fsqrt_rn(a)
#define NT_FFMA(a, b, c) __fmaf_rn((a), (b), (c))
#define NT_DMUL(a, b) __dmul_rn((a), (b))
#define NT_DSUB(a, b) __dsub_rn((a), (b))
#else
#define NT_FMUL(a, b) ((a) * (b))
#define NT_FADD(a, b) ((a) + (b))
#define NT_FSUB(a, b) ((a) - (b))
#define NT_FDIV(a, b) ((a) / (b))
#define NT_FSQRT(a) sqrtf(a)
#define NT_FFMA(a, b, c) fmaf((a), (b), (c))   /* correctly rounded, as the device's */
#define NT_DMUL(a, b) ((a) * (b))
#define NT_DSUB(a, b) ((a) - (b))
#endif

/* The prepare rule (host and device). found, grad_scale, sumsq and lr_dev may be NULL;
 * nt_optim_base_prepare gives sumsq whenever max_norm > 0, and grad_scale only then.
 * Clipping as torch's clip_grad_norm_: total = sqrt(sumsq) (times grad_scale: the norm of the
 * unscaled gradients), coefficient min(1, max_norm / (total + 1e-6)) (times grad_scale), in
 * explicitly rounded fp32. With grad_scale and found, a total that is not finite sets *found
 * and skips the step, as an unscale pass would have: a non-finite sumsq (a gradient that is
 * not finite, or squares that overflow fp32), an infinite grad_scale (1/scale once the loss
 * scale is below 2^-127: the unscale pass would have made every element inf or NaN), or a
 * product that overflows. A finite total gives a finite coefficient (min(1, ...) is in
 * [0, 1]). Without found there is no overflow check: a NaN coefficient propagates, as torch's
 * clip_grad_norm_ does on a non-finite norm. */
static inline NT_HD void nt_optim_prepare_rule(nt_optim_record *r, float *found,
                                               const float *grad_scale, const float *sumsq,
                                               float max_norm, double beta1, double beta2,
                                               double lr, const float *lr_dev,
                                               const nt_optim_groups *g) {
  const float inv = grad_scale ? *grad_scale : 1.0f;
  const bool clip = sumsq && max_norm > 0.0f;
  float coef = inv, total = 0.0f;
  if (clip) {
    total = grad_scale ? NT_FMUL(NT_FSQRT(*sumsq), inv) : NT_FSQRT(*sumsq);
    float c = NT_FDIV(max_norm, NT_FADD(total, 1e-6f));
    /* clamp(max=1) as torch: a NaN coefficient propagates (c < 1 is false for NaN); an
     * infinite max_norm gives 1 (no clipping) */
    if (!(c < 1.0f) && c == c) c = 1.0f;
    coef = grad_scale ? NT_FMUL(c, inv) : c;
  }
  if (found && grad_scale && !isfinite(total)) *found = 1.0f;
  r->skip = (found && *found != 0.0f) ? 1 : 0;
  if (r->skip) return;
  r->step += 1;
  r->clip_coef = coef;
  if (clip) r->total_norm = total;
  /* torch's arithmetic (it reproduces docs/semantics.md's vectors bit for bit): the corrections
   * rounded to fp32, the step size an fp32 division. */
  r->bias1 = (float)(1.0 - nt_optim_powi(beta1, r->step));
  r->bias2_sqrt = sqrtf((float)(1.0 - nt_optim_powi(beta2, r->step)));
  if (lr_dev) lr = (double)*lr_dev;
  for (int i = 0; i < NT_OPTIM_MAX_GROUPS; i++) {
    double lrg = i < g->n ? NT_DMUL(lr, g->lr_mult[i]) : 0.0;
    double wd = i < g->n ? g->weight_decay[i] : 0.0;
    r->neg_step[i] = -((float)lrg / r->bias1);
    r->decay[i] = (float)NT_DSUB(1.0, NT_DMUL(lrg, wd));
    r->wd[i] = (float)wd;
    r->neg_lr[i] = (float)(-lrg);
  }
}

NT_EXTERN_C_END
#endif
