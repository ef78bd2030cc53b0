/* A small JSON reader (for safetensors headers and checkpoint sidecars) and an append-only
 * writer. Numbers keep their source text so 64-bit integers parse exactly. */
#ifndef NT_MODELS_JSON_H
#define NT_MODELS_JSON_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef enum { NT_JSON_NULL = 0, NT_JSON_BOOL, NT_JSON_NUM, NT_JSON_STR, NT_JSON_ARR, NT_JSON_OBJ }
    nt_json_type;

typedef struct nt_json {
  nt_json_type type;
  bool b;
  char *str;                /* STR: the decoded string; NUM: the number's text */
  struct nt_json *items;    /* ARR / OBJ members */
  char **keys;              /* OBJ keys */
  int n;
} nt_json;

/* Parses text[0..len). Errors are NT_ERR_FORMAT naming `what` and the byte offset. */
nt_status nt_json_parse(nt_ctx *ctx, const char *text, size_t len, const char *what,
                        nt_json *out);
void nt_json_free(nt_json *j);                 /* frees the members; NULL is a no-op */

const nt_json *nt_json_get(const nt_json *obj, const char *key);   /* NULL when absent */
double nt_json_num(const nt_json *j, double dflt);
int64_t nt_json_i64(const nt_json *j, int64_t dflt);
uint64_t nt_json_u64(const nt_json *j, uint64_t dflt);
const char *nt_json_str(const nt_json *j, const char *dflt);
/* Shortcuts for obj[key]. */
double nt_json_get_num(const nt_json *obj, const char *key, double dflt);
int64_t nt_json_get_i64(const nt_json *obj, const char *key, int64_t dflt);

/* Range-checked getters for untrusted input (checkpoints, manifests, file headers). `name`
 * names the field in the messages. An absent value (j NULL), a value of another type, an
 * integer written with a fraction or exponent, one that does not fit 64 bits, a non-finite
 * number or one outside [min, max] is NT_ERR_FORMAT naming the field and the value as written
 * (e.g. "field 'n_layer' = 4294967298 is out of range [1, 1024]"); nothing wraps around.
 * *out is written only on success. */
nt_status nt_json_int_in(nt_ctx *ctx, const nt_json *j, const char *name, int64_t min,
                         int64_t max, int64_t *out);
nt_status nt_json_uint_in(nt_ctx *ctx, const nt_json *j, const char *name, uint64_t min,
                          uint64_t max, uint64_t *out);
nt_status nt_json_num_in(nt_ctx *ctx, const nt_json *j, const char *name, double min,
                         double max, double *out);
/* The same for obj[key] (the key names the field). */
nt_status nt_json_get_int_in(nt_ctx *ctx, const nt_json *obj, const char *key, int64_t min,
                             int64_t max, int64_t *out);
nt_status nt_json_get_uint_in(nt_ctx *ctx, const nt_json *obj, const char *key, uint64_t min,
                              uint64_t max, uint64_t *out);
nt_status nt_json_get_num_in(nt_ctx *ctx, const nt_json *obj, const char *key, double min,
                             double max, double *out);
/* An int field into an int (range within INT_MIN..INT_MAX). */
nt_status nt_json_get_int32_in(nt_ctx *ctx, const nt_json *obj, const char *key, int min,
                               int max, int *out);

/* Writer: a growing string. Errors are sticky (oom) and reported by nt_jw_finish. */
typedef struct {
  char *buf;
  size_t len, cap;
  bool oom;
  bool need_comma;
} nt_jw;

void nt_jw_begin(nt_jw *w, char open);          /* '{' or '[' */
void nt_jw_end(nt_jw *w, char close);
void nt_jw_key(nt_jw *w, const char *key);      /* inside an object, before a value */
void nt_jw_str(nt_jw *w, const char *s);
void nt_jw_num(nt_jw *w, double v);             /* %.9g; non-finite as null */
void nt_jw_f64(nt_jw *w, double v);             /* %.17g (reads back exactly); non-finite null */
void nt_jw_i64(nt_jw *w, int64_t v);
void nt_jw_u64(nt_jw *w, uint64_t v);
void nt_jw_bool(nt_jw *w, bool v);
/* Appends formatted text with no separator logic (for padding etc.). */
void nt_jw_printf(nt_jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Returns the NUL-terminated text (caller frees) or NULL on OOM. */
char *nt_jw_finish(nt_jw *w);

NT_EXTERN_C_END
#endif
