/* Checkpoints as one unit: SHA-256 against the FIPS 180-4 / NIST vectors, the directory layout
 * (ckpt-<step>/ with a manifest, `latest`), resume from the out-dir, a checkpoint dir or a file
 * in it, refusal of tampered, truncated, partial and manifest-less checkpoints, pruning to K,
 * stale temporaries, a save whose update of `latest` fails, the out-dir lock (a second process
 * names the holder's pid) and the range-checked JSON getters. */
#include "tests/testutil.h"
#include "models/checkpoint.h"
#include "models/json.h"
#include "models/safetensors.h"
#include "models/sha256.h"
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static void test_sha256(void) {
  static const struct { const char *msg; const char *hex; } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
       "lmnopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"}};
  char hex[65];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    nt_sha256_hex(v[i].msg, strlen(v[i].msg), hex);
    CHECK(!strcmp(hex, v[i].hex), "vector %zu: %s", i, hex);
  }
  /* one million 'a', fed in uneven pieces (exercises the partial-block path) */
  nt_sha256 s;
  uint8_t d[32];
  char a[1024];
  memset(a, 'a', sizeof a);
  nt_sha256_init(&s);
  size_t left = 1000000, piece = 1;
  while (left) {
    size_t k = piece < left ? piece : left;
    nt_sha256_update(&s, a, k);
    left -= k;
    piece = piece % 997 + 13;
  }
  nt_sha256_final(&s, d);
  nt_sha256_to_hex(d, hex);
  CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
        "a million 'a': %s", hex);
  /* message lengths around the padding boundary, against one-shot hashing */
  char m[130], h1[65], h2[65];
  for (int i = 0; i < 130; i++) m[i] = (char)(i * 7 + 1);
  bool same = true;
  for (int n = 50; n < 130; n++) {
    nt_sha256_hex(m, (size_t)n, h1);
    nt_sha256_init(&s);
    nt_sha256_update(&s, m, (size_t)n / 3);
    nt_sha256_update(&s, m + n / 3, (size_t)(n - n / 3));
    nt_sha256_final(&s, d);
    nt_sha256_to_hex(d, h2);
    same &= !strcmp(h1, h2);
  }
  CHECK(same, "split updates hash as one");
}

static void test_json_ranges(nt_ctx *ctx) {
  const char *text = "{\"n_layer\": 4294967298, \"iter\": -50, \"ok\": 12, \"f\": 2.5, "
                     "\"frac\": 2.0, \"exp\": 1e3, \"big\": 99999999999999999999, \"s\": \"7\", "
                     "\"u\": 18446744073709551615, \"neg0\": -0, \"huge\": 1e400}";
  nt_json j;
  if (!CHECK_OK(ctx, nt_json_parse(ctx, text, strlen(text), "t", &j))) return;
  int64_t v = 77;
  int iv = 77;
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int32_in(ctx, &j, "n_layer", 1, 1024, &iv));
  CHECK(strstr(nt_last_error(ctx), "'n_layer' = 4294967298") != NULL, "names field and value: %s",
        nt_last_error(ctx));
  CHECK(iv == 77, "no write on error (a wrap-around to 2 would be %d)", iv);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "iter", 0, INT64_MAX, &v));
  CHECK(strstr(nt_last_error(ctx), "'iter' = -50") != NULL, "%s", nt_last_error(ctx));
  CHECK_OK(ctx, nt_json_get_int_in(ctx, &j, "ok", 0, 12, &v));
  CHECK(v == 12, "in range, inclusive max");
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "ok", 13, 20, &v));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "f", 0, 100, &v));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "frac", 0, 100, &v));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "exp", 0, 10000, &v));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "big", INT64_MIN, INT64_MAX, &v));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "s", 0, 100, &v));
  CHECK(strstr(nt_last_error(ctx), "a string") != NULL, "type named: %s", nt_last_error(ctx));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_int_in(ctx, &j, "absent", 0, 100, &v));
  CHECK(strstr(nt_last_error(ctx), "'absent' is missing") != NULL, "%s", nt_last_error(ctx));
  uint64_t u = 0;
  CHECK_OK(ctx, nt_json_get_uint_in(ctx, &j, "u", 0, UINT64_MAX, &u));
  CHECK(u == UINT64_MAX, "u64 max exact");
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_uint_in(ctx, &j, "iter", 0, UINT64_MAX, &u));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_uint_in(ctx, &j, "u", 0, INT64_MAX, &u));
  CHECK_OK(ctx, nt_json_get_int_in(ctx, &j, "neg0", 0, 1, &v));
  double d = 0;
  CHECK_OK(ctx, nt_json_get_num_in(ctx, &j, "f", 0, 3, &d));
  CHECK(d == 2.5, "double in range");
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_num_in(ctx, &j, "f", 3, 4, &d));
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_get_num_in(ctx, &j, "huge", -1e308, 1e308, &d));
  nt_json_free(&j);
}

/* Malformed input the fuzzers found or that the readers must refuse: JSON numbers outside the
 * grammar, bad escapes, safetensors shapes whose element count overflows or that are negative. */
static void test_malformed(nt_ctx *ctx) {
  static const char *const bad_json[] = {"01", "1.", "-", "1e", "+1", "1e5e5", "\"\\x\"",
                                         "\"\\u12\"", "\"\\u12zz\"", "[1,]", "{\"a\"}"};
  for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
    nt_json j;
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_json_parse(ctx, bad_json[i], strlen(bad_json[i]), "t", &j));
  }
  nt_json j;
  const char *good = "[0, -0.5e-3, 12E+2, \"\\/\\u0041\"]";
  if (CHECK_OK(ctx, nt_json_parse(ctx, good, strlen(good), "t", &j))) {
    CHECK(j.n == 4 && nt_json_num(&j.items[2], 0) == 1200 && !strcmp(j.items[3].str, "/A"),
          "valid numbers and escapes");
    nt_json_free(&j);
  }
  static const char *const bad_headers[] = {
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}"};
  for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
    char path[PATH_MAX], file[512];
    size_t hl = strlen(bad_headers[i]);
    memset(file, 0, sizeof file);
    for (int k = 0; k < 8; k++) file[k] = (char)((uint64_t)hl >> (8 * k));
    memcpy(file + 8, bad_headers[i], hl);
    snprintf(path, sizeof path, "%s/bad%zu.safetensors", dir, i);
    nt_write_file_atomic(ctx, path, file, 8 + hl + 4);
    nt_safetensors *f = NULL;
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_safetensors_open(ctx, path, &f));
    nt_safetensors_close(f);
  }
}

/* A small model whose every parameter holds `value`. */
static bool make_params(nt_ctx *ctx, nt_params *p, int64_t n) {
  memset(p, 0, sizeof *p);
  int u;
  int64_t shape[1] = {n};
  return CHECK_OK(ctx, nt_params_add_unit(ctx, p, "u", &u)) &&
         CHECK_OK(ctx, nt_params_add(ctx, p, u, "u.w", 1, shape, true, NT_INIT_ZEROS, 0, NULL)) &&
         CHECK_OK(ctx, nt_params_alloc(ctx, p, NT_F32));
}

static void fill(nt_params *p, float v) {
  nt_tensor m = nt_params_view(p, 0, 0, NT_VIEW_MASTER);
  for (int64_t i = 0; i < m.shape[0]; i++) ((float *)m.data)[i] = v;
}

static float first(nt_params *p) { return ((float *)nt_params_view(p, 0, 0, NT_VIEW_MASTER).data)[0]; }

static int count_entries(const char *d, const char *prefix) {
  DIR *dd = opendir(d);
  int n = 0;
  struct dirent *e;
  while (dd && (e = readdir(dd))) n += !strncmp(e->d_name, prefix, strlen(prefix));
  if (dd) closedir(dd);
  return n;
}

static void save_step(nt_ctx *ctx, nt_params *p, const char *out, int step, int keep) {
  char side[128];
  snprintf(side, sizeof side, "{\"format\":\"nanotrain-checkpoint\",\"iter\":%d}", step);
  fill(p, (float)step);
  CHECK_OK(ctx, nt_checkpoint_save_keep(ctx, out, p, NULL, side, keep, NULL, NULL));
}

static void corrupt_byte(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  if (!f) return;
  fseek(f, at, SEEK_SET);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
}

static void test_layout(nt_ctx *ctx) {
  nt_params p;
  if (!make_params(ctx, &p, 1000)) return;
  char out[512], path[PATH_MAX], res[PATH_MAX], *side = NULL;
  snprintf(out, sizeof out, "%s/run", dir);
  for (int s = 10; s <= 50; s += 10) save_step(ctx, &p, out, s, 3);
  CHECK(count_entries(out, "ckpt-") == 3, "pruned to 3 (%d)", count_entries(out, "ckpt-"));
  snprintf(path, sizeof path, "%s/ckpt-20", out);
  CHECK(access(path, F_OK) != 0, "the oldest are removed");
  CHECK_OK(ctx, nt_checkpoint_resolve(ctx, out, res, sizeof res));
  CHECK(strstr(res, "/ckpt-50") != NULL, "latest resolves to ckpt-50: %s", res);
  fill(&p, 0);
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, out, &p, NULL));
  CHECK(first(&p) == 50, "out-dir loads the latest (%g)", first(&p));
  snprintf(path, sizeof path, "%s/ckpt-40", out);
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, path, &p, NULL));
  CHECK(first(&p) == 40, "a checkpoint dir loads itself (%g)", first(&p));
  snprintf(path, sizeof path, "%s/ckpt-30/ckpt.json", out);
  if (CHECK_OK(ctx, nt_checkpoint_read_sidecar(ctx, path, &side))) {
    CHECK(strstr(side, "\"iter\":30") != NULL, "a file path reads its dir's sidecar");
    free(side);
  }
  /* the same step again replaces its directory atomically */
  save_step(ctx, &p, out, 50, 3);
  fill(&p, 50.5f);
  CHECK_OK(ctx, nt_checkpoint_save_keep(ctx, out, &p, NULL,
                                        "{\"format\":\"nanotrain-checkpoint\",\"iter\":50}", 3,
                                        NULL, NULL));
  fill(&p, 0);
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, out, &p, NULL));
  CHECK(first(&p) == 50.5f, "a re-save of step 50 replaced it (%g)", first(&p));
  CHECK(count_entries(out, ".tmp-") == 0, "no temporaries left");

  /* tampering: a flipped byte in the tensors, then in the sidecar */
  snprintf(path, sizeof path, "%s/ckpt-50/ckpt.safetensors", out);
  corrupt_byte(path, 200);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_load_tensors(ctx, out, &p, NULL));
  CHECK(strstr(nt_last_error(ctx), "SHA-256") != NULL, "%s", nt_last_error(ctx));
  corrupt_byte(path, 200);
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, out, &p, NULL));
  snprintf(path, sizeof path, "%s/ckpt-50/ckpt.json", out);
  corrupt_byte(path, 3);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_read_sidecar(ctx, out, &side));
  corrupt_byte(path, 3);
  /* truncated tensors */
  snprintf(path, sizeof path, "%s/ckpt-50/ckpt.safetensors", out);
  char *raw;
  size_t len;
  if (CHECK_OK(ctx, nt_read_file(ctx, path, &raw, &len))) {
    CHECK_OK(ctx, nt_write_file_atomic(ctx, path, raw, len - 4));
    CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_read_sidecar(ctx, out, &side));
    CHECK(strstr(nt_last_error(ctx), "manifest says") != NULL, "%s", nt_last_error(ctx));
    /* a pair from two steps: step 40's sidecar beside step 50's tensors */
    CHECK_OK(ctx, nt_write_file_atomic(ctx, path, raw, len));
    free(raw);
  }
  char other[PATH_MAX];
  snprintf(other, sizeof other, "%s/ckpt-40/ckpt.json", out);
  snprintf(path, sizeof path, "%s/ckpt-50/ckpt.json", out);
  if (CHECK_OK(ctx, nt_read_file(ctx, other, &raw, &len))) {
    char *keep;
    size_t klen;
    if (CHECK_OK(ctx, nt_read_file(ctx, path, &keep, &klen))) {
      CHECK_OK(ctx, nt_write_file_atomic(ctx, path, raw, len));
      CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_read_sidecar(ctx, out, &side));
      CHECK_OK(ctx, nt_write_file_atomic(ctx, path, keep, klen));
      free(keep);
    }
    free(raw);
  }
  /* no manifest: partial, or an older nanotrain's */
  snprintf(path, sizeof path, "%s/ckpt-50/MANIFEST.json", out);
  snprintf(other, sizeof other, "%s/ckpt-50/MANIFEST.away", out);
  rename(path, other);
  snprintf(res, sizeof res, "%s/ckpt-50", out);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_load_tensors(ctx, res, &p, NULL));
  CHECK(strstr(nt_last_error(ctx), "without a manifest") != NULL, "%s", nt_last_error(ctx));
  rename(other, path);
  /* a stale temporary of a dead process is removed by the next save; a live one is kept */
  char stale[PATH_MAX], live[PATH_MAX];
  snprintf(stale, sizeof stale, "%s/.tmp-ckpt-999999999-00", out);
  snprintf(live, sizeof live, "%s/.tmp-ckpt-%ld-00", out, (long)getpid());
  mkdir(stale, 0755);
  mkdir(live, 0755);
  save_step(ctx, &p, out, 60, 3);
  CHECK(access(stale, F_OK) != 0 && access(live, F_OK) == 0, "only the dead one's removed");
  rmdir(live);
  /* legacy layout: ckpt.json beside ckpt.safetensors, no manifest */
  char legacy[512];
  snprintf(legacy, sizeof legacy, "%s/legacy", dir);
  nt_make_dirs(ctx, legacy);
  snprintf(path, sizeof path, "%s/ckpt.json", legacy);
  nt_write_file_atomic(ctx, path, "{}", 2);
  CHECK_ERR(ctx, NT_ERR_FORMAT, nt_checkpoint_read_sidecar(ctx, legacy, &side));
  CHECK(strstr(nt_last_error(ctx), "without a manifest") != NULL, "%s", nt_last_error(ctx));
  snprintf(path, sizeof path, "%s/empty", dir);
  nt_make_dirs(ctx, path);
  CHECK_ERR(ctx, NT_ERR_IO, nt_checkpoint_read_sidecar(ctx, path, &side));
  CHECK(strstr(nt_last_error(ctx), "no checkpoint") != NULL, "%s", nt_last_error(ctx));
  /* `latest` missing (a kill between the rename and the pointer): the highest sequence wins */
  snprintf(path, sizeof path, "%s/latest", out);
  unlink(path);
  CHECK_OK(ctx, nt_checkpoint_resolve(ctx, out, res, sizeof res));
  CHECK(strstr(res, "/ckpt-60") != NULL, "highest sequence: %s", res);
  nt_params_free(ctx, &p);
}

/* Once renamed into place a checkpoint is saved: a `latest` that cannot be replaced (a directory
 * in its place) is reported with the complete checkpoint's name, the call succeeds, and the
 * out-dir still resolves to that newest checkpoint. */
static void test_late_failure(nt_ctx *ctx) {
  nt_params p;
  if (!make_params(ctx, &p, 100)) return;
  char out[512], path[PATH_MAX], res[PATH_MAX], saved[PATH_MAX] = "";
  snprintf(out, sizeof out, "%s/late", dir);
  save_step(ctx, &p, out, 1, 3);
  snprintf(path, sizeof path, "%s/latest", out);
  unlink(path);
  CHECK(mkdir(path, 0755) == 0, "a directory in the place of `latest`");
  fill(&p, 2);
  bool warned = false;
  CHECK_OK(ctx, nt_checkpoint_save_keep(ctx, out, &p, NULL,
                                        "{\"format\":\"nanotrain-checkpoint\",\"iter\":2}", 3,
                                        saved, &warned));
  const char *msg = nt_last_error(ctx);
  CHECK(warned, "the failed update of `latest` is reported");
  CHECK(strstr(msg, "/ckpt-2 is complete") && strstr(msg, "updating `latest`"), "%s", msg);
  CHECK(strstr(saved, "/ckpt-2") != NULL, "saved names the new checkpoint: %s", saved);
  CHECK_OK(ctx, nt_checkpoint_resolve(ctx, out, res, sizeof res));
  CHECK(strstr(res, "/ckpt-2") != NULL, "the out-dir resolves to the newest: %s", res);
  fill(&p, 0);
  CHECK_OK(ctx, nt_checkpoint_load_tensors(ctx, out, &p, NULL));
  CHECK(first(&p) == 2, "the out-dir loads the newest (%g)", first(&p));
  rmdir(path);
  nt_params_free(ctx, &p);
}

static void test_lock(nt_ctx *ctx) {
  char out[512];
  snprintf(out, sizeof out, "%s/locked", dir);
  int ready[2], done[2];
  if (pipe(ready) || pipe(done)) return;
  pid_t child = fork();
  if (child == 0) {
    nt_ctx *c;
    nt_outdir_lock *lk;
    char b;
    if (nt_ctx_create(&c, nt_cpu()) || nt_outdir_lock_take(c, out, &lk)) _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(1);
    if (read(done[0], &b, 1) != 1) _exit(1);
    _exit(0);
  }
  char b = 0;
  CHECK(read(ready[0], &b, 1) == 1, "child took the lock");
  nt_outdir_lock *lk = NULL;
  CHECK_ERR(ctx, NT_ERR_STATE, nt_outdir_lock_take(ctx, out, &lk));
  char want[64];
  snprintf(want, sizeof want, "(pid %ld)", (long)child);
  CHECK(strstr(nt_last_error(ctx), want) != NULL, "names the holder: %s", nt_last_error(ctx));
  CHECK(write(done[1], "d", 1) == 1, "release");
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child ok");
  /* the holder is gone: the lock is free (released by the kernel at exit) */
  if (CHECK_OK(ctx, nt_outdir_lock_take(ctx, out, &lk))) {
    nt_outdir_lock *again = NULL;
    CHECK_ERR(ctx, NT_ERR_STATE, nt_outdir_lock_take(ctx, out, &again));
    nt_outdir_unlock(lk);
    CHECK_OK(ctx, nt_outdir_lock_take(ctx, out, &lk));
    nt_outdir_unlock(lk);
  }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/nt_ckdir_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  test_sha256();
  test_json_ranges(ctx);
  test_malformed(ctx);
  test_layout(ctx);
  test_late_failure(ctx);
  test_lock(ctx);
  nt_ctx_free(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  return nt_test_finish();
}
