/* Checks a run makes before training, so an impossible configuration fails at once with the
 * reason instead of minutes later (or by the kernel's OOM killer, with no message). */
#ifndef NT_MODELS_PREFLIGHT_H
#define NT_MODELS_PREFLIGHT_H
#include <stdint.h>
#include "core/nt.h"
#include "train/memest.h"
#include "models/json.h"
NT_EXTERN_C_BEGIN

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
uint64_t nt_host_memory_available(void);

/* est: memest's figures for the device that computes. host_bytes: what the run needs in host
 * memory (datasets, loader slots; for a CPU run est->total too); host_available: what is free
 * (nt_host_memory_available(); 0 skips the check). device_free: the GPU's free bytes, < 0 for a
 * CPU run. NT_ERR_OOM naming the figures (estimate, its largest parts, what is free) when the
 * need exceeds what is free, with 5% head-room for what the estimate leaves out. */
nt_status nt_preflight_memory(nt_ctx *ctx, const nt_mem_estimate *est, double host_bytes,
                              double host_available, double device_free);

/* Before a model allocates: memest's estimate against what the context's GPU has free (plus
 * what its pool holds), and host_bytes (the data, the loader's slots, host batch buffers; on a
 * CPU context est->total is added) against MemAvailable. nt_preflight_memory's errors. */
nt_status nt_preflight_run_memory(nt_ctx *ctx, const nt_mem_estimate *est, double host_bytes);

/* A GPT sample is block + 1 tokens: each split must hold one. NT_ERR_INVALID_ARG naming the
 * split and both lengths otherwise. */
nt_status nt_preflight_block(nt_ctx *ctx, int64_t train_tokens, int64_t val_tokens, int block);

/* What a run trained on, recorded in the checkpoint (its model_config's "data" object) so that a
 * resume on other data fails instead of training on silently. source: "shakespeare",
 * "synthetic", "fashion-mnist" or a token shard's path; items: tokens or images; hash:
 * FNV-1a 64 over the data's bytes (nt_fnv1a), e.g. every token id or every image and label. */
typedef struct {
  const char *source;
  int64_t items;
  uint64_t hash;
} nt_data_id;

/* Writes "data": {"source", "items", "fnv1a" (16 hex digits)} into an open object. */
void nt_data_id_write(nt_jw *w, const nt_data_id *id);

/* Resume: model_config's "data" must describe the same data as id (the path may differ: the
 * contents are compared). NT_ERR_INVALID_ARG naming the option that chose the data (--data for
 * a token shard, else --data-dir with data_dir), both sizes and both hashes otherwise; a
 * malformed object is NT_ERR_FORMAT. A checkpoint without the object (written before it was
 * recorded) passes with a warning on stderr. */
nt_status nt_preflight_data(nt_ctx *ctx, const nt_json *model_config, const nt_data_id *id,
                            const char *data_dir);

NT_EXTERN_C_END
#endif
