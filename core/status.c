#include "core/status.h"
#include "core/dtype.h"
#include <string.h>

const char *nt_status_str(nt_status st) {
  static const char *names[NT_STATUS_COUNT] = {
      "ok", "invalid argument", "shape error", "dtype error", "device mismatch",
      "out of memory", "no device", "CUDA error", "cuBLAS error", "communication error",
      "I/O error", "format error", "unsupported", "state error", "internal error"};
  if ((int)st < 0 || st >= NT_STATUS_COUNT) return "unknown status";
  return names[st];
}

static const struct { const char *name; size_t size; } dtype_info[NT_DTYPE_COUNT] = {
    {"f32", 4}, {"f16", 2}, {"bf16", 2}, {"e4m3", 1}, {"e5m2", 1},
    {"i32", 4}, {"i64", 8}, {"u8", 1}};

size_t nt_dtype_size(nt_dtype dt) {
  return ((int)dt >= 0 && dt < NT_DTYPE_COUNT) ? dtype_info[dt].size : 0;
}

const char *nt_dtype_name(nt_dtype dt) {
  return ((int)dt >= 0 && dt < NT_DTYPE_COUNT) ? dtype_info[dt].name : "?";
}

bool nt_dtype_is_float(nt_dtype dt) { return dt <= NT_FP8_E5M2; }

bool nt_dtype_parse(const char *name, nt_dtype *out) {
  static const struct { const char *alias; nt_dtype dt; } aliases[] = {
      {"float32", NT_F32}, {"fp32", NT_F32}, {"float16", NT_F16}, {"fp16", NT_F16},
      {"half", NT_F16}, {"bfloat16", NT_BF16}, {"fp8_e4m3", NT_FP8_E4M3},
      {"fp8_e5m2", NT_FP8_E5M2}, {"int32", NT_I32}, {"int64", NT_I64}, {"uint8", NT_U8}};
  for (int i = 0; i < NT_DTYPE_COUNT; i++)
    if (strcmp(name, dtype_info[i].name) == 0) { *out = (nt_dtype)i; return true; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].dt; return true; }
  return false;
}
