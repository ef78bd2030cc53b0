#include "core/stream.h"
#include "core/ctx.h"
#include "core/cuda_util.h"
#include <stdlib.h>

struct nt_event {
  void *ev;          /* cudaEvent_t; NULL on the CPU */
  bool recorded;
};

nt_status nt_event_create(nt_ctx *ctx, nt_event **out, bool timing) {
  nt_event *e = calloc(1, sizeof *e);
  if (!e) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for an event");
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    cudaEvent_t ev;
    nt_status st = NT_CUDA(ctx, cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault
                                                                      : cudaEventDisableTiming));
    if (st) { free(e); return st; }
    e->ev = ev;
  }
#else
  (void)timing;
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
  (void)ctx;
#ifdef NT_HAVE_CUDA
  if (ev->ev && ev->recorded) return cudaEventQuery((cudaEvent_t)ev->ev) == cudaSuccess;
#endif
  (void)ev;
  return true;
}

nt_status nt_event_elapsed_ms(nt_ctx *ctx, nt_event *start, nt_event *end, float *ms) {
  *ms = 0.0f;
#ifdef NT_HAVE_CUDA
  if (start->ev && end->ev)
    return NT_CUDA(ctx, cudaEventElapsedTime(ms, (cudaEvent_t)start->ev, (cudaEvent_t)end->ev));
#endif
  (void)ctx; (void)start; (void)end;
  return NT_OK;
}

nt_status nt_stream_create(nt_ctx *ctx, void **stream) {
  *stream = NULL;
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) {
    cudaStream_t s;
    nt_status st = NT_CUDA(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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
