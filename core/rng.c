/* Philox4x32-10 on the CPU, laid out as cuRAND lays it out (curand_philox4x32_x.h,
 * curand_kernel.h): key = (seed low word, seed high word); curand_init(seed, subsequence,
 * offset) starts the 128-bit counter at subsequence * 2^64 + offset / 4 and returns words from
 * word offset % 4 of that block on. With subsequence 0, number i of a stream is therefore
 * word i % 4 of Philox(counter = i / 4) -- what the GPU kernels in rng.cu draw with cuRAND. */
#include "core/rng.h"
#include <math.h>
#include "core/ctx.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
/* cuRAND's constants (curand_globals.h): 2^-32 and 2^-32 * 2pi, as floats. */
#define RNG_2POW32_INV 2.3283064e-10f
#define RNG_2POW32_INV_2PI (2.3283064e-10f * 6.2831855f)

void nt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The four numbers index & ~3 .. (index & ~3) + 3 of the stream for `seed`. */
static void rng_block(uint64_t seed, uint64_t index, uint32_t out[4]) {
  uint64_t block = index >> 2;
  uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  nt_philox4x32_10(ctr, key, out);
}

uint32_t nt_rng_u32(uint64_t seed, uint64_t index) {
  uint32_t out[4];
  rng_block(seed, index, out);
  return out[index & 3];
}

float nt_rng_u32_to_uniform(uint32_t x) {
  /* nvcc contracts cuRAND's `x * INV + INV / 2` into one fused multiply-add. */
  return fmaf((float)x, RNG_2POW32_INV, RNG_2POW32_INV / 2.0f);
}

/* cuRAND's _curand_box_muller (host branch: sinf/cosf where the device uses __sincosf). */
static void box_muller(uint32_t x, uint32_t y, float *z0, float *z1) {
  float u = fmaf((float)x, RNG_2POW32_INV, RNG_2POW32_INV / 2.0f);
  float v = fmaf((float)y, RNG_2POW32_INV_2PI, RNG_2POW32_INV_2PI / 2.0f);
  float s = sqrtf(-2.0f * logf(u));
  *z0 = sinf(v) * s;
  *z1 = cosf(v) * s;
}

static nt_status check_out(nt_ctx *ctx, const nt_tensor *out, const char *what) {
  nt_status st;
  if ((st = nt_check_dtype(ctx, out, NT_F32, what))) return st;
  if ((st = nt_check_contiguous(ctx, out, what))) return st;
  return nt_check_device(ctx, out, what);
}

#ifdef NT_HAVE_CUDA
nt_status nt_rng_uniform_cuda(nt_ctx *ctx, float *out, int64_t n, uint64_t seed,
                              uint64_t offset);
nt_status nt_rng_normal_cuda(nt_ctx *ctx, float *out, int64_t n, uint64_t seed,
                             uint64_t offset, float mean, float std);
#endif

/* Sequential reads of a stream, one Philox block computed per four numbers. */
typedef struct {
  uint64_t seed, block;   /* block held in `words`; UINT64_MAX before the first */
  uint32_t words[4];
} stream_reader;

static uint32_t read_u32(stream_reader *r, uint64_t index) {
  if (r->block != index >> 2) {
    rng_block(r->seed, index, r->words);
    r->block = index >> 2;
  }
  return r->words[index & 3];
}

static void rng_uniform_cpu(float *out, int64_t n, uint64_t seed, uint64_t offset) {
  stream_reader r = {seed, UINT64_MAX, {0, 0, 0, 0}};
  for (int64_t i = 0; i < n; i++)
    out[i] = nt_rng_u32_to_uniform(read_u32(&r, offset + (uint64_t)i));
}

/* Pair k uses numbers offset + 2k and offset + 2k + 1 and gives elements 2k (sine) and 2k + 1
 * (cosine), like curand_normal4 on four consecutive numbers. */
static void rng_normal_cpu(float *out, int64_t n, uint64_t seed, uint64_t offset, float mean,
                           float std) {
  stream_reader r = {seed, UINT64_MAX, {0, 0, 0, 0}};
  for (int64_t i = 0; i < n; i += 2) {
    uint64_t idx = offset + (uint64_t)i;
    float z0, z1;
    uint32_t x = read_u32(&r, idx);
    box_muller(x, read_u32(&r, idx + 1), &z0, &z1);
    out[i] = fmaf(z0, std, mean);
    if (i + 1 < n) out[i + 1] = fmaf(z1, std, mean);
  }
}

nt_status nt_rng_uniform(nt_ctx *ctx, nt_tensor *out, uint64_t seed, uint64_t offset) {
  nt_status st = check_out(ctx, out, "rng_uniform out");
  if (st) return st;
  int64_t n = nt_tensor_numel(out);
  if (n == 0) return NT_OK;
  if (!nt_ctx_is_cuda(ctx)) {
    rng_uniform_cpu((float *)out->data, n, seed, offset);
    return NT_OK;
  }
#ifdef NT_HAVE_CUDA
  return nt_rng_uniform_cuda(ctx, (float *)out->data, n, seed, offset);
#else
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "rng_uniform on a CUDA tensor: CUDA is not compiled in");
#endif
}

nt_status nt_rng_normal(nt_ctx *ctx, nt_tensor *out, uint64_t seed, uint64_t offset,
                        float mean, float std) {
  nt_status st = check_out(ctx, out, "rng_normal out");
  if (st) return st;
  if (!isfinite(mean) || !isfinite(std))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "rng_normal: mean %g and std %g must be finite",
                    (double)mean, (double)std);
  int64_t n = nt_tensor_numel(out);
  if (n == 0) return NT_OK;
  if (!nt_ctx_is_cuda(ctx)) {
    rng_normal_cpu((float *)out->data, n, seed, offset, mean, std);
    return NT_OK;
  }
#ifdef NT_HAVE_CUDA
  return nt_rng_normal_cuda(ctx, (float *)out->data, n, seed, offset, mean, std);
#else
  return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "rng_normal on a CUDA tensor: CUDA is not compiled in");
#endif
}
