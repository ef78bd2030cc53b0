/* nt_state_field tables (models/state.h): every type round-trips bit-exactly through the JSON
 * writer and reader, reading is all-or-nothing with errors naming the object, field and value
 * (missing, wrong type, out of range, wrap-around), and the scaler's table covers every field
 * of nt_scaler_state, growth tracker included. */
#include "tests/testutil.h"
#include "models/state.h"
#include <float.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t a;
  int64_t b;
  uint64_t c;
  float d;
  double e;
  bool f;
} demo;

static const nt_state_field demo_fields[] = {
    NT_STATE_FIELD(demo, a, NT_STATE_I32, -5, 1000),
    NT_STATE_FIELD(demo, b, NT_STATE_I64, -NT_STATE_ANY, NT_STATE_ANY),
    NT_STATE_FIELD(demo, c, NT_STATE_U64, 0, NT_STATE_ANY),
    NT_STATE_FIELD(demo, d, NT_STATE_F32, -NT_STATE_ANY, NT_STATE_ANY),
    NT_STATE_FIELD(demo, e, NT_STATE_F64, 0, 1),
    NT_STATE_FIELD(demo, f, NT_STATE_BOOL, 0, 0),
};
enum { N = sizeof demo_fields / sizeof demo_fields[0] };

static char *write_demo(const demo *x) {
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_state_write(&w, demo_fields, N, x);
  nt_jw_end(&w, '}');
  return nt_jw_finish(&w);
}

/* Parses text and reads it into *x; returns the status. */
static nt_status read_text(nt_ctx *ctx, const char *text, demo *x) {
  nt_json j;
  nt_status st = nt_json_parse(ctx, text, strlen(text), "t", &j);
  if (st) return st;
  st = nt_state_read(ctx, &j, demo_fields, N, x, sizeof *x, "demo");
  nt_json_free(&j);
  return st;
}

/* A resumed run: the checkpoint's configuration wins, given flags must agree with it except the
 * overridable ones. */
typedef struct {
  int32_t n_layer;
  double lr;
  int64_t max_iters;
  int64_t batch_size;
} run_cfg;

static const nt_state_field cfg_fields[] = {
    NT_STATE_FIELD(run_cfg, n_layer, NT_STATE_I32, 1, 1024),
    NT_STATE_FIELD(run_cfg, lr, NT_STATE_F64, 0, 10),
    NT_STATE_FIELD(run_cfg, max_iters, NT_STATE_I64, 0, NT_STATE_ANY),
    NT_STATE_FIELD(run_cfg, batch_size, NT_STATE_I64, 1, 1 << 20),
};

static void test_merge(nt_ctx *ctx) {
  const char *saved = "{\"n_layer\":6,\"lr\":0.003,\"max_iters\":300,\"batch_size\":16}";
  nt_json j;
  if (!CHECK_OK(ctx, nt_json_parse(ctx, saved, strlen(saved), "t", &j))) return;
  static const char *const overridable[] = {"max-iters"};
  /* nothing given: the defaults give way to the checkpoint */
  run_cfg c = {4, 1e-3, 5000, 64};
  CHECK_OK(ctx, nt_state_merge(ctx, &j, cfg_fields, 4, &c, sizeof c, NULL, 0, overridable, 1,
                               "resume"));
  CHECK(c.n_layer == 6 && c.lr == 0.003 && c.max_iters == 300 && c.batch_size == 16,
        "restored: %d %g %lld %lld", c.n_layer, c.lr, (long long)c.max_iters,
        (long long)c.batch_size);
  /* --max-iters given: kept; --n-layer 6 given and equal: fine */
  run_cfg d = {6, 1e-3, 600, 64};
  static const char *const given1[] = {"max-iters", "n-layer"};
  CHECK_OK(ctx, nt_state_merge(ctx, &j, cfg_fields, 4, &d, sizeof d, given1, 2, overridable, 1,
                               "resume"));
  CHECK(d.max_iters == 600 && d.n_layer == 6 && d.lr == 0.003 && d.batch_size == 16,
        "override kept, the rest restored");
  /* conflicting --lr and --batch-size: an error naming both, nothing changed */
  run_cfg e = {4, 1e-3, 5000, 64}, e0 = e;
  static const char *const given2[] = {"lr", "batch-size", "max-iters"};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_state_merge(ctx, &j, cfg_fields, 4, &e, sizeof e, given2,
                                                    3, overridable, 1, "--resume run"));
  const char *m = nt_last_error(ctx);
  CHECK(strstr(m, "--lr 0.001 (the checkpoint has 0.003)") &&
            strstr(m, "--batch-size 64 (the checkpoint has 16)") && !strstr(m, "max-iters"),
        "names each conflict: %s", m);
  CHECK(!memcmp(&e, &e0, sizeof e), "unchanged on conflict");
  nt_json_free(&j);
}

static void test_vocab(nt_ctx *ctx) {
  nt_text t = {(uint8_t *)"hello world", 11}, u = {(uint8_t *)"hello there", 11};
  nt_vocab v, w, back;
  nt_vocab_build(&t, &v);
  nt_vocab_build(&u, &w);
  nt_jw jw = {0};
  nt_vocab_write_json(&jw, &v);
  char *text = nt_jw_finish(&jw);
  nt_json j;
  if (!CHECK_OK(ctx, nt_json_parse(ctx, text, strlen(text), "vocab", &j))) return;
  CHECK_OK(ctx, nt_vocab_read_json(ctx, &j, &back));
  CHECK(back.size == v.size && !memcmp(back.chars, v.chars, (size_t)v.size) &&
            !memcmp(back.ids, v.ids, sizeof v.ids), "vocabulary round trip: %s", text);
  CHECK_OK(ctx, nt_vocab_check_json(ctx, &j, &v));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_vocab_check_json(ctx, &j, &w));
  CHECK(strstr(nt_last_error(ctx), "trained on another text") != NULL, "%s", nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_vocab_check_json(ctx, NULL, &v));
  nt_json bad;
  if (CHECK_OK(ctx, nt_json_parse(ctx, "[65,66,65]", 10, "bad", &bad))) {
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_vocab_read_json(ctx, &bad, &back));
    nt_json_free(&bad);
  }
  if (CHECK_OK(ctx, nt_json_parse(ctx, "[65,256]", 8, "bad", &bad))) {
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_vocab_read_json(ctx, &bad, &back));
    nt_json_free(&bad);
  }
  nt_json_free(&j);
  free(text);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  demo x = {-5, INT64_MIN, UINT64_MAX, 0.1f, 0.1 + 0.2, true}, y;
  memset(&y, 0, sizeof y);
  char *t = write_demo(&x);
  if (CHECK_OK(ctx, read_text(ctx, t, &y)))
    CHECK(y.a == x.a && y.b == x.b && y.c == x.c && y.d == x.d && y.e == x.e && y.f == x.f,
          "round trip exact: %s", t);
  free(t);
  x.d = FLT_MIN * 3;
  x.e = 1e-300;
  x.b = INT64_MAX;
  t = write_demo(&x);
  CHECK_OK(ctx, read_text(ctx, t, &y));
  CHECK(y.d == x.d && y.e == x.e && y.b == INT64_MAX, "extremes exact: %s", t);
  free(t);

  demo keep = y;
  static const struct { const char *text, *expect; } bad[] = {
      {"{\"a\":4294967298,\"b\":0,\"c\":0,\"d\":0,\"e\":0,\"f\":true}", "'a' = 4294967298"},
      {"{\"a\":-50,\"b\":0,\"c\":0,\"d\":0,\"e\":0,\"f\":true}", "'a' = -50"},
      {"{\"a\":1,\"b\":0,\"c\":-1,\"d\":0,\"e\":0,\"f\":true}", "'c' = -1"},
      {"{\"a\":1,\"b\":0,\"c\":0,\"d\":1e39,\"e\":0,\"f\":true}", "'d' = 1e39"},
      {"{\"a\":1,\"b\":0,\"c\":0,\"d\":0,\"e\":1.5,\"f\":true}", "'e' = 1.5"},
      {"{\"a\":1,\"b\":0,\"c\":0,\"d\":0,\"e\":null,\"f\":true}", "'e' is null"},
      {"{\"a\":1,\"b\":0,\"c\":0,\"d\":0,\"e\":0,\"f\":1}", "'f' is not a boolean"},
      {"{\"a\":1,\"b\":0,\"c\":0,\"d\":0,\"e\":0}", "'f' is missing"},
      {"{\"a\":1.5,\"b\":0,\"c\":0,\"d\":0,\"e\":0,\"f\":true}", "'a' = 1.5 is not an integer"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_ERR(ctx, NT_ERR_FORMAT, read_text(ctx, bad[i].text, &y));
    CHECK(strstr(nt_last_error(ctx), bad[i].expect) && strstr(nt_last_error(ctx), "demo: "),
          "case %zu names object and field: %s", i, nt_last_error(ctx));
    CHECK(!memcmp(&keep, &y, sizeof y), "case %zu: the object is unchanged", i);
  }
  nt_json arr;
  CHECK_OK(ctx, nt_json_parse(ctx, "[1]", 3, "t", &arr));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_state_read(ctx, &arr, demo_fields, N, &y, sizeof y, "demo"));
  nt_json_free(&arr);

  /* the scaler's table: all eleven fields, each at a distinct offset, round trip */
  CHECK(nt_scaler_state_n_fields == 11, "scaler fields %d", nt_scaler_state_n_fields);
  bool tracker = false;
  for (int i = 0; i < nt_scaler_state_n_fields; i++)
    tracker |= !strcmp(nt_scaler_state_fields[i].name, "growth_tracker");
  CHECK(tracker, "growth tracker saved");
  nt_scaler_state s = {2097152.0f, 2, 0.5f, 2000, 1234, 1, 16777216.0f, 2, 1, 98765, 3}, r;
  memset(&r, 0, sizeof r);
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_state_write(&w, nt_scaler_state_fields, nt_scaler_state_n_fields, &s);
  nt_jw_end(&w, '}');
  t = nt_jw_finish(&w);
  nt_json j;
  if (CHECK_OK(ctx, nt_json_parse(ctx, t, strlen(t), "scaler", &j))) {
    CHECK_OK(ctx, nt_state_read(ctx, &j, nt_scaler_state_fields, nt_scaler_state_n_fields, &r,
                                sizeof r, "scaler"));
    bool same = true;
    for (int i = 0; i < nt_scaler_state_n_fields; i++) {
      const nt_state_field *f = &nt_scaler_state_fields[i];
      size_t size = f->type == NT_STATE_I64 ? 8 : 4;
      same &= !memcmp((char *)&s + f->offset, (char *)&r + f->offset, size);
    }
    CHECK(same, "scaler state round trip: %s", t);
    nt_json_free(&j);
  }
  free(t);
  test_merge(ctx);
  test_vocab(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
