/* Precision policies, selectable per run: which dtype the weight copies and activations use,
 * whether the loss needs dynamic scaling, TF32 for fp32 GEMMs, FP8 for the linear layers.
 *
 *   policy  weights/activations  GEMM inputs           scaler  tf32
 *   fp32    F32                  F32                   no      no
 *   tf32    F32                  F32 (TF32 tensor ops) no      yes
 *   bf16    BF16                 BF16                  no      no
 *   fp16    F16                  F16                   yes     no
 *   fp8     BF16                 E4M3 fwd / E5M2 grads no      no   (linear layers; delayed
 *                                                                  scaling: amp/fp8.h)
 * GEMMs accumulate in fp32; LayerNorm statistics, softmax, the loss and reductions stay fp32
 * under every policy. FP8 needs compute capability >= 9.0 (Hopper); elsewhere (older GPUs, the
 * CPU) nt_policy_make logs why and falls back to bf16. The optimizer keeps fp32 master weights
 * in every policy. */
#ifndef NT_AMP_POLICY_H
#define NT_AMP_POLICY_H
#include <stdbool.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_PREC_FP32 = 0,
  NT_PREC_TF32,
  NT_PREC_BF16,
  NT_PREC_FP16,
  NT_PREC_FP8,
  NT_PREC_COUNT
} nt_precision;

const char *nt_precision_name(nt_precision p);       /* "fp32", "tf32", "bf16", "fp16", "fp8" */
/* Accepts the names above (also "float32", "bfloat16", "float16", "half"). */
nt_status nt_precision_parse(nt_ctx *ctx, const char *name, nt_precision *out);

typedef struct {
  nt_precision requested;
  nt_precision precision;    /* the effective policy (fp8 may fall back to bf16) */
  nt_dtype compute_dtype;    /* weight copies and activations */
  nt_dtype fp8_forward;      /* NT_FP8_E4M3 when fp8, else compute_dtype */
  nt_dtype fp8_backward;     /* NT_FP8_E5M2 when fp8, else compute_dtype */
  bool needs_scaler;         /* dynamic loss scaling (fp16) */
  bool allow_tf32;
  bool fp8;
} nt_policy;

/* The policy for `requested` on ctx's device (checks FP8 support, logs a fallback). */
nt_status nt_policy_make(nt_ctx *ctx, nt_precision requested, nt_policy *out);
/* The same for a given compute capability (major*10+minor; 0 = CPU), without a device query. */
nt_status nt_policy_make_for(nt_ctx *ctx, nt_precision requested, int compute_capability,
                             nt_policy *out);
/* Compute capability of ctx's GPU as major*10+minor (0 for a CPU context). */
nt_status nt_policy_compute_capability(nt_ctx *ctx, int *cc);
/* Applies the context-wide parts (TF32 for fp32 GEMMs). */
void nt_policy_apply(nt_ctx *ctx, const nt_policy *p);

NT_EXTERN_C_END
#endif
