/* Saving and restoring a stateful object's plain fields from one table, so a checkpoint's
 * writer and reader cannot drift apart: each object lists its fields once (name, type, offset,
 * accepted range) and both directions walk that list.
 *
 *   static const nt_state_field pos_fields[] = {
 *       NT_STATE_FIELD(loop_pos, iter, NT_STATE_I64, 0, NT_MAX_ITERS),
 *       NT_STATE_FIELD(loop_pos, epoch, NT_STATE_U64, 0, NT_STATE_ANY)};
 *   nt_jw_key(w, "position"); nt_jw_begin(w, '{');
 *   nt_state_write(w, pos_fields, 2, &pos); nt_jw_end(w, '}');
 *   ... nt_state_read(ctx, nt_json_get(root, "position"), pos_fields, 2, &pos, sizeof pos,
 *                     "ckpt.json position");
 *
 * Reading is all-or-nothing: every field must be present, of its type and within [min, max]
 * (integers exactly, with no wrap-around; floats finite); otherwise NT_ERR_FORMAT names the
 * object, the field and the value, and the object is left unchanged. Floats are written with
 * enough digits to read back bit-identically (9 for F32, 17 for F64). */
#ifndef NT_MODELS_STATE_H
#define NT_MODELS_STATE_H
#include <math.h>
#include <stddef.h>
#include "core/nt.h"
#include "models/json.h"
#include "amp/scaler.h"
#include "data/text.h"
NT_EXTERN_C_BEGIN

typedef enum {
  NT_STATE_I32 = 0, NT_STATE_I64, NT_STATE_U64, NT_STATE_F32, NT_STATE_F64, NT_STATE_BOOL
} nt_state_type;

/* min/max: inclusive bounds; NT_STATE_ANY as a bound means the type's own limit. Integer
 * bounds are exact up to 2^53 (use NT_STATE_ANY beyond). Ignored for BOOL. */
#define NT_STATE_ANY INFINITY

typedef struct {
  const char *name;
  nt_state_type type;
  size_t offset;
  double min, max;
} nt_state_field;

#define NT_STATE_FIELD(type_, member, kind, lo, hi) \
  {#member, kind, offsetof(type_, member), (lo), (hi)}
/* The same with an explicit name (nested members: "n_layer" for gpt.n_layer). */
#define NT_STATE_FIELD_NAMED(name, type_, member, kind, lo, hi) \
  {name, kind, offsetof(type_, member), (lo), (hi)}

/* Writes "name": value for each field (inside an object the caller opened). */
void nt_state_write(nt_jw *w, const nt_state_field *fields, int n, const void *obj);
/* Reads every field from the JSON object `src` into obj (obj_size bytes), all or nothing.
 * `what` names the object in messages. */
nt_status nt_state_read(nt_ctx *ctx, const nt_json *src, const nt_state_field *fields, int n,
                        void *obj, size_t obj_size, const char *what);

/* Resume: the saved object's fields replace obj's, except those the user set on the command
 * line. `given` lists the options given (as typed without dashes, e.g. "lr", "n-layer"); a
 * field matches an option when their names agree with '-' read as '_'. A given field listed in
 * `overridable` (option names too, e.g. "max-iters") keeps obj's value; a given field that is
 * not overridable and differs from the saved value is a conflict. Conflicts are
 * NT_ERR_INVALID_ARG naming every one with both values ("--lr 0.003 (the checkpoint has
 * 0.001)") and leave obj unchanged; a malformed saved object is NT_ERR_FORMAT. */
nt_status nt_state_merge(nt_ctx *ctx, const nt_json *saved, const nt_state_field *fields, int n,
                         void *obj, size_t obj_size, const char *const *given, int n_given,
                         const char *const *overridable, int n_overridable, const char *what);

/* The character vocabulary in a sidecar: a JSON array of the byte values of ids 0..size-1
 * (written after a key the caller wrote). */
void nt_vocab_write_json(nt_jw *w, const nt_vocab *v);
/* Reads such an array into *out (every byte distinct; NT_ERR_FORMAT otherwise). */
nt_status nt_vocab_read_json(nt_ctx *ctx, const nt_json *saved, nt_vocab *out);
/* Resume: the checkpoint's vocabulary must equal the corpus's, else NT_ERR_INVALID_ARG saying
 * the checkpoint was trained on another text (sizes and the first differing id). A missing
 * array (a checkpoint from before vocabularies were saved) is NT_ERR_FORMAT. */
nt_status nt_vocab_check_json(nt_ctx *ctx, const nt_json *saved, const nt_vocab *v);

/* The loss scaler's checkpoint fields (amp/scaler.h nt_scaler_state), growth tracker
 * included. */
extern const nt_state_field nt_scaler_state_fields[];
extern const int nt_scaler_state_n_fields;

NT_EXTERN_C_END
#endif
