/* Pre-training checks (train/preflight.h): memory estimate against free GPU and host memory,
 * block size against the splits, the training data a checkpoint records, /proc/meminfo read. */
#include "tests/testutil.h"
#include "train/preflight.h"
#include <stdlib.h>
#include <string.h>

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_mem_estimate e;
  memset(&e, 0, sizeof e);
  const double mib = 1048576.0;
  e.parameters = 100 * mib;
  e.optimizer = 800 * mib;
  e.activations = 1100 * mib;
  e.total = 2000 * mib;
  CHECK_OK(ctx, nt_preflight_memory(ctx, &e, 500 * mib, 8000 * mib, 4000 * mib));
  CHECK_ERR(ctx, NT_ERR_OOM, nt_preflight_memory(ctx, &e, 500 * mib, 8000 * mib, 2000 * mib));
  CHECK(strstr(nt_last_error(ctx), "2000 MiB of GPU memory") &&
            strstr(nt_last_error(ctx), "activations 1100"),
        "GPU figures named: %s", nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_OOM, nt_preflight_memory(ctx, &e, 2500 * mib, 2400 * mib, -1));
  CHECK(strstr(nt_last_error(ctx), "2500 MiB of host memory") != NULL &&
            strstr(nt_last_error(ctx), "memest: 2000 MiB = parameters 100") != NULL,
        "host figures with memest's parts: %s", nt_last_error(ctx));
  CHECK_OK(ctx, nt_preflight_memory(ctx, &e, 2500 * mib, 0, -1));   /* unknown: no check */
  CHECK_OK(ctx, nt_preflight_block(ctx, 1003854, 111540, 256));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_preflight_block(ctx, 1003854, 111540, 200000));
  CHECK(strstr(nt_last_error(ctx), "validation split has 111540") != NULL, "%s",
        nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_preflight_block(ctx, 100, 100, 100));
  /* the data a checkpoint records: the same data pass, other contents or another size fail
   * naming the option and both hashes, a malformed record is a format error */
  nt_data_id id = {"shakespeare", 1115394, 0x0123456789abcdefULL};
  nt_jw w = {0};
  nt_jw_begin(&w, '{');
  nt_data_id_write(&w, &id);
  nt_jw_end(&w, '}');
  char *text = nt_jw_finish(&w);
  nt_json mc;
  CHECK_OK(ctx, nt_json_parse(ctx, text, strlen(text), "model_config", &mc));
  CHECK_OK(ctx, nt_preflight_data(ctx, &mc, &id, "/data"));
  nt_data_id other = id;
  other.hash ^= 1;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_preflight_data(ctx, &mc, &other, "/elsewhere"));
  CHECK(strstr(nt_last_error(ctx), "--data-dir /elsewhere") &&
            strstr(nt_last_error(ctx), "0123456789abcdef") &&
            strstr(nt_last_error(ctx), "0123456789abcdee"), "%s", nt_last_error(ctx));
  other = (nt_data_id){"tokens.bin", 1115393, id.hash};
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_preflight_data(ctx, &mc, &other, NULL));
  CHECK(strstr(nt_last_error(ctx), "--data tokens.bin") != NULL, "%s", nt_last_error(ctx));
  nt_json_free(&mc);
  free(text);
  const char *bad = "{\"data\":{\"source\":\"x\",\"items\":5,\"fnv1a\":\"12zz\"}}";
  CHECK_OK(ctx, nt_json_parse(ctx, bad, strlen(bad), "model_config", &mc));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_preflight_data(ctx, &mc, &id, NULL));
  nt_json_free(&mc);
  uint64_t avail = nt_host_memory_available();
  printf("MemAvailable: %.0f MiB\n", (double)avail / mib);
  CHECK(avail > 16 * 1024 * 1024, "/proc/meminfo read (%llu bytes)", (unsigned long long)avail);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
