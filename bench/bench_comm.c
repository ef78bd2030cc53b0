/* Bandwidth of our communicator's collectives (dist/comm.h), in the manner of nccl-tests:
 * all-reduce (SUM, in place), reduce-scatter and all-gather, at the sizes of our units (GPT-2
 * 124M's and the small GPT's: the embeddings, one block, ln_f; fp32 and the dtype given) and a
 * sweep of powers of two from 64 KiB to 256 MiB.
 *
 *   mpirun -np N bench_comm [--device cpu|cuda] [--backend auto|mpi|nccl] [--dtype f32|bf16|f16]
 *                           [--min-bytes B] [--max-bytes B] [--iters K] [--windows W]
 *                           [--no-units] [--no-sweep] [--timeout S]
 *   --min-bytes, --max-bytes (64K, 256M by default; suffixes K, M, G) bound the sweep; the units
 *   are measured up to --max-bytes, however small.
 *   (also torchrun-style RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT with NCCL; one process
 *   alone measures world 1)
 *
 * Sizes are the whole buffer in bytes: the all-reduce's buffer, the reduce-scatter's input and
 * the all-gather's output (each rank's shard is 1/N of it, the buffer rounded up to a multiple
 * of N elements), as nccl-tests count them. One window issues K back-to-back collectives; its
 * time is read from CUDA events on the compute stream around them (the communicator's stream
 * waits for the start event and the compute stream for the last collective) on a GPU, or from
 * the host clock on the CPU (the MPI backend's collectives finish on the host). Each window is
 * preceded by a barrier; a window's time is the slowest rank's, and the figure is the median
 * of W windows after two warm-up windows, divided by K.
 *
 * What the columns mean (NCCL's doc/PERFORMANCE.md, in our words): algbw = size / time is what
 * a user sees moving through the call; busbw rescales it by how much data each rank must send
 * or receive for that collective with an optimal algorithm, so that it can be held against the
 * link's peak whatever N is: all-reduce moves 2 (N-1)/N of the buffer per rank (a
 * reduce-scatter then an all-gather), reduce-scatter and all-gather (N-1)/N each. At N = 1
 * busbw is 0 (nothing crosses a link).
 *
 * Before timing, every (collective, size) is checked once: rank r contributes r + 1 (and its
 * rank in the all-gather), and the result must be exact. Output: one "RESULT op label bytes
 * time_us algbw_GBps busbw_GBps" line per case, then a table. Exit 1 on an error or a wrong
 * result. */
#include "core/nt.h"
#include "core/stream.h"
#include "dist/comm.h"
#include "models/gpt.h"
#include "tools/launch_env.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { ALL_REDUCE = 0, REDUCE_SCATTER, ALL_GATHER } op_kind;
static const char *op_name[] = {"all_reduce", "reduce_scatter", "all_gather"};

typedef struct {
  char label[48];
  int64_t bytes;
} size_case;

typedef struct {
  nt_ctx *ctx;
  nt_comm *comm;
  int rank, world;
  nt_dtype dt;
  int iters, windows;
  nt_event *ev0, *ev1;
} bench;

static void die(bench *b, nt_status st, const char *what) {
  if (!st) return;
  fprintf(stderr, "bench_comm: rank %d: %s: %s\n", b->rank, what, nt_last_error(b->ctx));
  if (b->comm && b->world > 1) nt_comm_abort(b->ctx, b->comm);
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

/* A GPT's units in elements, as models/gpt.c lays them out (every parameter padded to 16
 * elements): the embeddings (wte over the padded vocabulary, wpe), one block, ln_f. Checked
 * against nt_gpt_estimate's flat total. */
static void gpt_units(bench *b, const char *name, nt_gpt_config c, size_case *out, int *n) {
  int64_t C = c.n_embd, Vp = nt_gpt_padded_vocab(&c);
  int64_t emb = round16(Vp * C) + round16((int64_t)c.block_size * C);
  int64_t block = 4 * round16(C) + round16(3 * C * C) + round16(3 * C) + round16(C * C) +
                  round16(C) + round16(4 * C * C) + round16(4 * C) + round16(4 * C * C) +
                  round16(C);   /* ln_1, ln_2; c_attn, attn.c_proj, c_fc, mlp.c_proj */
  int64_t lnf = 2 * round16(C);
  nt_model_sizes ms;
  die(b, nt_gpt_estimate(b->ctx, &c, NT_F32, 1, 1, &ms), "nt_gpt_estimate");
  if (ms.n_flat != emb + c.n_layer * block + lnf) {
    fprintf(stderr, "bench_comm: %s: unit sizes %lld + %d x %lld + %lld do not add up to the "
            "model's %lld\n", name, (long long)emb, c.n_layer, (long long)block, (long long)lnf,
            (long long)ms.n_flat);
    exit(1);
  }
  const char *what[3] = {"embeddings", "block", "ln_f"};
  int64_t elems[3] = {emb, block, lnf};
  size_t es = nt_dtype_size(b->dt);
  for (int i = 0; i < 3; i++) {
    snprintf(out[*n].label, sizeof out[*n].label, "%s.%s", name, what[i]);
    out[(*n)++].bytes = elems[i] * (int64_t)es;
  }
}

/* The buffers of one case: full (count elements) and shard (count / world). */
typedef struct {
  nt_tensor full, shard;
  int64_t count;
} bufs;

static void fill(bench *b, nt_tensor *t, float v) {
  int64_t n = nt_tensor_numel(t);
  float *h = malloc((size_t)n * sizeof *h);
  if (!h) die(b, NT_ERR_OOM, "host memory");
  for (int64_t i = 0; i < n; i++) h[i] = v;
  nt_tensor src = nt_tensor_view(h, NT_F32, nt_cpu(), 1, &n), tmp = {0};
  nt_status st = NT_OK;
  if (t->dtype == NT_F32) {
    st = nt_tensor_copy(b->ctx, t, &src);
  } else {   /* convert on the host side's copy of the dtype */
    st = nt_tensor_alloc(b->ctx, &tmp, NT_F32, 1, &n);
    if (!st) st = nt_tensor_copy(b->ctx, &tmp, &src);
    if (!st) st = nt_convert(b->ctx, t, &tmp);
  }
  if (!st) st = nt_ctx_synchronize(b->ctx);
  nt_tensor_free(b->ctx, &tmp);
  free(h);
  die(b, st, "filling a buffer");
}

/* Element i of t as float (a host read-back; synchronizes). */
static float *read_back(bench *b, const nt_tensor *t) {
  int64_t n = nt_tensor_numel(t);
  float *h = malloc((size_t)n * sizeof *h);
  nt_tensor dst = nt_tensor_view(h, NT_F32, nt_cpu(), 1, &n), tmp = {0};
  nt_status st = h ? NT_OK : NT_ERR_OOM;
  if (!st && t->dtype == NT_F32) {
    st = nt_tensor_copy(b->ctx, &dst, t);
  } else if (!st) {
    st = nt_tensor_alloc(b->ctx, &tmp, NT_F32, 1, &n);
    if (!st) st = nt_convert(b->ctx, &tmp, t);
    if (!st) st = nt_tensor_copy(b->ctx, &dst, &tmp);
  }
  if (!st) st = nt_ctx_synchronize(b->ctx);
  nt_tensor_free(b->ctx, &tmp);
  die(b, st, "reading a result back");
  return h;
}

static nt_status issue(bench *b, op_kind op, bufs *x) {
  switch (op) {
  case ALL_REDUCE: return nt_comm_all_reduce(b->comm, b->ctx, &x->full, NT_REDUCE_SUM);
  case REDUCE_SCATTER: return nt_comm_reduce_scatter(b->comm, b->ctx, &x->full, &x->shard);
  default: return nt_comm_all_gather(b->comm, b->ctx, &x->shard, &x->full);
  }
}

/* One call with known inputs; the result must be exact (small integers in every dtype). */
static void check(bench *b, op_kind op, bufs *x, const char *label) {
  int W = b->world;
  fill(b, &x->full, (float)(b->rank + 1));
  fill(b, &x->shard, (float)(b->rank + 1));
  die(b, issue(b, op, x), op_name[op]);
  die(b, nt_comm_synchronize(b->comm, b->ctx), "synchronize");
  die(b, nt_comm_wait_seq(b->comm, b->ctx, nt_comm_seq(b->comm)), "wait");
  const nt_tensor *out = op == REDUCE_SCATTER ? &x->shard : &x->full;
  float *h = read_back(b, out);
  int64_t n = nt_tensor_numel(out), per = x->count / W, bad = -1;
  float sum = (float)W * (float)(W + 1) / 2.0f;
  for (int64_t i = 0; i < n && bad < 0; i++) {
    float want = op == ALL_GATHER ? (float)(i / per + 1) : sum;
    if (h[i] != want) bad = i;
  }
  if (bad >= 0) {
    fprintf(stderr, "bench_comm: rank %d: %s %s: element %lld is %g, expected %g\n", b->rank,
            op_name[op], label, (long long)bad, (double)h[bad],
            op == ALL_GATHER ? (double)(bad / per + 1) : (double)sum);
    free(h);
    if (b->world > 1) nt_comm_abort(b->ctx, b->comm);
    exit(1);
  }
  free(h);
}

/* Seconds per call in one window of b->iters calls (this rank's view). */
static double window(bench *b, op_kind op, bufs *x) {
  die(b, nt_comm_barrier(b->comm, b->ctx), "barrier");
  bool cuda = nt_ctx_is_cuda(b->ctx);
  double t0 = now_s();
  if (cuda) die(b, nt_event_record(b->ctx, b->ev0, NULL), "event");
  for (int k = 0; k < b->iters; k++) die(b, issue(b, op, x), op_name[op]);
  die(b, nt_comm_wait_seq(b->comm, b->ctx, nt_comm_seq(b->comm)), "wait");
  if (!cuda) {
    die(b, nt_comm_synchronize(b->comm, b->ctx), "synchronize");
    return (now_s() - t0) / b->iters;
  }
  float ms = 0;
  die(b, nt_event_record(b->ctx, b->ev1, NULL), "event");
  die(b, nt_event_synchronize(b->ctx, b->ev1), "event");
  die(b, nt_event_elapsed_ms(b->ctx, b->ev0, b->ev1, &ms), "event");
  return 1e-3 * ms / b->iters;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median over windows of the slowest rank's time per call. */
static double measure(bench *b, op_kind op, bufs *x) {
  for (int w = 0; w < 2; w++) window(b, op, x);   /* warm-up */
  double *per = calloc((size_t)b->windows, sizeof *per);
  double *all = calloc((size_t)b->world, sizeof *all);
  if (!per || !all) die(b, NT_ERR_OOM, "host memory");
  for (int w = 0; w < b->windows; w++) {
    double t = window(b, op, x);
    die(b, nt_comm_gather_bytes(b->comm, b->ctx, &t, sizeof t, all), "gathering times");
    per[w] = 0;
    for (int r = 0; r < b->world; r++) per[w] = all[r] > per[w] ? all[r] : per[w];
  }
  qsort(per, (size_t)b->windows, sizeof *per, cmp_double);
  double med = per[b->windows / 2];
  free(per);
  free(all);
  return med;
}

static int64_t parse_bytes(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (int64_t)v;
}

int main(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  const char *device = "cpu", *backend = "auto", *dtype = "f32";
  int64_t min_bytes = 64 << 10, max_bytes = 256 << 20;
  bool units = true, sweep = true;
  double timeout = 120;
  b.iters = 20;
  b.windows = 5;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-units")) units = false;
    else if (!strcmp(a, "--no-sweep")) sweep = false;
    else if (!v) { fprintf(stderr, "bench_comm: %s needs a value (see the header)\n", a); return 2; }
    else if (!strcmp(a, "--device")) device = v, i++;
    else if (!strcmp(a, "--backend")) backend = v, i++;
    else if (!strcmp(a, "--dtype")) dtype = v, i++;
    else if (!strcmp(a, "--min-bytes")) min_bytes = parse_bytes(v), i++;
    else if (!strcmp(a, "--max-bytes")) max_bytes = parse_bytes(v), i++;
    else if (!strcmp(a, "--iters")) b.iters = atoi(v), i++;
    else if (!strcmp(a, "--windows")) b.windows = atoi(v), i++;
    else if (!strcmp(a, "--timeout")) timeout = atof(v), i++;
    else { fprintf(stderr, "bench_comm: unknown option %s (see the header)\n", a); return 2; }
  }
  if (b.iters < 1 || b.windows < 1 || min_bytes < 1 || max_bytes < min_bytes ||
      !nt_dtype_parse(dtype, &b.dt) || (b.dt != NT_F32 && b.dt != NT_BF16 && b.dt != NT_F16)) {
    fprintf(stderr, "bench_comm: bad --iters, --windows, byte range or --dtype\n");
    return 2;
  }
  nt_dist_launch launch;
  if (nt_dist_launch_from_env(NULL, &launch)) return 2;
  b.rank = launch.rank;
  b.world = launch.world;
  bool cuda = !strcmp(device, "cuda");
  nt_device dev = cuda ? nt_cuda(launch.local_rank % (nt_cuda_device_count() > 0
                                                          ? nt_cuda_device_count() : 1))
                       : nt_cpu();
  if (nt_ctx_create(&b.ctx, dev)) {
    fprintf(stderr, "bench_comm: cannot create the %s context\n", device);
    return 1;
  }
  nt_comm_options co = {NT_COMM_LOCAL, &launch, timeout, false};
  if (!strcmp(backend, "nccl") || (!strcmp(backend, "auto") && cuda)) co.backend = NT_COMM_NCCL;
  else if (!strcmp(backend, "mpi") || (!strcmp(backend, "auto") && b.world > 1))
    co.backend = NT_COMM_MPI;
  die(&b, nt_comm_create(b.ctx, &co, &b.comm), "creating the communicator");
  if (cuda) {
    die(&b, nt_event_create(b.ctx, &b.ev0, true), "event");
    die(&b, nt_event_create(b.ctx, &b.ev1, true), "event");
  }
  size_case cases[64];
  int n = 0;
  if (units) {
    gpt_units(&b, "gpt2", nt_gpt_config_gpt2(), cases, &n);
    gpt_units(&b, "small", nt_gpt_config_shakespeare_char(), cases, &n);
  }
  int kept = 0;   /* the units up to max_bytes (memory and time on a small machine) */
  for (int i = 0; i < n; i++)
    if (cases[i].bytes <= max_bytes) cases[kept++] = cases[i];
  n = kept;
  for (int64_t s = 64 << 10; sweep && s <= (int64_t)256 << 20 && n < 64; s *= 2) {
    if (s < min_bytes || s > max_bytes) continue;
    snprintf(cases[n].label, sizeof cases[n].label, "sweep");
    cases[n++].bytes = s;
  }
  if (n == 0) {
    fprintf(stderr, "bench_comm: no size within --min-bytes .. --max-bytes\n");
    return 2;
  }
  size_t es = nt_dtype_size(b.dt);
  double res[64][3];
  if (b.rank == 0)
    printf("# bench_comm: %s backend, world %d, %s, %s; %d calls per window, median of %d "
           "windows\n", nt_comm_backend_name(nt_comm_backend_of(b.comm)), b.world,
           nt_dtype_name(b.dt), cuda ? "device buffers (CUDA events)" : "host buffers (host "
           "clock)", b.iters, b.windows);
  for (int i = 0; i < n; i++) {
    bufs x;
    memset(&x, 0, sizeof x);
    int64_t elems = cases[i].bytes / (int64_t)es;
    x.count = (elems + b.world - 1) / b.world * b.world;
    int64_t per = x.count / b.world;
    die(&b, nt_tensor_alloc(b.ctx, &x.full, b.dt, 1, &x.count), "allocating");
    die(&b, nt_tensor_alloc(b.ctx, &x.shard, b.dt, 1, &per), "allocating");
    for (int op = 0; op < 3; op++) {
      check(&b, (op_kind)op, &x, cases[i].label);
      double t = measure(&b, (op_kind)op, &x);
      double bytes = (double)x.count * (double)es, algbw = bytes / t / 1e9;
      double factor = op == ALL_REDUCE ? 2.0 * (b.world - 1) / b.world
                                       : (double)(b.world - 1) / b.world;
      res[i][op] = t;
      if (b.rank == 0)
        printf("RESULT %s %s %.0f %.2f %.3f %.3f\n", op_name[op], cases[i].label, bytes, 1e6 * t,
               algbw, algbw * factor);
    }
    nt_tensor_free(b.ctx, &x.full);
    nt_tensor_free(b.ctx, &x.shard);
  }
  if (b.rank == 0) {
    printf("\n%-20s %12s | %-27s | %-27s | %-27s\n", "", "", "all_reduce", "reduce_scatter",
           "all_gather");
    printf("%-20s %12s |", "case", "bytes");
    for (int op = 0; op < 3; op++) printf(" %9s %8s %8s |", "us", "algbw", "busbw");
    printf("\n");
    for (int i = 0; i < n; i++) {
      double bytes = (double)((cases[i].bytes / (int64_t)es + b.world - 1) / b.world * b.world) *
                     (double)es;
      printf("%-20s %12.0f |", cases[i].label, bytes);
      for (int op = 0; op < 3; op++) {
        double algbw = bytes / res[i][op] / 1e9;
        double factor = op == ALL_REDUCE ? 2.0 * (b.world - 1) / b.world
                                         : (double)(b.world - 1) / b.world;
        printf(" %9.1f %8.2f %8.2f |", 1e6 * res[i][op], algbw, algbw * factor);
      }
      printf("\n");
    }
    printf("(GB/s = 1e9 bytes/s; busbw = algbw x 2(N-1)/N for all_reduce, x (N-1)/N for "
           "reduce_scatter and all_gather)\n");
  }
  nt_event_free(b.ctx, b.ev0);
  nt_event_free(b.ctx, b.ev1);
  nt_comm_free(b.ctx, b.comm);
  nt_ctx_free(b.ctx);
  nt_dist_mpi_finalize();
  return 0;
}
