/* Precision policies: names, the dtype table, the FP8 capability check and fallback. */
#include "amp/policy.h"
#include <string.h>
#ifdef NT_HAVE_CUDA
#include "core/cuda_util.h"
#endif

static const char *const names[NT_PREC_COUNT] = {"fp32", "tf32", "bf16", "fp16", "fp8"};

const char *nt_precision_name(nt_precision p) {
  return (p >= 0 && p < NT_PREC_COUNT) ? names[p] : "unknown";
}

nt_status nt_precision_parse(nt_ctx *ctx, const char *name, nt_precision *out) {
  static const struct { const char *alias; nt_precision p; } aliases[] = {
      {"float32", NT_PREC_FP32}, {"f32", NT_PREC_FP32}, {"bfloat16", NT_PREC_BF16},
      {"float16", NT_PREC_FP16}, {"half", NT_PREC_FP16}, {"f16", NT_PREC_FP16}};
  if (!name) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "precision name is NULL");
  for (int i = 0; i < NT_PREC_COUNT; i++)
    if (strcmp(name, names[i]) == 0) { *out = (nt_precision)i; return NT_OK; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].p; return NT_OK; }
  return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                  "unknown precision '%s' (fp32, tf32, bf16, fp16, fp8)", name);
}

nt_status nt_policy_compute_capability(nt_ctx *ctx, int *cc) {
  *cc = 0;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    int major = 0, minor = 0, dev = nt_ctx_device(ctx).index;
    nt_status st = NT_CUDA(ctx, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (!st) st = NT_CUDA(ctx, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (st) return st;
    *cc = major * 10 + minor;
  }
#endif
  (void)ctx;
  return NT_OK;
}

nt_status nt_policy_make_for(nt_ctx *ctx, nt_precision requested, int cc, nt_policy *out) {
  nt_policy p;
  if (requested < 0 || requested >= NT_PREC_COUNT)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "unknown precision %d", (int)requested);
  memset(&p, 0, sizeof p);
  p.requested = requested;
  p.precision = requested;
  if (requested == NT_PREC_FP8 && cc < 90) {
    if (cc == 0)
      nt_log(ctx, NT_LOG_WARN,
             "precision fp8 needs a Hopper GPU (compute capability >= 9.0); this is a CPU "
             "context: falling back to bf16");
    else
      nt_log(ctx, NT_LOG_WARN,
             "precision fp8 needs a Hopper GPU (compute capability >= 9.0), this GPU is %d.%d: "
             "falling back to bf16", cc / 10, cc % 10);
    p.precision = NT_PREC_BF16;
  }
  switch (p.precision) {
    case NT_PREC_FP32: p.compute_dtype = NT_F32; break;
    case NT_PREC_TF32: p.compute_dtype = NT_F32; p.allow_tf32 = true; break;
    case NT_PREC_BF16: p.compute_dtype = NT_BF16; break;
    case NT_PREC_FP16: p.compute_dtype = NT_F16; p.needs_scaler = true; break;
    case NT_PREC_FP8: p.compute_dtype = NT_BF16; p.fp8 = true; break;
    default: break;
  }
  p.fp8_forward = p.fp8 ? NT_FP8_E4M3 : p.compute_dtype;
  p.fp8_backward = p.fp8 ? NT_FP8_E5M2 : p.compute_dtype;
  *out = p;
  return NT_OK;
}

nt_status nt_policy_make(nt_ctx *ctx, nt_precision requested, nt_policy *out) {
  int cc = 0;
  nt_status st = nt_policy_compute_capability(ctx, &cc);
  if (st) return st;
  return nt_policy_make_for(ctx, requested, cc, out);
}

void nt_policy_apply(nt_ctx *ctx, const nt_policy *p) { nt_ctx_set_allow_tf32(ctx, p->allow_tf32); }
