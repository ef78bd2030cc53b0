/* CPU image transforms for the loader's workers: random crop with zero padding, random
 * horizontal flip (as torchvision's RandomCrop(padding) + RandomHorizontalFlip) and
 * normalization into F32. Randomness is drawn per sample from nt_sample_seed(seed, epoch,
 * index), so the result does not depend on which worker loads the sample or how many
 * workers there are. */
#ifndef NT_DATA_TRANSFORM_H
#define NT_DATA_TRANSFORM_H
#include <stdbool.h>
#include <stdint.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

typedef struct {
  int pad;        /* random crop: pad `pad` zero pixels on each side, crop back to h x w; 0 off */
  bool hflip;     /* mirror left-right with probability 1/2 */
  float mean;     /* output (x / 255 - mean) / std */
  float std;
} nt_image_transform;

/* No crop, no flip, mean 0, std 1 (x / 255). */
nt_image_transform nt_image_transform_none(void);

/* A sample's generator state: splitmix64 mixing of the three values, so (epoch, index) pairs
 * never share a stream the way seed + epoch + index would. */
uint64_t nt_sample_seed(uint64_t seed, uint64_t epoch, int64_t index);

/* src: h x w bytes; dst: h x w floats. Draws from *rng (crop offsets first, then the flip). */
void nt_image_transform_apply(const nt_image_transform *t, const uint8_t *src, int64_t h,
                              int64_t w, uint64_t *rng, float *dst);

NT_EXTERN_C_END
#endif
