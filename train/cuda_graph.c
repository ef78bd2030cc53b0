#include "train/cuda_graph.h"
#include "core/cuda_util.h"
#include <stdlib.h>

#ifdef NT_HAVE_CUDA
struct nt_graph {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
};

nt_status nt_graph_capture(nt_ctx *ctx, nt_graph_body body, void *arg, nt_graph **out) {
  *out = NULL;
  nt_status st = nt_ctx_capture_begin(ctx);   /* NT_ERR_UNSUPPORTED for a CPU context */
  if (st) return st;
  nt_status body_st = body(ctx, arg);
  void *captured = NULL;
  st = nt_ctx_capture_end(ctx, body_st == NT_OK, &captured);
  if (body_st) return body_st;
  if (st) return st;
  cudaGraph_t graph = captured;
  nt_graph *g = calloc(1, sizeof *g);
  if (!g) {
    cudaGraphDestroy(graph);
    return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a CUDA graph");
  }
  g->graph = graph;
  st = NT_CUDA(ctx, cudaGraphInstantiate(&g->exec, graph, 0));
  if (st) {
    cudaGraphDestroy(graph);
    free(g);
    return st;
  }
  *out = g;
  return NT_OK;
}

nt_status nt_graph_launch(nt_ctx *ctx, nt_graph *g) {
  return NT_CUDA(ctx, cudaGraphLaunch(g->exec, nt_cuda_stream(ctx)));
}

void nt_graph_free(nt_graph *g) {
  if (!g) return;
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  free(g);
}
#else
struct nt_graph {
  int unused;
};

nt_status nt_graph_capture(nt_ctx *ctx, nt_graph_body body, void *arg, nt_graph **out) {
  (void)body;
  (void)arg;
  *out = NULL;
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "CUDA graphs: built without CUDA");
}

nt_status nt_graph_launch(nt_ctx *ctx, nt_graph *g) {
  (void)g;
  return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "CUDA graphs: built without CUDA");
}

void nt_graph_free(nt_graph *g) { (void)g; }
#endif
