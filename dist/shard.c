/* The sharding strategies' names (dist/shard.h). */
#include "dist/shard.h"
#include <strings.h>

bool nt_sharding_parse(const char *s, nt_sharding *out) {
  static const struct { const char *name; nt_sharding v; } names[] = {
      {"NO_SHARD", NT_SHARD_NO_SHARD}, {"DP", NT_SHARD_NO_SHARD},
      {"SHARD_GRAD_OP", NT_SHARD_GRAD_OP}, {"ZERO2", NT_SHARD_GRAD_OP},
      {"FULL_SHARD", NT_SHARD_FULL}, {"ZERO3", NT_SHARD_FULL}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcasecmp(s, names[i].name)) {
      *out = names[i].v;
      return true;
    }
  return false;
}

const char *nt_sharding_name(nt_sharding s) {
  return s == NT_SHARD_GRAD_OP ? "SHARD_GRAD_OP" : s == NT_SHARD_FULL ? "FULL_SHARD" : "NO_SHARD";
}
