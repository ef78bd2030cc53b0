#include "train/memest.h"
#include <string.h>
#include <strings.h>

void nt_memest_compute(const nt_model_sizes *sz, nt_dtype compute_dtype, int64_t batch,
                       int64_t input_elems, int64_t output_elems, nt_sharding sharding,
                       int world, double workspace_bytes, nt_mem_estimate *e) {
  memset(e, 0, sizeof *e);
  double P = (double)sz->n_flat, N = world < 1 ? 1 : world;
  double cs = (double)nt_dtype_size(compute_dtype);
  bool separate = compute_dtype != NT_F32;
  e->n_params = sz->n_params;
  e->parameters = P * cs;
  e->gradients = P * 4;
  e->master = separate ? P * 4 : 0;
  e->optimizer = P * 8;
  if (sharding != NT_SHARD_NO_SHARD) {
    /* ZeRO-2: gradients reduce-scattered (a unit's full gradient exists until its
     * reduce-scatter); master weights and moments sharded. */
    e->gradients = P * 4 / N + (N > 1 ? (double)sz->largest_unit * 4 : 0);
    e->master /= N;
    e->optimizer /= N;
  }
  if (sharding == NT_SHARD_FULL) {
    /* ZeRO-3: parameters sharded; at most two units gathered (limit_all_gathers). */
    double gathered = N > 1 ? 2.0 * (double)sz->largest_unit * cs : 0;
    e->parameters = e->parameters / N + gathered;
  }
  e->activations = (double)sz->activation_bytes;
  e->workspace = workspace_bytes;
  e->total = e->parameters + e->gradients + e->master + e->optimizer + e->activations +
             e->workspace;
  double p = (double)sz->n_params;
  e->zero_formula = sharding == NT_SHARD_NO_SHARD ? 16 * p
                    : sharding == NT_SHARD_GRAD_OP ? 2 * p + 14 * p / N
                                                  : 16 * p / N;
  e->rule_of_thumb = p * 4 + (double)batch * (double)(input_elems + output_elems) * 4;
}

static void line(FILE *f, const char *what, double bytes, double total) {
  fprintf(f, "  %-18s %12.2f MiB  %5.1f%%\n", what, bytes / 1048576.0,
          total > 0 ? 100.0 * bytes / total : 0.0);
}

void nt_memest_print(FILE *f, const nt_mem_estimate *e, double measured_peak) {
  fprintf(f, "  %-18s %12lld\n", "parameters (count)", (long long)e->n_params);
  line(f, "parameters", e->parameters, e->total);
  line(f, "gradients", e->gradients, e->total);
  line(f, "master weights", e->master, e->total);
  line(f, "optimizer state", e->optimizer, e->total);
  line(f, "activations", e->activations, e->total);
  line(f, "workspace", e->workspace, e->total);
  fprintf(f, "  %-18s %12.2f MiB\n", "estimate (total)", e->total / 1048576.0);
  fprintf(f, "  %-18s %12.2f MiB  (model states by the ZeRO paper's formula, K=12)\n",
          "ZeRO formula", e->zero_formula / 1048576.0);
  fprintf(f, "  %-18s %12.2f MiB  (params x 4 + batch x (input + output) x 4)\n",
          "rule of thumb", e->rule_of_thumb / 1048576.0);
  if (measured_peak >= 0)
    fprintf(f, "  %-18s %12.2f MiB  (%+.1f%% vs the estimate)\n", "measured peak",
            measured_peak / 1048576.0,
            e->total > 0 ? 100.0 * (measured_peak - e->total) / e->total : 0.0);
}
