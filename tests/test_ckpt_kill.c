/* kill -9 during checkpoint saves: a child process resumes from the out-dir and saves one
 * checkpoint after another (every parameter and moment-like value equal to the step, the step
 * in the sidecar) until the parent kills it at a random moment, 100 times. After every kill
 * the parent resumes as the trainer would: whatever it accepts must be a consistent pair (the
 * tensors' values equal the sidecar's step), every complete checkpoint directory must verify,
 * and the step must never go backwards. Bounded at about 60 s. */
#include "tests/testutil.h"
#include "models/checkpoint.h"
#include "models/json.h"
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { NUMEL = 1 << 18, KILLS = 100 };

static char out[256];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool make_params(nt_ctx *ctx, nt_params *p) {
  memset(p, 0, sizeof *p);
  int u;
  int64_t a[1] = {NUMEL / 2}, b[2] = {NUMEL / 512, 256};
  return !nt_params_add_unit(ctx, p, "u", &u) &&
         !nt_params_add(ctx, p, u, "u.a", 1, a, false, NT_INIT_ZEROS, 0, NULL) &&
         !nt_params_add(ctx, p, u, "u.b", 2, b, true, NT_INIT_ZEROS, 0, NULL) &&
         !nt_params_alloc(ctx, p, NT_F32);
}

static float *values(nt_params *p, int i) {
  return nt_params_view(p, 0, i, NT_VIEW_MASTER).data;
}

/* Reads the checkpoint `where` designates: -1 when there is none, -2 when refused (the
 * message is printed), else its step after checking every value equals it. */
static int64_t read_back(nt_ctx *ctx, nt_params *p, const char *where, bool *consistent) {
  char *text = NULL;
  *consistent = true;
  nt_status st = nt_checkpoint_read_sidecar(ctx, where, &text);
  if (st == NT_ERR_IO && strstr(nt_last_error(ctx), "no checkpoint")) return -1;
  if (st) {
    fprintf(stderr, "refused: %s\n", nt_last_error(ctx));
    return -2;
  }
  nt_json j;
  int64_t step = -2;
  if (!nt_json_parse(ctx, text, strlen(text), where, &j)) {
    if (nt_json_get_int_in(ctx, &j, "iter", 0, INT32_MAX, &step)) step = -2;
    nt_json_free(&j);
  }
  free(text);
  if (step < 0) return -2;
  for (int i = 0; i < 2; i++) memset(values(p, i), 0xff, sizeof(float));
  if (nt_checkpoint_load_tensors(ctx, where, p, NULL)) {
    fprintf(stderr, "refused tensors: %s\n", nt_last_error(ctx));
    return -2;
  }
  for (int i = 0; i < 2; i++) {
    nt_tensor t = nt_params_view(p, 0, i, NT_VIEW_MASTER);
    int64_t n = nt_tensor_numel(&t);
    float *v = values(p, i);
    for (int64_t k = 0; k < n; k += 97) *consistent &= v[k] == (float)step;
    *consistent &= v[n - 1] == (float)step;
  }
  return step;
}

static void child(void) {
  nt_ctx *ctx;
  nt_params p;
  if (nt_ctx_create(&ctx, nt_cpu()) || !make_params(ctx, &p)) _exit(3);
  bool ok;
  int64_t step = read_back(ctx, &p, out, &ok);
  if (step == -2 || !ok) _exit(4);      /* the parent reports it */
  nt_outdir_lock *lk;
  if (nt_outdir_lock_take(ctx, out, &lk)) _exit(5);
  for (;;) {
    step = step < 0 ? 1 : step + 1;
    for (int i = 0; i < 2; i++) {
      float *v = values(&p, i);
      nt_tensor t = nt_params_view(&p, 0, i, NT_VIEW_MASTER);
      int64_t n = nt_tensor_numel(&t);
      for (int64_t k = 0; k < n; k++) v[k] = (float)step;
    }
    char side[96];
    snprintf(side, sizeof side, "{\"format\":\"nanotrain-checkpoint\",\"iter\":%lld}",
             (long long)step);
    if (nt_checkpoint_save_keep(ctx, out, &p, NULL, side, 2, NULL, NULL)) _exit(6);
  }
}

/* Every complete checkpoint directory (one with a manifest) must verify. */
static int bad_complete_dirs(nt_ctx *ctx) {
  DIR *d = opendir(out);
  struct dirent *e;
  int bad = 0;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "ckpt-", 5)) continue;
    char dir[PATH_MAX], man[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%s", out, e->d_name);
    snprintf(man, sizeof man, "%s/MANIFEST.json", dir);
    if (access(man, F_OK)) continue;
    if (nt_checkpoint_verify(ctx, dir, true)) {
      fprintf(stderr, "complete checkpoint fails verification: %s\n", nt_last_error(ctx));
      bad++;
    }
  }
  if (d) closedir(d);
  return bad;
}

static bool has_temporaries(void) {
  DIR *d = opendir(out);
  struct dirent *e;
  bool any = false;
  while (d && (e = readdir(d))) any |= !strncmp(e->d_name, ".tmp-", 5);
  if (d) closedir(d);
  return any;
}

int main(void) {
  snprintf(out, sizeof out, "/tmp/nt_ckkill_XXXXXX");
  if (!mkdtemp(out)) return 1;
  nt_ctx *ctx;
  nt_params p;
  if (nt_ctx_create(&ctx, nt_cpu()) || !make_params(ctx, &p)) return 1;
  /* time one save to spread the kills over a few saves' length */
  double t0 = now_s();
  CHECK_OK(ctx, nt_checkpoint_save_keep(ctx, out, &p, NULL,
                                        "{\"format\":\"nanotrain-checkpoint\",\"iter\":0}", 2,
                                        NULL, NULL));
  double save_s = now_s() - t0;
  printf("one save of %d floats: %.1f ms\n", NUMEL, 1e3 * save_s);
  uint64_t seed = (uint64_t)time(NULL);
  printf("seed %llu\n", (unsigned long long)seed);
  nt_test_rng r = {seed};
  int kills = 0, mid_save = 0, refused = 0, inconsistent = 0, backwards = 0, child_fail = 0;
  int64_t last = 0, first_accepted = -1;
  double deadline = now_s() + 60;
  while (kills < KILLS && now_s() < deadline) {
    pid_t pid = fork();
    if (pid == 0) child();
    /* the child's start-up plus 0..4 saves */
    double wait = save_s * nt_test_uniform(&r, 0.5, 4.5);
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    nanosleep(&ts, NULL);
    int status;
    bool exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      kills++;
    }
    if (WIFEXITED(status)) {
      fprintf(stderr, "child exited with %d (4: refused or inconsistent at start)\n",
              WEXITSTATUS(status));
      child_fail++;
    }
    mid_save += has_temporaries();
    bool ok;
    int64_t step = read_back(ctx, &p, out, &ok);
    if (step == -2) refused++;
    if (step >= 0 && !ok) inconsistent++;
    if (step >= 0 && step < last) backwards++;
    if (step >= 0) last = step;
    if (step >= 0 && first_accepted < 0) first_accepted = step;
    inconsistent += bad_complete_dirs(ctx);
  }
  printf("%d kills (%d left a temporary: killed mid-save), final step %lld, refused %d, "
         "inconsistent %d, backwards %d, child failures %d\n",
         kills, mid_save, (long long)last, refused, inconsistent, backwards, child_fail);
  CHECK(kills >= KILLS / 2, "at least %d kills within the time bound (%d)", KILLS / 2, kills);
  CHECK(mid_save > 0, "some kills landed during a save");
  /* how many saves complete between kills depends on the machine's load (CI runs tests two at
   * a time on two cores): only ask that some did */
  CHECK(last > 0, "saves made progress (step %lld)", (long long)last);
  CHECK(inconsistent == 0, "every accepted checkpoint is consistent");
  CHECK(refused == 0, "the latest checkpoint is always whole");
  CHECK(backwards == 0, "the resumed step never goes back");
  CHECK(child_fail == 0, "every child resumed and saved");
  nt_params_free(ctx, &p);
  nt_ctx_free(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", out);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", out);
  return nt_test_finish();
}
