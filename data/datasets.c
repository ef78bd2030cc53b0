#include "data/datasets.h"
#include <string.h>

static nt_status image_get(void *user, const nt_sample_info *info, void *const *dst) {
  const nt_image_source *src = user;
  const nt_image_set *s = src->set;
  int64_t hw = s->h * s->w;
  const uint8_t *img = s->images.data + info->index * hw;
  if (src->raw) {
    memcpy(dst[0], img, (size_t)hw);
  } else {
    uint64_t rng = nt_sample_seed(info->seed, info->epoch, info->index);
    nt_image_transform_apply(&src->tf, img, s->h, s->w, &rng, dst[0]);
  }
  *(int32_t *)dst[1] = s->labels[info->index];
  return NT_OK;
}

nt_dataset nt_image_dataset(const nt_image_source *src) {
  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = src->set->n;
  ds.n_fields = 2;
  ds.fields[0].dtype = src->raw ? NT_U8 : NT_F32;
  ds.fields[0].ndim = 3;
  ds.fields[0].shape[0] = 1;
  ds.fields[0].shape[1] = src->set->h;
  ds.fields[0].shape[2] = src->set->w;
  ds.fields[1].dtype = NT_I32;
  ds.fields[1].ndim = 0;
  ds.get = image_get;
  ds.user = (void *)src;
  return ds;
}

static nt_status token_get(void *user, const nt_sample_info *info, void *const *dst) {
  const nt_token_source *src = user;
  int64_t start = info->index * src->block;
  int32_t *x = dst[0], *y = dst[1];
  for (int64_t t = 0; t < src->block; t++) {
    int64_t p = start + t;
    x[t] = src->tokens32 ? src->tokens32[p] : src->tokens16[p];
    y[t] = src->tokens32 ? src->tokens32[p + 1] : src->tokens16[p + 1];
  }
  return NT_OK;
}

nt_dataset nt_token_dataset(const nt_token_source *src) {
  nt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.len = src->block > 0 && src->n > src->block ? (src->n - 1) / src->block : 0;
  ds.n_fields = 2;
  for (int f = 0; f < 2; f++) {
    ds.fields[f].dtype = NT_I32;
    ds.fields[f].ndim = 1;
    ds.fields[f].shape[0] = src->block;
  }
  ds.get = token_get;
  ds.user = (void *)src;
  return ds;
}
