#include "models/state.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nt_state_write(nt_jw *w, const nt_state_field *fields, int n, const void *obj) {
  const char *base = obj;
  for (int i = 0; i < n; i++) {
    const nt_state_field *f = &fields[i];
    const char *p = base + f->offset;
    nt_jw_key(w, f->name);
    switch (f->type) {
    case NT_STATE_I32: { int32_t v; memcpy(&v, p, sizeof v); nt_jw_i64(w, v); break; }
    case NT_STATE_I64: { int64_t v; memcpy(&v, p, sizeof v); nt_jw_i64(w, v); break; }
    case NT_STATE_U64: { uint64_t v; memcpy(&v, p, sizeof v); nt_jw_u64(w, v); break; }
    case NT_STATE_F32: { float v; memcpy(&v, p, sizeof v); nt_jw_num(w, v); break; }
    case NT_STATE_F64: { double v; memcpy(&v, p, sizeof v); nt_jw_f64(w, v); break; }
    case NT_STATE_BOOL: { bool v; memcpy(&v, p, sizeof v); nt_jw_bool(w, v); break; }
    }
  }
}

/* A double bound as an int64 bound: the type's limit for NT_STATE_ANY (or beyond it). */
static int64_t lo_i64(double v, int64_t type_min) {
  return v <= (double)type_min ? type_min : (int64_t)ceil(v);
}
static int64_t hi_i64(double v, int64_t type_max) {
  return v >= (double)type_max ? type_max : (int64_t)floor(v);
}

static nt_status read_field(nt_ctx *ctx, const nt_json *src, const nt_state_field *f, char *p) {
  const nt_json *j = nt_json_get(src, f->name);
  nt_status st = NT_OK;
  switch (f->type) {
  case NT_STATE_I32:
  case NT_STATE_I64: {
    int64_t tmin = f->type == NT_STATE_I32 ? INT32_MIN : INT64_MIN;
    int64_t tmax = f->type == NT_STATE_I32 ? INT32_MAX : INT64_MAX;
    int64_t v;
    st = nt_json_int_in(ctx, j, f->name, lo_i64(f->min, tmin), hi_i64(f->max, tmax), &v);
    if (st) break;
    if (f->type == NT_STATE_I32) {
      int32_t v32 = (int32_t)v;
      memcpy(p, &v32, sizeof v32);
    } else {
      memcpy(p, &v, sizeof v);
    }
    break;
  }
  case NT_STATE_U64: {
    uint64_t lo = f->min <= 0 ? 0 : (uint64_t)ceil(f->min);
    uint64_t hi = f->max >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)floor(f->max);
    uint64_t v;
    st = nt_json_uint_in(ctx, j, f->name, lo, hi, &v);
    if (!st) memcpy(p, &v, sizeof v);
    break;
  }
  case NT_STATE_F32:
  case NT_STATE_F64: {
    /* the type's largest finite value for NT_STATE_ANY */
    double big = f->type == NT_STATE_F32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
    double lo = isinf(f->min) ? -big : f->min, hi = isinf(f->max) ? big : f->max;
    double v;
    st = nt_json_num_in(ctx, j, f->name, lo, hi, &v);
    if (st) break;
    if (f->type == NT_STATE_F32) {
      float v32 = (float)v;
      memcpy(p, &v32, sizeof v32);
    } else {
      memcpy(p, &v, sizeof v);
    }
    break;
  }
  case NT_STATE_BOOL:
    if (!j || j->type != NT_JSON_BOOL)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' is %s, expected true or false", f->name,
                      j ? "not a boolean" : "missing");
    memcpy(p, &j->b, sizeof j->b);
    break;
  }
  return st;
}

nt_status nt_state_read(nt_ctx *ctx, const nt_json *src, const nt_state_field *fields, int n,
                        void *obj, size_t obj_size, const char *what) {
  if (!src || src->type != NT_JSON_OBJ)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "%s: missing, or not a JSON object", what);
  char *copy = malloc(obj_size ? obj_size : 1);
  if (!copy) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory reading %s", what);
  memcpy(copy, obj, obj_size);
  nt_status st = NT_OK;
  for (int i = 0; i < n && !st; i++) {
    if (fields[i].offset >= obj_size) {
      st = NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: field '%s' lies outside the object", what,
                    fields[i].name);
      break;
    }
    st = read_field(ctx, src, &fields[i], copy + fields[i].offset);
    if (st) st = NT_ERROR(ctx, st, "%s: %s", what, nt_last_error(ctx));
  }
  if (!st) memcpy(obj, copy, obj_size);
  free(copy);
  return st;
}

static size_t field_size(nt_state_type t) {
  return t == NT_STATE_I32 || t == NT_STATE_F32 ? 4 : t == NT_STATE_BOOL ? sizeof(bool) : 8;
}

/* The field's value as text (for messages). */
static void field_text(const nt_state_field *f, const char *obj, char *buf, size_t len) {
  const char *p = obj + f->offset;
  switch (f->type) {
  case NT_STATE_I32: { int32_t v; memcpy(&v, p, 4); snprintf(buf, len, "%d", (int)v); break; }
  case NT_STATE_I64: { int64_t v; memcpy(&v, p, 8); snprintf(buf, len, "%lld", (long long)v); break; }
  case NT_STATE_U64: {
    uint64_t v;
    memcpy(&v, p, 8);
    snprintf(buf, len, "%llu", (unsigned long long)v);
    break;
  }
  case NT_STATE_F32: {
    float v;
    memcpy(&v, p, 4);
    snprintf(buf, len, "%.7g", v);            /* the shortest of 7 / 9 digits that reads back */
    if (strtof(buf, NULL) != v) snprintf(buf, len, "%.9g", v);
    break;
  }
  case NT_STATE_F64: {
    double v;
    memcpy(&v, p, 8);
    snprintf(buf, len, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, len, "%.17g", v);
    break;
  }
  case NT_STATE_BOOL: { bool v; memcpy(&v, p, sizeof v); snprintf(buf, len, v ? "true" : "false"); break; }
  }
}

/* Whether option `opt` (dashes) names field `name` (underscores). */
static bool option_is(const char *opt, const char *name) {
  for (; *opt && *name; opt++, name++)
    if (*opt != *name && !(*opt == '-' && *name == '_')) return false;
  return !*opt && !*name;
}

static bool listed(const char *name, const char *const *opts, int n) {
  for (int i = 0; i < n; i++)
    if (option_is(opts[i], name)) return true;
  return false;
}

nt_status nt_state_merge(nt_ctx *ctx, const nt_json *saved, const nt_state_field *fields, int n,
                         void *obj, size_t obj_size, const char *const *given, int n_given,
                         const char *const *overridable, int n_overridable, const char *what) {
  char *from_ckpt = malloc(obj_size ? obj_size : 1);
  if (!from_ckpt) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory reading %s", what);
  memcpy(from_ckpt, obj, obj_size);
  nt_status st = nt_state_read(ctx, saved, fields, n, from_ckpt, obj_size, what);
  char msg[1024] = "";
  size_t used = 0;
  int conflicts = 0;
  for (int i = 0; !st && i < n; i++) {
    const nt_state_field *f = &fields[i];
    if (!listed(f->name, given, n_given)) continue;
    size_t sz = field_size(f->type);
    if (listed(f->name, overridable, n_overridable)) {
      memcpy(from_ckpt + f->offset, (const char *)obj + f->offset, sz);   /* the flag wins */
      continue;
    }
    if (!memcmp(from_ckpt + f->offset, (const char *)obj + f->offset, sz)) continue;
    char mine[48], theirs[48], opt[64];
    field_text(f, obj, mine, sizeof mine);
    field_text(f, from_ckpt, theirs, sizeof theirs);
    snprintf(opt, sizeof opt, "%s", f->name);
    for (char *c = opt; *c; c++)
      if (*c == '_') *c = '-';
    int w = snprintf(msg + used, sizeof msg - used, "%s--%s %s (the checkpoint has %s)",
                     conflicts ? ", " : "", opt, mine, theirs);
    if (w > 0 && (size_t)w < sizeof msg - used) used += (size_t)w;
    conflicts++;
  }
  if (!st && conflicts)
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                  "%s: %s conflict%s with the checkpoint; drop %s to continue the run as saved",
                  what, msg, conflicts > 1 ? "" : "s", conflicts > 1 ? "them" : "it");
  if (!st) memcpy(obj, from_ckpt, obj_size);
  free(from_ckpt);
  return st;
}

void nt_vocab_write_json(nt_jw *w, const nt_vocab *v) {
  nt_jw_begin(w, '[');
  for (int i = 0; i < v->size; i++) nt_jw_i64(w, v->chars[i]);
  nt_jw_end(w, ']');
}

nt_status nt_vocab_read_json(nt_ctx *ctx, const nt_json *saved, nt_vocab *out) {
  if (!saved || saved->type != NT_JSON_ARR)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "the checkpoint has no vocabulary (saved before "
                    "vocabularies were recorded)");
  if (saved->n < 1 || saved->n > 256)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "vocabulary of %d entries: expected 1..256", saved->n);
  nt_vocab v;
  memset(&v, 0, sizeof v);
  for (int c = 0; c < 256; c++) v.ids[c] = -1;
  for (int i = 0; i < saved->n; i++) {
    int64_t b;
    nt_status st = nt_json_int_in(ctx, &saved->items[i], "vocabulary byte", 0, 255, &b);
    if (st) return st;
    if (v.ids[b] >= 0)
      return NT_ERROR(ctx, NT_ERR_FORMAT, "vocabulary lists byte %lld twice", (long long)b);
    v.ids[b] = (int16_t)i;
    v.chars[i] = (uint8_t)b;
  }
  v.size = saved->n;
  *out = v;
  return NT_OK;
}

nt_status nt_vocab_check_json(nt_ctx *ctx, const nt_json *saved, const nt_vocab *v) {
  nt_vocab ck;
  nt_status st = nt_vocab_read_json(ctx, saved, &ck);
  if (st) return st;
  int first = -1;
  for (int i = 0; i < ck.size && i < v->size && first < 0; i++)
    if (ck.chars[i] != v->chars[i]) first = i;
  if (first < 0 && ck.size == v->size) return NT_OK;
  if (first < 0) first = ck.size < v->size ? ck.size : v->size;
  return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                  "the checkpoint was trained on another text: its vocabulary has %d characters, "
                  "this corpus's %d, first different at id %d (byte %d against %d); resume on "
                  "the corpus it was trained on", ck.size, v->size, first,
                  first < ck.size ? ck.chars[first] : -1, first < v->size ? v->chars[first] : -1);
}

const nt_state_field nt_scaler_state_fields[] = {
    NT_STATE_FIELD(nt_scaler_state, scale, NT_STATE_F32, 0x1p-149, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, growth_factor, NT_STATE_F32, 1, 1e6),
    NT_STATE_FIELD(nt_scaler_state, backoff_factor, NT_STATE_F32, 0x1p-149, 1),
    NT_STATE_FIELD(nt_scaler_state, growth_interval, NT_STATE_I32, 1, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, growth_tracker, NT_STATE_I32, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, min_scale, NT_STATE_F32, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, max_scale, NT_STATE_F32, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, hysteresis, NT_STATE_I32, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, hysteresis_left, NT_STATE_I32, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, updates, NT_STATE_I64, 0, NT_STATE_ANY),
    NT_STATE_FIELD(nt_scaler_state, skipped_total, NT_STATE_I64, 0, NT_STATE_ANY),
};
const int nt_scaler_state_n_fields =
    (int)(sizeof nt_scaler_state_fields / sizeof nt_scaler_state_fields[0]);
