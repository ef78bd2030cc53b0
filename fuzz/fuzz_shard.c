/* llm.c token shard reader (data/shards.c): any bytes give a clean status. */
#include "data/shards.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size, ".bin");
  nt_shard s;
  if (!nt_shard_read(fuzz_ctx(), path, &s)) {
    if (s.n <= 0 || (size_t)s.n * 2 + NT_SHARD_HEADER_BYTES != size) abort();
    nt_shard_free(&s);
  }
  unlink(path);
  return 0;
}
