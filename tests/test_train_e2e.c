/* End to end on the CPU, one part per invocation so a part whose data is missing reports
 * skipped (exit 77) instead of passing with pieces dropped:
 *   test_train_e2e               resume is bit-identical: N steps + save, then resume for M more,
 *                                gives the same losses and the same saved state (every tensor
 *                                byte: parameters and AdamW moments; the sidecar: scaler scale
 *                                and growth tracker, RNG, loader position, step) as one N+M run;
 *                                GPT with dropout in fp32 and in fp16 with the loss scaler, on
 *                                synthetic tokens (no data needed); steady-state steps make no
 *                                system allocations; the checkpoint and metrics files look right
 *   test_train_e2e --gpt-learn   a tiny GPT on tiny shakespeare beats a count-based bigram model's
 *                                validation loss on the same split (computed here from the data,
 *                                about 2.48), so a broken attention fails (NT_DATA_DIR)
 *   test_train_e2e --cnn-resume  the CNN resumed mid-epoch across an epoch boundary, with and
 *                                without loader workers (Fashion-MNIST)
 *   test_train_e2e --cnn-learn   a small CNN on a 10k-image subset passes 80% test accuracy */
#include "tests/testutil.h"
#include "train/train.h"
#include "data/idx.h"
#include "models/checkpoint.h"
#include "models/sha256.h"
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static bool have_shakespeare(void) {
  const char *d = nt_test_data_dir();
  if (!d) return false;
  char p[4096];
  snprintf(p, sizeof p, "%s/tinyshakespeare.txt", d);
  return access(p, R_OK) == 0;
}

static bool have_fashion(void) {
  char p[4096];
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", nt_test_fashion_dir());
  return access(p, R_OK) == 0;
}

static nt_train_options tiny_gpt(void) {
  nt_train_options o = nt_train_defaults(NT_MODEL_GPT);
  o.gpt_data = "synthetic";
  o.gpt.n_layer = 2;
  o.gpt.n_head = 2;
  o.gpt.n_embd = 32;
  o.gpt.block_size = 16;
  o.gpt.dropout = 0.1f;
  o.batch_size = 4;
  o.lr_decay_iters = 20;
  o.warmup_iters = 3;
  o.eval_interval = 0;
  o.log_interval = 2;
  o.quiet = true;
  o.record_losses = true;
  o.num_workers = 0;
  return o;
}

/* The newest checkpoint under out: its tensors' SHA-256 and its sidecar text (caller frees). */
static bool saved_state(nt_ctx *ctx, const char *out, char hex[65], char **sidecar) {
  char dir[PATH_MAX], path[PATH_MAX + 32];
  uint64_t size;
  *sidecar = NULL;
  if (!CHECK_OK(ctx, nt_checkpoint_resolve(ctx, out, dir, sizeof dir))) return false;
  snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
  return CHECK_OK(ctx, nt_sha256_file(ctx, path, hex, &size)) &&
         CHECK_OK(ctx, nt_checkpoint_read_sidecar(ctx, out, sidecar));
}

/* Runs N+M steps straight, then N steps + checkpoint, then a resume to N+M; the losses of
 * steps N..N+M-1 must agree bit for bit, and so must the whole state both runs save at the
 * end (tensor file byte for byte, sidecar text). */
static void check_resume(nt_ctx *ctx, nt_train_options base, int64_t n, int64_t m,
                         const char *what) {
  char full[512], part[512];
  snprintf(full, sizeof full, "%s/%s-full", tmpdir, what);
  snprintf(part, sizeof part, "%s/%s-part", tmpdir, what);
  nt_train_result a, b, c;
  nt_train_options o = base;
  o.max_iters = n + m;
  o.out_dir = full;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &a))) return;
  o.max_iters = n;
  o.out_dir = part;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &b))) return;
  /* the resume continues the checkpoint's configuration: a given option that differs is an
   * error naming both values; one not given is the checkpoint's (the lr below is ignored, so the
   * losses still match) */
  static const char *const given_lr[] = {"max-iters", "lr"}, *const given[] = {"max-iters"};
  o.max_iters = n + m;
  o.resume = part;
  o.lr = base.lr * 3;
  o.given = given_lr;
  o.n_given = 2;
  nt_train_result x;
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_train_run(ctx, &o, &x));
  CHECK(strstr(nt_last_error(ctx), "--lr ") && strstr(nt_last_error(ctx), "the checkpoint has"),
        "%s: the conflict names the option and both values: %s", what, nt_last_error(ctx));
  nt_train_result_free(&x);
  o.n_given = 1;
  o.given = given;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &c))) return;
  CHECK(a.n_losses == n + m && b.n_losses == n && c.n_losses == m,
        "%s: loss counts %lld/%lld/%lld", what, (long long)a.n_losses, (long long)b.n_losses,
        (long long)c.n_losses);
  CHECK(c.first_step == n, "%s: resumed at step %lld", what, (long long)c.first_step);
  CHECK(a.steady_system_allocs == 0 && c.steady_system_allocs == 0,
        "%s: steady-state steps allocate nothing (%llu, %llu system allocations)", what,
        (unsigned long long)a.steady_system_allocs, (unsigned long long)c.steady_system_allocs);
  int same = 0;
  for (int64_t i = 0; i < n && i < b.n_losses; i++)
    same += memcmp(&a.losses[i], &b.losses[i], sizeof(double)) == 0;
  CHECK(same == n, "%s: the first %lld steps agree (%d)", what, (long long)n, same);
  same = 0;
  for (int64_t i = 0; i < m && i < c.n_losses; i++) {
    bool eq = memcmp(&a.losses[n + i], &c.losses[i], sizeof(double)) == 0;
    if (!eq)
      fprintf(stderr, "  %s step %lld: uninterrupted %.9g, resumed %.9g\n", what,
              (long long)(n + i), a.losses[n + i], c.losses[i]);
    same += eq;
  }
  CHECK(same == m, "%s: resumed losses are bit-identical (%d of %lld)", what, same,
        (long long)m);
  printf("  %s: resume after %lld steps, %d of %lld later losses bit-identical (last %.6f)\n",
         what, (long long)n, same, (long long)m, c.n_losses ? c.losses[c.n_losses - 1] : NAN);
  CHECK((isnan(a.val_loss) && isnan(c.val_loss)) || a.val_loss == c.val_loss,
        "%s: the final evaluation matches (%.9g, %.9g)", what, a.val_loss, c.val_loss);
  CHECK((isnan(a.test_accuracy) && isnan(c.test_accuracy)) || a.test_accuracy == c.test_accuracy,
        "%s: the final test accuracy matches", what);
  char ha[65], hc[65], *sa, *sc;
  if (saved_state(ctx, full, ha, &sa) && saved_state(ctx, part, hc, &sc)) {
    CHECK(!strcmp(ha, hc), "%s: the saved parameters and moments are byte-identical", what);
    CHECK(!strcmp(sa, sc), "%s: the saved sidecars (config, scaler, RNG, position, eval count) are identical:\n"
          "  uninterrupted %s\n  resumed       %s", what, sa, sc);
  }
  free(sa);
  free(sc);
  nt_train_result_free(&a);
  nt_train_result_free(&b);
  nt_train_result_free(&c);
}

static bool has_prefix_entry(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  struct dirent *e;
  bool any = false;
  while (d && (e = readdir(d))) any |= !strncmp(e->d_name, prefix, strlen(prefix));
  if (d) closedir(d);
  return any;
}

static void check_files(void) {
  char p[600];
  const char *files[] = {"latest", "ckpt-6/ckpt.safetensors", "ckpt-6/ckpt.json",
                         "ckpt-6/MANIFEST.json", "metrics.jsonl", "metrics.prom"};
  for (int i = 0; i < 6; i++) {
    snprintf(p, sizeof p, "%s/gpt-fp32-part/%s", tmpdir, files[i]);
    CHECK(access(p, R_OK) == 0, "%s exists", p);
  }
  snprintf(p, sizeof p, "%s/gpt-fp32-part", tmpdir);
  CHECK(!has_prefix_entry(p, ".tmp"), "no temporary left behind");
  snprintf(p, sizeof p, "%s/gpt-fp32-part/metrics.prom", tmpdir);
  FILE *f = fopen(p, "r");
  char line[256];
  bool step = false;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "nanotrain_step{model=\"gpt\"}", 27)) step = true;
  if (f) fclose(f);
  CHECK(step, "metrics.prom has nanotrain_step");
}

/* A count-based bigram model's loss on the validation split (the last 10%, as the trainer
 * splits): -mean log p(next | current), counts from the training split with add-one
 * smoothing over the text's characters. */
static double bigram_val_loss(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NAN;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  unsigned char *t = malloc((size_t)n);
  if (!t || fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
  fclose(f);
  static double count[256][256], row[256];
  bool seen[256] = {false};
  int vocab = 0;
  for (long i = 0; i < n; i++) {
    vocab += !seen[t[i]];
    seen[t[i]] = true;
  }
  long split = n * 9 / 10;
  for (long i = 0; i + 1 < split; i++) {
    count[t[i]][t[i + 1]]++;
    row[t[i]]++;
  }
  double loss = 0;
  for (long i = split; i + 1 < n; i++)
    loss -= log((count[t[i]][t[i + 1]] + 1) / (row[t[i]] + vocab));
  free(t);
  return n > split + 1 ? loss / (double)(n - split - 1) : NAN;
}

static void learn_gpt(nt_ctx *ctx) {
  nt_train_options o = nt_train_defaults(NT_MODEL_GPT);
  o.data_dir = nt_test_data_dir();
  o.gpt.n_layer = 2;
  o.gpt.n_head = 4;
  o.gpt.n_embd = 64;
  o.gpt.block_size = 64;
  o.gpt.dropout = 0.0f;
  o.batch_size = 16;
  o.max_iters = 250;
  o.lr_decay_iters = 250;
  o.warmup_iters = 20;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.eval_interval = 250;
  o.eval_iters = 10;
  o.log_interval = 50;
  o.quiet = true;
  char path[4096];
  snprintf(path, sizeof path, "%s/tinyshakespeare.txt", getenv("NT_DATA_DIR"));
  double bigram = bigram_val_loss(path);
  CHECK(bigram > 2.3 && bigram < 2.7, "bigram validation loss %.4f (about 2.48)", bigram);
  nt_train_result r;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &r))) return;
  printf("  tiny GPT, %lld steps: val loss %.4f (bar: the bigram model's %.4f), train %.4f\n",
         (long long)o.max_iters, r.val_loss, bigram, r.train_loss);
  CHECK(r.val_loss < bigram, "validation loss %.4f < the bigram model's %.4f", r.val_loss, bigram);
  nt_train_result_free(&r);
}

static void learn_cnn(nt_ctx *ctx) {
  nt_train_options o = nt_train_defaults(NT_MODEL_CNN);
  o.data_dir = nt_test_fashion_dir();
  o.cnn.c1 = 4;
  o.cnn.c2 = 8;
  o.cnn.hidden = 128;
  o.epochs = 2;
  o.train_subset = 10000;
  o.test_subset = 2000;
  o.batch_size = 32;
  o.lr = 2e-3;
  o.num_workers = 1;
  o.log_interval = 0;
  o.quiet = true;
  nt_train_result r;
  if (!CHECK_OK(ctx, nt_train_run(ctx, &o, &r))) return;
  printf("  CNN, 10k images x 2 epochs: test accuracy %.2f%% (bar 80%%)\n", 100 * r.test_accuracy);
  CHECK(r.test_accuracy > 0.80, "test accuracy %.4f > 0.80", r.test_accuracy);
  nt_train_result_free(&r);
}

static void cnn_resume(nt_ctx *ctx) {
  nt_train_options o = nt_train_defaults(NT_MODEL_CNN);
  o.cnn.c1 = 2;
  o.cnn.c2 = 4;
  o.cnn.hidden = 16;
  o.train_subset = 320;
  o.test_subset = 64;
  o.batch_size = 32;     /* 10 batches per epoch: the resume point 13 is mid-epoch 1 */
  o.epochs = 3;
  o.num_workers = 2;
  o.log_interval = 0;
  o.quiet = true;
  o.record_losses = true;
  check_resume(ctx, o, 13, 9, "cnn");
  o.num_workers = 0;   /* synchronous loading resumes identically too */
  check_resume(ctx, o, 13, 4, "cnn-sync");
}

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : "";
  bool gpt_learn = !strcmp(part, "--gpt-learn"), cnn_resume_part = !strcmp(part, "--cnn-resume");
  bool cnn_learn = !strcmp(part, "--cnn-learn");
  if (*part && !gpt_learn && !cnn_resume_part && !cnn_learn) {
    fprintf(stderr, "usage: test_train_e2e [--gpt-learn | --cnn-resume | --cnn-learn]\n");
    return 2;
  }
  if (gpt_learn && !have_shakespeare())
    return nt_test_skip("NT_DATA_DIR/tinyshakespeare.txt not found");
  if ((cnn_resume_part || cnn_learn) && !have_fashion())
    return nt_test_skip("Fashion-MNIST not found (NT_FASHION_DIR or the system copy)");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/nt_e2e_XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  if (gpt_learn) {
    learn_gpt(ctx);
  } else if (cnn_resume_part) {
    cnn_resume(ctx);
  } else if (cnn_learn) {
    learn_cnn(ctx);
  } else {
    check_resume(ctx, tiny_gpt(), 6, 7, "gpt-fp32");
    nt_train_options ev = tiny_gpt();
    ev.eval_interval = 4;   /* evaluations before and after the resume point: their batches,
                             * counter and best loss continue */
    ev.eval_iters = 2;
    check_resume(ctx, ev, 6, 7, "gpt-eval");
    check_files();
    nt_train_options o = tiny_gpt();
    o.precision = NT_PREC_FP16;
    o.growth_interval = 3;   /* the scale grows during the run: its state must resume too */
    o.init_scale = 1e6f;      /* and overflows early: skipped steps resume too */
    check_resume(ctx, o, 5, 6, "gpt-fp16");
  }
  nt_ctx_free(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return nt_test_finish();
}
