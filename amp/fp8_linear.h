/* Linear layer with FP8 GEMMs (Transformer Engine's "HYBRID" delayed-scaling recipe, see
 * amp/fp8.h and docs/semantics.md): the semantics of nt_linear_forward/backward
 * (ops/linear.h), same arguments plus the FP8 configuration:
 *   y = act(x W^T + b)        W [out, in], x [.., in], y [.., out]   (act: see the forward)
 *   dx += dy W,  dW += dy^T x,  db += sum over rows of dy        (each may be NULL to skip)
 * x, W, dy: F32, F16 or BF16 (any mix); y, dx, dW: F32, F16 or BF16; b, db: F32, F16 or BF16.
 * Leading dims of x, y, dy, dx are flattened into rows (contiguous when more than 2-D).
 *
 * Each layer uses three tensors of a delayed-scaling state: index (the input x, E4M3),
 * index + 1 (the weight, E4M3) and index + 2 (the output gradient dy, E5M2).
 *   forward:  xq = e4m3(x * s_x), wq = e4m3(W * s_w), amax_x and amax_w recorded;
 *             y = (xq wq^T) * (1/s_x)(1/s_w) + b                       E4M3 x E4M3
 *   backward: dyq = e5m2(dy * s_g), amax_g recorded; W and x quantized again with the same
 *             scales (transposed: the GEMMs want K-major operands); with both dx and dW
 *             wanted, dy is quantized row-major and transposed in one pass
 *             (nt_fp8_quantize_dual), which also sums db (fp32 db) and can form dy from the
 *             gradient of a GELU after the layer (nt_fp8_linear_bwd_opts);
 *             dx += (dyq (wq^T)^T) / (s_g s_w)                          E5M2 x E4M3
 *             dW += (dyq^T (xq^T)^T) / (s_g s_x)                        E5M2 x E4M3
 *             db += column sums of dy in fp32 (from dy itself, not its FP8 copy).
 * The scales are the state's current ones (read on the device); nt_fp8_update(ctx, state) once
 * per step, after the backward, turns the recorded amaxes into the next step's scales (several
 * forwards in a step, as with gradient accumulation, record the max of their amaxes). GEMMs
 * accumulate in fp32. Quantized operands are padded with zeros to multiples of 16 (cuBLASLt's
 * FP8 alignment rules), so any shape works; when a product's dims are already multiples of 16
 * the GEMM writes (or accumulates into) the output directly, otherwise it writes an fp32
 * scratch that one small kernel adds into the output (with the bias).
 *
 * Where the FP8 GEMM runs: a CUDA context on compute capability >= 9.0 (Hopper). Elsewhere (the
 * CPU, older GPUs) or with cfg->emulate, the same quantization runs and the GEMMs run in fp32 on
 * the dequantized values (fp8 value * scale_inv): the numbers FP8 would give up to the order of
 * fp32 accumulation, so the recipe is testable without Hopper. (The precision policy,
 * amp/policy.h, chooses bf16 instead of fp8 below 9.0; the emulation is for tests and CI.) */
#ifndef NT_AMP_FP8_LINEAR_H
#define NT_AMP_FP8_LINEAR_H
#include "core/nt.h"
#include "amp/fp8.h"
#include "ops/linear.h"
NT_EXTERN_C_BEGIN

/* Offsets of a layer's tensors from its index in the state. */
enum { NT_FP8_LINEAR_INPUT = 0, NT_FP8_LINEAR_WEIGHT = 1, NT_FP8_LINEAR_GRAD = 2,
       NT_FP8_LINEAR_TENSORS = 3 };

typedef struct {
  nt_fp8_state *state;   /* not owned */
  int index;             /* first of the layer's three tensors in state */
  bool emulate;          /* fp32 GEMMs on dequantized values even on Hopper (tests) */
} nt_fp8_linear_cfg;

/* A state for n_layers layers: tensors 3l, 3l+1, 3l+2 are layer l's (E4M3, E4M3, E5M2), so one
 * nt_fp8_update launch serves the whole model. opt NULL: defaults (history 1024, margin 0). */
nt_status nt_fp8_linear_state_create(nt_ctx *ctx, const nt_fp8_options *opt, int n_layers,
                                     nt_fp8_state **out);

/* Whether nt_fp8_linear_* would run real FP8 GEMMs on this context (Hopper, no emulate). */
nt_status nt_fp8_linear_uses_fp8(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, bool *out);

/* act as nt_linear_forward: GELU writes the pre-activation x W^T + b into `pre` (same shape
 * and dtype as y, kept for backward) and y = gelu_tanh(pre); RELU gives y = relu(..) (pre
 * unused). With real FP8 GEMMs and no padding (in and out multiples of 16, y 16-byte aligned,
 * no bias or a bf16 bias with bf16 y) GELU runs in the GEMM's GELU_AUX epilogue (ops/gemm.h;
 * y may be gelu_tanh of the pre-activation before its rounding to pre); otherwise, and for RELU
 * and the emulation, the activation is its own elementwise pass after the GEMM
 * (ops/elementwise.h). With an activation y (and pre) must be contiguous. */
nt_status nt_fp8_linear_forward(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, const nt_tensor *x,
                                const nt_tensor *w, const nt_tensor *b, nt_tensor *y,
                                nt_activation act, nt_tensor *pre);
/* dy is the gradient of the layer's output before the activation (nt_gelu_backward /
 * nt_relu_backward first), as for nt_linear_backward. */
nt_status nt_fp8_linear_backward(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg, const nt_tensor *dy,
                                 const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                 nt_tensor *dw, nt_tensor *db);

/* Options of nt_fp8_linear_backward_ex; all zero (or NULL options) is nt_fp8_linear_backward.
 * dW and db always accumulate. */
typedef struct {
  /* dx = dy W: the GEMM (or the fp32 scratch's add) writes dx without reading it, which spares
   * zeroing dx first. */
  bool overwrite_dx;
  /* The layer's output went through GELU (an MLP's first layer, y = gelu_tanh(pre)), and dy
   * is the gradient of gelu's output: the layer's own output gradient is then
   * dy * gelu_tanh'(pre), rounded to dy's dtype (the bytes nt_gelu_backward into a zeroed
   * tensor gives). With dx and dW both wanted (and db NULL or F32) it is formed inside the
   * quantization pass and never stored; otherwise in a scratch first. pre: dy's shape, dtype
   * and layout (dy then contiguous). */
  const nt_tensor *dy_gelu_pre;
} nt_fp8_linear_bwd_opts;

nt_status nt_fp8_linear_backward_ex(nt_ctx *ctx, const nt_fp8_linear_cfg *cfg,
                                    const nt_tensor *dy, const nt_tensor *x, const nt_tensor *w,
                                    nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                                    const nt_fp8_linear_bwd_opts *opts);

NT_EXTERN_C_END
#endif
