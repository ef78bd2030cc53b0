/* Training checkpoints: <dir>/ckpt.safetensors holds the model's fp32 parameters under their
 * names (loadable by numpy / torch's safetensors) and the AdamW moments of every unit
 * ("optimizer.<unit>.exp_avg" / ".exp_avg_sq", 1-D over the unit's flat buffer);
 * <dir>/ckpt.json (the sidecar) holds everything else: step, scaler, RNG, loader position,
 * config. Both files are written atomically (tmp + fsync + rename), the tensors first, so a
 * sidecar always refers to a complete tensor file. */
#ifndef NT_MODELS_CHECKPOINT_H
#define NT_MODELS_CHECKPOINT_H
#include "core/nt.h"
#include "models/module.h"
#include "optim/adamw.h"
NT_EXTERN_C_BEGIN

/* Paths of the two files for a checkpoint directory (or a path ending in .safetensors/.json,
 * whose directory and stem are used). */
void nt_checkpoint_paths(const char *where, char *tensors, char *sidecar, size_t len);

/* mkdir -p */
nt_status nt_make_dirs(nt_ctx *ctx, const char *dir);

/* Writes the parameters (master weights) and, when opt is given, its moments; then the sidecar
 * text (a JSON object) as given. Creates `dir` if needed. */
nt_status nt_checkpoint_save(nt_ctx *ctx, const char *dir, const nt_params *p, nt_adamw *opt,
                             const char *sidecar_json);
/* Reads the sidecar's text (caller frees). */
nt_status nt_checkpoint_read_sidecar(nt_ctx *ctx, const char *where, char **json);
/* Loads the parameters into the master buffers (then refreshes the compute copies) and, when
 * opt is given, its moments. Every parameter must be present with its exact shape. */
nt_status nt_checkpoint_load_tensors(nt_ctx *ctx, const char *where, nt_params *p,
                                     nt_adamw *opt);

NT_EXTERN_C_END
#endif
