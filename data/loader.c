#include "data/loader.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/memory.h"
#include "core/stream.h"
#include "core/cuda_util.h"
#include "data/sampler.h"

#define MSG_LEN 512               /* a sample callback's message */
#define FULL_MSG_LEN (MSG_LEN + 128)  /* with the loader's prefix */

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD, SLOT_COPYING } slot_state;

typedef struct {
  unsigned char *host;     /* all fields of one batch, field f at field_off[f] */
  slot_state state;
  int64_t batch;
  nt_event *copied;        /* CUDA: recorded on the copy stream after the batch's copies */
  uint64_t copy_seq;       /* order of the copies, to wait for the oldest first */
} slot;

struct nt_loader {
  nt_ctx *ctx;
  nt_dataset ds;
  nt_loader_opts o;
  bool cuda;
  nt_sampler sampler;
  int64_t *indices, *scratch;      /* this epoch's indices (num_samples) */
  int64_t num_batches;
  size_t field_off[NT_LOADER_MAX_FIELDS], row_bytes[NT_LOADER_MAX_FIELDS], slot_bytes;

  int nslots;
  slot *slots;
  int held;                        /* the slot the consumer holds (CPU), or -1 */

  /* CUDA: device batch ring; each buffer has the layout of a slot. */
  int ndev;
  unsigned char **dev;
  nt_event **compute_done;         /* recorded on the compute stream when a batch is released */
  int dev_held;                    /* ring entry the consumer holds, or -1 */
  uint64_t copy_seq;

  pthread_mutex_t mu;
  pthread_cond_t work_cv, ready_cv, reap_cv;
  pthread_t *threads;              /* the workers, then the reaper (CUDA) */
  int nthreads, num_workers;
  bool shutdown, epoch_active, failed;
  atomic_uint_fast64_t gen;        /* bumped to abandon an epoch; workers drop stale batches */
  int busy;                        /* batches being filled */
  int64_t next_assign, next_deliver, fail_batch;
  nt_status fail_status;
  char fail_msg[FULL_MSG_LEN];
  bool started;                    /* an iteration is running (nt_loader_next began it) */
  nt_loader_stats stats;
};

nt_status nt_sample_fail(const nt_sample_info *info, nt_status st, const char *fmt, ...) {
  if (info->msg && info->msg_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->msg, info->msg_len, fmt, ap);
    va_end(ap);
  }
  return st;
}

size_t nt_field_row_bytes(const nt_field_spec *f) {
  size_t n = nt_dtype_size(f->dtype);
  for (int d = 0; d < f->ndim; d++) n *= (size_t)f->shape[d];
  return n;
}

nt_loader_opts nt_loader_default_opts(void) {
  nt_loader_opts o = {0};
  o.batch_size = 1;
  o.prefetch_factor = 2;
  o.pin_memory = true;
  o.world_size = 1;
  o.device_buffers = 2;
  return o;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t batch_rows(const nt_loader *l, int64_t b) {
  int64_t left = l->sampler.num_samples - b * l->o.batch_size;
  return left < l->o.batch_size ? left : l->o.batch_size;
}

/* Fills batch b into slot s. Called without the lock; reads only the epoch's index list,
 * which does not change while any batch is being filled. */
static nt_status fill_batch(nt_loader *l, slot *s, int64_t b, int worker, uint64_t gen,
                            char *msg) {
  char cbmsg[MSG_LEN];
  nt_sample_info info = {0};
  info.seed = l->o.seed;
  info.epoch = l->sampler.epoch;
  info.worker = worker;
  info.msg = cbmsg;
  info.msg_len = sizeof cbmsg;
  void *dst[NT_LOADER_MAX_FIELDS];
  int64_t rows = batch_rows(l, b);
  for (int64_t r = 0; r < rows; r++) {
    if (atomic_load_explicit(&l->gen, memory_order_relaxed) != gen) return NT_OK;  /* dropped */
    info.index = l->indices[b * l->o.batch_size + r];
    for (int f = 0; f < l->ds.n_fields; f++)
      dst[f] = s->host + l->field_off[f] + (size_t)r * l->row_bytes[f];
    cbmsg[0] = '\0';
    nt_status st = l->ds.get(l->ds.user, &info, dst);
    if (st) {
      snprintf(msg, FULL_MSG_LEN, "loader: batch %lld, sample %lld (worker %d): %s",
               (long long)b, (long long)info.index, worker, cbmsg[0] ? cbmsg : nt_status_str(st));
      return st;
    }
  }
  return NT_OK;
}

static int find_slot(const nt_loader *l, slot_state state) {
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].state == state) return i;
  return -1;
}

/* Records the end of filling batch b (lock held). */
static void finish_fill(nt_loader *l, slot *s, uint64_t gen, nt_status st, const char *msg,
                        int64_t b) {
  if (gen != atomic_load(&l->gen)) {
    s->state = SLOT_FREE;
  } else if (st) {
    s->state = SLOT_FREE;
    if (!l->failed || b < l->fail_batch) {
      l->failed = true;
      l->fail_batch = b;
      l->fail_status = st;
      snprintf(l->fail_msg, sizeof l->fail_msg, "%s", msg);
    }
  } else {
    s->state = SLOT_READY;
  }
}

static bool worker_has_work(const nt_loader *l) {
  return l->epoch_active && !l->failed && l->next_assign < l->num_batches &&
         find_slot(l, SLOT_FREE) >= 0;
}

typedef struct { nt_loader *l; int id; } worker_arg;

static void *worker_main(void *p) {
  worker_arg *a = p;
  nt_loader *l = a->l;
  int id = a->id;
  free(a);
  char msg[FULL_MSG_LEN];
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->shutdown && !worker_has_work(l)) pthread_cond_wait(&l->work_cv, &l->mu);
    if (l->shutdown) break;
    slot *s = &l->slots[find_slot(l, SLOT_FREE)];
    int64_t b = l->next_assign++;
    s->state = SLOT_FILLING;
    s->batch = b;
    uint64_t gen = atomic_load(&l->gen);
    l->busy++;
    pthread_mutex_unlock(&l->mu);
    nt_status st = fill_batch(l, s, b, id, gen, msg);
    pthread_mutex_lock(&l->mu);
    l->busy--;
    finish_fill(l, s, gen, st, msg, b);
    pthread_cond_broadcast(&l->ready_cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* Abandons the running iteration (lock held): waits out batches being filled, frees ready
 * slots. Slots whose copy is in flight stay COPYING until their event completes. */
static void abandon_epoch(nt_loader *l) {
  atomic_fetch_add(&l->gen, 1);
  l->epoch_active = false;
  l->started = false;
  while (l->busy > 0) pthread_cond_wait(&l->ready_cv, &l->mu);
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].state == SLOT_READY || l->slots[i].state == SLOT_FILLING)
      l->slots[i].state = SLOT_FREE;
}

/* Starts an iteration (lock held, no batch being filled). */
static nt_status start_epoch(nt_loader *l) {
  nt_status st = nt_sampler_indices(l->ctx, &l->sampler, l->indices, l->scratch);
  if (st) return st;
  l->next_assign = l->next_deliver = 0;
  l->failed = false;
  l->epoch_active = true;
  l->started = true;
  pthread_cond_broadcast(&l->work_cv);
  return NT_OK;
}

/* CUDA: the reaper thread hands slots back to the workers as soon as their copy has
 * completed, so refilling does not wait for the consumer's next call. Copies complete in issue
 * order (one copy stream), so it watches the oldest. It polls cudaEventQuery (clearing the
 * "not ready" it leaves in this thread's last error) with short sleeps, rather than blocking
 * in cudaEventSynchronize, which spins a core with default event flags. */
static int oldest_copy(const nt_loader *l) {
  int oldest = -1;
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].state == SLOT_COPYING &&
        (oldest < 0 || l->slots[i].copy_seq < l->slots[oldest].copy_seq))
      oldest = i;
  return oldest;
}

static void *reaper_main(void *p) {
  nt_loader *l = p;
#ifdef NT_HAVE_CUDA
  (void)nt_cuda_set_device(l->ctx);
#endif
  pthread_mutex_lock(&l->mu);
  for (;;) {
    int i = -1;
    while (!l->shutdown && (i = oldest_copy(l)) < 0) pthread_cond_wait(&l->reap_cv, &l->mu);
    if (l->shutdown) break;
    slot *s = &l->slots[i];
    uint64_t seq = s->copy_seq;
    pthread_mutex_unlock(&l->mu);
    bool done = nt_event_done(l->ctx, s->copied);
#ifdef NT_HAVE_CUDA
    if (!done) (void)cudaGetLastError();
#endif
    if (!done) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&l->mu);
    if (done && s->state == SLOT_COPYING && s->copy_seq == seq) {
      s->state = SLOT_FREE;
      pthread_cond_broadcast(&l->work_cv);
      pthread_cond_broadcast(&l->ready_cv);
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static int ready_slot(const nt_loader *l, int64_t b) {
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].state == SLOT_READY && l->slots[i].batch == b) return i;
  return -1;
}

/* Waits (lock held) until batch next_deliver is ready; returns its slot in *out. */
static nt_status wait_ready(nt_loader *l, int *out) {
  char msg[FULL_MSG_LEN];
  for (;;) {
    nt_status st;
    int i = ready_slot(l, l->next_deliver);
    if (i >= 0) { *out = i; return NT_OK; }
    if (l->failed && l->fail_batch <= l->next_deliver) {
      /* The iteration ends here; batches still being filled must finish before the next
       * iteration rewrites the index list. */
      abandon_epoch(l);
      return NT_ERROR(l->ctx, l->fail_status, "%s", l->fail_msg);
    }
    bool assigned = l->next_assign > l->next_deliver;
    if (!assigned && find_slot(l, SLOT_FREE) < 0 && oldest_copy(l) < 0)
      return NT_ERROR(l->ctx, NT_ERR_INTERNAL, "loader: no free slot and no copy in flight");
    if (l->num_workers == 0 && !assigned && find_slot(l, SLOT_FREE) >= 0) {
      /* synchronous: load it here */
      slot *s = &l->slots[find_slot(l, SLOT_FREE)];
      int64_t b = l->next_assign++;
      s->state = SLOT_FILLING;
      s->batch = b;
      uint64_t gen = atomic_load(&l->gen);
      pthread_mutex_unlock(&l->mu);
      st = fill_batch(l, s, b, -1, gen, msg);
      pthread_mutex_lock(&l->mu);
      finish_fill(l, s, gen, st, msg, b);
      continue;
    }
    pthread_cond_wait(&l->ready_cv, &l->mu);
  }
}

static nt_status release_locked(nt_loader *l) {
  if (l->held >= 0) {
    l->slots[l->held].state = SLOT_FREE;
    l->held = -1;
    pthread_cond_broadcast(&l->work_cv);
  }
  if (l->dev_held >= 0) {
    nt_status st = nt_event_record(l->ctx, l->compute_done[l->dev_held], NULL);
    l->dev_held = -1;
    if (st) return st;
  }
  return NT_OK;
}

nt_status nt_loader_release(nt_loader *l) {
  pthread_mutex_lock(&l->mu);
  nt_status st = release_locked(l);
  pthread_mutex_unlock(&l->mu);
  return st;
}

#ifdef NT_HAVE_CUDA
/* Issues the copies of slot s into ring entry d on the copy stream (lock held). */
static nt_status issue_copy(nt_loader *l, slot *s, int d, int64_t rows) {
  nt_ctx *ctx = l->ctx;
  void *cs = nt_ctx_copy_stream(ctx);
  nt_status st = nt_stream_wait_event(ctx, cs, l->compute_done[d]);
  for (int f = 0; !st && f < l->ds.n_fields; f++)
    st = NT_CUDA(ctx, cudaMemcpyAsync(l->dev[d] + l->field_off[f], s->host + l->field_off[f],
                                      (size_t)rows * l->row_bytes[f], cudaMemcpyHostToDevice,
                                      (cudaStream_t)cs));
  if (!st) st = nt_event_record(ctx, s->copied, cs);
  if (!st) st = nt_stream_wait_event(ctx, NULL, s->copied);
  return st;
}
#endif

nt_status nt_loader_next(nt_loader *l, nt_batch *out, bool *end) {
  uint64_t t0 = now_ns();
  memset(out, 0, sizeof *out);
  *end = false;
  pthread_mutex_lock(&l->mu);
  nt_status st = release_locked(l);
  if (st) goto done;
  if (!l->started) {
    if ((st = start_epoch(l))) goto done;
  }
  if (l->next_deliver >= l->num_batches) {
    l->epoch_active = false;
    l->started = false;
    *end = true;
    goto done;
  }
  int i;
  uint64_t tw = now_ns();
  if ((st = wait_ready(l, &i))) goto done;
  uint64_t waited = now_ns() - tw;
  slot *s = &l->slots[i];
  int64_t b = l->next_deliver++, rows = batch_rows(l, b);
  unsigned char *base = s->host;
  nt_device dev = nt_cpu();
  if (l->cuda) {
#ifdef NT_HAVE_CUDA
    /* Round robin over all copies, not batch numbers, so the first batch of an epoch does
     * not land in the buffer that still holds the epoch's last one. */
    int d = (int)(l->copy_seq % (uint64_t)l->ndev);
    if ((st = issue_copy(l, s, d, rows))) {
      /* A CUDA error: let queued copies drain before the slot can be written again. */
      (void)nt_stream_synchronize(l->ctx, nt_ctx_copy_stream(l->ctx));
      s->state = SLOT_FREE;
      abandon_epoch(l);
      goto done;
    }
    s->state = SLOT_COPYING;
    s->copy_seq = l->copy_seq++;
    pthread_cond_signal(&l->reap_cv);
    l->dev_held = d;
    base = l->dev[d];
    dev = nt_ctx_device(l->ctx);
#endif
  } else {
    s->state = SLOT_HELD;
    l->held = i;
  }
  out->n_fields = l->ds.n_fields;
  for (int f = 0; f < l->ds.n_fields; f++) {
    const nt_field_spec *fs = &l->ds.fields[f];
    int64_t shape[NT_MAX_DIMS];
    shape[0] = rows;
    for (int k = 0; k < fs->ndim; k++) shape[k + 1] = fs->shape[k];
    out->field[f] = nt_tensor_view(base + l->field_off[f], fs->dtype, dev, fs->ndim + 1, shape);
  }
  out->size = rows;
  out->step = b;
  out->epoch = l->sampler.epoch;
  out->indices = l->indices + b * l->o.batch_size;
  l->stats.steps++;
  l->stats.wait_ns_total += waited;
  l->stats.wait_ns_last = waited;
  if (waited > l->stats.wait_ns_max) l->stats.wait_ns_max = waited;
done:
  l->stats.next_ns_total += now_ns() - t0;
  pthread_mutex_unlock(&l->mu);
  return st;
}

nt_status nt_loader_set_epoch(nt_loader *l, uint64_t epoch) {
  pthread_mutex_lock(&l->mu);
  nt_status st = release_locked(l);
  if (l->started) abandon_epoch(l);
  nt_sampler_set_epoch(&l->sampler, epoch);
  pthread_mutex_unlock(&l->mu);
  return st;
}

int64_t nt_loader_num_batches(const nt_loader *l) { return l->num_batches; }
int64_t nt_loader_num_samples(const nt_loader *l) { return l->sampler.num_samples; }

void nt_loader_get_stats(const nt_loader *l, nt_loader_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  *out = l->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
}

void nt_loader_reset_stats(nt_loader *l) {
  pthread_mutex_lock(&l->mu);
  memset(&l->stats, 0, sizeof l->stats);
  pthread_mutex_unlock(&l->mu);
}

static nt_status check_opts(nt_ctx *ctx, const nt_dataset *ds, const nt_loader_opts *o) {
  if (!ds->get)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: the dataset has no get callback");
  if (ds->len <= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: empty dataset (len %lld)",
                    (long long)ds->len);
  if (ds->n_fields < 1 || ds->n_fields > NT_LOADER_MAX_FIELDS)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: %d fields (expected 1..%d)", ds->n_fields,
                    NT_LOADER_MAX_FIELDS);
  for (int f = 0; f < ds->n_fields; f++) {
    const nt_field_spec *fs = &ds->fields[f];
    if (fs->ndim < 0 || fs->ndim > NT_MAX_DIMS - 1 || fs->dtype >= NT_DTYPE_COUNT)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: field %d: ndim %d / dtype %d invalid", f,
                      fs->ndim, (int)fs->dtype);
    for (int d = 0; d < fs->ndim; d++)
      if (fs->shape[d] <= 0)
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: field %d: dim %d is %lld", f, d,
                        (long long)fs->shape[d]);
  }
  if (o->batch_size <= 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: batch_size %lld must be > 0",
                    (long long)o->batch_size);
  if (o->num_workers < 0 || o->num_workers > 256)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: num_workers %d outside 0..256",
                    o->num_workers);
  if (o->num_workers > 0 && (o->prefetch_factor < 1 || o->prefetch_factor > 64))
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: prefetch_factor %d outside 1..64",
                    o->prefetch_factor);
  if (o->device_buffers < 2 || o->device_buffers > 64)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "loader: device_buffers %d outside 2..64",
                    o->device_buffers);
  return NT_OK;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static nt_status alloc_buffers(nt_loader *l) {
  nt_ctx *ctx = l->ctx;
  for (int f = 0; f < l->ds.n_fields; f++) {
    l->row_bytes[f] = nt_field_row_bytes(&l->ds.fields[f]);
    l->field_off[f] = l->slot_bytes;
    l->slot_bytes += align256(l->row_bytes[f] * (size_t)l->o.batch_size);
  }
  nt_status st;
  for (int i = 0; i < l->nslots; i++) {
    slot *s = &l->slots[i];
    if (l->o.pin_memory || !l->cuda) {
      if ((st = nt_pinned_alloc(ctx, l->slot_bytes, (void **)&s->host))) return st;
    } else {
      s->host = aligned_alloc(256, l->slot_bytes);
      if (!s->host)
        return NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory for a %zu-byte slot",
                        l->slot_bytes);
    }
    if (l->cuda && (st = nt_event_create(ctx, &s->copied, false))) return st;
  }
  if (!l->cuda) return NT_OK;
  l->ndev = l->o.device_buffers;
  l->dev = calloc((size_t)l->ndev, sizeof *l->dev);
  l->compute_done = calloc((size_t)l->ndev, sizeof *l->compute_done);
  if (!l->dev || !l->compute_done)
    return NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory");
  for (int d = 0; d < l->ndev; d++) {
    if ((st = nt_alloc(ctx, l->slot_bytes, (void **)&l->dev[d]))) return st;
    if ((st = nt_event_create(ctx, &l->compute_done[d], false))) return st;
  }
  return NT_OK;
}

nt_status nt_loader_create(nt_ctx *ctx, const nt_dataset *ds, const nt_loader_opts *opts,
                           nt_loader **out) {
  *out = NULL;
  nt_loader_opts o = opts ? *opts : nt_loader_default_opts();
  nt_status st = check_opts(ctx, ds, &o);
  if (st) return st;
  nt_loader *l = calloc(1, sizeof *l);
  if (!l) return NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory");
  l->ctx = ctx;
  l->ds = *ds;
  l->o = o;
  l->cuda = nt_ctx_is_cuda(ctx);
  l->held = l->dev_held = -1;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work_cv, NULL);
  pthread_cond_init(&l->ready_cv, NULL);
  pthread_cond_init(&l->reap_cv, NULL);
  atomic_init(&l->gen, 0);
  if ((st = nt_sampler_init(ctx, &l->sampler, ds->len, o.rank, o.world_size, o.shuffle, o.seed,
                            o.drop_last)))
    goto fail;
  int64_t ns = l->sampler.num_samples;
  l->num_batches = o.drop_last ? ns / o.batch_size : (ns + o.batch_size - 1) / o.batch_size;
  if (l->num_batches == 0) {
    st = NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                  "loader: drop_last with batch_size %lld larger than the %lld samples of "
                  "rank %d yields no batches",
                  (long long)o.batch_size, (long long)ns, o.rank);
    goto fail;
  }
  /* One slot per batch in flight, plus the one the consumer holds (or whose copy runs). */
  l->nslots = (o.num_workers > 0 ? o.num_workers * o.prefetch_factor : 1) + 1;
  l->indices = malloc((size_t)ns * sizeof *l->indices);
  l->scratch = malloc((size_t)ds->len * sizeof *l->scratch);
  l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
  if (!l->indices || !l->scratch || !l->slots) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory for %lld indices",
                  (long long)ds->len);
    goto fail;
  }
  if ((st = alloc_buffers(l))) goto fail;
  l->num_workers = o.num_workers;
  l->threads = calloc((size_t)o.num_workers + 1, sizeof *l->threads);
  if (!l->threads) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory");
    goto fail;
  }
  for (int w = 0; w < o.num_workers; w++) {
    worker_arg *a = malloc(sizeof *a);
    if (!a) {
      st = NT_ERROR(ctx, NT_ERR_OOM, "loader: out of host memory");
      goto fail;
    }
    a->l = l;
    a->id = w;
    if (pthread_create(&l->threads[w], NULL, worker_main, a) != 0) {
      free(a);
      st = NT_ERROR(ctx, NT_ERR_INTERNAL, "loader: cannot start worker thread %d", w);
      goto fail;
    }
    l->nthreads++;
  }
  if (l->cuda) {
    if (pthread_create(&l->threads[l->nthreads], NULL, reaper_main, l) != 0) {
      st = NT_ERROR(ctx, NT_ERR_INTERNAL, "loader: cannot start the copy reaper thread");
      goto fail;
    }
    l->nthreads++;
  }
  *out = l;
  return NT_OK;
fail:
  nt_loader_free(l);
  return st;
}

void nt_loader_free(nt_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->mu);
  if (l->started) abandon_epoch(l);
  l->shutdown = true;
  pthread_cond_broadcast(&l->work_cv);
  pthread_cond_broadcast(&l->reap_cv);
  pthread_mutex_unlock(&l->mu);
  for (int w = 0; w < l->nthreads; w++) pthread_join(l->threads[w], NULL);
  nt_ctx *ctx = l->ctx;
  if (l->cuda) {
    /* Copies may still read the slots: wait for them before freeing host memory. */
    (void)nt_stream_synchronize(ctx, nt_ctx_copy_stream(ctx));
  }
  for (int i = 0; l->slots && i < l->nslots; i++) {
    if (l->o.pin_memory || !l->cuda)
      nt_pinned_free(ctx, l->slots[i].host);
    else
      free(l->slots[i].host);
    nt_event_free(ctx, l->slots[i].copied);
  }
  for (int d = 0; d < l->ndev; d++) {
    if (l->dev) nt_free(ctx, l->dev[d]);  /* stream-ordered on compute: safe to free now */
    if (l->compute_done) nt_event_free(ctx, l->compute_done[d]);
  }
  free(l->dev);
  free(l->compute_done);
  free(l->slots);
  free(l->threads);
  free(l->indices);
  free(l->scratch);
  pthread_cond_destroy(&l->work_cv);
  pthread_cond_destroy(&l->ready_cv);
  pthread_cond_destroy(&l->reap_cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}
