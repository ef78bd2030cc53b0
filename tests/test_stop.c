/* SIGINT / SIGTERM handling (core/stop.h): a polled first signal only requests a stop (exit
 * code 130 / 143 reported), a second exits at once with that code, and a signal before anything
 * polls exits at once (the handler never makes a program ignore Ctrl-C). Each case runs in a
 * child process. */
#include "tests/testutil.h"
#include "core/stop.h"
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs body in a child; returns its exit status (or 1000 + the signal that killed it). */
static int in_child(int (*body)(void)) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

static int polled_once(void) {
  if (nt_stop_install() || nt_stop_requested() != 0) return 10;
  raise(SIGTERM);
  if (nt_stop_requested() != SIGTERM) return 11;
  return nt_stop_exit_code() == 143 ? 0 : 12;   /* the loop saves, then exits with this */
}

static int polled_twice(void) {
  if (nt_stop_install()) return 10;
  nt_stop_requested();
  raise(SIGINT);
  if (nt_stop_requested() != SIGINT) return 11;
  raise(SIGINT);          /* exits 130 here */
  return 12;
}

static int never_polled(void) {
  if (nt_stop_install()) return 10;
  raise(SIGTERM);         /* exits 143 here */
  return 12;
}

static int cleared(void) {
  if (nt_stop_install()) return 10;
  nt_stop_requested();
  nt_stop_request(SIGINT);
  if (nt_stop_exit_code() != 130) return 11;
  nt_stop_clear();
  return nt_stop_requested() == 0 && nt_stop_exit_code() == 0 ? 0 : 12;
}

int main(void) {
  int rc = in_child(polled_once);
  CHECK(rc == 0, "a polled SIGTERM only requests (child status %d)", rc);
  rc = in_child(polled_twice);
  CHECK(rc == 130, "a second SIGINT exits 130 at once (status %d)", rc);
  rc = in_child(never_polled);
  CHECK(rc == 143, "SIGTERM before any poll exits 143 (status %d)", rc);
  rc = in_child(cleared);
  CHECK(rc == 0, "request / clear (status %d)", rc);
  return nt_test_finish();
}
