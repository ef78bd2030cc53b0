/* Conversions on the GPU: CUDA's intrinsics applied on the device to every 16-bit and 8-bit
 * pattern and to 2^25 fp32 inputs, compared bit for bit with the CPU functions; then
 * nt_convert on a CUDA context against nt_convert on the CPU for every supported dtype pair.
 *
 * NaN: the CPU follows CUDA's host code (canonical positive NaN). Should the hardware encode a
 * NaN differently (another payload or sign), the output is still required to be a NaN and the
 * difference is printed as a NOTE with the patterns, not counted as a failure. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "tests/testutil.h"
}
#include "core/cuda_util.h"

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Per fp32 input: f16, bf16, then e4m3 sat, e4m3 nosat, e5m2 sat, e5m2 nosat. */
struct encoded {
  uint16_t f16, bf16;
  uint8_t fp8[4];
};

__device__ uint32_t sweep_input(uint32_t i, int pass) {
  return (i << 8) | (pass ? (i * 2654435761u) >> 24 : 0u);
}

__global__ void encode_kernel(int pass, uint32_t n, encoded *out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = __uint_as_float(sweep_input(i, pass));
  encoded e;
  e.f16 = __half_as_ushort(__float2half_rn(x));
  e.bf16 = __bfloat16_as_ushort(__float2bfloat16_rn(x));
  e.fp8[0] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  e.fp8[1] = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
  e.fp8[2] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  e.fp8[3] = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
  out[i] = e;
}

/* Every 16-bit pattern decoded as f16 and bf16; the first 256 also as E4M3 / E5M2 (through
 * __nv_cvt_fp8_to_halfraw, whose half result is recorded too). */
__global__ void decode_kernel(float *f16, float *bf16, float *e4m3, float *e5m2,
                              uint16_t *e4m3_half, uint16_t *e5m2_half) {
  uint32_t v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= 65536) return;
  f16[v] = __half2float(__ushort_as_half((unsigned short)v));
  bf16[v] = __bfloat162float(__ushort_as_bfloat16((unsigned short)v));
  if (v < 256) {
    __half_raw a = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    __half_raw b = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E5M2);
    e4m3_half[v] = a.x;
    e5m2_half[v] = b.x;
    e4m3[v] = __half2float(__half(a));
    e5m2[v] = __half2float(__half(b));
  }
}

typedef struct {
  const char *what;
  long exact_bad, nan_diff, n;
  uint32_t note_cpu, note_gpu, note_in;
} tally;

static tally T(const char *what) {
  tally t;
  memset(&t, 0, sizeof t);
  t.what = what;
  return t;
}

static bool f32_nan(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }
static bool f16_nan(uint32_t b) { return (b & 0x7fffu) > 0x7c00u; }
static bool bf16_nan(uint32_t b) { return (b & 0x7fffu) > 0x7f80u; }
static bool e4m3_nan(uint32_t b) { return (b & 0x7fu) == 0x7fu; }
static bool e5m2_nan(uint32_t b) { return (b & 0x7fu) > 0x7cu; }

static void compare(tally *t, uint32_t in, uint32_t cpu, uint32_t gpu, bool (*is_nan)(uint32_t)) {
  t->n++;
  if (cpu == gpu) return;
  if (is_nan(cpu) && is_nan(gpu)) {
    if (t->nan_diff++ == 0) { t->note_cpu = cpu; t->note_gpu = gpu; t->note_in = in; }
    return;
  }
  if (t->exact_bad++ < 5)
    fprintf(stderr, "%s: input 0x%08x cpu 0x%x gpu 0x%x\n", t->what, in, cpu, gpu);
}

static void report(const tally *t) {
  CHECK(t->exact_bad == 0, "%s: %ld of %ld differ from the intrinsic", t->what, t->exact_bad, t->n);
  if (t->nan_diff)
    printf("NOTE %s: %ld NaN results encoded differently (input 0x%x: cpu 0x%x, gpu 0x%x)\n",
           t->what, t->nan_diff, t->note_in, t->note_cpu, t->note_gpu);
  else
    printf("%s: %ld inputs, bit-identical\n", t->what, t->n);
}

static void test_intrinsics(nt_ctx *ctx) {
  const uint32_t n = 1u << 24;
  cudaStream_t s = nt_cuda_stream(ctx);
  void *d_enc = NULL, *d_dec = NULL;
  encoded *h_enc = (encoded *)malloc(sizeof(encoded) * n);
  float *h_dec = (float *)malloc(sizeof(float) * (2 * 65536 + 512) + 2 * 256 * sizeof(uint16_t));
  if (!h_enc || !h_dec) { CHECK(false, "host memory"); goto done; }
  if (!CHECK_OK(ctx, nt_alloc(ctx, sizeof(encoded) * n, &d_enc))) goto done;
  if (!CHECK_OK(ctx, nt_alloc(ctx, sizeof(float) * (2 * 65536 + 512) + 2 * 256 * sizeof(uint16_t), &d_dec)))
    goto done;
  {
    tally tf16 = T("__float2half_rn"), tbf16 = T("__float2bfloat16_rn");
    tally t8[4] = {T("e4m3 SATFINITE"), T("e4m3 NOSAT"), T("e5m2 SATFINITE"), T("e5m2 NOSAT")};
    for (int pass = 0; pass < 2; pass++) {
      encode_kernel<<<n / 256, 256, 0, s>>>(pass, n, (encoded *)d_enc);
      if (!CHECK_OK(ctx, NT_CUDA_LAUNCHED(ctx))) goto done;
      if (!CHECK_OK(ctx, NT_CUDA(ctx, cudaMemcpyAsync(h_enc, d_enc, sizeof(encoded) * n,
                                                      cudaMemcpyDeviceToHost, s))))
        goto done;
      if (!CHECK_OK(ctx, NT_CUDA(ctx, cudaStreamSynchronize(s)))) goto done;
      for (uint32_t i = 0; i < n; i++) {
        uint32_t in = (i << 8) | (pass ? (i * 2654435761u) >> 24 : 0u);
        float x;
        memcpy(&x, &in, 4);
        compare(&tf16, in, nt_f32_to_f16(x), h_enc[i].f16, f16_nan);
        compare(&tbf16, in, nt_f32_to_bf16(x), h_enc[i].bf16, bf16_nan);
        compare(&t8[0], in, nt_f32_to_e4m3(x, true), h_enc[i].fp8[0], e4m3_nan);
        compare(&t8[1], in, nt_f32_to_e4m3(x, false), h_enc[i].fp8[1], e4m3_nan);
        compare(&t8[2], in, nt_f32_to_e5m2(x, true), h_enc[i].fp8[2], e5m2_nan);
        compare(&t8[3], in, nt_f32_to_e5m2(x, false), h_enc[i].fp8[3], e5m2_nan);
      }
    }
    report(&tf16);
    report(&tbf16);
    for (int k = 0; k < 4; k++) report(&t8[k]);
  }
  {
    float *d = (float *)d_dec;
    uint16_t *dh = (uint16_t *)(d + 2 * 65536 + 512);
    decode_kernel<<<65536 / 256, 256, 0, s>>>(d, d + 65536, d + 2 * 65536, d + 2 * 65536 + 256,
                                              dh, dh + 256);
    if (!CHECK_OK(ctx, NT_CUDA_LAUNCHED(ctx))) goto done;
    size_t bytes = sizeof(float) * (2 * 65536 + 512) + 2 * 256 * sizeof(uint16_t);
    if (!CHECK_OK(ctx, NT_CUDA(ctx, cudaMemcpyAsync(h_dec, d_dec, bytes, cudaMemcpyDeviceToHost, s))))
      goto done;
    if (!CHECK_OK(ctx, NT_CUDA(ctx, cudaStreamSynchronize(s)))) goto done;
    const uint16_t *hh = (const uint16_t *)(h_dec + 2 * 65536 + 512);
    tally th = T("__half2float"), tb = T("__bfloat162float"), t4 = T("e4m3 -> f32"),
          t5 = T("e5m2 -> f32"), t4h = T("e4m3 -> halfraw"), t5h = T("e5m2 -> halfraw");
    for (uint32_t v = 0; v < 65536; v++) {
      compare(&th, v, f32_bits(nt_f16_to_f32((uint16_t)v)), f32_bits(h_dec[v]), f32_nan);
      compare(&tb, v, f32_bits(nt_bf16_to_f32((uint16_t)v)), f32_bits(h_dec[65536 + v]), f32_nan);
    }
    for (uint32_t v = 0; v < 256; v++) {
      float c4 = nt_e4m3_to_f32((uint8_t)v), c5 = nt_e5m2_to_f32((uint8_t)v);
      compare(&t4, v, f32_bits(c4), f32_bits(h_dec[2 * 65536 + v]), f32_nan);
      compare(&t5, v, f32_bits(c5), f32_bits(h_dec[2 * 65536 + 256 + v]), f32_nan);
      /* Every FP8 value is an fp16 value, so the half result is the f16 encoding. */
      compare(&t4h, v, nt_f32_to_f16(c4), hh[v], f16_nan);
      compare(&t5h, v, nt_f32_to_f16(c5), hh[256 + v], f16_nan);
    }
    report(&th);
    report(&tb);
    report(&t4);
    report(&t5);
    report(&t4h);
    report(&t5h);
  }
done:
  nt_free(ctx, d_enc);
  nt_free(ctx, d_dec);
  free(h_enc);
  free(h_dec);
}

/* Host data of dtype `dt`: random values with the edge cases mixed in. */
static void make_source(nt_dtype dt, void *buf, int64_t n, nt_test_rng *r) {
  static const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-8f, 6e-5f,
                                  65520.0f, 464.0f, 61440.0f, 1e30f, -3e9f, 255.5f, -1.5f, 2.5f};
  int ns = (int)(sizeof special / sizeof special[0]);
  for (int64_t i = 0; i < n; i++) {
    float v;
    if (i % 7 == 3) v = special[(i / 7) % ns];
    else v = (float)(nt_test_normal(r) * pow(10.0, nt_test_uniform(r, -6, 5)));
    if (dt == NT_I32) ((int32_t *)buf)[i] = (int32_t)(nt_test_uniform(r, -3e9, 3e9) / 2);
    else if (dt == NT_I64) ((int64_t *)buf)[i] = (int64_t)nt_test_uniform(r, -1e18, 1e18);
    else if (dt == NT_U8) ((uint8_t *)buf)[i] = (uint8_t)(i * 37);
    else nt_store_f32(buf, dt, i, v);
  }
}

static bool is_nan_of(nt_dtype dt, const uint8_t *p) {
  uint32_t v = 0;
  switch (dt) {
    case NT_F32: memcpy(&v, p, 4); return f32_nan(v);
    case NT_F16: case NT_BF16: memcpy(&v, p, 2); return dt == NT_F16 ? f16_nan(v) : bf16_nan(v);
    case NT_FP8_E4M3: return e4m3_nan(*p);
    case NT_FP8_E5M2: return e5m2_nan(*p);
    default: return false;
  }
}

/* nt_convert on the GPU equals nt_convert on the CPU, element by element. `shift` offsets both
 * views by that many elements so the kernel's scalar (unaligned) path runs too. */
static void check_pair(nt_ctx *g, nt_ctx *c, nt_dtype sd, nt_dtype dd, int64_t n, int64_t shift) {
  size_t ss = nt_dtype_size(sd), ds = nt_dtype_size(dd);
  int64_t tot = n + shift + 8;
  int64_t shp_src[1] = {tot}, shp_dst[1] = {tot}, shp_n[1] = {n};
  uint8_t *hs = (uint8_t *)malloc(ss * tot), *hd = (uint8_t *)malloc(ds * tot),
          *hr = (uint8_t *)malloc(ds * tot);
  nt_tensor ds_t, dd_t;
  memset(&ds_t, 0, sizeof ds_t);
  memset(&dd_t, 0, sizeof dd_t);
  nt_test_rng r = {(uint64_t)(sd * 16 + dd + 1)};
  if (!hs || !hd || !hr) { CHECK(false, "host memory"); goto done; }
  make_source(sd, hs, tot, &r);
  memset(hd, 0xab, ds * tot);
  memcpy(hr, hd, ds * tot);
  if (!CHECK_OK(g, nt_tensor_alloc(g, &ds_t, sd, 1, shp_src))) goto done;
  if (!CHECK_OK(g, nt_tensor_alloc(g, &dd_t, dd, 1, shp_dst))) goto done;
  {
    nt_tensor hs_t = nt_tensor_view(hs, sd, nt_cpu(), 1, shp_src);
    nt_tensor hd_t = nt_tensor_view(hd, dd, nt_cpu(), 1, shp_dst);
    CHECK_OK(g, nt_tensor_copy(g, &ds_t, &hs_t));
    CHECK_OK(g, nt_tensor_copy(g, &dd_t, &hd_t));   /* sentinel bytes past the view */
    nt_tensor gs = nt_tensor_view((uint8_t *)ds_t.data + shift * ss, sd, ds_t.device, 1, shp_n);
    nt_tensor gd = nt_tensor_view((uint8_t *)dd_t.data + shift * ds, dd, dd_t.device, 1, shp_n);
    if (!CHECK_OK(g, nt_convert(g, &gd, &gs))) goto done;
    CHECK_OK(g, nt_tensor_copy(g, &hd_t, &dd_t));
    nt_tensor cs = nt_tensor_view(hs + shift * ss, sd, nt_cpu(), 1, shp_n);
    nt_tensor cd = nt_tensor_view(hr + shift * ds, dd, nt_cpu(), 1, shp_n);
    CHECK_OK(c, nt_convert(c, &cd, &cs));
    long bad = 0, nan_diff = 0;
    for (int64_t i = 0; i < tot; i++) {
      const uint8_t *a = hd + i * ds, *b = hr + i * ds;
      if (!memcmp(a, b, ds)) continue;
      if (is_nan_of(dd, a) && is_nan_of(dd, b)) { nan_diff++; continue; }
      if (bad++ < 3) {
        uint64_t va = 0, vb = 0;
        memcpy(&va, a, ds);
        memcpy(&vb, b, ds);
        fprintf(stderr, "  %s -> %s [%lld]: gpu 0x%llx cpu 0x%llx\n", nt_dtype_name(sd),
                nt_dtype_name(dd), (long long)(i - shift), (unsigned long long)va,
                (unsigned long long)vb);
      }
    }
    CHECK(bad == 0, "nt_convert %s -> %s (n %lld, shift %lld): %ld elements differ (tail "
          "sentinels included)", nt_dtype_name(sd), nt_dtype_name(dd), (long long)n,
          (long long)shift, bad);
    if (nan_diff)
      printf("NOTE nt_convert %s -> %s: %ld NaNs encoded differently\n", nt_dtype_name(sd),
             nt_dtype_name(dd), nan_diff);
  }
done:
  nt_tensor_free(g, &ds_t);
  nt_tensor_free(g, &dd_t);
  free(hs);
  free(hd);
  free(hr);
}

static void test_nt_convert(nt_ctx *g, nt_ctx *c) {
  const nt_dtype floats[5] = {NT_F32, NT_F16, NT_BF16, NT_FP8_E4M3, NT_FP8_E5M2};
  const nt_dtype ints[3] = {NT_I32, NT_I64, NT_U8};
  const int64_t sizes[3] = {3, 1031, 300007};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++)
      for (int k = 0; k < 3; k++) check_pair(g, c, floats[a], floats[b], sizes[k], k == 1 ? 1 : 0);
  for (int a = 0; a < 3; a++)
    for (int k = 0; k < 3; k++) {
      check_pair(g, c, ints[a], NT_F32, sizes[k], k == 1 ? 1 : 0);
      check_pair(g, c, NT_F32, ints[a], sizes[k], k == 1 ? 1 : 0);
    }
  /* The unsupported pair is refused on the GPU too. */
  nt_tensor x, y;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  int64_t shp[1] = {4};
  if (CHECK_OK(g, nt_tensor_alloc(g, &x, NT_I32, 1, shp)) &&
      CHECK_OK(g, nt_tensor_alloc(g, &y, NT_BF16, 1, shp)))
    CHECK_ERR(g, NT_ERR_DTYPE, nt_convert(g, &y, &x));
  nt_tensor_free(g, &x);
  nt_tensor_free(g, &y);
}

int main(void) {
  nt_ctx *g = nt_test_cuda_ctx();
  if (!g) return nt_test_skip("no GPU");
  nt_ctx *c = NULL;
  if (CHECK_OK(NULL, nt_ctx_create(&c, nt_cpu()))) {
    test_intrinsics(g);
    test_nt_convert(g, c);
  }
  nt_ctx_free(c);
  nt_ctx_free(g);
  return nt_test_finish();
}
