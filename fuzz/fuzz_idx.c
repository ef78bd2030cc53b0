/* IDX reader (data/idx.c), plain or gzip: any bytes give a clean status. The first byte picks
 * the expected number of dims (0: any). */
#include "data/idx.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *path = fuzz_file(data + 1, size - 1, ".idx");
  nt_idx a;
  if (!nt_idx_read(fuzz_ctx(), path, data[0] % 4, &a)) {
    int64_t n = 1;
    for (int d = 0; d < a.ndim; d++) n *= a.dims[d];
    if (n != a.numel || (n > 0 && a.data[n - 1] != a.data[n - 1])) abort();
    nt_idx_free(&a);
  }
  unlink(path);
  return 0;
}
