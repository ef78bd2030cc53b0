/* Streams and events. On a CPU context they exist and do nothing (work is synchronous). */
#ifndef NT_STREAM_H
#define NT_STREAM_H
#include <stdbool.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

typedef struct nt_ctx nt_ctx;
typedef struct nt_event nt_event;

nt_status nt_event_create(nt_ctx *ctx, nt_event **out, bool timing);
void nt_event_free(nt_ctx *ctx, nt_event *ev);                      /* NULL is a no-op */
/* stream NULL means the context's compute stream. */
nt_status nt_event_record(nt_ctx *ctx, nt_event *ev, void *stream);
nt_status nt_stream_wait_event(nt_ctx *ctx, void *stream, nt_event *ev);
nt_status nt_event_synchronize(nt_ctx *ctx, nt_event *ev);
/* true when all work before the record has completed (or nothing was recorded). */
bool nt_event_done(nt_ctx *ctx, nt_event *ev);
nt_status nt_event_elapsed_ms(nt_ctx *ctx, nt_event *start, nt_event *end, float *ms);

nt_status nt_stream_create(nt_ctx *ctx, void **stream);             /* non-blocking stream */
void nt_stream_free(nt_ctx *ctx, void *stream);
nt_status nt_stream_synchronize(nt_ctx *ctx, void *stream);
/* Marks the range a profiler started with `ncu --profile-from-start off` collects
 * (cudaProfilerStart / Stop); no-ops on a CPU context. */
void nt_profiler_range(nt_ctx *ctx, bool start);

NT_EXTERN_C_END
#endif
