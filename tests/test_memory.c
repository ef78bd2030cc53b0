/* The caching allocator on a CPU context (the same cache logic a CUDA context uses): reuse,
 * split and merge, a training-step pattern reaching a steady state, exact statistics, the
 * out-of-memory path, stream-held blocks, foreign frees, many threads at once, and the
 * exact-size mode for sanitizers (mem_cache off). */
#include "tests/testutil.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static nt_ctx *new_ctx(void) {
  nt_ctx *ctx = NULL;
  if (nt_ctx_create(&ctx, nt_cpu())) {
    fprintf(stderr, "cpu ctx: %s\n", nt_last_error(ctx));
    exit(1);
  }
  return ctx;
}

static nt_mem_stats stats(nt_ctx *ctx) {
  nt_mem_stats s;
  nt_mem_get_stats(ctx, &s);
  return s;
}

static void test_reuse(void) {
  nt_ctx *ctx = new_ctx();
  void *a, *b;
  CHECK_OK(ctx, nt_alloc(ctx, 1000, &a));
  CHECK(((uintptr_t)a % 512) == 0, "alignment");
  nt_free(ctx, a);
  CHECK_OK(ctx, nt_alloc(ctx, 1000, &b));
  nt_mem_stats s = stats(ctx);
  CHECK(a == b, "same block handed out again");
  CHECK(s.n_system_allocs == 1 && s.n_allocs == 2 && s.n_frees == 1, "sys %llu allocs %llu",
        (unsigned long long)s.n_system_allocs, (unsigned long long)s.n_allocs);
  /* A size in the same rounding class reuses the block too. */
  nt_free(ctx, b);
  CHECK_OK(ctx, nt_alloc(ctx, 700, &b));
  CHECK(a == b && stats(ctx).n_system_allocs == 1, "700 B reuses the 1024 B block");
  nt_free(ctx, b);
  /* Zero bytes still gives a distinct, freeable block. */
  CHECK_OK(ctx, nt_alloc(ctx, 0, &b));
  CHECK(b != NULL, "alloc(0) returns a block");
  nt_free(ctx, b);
  nt_free(ctx, NULL);
  nt_ctx_free(ctx);
}

/* Exact numbers for a scripted sequence (sizes per the scheme in core/memory.h). */
static void test_stats_exact(void) {
  nt_ctx *ctx = new_ctx();
  void *a, *b, *c;
  nt_mem_stats s = stats(ctx);
  CHECK(s.reserved == 0 && s.allocated == 0 && s.fragmentation == 0.0, "fresh pool");

  CHECK_OK(ctx, nt_alloc(ctx, 1000, &a));          /* 1024 B from a 2 MiB small segment */
  s = stats(ctx);
  CHECK(s.allocated == 1024 && s.requested == 1000 && s.reserved == 2 * MiB,
        "a: allocated %zu requested %zu reserved %zu", s.allocated, s.requested, s.reserved);
  CHECK(s.fragmentation == 0.0, "one block split off a segment: no fragmentation (%g)",
        s.fragmentation);

  CHECK_OK(ctx, nt_alloc(ctx, 3 * MiB, &b));       /* large: a 20 MiB segment, split */
  s = stats(ctx);
  CHECK(s.allocated == 1024 + 3 * MiB && s.reserved == 22 * MiB && s.n_system_allocs == 2,
        "b: allocated %zu reserved %zu", s.allocated, s.reserved);
  double want = (double)(22 * MiB - (1024 + 3 * MiB) - 17 * MiB) / (double)(22 * MiB);
  CHECK(s.fragmentation == want, "fragmentation %g, want %g", s.fragmentation, want);

  /* 16 MiB from the 17 MiB rest: 1 MiB would remain, too little to split off in the large
   * pool, so the block keeps it and counts as 17 MiB allocated. */
  CHECK_OK(ctx, nt_alloc(ctx, 16 * MiB, &c));
  s = stats(ctx);
  CHECK(s.allocated == 1024 + 20 * MiB && s.requested == 1000 + 19 * MiB &&
        s.n_system_allocs == 2, "c: allocated %zu requested %zu", s.allocated, s.requested);
  CHECK((char *)c == (char *)b + 3 * MiB, "c follows b in the segment");

  nt_free(ctx, b);
  nt_free(ctx, c);                                  /* merges with b: one 20 MiB free block */
  s = stats(ctx);
  CHECK(s.allocated == 1024 && s.requested == 1000 && s.reserved == 22 * MiB, "after frees");
  CHECK(s.peak_allocated == 1024 + 20 * MiB && s.peak_reserved == 22 * MiB, "peaks %zu %zu",
        s.peak_allocated, s.peak_reserved);
  CHECK(s.fragmentation == (double)(2 * MiB - 1024) / (double)(22 * MiB), "merged: %g",
        s.fragmentation);
  void *d;
  CHECK_OK(ctx, nt_alloc(ctx, 19 * MiB, &d));
  CHECK(d == b && stats(ctx).n_system_allocs == 2, "merged block serves 19 MiB");
  nt_free(ctx, d);

  nt_mem_reset_peak(ctx);
  s = stats(ctx);
  CHECK(s.peak_allocated == 1024 && s.peak_reserved == 22 * MiB, "peak reset to current");

  nt_free(ctx, a);
  s = stats(ctx);
  CHECK(s.allocated == 0 && s.requested == 0 && s.n_allocs == 4 && s.n_frees == 4,
        "all freed: allocs %llu frees %llu", (unsigned long long)s.n_allocs,
        (unsigned long long)s.n_frees);
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  s = stats(ctx);
  CHECK(s.reserved == 0 && s.fragmentation == 0.0, "empty_cache: reserved %zu", s.reserved);
  CHECK(s.peak_reserved == 22 * MiB, "peak kept until reset");
  nt_ctx_free(ctx);
}

static void test_split_merge(void) {
  nt_ctx *ctx = new_ctx();
  char *p[4];
  for (int i = 0; i < 4; i++) CHECK_OK(ctx, nt_alloc(ctx, 512 * KiB, (void **)&p[i]));
  nt_mem_stats s = stats(ctx);
  CHECK(s.n_system_allocs == 1 && s.reserved == 2 * MiB, "4 x 512 KiB split one segment");
  for (int i = 1; i < 4; i++) CHECK(p[i] == p[i - 1] + 512 * KiB, "block %d adjacent", i);
  CHECK(s.fragmentation == 0.0, "full segment");

  nt_free(ctx, p[0]);
  nt_free(ctx, p[2]);                       /* two 512 KiB holes, not adjacent */
  s = stats(ctx);
  CHECK(s.fragmentation == 0.25, "two holes: fragmentation %g, want 0.25", s.fragmentation);
  char *q;
  CHECK_OK(ctx, nt_alloc(ctx, 1 * MiB, (void **)&q));   /* no 1 MiB hole: new segment */
  CHECK(stats(ctx).n_system_allocs == 2, "1 MiB does not fit in the holes");
  nt_free(ctx, q);

  nt_free(ctx, p[1]);                       /* merges p0, p1, p2 into a 1.5 MiB hole */
  s = stats(ctx);
  /* reserved 4 MiB, allocated 512 KiB (p3), largest free block the 2 MiB segment of q. */
  CHECK(s.fragmentation == 0.375, "merged hole: fragmentation %g, want 0.375", s.fragmentation);
  char *t;
  CHECK_OK(ctx, nt_alloc(ctx, 1 * MiB, (void **)&q));
  CHECK(q == p[0] && stats(ctx).n_system_allocs == 2,
        "best fit: the merged 1.5 MiB hole, not the free 2 MiB segment");
  CHECK_OK(ctx, nt_alloc(ctx, 300 * KiB, (void **)&t));
  CHECK(t == p[2], "best fit: the 512 KiB rest of the hole");
  nt_free(ctx, t);
  nt_free(ctx, q);
  nt_free(ctx, p[3]);
  s = stats(ctx);
  CHECK(s.allocated == 0 && s.reserved == 4 * MiB && s.fragmentation == 0.5,
        "two whole free segments: reserved %zu fragmentation %g", s.reserved, s.fragmentation);
  nt_ctx_free(ctx);
}

/* A training step: persistent weights, activations allocated through forward and freed in
 * reverse order through backward (with gradient temporaries), an optimizer temporary. */
static const size_t act_sizes[] = {4 * MiB, 12345, 1536 * KiB + 7, 777, 3 * MiB,
                                   48 * MiB + 3, 64 * KiB, 1, 11 * MiB + 511, 200 * KiB};
#define N_ACT (sizeof act_sizes / sizeof act_sizes[0])
#define N_LAYERS 6

static void training_step(nt_ctx *ctx, int fill) {
  void *acts[N_LAYERS][N_ACT];
  for (int l = 0; l < N_LAYERS; l++)
    for (size_t i = 0; i < N_ACT; i++) {
      size_t n = act_sizes[(i + (size_t)l) % N_ACT];
      if (!CHECK_OK(ctx, nt_alloc(ctx, n, &acts[l][i]))) return;
      if (fill) memset(acts[l][i], l, n < 4096 ? n : 4096);
    }
  void *loss;
  CHECK_OK(ctx, nt_alloc(ctx, 4, &loss));
  nt_free(ctx, loss);
  for (int l = N_LAYERS - 1; l >= 0; l--) {
    void *grad_tmp;
    CHECK_OK(ctx, nt_alloc(ctx, act_sizes[(size_t)l % N_ACT] + 13, &grad_tmp));
    for (int i = (int)N_ACT - 1; i >= 0; i--) nt_free(ctx, acts[l][i]);
    nt_free(ctx, grad_tmp);
  }
  void *opt_tmp;
  CHECK_OK(ctx, nt_alloc(ctx, 5 * MiB + 99, &opt_tmp));
  nt_free(ctx, opt_tmp);
}

static void test_training_pattern(void) {
  nt_ctx *ctx = new_ctx();
  void *weights[3];
  CHECK_OK(ctx, nt_alloc(ctx, 30 * MiB + 5, &weights[0]));
  CHECK_OK(ctx, nt_alloc(ctx, 333 * KiB, &weights[1]));
  CHECK_OK(ctx, nt_alloc(ctx, 7 * MiB, &weights[2]));
  size_t base_alloc = stats(ctx).allocated;
  training_step(ctx, 1);
  nt_mem_stats first = stats(ctx);
  CHECK(first.allocated == base_alloc, "step 1 returns everything");
  int steady = 1;
  for (int step = 2; step <= 100; step++) {
    training_step(ctx, step == 2);
    nt_mem_stats s = stats(ctx);
    if (s.n_system_allocs != first.n_system_allocs || s.reserved != first.reserved ||
        s.allocated != base_alloc) {
      steady = 0;
      fprintf(stderr, "step %d: system allocs %llu (step 1: %llu), reserved %zu (step 1: %zu)\n",
              step, (unsigned long long)s.n_system_allocs,
              (unsigned long long)first.n_system_allocs, s.reserved, first.reserved);
      break;
    }
  }
  CHECK(steady, "no system allocation and constant reserved after the first step");
  nt_mem_stats s = stats(ctx);
  CHECK(s.peak_reserved == first.reserved, "peak reserved %zu", s.peak_reserved);
  CHECK(s.fragmentation >= 0.0 && s.fragmentation <= 1.0, "fragmentation %g", s.fragmentation);
  char line[256];
  printf("  training pattern: %s\n", nt_mem_describe(ctx, line, sizeof line));
  for (int i = 0; i < 3; i++) nt_free(ctx, weights[i]);
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  CHECK(stats(ctx).reserved == 0, "empty cache after the run");
  nt_ctx_free(ctx);
}

/* Random alloc/free with every block filled with its own byte: overlapping blocks would
 * corrupt each other's contents. */
static void test_random_no_overlap(void) {
  nt_ctx *ctx = new_ctx();
  nt_test_rng rng = {7};
  enum { LIVE = 64 };
  unsigned char *live[LIVE] = {0};
  size_t sizes[LIVE] = {0};
  int bad = 0, frag_ok = 1;
  for (int it = 0; it < 4000; it++) {
    int k = (int)nt_test_uniform(&rng, 0, LIVE);
    if (live[k]) {
      /* Sampled: every byte near the ends, every 61st in between (cheap under ASan -O0). */
      for (size_t i = 0; i < sizes[k]; i += (i < 4096 || i + 4096 > sizes[k]) ? 1 : 61)
        bad += live[k][i] != (unsigned char)k;
      nt_free(ctx, live[k]);
      live[k] = NULL;
    } else {
      double u = nt_test_uniform(&rng, 0, 1);
      size_t n = u < 0.8 ? (size_t)nt_test_uniform(&rng, 1, 64 * KiB)
                         : (size_t)nt_test_uniform(&rng, 1, 6 * MiB);
      if (!CHECK_OK(ctx, nt_alloc(ctx, n, (void **)&live[k]))) break;
      sizes[k] = n;
      memset(live[k], k, n);
    }
    nt_mem_stats s = stats(ctx);
    frag_ok &= s.fragmentation >= 0.0 && s.fragmentation <= 1.0 && s.allocated <= s.reserved;
  }
  CHECK(bad == 0, "%d bytes overwritten by another block", bad);
  CHECK(frag_ok, "fragmentation stayed in [0, 1]");
  for (int k = 0; k < LIVE; k++) nt_free(ctx, live[k]);
  nt_mem_stats s = stats(ctx);
  CHECK(s.allocated == 0 && s.n_allocs == s.n_frees, "all returned");
  nt_ctx_free(ctx);
}

static void test_invalid_frees(void) {
  nt_ctx *ctx = new_ctx();
  printf("  (three 'ignored' errors expected below)\n");
  int on_stack;
  char *a;
  CHECK_OK(ctx, nt_alloc(ctx, 4096, (void **)&a));
  nt_mem_stats before = stats(ctx);
  nt_free(ctx, &on_stack);                   /* foreign pointer */
  nt_free(ctx, a + 512);                     /* inside a block */
  nt_free(ctx, a);
  nt_free(ctx, a);                           /* double free */
  nt_mem_stats s = stats(ctx);
  CHECK(s.n_invalid_frees == 3 && s.n_frees == before.n_frees + 1 && s.allocated == 0,
        "invalid frees %llu", (unsigned long long)s.n_invalid_frees);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_alloc_record_stream(ctx, a, (void *)0x1));
  void *pin;
  CHECK_OK(ctx, nt_pinned_alloc(ctx, 1000, &pin));
  CHECK(stats(ctx).pinned == 1024, "pinned %zu", stats(ctx).pinned);
  memset(pin, 1, 1000);
  nt_pinned_free(ctx, pin);
  nt_pinned_free(ctx, pin);                  /* logged, ignored */
  nt_pinned_free(ctx, NULL);
  CHECK(stats(ctx).pinned == 0, "pinned freed");
  nt_ctx_free(ctx);
}

/* A block recorded on another stream is held back at free; on a CPU context it is released
 * at the next allocation (CPU work is synchronous). */
static void test_record_stream_cpu(void) {
  nt_ctx *ctx = new_ctx();
  void *a, *b;
  void *other = (void *)0x1234;
  CHECK_OK(ctx, nt_alloc(ctx, 8 * KiB, &a));
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, a, other));
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, a, other));     /* twice: recorded once */
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, a, NULL));      /* own stream: nothing to do */
  nt_free(ctx, a);
  nt_mem_stats s = stats(ctx);
  CHECK(s.pending == 8 * KiB && s.allocated == 0, "held back: pending %zu", s.pending);
  CHECK_OK(ctx, nt_alloc(ctx, 8 * KiB, &b));
  s = stats(ctx);
  CHECK(s.pending == 0 && b == a && s.n_system_allocs == 1, "released and reused");
  nt_free(ctx, b);                          /* no stream recorded any more: immediate */
  CHECK(stats(ctx).pending == 0, "recorded streams do not outlive the block");
  /* Pending blocks are released by empty_cache and by destruction too. */
  CHECK_OK(ctx, nt_alloc(ctx, 8 * KiB, &a));
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, a, other));
  nt_free(ctx, a);
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  s = stats(ctx);
  CHECK(s.pending == 0 && s.reserved == 0, "empty_cache: pending %zu reserved %zu", s.pending,
        s.reserved);
  CHECK_OK(ctx, nt_alloc(ctx, 8 * KiB, &a));
  CHECK_OK(ctx, nt_alloc_record_stream(ctx, a, other));
  nt_free(ctx, a);
  nt_ctx_free(ctx);                         /* pending at destruction: no leak under ASan */
}

/* mem_cache off (sanitizer runs): each request is its own system allocation of exactly its
 * size, never a piece of another; a freed block serves only a request of the same size. */
static void test_no_cache(void) {
  nt_ctx_options o = nt_ctx_options_default();
  o.mem_cache = false;
  nt_ctx *ctx = NULL;
  if (!CHECK_OK(ctx, nt_ctx_create_with(&ctx, nt_cpu(), &o))) return;
  void *a, *b, *c;
  CHECK_OK(ctx, nt_alloc(ctx, 1000, &a));
  CHECK_OK(ctx, nt_alloc(ctx, 24, &b));
  nt_mem_stats s = stats(ctx);
  CHECK(s.reserved == 1024 && s.allocated == 1024 && s.n_system_allocs == 2,
        "exact sizes, one segment each: reserved %zu, allocated %zu, %llu system allocations",
        s.reserved, s.allocated, (unsigned long long)s.n_system_allocs);
  nt_free(ctx, a);
  CHECK_OK(ctx, nt_alloc(ctx, 999, &c));
  CHECK(c != a && stats(ctx).n_system_allocs == 3, "a smaller request gets its own block");
  nt_free(ctx, c);
  CHECK_OK(ctx, nt_alloc(ctx, 1000, &c));
  CHECK(c == a && stats(ctx).n_system_allocs == 3, "an equal request reuses the freed block");
  nt_free(ctx, b);
  nt_free(ctx, c);
  /* Out of memory with a larger block cached: the retry gives the cache back rather than
   * handing out the larger block. */
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  nt_mem_set_limit(ctx, 3000);
  CHECK_OK(ctx, nt_alloc(ctx, 2000, &a));
  nt_free(ctx, a);
  uint64_t flushes = stats(ctx).n_cache_flushes;
  CHECK_OK(ctx, nt_alloc(ctx, 1500, &c));
  s = stats(ctx);
  CHECK(s.reserved == 1500 && s.allocated == 1500 && s.n_cache_flushes == flushes + 1,
        "exact after an OOM retry: reserved %zu, allocated %zu, %llu flushes", s.reserved,
        s.allocated, (unsigned long long)(s.n_cache_flushes - flushes));
  nt_free(ctx, c);
  nt_ctx_free(ctx);
}

static void test_oom(void) {
  nt_ctx *ctx = new_ctx();
  nt_mem_set_limit(ctx, 21 * MiB);
  void *a, *b, *c;
  CHECK_OK(ctx, nt_alloc(ctx, 1 * MiB, &a));        /* 2 MiB segment */
  nt_free(ctx, a);                                  /* cached */
  CHECK_OK(ctx, nt_alloc(ctx, 20 * MiB, &b));       /* 2 + 20 > 21: flush the cache, retry */
  nt_mem_stats s = stats(ctx);
  CHECK(s.n_cache_flushes == 1 && s.reserved == 20 * MiB, "flushed: %llu, reserved %zu",
        (unsigned long long)s.n_cache_flushes, s.reserved);
  CHECK_ERR(ctx, NT_ERR_OOM, nt_alloc(ctx, 5 * MiB, &c));
  CHECK(c == NULL, "no pointer on failure");
  const char *msg = nt_last_error(ctx);
  CHECK(strstr(msg, "requested 5242880 bytes") && strstr(msg, "allocated") &&
        strstr(msg, "20971520 bytes") && strstr(msg, "reserved"), "message: %s", msg);
  CHECK(stats(ctx).allocated == 20 * MiB, "failed alloc changes nothing");
  nt_free(ctx, b);
  CHECK_OK(ctx, nt_alloc(ctx, 5 * MiB, &c));        /* the pool still works */
  CHECK(c == b, "served from the freed segment");
  nt_free(ctx, c);
  /* Absurd sizes fail cleanly without reaching the system allocator. */
  CHECK_ERR(ctx, NT_ERR_OOM, nt_alloc(ctx, SIZE_MAX - 100, &c));
  CHECK_ERR(ctx, NT_ERR_OOM, nt_alloc(ctx, (size_t)10 << 40, &c));   /* 10 TiB over the limit */
  /* A medium request whose shared 20 MiB segment does not fit gets a tight segment. */
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  nt_mem_set_limit(ctx, 8 * MiB);
  CHECK_OK(ctx, nt_alloc(ctx, 3 * MiB, &c));
  s = stats(ctx);
  CHECK(s.reserved == 4 * MiB && s.allocated == 4 * MiB, "tight segment: reserved %zu",
        s.reserved);
  nt_free(ctx, c);
  nt_mem_set_limit(ctx, 0);
  CHECK_OK(ctx, nt_alloc(ctx, 30 * MiB, &c));       /* no limit any more */
  nt_free(ctx, c);
  nt_ctx_free(ctx);
}

/* Leaked blocks and pinned buffers are still returned at destruction (ASan checks). */
static void test_destroy_with_leaks(void) {
  nt_ctx *ctx = new_ctx();
  void *a, *b, *c;
  CHECK_OK(ctx, nt_alloc(ctx, 100, &a));
  CHECK_OK(ctx, nt_alloc(ctx, 30 * MiB, &b));
  CHECK_OK(ctx, nt_pinned_alloc(ctx, 100, &c));
  printf("  (two 'destroyed with' warnings expected below)\n");
  nt_ctx_free(ctx);
}

typedef struct {
  nt_ctx *ctx;
  int id;
  int bad, failed;
} worker_arg;

static void *worker(void *p) {
  worker_arg *w = p;
  nt_test_rng rng = {(uint64_t)w->id * 1000 + 1};
  enum { LIVE = 16 };
  unsigned char *live[LIVE] = {0};
  size_t sizes[LIVE] = {0};
  unsigned char tag = (unsigned char)(w->id + 1);
  for (int it = 0; it < 3000; it++) {
    int k = (int)nt_test_uniform(&rng, 0, LIVE);
    if (live[k]) {
      size_t check = sizes[k] < 256 ? sizes[k] : 256;
      for (size_t i = 0; i < check; i++) w->bad += live[k][i] != tag;
      w->bad += live[k][sizes[k] - 1] != tag;
      nt_free(w->ctx, live[k]);
      live[k] = NULL;
    } else {
      size_t n = nt_test_uniform(&rng, 0, 1) < 0.9 ? (size_t)nt_test_uniform(&rng, 1, 100000)
                                                   : (size_t)nt_test_uniform(&rng, 1, 3 * MiB);
      if (nt_alloc(w->ctx, n, (void **)&live[k])) { w->failed++; continue; }
      sizes[k] = n;
      memset(live[k], tag, n < 256 ? n : 256);
      live[k][n - 1] = tag;
    }
  }
  for (int k = 0; k < LIVE; k++) nt_free(w->ctx, live[k]);
  return NULL;
}

static void test_threads(void) {
  nt_ctx *ctx = new_ctx();
  enum { N = 8 };
  pthread_t th[N];
  worker_arg args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (worker_arg){ctx, i, 0, 0};
    CHECK(pthread_create(&th[i], NULL, worker, &args[i]) == 0, "thread %d", i);
  }
  int bad = 0, failed = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    bad += args[i].bad;
    failed += args[i].failed;
  }
  nt_mem_stats s = stats(ctx);
  CHECK(bad == 0 && failed == 0, "threads: %d corrupted bytes, %d failed allocs", bad, failed);
  CHECK(s.allocated == 0 && s.requested == 0 && s.n_allocs == s.n_frees,
        "threads: allocated %zu, allocs %llu frees %llu", s.allocated,
        (unsigned long long)s.n_allocs, (unsigned long long)s.n_frees);
  CHECK_OK(ctx, nt_mem_empty_cache(ctx));
  CHECK(stats(ctx).reserved == 0, "all segments whole again after the threads");
  nt_ctx_free(ctx);
}

/* Streams and events on a CPU context: no-ops that keep the same contract (host timing). */
static void test_cpu_events(void) {
  nt_ctx *ctx = new_ctx();
  nt_event *a = NULL, *b = NULL, *plain = NULL;
  void *stream = (void *)1;
  CHECK_OK(ctx, nt_event_create(ctx, &a, true));
  CHECK_OK(ctx, nt_event_create(ctx, &b, true));
  CHECK_OK(ctx, nt_event_create(ctx, &plain, false));
  float ms = -1;
  CHECK_ERR(ctx, NT_ERR_STATE, nt_event_elapsed_ms(ctx, a, b, &ms));
  CHECK_OK(ctx, nt_stream_create(ctx, &stream));
  CHECK(stream == NULL, "no stream object on the CPU");
  CHECK_OK(ctx, nt_event_record(ctx, a, NULL));
  volatile double x = 0;
  for (int i = 0; i < 1000000; i++) x += i;
  CHECK_OK(ctx, nt_event_record(ctx, b, stream));
  CHECK_OK(ctx, nt_stream_wait_event(ctx, NULL, b));
  CHECK_OK(ctx, nt_event_synchronize(ctx, b));
  CHECK(nt_event_done(ctx, b), "done");
  CHECK_OK(ctx, nt_event_elapsed_ms(ctx, a, b, &ms));
  CHECK(ms >= 0.0f && ms < 10000.0f, "host-timed elapsed %g ms", ms);
  CHECK_OK(ctx, nt_event_record(ctx, plain, NULL));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_event_elapsed_ms(ctx, a, plain, &ms));
  CHECK_OK(ctx, nt_stream_synchronize(ctx, stream));
  nt_stream_free(ctx, stream);
  nt_event_free(ctx, a);
  nt_event_free(ctx, b);
  nt_event_free(ctx, plain);
  nt_event_free(ctx, NULL);
  nt_ctx_free(ctx);
}

int main(void) {
  test_cpu_events();
  test_reuse();
  test_stats_exact();
  test_split_merge();
  test_training_pattern();
  test_random_no_overlap();
  test_invalid_frees();
  test_record_stream_cpu();
  test_oom();
  test_no_cache();
  test_destroy_with_leaks();
  test_threads();
  return nt_test_finish();
}
