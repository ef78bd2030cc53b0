/* train: trains the small GPT (tiny shakespeare, nanoGPT's shakespeare_char config by
 * default; GPT-2 124M with --preset gpt2) or the small CNN (Fashion-MNIST) on the CPU or a GPU.
 *   train gpt --device cuda --dtype bf16 --out-dir runs/gpt --sample 500
 *   train cnn --device cuda --dtype fp16 --epochs 10 --out-dir runs/cnn
 * Run `train --help` for every option. Exit status: 0 success, 1 a failure during the run,
 * 2 a bad command line, 130 / 143 stopped by SIGINT / SIGTERM (a second signal exits at once).
 * Every numeric option is range-checked (models/limits.h) with a message naming it. Built with
 * NT_CLI_NO_MAIN it provides parse_cli alone (the option parser's fuzz target). */
#include "train/train.h"
#include "tools/launch_env.h"
#include "tools/ctx_env.h"
#include "core/stop.h"
#include "models/checkpoint.h"
#include "models/limits.h"
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tools/ctx_env.h"

enum {
  O_MODEL = 256, O_DEVICE, O_DTYPE, O_BATCH, O_LR, O_MIN_LR, O_WD, O_BETA1, O_BETA2, O_EPS,
  O_MAX_ITERS, O_EPOCHS, O_WARMUP, O_DECAY_ITERS, O_NO_DECAY, O_INIT_SCALE, O_GROWTH_INTERVAL,
  O_GROWTH_FACTOR, O_BACKOFF, O_CLIP, O_DROPOUT, O_NLAYER, O_NHEAD, O_NEMBD, O_BLOCK, O_VOCAB,
  O_HEAD_ROWS,
  O_PRESET, O_DATA, O_WIDTHS, O_SEED, O_EVAL_INTERVAL, O_EVAL_ITERS, O_LOG_INTERVAL,
  O_METRICS_INTERVAL, O_WORKERS, O_DATA_DIR, O_OUT_DIR, O_RESUME, O_CKPT_INTERVAL, O_KEEP_CKPT,
  O_SAMPLE,
  O_TEMP, O_TOPK, O_GRAPH, O_NO_GRAPH, O_PROGRESS, O_NO_PROGRESS, O_AUGMENT, O_TRAIN_SUBSET,
  O_TEST_SUBSET, O_QUIET, O_TRACE, O_HELP
};

/* ---- data parallel (dist/): options, launch detection, the communicator ---- */
enum {
  O_SHARDING = 512, O_RESHARD, O_LIMIT_GATHERS, O_BWD_PREFETCH, O_FWD_PREFETCH, O_PARAM_DTYPE,
  O_REDUCE_DTYPE, O_ACCUM, O_DIST_TIMEOUT, O_DIST_BACKEND, O_DIST_FINGERPRINT, O_CKPT_FORMAT
};
#define DIST_LONG_OPTS                                                                        \
  {"sharding-strategy", required_argument, 0, O_SHARDING},                                  \
  {"reshard-after-forward", required_argument, 0, O_RESHARD},                               \
  {"limit-all-gathers", required_argument, 0, O_LIMIT_GATHERS},                             \
  {"backward-prefetch", required_argument, 0, O_BWD_PREFETCH},                              \
  {"forward-prefetch", no_argument, 0, O_FWD_PREFETCH},                                     \
  {"param-dtype", required_argument, 0, O_PARAM_DTYPE},                                     \
  {"reduce-dtype", required_argument, 0, O_REDUCE_DTYPE},                                   \
  {"grad-accum-steps", required_argument, 0, O_ACCUM},                                      \
  {"dist-timeout", required_argument, 0, O_DIST_TIMEOUT},                                   \
  {"dist-backend", required_argument, 0, O_DIST_BACKEND},                                   \
  {"dist-fingerprint", no_argument, 0, O_DIST_FINGERPRINT},                                 \
  {"checkpoint-format", required_argument, 0, O_CKPT_FORMAT},
#define DIST_USAGE                                                                            \
"\ndata parallel (mpirun -np N nanotrain ..., torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/\n"  \
"MASTER_ADDR/MASTER_PORT, or srun; --batch-size is per rank):\n"                               \
"  --sharding-strategy NO_SHARD|SHARD_GRAD_OP|FULL_SHARD   DDP, ZeRO-2, ZeRO-3 (NO_SHARD)\n"   \
"  --reshard-after-forward true|false   FULL_SHARD: free gathered units after forward (true)\n" \
"  --limit-all-gathers true|false   at most two units gathered at once (true)\n"             \
"  --backward-prefetch BACKWARD_PRE|BACKWARD_POST|NONE   (BACKWARD_PRE)\n"                    \
"  --forward-prefetch         gather the next unit during a unit's forward\n"                \
"  --param-dtype T --reduce-dtype T   compute copy (must match --dtype), gradient\n"         \
"                             reductions (fp32; bf16, fp16)\n"                               \
"  --grad-accum-steps K       micro-steps per step, reduced on the last (1)\n"               \
"  --dist-timeout S           a collective that takes longer ends the job (300)\n"           \
"  --dist-backend auto|nccl|mpi   auto: NCCL when every rank has its own GPU, MPI (staged\n" \
"                             through host memory) when ranks share one or on the CPU\n"     \
"  --dist-fingerprint         debug: compare the ranks' sequences of collectives\n"         \
"  --checkpoint-format auto|consolidated|sharded|both   whole state by rank 0, or one file\n" \
"                             per rank (auto: sharded when the strategy shards, N > 1)\n"

typedef struct {
  const char *backend;     /* auto, nccl, mpi, local */
  double timeout;
  bool fingerprint;
} dist_cli;

static bool parse_bool(const char *s, bool *out) {
  if (!strcmp(s, "true") || !strcmp(s, "1")) *out = true;
  else if (!strcmp(s, "false") || !strcmp(s, "0")) *out = false;
  else return false;
  return true;
}

/* One data-parallel option; returns 0, or 2 after printing the complaint. */
static int bad(const char *opt, const char *val, const char *why);
static int dist_option(int c, const char *name, const char *v, nt_train_options *o, dist_cli *d) {
  nt_fsdp_options *f = &o->dist.fsdp;
  char *end;
  switch (c) {
  case O_SHARDING:
    return nt_sharding_parse(v, &f->strategy) ? 0
           : bad(name, v, "expected NO_SHARD, SHARD_GRAD_OP or FULL_SHARD");
  case O_RESHARD: return parse_bool(v, &f->reshard_after_forward) ? 0 : bad(name, v, "true|false");
  case O_LIMIT_GATHERS: return parse_bool(v, &f->limit_all_gathers) ? 0 : bad(name, v, "true|false");
  case O_BWD_PREFETCH:
    return nt_backward_prefetch_parse(v, &f->backward_prefetch) ? 0
           : bad(name, v, "expected BACKWARD_PRE, BACKWARD_POST or NONE");
  case O_FWD_PREFETCH: f->forward_prefetch = true; return 0;
  case O_PARAM_DTYPE:
  case O_REDUCE_DTYPE: {
    nt_dtype t;
    const char *n = !strcmp(v, "fp32") ? "f32" : !strcmp(v, "fp16") ? "f16" : v;
    if (!nt_dtype_parse(n, &t) || (t != NT_F32 && t != NT_F16 && t != NT_BF16))
      return bad(name, v, "expected fp32, bf16 or fp16");
    if (c == O_REDUCE_DTYPE) f->reduce_dtype = t;
    else f->param_dtype = t, o->dist.param_dtype_given = true;
    return 0;
  }
  case O_ACCUM: {
    long k = strtol(v, &end, 10);
    if (*end || end == v || k < 1 || k > 1 << 20) return bad(name, v, "expected an integer >= 1");
    o->dist.grad_accum_steps = (int)k;
    return 0;
  }
  case O_DIST_TIMEOUT:
    d->timeout = strtod(v, &end);
    return *end || end == v || !(d->timeout > 0) ? bad(name, v, "expected seconds > 0") : 0;
  case O_DIST_BACKEND:
    if (strcmp(v, "auto") && strcmp(v, "nccl") && strcmp(v, "mpi") && strcmp(v, "local"))
      return bad(name, v, "expected auto, nccl or mpi");
    d->backend = v;
    return 0;
  case O_DIST_FINGERPRINT: d->fingerprint = true; return 0;
  case O_CKPT_FORMAT:
    return nt_checkpoint_format_parse(v, &o->checkpoint_format) ? 0
           : bad(name, v, "expected auto, consolidated, sharded or both");
  default: return -1;
  }
}

#ifndef NT_CLI_NO_MAIN
/* The communicator for the launch: none at world 1 with NO_SHARD and the automatic backend
 * (the one-process path); NCCL when every rank has its own GPU; MPI (device tensors staged
 * through host memory) when ranks share a GPU, which NCCL refuses, or on the CPU. Under mpirun
 * the ranks first compare their devices over MPI, so they all choose alike. */
static nt_status make_comm(nt_ctx *ctx, const nt_dist_launch *l, const nt_train_options *o,
                           const dist_cli *d, bool cuda, nt_comm **out) {
  *out = NULL;
  bool sharded = o->dist.fsdp.strategy != NT_SHARD_NO_SHARD;
  if (l->world == 1 && !sharded && !strcmp(d->backend, "auto")) return NT_OK;
  nt_comm_options co = {NT_COMM_LOCAL, l, d->timeout, d->fingerprint};
  if (!strcmp(d->backend, "mpi")) co.backend = NT_COMM_MPI;
  else if (!strcmp(d->backend, "nccl")) co.backend = NT_COMM_NCCL;
  else if (!strcmp(d->backend, "local")) co.backend = NT_COMM_LOCAL;
  else if (!cuda) co.backend = l->world > 1 ? NT_COMM_MPI : NT_COMM_LOCAL;
  else co.backend = NT_COMM_NCCL;
  if (co.backend == NT_COMM_MPI && l->kind != NT_LAUNCH_MPI && l->world > 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "the MPI backend needs ranks started by mpirun "
                    "(this launch is %s: NCCL on GPUs only)", nt_launch_kind_name(l->kind));
  if (!strcmp(d->backend, "auto") && cuda && l->kind == NT_LAUNCH_MPI && l->world > 1) {
    nt_comm_options mo = co;
    mo.backend = NT_COMM_MPI;
    nt_comm *mpi = NULL;
    char host[64] = {0};
    gethostname(host, sizeof host - 1);
    struct { uint64_t host; int64_t dev; } mine = {nt_fnv1a(NT_FNV_OFFSET, host, strlen(host)),
                                                   nt_ctx_device(ctx).index}, *all;
    all = calloc((size_t)l->world, sizeof *all);
    nt_status st = all ? nt_comm_create(ctx, &mo, &mpi) : NT_ERR_OOM;
    if (!st) st = nt_comm_gather_bytes(mpi, ctx, &mine, sizeof mine, all);
    bool shared = false;
    for (int i = 0; !st && i < l->world; i++)
      for (int j = 0; j < i; j++) shared |= all[i].host == all[j].host && all[i].dev == all[j].dev;
    free(all);
    if (st || shared) {
      *out = mpi;
      return st;
    }
    nt_comm_free(ctx, mpi);
  }
  return nt_comm_create(ctx, &co, out);
}
#endif

static const struct option long_opts[] = {
    {"model", required_argument, 0, O_MODEL},
    {"device", required_argument, 0, O_DEVICE},
    {"dtype", required_argument, 0, O_DTYPE},
    {"batch-size", required_argument, 0, O_BATCH},
    {"lr", required_argument, 0, O_LR},
    {"min-lr", required_argument, 0, O_MIN_LR},
    {"weight-decay", required_argument, 0, O_WD},
    {"beta1", required_argument, 0, O_BETA1},
    {"beta2", required_argument, 0, O_BETA2},
    {"eps", required_argument, 0, O_EPS},
    {"max-iters", required_argument, 0, O_MAX_ITERS},
    {"epochs", required_argument, 0, O_EPOCHS},
    {"warmup-iters", required_argument, 0, O_WARMUP},
    {"lr-decay-iters", required_argument, 0, O_DECAY_ITERS},
    {"no-decay-lr", no_argument, 0, O_NO_DECAY},
    {"init-scale", required_argument, 0, O_INIT_SCALE},
    {"growth-interval", required_argument, 0, O_GROWTH_INTERVAL},
    {"growth-factor", required_argument, 0, O_GROWTH_FACTOR},
    {"backoff-factor", required_argument, 0, O_BACKOFF},
    {"grad-clip", required_argument, 0, O_CLIP},
    {"dropout", required_argument, 0, O_DROPOUT},
    {"n-layer", required_argument, 0, O_NLAYER},
    {"n-head", required_argument, 0, O_NHEAD},
    {"n-embd", required_argument, 0, O_NEMBD},
    {"block-size", required_argument, 0, O_BLOCK},
    {"vocab-size", required_argument, 0, O_VOCAB},
    {"head-rows", required_argument, 0, O_HEAD_ROWS},
    {"preset", required_argument, 0, O_PRESET},
    {"data", required_argument, 0, O_DATA},
    {"widths", required_argument, 0, O_WIDTHS},
    {"seed", required_argument, 0, O_SEED},
    {"eval-interval", required_argument, 0, O_EVAL_INTERVAL},
    {"eval-iters", required_argument, 0, O_EVAL_ITERS},
    {"log-interval", required_argument, 0, O_LOG_INTERVAL},
    {"metrics-interval", required_argument, 0, O_METRICS_INTERVAL},
    {"num-workers", required_argument, 0, O_WORKERS},
    {"data-dir", required_argument, 0, O_DATA_DIR},
    {"out-dir", required_argument, 0, O_OUT_DIR},
    {"resume", required_argument, 0, O_RESUME},
    {"checkpoint-interval", required_argument, 0, O_CKPT_INTERVAL},
    {"keep-checkpoints", required_argument, 0, O_KEEP_CKPT},
    {"sample", required_argument, 0, O_SAMPLE},
    {"temperature", required_argument, 0, O_TEMP},
    {"top-k", required_argument, 0, O_TOPK},
    {"cuda-graph", no_argument, 0, O_GRAPH},
    {"no-cuda-graph", no_argument, 0, O_NO_GRAPH},
    {"progress", no_argument, 0, O_PROGRESS},
    {"no-progress", no_argument, 0, O_NO_PROGRESS},
    {"augment", no_argument, 0, O_AUGMENT},
    {"train-subset", required_argument, 0, O_TRAIN_SUBSET},
    {"test-subset", required_argument, 0, O_TEST_SUBSET},
    {"quiet", no_argument, 0, O_QUIET},
    {"trace", no_argument, 0, O_TRACE},
    {"help", no_argument, 0, O_HELP},
    DIST_LONG_OPTS
    {0, 0, 0, 0}};

static void usage(FILE *f) {
  fprintf(f,
"usage: nanotrain [gpt|cnn] [options]\n"
"\n"
"Trains the small GPT on tiny shakespeare (nanoGPT's shakespeare_char defaults) or the small\n"
"CNN on Fashion-MNIST, on the CPU or a GPU, with mixed precision, checkpoints and metrics.\n"
"\n"
"  --model gpt|cnn            model to train (or give it as the first argument)\n"
"  --device cpu|cuda[:N]      where to train (default: cuda when a GPU is present)\n"
"  --dtype fp32|tf32|bf16|fp16|fp8   precision policy (default bf16 on a GPU, fp32 on the\n"
"                             CPU); fp16 uses the dynamic loss scaler; fp8 runs the linear\n"
"                             layers in FP8 on Hopper, the rest in bf16 (elsewhere: bf16)\n"
"  --batch-size N             (gpt 64, cnn 128)\n"
"  --lr X                     peak learning rate (1e-3)\n"
"  --min-lr X                 cosine floor (gpt 1e-4, cnn 1e-5)\n"
"  --weight-decay X           AdamW decay on 2-D weights only (gpt 0.1, cnn 0.05)\n"
"  --beta1 X --beta2 X --eps X   AdamW (0.9, gpt 0.99 / cnn 0.999, 1e-8)\n"
"  --max-iters N              gpt iterations (5000); cnn: stop after N steps\n"
"  --epochs N                 cnn epochs (10)\n"
"  --warmup-iters N           linear warmup (gpt 100, cnn 0)\n"
"  --lr-decay-iters N         cosine length (gpt 5000; cnn: the whole run)\n"
"  --no-decay-lr              constant learning rate\n"
"  --grad-clip X              clip by global norm (1.0; 0 disables)\n"
"  --init-scale X             loss scaler (fp16): initial scale (65536)\n"
"  --growth-interval N        steps without overflow before growing (gpt 2000, cnn 1000)\n"
"  --growth-factor X          (2.0)\n"
"  --backoff-factor X         (0.5)\n"
"  --dropout X                gpt 0.2, cnn 0 (after the hidden layer)\n"
"  --n-layer N --n-head N --n-embd N --block-size N --vocab-size N   GPT shape\n"
"  --head-rows N              GPT: logits rows formed at once (0: all while they take at\n"
"                             most 1 GiB, else halved until they do)\n"
"  --preset shakespeare-char|gpt2   GPT config (gpt2: 12/12/768, block 1024, vocab 50257,\n"
"                             dropout 0, synthetic tokens unless --data is a shard)\n"
"  --data shakespeare|synthetic|FILE   GPT text: tiny shakespeare, random tokens, or an\n"
"                             llm.c token shard (.bin)\n"
"  --widths C1,C2,HIDDEN      CNN widths (32,64,256)\n"
"  --augment                  CNN: random crop (pad 2) + horizontal flip\n"
"  --train-subset N --test-subset N   CNN: use the first N images\n"
"  --seed N                   (1337)\n"
"  --eval-interval N          gpt: evaluate every N iterations (250; 0 never)\n"
"  --eval-iters N             gpt: batches per evaluation (200)\n"
"  --log-interval N           print/log every N steps (gpt 10, cnn 50)\n"
"  --metrics-interval N       rewrite metrics.prom every N steps (default: every log)\n"
"  --num-workers N            cnn loader threads (4)\n"
"  --data-dir DIR             tiny shakespeare's dir (default $NT_DATA_DIR) or\n"
"                             Fashion-MNIST's (default $NT_FASHION_DIR or the system copy)\n"
"  --out-dir DIR              checkpoints (DIR/ckpt-<step>/: ckpt.safetensors, ckpt.json and\n"
"                             a SHA-256 manifest; DIR/latest names the newest),\n"
"                             metrics.jsonl, metrics.prom; one run at a time (DIR/.lock)\n"
"  --resume DIR               continue from a checkpoint: an out-dir (its newest) or one\n"
"                             ckpt-<step> directory (bit-identical on one device); without\n"
"                             --out-dir the run keeps writing into DIR\n"
"  --checkpoint-interval N    save every N iterations (gpt 250; 0: after every evaluation);\n"
"                             also per epoch (cnn) and at the end\n"
"  --keep-checkpoints K       keep the newest K checkpoints (3; 0 keeps all)\n"
"  --sample N                 gpt: generate N characters after training\n"
"  --temperature X --top-k N  sampling (0.8, 200)\n"
"  --cuda-graph / --no-cuda-graph   capture the step as a CUDA graph (default on a GPU;\n"
"                             falls back to eager if capture fails)\n"
"  --progress / --no-progress   progress bar (default when stdout is a terminal)\n"
"  --quiet                    no per-step output\n"
"  --trace                    print every step's AMP events: the loss scale, found_inf,\n"
"                             whether the optimizer step was skipped, the growth tracker\n"
"                             (reads the GPU every step: slower, for learning and debugging)\n"
"  --kernel-opt KEY=VALUE     a kernel or algorithm option of the context (core/ctx.h; also\n"
"                             from the environment, NT_ + KEY in capitals), e.g.\n"
"                             gemm_search=0, attn_wgmma=0, log=debug\n"
"  --help                     this text\n" DIST_USAGE);
}

static int bad(const char *opt, const char *val, const char *why) {
  fprintf(stderr, "nanotrain: invalid value '%s' for --%s: %s\n", val, opt, why);
  fprintf(stderr, "Try 'nanotrain --help'.\n");
  return 2;
}

/* The accepted range of every numeric option: integers in [imin, imax]; numbers in [dmin, dmax]
 * with the bounds excluded where lo_open / hi_open. */
typedef struct {
  int id;
  bool integer;
  int64_t imin, imax;
  double dmin, dmax;
  bool lo_open, hi_open;
} opt_range;

#define IRANGE(id, lo, hi) {id, true, lo, hi, 0, 0, false, false}
#define DRANGE(id, lo, hi, lo_open, hi_open) {id, false, 0, 0, lo, hi, lo_open, hi_open}
static const opt_range ranges[] = {
    IRANGE(O_BATCH, 1, NT_MAX_BATCH_SIZE),
    DRANGE(O_LR, 0, 10, false, false),
    DRANGE(O_MIN_LR, 0, 10, false, false),
    DRANGE(O_WD, 0, 10, false, false),
    DRANGE(O_BETA1, 0, 1, false, true),
    DRANGE(O_BETA2, 0, 1, false, true),
    DRANGE(O_EPS, 0, 1, true, false),
    IRANGE(O_MAX_ITERS, 0, NT_MAX_ITERS),
    IRANGE(O_EPOCHS, 0, NT_MAX_EPOCHS),
    IRANGE(O_WARMUP, 0, NT_MAX_ITERS),
    IRANGE(O_DECAY_ITERS, 0, NT_MAX_ITERS),
    DRANGE(O_INIT_SCALE, 0, 3.0e38, true, false),
    IRANGE(O_GROWTH_INTERVAL, 1, INT32_MAX),
    DRANGE(O_GROWTH_FACTOR, 1, 1e6, true, false),
    DRANGE(O_BACKOFF, 0, 1, true, true),
    DRANGE(O_CLIP, 0, 1e9, false, false),
    DRANGE(O_DROPOUT, 0, 1, false, true),
    IRANGE(O_NLAYER, 1, NT_MAX_N_LAYER),
    IRANGE(O_NHEAD, 1, NT_MAX_N_HEAD),
    IRANGE(O_NEMBD, 1, NT_MAX_N_EMBD),
    IRANGE(O_BLOCK, 1, NT_MAX_BLOCK_SIZE),
    IRANGE(O_VOCAB, 1, NT_MAX_VOCAB_SIZE),
    IRANGE(O_HEAD_ROWS, 0, INT32_MAX),
    IRANGE(O_SEED, 0, INT64_MAX),
    IRANGE(O_EVAL_INTERVAL, 0, NT_MAX_ITERS),
    IRANGE(O_EVAL_ITERS, 1, NT_MAX_ITERS),
    IRANGE(O_LOG_INTERVAL, 0, NT_MAX_ITERS),
    IRANGE(O_METRICS_INTERVAL, 0, NT_MAX_ITERS),
    IRANGE(O_WORKERS, 0, NT_MAX_WORKERS),
    IRANGE(O_CKPT_INTERVAL, 0, NT_MAX_ITERS),
    IRANGE(O_KEEP_CKPT, 0, 1000000),
    IRANGE(O_SAMPLE, 0, NT_MAX_SAMPLE_TOKENS),
    DRANGE(O_TEMP, 0, 100, true, false),
    IRANGE(O_TOPK, 0, NT_MAX_VOCAB_SIZE),
    IRANGE(O_TRAIN_SUBSET, 0, INT32_MAX),
    IRANGE(O_TEST_SUBSET, 0, INT32_MAX),
};

static const opt_range *range_of(int id) {
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
    if (ranges[i].id == id) return &ranges[i];
  return NULL;
}

/* Parses optarg by r into *n or *d; returns 0, or 2 after a message naming the option. */
static int parse_ranged(const opt_range *r, const char *name, const char *val, int64_t *n,
                        double *d) {
  char *end, why[160];
  errno = 0;
  if (r->integer) {
    long long v = strtoll(val, &end, 10);
    if (end == val || *end || strchr(val, ' ') || !*val)
      return bad(name, val, "expected an integer");
    if (errno == ERANGE || v < r->imin || v > r->imax) {
      snprintf(why, sizeof why, "must be an integer in [%lld, %lld]", (long long)r->imin,
               (long long)r->imax);
      return bad(name, val, why);
    }
    *n = v;
    return 0;
  }
  double v = strtod(val, &end);
  if (end == val || *end || !*val || isnan(v)) return bad(name, val, "expected a number");
  if (!isfinite(v) || (r->lo_open ? !(v > r->dmin) : !(v >= r->dmin)) ||
      (r->hi_open ? !(v < r->dmax) : !(v <= r->dmax))) {
    snprintf(why, sizeof why, "must be in %c%g, %g%c", r->lo_open ? '(' : '[', r->dmin, r->dmax,
             r->hi_open ? ')' : ']');
    return bad(name, val, why);
  }
  *d = v;
  return 0;
}

static const char *opt_name(int id) {
  for (const struct option *lo = long_opts; lo->name; lo++)
    if (lo->val == id) return lo->name;
  return "?";
}

typedef struct {
  nt_model_kind model;
  nt_train_options o;
  bool want_cuda, device_given, device_index_given;
  dist_cli dist;              /* data parallel: backend, timeout, fingerprint */
  int device_index;
  const char *given[sizeof long_opts / sizeof long_opts[0]];   /* options given, once each */
  int n_given;
  char resume_parent[4200];   /* the out-dir of a ckpt-<step> directory given to --resume */
  nt_ctx_options ctx_opts;    /* the context options: environment, then --kernel-opt */
} cli;

/* Parses the command line into c. Returns -1 to go on, else the exit status (0 after --help,
 * 2 after a message for a bad command line). */
static int parse_cli(int argc, char **argv, cli *c) {
  c->model = NT_MODEL_GPT;
  /* the model picks the defaults, so find it first */
  for (int i = 1; i < argc; i++) {
    const char *m = NULL;
    if (!strcmp(argv[i], "--model") && i + 1 < argc) m = argv[i + 1];
    else if (!strncmp(argv[i], "--model=", 8)) m = argv[i] + 8;
    else if (i == 1 && argv[i][0] != '-') m = argv[i];
    if (m && strcmp(m, "gpt") && strcmp(m, "cnn")) return bad("model", m, "expected gpt or cnn");
    if (m) c->model = strcmp(m, "cnn") ? NT_MODEL_GPT : NT_MODEL_CNN;   /* the last one wins */
  }
  nt_train_options o = nt_train_defaults(c->model);
  o.keep_checkpoints = NT_CHECKPOINT_KEEP_DEFAULT;
  /* Settings the library takes from the program: the context options (core/ctx.h) from the
   * environment's NT_* names, then from each --kernel-opt key=value (taken out of argv here,
   * before the other options are parsed); the data folder from NT_DATA_DIR (gpt) or
   * NT_FASHION_DIR (cnn) unless --data-dir gives one. */
  c->ctx_opts = nt_ctx_options_default();
  if (nt_ctx_options_from_env(&c->ctx_opts)) return 2;
  int kept_args = 1;
  for (int i = 1; i < argc; i++) {
    const char *kv = !strncmp(argv[i], "--kernel-opt=", 13) ? argv[i] + 13 : NULL;
    if (!strcmp(argv[i], "--kernel-opt")) {
      if (i + 1 == argc) return bad("kernel-opt", "", "expected key=value");
      kv = argv[++i];
    }
    if (!kv) argv[kept_args++] = argv[i];
    else if (nt_ctx_options_set_pair(&c->ctx_opts, kv))
      return bad("kernel-opt", kv, "expected key=value with a key and value of core/ctx.h");
  }
  argc = kept_args;
  argv[argc] = NULL;
  const char *data_env = getenv(c->model == NT_MODEL_GPT ? "NT_DATA_DIR" : "NT_FASHION_DIR");
  if (data_env && *data_env) o.data_dir = data_env;
  bool dtype_given = false, gpt2 = false, data_given = false;
  c->device_index = 0;
  c->device_given = false;
  c->want_cuda = nt_cuda_device_count() > 0;
  c->dist = (dist_cli){"auto", NT_DIST_DEFAULT_TIMEOUT_S, false};
  int ch;
  opterr = 0;
  optind = 0;   /* full re-initialisation (the parser may run more than once) */
  c->n_given = 0;
  while ((ch = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    const char *name = opt_name(ch);
    bool seen = false;
    for (int i = 0; i < c->n_given; i++) seen |= c->given[i] == name;
    if (!seen && strcmp(name, "?") && c->n_given < (int)(sizeof c->given / sizeof c->given[0]))
      c->given[c->n_given++] = name;
    double d = 0;
    int64_t n = 0;
    const opt_range *r = range_of(ch);
    if (r) {
      int rc = parse_ranged(r, name, optarg, &n, &d);
      if (rc) return rc;
    }
    switch (ch) {
    case O_MODEL: break;
    case O_DEVICE:
      c->device_given = true;
      if (!strcmp(optarg, "cpu")) c->want_cuda = false;
      else if (!strcmp(optarg, "cuda")) c->want_cuda = true;
      else if (!strncmp(optarg, "cuda:", 5) && optarg[5] >= '0' && optarg[5] <= '9' &&
               strlen(optarg + 5) <= 4 && strspn(optarg + 5, "0123456789") == strlen(optarg + 5)) {
        c->want_cuda = true;
        c->device_index = atoi(optarg + 5);
        c->device_index_given = true;
      } else return bad(name, optarg, "expected cpu, cuda or cuda:N");
      break;
    case O_DTYPE:
      if (nt_precision_parse(NULL, optarg, &o.precision))
        return bad(name, optarg, "expected fp32, tf32, bf16, fp16 or fp8");
      dtype_given = true;
      break;
    case O_BATCH: o.batch_size = n; break;
    case O_LR: o.lr = d; break;
    case O_MIN_LR: o.min_lr = d; break;
    case O_WD: o.weight_decay = d; break;
    case O_BETA1: o.beta1 = d; break;
    case O_BETA2: o.beta2 = d; break;
    case O_EPS: o.eps = d; break;
    case O_MAX_ITERS: o.max_iters = n; break;
    case O_EPOCHS: o.epochs = (int)n; break;
    case O_WARMUP: o.warmup_iters = n; break;
    case O_DECAY_ITERS: o.lr_decay_iters = n; break;
    case O_NO_DECAY: o.decay_lr = false; break;
    case O_INIT_SCALE: o.init_scale = (float)d; break;
    case O_GROWTH_INTERVAL: o.growth_interval = (int)n; break;
    case O_GROWTH_FACTOR: o.growth_factor = (float)d; break;
    case O_BACKOFF: o.backoff_factor = (float)d; break;
    case O_CLIP: o.grad_clip = d; break;
    case O_DROPOUT: o.gpt.dropout = o.cnn.dropout = (float)d; break;
    case O_NLAYER: o.gpt.n_layer = (int)n; break;
    case O_NHEAD: o.gpt.n_head = (int)n; break;
    case O_NEMBD: o.gpt.n_embd = (int)n; break;
    case O_BLOCK: o.gpt.block_size = (int)n; break;
    case O_VOCAB: o.gpt.vocab_size = (int)n; break;
    case O_HEAD_ROWS: o.gpt.head_rows = (int)n; break;
    case O_PRESET: {
      int head_rows = o.gpt.head_rows;   /* not part of the model: a preset keeps it */
      if (!strcmp(optarg, "gpt2")) {
        o.gpt = nt_gpt_config_gpt2();
        gpt2 = true;
      } else if (!strcmp(optarg, "shakespeare-char") || !strcmp(optarg, "shakespeare_char")) {
        o.gpt = nt_gpt_config_shakespeare_char();
      } else {
        return bad(name, optarg, "expected shakespeare-char or gpt2");
      }
      o.gpt.head_rows = head_rows;
      break;
    }
    case O_DATA:
      o.gpt_data = optarg;
      data_given = true;
      break;
    case O_WIDTHS: {
      int w[3];
      if (!nt_parse_int_list(optarg, 3, 1, NT_MAX_CNN_WIDTH, w))
        return bad(name, optarg, "expected three integers C1,C2,HIDDEN in [1, 65536]");
      o.cnn.c1 = w[0];
      o.cnn.c2 = w[1];
      o.cnn.hidden = w[2];
      break;
    }
    case O_SEED: o.seed = (uint64_t)n; break;
    case O_EVAL_INTERVAL: o.eval_interval = n; break;
    case O_EVAL_ITERS: o.eval_iters = n; break;
    case O_LOG_INTERVAL: o.log_interval = n; break;
    case O_METRICS_INTERVAL: o.metrics_interval = n; break;
    case O_WORKERS: o.num_workers = (int)n; break;
    case O_DATA_DIR: o.data_dir = optarg; break;
    case O_OUT_DIR: o.out_dir = optarg; break;
    case O_RESUME: o.resume = optarg; break;
    case O_CKPT_INTERVAL: o.checkpoint_interval = n; break;
    case O_KEEP_CKPT: o.keep_checkpoints = (int)n; break;
    case O_SAMPLE: o.sample_tokens = (int)n; break;
    case O_TEMP: o.temperature = (float)d; break;
    case O_TOPK: o.top_k = (int)n; break;
    case O_GRAPH: o.cuda_graph = 1; break;
    case O_NO_GRAPH: o.cuda_graph = 0; break;
    case O_PROGRESS: o.progress = 1; break;
    case O_NO_PROGRESS: o.progress = 0; break;
    case O_AUGMENT: o.augment = true; break;
    case O_TRAIN_SUBSET: o.train_subset = n; break;
    case O_TEST_SUBSET: o.test_subset = n; break;
    case O_QUIET: o.quiet = true; break;
    case O_TRACE: o.trace = true; break;
    case O_SHARDING: case O_RESHARD: case O_LIMIT_GATHERS: case O_BWD_PREFETCH:
    case O_FWD_PREFETCH: case O_PARAM_DTYPE: case O_REDUCE_DTYPE: case O_ACCUM:
    case O_DIST_TIMEOUT: case O_DIST_BACKEND: case O_DIST_FINGERPRINT: case O_CKPT_FORMAT:
      if (dist_option(ch, name, optarg, &o, &c->dist)) return 2;
      break;
    case 'h':
    case O_HELP: usage(stdout); return 0;
    case ':':
      fprintf(stderr, "nanotrain: --%s needs a value\nTry 'nanotrain --help'.\n",
              opt_name(optopt));
      return 2;
    default:
      fprintf(stderr, "nanotrain: unknown option '%s'\nTry 'nanotrain --help'.\n",
              argv[optind - 1]);
      return 2;
    }
  }
  for (int i = optind; i < argc; i++) {
    if (!strcmp(argv[i], "gpt") || !strcmp(argv[i], "cnn")) continue;
    fprintf(stderr, "nanotrain: unexpected argument '%s'\nTry 'nanotrain --help'.\n", argv[i]);
    return 2;
  }
  if (c->model == NT_MODEL_GPT && o.gpt.n_embd % o.gpt.n_head) {
    char why[96];
    snprintf(why, sizeof why, "must divide --n-embd (%d)", o.gpt.n_embd);
    char val[24];
    snprintf(val, sizeof val, "%d", o.gpt.n_head);
    return bad("n-head", val, why);
  }
  if (gpt2 && !data_given) o.gpt_data = "synthetic";
  /* NT_PROFILE_ITERS="a:b": iterations a..b-1 are the profiler's range (ncu/nsys started
   * with the capture off) */
  const char *pr = getenv("NT_PROFILE_ITERS");
  long long pa, pb;
  if (pr && sscanf(pr, "%lld:%lld", &pa, &pb) == 2) {
    o.profile_iters.from = pa;
    o.profile_iters.to = pb;
  }
  /* as nanoGPT: a resumed run keeps writing into the checkpoint's out-dir (the parent of a
   * ckpt-<step> directory given directly) */
  struct stat sb;
  if (o.resume && !o.out_dir && stat(o.resume, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST.json", o.resume);
    if (stat(manifest, &sb) == 0) {
      char *p = c->resume_parent;
      snprintf(p, sizeof c->resume_parent, "%s", o.resume);
      size_t n = strlen(p);
      while (n > 1 && p[n - 1] == '/') p[--n] = 0;
      char *slash = strrchr(p, '/');
      if (!slash) snprintf(p, sizeof c->resume_parent, ".");
      else if (slash == p) p[1] = 0;
      else *slash = 0;
      o.out_dir = p;
    } else {
      o.out_dir = o.resume;
    }
  }
  if (c->model == NT_MODEL_GPT && gpt2) {
    if (o.lr_decay_iters == 5000 && o.max_iters != 5000) o.lr_decay_iters = o.max_iters;
  }
  if (!dtype_given) o.precision = c->want_cuda ? NT_PREC_BF16 : NT_PREC_FP32;
  o.given = c->given;
  o.n_given = c->n_given;
  c->o = o;
  return -1;
}

#ifndef NT_CLI_NO_MAIN
int main(int argc, char **argv) {
  cli c;
  memset(&c, 0, sizeof c);
  int rc = parse_cli(argc, argv, &c);
  if (rc >= 0) return rc;
  nt_train_options o = c.o;
  nt_model_kind model = c.model;
  bool want_cuda = c.want_cuda, device_given = c.device_given;
  int device_index = c.device_index;
  if (want_cuda && nt_cuda_device_count() == 0) {
    fprintf(stderr, "nanotrain: --device %s: no usable GPU (or built without CUDA)\n",
            device_given ? "cuda" : "auto");
    return 2;
  }
  /* data parallel: who this process is (mpirun, torchrun-style or srun), before the context;
   * the GPU is the local rank's unless --device cuda:K chose one; rank 0 alone prints and
   * writes (and locks the out-dir) */
  nt_dist_launch launch;
  if (nt_dist_launch_from_env(NULL, &launch)) return 2;
  if (want_cuda && !c.device_index_given) device_index = launch.local_rank % nt_cuda_device_count();
  o.rank = launch.rank;
  o.world_size = launch.world;
  if (launch.rank != 0) o.quiet = true;
  o.device = want_cuda ? nt_cuda(device_index) : nt_cpu();
  nt_ctx *ctx = NULL;
  if (nt_ctx_create_with(&ctx, o.device, &c.ctx_opts)) {
    fprintf(stderr, "nanotrain: cannot create the %s context: %s\n",
            want_cuda ? "CUDA" : "CPU", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  nt_outdir_lock *lock = NULL;
  if (o.out_dir && launch.rank == 0 && nt_outdir_lock_take(ctx, o.out_dir, &lock)) {
    fprintf(stderr, "nanotrain: %s\n", nt_last_error(ctx));
    nt_ctx_free(ctx);
    return 1;
  }
  if (nt_stop_install()) fprintf(stderr, "nanotrain: warning: cannot install signal handlers\n");
  nt_comm *comm = NULL;
  nt_status st = make_comm(ctx, &launch, &o, &c.dist, want_cuda, &comm);
  o.dist.comm = comm;
  nt_train_result res;
  memset(&res, 0, sizeof res);
  if (!st) st = nt_train_run(ctx, &o, &res);
  rc = 0;
  if (st) {
    fprintf(stderr, "nanotrain: rank %d: %s: %s\n", launch.rank, nt_status_str(st),
            nt_last_error(ctx));
    rc = st == NT_ERR_INVALID_ARG ? 2 : 1;
  } else if (launch.rank == 0) {
    if (model == NT_MODEL_GPT)
      printf("%s: %lld steps, final val loss %.4f, best val loss %.4f, train loss %.4f",
             res.stopped ? "stopped" : "done", (long long)res.steps, res.val_loss,
             res.best_val_loss, res.train_loss);
    else
      printf("%s: %lld steps, test accuracy %.2f%%", res.stopped ? "stopped" : "done",
             (long long)res.steps, 100 * res.test_accuracy);
    if (res.items_per_sec > 0)
      printf(", %.0f %s/s", res.items_per_sec, model == NT_MODEL_GPT ? "tokens" : "images");
    printf("%s\n", res.used_cuda_graph ? " (CUDA graph)" : "");
    if (o.out_dir)
      printf("logs: %s/metrics.jsonl, %s/metrics.prom; checkpoints: %s/ckpt-<step>/ (newest: "
             "%s/latest)\n", o.out_dir, o.out_dir, o.out_dir, o.out_dir);
  }
  if (nt_stop_exit_code()) rc = nt_stop_exit_code();
  nt_train_result_free(&res);
  nt_outdir_unlock(lock);
  if (st && comm && nt_comm_world(comm) > 1) {   /* the other ranks must not wait for us */
    fflush(stdout);
    fflush(stderr);
    nt_comm_abort(ctx, comm);
  }
  nt_comm_free(ctx, comm);
  nt_ctx_free(ctx);
  nt_dist_mpi_finalize();
  return rc;
}
#endif
