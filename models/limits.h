/* The largest values nanotrain accepts for sizes that come from the command line or from a
 * checkpoint's sidecar (range-checked in both places, so no count sizes an allocation or a loop
 * past what the runtime can hold). */
#ifndef NT_MODELS_LIMITS_H
#define NT_MODELS_LIMITS_H
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#define NT_MAX_N_LAYER 1024
#define NT_MAX_N_HEAD 1024
#define NT_MAX_N_EMBD 65536
#define NT_MAX_BLOCK_SIZE (1 << 20)
#define NT_MAX_VOCAB_SIZE (1 << 24)
#define NT_MAX_BATCH_SIZE (1 << 20)
#define NT_MAX_CNN_WIDTH 65536      /* C1, C2 and the hidden width */
#define NT_MAX_ITERS 1000000000000LL   /* iterations, intervals, warmup, decay length */
#define NT_MAX_EPOCHS 1000000
#define NT_MAX_WORKERS 256
#define NT_MAX_WORLD_SIZE 65536
#define NT_MAX_SAMPLE_TOKENS 10000000

/* "A,B,C": exactly n comma-separated decimal integers, each in [min, max], into out (the
 * command-line form of --widths). */
static inline bool nt_parse_int_list(const char *s, int n, long min, long max, int *out) {
  for (int k = 0; k < n; k++) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') return false;
    long v = strtol(s, &end, 10);
    if (errno || v < min || v > max || *end != (k < n - 1 ? ',' : 0)) return false;
    out[k] = (int)v;
    s = end + (k < n - 1);
  }
  return true;
}

#endif
