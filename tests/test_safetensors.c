/* safetensors by name (models/safetensors.h): listing a file's tensors, loading with dtype
 * conversion, a row range with zero padding and a transpose, whole nt_params with missing and
 * extra tensors reported, and strict header checks (each corrupt header names its problem).
 * Every file is written by the test. */
#include "tests/testutil.h"
#include "models/module.h"
#include "models/safetensors.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void path_of(char *p, size_t len, const char *name) {
  snprintf(p, len, "%s/%s.safetensors", dir, name);
}

/* A file with the given header text followed by `data_len` bytes (i * 0.25f as floats where
 * they fit, so values are recognisable). */
static bool write_raw(nt_ctx *ctx, const char *path, const char *header, size_t data_len) {
  size_t hl = strlen(header);
  char *buf = calloc(1, 8 + hl + data_len);
  for (int i = 0; i < 8; i++) buf[i] = (char)((uint64_t)hl >> (8 * i));
  memcpy(buf + 8, header, hl);
  for (size_t i = 0; i + 4 <= data_len; i += 4) {
    float v = (float)(i / 4) * 0.25f;
    memcpy(buf + 8 + hl + i, &v, 4);
  }
  bool ok = CHECK_OK(ctx, nt_write_file_atomic(ctx, path, buf, 8 + hl + data_len));
  free(buf);
  return ok;
}

static void test_list_and_convert(nt_ctx *ctx) {
  char path[512];
  path_of(path, sizeof path, "list");
  float w[6] = {1.5f, -2, 3.25f, 1e-3f, 65504.0f * 2, -0.0f};
  uint16_t h[4];
  for (int i = 0; i < 4; i++) h[i] = nt_f32_to_f16((float)i / 3.0f);
  int32_t ids[2] = {7, -9};
  int64_t sw[2] = {2, 3}, sh[3] = {1, 2, 2}, si[1] = {2};
  nt_named_tensor ts[3] = {{"w", nt_tensor_view(w, NT_F32, nt_cpu(), 2, sw)},
                           {"h", nt_tensor_view(h, NT_F16, nt_cpu(), 3, sh)},
                           {"ids", nt_tensor_view(ids, NT_I32, nt_cpu(), 1, si)}};
  if (!CHECK_OK(ctx, nt_safetensors_save(ctx, path, ts, 3, NULL))) return;
  nt_safetensors *f;
  if (!CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) return;
  CHECK(nt_safetensors_count(f) == 3, "3 tensors, got %d", nt_safetensors_count(f));
  const nt_safetensors_info *a = nt_safetensors_info_at(f, 0), *b = nt_safetensors_find(f, "h");
  CHECK(a && !strcmp(a->name, "w") && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 &&
        a->dtype == NT_F32 && a->numel == 6 && a->nbytes == 24, "first entry w f32 [2, 3]");
  CHECK(b && !strcmp(b->dtype_name, "F16") && b->ndim == 3 && b->shape[2] == 2, "h f16 [1,2,2]");
  CHECK(!nt_safetensors_find(f, "x") && !nt_safetensors_info_at(f, 3), "absent entries");
  /* F16 file -> F32 destination, F32 -> BF16 and F16 (overflow to inf as the cast does) */
  float hf[4], wb_ref[6];
  int64_t s4[3] = {1, 2, 2};
  nt_tensor d = nt_tensor_view(hf, NT_F32, nt_cpu(), 3, s4);
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "h", &d, NULL));
  bool ok = true;
  for (int i = 0; i < 4; i++) ok = ok && hf[i] == nt_f16_to_f32(h[i]);
  CHECK(ok, "F16 -> F32 exact");
  uint16_t wb[6], wh[6];
  nt_tensor db = nt_tensor_view(wb, NT_BF16, nt_cpu(), 2, sw);
  nt_tensor dh = nt_tensor_view(wh, NT_F16, nt_cpu(), 2, sw);
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "w", &db, NULL));
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "w", &dh, NULL));
  ok = true;
  for (int i = 0; i < 6; i++) {
    wb_ref[i] = nt_bf16_to_f32(nt_f32_to_bf16(w[i]));
    ok = ok && nt_bf16_to_f32(wb[i]) == wb_ref[i] && wh[i] == nt_f32_to_f16(w[i]);
  }
  CHECK(ok, "F32 -> BF16 / F16 round to nearest even");
  CHECK(nt_f16_to_f32(wh[4]) > 1e30f, "F16 overflow is inf");
  /* integers load only as themselves */
  float fi[2];
  nt_tensor dfi = nt_tensor_view(fi, NT_F32, nt_cpu(), 1, si);
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_safetensors_load(ctx, f, "ids", &dfi, NULL));
  int32_t i2[2];
  nt_tensor di = nt_tensor_view(i2, NT_I32, nt_cpu(), 1, si);
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "ids", &di, NULL));
  CHECK(i2[0] == 7 && i2[1] == -9, "I32 as is");
  CHECK(nt_safetensors_loaded(f, 0) && nt_safetensors_loaded(f, 2), "loaded flags");
  CHECK_OK(ctx, nt_safetensors_check_all_loaded(ctx, f));
  nt_safetensors_close(f);

  /* stored as BF16 / F16 */
  path_of(path, sizeof path, "bf16");
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_safetensors_save_as(ctx, path, ts, 3, NULL, NT_I32));
  if (!CHECK_OK(ctx, nt_safetensors_save_as(ctx, path, ts, 3, NULL, NT_BF16))) return;
  if (!CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) return;
  CHECK(nt_safetensors_find(f, "w")->dtype == NT_BF16 && nt_safetensors_find(f, "h")->dtype ==
        NT_BF16 && nt_safetensors_find(f, "ids")->dtype == NT_I32, "floats stored as BF16");
  float wf[6];
  nt_tensor dw = nt_tensor_view(wf, NT_F32, nt_cpu(), 2, sw);
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "w", &dw, NULL));
  CHECK(!memcmp(wf, wb_ref, sizeof wf), "BF16 file -> F32 gives the rounded values");
  nt_safetensors_close(f);
}

static void test_rows_transpose(nt_ctx *ctx) {
  char path[512];
  path_of(path, sizeof path, "rows");
  float e[15], t[6];
  for (int i = 0; i < 15; i++) e[i] = (float)(i + 1);
  for (int i = 0; i < 6; i++) t[i] = (float)(10 * i);
  uint16_t tb[6];
  for (int i = 0; i < 6; i++) tb[i] = nt_f32_to_bf16(t[i] + 0.5f);
  int64_t se[2] = {5, 3}, st[2] = {2, 3}, s1[1] = {6};
  nt_named_tensor ts[4] = {{"emb", nt_tensor_view(e, NT_F32, nt_cpu(), 2, se)},
                           {"conv", nt_tensor_view(t, NT_F32, nt_cpu(), 2, st)},
                           {"convb", nt_tensor_view(tb, NT_BF16, nt_cpu(), 2, st)},
                           {"vec", nt_tensor_view(t, NT_F32, nt_cpu(), 1, s1)}};
  if (!CHECK_OK(ctx, nt_safetensors_save(ctx, path, ts, 4, NULL))) return;
  nt_safetensors *f;
  if (!CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) return;
  /* padded vocabulary: 5 file rows into 8, rows 5..7 zeroed (they start as garbage) */
  float p[24];
  for (int i = 0; i < 24; i++) p[i] = 99.0f;
  int64_t sp[2] = {8, 3};
  nt_tensor dp = nt_tensor_view(p, NT_F32, nt_cpu(), 2, sp);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load(ctx, f, "emb", &dp, NULL));
  nt_safetensors_load_opts pad = {.pad_rows = true};
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "emb", &dp, &pad));
  bool ok = true;
  for (int i = 0; i < 24; i++) ok = ok && p[i] == (i < 15 ? e[i] : 0.0f);
  CHECK(ok, "rows copied, padding rows zero");
  /* a row range: rows [1, 3) */
  float r[6];
  int64_t sr[2] = {2, 3};
  nt_tensor dr = nt_tensor_view(r, NT_F32, nt_cpu(), 2, sr);
  nt_safetensors_load_opts rr = {.row_begin = 1, .rows = 2};
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "emb", &dr, &rr));
  CHECK(r[0] == 4 && r[5] == 9, "rows 1..2 of emb: %g .. %g", r[0], r[5]);
  nt_safetensors_load_opts far = {.row_begin = 4, .rows = 2};
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load(ctx, f, "emb", &dr, &far));
  nt_safetensors_load_opts neg = {.row_begin = -1};
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load(ctx, f, "emb", &dr, &neg));
  /* transpose: file [2, 3] into [3, 2]; with BF16 -> F32; with padding to 4 rows */
  float q[8];
  int64_t sq[2] = {3, 2}, sq4[2] = {4, 2};
  nt_tensor dq = nt_tensor_view(q, NT_F32, nt_cpu(), 2, sq);
  nt_safetensors_load_opts tr = {.transpose = true};
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load(ctx, f, "conv", &dq, NULL));
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "conv", &dq, &tr));
  ok = true;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) ok = ok && q[i * 2 + j] == t[j * 3 + i];
  CHECK(ok, "transposed");
  for (int i = 0; i < 8; i++) q[i] = -1;
  nt_tensor dq4 = nt_tensor_view(q, NT_F32, nt_cpu(), 2, sq4);
  nt_safetensors_load_opts trp = {.transpose = true, .pad_rows = true};
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "convb", &dq4, &trp));
  ok = q[6] == 0 && q[7] == 0;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) ok = ok && q[i * 2 + j] == nt_bf16_to_f32(tb[j * 3 + i]);
  CHECK(ok, "BF16 transposed into F32, padded row zero");
  int64_t s6[1] = {6};
  nt_tensor dv = nt_tensor_view(q, NT_F32, nt_cpu(), 1, s6);
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load(ctx, f, "vec", &dv, &tr));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_load(ctx, f, "nope", &dv, NULL));
  nt_safetensors_close(f);
}

/* Data that starts at an odd offset (a header length that is not a multiple of 8): loads
 * must not assume alignment (UBSan checks this in the sanitized build). */
static void test_unaligned(nt_ctx *ctx) {
  char path[512];
  path_of(path, sizeof path, "odd");
  const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
  if (!write_raw(ctx, path, h, 12)) return;
  nt_safetensors *f;
  if (!CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) return;
  float x[3];
  uint16_t y[3];
  int64_t s[1] = {3};
  nt_tensor dx = nt_tensor_view(x, NT_F32, nt_cpu(), 1, s);
  nt_tensor dy = nt_tensor_view(y, NT_BF16, nt_cpu(), 1, s);
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "a", &dx, NULL));
  CHECK_OK(ctx, nt_safetensors_load(ctx, f, "a", &dy, NULL));
  CHECK(x[2] == 0.5f && nt_bf16_to_f32(y[1]) == 0.25f, "values %g %g", x[2], nt_bf16_to_f32(y[1]));
  nt_safetensors_close(f);
}

static void test_corrupt_headers(nt_ctx *ctx) {
  static const struct {
    const char *header;
    size_t data;
    const char *says;         /* NULL: the file is valid */
  } cases[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, NULL},
      {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, NULL},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype"},
      {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "no dtype"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape entry 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, "shape entry 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "no shape"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
       "9 dims"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
       "\"data_offsets\":[0,8]}}", 8, "overflows"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8, "needs 16"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "outside"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "outside"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, "hole"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "4 bytes after"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "twice"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
      {"{\"__metadata__\":[]}", 0, "__metadata__ is not"},
      {"{\"a\":3}", 0, "not an object"},
      {"[1]     ", 0, "does not start"},
      {"{\"a\":{\"dtype\":\"F32\",", 0, "JSON"},
  };
  char path[512];
  path_of(path, sizeof path, "corrupt");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (!write_raw(ctx, path, cases[i].header, cases[i].data)) return;
    nt_safetensors *f = NULL;
    nt_status st = nt_safetensors_open(ctx, path, &f);
    if (!cases[i].says) {
      CHECK(st == NT_OK && f, "case %zu is valid: %s", i, nt_last_error(ctx));
    } else {
      CHECK(st == NT_ERR_FORMAT && !f && strstr(nt_last_error(ctx), cases[i].says),
            "case %zu: expected an error saying '%s', got %d '%s'", i, cases[i].says, (int)st,
            nt_last_error(ctx));
      printf("  corrupt header %zu: %s\n", i, nt_last_error(ctx));
    }
    if (f && cases[i].data == 8 && nt_safetensors_find(f, "a")->dtype == NT_DTYPE_COUNT) {
      double d;
      int64_t s[1] = {1};
      nt_tensor t = nt_tensor_view(&d, NT_F32, nt_cpu(), 1, s);
      CHECK(!strcmp(nt_safetensors_find(f, "a")->dtype_name, "F64"), "F64 listed");
      CHECK_ERR(ctx, NT_ERR_DTYPE, nt_safetensors_load(ctx, f, "a", &t, NULL));
    }
    nt_safetensors_close(f);
  }
}

static bool add_model(nt_ctx *ctx, nt_params *p, const char *prefix, int64_t rows) {
  memset(p, 0, sizeof *p);
  int u0, u1;
  char n[64];
  int64_t sw[2] = {rows, 4}, sb[1] = {4};
  bool ok = CHECK_OK(ctx, nt_params_add_unit(ctx, p, "emb", &u0));
  snprintf(n, sizeof n, "%sembed.weight", prefix);
  ok = ok && CHECK_OK(ctx, nt_params_add(ctx, p, u0, n, 2, sw, true, NT_INIT_NORMAL, 1, NULL));
  ok = ok && CHECK_OK(ctx, nt_params_add_unit(ctx, p, "norm", &u1));
  snprintf(n, sizeof n, "%snorm.bias", prefix);
  ok = ok && CHECK_OK(ctx, nt_params_add(ctx, p, u1, n, 1, sb, false, NT_INIT_UNIFORM, 1, NULL));
  ok = ok && CHECK_OK(ctx, nt_params_alloc(ctx, p, NT_BF16));
  return ok && CHECK_OK(ctx, nt_params_init(ctx, p, 5));
}

/* "model.X" -> "X"; the embedding's 6 file rows padded to the parameter's 8. */
static bool strip_prefix(void *arg, const char *param, char *name, size_t len,
                         nt_safetensors_load_opts *o) {
  (void)arg;
  snprintf(name, len, "%s", param + strlen("model."));
  o->pad_rows = strstr(param, "embed") != NULL;
  return true;
}

static void test_params(nt_ctx *ctx) {
  nt_params a, b;
  char path[512], p2[512];
  path_of(path, sizeof path, "params");
  path_of(p2, sizeof p2, "params_bf16");
  if (!add_model(ctx, &a, "", 6)) return;
  const char *meta[] = {"format", "pt", NULL};
  CHECK_OK(ctx, nt_safetensors_save_params(ctx, path, &a, NT_F32, meta));
  CHECK_OK(ctx, nt_safetensors_save_params(ctx, p2, &a, NT_BF16, NULL));
  float *aw = nt_params_view(&a, 0, 0, NT_VIEW_MASTER).data;
  /* same names: a bit-exact round trip, compute copies refreshed */
  if (add_model(ctx, &b, "model.", 8)) {
    nt_safetensors *f;
    if (CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) {
      float *bw = nt_params_view(&b, 0, 0, NT_VIEW_MASTER).data;
      float before = bw[0];
      /* without the map every name is missing, and both are listed; nothing is written */
      CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_load_params(ctx, f, &b, NULL));
      CHECK(strstr(nt_last_error(ctx), "2 tensors missing: model.embed.weight, model.norm.bias"),
            "missing listed: %s", nt_last_error(ctx));
      CHECK(bw[0] == before, "nothing loaded on a missing tensor");
      nt_safetensors_params_opts o = {strip_prefix, NULL, false};
      CHECK_OK(ctx, nt_safetensors_load_params(ctx, f, &b, &o));
      bool ok = true;
      for (int i = 0; i < 32; i++) ok = ok && bw[i] == (i < 24 ? aw[i] : 0.0f);
      CHECK(ok, "embedding rows loaded, padded rows zero");
      nt_tensor bc = nt_params_view(&b, 0, 0, NT_VIEW_COMPUTE);
      CHECK(nt_load_f32(bc.data, NT_BF16, 3) == nt_bf16_to_f32(nt_f32_to_bf16(aw[3])),
            "compute copy refreshed");
      nt_safetensors_close(f);
    }
    nt_params_free(ctx, &b);
  }
  /* BF16 file into F32 masters; an extra tensor is an error unless allowed or marked */
  if (add_model(ctx, &b, "", 6)) {
    nt_safetensors *f;
    int64_t s1[1] = {1};
    float x = 1;
    nt_named_tensor ts[3] = {{"embed.weight", nt_params_view(&a, 0, 0, NT_VIEW_MASTER)},
                             {"norm.bias", nt_params_view(&a, 1, 0, NT_VIEW_MASTER)},
                             {"attn.bias", nt_tensor_view(&x, NT_F32, nt_cpu(), 1, s1)}};
    CHECK_OK(ctx, nt_safetensors_save_as(ctx, p2, ts, 3, NULL, NT_BF16));
    if (CHECK_OK(ctx, nt_safetensors_open(ctx, p2, &f))) {
      CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_load_params(ctx, f, &b, NULL));
      CHECK(strstr(nt_last_error(ctx), "1 tensor that nothing loads: attn.bias"), "extra: %s",
            nt_last_error(ctx));
      nt_safetensors_params_opts allow = {NULL, NULL, true};
      CHECK_OK(ctx, nt_safetensors_load_params(ctx, f, &b, &allow));
      CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_check_all_loaded(ctx, f));
      nt_safetensors_mark_loaded(f, "attn.bias");
      CHECK_OK(ctx, nt_safetensors_load_params(ctx, f, &b, NULL));
      CHECK_OK(ctx, nt_safetensors_check_all_loaded(ctx, f));
      float *bw = nt_params_view(&b, 0, 0, NT_VIEW_MASTER).data;
      bool ok = true;
      for (int i = 0; i < 24; i++) ok = ok && bw[i] == nt_bf16_to_f32(nt_f32_to_bf16(aw[i]));
      CHECK(ok, "BF16 file into F32 masters");
      nt_safetensors_close(f);
    }
    nt_params_free(ctx, &b);
  }
  /* a parameter with another shape */
  if (add_model(ctx, &b, "", 7)) {
    nt_safetensors *f;
    if (CHECK_OK(ctx, nt_safetensors_open(ctx, path, &f))) {
      CHECK_ERR(ctx, NT_ERR_SHAPE, nt_safetensors_load_params(ctx, f, &b, NULL));
      CHECK(strstr(nt_last_error(ctx), "embed.weight"), "names the tensor: %s",
            nt_last_error(ctx));
      nt_safetensors_close(f);
    }
    nt_params_free(ctx, &b);
  }
  nt_params_free(ctx, &a);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  snprintf(dir, sizeof dir, "/tmp/nt_test_safetensors_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  test_list_and_convert(ctx);
  test_rows_transpose(ctx);
  test_unaligned(ctx);
  test_corrupt_headers(ctx);
  test_params(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
