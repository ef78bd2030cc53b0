/* Capture of a piece of work queued on the context's compute stream as a CUDA graph, replayed
 * with one launch. The body must be capturable: no host synchronization and no allocation
 * that misses the pool's cache (run it once eagerly first). A failed capture leaves the stream
 * usable and returns the error, so callers fall back to running the body eagerly. Without
 * CUDA (or for a CPU context) capture is NT_ERR_UNSUPPORTED. */
#ifndef NT_TRAIN_CUDA_GRAPH_H
#define NT_TRAIN_CUDA_GRAPH_H
#include "core/nt.h"
NT_EXTERN_C_BEGIN

typedef struct nt_graph nt_graph;
typedef nt_status (*nt_graph_body)(nt_ctx *ctx, void *arg);

nt_status nt_graph_capture(nt_ctx *ctx, nt_graph_body body, void *arg, nt_graph **out);
nt_status nt_graph_launch(nt_ctx *ctx, nt_graph *g);
void nt_graph_free(nt_graph *g);      /* NULL is a no-op */

NT_EXTERN_C_END
#endif
