#include "data/transform.h"
#include "data/sampler.h"

nt_image_transform nt_image_transform_none(void) {
  nt_image_transform t = {0, false, 0.0f, 1.0f};
  return t;
}

uint64_t nt_sample_seed(uint64_t seed, uint64_t epoch, int64_t index) {
  uint64_t s = seed;
  uint64_t a = nt_splitmix64(&s) ^ epoch;
  uint64_t b = nt_splitmix64(&a) ^ (uint64_t)index;
  return nt_splitmix64(&b);
}

void nt_image_transform_apply(const nt_image_transform *t, const uint8_t *src, int64_t h,
                              int64_t w, uint64_t *rng, float *dst) {
  int64_t dy = 0, dx = 0;  /* crop origin relative to the unpadded image */
  if (t->pad > 0) {
    dy = (int64_t)nt_splitmix64_below(rng, (uint64_t)(2 * t->pad + 1)) - t->pad;
    dx = (int64_t)nt_splitmix64_below(rng, (uint64_t)(2 * t->pad + 1)) - t->pad;
  }
  bool flip = t->hflip && (nt_splitmix64(rng) >> 63);
  float scale = 1.0f / (255.0f * t->std), shift = -t->mean / t->std;
  for (int64_t y = 0; y < h; y++) {
    int64_t sy = y + dy;
    for (int64_t x = 0; x < w; x++) {
      int64_t sx = (flip ? w - 1 - x : x) + dx;
      /* Padding is a zero pixel, normalized like any other (as torchvision pads first). */
      float v = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? (float)src[sy * w + sx] : 0.0f;
      dst[y * w + x] = v * scale + shift;
    }
  }
}
