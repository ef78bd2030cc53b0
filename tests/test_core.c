/* Core: contexts, errors, tensor views and checks, CPU memory statistics. */
#include "tests/testutil.h"
#include <string.h>

static void test_tensor_views(nt_ctx *ctx) {
  float buf[24];
  nt_tensor t = nt_tensor_view(buf, NT_F32, nt_cpu(), 3, (int64_t[]){2, 3, 4});
  CHECK(nt_tensor_numel(&t) == 24, "numel %lld", (long long)nt_tensor_numel(&t));
  CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1, "strides");
  CHECK(nt_tensor_is_contiguous(&t), "contiguous");
  nt_tensor tt = nt_tensor_transpose(&t, 1, 2);
  CHECK(!nt_tensor_is_contiguous(&tt) && tt.shape[1] == 4 && tt.stride[1] == 1, "transpose");
  nt_tensor s = nt_tensor_slice0(&t, 1, 1);
  CHECK(s.data == buf + 12 && s.shape[0] == 1, "slice");
  nt_tensor r;
  CHECK_OK(ctx, nt_tensor_reshape(ctx, &t, 2, (int64_t[]){6, 4}, &r));
  CHECK(r.shape[0] == 6 && r.stride[0] == 4, "reshape");
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_tensor_reshape(ctx, &t, 2, (int64_t[]){5, 4}, &r));
  CHECK(strstr(nt_last_error(ctx), "element count") != NULL, "message: %s", nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_UNSUPPORTED, nt_tensor_reshape(ctx, &tt, 1, (int64_t[]){24}, &r));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_check_dtype(ctx, &t, NT_BF16, "gemm A"));
  CHECK(strstr(nt_last_error(ctx), "gemm A") && strstr(nt_last_error(ctx), "bf16"), "%s",
        nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_check_dim(ctx, &t, 1, 5, "layernorm weight"));
  nt_tensor g = t;
  g.device = nt_cuda(0);
  CHECK_ERR(ctx, NT_ERR_DEVICE, nt_check_device(ctx, &g, "input"));
  char d[96];
  CHECK(!strcmp(nt_tensor_describe(&t, d, sizeof d), "f32[2, 3, 4] cpu:0"), "describe %s", d);
}

static void test_dtypes(void) {
  CHECK(nt_dtype_size(NT_BF16) == 2 && nt_dtype_size(NT_FP8_E5M2) == 1 && nt_dtype_size(NT_I64) == 8,
        "sizes");
  nt_dtype dt;
  CHECK(nt_dtype_parse("bfloat16", &dt) && dt == NT_BF16, "parse bfloat16");
  CHECK(nt_dtype_parse("f16", &dt) && dt == NT_F16, "parse f16");
  CHECK(!nt_dtype_parse("f17", &dt), "unknown dtype");
  CHECK(!strcmp(nt_status_str(NT_ERR_OOM), "out of memory"), "status names");
}

static void test_memory_stats(nt_ctx *ctx) {
  nt_mem_stats s0, s1;
  nt_mem_get_stats(ctx, &s0);
  nt_tensor a, b;
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &a, NT_F32, 2, (int64_t[]){100, 10}));
  CHECK_OK(ctx, nt_tensor_alloc(ctx, &b, NT_F16, 1, (int64_t[]){7}));
  CHECK(((uintptr_t)a.data % 256) == 0, "alignment");
  nt_mem_get_stats(ctx, &s1);
  CHECK(s1.allocated >= s0.allocated + 4000 + 14, "allocated grew: %zu", s1.allocated);
  CHECK(s1.peak_allocated >= s1.allocated, "peak");
  nt_tensor_free(ctx, &a);
  nt_tensor_free(ctx, &b);
  nt_tensor_free(ctx, &b);  /* second free of a cleared tensor is a no-op */
  nt_mem_get_stats(ctx, &s1);
  CHECK(s1.allocated == s0.allocated, "all freed: %zu vs %zu", s1.allocated, s0.allocated);
  nt_mem_reset_peak(ctx);
  nt_mem_get_stats(ctx, &s1);
  CHECK(s1.peak_allocated == s1.allocated, "peak reset");
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_tensor_alloc(ctx, &a, NT_F32, 5, (int64_t[]){1, 1, 1, 1, 1}));
}

static void test_ctx(void) {
  nt_ctx *a, *b;
  CHECK(nt_ctx_create(&a, nt_cpu()) == NT_OK, "cpu ctx");
  CHECK(nt_ctx_create(&b, nt_cpu()) == NT_OK, "second cpu ctx");
  nt_ctx_manual_seed(a, 42);
  CHECK(nt_ctx_rng_reserve(a, 10) == 0 && nt_ctx_rng_offset(a) == 12, "rng reserve rounds to 4");
  CHECK(nt_ctx_rng_offset(b) == 0, "contexts are independent");
  NT_ERROR(a, NT_ERR_IO, "file %s missing", "x.bin");
  CHECK(nt_last_status(a) == NT_ERR_IO && nt_last_status(b) == NT_OK, "errors are per context");
  CHECK(strstr(nt_last_error(a), "x.bin") && strstr(nt_last_error(a), "test_core.c"),
        "message has text and file:line: %s", nt_last_error(a));
  nt_clear_error(a);
  CHECK(nt_last_error(a)[0] == '\0', "cleared");
  /* A CPU context has no stream to capture; an end without a begin is an error either way. */
  void *graph = &graph;
  CHECK(nt_ctx_capture_begin(a) == NT_ERR_UNSUPPORTED, "capture on a CPU context: %s",
        nt_last_error(a));
  CHECK(nt_ctx_capture_end(a, true, &graph) != NT_OK && graph == NULL,
        "capture end without a begin: %s", nt_last_error(a));
  nt_clear_error(a);
  nt_ctx_free(a);
  nt_ctx_free(b);
  nt_ctx_free(NULL);

  if (nt_cuda_device_count() == 0) {
    nt_ctx *g;
    nt_status st = nt_ctx_create(&g, nt_cuda(0));
    CHECK(st == NT_ERR_NO_DEVICE, "no GPU is a clear error, got %s", nt_status_str(st));
    CHECK(strlen(nt_last_error(g)) > 10, "with a message");
    printf("  no-GPU message: %s\n", nt_last_error(g));
    nt_ctx_free(g);
  }
}

/* The context options: defaults, the text setter (every key, bad keys and values leave the
 * options alone), the environment names, and the range check at creation. */
static void test_options(void) {
  const nt_ctx_options d = nt_ctx_options_default();
  CHECK(d.log == NT_LOG_INFO && d.cublaslt_workspace_bytes == (size_t)32 << 20 &&
            d.gemm_autotune && d.gemm_search == 1 && !d.gemm_search_verify &&
            d.gemm_untuned_gflop == 100.0 && d.conv_l2_mb < 0 && d.pdl && !d.attn_simple &&
            d.attn_wgmma && d.attn_tma && d.attn_bwd_keys == 0 && d.attn_bwd_group == 32 &&
            d.attn_dq_pair && d.mem_cache,
        "documented defaults");
  nt_ctx_options o = d;
  const struct { const char *key, *value; } good[] = {
      {"log", "debug"}, {"cublaslt_workspace_mib", "0.5"}, {"gemm_autotune", "off"},
      {"gemm_search", "2"}, {"gemm_search_verify", "1"}, {"gemm_untuned_gflop", "1e3"},
      {"conv_l2_mb", "0"}, {"pdl", "false"}, {"attn_simple", "yes"}, {"attn_wgmma", "0"},
      {"attn_tma", "0"}, {"attn_bwd_keys", "64"}, {"attn_bwd_group", "0"},
      {"attn_dq_pair", "no"}, {"mem_cache", "0"}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    CHECK(nt_ctx_options_set(&o, good[i].key, good[i].value) == NT_OK, "%s=%s", good[i].key,
          good[i].value);
  CHECK(o.log == NT_LOG_DEBUG && o.cublaslt_workspace_bytes == (size_t)1 << 19 &&
            !o.gemm_autotune && o.gemm_search == 2 && o.gemm_search_verify &&
            o.gemm_untuned_gflop == 1e3 && o.conv_l2_mb == 0 && !o.pdl && o.attn_simple &&
            !o.attn_wgmma && !o.attn_tma && o.attn_bwd_keys == 64 && o.attn_bwd_group == 0 &&
            !o.attn_dq_pair && !o.mem_cache,
        "every field set from text");
  const nt_ctx_options before = o;
  const struct { const char *key, *value; } bad[] = {
      {"log", "loud"},          {"gemm_autotune", "2"},   {"gemm_search", "3"},
      {"gemm_search", "1x"},    {"attn_bwd_keys", "96"},  {"attn_bwd_group", "-1"},
      {"gemm_untuned_gflop", "0"}, {"cublaslt_workspace_mib", "5000"}, {"conv_l2_mb", "-1"},
      {"no_such_option", "1"},  {"NT_LOG", "info"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK(nt_ctx_options_set(&o, bad[i].key, bad[i].value) == NT_ERR_INVALID_ARG, "%s=%s refused",
          bad[i].key, bad[i].value);
  CHECK(!memcmp(&o, &before, sizeof o), "refused values leave the options alone");
  int n = 0;
  for (const nt_ctx_option_name *nm; (nm = nt_ctx_option_name_at(n)); n++) {
    char env[64] = "NT_";
    for (size_t j = 0; nm->key[j] && j + 4 < sizeof env; j++)
      env[3 + j] = (char)(nm->key[j] >= 'a' && nm->key[j] <= 'z' ? nm->key[j] - 32 : nm->key[j]);
    CHECK(!strcmp(env, nm->env), "option %s's environment name %s is NT_ + its key", nm->key,
          nm->env);
  }
  CHECK(n == (int)(sizeof good / sizeof good[0]) && !nt_ctx_option_name_at(-1),
        "%d names, one per option", n);
  nt_ctx *c = NULL;
  CHECK(nt_ctx_create_with(&c, nt_cpu(), &o) == NT_OK && nt_ctx_opts(c)->gemm_search == 2,
        "a context keeps its options");
  nt_ctx_free(c);
  o.attn_bwd_keys = 32;
  CHECK(nt_ctx_create_with(&c, nt_cpu(), &o) == NT_ERR_INVALID_ARG &&
            strstr(nt_last_error(c), "attn_bwd_keys"),
        "an out-of-range field is refused at creation, named: %s", nt_last_error(c));
  nt_ctx_free(c);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_options();
  test_tensor_views(ctx);
  test_dtypes();
  test_memory_stats(ctx);
  test_ctx();
  nt_ctx_free(ctx);
  return nt_test_finish();
}
