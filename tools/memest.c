/* memest: the memory a training run needs, per GPU, before running it.
 *   memest --model gpt --dtype bf16 --batch-size 64
 *   memest --model gpt --preset gpt2 --dtype bf16 --batch-size 16 --sharding FULL_SHARD --world-size 8
 *   memest --model cnn --dtype fp16 --batch-size 128
 * Prints parameters, gradients, master weights, optimizer state, activations and workspace,
 * the total, the ZeRO paper's model-state formula and the rule of thumb
 * "parameters x 4 + batch x (input + output) x 4". The training program prints the measured
 * peak beside the same estimate at the end of a run. Exit 2 on a bad command line (every size
 * range-checked against models/limits.h, the message naming the option). */
#include "models/cnn.h"
#include "models/gpt.h"
#include "models/limits.h"
#include "train/memest.h"
#include "amp/policy.h"
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
"usage: memest [options]\n"
"  --model gpt|cnn              (gpt)\n"
"  --preset shakespeare-char|gpt2   GPT config (shakespeare-char)\n"
"  --n-layer N --n-head N --n-embd N --block-size N --vocab-size N   GPT shape\n"
"  --widths C1,C2,HIDDEN        CNN widths (32,64,256)\n"
"  --dtype fp32|tf32|bf16|fp16|fp8  precision policy (bf16)\n"
"  --batch-size N               per GPU (gpt 64, cnn 128)\n"
"  --sharding NO_SHARD|SHARD_GRAD_OP|FULL_SHARD   (NO_SHARD)\n"
"  --world-size N               ranks sharing the model states (1)\n"
"  --cpu                        no GPU workspace allowance\n"
"  --help\n");
}

static int bad(const char *opt, const char *val, const char *why) {
  fprintf(stderr, "memest: invalid value '%s' for --%s: %s\nTry 'memest --help'.\n", val, opt,
          why);
  return 2;
}

/* An integer option in [1, max]; returns 0, or 2 after a message naming the option. */
static int to_int(const char *name, const char *s, long max, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end) return bad(name, s, "expected an integer");
  if (errno == ERANGE || v < 1 || v > max) {
    char why[64];
    snprintf(why, sizeof why, "must be an integer in [1, %ld]", max);
    return bad(name, s, why);
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},     {"preset", required_argument, 0, 'p'},
      {"n-layer", required_argument, 0, 'L'},   {"n-head", required_argument, 0, 'H'},
      {"n-embd", required_argument, 0, 'C'},    {"block-size", required_argument, 0, 'T'},
      {"vocab-size", required_argument, 0, 'V'}, {"widths", required_argument, 0, 'w'},
      {"dtype", required_argument, 0, 'd'},     {"batch-size", required_argument, 0, 'b'},
      {"sharding", required_argument, 0, 's'},  {"world-size", required_argument, 0, 'n'},
      {"cpu", no_argument, 0, 'c'},             {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  bool cnn = false, cpu = false;
  nt_gpt_config g = nt_gpt_config_shakespeare_char();
  nt_cnn_config c = nt_cnn_config_default();
  nt_precision prec = NT_PREC_BF16;
  long batch = 0, world = 1, v = 0;
  nt_sharding sh = NT_SHARD_NO_SHARD;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    const char *name = "?";
    for (const struct option *lo = opts; lo->name; lo++)
      if (lo->val == (o == ':' ? optopt : o)) name = lo->name;
    static const struct { char id; long max; } limits[] = {
        {'L', NT_MAX_N_LAYER},    {'H', NT_MAX_N_HEAD},      {'C', NT_MAX_N_EMBD},
        {'T', NT_MAX_BLOCK_SIZE}, {'V', NT_MAX_VOCAB_SIZE},  {'b', NT_MAX_BATCH_SIZE},
        {'n', NT_MAX_WORLD_SIZE}};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
      if (limits[i].id != o) continue;
      int rc = to_int(name, optarg, limits[i].max, &v);
      if (rc) return rc;
    }
    switch (o) {
    case 'm':
      if (!strcmp(optarg, "cnn")) cnn = true;
      else if (strcmp(optarg, "gpt")) return bad("model", optarg, "expected gpt or cnn");
      break;
    case 'p':
      if (!strcmp(optarg, "gpt2")) g = nt_gpt_config_gpt2();
      else if (strcmp(optarg, "shakespeare-char") && strcmp(optarg, "shakespeare_char"))
        return bad("preset", optarg, "expected shakespeare-char or gpt2");
      break;
    case 'L': case 'H': case 'C': case 'T': case 'V': case 'b': case 'n':
      if (o == 'L') g.n_layer = (int)v;
      if (o == 'H') g.n_head = (int)v;
      if (o == 'C') g.n_embd = (int)v;
      if (o == 'T') g.block_size = (int)v;
      if (o == 'V') g.vocab_size = (int)v;
      if (o == 'b') batch = v;
      if (o == 'n') world = v;
      break;
    case 'w': {
      int w[3];
      if (!nt_parse_int_list(optarg, 3, 1, NT_MAX_CNN_WIDTH, w))
        return bad("widths", optarg, "expected three integers C1,C2,HIDDEN in [1, 65536]");
      c.c1 = w[0];
      c.c2 = w[1];
      c.hidden = w[2];
      break;
    }
    case 'd':
      if (nt_precision_parse(NULL, optarg, &prec))
        return bad("dtype", optarg, "expected fp32, tf32, bf16, fp16 or fp8");
      break;
    case 's':
      if (!nt_sharding_parse(optarg, &sh))
        return bad("sharding", optarg, "expected NO_SHARD, SHARD_GRAD_OP or FULL_SHARD");
      break;
    case 'c': cpu = true; break;
    case 'h': usage(stdout); return 0;
    case ':':
      fprintf(stderr, "memest: --%s needs a value\nTry 'memest --help'.\n", name);
      return 2;
    default:
      fprintf(stderr, "memest: unknown option '%s'\nTry 'memest --help'.\n", argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "memest: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!cnn && g.n_embd % g.n_head) {
    char val[24];
    snprintf(val, sizeof val, "%d", g.n_head);
    return bad("n-head", val, "must divide --n-embd");
  }
  nt_ctx *ctx = NULL;
  nt_policy pol;
  if (nt_ctx_create(&ctx, nt_cpu()) || nt_policy_make_for(ctx, prec, cpu ? 0 : 90, &pol)) {
    fprintf(stderr, "memest: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  nt_dtype dt = pol.compute_dtype;
  if (!batch) batch = cnn ? 128 : 64;
  nt_model_sizes sizes;
  nt_mem_estimate e;
  int64_t in, out;
  if (cnn) {
    if (nt_cnn_estimate(ctx, &c, dt, (int)batch, &sizes)) goto fail;
    in = (int64_t)c.in_channels * c.height * c.width;
    out = c.classes;
    printf("cnn: widths %d/%d, hidden %d", c.c1, c.c2, c.hidden);
  } else {
    if (nt_gpt_estimate(ctx, &g, dt, (int)batch, g.block_size, &sizes)) goto fail;
    in = g.block_size;
    out = (int64_t)g.block_size * g.vocab_size;
    printf("gpt: %d layers, %d heads, %d wide, block %d, vocab %d", g.n_layer, g.n_head,
           g.n_embd, g.block_size, g.vocab_size);
  }
  printf(", %s (compute %s), batch %ld, %s x %ld\n", nt_precision_name(pol.precision),
         nt_dtype_name(dt), batch, nt_sharding_name(sh), world);
  nt_memest_compute(&sizes, dt, batch, in, out, sh, (int)world,
                    cpu ? 0 : NT_MEMEST_WORKSPACE_BYTES, &e);
  nt_memest_print(stdout, &e, -1);
  nt_ctx_free(ctx);
  return 0;
fail:
  fprintf(stderr, "memest: %s\n", nt_last_error(ctx));
  nt_ctx_free(ctx);
  return 2;
}
