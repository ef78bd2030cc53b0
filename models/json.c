#include "models/json.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  nt_ctx *ctx;
  const char *s;
  size_t i, n;
  const char *what;
  int depth;
} parser;

static nt_status fail(parser *p, const char *why) {
  return NT_ERROR(p->ctx, NT_ERR_FORMAT, "%s: JSON %s at byte %zu", p->what, why, p->i);
}

static void skip_ws(parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                         p->s[p->i] == '\r'))
    p->i++;
}

static nt_status parse_value(parser *p, nt_json *out);

/* Skips decimal digits; returns how many. */
static size_t digits_at(parser *p) {
  size_t start = p->i;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  return p->i - start;
}

static nt_status parse_string(parser *p, char **out) {
  p->i++;   /* opening quote */
  size_t start = p->i;
  char *buf = malloc(p->n - start + 1);
  if (!buf) return NT_ERROR(p->ctx, NT_ERR_OOM, "%s: out of memory parsing JSON", p->what);
  size_t k = 0;
  while (p->i < p->n && p->s[p->i] != '"') {
    char c = p->s[p->i++];
    if (c == '\\') {
      if (p->i >= p->n) break;
      char e = p->s[p->i++];
      switch (e) {
      case 'n': c = '\n'; break;
      case 't': c = '\t'; break;
      case 'r': c = '\r'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'u': {
        unsigned v = 0;
        for (int j = 0; j < 4; j++) {
          int h = p->i < p->n ? (unsigned char)p->s[p->i] : 0;
          if (!isxdigit(h)) {
            free(buf);
            return fail(p, "bad \\u escape");
          }
          p->i++;
          v = v * 16 + (unsigned)(isdigit(h) ? h - '0' : tolower(h) - 'a' + 10);
        }
        /* Only the Basic Latin range is needed here; others become '?'. */
        c = v < 0x80 ? (char)v : '?';
        break;
      }
      case '"': case '\\': case '/': c = e; break;
      default:
        free(buf);
        p->i--;
        return fail(p, "bad escape");
      }
    }
    buf[k++] = c;
  }
  if (p->i >= p->n) {
    free(buf);
    return fail(p, "unterminated string");
  }
  p->i++;
  buf[k] = 0;
  *out = buf;
  return NT_OK;
}

static nt_status push(parser *p, nt_json *j, char *key, nt_json *v) {
  nt_json *items = realloc(j->items, (size_t)(j->n + 1) * sizeof *items);
  if (!items) return NT_ERROR(p->ctx, NT_ERR_OOM, "%s: out of memory parsing JSON", p->what);
  j->items = items;
  if (j->type == NT_JSON_OBJ) {
    char **keys = realloc(j->keys, (size_t)(j->n + 1) * sizeof *keys);
    if (!keys) return NT_ERROR(p->ctx, NT_ERR_OOM, "%s: out of memory parsing JSON", p->what);
    j->keys = keys;
    j->keys[j->n] = key;
  }
  j->items[j->n++] = *v;
  return NT_OK;
}

static nt_status parse_container(parser *p, nt_json *out, bool obj) {
  out->type = obj ? NT_JSON_OBJ : NT_JSON_ARR;
  if (++p->depth > 64) return fail(p, "nesting too deep");
  p->i++;
  skip_ws(p);
  char close = obj ? '}' : ']';
  if (p->i < p->n && p->s[p->i] == close) {
    p->i++;
    p->depth--;
    return NT_OK;
  }
  for (;;) {
    char *key = NULL;
    nt_json v;
    memset(&v, 0, sizeof v);
    skip_ws(p);
    if (obj) {
      if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "expected a key");
      nt_status st = parse_string(p, &key);
      if (st) return st;
      skip_ws(p);
      if (p->i >= p->n || p->s[p->i] != ':') {
        free(key);
        return fail(p, "expected ':'");
      }
      p->i++;
    }
    nt_status st = parse_value(p, &v);
    if (!st) st = push(p, out, key, &v);
    if (st) {
      free(key);
      nt_json_free(&v);
      return st;
    }
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == close) {
      p->i++;
      p->depth--;
      return NT_OK;
    }
    return fail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static nt_status parse_value(parser *p, nt_json *out) {
  memset(out, 0, sizeof *out);
  skip_ws(p);
  if (p->i >= p->n) return fail(p, "unexpected end");
  char c = p->s[p->i];
  if (c == '{') return parse_container(p, out, true);
  if (c == '[') return parse_container(p, out, false);
  if (c == '"') {
    out->type = NT_JSON_STR;
    return parse_string(p, &out->str);
  }
  static const struct { const char *w; nt_json_type t; bool b; } words[] = {
      {"true", NT_JSON_BOOL, true}, {"false", NT_JSON_BOOL, false}, {"null", NT_JSON_NULL, false}};
  for (int k = 0; k < 3; k++) {
    size_t l = strlen(words[k].w);
    if (p->i + l <= p->n && !strncmp(p->s + p->i, words[k].w, l)) {
      p->i += l;
      out->type = words[k].t;
      out->b = words[k].b;
      return NT_OK;
    }
  }
  /* a number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
  size_t start = p->i;
  if (p->i < p->n && p->s[p->i] == '-') p->i++;
  size_t int_start = p->i;
  size_t digits = digits_at(p);
  if (digits == 0) return fail(p, "unexpected character");
  if (digits > 1 && p->s[int_start] == '0') return fail(p, "number with a leading zero");
  if (p->i < p->n && p->s[p->i] == '.') {
    p->i++;
    if (!digits_at(p)) return fail(p, "number without digits after '.'");
  }
  if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    p->i++;
    if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
    if (!digits_at(p)) return fail(p, "number without exponent digits");
  }
  out->type = NT_JSON_NUM;
  out->str = malloc(p->i - start + 1);
  if (!out->str) return NT_ERROR(p->ctx, NT_ERR_OOM, "%s: out of memory parsing JSON", p->what);
  memcpy(out->str, p->s + start, p->i - start);
  out->str[p->i - start] = 0;
  return NT_OK;
}

nt_status nt_json_parse(nt_ctx *ctx, const char *text, size_t len, const char *what,
                        nt_json *out) {
  parser p = {ctx, text, 0, len, what, 0};
  nt_status st = parse_value(&p, out);
  if (!st) {
    skip_ws(&p);
    if (p.i < p.n && text[p.i] != 0) st = fail(&p, "trailing characters");
  }
  if (st) nt_json_free(out);
  return st;
}

void nt_json_free(nt_json *j) {
  if (!j) return;
  for (int i = 0; i < j->n; i++) {
    nt_json_free(&j->items[i]);
    if (j->keys) free(j->keys[i]);
  }
  free(j->items);
  free(j->keys);
  free(j->str);
  memset(j, 0, sizeof *j);
}

const nt_json *nt_json_get(const nt_json *obj, const char *key) {
  if (!obj || obj->type != NT_JSON_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

double nt_json_num(const nt_json *j, double dflt) {
  if (!j) return dflt;
  if (j->type == NT_JSON_NUM) return strtod(j->str, NULL);
  if (j->type == NT_JSON_BOOL) return j->b;
  if (j->type == NT_JSON_NULL) return NAN;
  return dflt;
}

int64_t nt_json_i64(const nt_json *j, int64_t dflt) {
  if (!j || j->type != NT_JSON_NUM) return dflt;
  return strtoll(j->str, NULL, 10);
}

uint64_t nt_json_u64(const nt_json *j, uint64_t dflt) {
  if (!j || j->type != NT_JSON_NUM) return dflt;
  return strtoull(j->str, NULL, 10);
}

const char *nt_json_str(const nt_json *j, const char *dflt) {
  return j && j->type == NT_JSON_STR ? j->str : dflt;
}

double nt_json_get_num(const nt_json *obj, const char *key, double dflt) {
  return nt_json_num(nt_json_get(obj, key), dflt);
}

int64_t nt_json_get_i64(const nt_json *obj, const char *key, int64_t dflt) {
  return nt_json_i64(nt_json_get(obj, key), dflt);
}

/* ---- range-checked getters ---- */

static const char *type_name(nt_json_type t) {
  static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array",
                                      "an object"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* The number's text is a plain integer: an optional '-' (when signed) and 1..20 digits. */
static nt_status integer_text(nt_ctx *ctx, const nt_json *j, const char *name, bool sign) {
  if (!j) return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' is missing", name);
  if (j->type != NT_JSON_NUM)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' is %s, expected an integer", name,
                    type_name(j->type));
  const char *s = j->str;
  if (*s == '-' && sign) s++;
  size_t digits = strspn(s, "0123456789");
  if (digits == 0 || s[digits])
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' = %.40s is not %s integer", name, j->str,
                    sign ? "an" : "a non-negative");
  return NT_OK;
}

nt_status nt_json_int_in(nt_ctx *ctx, const nt_json *j, const char *name, int64_t min,
                         int64_t max, int64_t *out) {
  nt_status st = integer_text(ctx, j, name, true);
  if (st) return st;
  errno = 0;
  long long v = strtoll(j->str, NULL, 10);
  if (errno == ERANGE || v < min || v > max)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' = %.40s is out of range [%lld, %lld]", name,
                    j->str, (long long)min, (long long)max);
  *out = v;
  return NT_OK;
}

nt_status nt_json_uint_in(nt_ctx *ctx, const nt_json *j, const char *name, uint64_t min,
                          uint64_t max, uint64_t *out) {
  nt_status st = integer_text(ctx, j, name, false);
  if (st) return st;
  errno = 0;
  unsigned long long v = strtoull(j->str, NULL, 10);
  if (errno == ERANGE || v < min || v > max)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' = %.40s is out of range [%llu, %llu]", name,
                    j->str, (unsigned long long)min, (unsigned long long)max);
  *out = v;
  return NT_OK;
}

nt_status nt_json_num_in(nt_ctx *ctx, const nt_json *j, const char *name, double min,
                         double max, double *out) {
  if (!j) return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' is missing", name);
  if (j->type != NT_JSON_NUM)
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' is %s, expected a number", name,
                    type_name(j->type));
  char *end;
  errno = 0;
  double v = strtod(j->str, &end);
  if (end == j->str || *end || !isfinite(v))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' = %.40s is not a finite number", name, j->str);
  if (!(v >= min && v <= max))
    return NT_ERROR(ctx, NT_ERR_FORMAT, "field '%s' = %.40s is out of range [%g, %g]", name,
                    j->str, min, max);
  *out = v;
  return NT_OK;
}

nt_status nt_json_get_int_in(nt_ctx *ctx, const nt_json *obj, const char *key, int64_t min,
                             int64_t max, int64_t *out) {
  return nt_json_int_in(ctx, nt_json_get(obj, key), key, min, max, out);
}

nt_status nt_json_get_uint_in(nt_ctx *ctx, const nt_json *obj, const char *key, uint64_t min,
                              uint64_t max, uint64_t *out) {
  return nt_json_uint_in(ctx, nt_json_get(obj, key), key, min, max, out);
}

nt_status nt_json_get_num_in(nt_ctx *ctx, const nt_json *obj, const char *key, double min,
                             double max, double *out) {
  return nt_json_num_in(ctx, nt_json_get(obj, key), key, min, max, out);
}

nt_status nt_json_get_int32_in(nt_ctx *ctx, const nt_json *obj, const char *key, int min,
                               int max, int *out) {
  int64_t v;
  nt_status st = nt_json_int_in(ctx, nt_json_get(obj, key), key, min, max, &v);
  if (!st) *out = (int)v;
  return st;
}

/* ---- writer ---- */

static void append(nt_jw *w, const char *s, size_t l) {
  if (w->oom) return;
  if (w->len + l + 1 > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + l + 1) cap *= 2;
    char *b = realloc(w->buf, cap);
    if (!b) {
      w->oom = true;
      return;
    }
    w->buf = b;
    w->cap = cap;
  }
  memcpy(w->buf + w->len, s, l);
  w->len += l;
  w->buf[w->len] = 0;
}

void nt_jw_printf(nt_jw *w, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  append(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sep(nt_jw *w) {
  if (w->need_comma) append(w, ",", 1);
  w->need_comma = true;
}

void nt_jw_begin(nt_jw *w, char open) {
  sep(w);
  append(w, &open, 1);
  w->need_comma = false;
}

void nt_jw_end(nt_jw *w, char close) {
  append(w, &close, 1);
  w->need_comma = true;
}

void nt_jw_key(nt_jw *w, const char *key) {
  nt_jw_str(w, key);
  append(w, ":", 1);
  w->need_comma = false;
}

void nt_jw_str(nt_jw *w, const char *s) {
  sep(w);
  append(w, "\"", 1);
  for (const char *c = s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      char e[2] = {'\\', *c};
      append(w, e, 2);
    } else if ((unsigned char)*c < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", (unsigned)(unsigned char)*c);
      append(w, e, 6);
    } else {
      append(w, c, 1);
    }
  }
  append(w, "\"", 1);
}

void nt_jw_num(nt_jw *w, double v) {
  sep(w);
  if (!isfinite(v)) {
    append(w, "null", 4);
    return;
  }
  nt_jw_printf(w, "%.9g", v);
}

void nt_jw_f64(nt_jw *w, double v) {
  sep(w);
  if (!isfinite(v)) {
    append(w, "null", 4);
    return;
  }
  nt_jw_printf(w, "%.17g", v);
}

void nt_jw_i64(nt_jw *w, int64_t v) {
  sep(w);
  nt_jw_printf(w, "%lld", (long long)v);
}

void nt_jw_u64(nt_jw *w, uint64_t v) {
  sep(w);
  nt_jw_printf(w, "%llu", (unsigned long long)v);
}

void nt_jw_bool(nt_jw *w, bool v) {
  sep(w);
  append(w, v ? "true" : "false", v ? 4 : 5);
}

char *nt_jw_finish(nt_jw *w) {
  if (w->oom) {
    free(w->buf);
    w->buf = NULL;
    return NULL;
  }
  if (!w->buf) append(w, "", 0);
  char *b = w->buf;
  w->buf = NULL;
  w->len = w->cap = 0;
  return b;
}
