#include "train/preflight.h"
#include "core/memory.h"
#include "core/cuda_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t nt_host_memory_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  fclose(f);
  return (uint64_t)kib * 1024;
}

nt_status nt_preflight_memory(nt_ctx *ctx, const nt_mem_estimate *est, double host_bytes,
                              double host_available, double device_free) {
  const double mib = 1048576.0, slack = 1.05;
  char parts[320];
  snprintf(parts, sizeof parts, "memest: %.0f MiB = parameters %.0f, gradients %.0f, master "
           "%.0f, optimizer %.0f, activations %.0f, workspace %.0f MiB", est->total / mib,
           est->parameters / mib, est->gradients / mib, est->master / mib,
           est->optimizer / mib, est->activations / mib, est->workspace / mib);
  if (device_free >= 0 && est->total * slack > device_free)
    return NT_ERROR(ctx, NT_ERR_OOM,
                    "the run needs about %.0f MiB of GPU memory (%s) but %.0f MiB are free; "
                    "reduce --batch-size or the model", est->total / mib, parts,
                    device_free / mib);
  if (host_available > 0 && host_bytes * slack > host_available)
    return NT_ERROR(ctx, NT_ERR_OOM,
                    "the run needs about %.0f MiB of host memory (%s%s%.0f MiB) but %.0f MiB "
                    "are available; reduce --batch-size, the model or the data",
                    host_bytes / mib, device_free < 0 ? parts : "",
                    device_free < 0 ? "; data, loader and batches " : "data, loader and batches ",
                    (host_bytes - (device_free < 0 ? est->total : 0)) / mib,
                    host_available / mib);
  return NT_OK;
}

/* Bytes free on the context's GPU (cudaMemGetInfo), -1 for a CPU context or when unknown. */
static double device_free_bytes(nt_ctx *ctx) {
#ifdef NT_HAVE_CUDA
  if (!nt_ctx_is_cuda(ctx)) return -1;
  int prev = 0;
  size_t free_b = 0, total = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return -1;
  bool ok = cudaSetDevice(nt_ctx_device(ctx).index) == cudaSuccess &&
            cudaMemGetInfo(&free_b, &total) == cudaSuccess;
  cudaSetDevice(prev);
  (void)cudaGetLastError();
  return ok ? (double)free_b : -1;
#else
  (void)ctx;
  return -1;
#endif
}

nt_status nt_preflight_run_memory(nt_ctx *ctx, const nt_mem_estimate *est, double host_bytes) {
  nt_mem_stats ms;
  nt_mem_get_stats(ctx, &ms);
  /* what the context's pool holds is the run's to use */
  double held = (double)ms.reserved, dev = device_free_bytes(ctx);
  double host = (double)nt_host_memory_available();
  if (dev >= 0) return nt_preflight_memory(ctx, est, host_bytes, host, dev + held);
  return nt_preflight_memory(ctx, est, est->total + host_bytes, host > 0 ? host + held : 0, -1);
}

nt_status nt_preflight_block(nt_ctx *ctx, int64_t train_tokens, int64_t val_tokens, int block) {
  if (train_tokens < (int64_t)block + 1 || val_tokens < (int64_t)block + 1)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                    "--block-size %d needs %d tokens per sample but the %s split has %lld; use a "
                    "smaller --block-size", block, block + 1,
                    train_tokens < (int64_t)block + 1 ? "training" : "validation",
                    (long long)(train_tokens < (int64_t)block + 1 ? train_tokens : val_tokens));
  return NT_OK;
}

void nt_data_id_write(nt_jw *w, const nt_data_id *id) {
  nt_jw_key(w, "data");
  nt_jw_begin(w, '{');
  nt_jw_key(w, "source");
  nt_jw_str(w, id->source);
  nt_jw_key(w, "items");
  nt_jw_i64(w, id->items);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id->hash);
  nt_jw_key(w, "fnv1a");
  nt_jw_str(w, hex);
  nt_jw_end(w, '}');
}

nt_status nt_preflight_data(nt_ctx *ctx, const nt_json *model_config, const nt_data_id *id,
                            const char *data_dir) {
  const nt_json *saved = nt_json_get(model_config, "data");
  if (!saved) {
    fprintf(stderr, "nanotrain: warning: the checkpoint does not record its training data; "
            "resuming on %s unchecked\n", id->source);
    return NT_OK;
  }
  const char *hex = nt_json_str(nt_json_get(saved, "fnv1a"), "");
  char *end;
  unsigned long long hash = strtoull(hex, &end, 16);
  int64_t items;
  nt_status st = nt_json_get_int_in(ctx, saved, "items", 0, INT64_MAX, &items);
  if (!st && (strlen(hex) != 16 || *end))
    st = NT_ERROR(ctx, NT_ERR_FORMAT, "field 'fnv1a' is '%s', expected 16 hex digits", hex);
  if (st) return NT_ERROR(ctx, st, "ckpt.json model_config data: %s", nt_last_error(ctx));
  if (items == id->items && hash == id->hash) return NT_OK;
  bool shard = strcmp(id->source, "shakespeare") && strcmp(id->source, "synthetic") &&
               strcmp(id->source, "fashion-mnist");
  return NT_ERROR(ctx, NT_ERR_INVALID_ARG,
                  "--resume: %s %s holds other data than the checkpoint was trained on (%lld "
                  "items, fnv1a %016llx; the checkpoint's: %lld items, fnv1a %016llx); resume on "
                  "the data it was trained on", shard ? "--data" : "--data-dir",
                  shard ? id->source : data_dir ? data_dir : "(default)", (long long)id->items,
                  (unsigned long long)id->hash, (long long)items, hash);
}
