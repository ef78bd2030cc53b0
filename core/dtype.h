#ifndef NT_DTYPE_H
#define NT_DTYPE_H
#include <stddef.h>
#include <stdbool.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_F32 = 0,
  NT_F16,
  NT_BF16,
  NT_FP8_E4M3,
  NT_FP8_E5M2,
  NT_I32,
  NT_I64,
  NT_U8,
  NT_DTYPE_COUNT
} nt_dtype;

size_t nt_dtype_size(nt_dtype dt);
const char *nt_dtype_name(nt_dtype dt);        /* "f32", "f16", "bf16", "e4m3", ... */
bool nt_dtype_is_float(nt_dtype dt);           /* F32, F16, BF16 and the FP8 formats */
/* Parses a name as printed by nt_dtype_name (also "float32", "float16", "bfloat16");
 * returns false for an unknown name. */
bool nt_dtype_parse(const char *name, nt_dtype *out);

NT_EXTERN_C_END
#endif
