/* Exact fp32 <-> fp16 / bf16 / FP8 conversions on the CPU, with the rules of CUDA's own
 * conversion functions (the host paths of cuda_fp16.hpp, cuda_bf16.hpp, cuda_fp8.hpp):
 *  - one rounding, to nearest with ties to even, straight from the fp32 bits (never via an
 *    intermediate format, which would round twice);
 *  - a NaN input gives the positive canonical NaN of the target (fp16/bf16 0x7fff, FP8 0x7f);
 *  - a NaN decoded to fp32 is 0x7fffffff, except bf16 whose bits are simply widened;
 *  - FP8 overflow: saturate -> +-max finite; no saturation -> NaN (E4M3, which has no inf)
 *    or inf (E5M2), sign kept. */
#include "core/convert.h"
#include <math.h>
#include <string.h>
#include "core/ctx.h"
#ifdef NT_HAVE_CUDA
#include "core/cuda_util.h"
#endif

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

#define F32_CANONICAL_NAN 0x7fffffffu

/* Rounds |x| (fp32 bits without sign, finite) to a binary format with `mbits` stored mantissa
 * bits and exponent bias `bias`, returning the unsigned bit pattern. The pattern may exceed
 * the largest finite one: the caller decides what overflow means. Works because patterns of
 * one sign are ordered like their values, so a rounding carry out of the mantissa moves into
 * the exponent field (and from the largest subnormal into the smallest normal) by itself. */
static uint32_t round_to_format(uint32_t abs_bits, int mbits, int bias) {
  int biased = (int)(abs_bits >> 23);
  uint32_t frac = abs_bits & 0x7fffffu;
  if (biased == 0) {
    /* fp32 subnormals are below 2^-126: far under half the smallest subnormal of every
     * narrower-exponent format here. (bf16 has fp32's exponent and is handled separately.) */
    return 0;
  }
  uint32_t sig = frac | 0x800000u;      /* value = sig * 2^(e - 23) */
  int e = biased - 127;
  int emin = 1 - bias;                  /* exponent of the smallest normal */
  int shift = 23 - mbits + (e < emin ? emin - e : 0);
  int exp_field = e < emin ? 0 : e + bias - 1;  /* minus the implicit bit added below */
  if (shift > 25) return 0;             /* sig < 2^24 <= half of one target quantum */
  uint32_t q = sig >> shift;
  uint32_t rem = sig & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return ((uint32_t)exp_field << mbits) + q;
}

uint16_t nt_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;
  if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  uint32_t r = round_to_format(a, 10, 15);
  if (r >= 0x7c00u) r = 0x7c00u;        /* IEEE: overflow rounds to inf */
  return (uint16_t)(sign | r);
}

float nt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(man ? F32_CANONICAL_NAN : (sign | 0x7f800000u));
  if (exp == 0) {
    /* Subnormal (or zero): man * 2^-24 is exact in fp32. */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t nt_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  uint32_t hi = u >> 16, rem = u & 0xffffu;
  /* Same exponent as fp32: rounding the upper half carries into inf correctly. */
  if (rem > 0x8000u || (rem == 0x8000u && (hi & 1u))) hi++;
  return (uint16_t)hi;
}

float nt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint8_t nt_f32_to_e4m3(float x, bool saturate) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  /* 0x7f is NaN, so anything rounding to 0x7f or beyond (and inf) overflows. */
  uint32_t r = a == 0x7f800000u ? 0x80u : round_to_format(a, 3, 7);
  if (r >= 0x7fu) r = saturate ? 0x7eu : 0x7fu;
  return (uint8_t)(sign | r);
}

float nt_e4m3_to_f32(uint8_t v) {
  uint32_t exp = (v >> 3) & 0xfu, man = v & 7u;
  if ((v & 0x7fu) == 0x7fu) return bits_f32(F32_CANONICAL_NAN);
  float mag = exp == 0 ? (float)man * 0x1p-9f : bits_f32(((exp + 120u) << 23) | (man << 20));
  return (v & 0x80u) ? -mag : mag;
}

uint8_t nt_f32_to_e5m2(float x, bool saturate) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  uint32_t r = a == 0x7f800000u ? 0x7cu : round_to_format(a, 2, 15);
  if (r >= 0x7cu) r = saturate ? 0x7bu : 0x7cu;
  return (uint8_t)(sign | r);
}

float nt_e5m2_to_f32(uint8_t v) {
  /* E5M2 is the upper byte of an fp16. */
  return nt_f16_to_f32((uint16_t)((uint16_t)v << 8));
}

/* Float to integer like CUDA's cvt.rzi: truncation, saturation at the range, NaN -> 0. */
static int64_t f32_to_int(float v, double lo, double hi) {
  if (isnan(v)) return 0;
  double d = trunc((double)v);
  if (d <= lo) return (int64_t)lo;
  if (d >= hi) return hi >= 0x1p63 ? INT64_MAX : (int64_t)hi;  /* 2^63 itself is no int64 */
  return (int64_t)d;
}

float nt_load_f32(const void *data, nt_dtype dt, int64_t i) {
  switch (dt) {
    case NT_F32: return ((const float *)data)[i];
    case NT_F16: return nt_f16_to_f32(((const uint16_t *)data)[i]);
    case NT_BF16: return nt_bf16_to_f32(((const uint16_t *)data)[i]);
    case NT_FP8_E4M3: return nt_e4m3_to_f32(((const uint8_t *)data)[i]);
    case NT_FP8_E5M2: return nt_e5m2_to_f32(((const uint8_t *)data)[i]);
    case NT_I32: return (float)((const int32_t *)data)[i];
    case NT_I64: return (float)((const int64_t *)data)[i];
    case NT_U8: return (float)((const uint8_t *)data)[i];
    default: return NAN;
  }
}

void nt_store_f32(void *data, nt_dtype dt, int64_t i, float v) {
  switch (dt) {
    case NT_F32: ((float *)data)[i] = v; break;
    case NT_F16: ((uint16_t *)data)[i] = nt_f32_to_f16(v); break;
    case NT_BF16: ((uint16_t *)data)[i] = nt_f32_to_bf16(v); break;
    case NT_FP8_E4M3: ((uint8_t *)data)[i] = nt_f32_to_e4m3(v, true); break;
    case NT_FP8_E5M2: ((uint8_t *)data)[i] = nt_f32_to_e5m2(v, true); break;
    case NT_I32: ((int32_t *)data)[i] = (int32_t)f32_to_int(v, INT32_MIN, INT32_MAX); break;
    case NT_I64: ((int64_t *)data)[i] = f32_to_int(v, -0x1p63, 0x1p63); break;
    case NT_U8: ((uint8_t *)data)[i] = (uint8_t)f32_to_int(v, 0, 255); break;
    default: break;
  }
}

/* Float dtypes convert to each other through fp32, which every one of them fits in exactly,
 * so the single rounding happens in the final store. Integers go to and from F32 only: an
 * int -> f16 path through fp32 could round twice. */
static bool convert_supported(nt_dtype dst, nt_dtype src) {
  if (dst == src) return true;
  if (nt_dtype_is_float(dst) && nt_dtype_is_float(src)) return true;
  return dst == NT_F32 || src == NT_F32;
}

static void convert_cpu(void *dst, nt_dtype dd, const void *src, nt_dtype sd, int64_t n) {
  if (dd == sd) {
    memcpy(dst, src, (size_t)n * nt_dtype_size(dd));
    return;
  }
  for (int64_t i = 0; i < n; i++) nt_store_f32(dst, dd, i, nt_load_f32(src, sd, i));
}

#ifdef NT_HAVE_CUDA
nt_status nt_convert_cuda(nt_ctx *ctx, void *dst, nt_dtype dd, const void *src, nt_dtype sd,
                          int64_t n);
#endif

nt_status nt_convert(nt_ctx *ctx, nt_tensor *dst, const nt_tensor *src) {
  nt_status st;
  if ((st = nt_check_device(ctx, dst, "convert dst"))) return st;
  if ((st = nt_check_device(ctx, src, "convert src"))) return st;
  if ((st = nt_check_contiguous(ctx, dst, "convert dst"))) return st;
  if ((st = nt_check_contiguous(ctx, src, "convert src"))) return st;
  int64_t n = nt_tensor_numel(src);
  if (nt_tensor_numel(dst) != n)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "convert of %lld elements into %lld", (long long)n,
                    (long long)nt_tensor_numel(dst));
  if ((unsigned)src->dtype >= NT_DTYPE_COUNT || (unsigned)dst->dtype >= NT_DTYPE_COUNT)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "convert: invalid dtype (%d -> %d)", (int)src->dtype,
                    (int)dst->dtype);
  if (!convert_supported(dst->dtype, src->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE,
                    "convert from %s to %s: integers convert only to and from f32",
                    nt_dtype_name(src->dtype), nt_dtype_name(dst->dtype));
  if (n == 0) return NT_OK;
  if (!nt_ctx_is_cuda(ctx)) {
    convert_cpu(dst->data, dst->dtype, src->data, src->dtype, n);
    return NT_OK;
  }
#ifdef NT_HAVE_CUDA
  return nt_convert_cuda(ctx, dst->data, dst->dtype, src->data, src->dtype, n);
#else
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "convert on a CUDA tensor: CUDA is not compiled in");
#endif
}
