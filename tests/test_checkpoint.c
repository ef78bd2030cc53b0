/* Checkpoint formats: the JSON reader/writer, safetensors files (the byte layout the
 * safetensors package expects: little-endian u64 header length, a JSON header padded to 8
 * bytes with dtype/shape/data_offsets, contiguous data), round trips of every dtype, clear
 * errors for corrupt files and mismatched tensors, atomic writes, and nt_params save/load. */
#include "tests/testutil.h"
#include "models/checkpoint.h"
#include "models/json.h"
#include "train/metrics.h"
#include "models/safetensors.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void test_json(nt_ctx *ctx) {
  const char *text = "{\"a\": [1, -2.5e3, 9007199254740993], \"s\": \"q\\\"\\n\\u0041\", "
                     "\"o\": {\"t\": true, \"f\": false, \"n\": null}, \"e\": {}, \"z\": []}";
  nt_json j;
  if (!CHECK_OK(ctx, nt_json_parse(ctx, text, strlen(text), "test", &j))) return;
  const nt_json *a = nt_json_get(&j, "a");
  CHECK(a && a->type == NT_JSON_ARR && a->n == 3, "array of 3");
  CHECK(nt_json_num(&a->items[1], 0) == -2500.0, "-2.5e3");
  CHECK(nt_json_i64(&a->items[2], 0) == 9007199254740993LL, "int64 parsed exactly");
  CHECK(!strcmp(nt_json_str(nt_json_get(&j, "s"), ""), "q\"\nA"), "escapes");
  const nt_json *o = nt_json_get(&j, "o");
  CHECK(nt_json_get(o, "t")->b && !nt_json_get(o, "f")->b, "bools");
  CHECK(nt_json_get(o, "n")->type == NT_JSON_NULL, "null");
  CHECK(nt_json_get(&j, "e")->n == 0 && nt_json_get(&j, "z")->n == 0, "empty containers");
  CHECK(nt_json_get(&j, "missing") == NULL, "absent key");
  nt_json_free(&j);
  const char *bad[] = {"{\"a\": }", "{\"a\" 1}", "[1, 2", "{\"a\": \"x}", "[1] x", "{1: 2}"};
  for (int i = 0; i < 6; i++)
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_parse(ctx, bad[i], strlen(bad[i]), "bad", &j));
  /* writer round trip */
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_jw_key(&w, "k\"ey");
  nt_jw_str(&w, "v\\al\x01");
  nt_jw_key(&w, "n");
  nt_jw_num(&w, 0.1f);
  nt_jw_key(&w, "inf");
  nt_jw_num(&w, INFINITY);
  nt_jw_key(&w, "u");
  nt_jw_u64(&w, 18446744073709551615ULL);
  nt_jw_key(&w, "l");
  nt_jw_begin(&w, '[');
  nt_jw_i64(&w, -1);
  nt_jw_bool(&w, true);
  nt_jw_end(&w, ']');
  nt_jw_end(&w, '}');
  char *out = nt_jw_finish(&w);
  CHECK(out != NULL, "writer output");
  if (out && CHECK_OK(ctx, nt_json_parse(ctx, out, strlen(out), "written", &j))) {
    CHECK(!strcmp(nt_json_str(nt_json_get(&j, "k\"ey"), ""), "v\\al\x01"), "strings escape");
    CHECK((float)nt_json_get_num(&j, "n", 0) == 0.1f, "floats round-trip");
    CHECK(nt_json_get(&j, "inf")->type == NT_JSON_NULL, "inf is null");
    CHECK(nt_json_u64(nt_json_get(&j, "u"), 0) == 18446744073709551615ULL, "u64 exact");
    CHECK(nt_json_get(&j, "l")->n == 2, "nested array");
    nt_json_free(&j);
  }
  free(out);
}

static void test_safetensors(nt_ctx *ctx) {
  char path[512];
  snprintf(path, sizeof path, "%s/t.safetensors", dir);
  float f[7] = {1, -2, 3.5f, 0, 1e-30f, -0.0f, 7};
  uint16_t h[6];
  for (int i = 0; i < 6; i++) h[i] = nt_f32_to_bf16((float)i - 2.25f);
  int32_t ids[3] = {-1, 0, 2147483647};
  float s = 42.0f;
  int64_t sf[2] = {7, 1}, sh[3] = {1, 2, 3}, si[1] = {3};
  nt_named_tensor ts[4] = {{"w.f32", nt_tensor_view(f, NT_F32, nt_cpu(), 2, sf)},
                           {"w.bf16", nt_tensor_view(h, NT_BF16, nt_cpu(), 3, sh)},
                           {"ids", nt_tensor_view(ids, NT_I32, nt_cpu(), 1, si)},
                           {"scalar", nt_tensor_view(&s, NT_F32, nt_cpu(), 0, NULL)}};
  const char *meta[] = {"format", "pt", "note", "hi \"there\"", NULL};
  if (!CHECK_OK(ctx, nt_safetensors_save(ctx, path, ts, 4, meta))) return;
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(access(tmp, F_OK) != 0, "the temporary file was renamed away");
  /* the raw layout */
  char *raw;
  size_t len;
  if (!CHECK_OK(ctx, nt_read_file(ctx, path, &raw, &len))) return;
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)(uint8_t)raw[i] << (8 * i);
  CHECK(hl % 8 == 0 && 8 + hl <= len, "header length %llu, multiple of 8",
        (unsigned long long)hl);
  CHECK(raw[8] == '{', "header is a JSON object");
  CHECK(len == 8 + hl + sizeof f + sizeof h + sizeof ids + sizeof s, "data is contiguous: %zu",
        len);
  nt_json j;
  if (CHECK_OK(ctx, nt_json_parse(ctx, raw + 8, hl, "header", &j))) {
    const nt_json *e = nt_json_get(&j, "w.bf16");
    CHECK(!strcmp(nt_json_str(nt_json_get(e, "dtype"), ""), "BF16"), "BF16 dtype name");
    const nt_json *of = nt_json_get(e, "data_offsets");
    CHECK(nt_json_i64(&of->items[0], -1) == 28 && nt_json_i64(&of->items[1], -1) == 40,
          "bf16 offsets [28, 40)");
    CHECK(nt_json_get(nt_json_get(&j, "scalar"), "shape")->n == 0, "scalar shape []");
    CHECK(!strcmp(nt_json_str(nt_json_get(nt_json_get(&j, "__metadata__"), "format"), ""),
                  "pt"), "metadata");
    nt_json_free(&j);
  }
  /* read back */
  nt_safetensors *st;
  if (!CHECK_OK(ctx, nt_safetensors_open(ctx, path, &st))) {
    free(raw);
    return;
  }
  float f2[7];
  uint16_t h2[6];
  int32_t i2[3];
  float s2 = 0;
  nt_tensor tf = nt_tensor_view(f2, NT_F32, nt_cpu(), 2, sf);
  nt_tensor th = nt_tensor_view(h2, NT_BF16, nt_cpu(), 3, sh);
  nt_tensor ti = nt_tensor_view(i2, NT_I32, nt_cpu(), 1, si);
  nt_tensor tsc = nt_tensor_view(&s2, NT_F32, nt_cpu(), 0, NULL);
  CHECK_OK(ctx, nt_safetensors_read(ctx, st, "w.f32", &tf));
  CHECK_OK(ctx, nt_safetensors_read(ctx, st, "w.bf16", &th));
  CHECK_OK(ctx, nt_safetensors_read(ctx, st, "ids", &ti));
  CHECK_OK(ctx, nt_safetensors_read(ctx, st, "scalar", &tsc));
  CHECK(!memcmp(f, f2, sizeof f) && !memcmp(h, h2, sizeof h) && !memcmp(ids, i2, sizeof ids) &&
        s2 == 42.0f, "round trip is bit-exact");
  CHECK(!strcmp(nt_safetensors_metadata(st, "note"), "hi \"there\""), "metadata value");
  CHECK(nt_safetensors_has(st, "ids") && !nt_safetensors_has(st, "nope"), "has");
  int64_t wrong[2] = {1, 7};
  nt_tensor tw = nt_tensor_view(f2, NT_F32, nt_cpu(), 2, wrong);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_read(ctx, st, "w.f32", &tw));
  nt_tensor tdt = nt_tensor_view(h2, NT_F16, nt_cpu(), 3, sh);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_read(ctx, st, "w.bf16", &tdt));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_read(ctx, st, "nope", &tf));
  nt_safetensors_close(st);
  /* corrupt files */
  char bad[512];
  snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
  CHECK_OK(ctx, nt_write_file_atomic(ctx, bad, raw, len - 3));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_open(ctx, bad, &st));
  raw[7] = 0x10;   /* header length far beyond the file */
  CHECK_OK(ctx, nt_write_file_atomic(ctx, bad, raw, len));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_open(ctx, bad, &st));
  CHECK_OK(ctx, nt_write_file_atomic(ctx, bad, "abc", 3));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_open(ctx, bad, &st));
  snprintf(bad, sizeof bad, "%s/missing.safetensors", dir);
  CHECK_ERR(ctx, NT_ERR_IO, nt_safetensors_open(ctx, bad, &st));
  snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
  CHECK_ERR(ctx, NT_ERR_IO, nt_safetensors_save(ctx, bad, ts, 1, NULL));
  free(raw);
}

static void test_params_checkpoint(nt_ctx *ctx) {
  nt_params p;
  memset(&p, 0, sizeof p);
  int u0, u1;
  int64_t s2[2] = {5, 3}, s1[1] = {7};
  CHECK_OK(ctx, nt_params_add_unit(ctx, &p, "block", &u0));
  CHECK_OK(ctx, nt_params_add(ctx, &p, u0, "block.bias", 1, s1, false, NT_INIT_ZEROS, 0, NULL));
  CHECK_OK(ctx, nt_params_add(ctx, &p, u0, "block.weight", 2, s2, true, NT_INIT_NORMAL, 1, NULL));
  CHECK_OK(ctx, nt_params_add_unit(ctx, &p, "head", &u1));
  CHECK_OK(ctx, nt_params_add(ctx, &p, u1, "head.w", 2, s2, true, NT_INIT_UNIFORM, 0.5f, NULL));
  if (!CHECK_OK(ctx, nt_params_alloc(ctx, &p, NT_BF16))) return;
  CHECK(p.units[0].params[1].offset == 0 && p.units[0].params[0].offset == 16,
        "decayed weight first, bias after the aligned gap");
  CHECK(p.units[0].n_decay == 16 && p.units[0].numel == 32, "decay range 16 of 32");
  CHECK_OK(ctx, nt_params_init(ctx, &p, 77));
  nt_tensor c = nt_params_view(&p, u0, 1, NT_VIEW_COMPUTE);
  nt_tensor m = nt_params_view(&p, u0, 1, NT_VIEW_MASTER);
  CHECK(c.dtype == NT_BF16 && nt_load_f32(c.data, NT_BF16, 4) ==
        nt_bf16_to_f32(nt_f32_to_bf16(((float *)m.data)[4])), "compute copy is the rounded master");
  float *bw = nt_params_view(&p, u1, 0, NT_VIEW_MASTER).data;
  float mx = 0;
  for (int i = 0; i < 15; i++) mx = fmaxf(mx, fabsf(bw[i]));
  CHECK(mx <= 0.5f && mx > 0.2f, "uniform init within bound (max %g)", mx);
  char cdir[512];
  snprintf(cdir, sizeof cdir, "%s/ck/nested", dir);
  if (!CHECK_OK(ctx, nt_checkpoint_save(ctx, cdir, &p, NULL, "{\"format\":\"x\"}"))) return;
  float saved[15];
  memcpy(saved, m.data, sizeof saved);
  memset(m.data, 0, sizeof saved);
  CHECK_OK(ctx, nt_params_sync_compute(ctx, &p));
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, cdir, &p, NULL));
  CHECK(!memcmp(saved, m.data, sizeof saved), "parameters restored bit-exactly");
  CHECK(nt_load_f32(c.data, NT_BF16, 4) == nt_bf16_to_f32(nt_f32_to_bf16(saved[4])),
        "compute copy refreshed after load");
  char *side;
  if (CHECK_OK(ctx, nt_checkpoint_read_sidecar(ctx, cdir, &side))) {
    CHECK(!strcmp(side, "{\"format\":\"x\"}"), "sidecar text");
    free(side);
  }
  char tp[600], sp[600];
  nt_checkpoint_paths("/a/b/run.safetensors", tp, sp, sizeof tp);
  CHECK(!strcmp(tp, "/a/b/run.safetensors") && !strcmp(sp, "/a/b/run.json"), "paths from a file");
  nt_checkpoint_paths("/a/b", tp, sp, sizeof tp);
  CHECK(!strcmp(tp, "/a/b/ckpt.safetensors") && !strcmp(sp, "/a/b/ckpt.json"), "paths from a dir");
  /* a model with another shape refuses the file */
  nt_params q;
  memset(&q, 0, sizeof q);
  int v0;
  int64_t s3[2] = {3, 5};
  CHECK_OK(ctx, nt_params_add_unit(ctx, &q, "block", &v0));
  CHECK_OK(ctx, nt_params_add(ctx, &q, v0, "block.weight", 2, s3, true, NT_INIT_ZEROS, 0, NULL));
  CHECK_OK(ctx, nt_params_alloc(ctx, &q, NT_F32));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_load_tensors(ctx, cdir, &q, NULL));
  nt_params_free(ctx, &q);
  nt_params_free(ctx, &p);
}

static void test_metrics(nt_ctx *ctx) {
  char path[512], prom[512];
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  snprintf(prom, sizeof prom, "%s/m.prom", dir);
  nt_metrics_log *l;
  if (!CHECK_OK(ctx, nt_metrics_log_open(ctx, path, false, &l))) return;
  nt_train_metrics m = nt_train_metrics_empty();
  m.model = "gpt";
  m.items = "tokens";
  m.step = 10;
  m.loss = 2.5;
  m.items_per_sec = 1234.5;
  m.mfu = 0.25;
  CHECK_OK(ctx, nt_metrics_log_write(ctx, l, &m));
  m.step = 20;
  m.loss = NAN;
  CHECK_OK(ctx, nt_metrics_log_write(ctx, l, &m));
  nt_metrics_log_close(l);
  char *raw;
  size_t len;
  if (CHECK_OK(ctx, nt_read_file(ctx, path, &raw, &len))) {
    char *nl = strchr(raw, '\n');
    nt_json j;
    if (nl && CHECK_OK(ctx, nt_json_parse(ctx, raw, (size_t)(nl - raw), "line 1", &j))) {
      CHECK(nt_json_get_i64(&j, "step", 0) == 10 && nt_json_get_num(&j, "loss", 0) == 2.5,
            "step and loss");
      CHECK(nt_json_get_num(&j, "tokens_per_sec", 0) == 1234.5, "throughput named by unit");
      CHECK(nt_json_get(&j, "lr") == NULL, "NaN fields are left out");
      nt_json_free(&j);
    }
    CHECK(strstr(nl ? nl : "", "\"loss\":null") != NULL, "a NaN loss is null");
    free(raw);
  }
  CHECK_OK(ctx, nt_metrics_prometheus_write(ctx, prom, &m));
  if (CHECK_OK(ctx, nt_read_file(ctx, prom, &raw, &len))) {
    CHECK(strstr(raw, "nanotrain_step{model=\"gpt\"} 20\n") != NULL, "step gauge");
    CHECK(strstr(raw, "# TYPE nanotrain_tokens_per_second gauge\n") != NULL, "typed gauge");
    CHECK(strstr(raw, "nanotrain_mfu{model=\"gpt\"} 0.25\n") != NULL, "mfu gauge");
    free(raw);
  }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/nt_ckpt_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_json(ctx);
  test_safetensors(ctx);
  test_params_checkpoint(ctx);
  test_metrics(ctx);
  nt_ctx_free(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  return nt_test_finish();
}
