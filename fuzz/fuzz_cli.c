/* The training program's option parser (examples/nanotrain.c's parse_cli): the input split at
 * NUL bytes is the argument list. Any arguments give "go on", 0 (--help) or 2 with a message;
 * accepted values lie within models/limits.h. */
#define NT_CLI_NO_MAIN
#include "examples/nanotrain.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  enum { MAX_ARGS = 64 };
  char *buf = malloc(size + 1), *argv[MAX_ARGS + 2];
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = 0;
  int argc = 0;
  argv[argc++] = "nanotrain";
  for (size_t i = 0; i <= size && argc < MAX_ARGS;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;
  cli c;
  memset(&c, 0, sizeof c);
  int rc = parse_cli(argc, argv, &c);
  if (rc != -1 && rc != 0 && rc != 2) abort();
  if (rc == -1 && c.model == NT_MODEL_GPT) {
    const nt_train_options *o = &c.o;
    if (o->batch_size < 1 || o->batch_size > NT_MAX_BATCH_SIZE || o->gpt.n_layer < 1 ||
        o->gpt.n_layer > NT_MAX_N_LAYER || o->gpt.n_head < 1 || o->gpt.n_embd % o->gpt.n_head ||
        o->gpt.block_size > NT_MAX_BLOCK_SIZE || o->gpt.vocab_size > NT_MAX_VOCAB_SIZE)
      abort();
  }
  free(buf);
  return 0;
}
