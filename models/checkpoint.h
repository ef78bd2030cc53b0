/* Training checkpoints, each one unit on disk.
 *
 * Layout of an out-dir:
 *   <out>/ckpt-<step>/ckpt.safetensors   the model's fp32 parameters under their names
 *                                        (loadable by numpy / torch's safetensors) and the AdamW
 *                                        moments ("optimizer.<unit>.exp_avg" / ".exp_avg_sq",
 *                                        1-D over the unit's flat buffer)
 *   <out>/ckpt-<step>/ckpt.json          the sidecar: step, scaler, RNG, loader position, config
 *   <out>/ckpt-<step>/MANIFEST.json      written last: each file's size and SHA-256, the step and
 *                                        a sequence number that orders the checkpoints
 *   <out>/latest                         one line naming the newest checkpoint directory
 *   <out>/.lock                          held (flock) by the run writing into <out>
 * A save writes everything into a new directory <out>/.tmp-ckpt-<pid>-<random>, fsyncs the files
 * and the directory, renames it to ckpt-<step> (an existing one of the same step is exchanged
 * atomically), fsyncs <out>, then replaces `latest` atomically and prunes old checkpoints. A
 * kill at any moment leaves either the previous checkpoint or the new one, never a mixed pair;
 * the temporaries of dead processes are removed by the next save or lock. Once the rename is
 * done the checkpoint is saved: a failure of the steps after it is reported (`warned`, the
 * context's message), not returned.
 *
 * Readers accept a checkpoint directory, an out-dir (the complete checkpoint with the highest
 * sequence number, which `latest` names unless its update failed or was cut short: `latest` is
 * for people and scripts), or a path to a file inside a checkpoint directory; they verify the
 * manifest and refuse a missing, partial, mismatched or tampered checkpoint with NT_ERR_FORMAT
 * naming the file. Checkpoints without a manifest (older nanotrain) are refused. */
#ifndef NT_MODELS_CHECKPOINT_H
#define NT_MODELS_CHECKPOINT_H
#include "core/nt.h"
#include "models/module.h"
#include "optim/adamw.h"
#include "models/json.h"
NT_EXTERN_C_BEGIN

/* How many checkpoints nt_checkpoint_save keeps (the newest by sequence). */
#define NT_CHECKPOINT_KEEP_DEFAULT 3

/* Paths of the two files for a checkpoint directory (or a path ending in .safetensors/.json,
 * whose directory and stem are used). Pure string work: no resolution of an out-dir. */
void nt_checkpoint_paths(const char *where, char *tensors, char *sidecar, size_t len);

/* mkdir -p */
nt_status nt_make_dirs(nt_ctx *ctx, const char *dir);

/* Writes the parameters (master weights) and, when opt is given, its moments, and the sidecar
 * text (a JSON object; its integer "iter" names the directory, else the sequence number does)
 * as one checkpoint under out_dir, then keeps the newest NT_CHECKPOINT_KEEP_DEFAULT. */
nt_status nt_checkpoint_save(nt_ctx *ctx, const char *out_dir, const nt_params *p,
                             nt_adamw *opt, const char *sidecar_json);
/* The same with `keep` checkpoints kept (0 keeps all); `saved` (optional, PATH_MAX bytes) gets
 * the new checkpoint's directory. `warned` (optional) is set when the checkpoint is in place
 * but syncing out_dir, updating `latest` or pruning failed: the call returns NT_OK and the
 * context's message (nt_last_error) names the checkpoint and what failed. */
nt_status nt_checkpoint_save_keep(nt_ctx *ctx, const char *out_dir, const nt_params *p,
                                  nt_adamw *opt, const char *sidecar_json, int keep,
                                  char *saved, bool *warned);
/* A save in stages, for a checkpoint that several processes write (sharded data parallel,
 * each rank its own files; they share the file system):
 *   begin   (one process) creates the temporary directory under out_dir, into tmp[PATH_MAX];
 *   ...     every writer puts its files into tmp, each written atomically and fsynced
 *           (nt_safetensors_save does), and reports name, size and SHA-256 to the committer;
 *   commit  (the process that called begin, after every writer has finished) writes the
 *           sidecar, then the manifest last (the local ckpt.safetensors / ckpt.json hashed
 *           here, `files` as reported, `layout` a JSON object stored as the manifest's
 *           "sharded" member, NULL for none), renames the directory into place, updates
 *           `latest` and prunes to `keep`, exactly as nt_checkpoint_save_keep (`saved`,
 *           `warned` as there);
 *   abort   removes the temporary directory (a failed writer).
 * A checkpoint with a "sharded" member needs no ckpt.safetensors; its listed files must be
 * plain names ending in .safetensors. */
typedef struct {
  char name[64];
  uint64_t size;
  char sha256[65];
} nt_checkpoint_file;
nt_status nt_checkpoint_stage_begin(nt_ctx *ctx, const char *out_dir, char *tmp);
nt_status nt_checkpoint_stage_commit(nt_ctx *ctx, const char *out_dir, const char *tmp,
                                     const char *sidecar_json, const nt_checkpoint_file *files,
                                     int n_files, const char *layout, int keep, char *saved,
                                     bool *warned);
void nt_checkpoint_stage_abort(const char *tmp);
/* Writes dir/ckpt.safetensors: the parameters' master values under their names and, when opt
 * is given, its moments (what nt_checkpoint_save_keep writes). */
nt_status nt_checkpoint_write_tensors(nt_ctx *ctx, const char *dir, const nt_params *p,
                                      nt_adamw *opt);
/* Resolves `where` and checks every listed file's size; *manifest (caller frees with
 * nt_json_free) gets the parsed manifest, dir[len] the directory. */
nt_status nt_checkpoint_manifest(nt_ctx *ctx, const char *where, char *dir, size_t len,
                                 nt_json *manifest);
/* Checks the SHA-256 of one file that the manifest of dir lists. */
nt_status nt_checkpoint_verify_file(nt_ctx *ctx, const char *dir, const nt_json *manifest,
                                    const char *name);

/* The checkpoint directory that `where` designates (see above), into dir[len]. */
nt_status nt_checkpoint_resolve(nt_ctx *ctx, const char *where, char *dir, size_t len);
/* Checks dir's manifest: every listed file has its size, and when `hash_all` its SHA-256
 * (else only the sidecar's). */
nt_status nt_checkpoint_verify(nt_ctx *ctx, const char *dir, bool hash_all);
/* Reads the sidecar's text (caller frees) after resolving and verifying. */
nt_status nt_checkpoint_read_sidecar(nt_ctx *ctx, const char *where, char **json);
/* Loads the parameters into the master buffers (then refreshes the compute copies) and, when
 * opt is given, its moments, after resolving and verifying every file's SHA-256. Every
 * parameter must be present with its exact shape. */
nt_status nt_checkpoint_load_tensors(nt_ctx *ctx, const char *where, nt_params *p,
                                     nt_adamw *opt);
/* Removes all but the newest `keep` checkpoints (by sequence; `latest`'s target is always
 * kept). keep <= 0 keeps all. */
nt_status nt_checkpoint_prune(nt_ctx *ctx, const char *out_dir, int keep);
/* Removes the save temporaries in out_dir: those of dead processes, or all when `all` (the
 * caller holds the out-dir's lock). */
void nt_checkpoint_clean_stale(const char *out_dir, bool all);

/* The out-dir lock: a second run on the same out-dir fails at once (NT_ERR_STATE) with a
 * message naming the other run's pid. Creates out_dir. Taking the lock also removes every
 * save temporary left there. Released by nt_outdir_unlock or when the process dies. */
typedef struct nt_outdir_lock nt_outdir_lock;
nt_status nt_outdir_lock_take(nt_ctx *ctx, const char *out_dir, nt_outdir_lock **out);
void nt_outdir_unlock(nt_outdir_lock *lk);          /* NULL is a no-op */

NT_EXTERN_C_END
#endif
