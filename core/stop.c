#include "core/stop.h"
#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t pending;   /* the requested signal, 0 none */
static volatile sig_atomic_t polled;    /* a loop has polled: the first signal only requests */

static void say(const char *s) {
  ssize_t r = write(STDERR_FILENO, s, strlen(s));   /* strlen is async-signal-safe (POSIX 2016) */
  (void)r;
}

static void on_signal(int sig) {
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (!polled || pending) {
    say("\nnanotrain: ");
    say(name);
    say(pending ? " again: exiting now\n" : ": exiting\n");
    _exit(128 + sig);
  }
  pending = sig;
  say("\nnanotrain: ");
  say(name);
  say(": stopping after this step (send it again to exit at once)\n");
}

nt_status nt_stop_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) return NT_ERR_INTERNAL;
  return NT_OK;
}

int nt_stop_requested(void) {
  polled = 1;
  return pending;
}

void nt_stop_request(int sig) { pending = sig; }

void nt_stop_clear(void) { pending = 0; }

int nt_stop_exit_code(void) { return pending ? 128 + pending : 0; }
