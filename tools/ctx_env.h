/* For programs (examples/, tools/, bench/, tests' helpers), not the library: the context
 * options (core/ctx.h) that the environment sets. Each option keeps an environment name
 * (nt_ctx_option_name_at: "NT_" + its key in capitals, e.g. NT_LOG=debug, NT_GEMM_SEARCH=2);
 * a program that chooses to honour them calls this once at start, before its flags, so that
 * a flag given on the command line wins. Unset or empty variables leave the option alone; a
 * bad value is an error naming the variable. */
#ifndef NT_TOOLS_CTX_ENV_H
#define NT_TOOLS_CTX_ENV_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/ctx.h"

static inline nt_status nt_ctx_options_from_env(nt_ctx_options *opts) {
  const nt_ctx_option_name *n;
  for (int i = 0; (n = nt_ctx_option_name_at(i)); i++) {
    const char *v = getenv(n->env);
    if (!v || !*v) continue;
    nt_status st = nt_ctx_options_set(opts, n->key, v);
    if (st) {
      fprintf(stderr, "nanotrain: environment variable %s=%s is not a valid value\n", n->env, v);
      return st;
    }
  }
  return NT_OK;
}

/* nt_ctx_create_with on `dev` with the defaults and the environment's options. A bad value is
 * NT_ERR_INVALID_ARG with *out NULL (the message went to stderr). */
static inline nt_status nt_ctx_create_env(nt_ctx **out, nt_device dev) {
  nt_ctx_options o = nt_ctx_options_default();
  *out = NULL;
  nt_status st = nt_ctx_options_from_env(&o);
  return st ? st : nt_ctx_create_with(out, dev, &o);
}

/* "key=value", as `--kernel-opt key=value` gives it. */
static inline nt_status nt_ctx_options_set_pair(nt_ctx_options *opts, const char *pair) {
  const char *eq = pair ? strchr(pair, '=') : NULL;
  char key[64];
  if (!eq || eq == pair || (size_t)(eq - pair) >= sizeof key) {
    fprintf(stderr, "nanotrain: kernel option '%s': expected key=value\n", pair ? pair : "");
    return NT_ERR_INVALID_ARG;
  }
  memcpy(key, pair, (size_t)(eq - pair));
  key[eq - pair] = '\0';
  return nt_ctx_options_set(opts, key, eq + 1);
}

#endif
