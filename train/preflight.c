#include "train/preflight.h"
#include <stdio.h>
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
  if (device_free >= 0 && est->total * slack > device_free)
    return NT_ERROR(ctx, NT_ERR_OOM,
                    "the run needs about %.0f MiB of GPU memory (memest: parameters %.0f, "
                    "gradients %.0f, master %.0f, optimizer %.0f, activations %.0f, workspace "
                    "%.0f MiB) but %.0f MiB are free; reduce --batch-size or the model",
                    est->total / mib, est->parameters / mib, est->gradients / mib,
                    est->master / mib, est->optimizer / mib, est->activations / mib,
                    est->workspace / mib, device_free / mib);
  if (host_available > 0 && host_bytes * slack > host_available)
    return NT_ERROR(ctx, NT_ERR_OOM,
                    "the run needs about %.0f MiB of host memory (%s) but %.0f MiB are "
                    "available; reduce --batch-size, the model or the data",
                    host_bytes / mib,
                    device_free < 0 ? "memest's estimate plus the data" : "data and loader",
                    host_available / mib);
  return NT_OK;
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
