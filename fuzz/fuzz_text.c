/* Text reader and character vocabulary (data/text.c): load, build the vocabulary, encode and
 * decode; the round trip must give the bytes back. */
#include "data/text.h"
#include "fuzz/fuzz_util.h"
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size, ".txt");
  nt_ctx *ctx = fuzz_ctx();
  nt_text t;
  if (!nt_text_load(ctx, path, &t)) {
    nt_vocab v;
    nt_vocab_build(&t, &v);
    int32_t *ids = malloc((size_t)t.n * sizeof *ids);
    uint8_t *back = malloc((size_t)t.n);
    if (!ids || !back) abort();
    if (nt_vocab_encode(ctx, &v, t.bytes, t.n, ids) ||
        nt_vocab_decode(ctx, &v, ids, t.n, back) || memcmp(back, t.bytes, (size_t)t.n))
      abort();
    free(ids);
    free(back);
    nt_text_free(&t);
  }
  unlink(path);
  return 0;
}
