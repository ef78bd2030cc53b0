/* Exact conversions between fp32 and the low-precision formats, bit-identical to CUDA's
 * conversion intrinsics (__float2half_rn, __float2bfloat16_rn, __nv_cvt_float_to_fp8):
 * round to nearest even, NaN, inf, overflow and subnormals included. */
#ifndef NT_CONVERT_H
#define NT_CONVERT_H
#include <stdint.h>
#include <stdbool.h>
#include "core/status.h"
#include "core/tensor.h"
NT_EXTERN_C_BEGIN

uint16_t nt_f32_to_f16(float x);
float nt_f16_to_f32(uint16_t h);
uint16_t nt_f32_to_bf16(float x);
float nt_bf16_to_f32(uint16_t h);
/* saturate: true = __NV_SATFINITE (out-of-range finite values become +-max),
 *           false = __NV_NOSAT (they become NaN for E4M3, inf for E5M2). */
uint8_t nt_f32_to_e4m3(float x, bool saturate);
float nt_e4m3_to_f32(uint8_t v);
uint8_t nt_f32_to_e5m2(float x, bool saturate);
float nt_e5m2_to_f32(uint8_t v);

/* Element i of a tensor as float / set from float (CPU memory only; any float dtype or int). */
float nt_load_f32(const void *data, nt_dtype dt, int64_t i);
void nt_store_f32(void *data, nt_dtype dt, int64_t i, float v);

/* dst = src converted elementwise (same numel, contiguous, same device). FP8 outputs
 * saturate. Runs on ctx's device. */
nt_status nt_convert(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src);

NT_EXTERN_C_END
#endif
