/* Ready-made loader datasets over the readers: labelled images (with optional transforms) and
 * next-token language-model windows. The source structs are the callbacks' user data and must
 * outlive the loader. */
#ifndef NT_DATA_DATASETS_H
#define NT_DATA_DATASETS_H
#include <stdbool.h>
#include <stdint.h>
#include "data/idx.h"
#include "data/loader.h"
#include "data/transform.h"
NT_EXTERN_C_BEGIN

typedef struct {
  const nt_image_set *set;
  bool raw;                 /* true: U8 [1, h, w] images as stored; false: F32 through tf */
  nt_image_transform tf;
} nt_image_source;

/* Fields: image [1, h, w] (F32, or U8 when raw), label I32 scalar. */
nt_dataset nt_image_dataset(const nt_image_source *src);

/* Language-model windows: sample i is x = tokens[i*block .. i*block + block), y = x shifted by
 * one; len = (n - 1) / block. tokens32 or tokens16 (exactly one non-NULL). */
typedef struct {
  const int32_t *tokens32;
  const uint16_t *tokens16;
  int64_t n;
  int64_t block;
} nt_token_source;

/* Fields: x I32 [block], y I32 [block]. len is 0 (an empty dataset the loader rejects) when
 * there are fewer than block + 1 tokens. */
nt_dataset nt_token_dataset(const nt_token_source *src);

NT_EXTERN_C_END
#endif
