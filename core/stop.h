/* Stop requests from SIGINT / SIGTERM, for a training loop that finishes its step, saves and
 * exits with 128 + the signal (130 for SIGINT, 143 for SIGTERM).
 *
 * The program calls nt_stop_install() once. The handler is async-signal-safe: it only stores
 * the signal number in a volatile sig_atomic_t and write()s one line to stderr. A loop polls
 * nt_stop_requested() between steps; once anything has polled, the first signal only sets the
 * request and a second one ends the process at once (_exit(128 + sig)). Before anything polls
 * (start-up, a program whose loop does not poll) the first signal ends the process at once, as
 * the default action would, so installing the handler never makes a program ignore Ctrl-C. */
#ifndef NT_CORE_STOP_H
#define NT_CORE_STOP_H
#include <stdbool.h>
#include "core/status.h"
NT_EXTERN_C_BEGIN

/* Installs the SIGINT and SIGTERM handlers (sigaction, SA_RESTART). */
nt_status nt_stop_install(void);
/* The pending signal's number (SIGINT / SIGTERM), or 0; marks the caller as a poller. */
int nt_stop_requested(void);
/* Records a request as a signal would (tests, or a caller stopping the loop itself). */
void nt_stop_request(int sig);
/* Forgets a pending request. */
void nt_stop_clear(void);
/* 128 + the pending signal's number, or 0. */
int nt_stop_exit_code(void);

NT_EXTERN_C_END
#endif
