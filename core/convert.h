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

/* Element i of a tensor as float / set from float (CPU memory only; any dtype). Stores round
 * to nearest even; FP8 stores saturate; integer stores truncate toward zero, saturate at the
 * type's range and turn NaN into 0 (the rule the GPU kernels follow too). */
float nt_load_f32(const void *data, nt_dtype dt, int64_t i);
void nt_store_f32(void *data, nt_dtype dt, int64_t i, float v);

/* dst = src converted elementwise (same numel, contiguous, same device, no overlap unless the
 * dtypes are equal). Any float dtype to any float dtype (one rounding: every float dtype is
 * exact in fp32); integers (I32, I64, U8) only to and from F32. FP8 outputs saturate. Runs on
 * ctx's device; CPU and GPU results are bit-identical (NaN encodings aside). */
nt_status nt_convert(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src);

NT_EXTERN_C_END
#endif
