/* memest: the memory a training run needs, per GPU, before running it.
 *   memest --model gpt --dtype bf16 --batch-size 64
 *   memest --model gpt --preset gpt2 --dtype bf16 --batch-size 16 --sharding FULL_SHARD --world-size 8
 *   memest --model cnn --dtype fp16 --batch-size 128
 * Prints parameters, gradients, master weights, optimizer state, activations and workspace,
 * the total, the ZeRO paper's model-state formula and the rule of thumb
 * "parameters x 4 + batch x (input + output) x 4". The training program prints the measured
 * peak beside the same estimate at the end of a run. Exit 2 on a bad command line. */
#include "models/cnn.h"
#include "models/gpt.h"
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

static bool to_int(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 1) return false;
  *out = v;
  return true;
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
  long batch = 0, world = 1, v;
  nt_sharding sh = NT_SHARD_NO_SHARD;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
      if (!to_int(optarg, &v)) return bad(opts[0].name, optarg, "expected a positive integer");
      if (o == 'L') g.n_layer = (int)v;
      if (o == 'H') g.n_head = (int)v;
      if (o == 'C') g.n_embd = (int)v;
      if (o == 'T') g.block_size = (int)v;
      if (o == 'V') g.vocab_size = (int)v;
      if (o == 'b') batch = v;
      if (o == 'n') world = v;
      break;
    case 'w': {
      int a, b2, h;
      char tail;
      if (sscanf(optarg, "%d,%d,%d%c", &a, &b2, &h, &tail) != 3 || a < 1 || b2 < 1 || h < 1)
        return bad("widths", optarg, "expected C1,C2,HIDDEN");
      c.c1 = a;
      c.c2 = b2;
      c.hidden = h;
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
    default:
      fprintf(stderr, "memest: unknown option or missing value: '%s'\nTry 'memest --help'.\n",
              argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "memest: unexpected argument '%s'\n", argv[optind]);
    return 2;
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
