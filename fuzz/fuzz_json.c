/* JSON reader (models/json.c) and its range-checked getters: any bytes parse to a value or a
 * clean error; a parsed value written back with the writer parses again. Also the checkpoint
 * state-table reader (models/state.c) on the parsed object. */
#include "models/json.h"
#include "models/state.h"
#include "fuzz/fuzz_util.h"
#include <string.h>

static void rewrite(nt_jw *w, const nt_json *j) {
  switch (j->type) {
  case NT_JSON_NULL: nt_jw_num(w, NAN); break;      /* written as null */
  case NT_JSON_BOOL: nt_jw_bool(w, j->b); break;
  case NT_JSON_NUM: nt_jw_num(w, nt_json_num(j, 0)); break;
  case NT_JSON_STR: nt_jw_str(w, j->str); break;
  case NT_JSON_ARR:
  case NT_JSON_OBJ:
    nt_jw_begin(w, j->type == NT_JSON_ARR ? '[' : '{');
    for (int i = 0; i < j->n; i++) {
      if (j->type == NT_JSON_OBJ) nt_jw_key(w, j->keys[i]);
      rewrite(w, &j->items[i]);
    }
    nt_jw_end(w, j->type == NT_JSON_ARR ? ']' : '}');
    break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nt_ctx *ctx = fuzz_ctx();
  nt_json j;
  if (nt_json_parse(ctx, (const char *)data, size, "fuzz", &j)) return 0;
  int64_t i64;
  uint64_t u64;
  double d;
  for (int i = 0; j.type == NT_JSON_OBJ && i < j.n; i++) {
    nt_json_get_int_in(ctx, &j, j.keys[i], -1000, 1000, &i64);
    nt_json_get_uint_in(ctx, &j, j.keys[i], 0, UINT64_MAX, &u64);
    nt_json_get_num_in(ctx, &j, j.keys[i], -1, 1, &d);
    nt_json_u64(&j.items[i], 0);
    nt_json_i64(&j.items[i], 0);
  }
  nt_scaler_state s;
  memset(&s, 0, sizeof s);
  nt_state_read(ctx, &j, nt_scaler_state_fields, nt_scaler_state_n_fields, &s, sizeof s, "s");
  nt_jw w = {0};
  rewrite(&w, &j);
  char *text = nt_jw_finish(&w);
  nt_json again;
  if (text && nt_json_parse(ctx, text, strlen(text), "rewritten", &again)) abort();
  if (text) nt_json_free(&again);
  free(text);
  nt_json_free(&j);
  return 0;
}
