/* Memory estimates for training a model (tools/memest, and nanotrain's end-of-run line):
 * per rank, bytes of
 *   parameters     the compute copy the kernels read (the fp32 master itself under fp32/tf32)
 *   gradients      fp32, one flat buffer per unit
 *   master         fp32 master weights (only when the compute copy is 16-bit)
 *   optimizer      AdamW's two fp32 moments
 *   activations    everything the model allocates at create (saved activations + scratch)
 *   workspace      cuBLASLt workspace and op scratch (a fixed allowance)
 * under NO_SHARD / SHARD_GRAD_OP / FULL_SHARD for a world size (docs/semantics.md: ZeRO-2 shards
 * gradients, master weights and optimizer state; ZeRO-3 the parameters too, with at most two
 * units gathered at once), next to the ZeRO paper's formula for mixed-precision Adam (K = 12)
 * and the rule of thumb "parameters x 4 + batch x (input + output) x 4". */
#ifndef NT_TRAIN_MEMEST_H
#define NT_TRAIN_MEMEST_H
#include <stdio.h>
#include "core/nt.h"
#include "models/module.h"
#include "dist/shard.h"
NT_EXTERN_C_BEGIN


/* The GPU's allowance for the cuBLASLt workspace and op scratch (0 on the CPU). */
#define NT_MEMEST_WORKSPACE_BYTES (64.0 * 1024 * 1024)

typedef struct {
  int64_t n_params;
  double parameters, gradients, master, optimizer, activations, workspace, total;
  double zero_formula;      /* 16P (DP), 2P + 14P/N (ZeRO-2), 16P/N (ZeRO-3) */
  double rule_of_thumb;     /* P * 4 + batch * (input + output) * 4 */
} nt_mem_estimate;

/* sizes from nt_gpt_estimate / nt_cnn_estimate; input/output: elements per sample. */
void nt_memest_compute(const nt_model_sizes *sizes, nt_dtype compute_dtype, int64_t batch,
                       int64_t input_elems, int64_t output_elems, nt_sharding sharding,
                       int world, double workspace_bytes, nt_mem_estimate *out);
/* Prints the breakdown as a table (one line per part), with an optional measured peak
 * (bytes; < 0 for none). */
void nt_memest_print(FILE *f, const nt_mem_estimate *e, double measured_peak);

NT_EXTERN_C_END
#endif
