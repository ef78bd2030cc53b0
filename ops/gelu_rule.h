/* The tanh-approximate GELU (PyTorch's gelu(approximate='tanh')) and its derivative, written
 * once for the CPU references and the CUDA kernels that use it (the elementwise maps, the GEMM
 * epilogue fallback, the FP8 quantization's fused GELU backward), so every path computes the
 * same expression. Private.
 *   gelu(x)  = 0.5 x (1 + t),  t = tanh(u),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * (the expressions, and so the roundings, of the elementwise kernels before this header). */
#ifndef NT_OPS_GELU_RULE_H
#define NT_OPS_GELU_RULE_H
#include <math.h>
#include "core/hd.h"

#define NT_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define NT_GELU_C 0.044715f

static inline NT_HD float nt_gelu(float x) {
  float t = tanhf(NT_GELU_S * (x + NT_GELU_C * x * x * x));
  return 0.5f * x * (1.0f + t);
}
static inline NT_HD float nt_gelu_grad(float x) {
  float t = tanhf(NT_GELU_S * (x + NT_GELU_C * x * x * x));
  float du = NT_GELU_S * (1.0f + 3.0f * NT_GELU_C * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

#endif
