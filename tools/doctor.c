/* doctor: checks the environment nanotrain runs in and says what to fix.
 *
 *   doctor                  human-readable report
 *   doctor --json           one JSON object (for tooling)
 *   doctor --no-bandwidth   skip the host-to-device copy measurement
 *   doctor --bandwidth-mib N  copy size for the measurement (default 256)
 *
 * Reports the nanotrain build, the CPU and OpenBLAS, the CUDA driver and runtime versions and
 * whether they fit together, each GPU (name, compute capability, memory, SMs, ECC, L2), the
 * cuBLASLt / cuRAND / NCCL versions and the measured pinned vs pageable host-to-device
 * bandwidth. Exit status: 0 when everything found works, including "no GPU" (the CPU backend
 * works); 1 when a GPU is present but unusable (a driver older than the runtime, a failing
 * device); 2 on a bad option. */
#include "core/nt.h"
#include "tools/ctx_env.h"
#include "core/cuda_util.h"
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef NT_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <curand.h>
#ifdef NT_HAVE_NCCL
#include <nccl.h>
#endif
#endif

#define MAX_GPUS 16

typedef struct {
  int index;
  char name[256];
  int cc_major, cc_minor;
  size_t mem_total, mem_free;
  int sm_count;
  int ecc;
  int l2_bytes;
  char pci[32];
  double pinned_gbs, pageable_gbs;  /* < 0: not measured */
  char error[512];                  /* "" when the device works */
} gpu_info;

typedef struct {
  /* build */
  int cuda_backend, nccl_backend;
  int compiled_runtime;             /* CUDART_VERSION this nanotrain was built with */
  /* CPU */
  char cpu_model[256];
  long cores;
  unsigned long long mem_bytes;
  char blas_config[256];
  int blas_threads;
  /* CUDA */
  int runtime, driver;              /* 1000 * major + 10 * minor; driver 0: none */
  const char *status;               /* ok, no_driver, no_gpu, driver_too_old, error, cpu_build */
  int compatible;                   /* -1 unknown */
  char message[1024];
  char warning[512];
  int cublaslt[3], curand[3], nccl[3];  /* major, minor, patch; major < 0: absent */
  int n_gpus;
  gpu_info gpus[MAX_GPUS];
  size_t bandwidth_bytes;
  int exit_code;
} report;

static void read_cpu_model(char *out, size_t len) {
  snprintf(out, len, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    v[strcspn(v, "\n")] = '\0';
    snprintf(out, len, "%s", v);
    break;
  }
  fclose(f);
}

static void collect_cpu(report *r) {
  read_cpu_model(r->cpu_model, sizeof r->cpu_model);
  r->cores = sysconf(_SC_NPROCESSORS_ONLN);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  r->mem_bytes = (pages > 0 && page > 0) ? (unsigned long long)pages * (unsigned long long)page : 0;
  const char *cfg = openblas_get_config();
  snprintf(r->blas_config, sizeof r->blas_config, "%s", cfg ? cfg : "unknown");
  size_t n = strlen(r->blas_config);
  while (n && r->blas_config[n - 1] == ' ') r->blas_config[--n] = '\0';
  r->blas_threads = openblas_get_num_threads();
}

#ifdef NT_HAVE_CUDA
/* Times `reps` copies of `bytes` from host to device and keeps the best. */
static nt_status time_h2d(nt_ctx *ctx, void *dev, const void *host, size_t bytes, int reps,
                          double *gbs) {
  nt_event *e0 = NULL, *e1 = NULL;
  float best = 0;
  nt_status st = nt_event_create(ctx, &e0, true);
  if (!st) st = nt_event_create(ctx, &e1, true);
  for (int i = 0; !st && i < reps; i++) {
    float ms = 0;
    st = nt_event_record(ctx, e0, NULL);
    if (!st) st = NT_CUDA(ctx, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice,
                                               nt_cuda_stream(ctx)));
    if (!st) st = nt_event_record(ctx, e1, NULL);
    if (!st) st = nt_event_synchronize(ctx, e1);
    if (!st) st = nt_event_elapsed_ms(ctx, e0, e1, &ms);
    if (!st && ms > 0 && (best == 0 || ms < best)) best = ms;
  }
  *gbs = best > 0 ? (double)bytes / ((double)best * 1e6) : -1;
  nt_event_free(ctx, e0);
  nt_event_free(ctx, e1);
  return st;
}

static void measure_bandwidth(gpu_info *g, size_t bytes) {
  nt_ctx *ctx = NULL;
  void *dev = NULL, *pinned = NULL;
  char *pageable = NULL;
  nt_status st = nt_ctx_create_env(&ctx, nt_cuda(g->index));
  if (st) goto fail;
  if ((st = nt_alloc(ctx, bytes, &dev))) goto fail;
  if ((st = nt_pinned_alloc(ctx, bytes, &pinned))) goto fail;
  pageable = malloc(bytes);
  if (!pageable) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for a %zu-byte pageable buffer", bytes);
    goto fail;
  }
  memset(pageable, 1, bytes);      /* touch every page so the copy measures copying */
  memset(pinned, 1, bytes);
  if ((st = time_h2d(ctx, dev, pinned, bytes, 5, &g->pinned_gbs))) goto fail;
  if ((st = time_h2d(ctx, dev, pageable, bytes, 3, &g->pageable_gbs))) goto fail;
fail:
  if (st)
    snprintf(g->error, sizeof g->error, "bandwidth test failed: %s", nt_last_error(ctx));
  free(pageable);
  if (ctx) {
    nt_pinned_free(ctx, pinned);
    nt_free(ctx, dev);
  }
  nt_ctx_free(ctx);
}

static void version3(int *out, int major, int minor, int patch) {
  out[0] = major;
  out[1] = minor;
  out[2] = patch;
}

static void collect_libraries(report *r) {
  size_t lt = cublasLtGetVersion();
  version3(r->cublaslt, (int)(lt / 10000), (int)(lt / 100 % 100), (int)(lt % 100));
  int v = 0;
  if (curandGetVersion(&v) == CURAND_STATUS_SUCCESS)
    version3(r->curand, v / 1000, v % 1000 / 100, v % 100);
#ifdef NT_HAVE_NCCL
  v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) {
    if (v >= 10000) version3(r->nccl, v / 10000, v / 100 % 100, v % 100);
    else version3(r->nccl, v / 1000, v / 100 % 10, v % 100);   /* before 2.9 */
  }
#endif
}

static void collect_gpu(gpu_info *g, int index, size_t bandwidth_bytes) {
  g->index = index;
  g->pinned_gbs = g->pageable_gbs = -1;
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, index);
  if (e != cudaSuccess) {
    snprintf(g->error, sizeof g->error, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    (void)cudaGetLastError();
    return;
  }
  snprintf(g->name, sizeof g->name, "%s", p.name);
  g->cc_major = p.major;
  g->cc_minor = p.minor;
  g->mem_total = p.totalGlobalMem;
  g->sm_count = p.multiProcessorCount;
  g->ecc = p.ECCEnabled;
  g->l2_bytes = p.l2CacheSize;
  snprintf(g->pci, sizeof g->pci, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID,
           p.pciDeviceID);
  if ((e = cudaSetDevice(index)) != cudaSuccess ||
      (e = cudaMemGetInfo(&g->mem_free, &g->mem_total)) != cudaSuccess) {
    snprintf(g->error, sizeof g->error, "cannot use the device: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    (void)cudaGetLastError();
    return;
  }
  if (bandwidth_bytes) measure_bandwidth(g, bandwidth_bytes);
}

static void collect_cuda(report *r) {
  r->cuda_backend = 1;
  r->compiled_runtime = CUDART_VERSION;
#ifdef NT_HAVE_NCCL
  r->nccl_backend = 1;
#endif
  collect_libraries(r);
  if (cudaRuntimeGetVersion(&r->runtime) != cudaSuccess) r->runtime = CUDART_VERSION;
  if (cudaDriverGetVersion(&r->driver) != cudaSuccess) r->driver = 0;
  (void)cudaGetLastError();
  int rmaj = r->runtime / 1000, rmin = r->runtime % 1000 / 10;
  int dmaj = r->driver / 1000, dmin = r->driver % 1000 / 10;
  if (r->driver == 0) {
    r->status = "no_driver";
    snprintf(r->message, sizeof r->message,
             "no CUDA driver/GPU found: no NVIDIA driver is installed (libcuda is missing, "
             "cudaDriverGetVersion reports none); the CPU backend works (--device cpu)");
    return;
  }
  /* A runtime needs a driver of at least its major version; within one major version, minor
   * version compatibility lets an older driver run it (without JIT of newer PTX). */
  r->compatible = dmaj >= rmaj;
  if (!r->compatible) {
    r->status = "driver_too_old";
    r->exit_code = 1;
    snprintf(r->message, sizeof r->message,
             "the CUDA runtime is %d.%d but the installed driver supports CUDA only up to "
             "%d.%d: upgrade the NVIDIA driver to one supporting CUDA %d.%d, or use a CUDA "
             "toolkit/runtime <= %d.%d (rebuild nanotrain with it); the CPU backend still works",
             rmaj, rmin, dmaj, dmin, rmaj, rmin, dmaj, dmin);
    return;
  }
  if (r->driver < r->runtime)
    snprintf(r->warning, sizeof r->warning,
             "the driver supports CUDA %d.%d, older than the runtime %d.%d: this works through "
             "minor version compatibility, but PTX from newer toolkits cannot be JIT-compiled; "
             "consider a driver supporting CUDA %d.%d", dmaj, dmin, rmaj, rmin, rmaj, rmin);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    if (e == cudaSuccess || e == cudaErrorNoDevice) {
      r->status = "no_gpu";
      snprintf(r->message, sizeof r->message,
               "no CUDA driver/GPU found: the driver (CUDA %d.%d) is installed but sees no GPU "
               "(check CUDA_VISIBLE_DEVICES, or nvidia-smi); the CPU backend works "
               "(--device cpu)", dmaj, dmin);
    } else {
      r->status = "error";
      r->exit_code = 1;
      snprintf(r->message, sizeof r->message,
               "the CUDA driver (CUDA %d.%d) is installed but cudaGetDeviceCount failed: %s (%s);"
               " check nvidia-smi and dmesg; the CPU backend still works", dmaj, dmin,
               cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return;
  }
  r->n_gpus = n < MAX_GPUS ? n : MAX_GPUS;
  int failed = 0;
  for (int i = 0; i < r->n_gpus; i++) {
    collect_gpu(&r->gpus[i], i, r->bandwidth_bytes);
    failed += r->gpus[i].error[0] != '\0';
  }
  r->status = failed ? "error" : "ok";
  if (failed) r->exit_code = 1;
  snprintf(r->message, sizeof r->message, failed ? "%d of %d GPU(s) failed the checks"
                                                 : "%d GPU(s) ready", failed ? failed : n, n);
}
#endif

/* ---- output ------------------------------------------------------------------------------ */

static void print_version(FILE *f, const int *v) {
  if (v[0] < 0) fprintf(f, "not available");
  else fprintf(f, "%d.%d.%d", v[0], v[1], v[2]);
}

static void print_text(const report *r) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  printf("nanotrain doctor\n");
  printf("  build      CUDA backend %s", r->cuda_backend ? "on" : "off");
  if (r->cuda_backend)
    printf(" (built with CUDA runtime %d.%d), NCCL %s", r->compiled_runtime / 1000,
           r->compiled_runtime % 1000 / 10, r->nccl_backend ? "on" : "off");
  printf("\n  cpu        %s, %ld logical cores, %.1f GiB memory\n", r->cpu_model, r->cores,
         (double)r->mem_bytes / gib);
  printf("  openblas   %s, %d threads\n", r->blas_config, r->blas_threads);
  if (r->cuda_backend) {
    printf("  cuda       runtime %d.%d, driver ", r->runtime / 1000, r->runtime % 1000 / 10);
    if (r->driver) printf("supports CUDA %d.%d%s\n", r->driver / 1000, r->driver % 1000 / 10,
                          r->compatible == 1 ? " (compatible)" : " (INCOMPATIBLE)");
    else printf("none\n");
    printf("  libraries  cuBLASLt ");
    print_version(stdout, r->cublaslt);
    printf(", cuRAND ");
    print_version(stdout, r->curand);
    printf(", NCCL ");
    if (r->nccl_backend) print_version(stdout, r->nccl);
    else printf("not built");
    printf("\n");
  }
  for (int i = 0; i < r->n_gpus; i++) {
    const gpu_info *g = &r->gpus[i];
    printf("  GPU %d      %s, compute capability %d.%d, %.1f GiB (%.1f GiB free), %d SMs, ECC "
           "%s, L2 %.1f MiB, PCI %s\n", g->index, g->name, g->cc_major, g->cc_minor,
           (double)g->mem_total / gib, (double)g->mem_free / gib, g->sm_count,
           g->ecc ? "on" : "off", g->l2_bytes / 1048576.0, g->pci);
    if (g->pinned_gbs > 0)
      printf("             host->device %zu MiB copies: pinned %.1f GB/s, pageable %.1f GB/s\n",
             r->bandwidth_bytes >> 20, g->pinned_gbs, g->pageable_gbs);
    if (g->error[0]) printf("             ERROR: %s\n", g->error);
  }
  if (r->warning[0]) printf("  warning    %s\n", r->warning);
  printf("  status     %s%s\n", r->exit_code ? "ERROR: " : "", r->message);
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c == '\n') printf("\\n");
    else if (c == '\t') printf("\\t");
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static void json_version(const char *key, const int *v, int present) {
  printf("\"%s\": ", key);
  if (!present || v[0] < 0) printf("null");
  else printf("\"%d.%d.%d\"", v[0], v[1], v[2]);
}

static void json_cuda_version(const char *key, int v) {
  printf("\"%s\": ", key);
  if (v <= 0) printf("null");
  else printf("\"%d.%d\"", v / 1000, v % 1000 / 10);
}

static void json_gbs(const char *key, double v) {
  printf("\"%s\": ", key);
  if (v > 0) printf("%.2f", v);
  else printf("null");
}

static void print_json(const report *r) {
  printf("{\"nanotrain\": {\"cuda_backend\": %s, \"nccl_backend\": %s, ",
         r->cuda_backend ? "true" : "false", r->nccl_backend ? "true" : "false");
  json_cuda_version("built_with_cuda_runtime", r->compiled_runtime);
  printf("},\n \"cpu\": {\"model\": ");
  json_str(r->cpu_model);
  printf(", \"logical_cores\": %ld, \"memory_bytes\": %llu, \"openblas_config\": ", r->cores,
         r->mem_bytes);
  json_str(r->blas_config);
  printf(", \"openblas_threads\": %d},\n \"cuda\": {\"status\": ", r->blas_threads);
  json_str(r->status);
  printf(", \"message\": ");
  json_str(r->message);
  printf(", \"warning\": ");
  if (r->warning[0]) json_str(r->warning);
  else printf("null");
  printf(", ");
  json_cuda_version("runtime_version", r->runtime);
  printf(", ");
  json_cuda_version("driver_version", r->driver);
  printf(", \"compatible\": %s, ", r->compatible < 0 ? "null" : r->compatible ? "true" : "false");
  json_version("cublaslt_version", r->cublaslt, r->cuda_backend);
  printf(", ");
  json_version("curand_version", r->curand, r->cuda_backend);
  printf(", ");
  json_version("nccl_version", r->nccl, r->nccl_backend);
  printf("},\n \"gpus\": [");
  for (int i = 0; i < r->n_gpus; i++) {
    const gpu_info *g = &r->gpus[i];
    printf("%s\n  {\"index\": %d, \"name\": ", i ? "," : "", g->index);
    json_str(g->name);
    printf(", \"compute_capability\": \"%d.%d\", \"memory_total_bytes\": %zu, "
           "\"memory_free_bytes\": %zu, \"sm_count\": %d, \"ecc\": %s, \"l2_bytes\": %d, "
           "\"pci_bus_id\": ", g->cc_major, g->cc_minor, g->mem_total, g->mem_free,
           g->sm_count, g->ecc ? "true" : "false", g->l2_bytes);
    json_str(g->pci);
    printf(", \"h2d_bandwidth_bytes\": %zu, ", r->bandwidth_bytes);
    json_gbs("h2d_pinned_gbs", g->pinned_gbs);
    printf(", ");
    json_gbs("h2d_pageable_gbs", g->pageable_gbs);
    printf(", \"error\": ");
    if (g->error[0]) json_str(g->error);
    else printf("null");
    printf("}");
  }
  printf("%s],\n \"exit_code\": %d}\n", r->n_gpus ? "\n " : "", r->exit_code);
}

static void usage(FILE *f) {
  fprintf(f, "usage: doctor [--json] [--no-bandwidth] [--bandwidth-mib N]\n"
             "  checks the CUDA driver, runtime, GPUs, libraries and host<->device bandwidth\n");
}

int main(int argc, char **argv) {
  static report r;   /* large; zero-initialised */
  int json = 0;
  r.bandwidth_bytes = (size_t)256 << 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (!strcmp(argv[i], "--no-bandwidth")) {
      r.bandwidth_bytes = 0;
    } else if (!strcmp(argv[i], "--bandwidth-mib") && i + 1 < argc) {
      char *end;
      long mib = strtol(argv[++i], &end, 10);
      if (*end || mib <= 0 || mib > 65536) {
        fprintf(stderr, "doctor: --bandwidth-mib wants a size in MiB (1..65536), got '%s'\n",
                argv[i]);
        return 2;
      }
      r.bandwidth_bytes = (size_t)mib << 20;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "doctor: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  r.compatible = -1;
  r.cublaslt[0] = r.curand[0] = r.nccl[0] = -1;
  collect_cpu(&r);
#ifdef NT_HAVE_CUDA
  collect_cuda(&r);
#else
  r.status = "cpu_build";
  snprintf(r.message, sizeof r.message,
           "no CUDA driver/GPU used: this nanotrain was built without the CUDA backend "
           "(NT_CUDA=OFF, or no CUDA toolkit found at build time); the CPU backend works");
#endif
  if (json) print_json(&r);
  else print_text(&r);
  return r.exit_code;
}
