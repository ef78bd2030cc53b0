#include "core/stream.h"
#include "core/ctx.h"
#include "core/cuda_util.h"
#ifdef NT_HAVE_CUDA
#include <cuda_profiler_api.h>
#endif
#include <stdlib.h>
#include <time.h>

struct nt_event {
  void *ev;          /* cudaEvent_t; NULL on the CPU */
  bool timing;
  bool recorded;
  double host_ms;    /* CPU context: when it was recorded (CPU work is synchronous) */
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

nt_status nt_event_create(nt_ctx *ctx, nt_event **out, bool timing) {
  *out = NULL;
  nt_event *e = calloc(1, sizeof *e);
  if (!e) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for an event");
  e->timing = timing;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    /* The event belongs to the context's device, whichever thread creates it. */
    nt_status st = nt_cuda_set_device(ctx);
    cudaEvent_t ev;
    if (!st)
      st = NT_CUDA(ctx, cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault
                                                             : cudaEventDisableTiming));
    if (st) { free(e); return st; }
    e->ev = ev;
  }
#endif
  *out = e;
  return NT_OK;
}

void nt_event_free(nt_ctx *ctx, nt_event *ev) {
  if (!ev) return;
#ifdef NT_HAVE_CUDA
  if (ev->ev) (void)cudaEventDestroy((cudaEvent_t)ev->ev);
#endif
  (void)ctx;
  free(ev);
}

#ifdef NT_HAVE_CUDA
static cudaStream_t pick(nt_ctx *ctx, void *stream) {
  return stream ? (cudaStream_t)stream : nt_cuda_stream(ctx);
}
#endif

nt_status nt_event_record(nt_ctx *ctx, nt_event *ev, void *stream) {
  ev->recorded = true;
#ifdef NT_HAVE_CUDA
  if (ev->ev) return NT_CUDA(ctx, cudaEventRecord((cudaEvent_t)ev->ev, pick(ctx, stream)));
#endif
  (void)ctx; (void)stream;
  ev->host_ms = now_ms();
  return NT_OK;
}

nt_status nt_stream_wait_event(nt_ctx *ctx, void *stream, nt_event *ev) {
#ifdef NT_HAVE_CUDA
  if (ev->ev) return NT_CUDA(ctx, cudaStreamWaitEvent(pick(ctx, stream), (cudaEvent_t)ev->ev, 0));
#endif
  (void)ctx; (void)stream; (void)ev;
  return NT_OK;
}

nt_status nt_event_synchronize(nt_ctx *ctx, nt_event *ev) {
#ifdef NT_HAVE_CUDA
  if (ev->ev && ev->recorded) return NT_CUDA(ctx, cudaEventSynchronize((cudaEvent_t)ev->ev));
#endif
  (void)ctx; (void)ev;
  return NT_OK;
}

bool nt_event_done(nt_ctx *ctx, nt_event *ev) {
#ifdef NT_HAVE_CUDA
  if (ev->ev && ev->recorded) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev->ev);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    if (e == cudaErrorNotReady) return false;
    /* A failed device never completes the work: report done so a polling caller does not
     * spin forever; its next synchronizing call returns the error. */
    nt_log(ctx, NT_LOG_ERROR, "cudaEventQuery failed: %s", cudaGetErrorString(e));
    return true;
  }
#endif
  (void)ctx; (void)ev;
  return true;
}

nt_status nt_event_elapsed_ms(nt_ctx *ctx, nt_event *start, nt_event *end, float *ms) {
  *ms = 0.0f;
  if (!start->timing || !end->timing)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "nt_event_elapsed_ms: both events must be "
                    "created with timing = true");
  if (!start->recorded || !end->recorded)
    return NT_ERROR(ctx, NT_ERR_STATE, "nt_event_elapsed_ms: the %s event was never recorded",
                    start->recorded ? "end" : "start");
#ifdef NT_HAVE_CUDA
  if (start->ev && end->ev)
    return NT_CUDA(ctx, cudaEventElapsedTime(ms, (cudaEvent_t)start->ev, (cudaEvent_t)end->ev));
#endif
  *ms = (float)(end->host_ms - start->host_ms);
  return NT_OK;
}

nt_status nt_stream_create(nt_ctx *ctx, void **stream) {
  *stream = NULL;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    cudaStream_t s;
    nt_status st = nt_cuda_set_device(ctx);
    if (!st) st = NT_CUDA(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!st) *stream = s;
    return st;
  }
#endif
  (void)ctx;
  return NT_OK;
}

void nt_stream_free(nt_ctx *ctx, void *stream) {
  (void)ctx;
#ifdef NT_HAVE_CUDA
  if (stream) (void)cudaStreamDestroy((cudaStream_t)stream);
#else
  (void)stream;
#endif
}

nt_status nt_stream_synchronize(nt_ctx *ctx, void *stream) {
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) return NT_CUDA(ctx, cudaStreamSynchronize(pick(ctx, stream)));
#endif
  (void)ctx; (void)stream;
  return NT_OK;
}

void nt_profiler_range(nt_ctx *ctx, bool start) {
#ifdef NT_HAVE_CUDA
  /* Best effort: a profiler that is not attached makes these no-ops. */
  if (nt_ctx_is_cuda(ctx)) (void)(start ? cudaProfilerStart() : cudaProfilerStop());
#else
  (void)ctx; (void)start;
#endif
}
