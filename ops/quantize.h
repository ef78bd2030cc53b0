/* FP8 quantization for the delayed-scaling recipe (amp/fp8.h):
 *   y = fp8(x * scale)   (E4M3 or E5M2, round to nearest even, saturating to +-max; NaN stays
 *                          NaN), and amax = max(amax, max|x|) in the same pass.
 * `scale` and `amax` are F32 scalars on ctx's device (nt_fp8_scale_tensor and
 * nt_fp8_amax_tensor of a state); the scale is read on the device, so nothing waits for the
 * host. The amax update is a max with what is already there (several writers per step); a NaN
 * in x makes it NaN, which the scale update then ignores (it keeps the previous scale).
 *
 * Shapes (2-D; x F32, F16 or BF16 with unit stride along its last dim; y FP8, contiguous):
 *   plain:      x [R, C] -> y [R', C'] with R' >= R, C' >= C: y[r, c] = q(x[r, c])
 *   transposed: x [R, C] -> y [C', R'] with C' >= C, R' >= R: y[c, r] = q(x[r, c])
 * Elements of y outside the image of x are written 0, so a buffer padded to the multiples of 16
 * that cuBLASLt's FP8 GEMMs want is filled in the same pass. The transposed form gives the
 * K-major operands of the backward GEMMs (dW = dY^T X needs dY^T and X^T).
 * CPU and GPU produce the same bytes (the conversion is core/convert.h's, bit-exact with
 * CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE). */
#ifndef NT_OPS_QUANTIZE_H
#define NT_OPS_QUANTIZE_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

/* amax may be NULL (no recording, e.g. a second quantization of the same tensor). */
nt_status nt_fp8_quantize(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y, bool transpose,
                          const nt_tensor *scale, nt_tensor *amax);

/* What else the pass over x in nt_fp8_quantize_dual does; all NULL (or NULL options): nothing.
 * Both serve the FP8 linear backward, whose dY is otherwise read again (amp/fp8_linear.h). */
typedef struct {
  /* x is the gradient of gelu_tanh(gelu_pre) (ops/gelu_rule.h): the tensor quantized (and
   * summed, and recorded in amax) is x' = dtype(x)(0 + x * gelu'(gelu_pre)), the bytes that
   * nt_gelu_backward into a zeroed tensor of x's dtype would hold, never stored. gelu_pre: x's
   * shape, dtype and strides, not aliasing the outputs. */
  const nt_tensor *gelu_pre;
  /* F32 [C], contiguous: colsum[c] += the sum over rows of x'[r, c] in fp32 (a linear
   * layer's bias gradient). The GPU adds per 64-row block, then the blocks in order. */
  nt_tensor *colsum;
} nt_fp8_dual_opts;

/* Both layouts from one pass over x: the same bytes (padding included) and the same amax as
 *   nt_fp8_quantize(x, y_rows, false, ..amax) and nt_fp8_quantize(x, y_t, true, ..NULL),
 * with x [R, C], y_rows [R', C'] (R' >= R, C' >= C) and y_t [C'', R''] (C'' >= C, R'' >= R) of
 * one FP8 dtype, distinct buffers. On the GPU x is read once (the linear backward's dY, which
 * its two GEMMs want row-major and transposed). amax and opts may be NULL. */
nt_status nt_fp8_quantize_dual(nt_ctx *ctx, const nt_tensor *x, nt_tensor *y_rows,
                               nt_tensor *y_t, const nt_tensor *scale, nt_tensor *amax,
                               const nt_fp8_dual_opts *opts);

/* y = float(x) * scale_inv, elementwise over same-shape contiguous tensors: x FP8, y F32. The
 * FP8 GEMM emulation uses it (and tests: dequantize(quantize(x)) ~ x). */
nt_status nt_fp8_dequantize(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *scale_inv,
                            nt_tensor *y);

NT_EXTERN_C_END
#endif
