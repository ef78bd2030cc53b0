/* safetensors reader (models/safetensors.c): open any bytes; every tensor the header declares
 * (small enough) is read into a host tensor of its own dtype and shape. */
#include "models/json.h"
#include "models/safetensors.h"
#include "fuzz/fuzz_util.h"
#include <string.h>

/* The safetensors dtype name's nt_dtype, or -1. */
static int dtype_of(const char *name) {
  for (int d = 0; d < NT_DTYPE_COUNT; d++) {
    const char *n = nt_safetensors_dtype_name((nt_dtype)d);
    if (n && !strcmp(n, name)) return d;
  }
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size, ".safetensors");
  nt_ctx *ctx = fuzz_ctx();
  nt_safetensors *f;
  if (!nt_safetensors_open(ctx, path, &f)) {
    /* re-parse the header to learn the names, then read each one */
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)data[i] << (8 * i);
    nt_json h;
    if (!nt_json_parse(ctx, (const char *)data + 8, (size_t)hlen, "header", &h)) {
      for (int i = 0; i < h.n; i++) {
        const nt_json *e = &h.items[i];
        const nt_json *sh = nt_json_get(e, "shape");
        int dt = dtype_of(nt_json_str(nt_json_get(e, "dtype"), ""));
        if (!sh || sh->type != NT_JSON_ARR || dt < 0 || sh->n > NT_MAX_DIMS) continue;
        int64_t shape[NT_MAX_DIMS], numel = 1;
        bool ok = true;
        for (int k = 0; k < sh->n && ok; k++) {
          ok = !nt_json_int_in(ctx, &sh->items[k], "dim", 0, 1 << 16, &shape[k]);
          numel *= ok ? shape[k] : 1;
        }
        if (!ok || numel > (1 << 16)) continue;
        void *buf = malloc((size_t)numel * nt_dtype_size((nt_dtype)dt) + 1);
        nt_tensor t = nt_tensor_view(buf, (nt_dtype)dt, nt_cpu(), sh->n, shape);
        nt_safetensors_read(ctx, f, h.keys[i], &t);
        free(buf);
      }
      nt_json_free(&h);
    }
    nt_safetensors_metadata(f, "format");
    nt_safetensors_close(f);
  }
  unlink(path);
  return 0;
}
