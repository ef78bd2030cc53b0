/* Shared by the libFuzzer targets: the input written to a file unique to the process (the
 * readers under test take paths), and one CPU context for the whole run. */
#ifndef NT_FUZZ_UTIL_H
#define NT_FUZZ_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/nt.h"

static inline nt_ctx *fuzz_ctx(void) {
  static nt_ctx *ctx;
  if (!ctx && nt_ctx_create(&ctx, nt_cpu())) abort();
  return ctx;
}

/* Writes data to /tmp/nt_fuzz_<pid><suffix> and returns that path. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
  static char path[128];
  snprintf(path, sizeof path, "/tmp/nt_fuzz_%ld%s", (long)getpid(), suffix);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  return path;
}

#endif
