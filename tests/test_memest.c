/* memest's sharding arithmetic (memest.h) against figures worked by hand for a model of
 * P = 1024 flat elements (1000 parameters), largest unit 300, 5000 activation bytes, a 100-byte
 * workspace: per rank, under NO_SHARD / SHARD_GRAD_OP (ZeRO-2) / FULL_SHARD (ZeRO-3) with
 *   parameters  P * s (ZeRO-3: P * s / N + two gathered units 2 * U * s)
 *   gradients   4P (ZeRO-2/3: 4P / N + one unit's full gradient 4U)
 *   master      4P when the compute copy is 16-bit (ZeRO-2/3: / N)
 *   optimizer   8P (ZeRO-2/3: / N)
 * the ZeRO paper's 16p, 2p + 14p/N, 16p/N, the rule of thumb, and N = 1 adding no gather or
 * reduce-scatter buffers. */
#include "tests/testutil.h"
#include "train/memest.h"
#include <math.h>

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

static void expect(const nt_mem_estimate *e, double params, double grads, double master,
                   double opt, double zero, const char *what) {
  double total = params + grads + master + opt + 5000 + 100;
  CHECK(near(e->parameters, params), "%s: parameters %.0f, expected %.0f", what, e->parameters,
        params);
  CHECK(near(e->gradients, grads), "%s: gradients %.0f, expected %.0f", what, e->gradients, grads);
  CHECK(near(e->master, master), "%s: master %.0f, expected %.0f", what, e->master, master);
  CHECK(near(e->optimizer, opt), "%s: optimizer %.0f, expected %.0f", what, e->optimizer, opt);
  CHECK(near(e->activations, 5000) && near(e->workspace, 100), "%s: activations, workspace", what);
  CHECK(near(e->total, total), "%s: total %.0f, expected %.0f", what, e->total, total);
  CHECK(near(e->zero_formula, zero), "%s: ZeRO formula %.0f, expected %.0f", what,
        e->zero_formula, zero);
  CHECK(e->n_params == 1000, "%s: parameter count", what);
}

int main(void) {
  nt_model_sizes sz = {1000, 1024, 300, 3, 5000};
  nt_mem_estimate e;
  /* bf16 compute (2 bytes), 4 ranks */
  nt_memest_compute(&sz, NT_BF16, 8, 10, 20, NT_SHARD_NO_SHARD, 4, 100, &e);
  expect(&e, 2048, 4096, 4096, 8192, 16000, "bf16 NO_SHARD x4");
  CHECK(near(e.rule_of_thumb, 4000 + 8 * 30 * 4), "rule of thumb %.0f", e.rule_of_thumb);
  nt_memest_compute(&sz, NT_BF16, 8, 10, 20, NT_SHARD_GRAD_OP, 4, 100, &e);
  expect(&e, 2048, 1024 + 1200, 1024, 2048, 2000 + 14000.0 / 4, "bf16 SHARD_GRAD_OP x4");
  nt_memest_compute(&sz, NT_BF16, 8, 10, 20, NT_SHARD_FULL, 4, 100, &e);
  expect(&e, 512 + 1200, 1024 + 1200, 1024, 2048, 4000, "bf16 FULL_SHARD x4");
  /* one rank: sharding changes nothing but the formula's label */
  nt_memest_compute(&sz, NT_BF16, 8, 10, 20, NT_SHARD_FULL, 1, 100, &e);
  expect(&e, 2048, 4096, 4096, 8192, 16000, "bf16 FULL_SHARD x1");
  nt_memest_compute(&sz, NT_BF16, 8, 10, 20, NT_SHARD_GRAD_OP, 0, 100, &e);
  expect(&e, 2048, 4096, 4096, 8192, 16000, "world 0 counts as 1");
  /* fp32 compute: the master is the parameters themselves */
  nt_memest_compute(&sz, NT_F32, 8, 10, 20, NT_SHARD_GRAD_OP, 8, 100, &e);
  expect(&e, 4096, 512 + 1200, 0, 1024, 2000 + 14000.0 / 8, "fp32 SHARD_GRAD_OP x8");
  nt_memest_compute(&sz, NT_F32, 8, 10, 20, NT_SHARD_FULL, 8, 100, &e);
  expect(&e, 512 + 2400, 512 + 1200, 0, 1024, 2000, "fp32 FULL_SHARD x8");
  /* a large model with small units: more sharding, less memory per rank */
  nt_model_sizes big = {100000000, 100000000, 1000000, 100, 0};
  double t[3];
  for (int s = 0; s < 3; s++) {
    nt_memest_compute(&big, NT_BF16, 1, 1, 1, (nt_sharding)s, 8, 0, &e);
    t[s] = e.total;
  }
  CHECK(t[2] < t[1] && t[1] < t[0], "per-rank totals fall with sharding: %.0f %.0f %.0f", t[0],
        t[1], t[2]);
  nt_sharding sh = NT_SHARD_NO_SHARD;
  CHECK(nt_sharding_parse("zero3", &sh) && sh == NT_SHARD_FULL, "ZERO3 alias");
  CHECK(nt_sharding_parse("SHARD_GRAD_OP", &sh) && sh == NT_SHARD_GRAD_OP, "SHARD_GRAD_OP");
  CHECK(!nt_sharding_parse("ZERO9", &sh), "unknown sharding refused");
  return nt_test_finish();
}
