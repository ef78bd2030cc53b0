/* Every collective of dist/comm.h in F32, F16 and BF16 against values worked out here
 * (small integers, exact in every dtype), in place and out of place; part of dist_train
 * (--mode collectives). */
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"
#include "dist/shard.h"
#include "testutil.h"

/* A tensor of dtype dt on ctx's device holding vals (rounded to dt); nt_tensor_free it. */
static nt_tensor make(nt_ctx *ctx, nt_dtype dt, const float *vals, int64_t n) {
  void *host = calloc((size_t)n, nt_dtype_size(dt));
  for (int64_t i = 0; i < n; i++) {
    if (dt == NT_F32) ((float *)host)[i] = vals[i];
    else if (dt == NT_F16) ((uint16_t *)host)[i] = nt_f32_to_f16(vals[i]);
    else ((uint16_t *)host)[i] = nt_f32_to_bf16(vals[i]);
  }
  nt_tensor t, h = nt_tensor_view(host, dt, nt_cpu(), 1, &n);
  nt_tensor_alloc(ctx, &t, dt, 1, &n);
  nt_tensor_copy(ctx, &t, &h);
  free(host);
  return t;
}

/* t's values as floats (host copy in `out`, n elements), after the queued work. */
static const float *fetch(nt_ctx *ctx, nt_comm *comm, const nt_tensor *t, float *out) {
  int64_t n = nt_tensor_numel(t);
  uint16_t *h16 = calloc((size_t)n, 2);
  nt_tensor h = nt_tensor_view(t->dtype == NT_F32 ? (void *)out : (void *)h16, t->dtype, nt_cpu(),
                               1, &n);
  nt_comm_wait_seq(comm, ctx, nt_comm_seq(comm));
  nt_tensor_copy(ctx, &h, t);
  nt_ctx_synchronize(ctx);
  for (int64_t i = 0; t->dtype != NT_F32 && i < n; i++)
    out[i] = t->dtype == NT_F16 ? nt_f16_to_f32(h16[i]) : nt_bf16_to_f32(h16[i]);
  free(h16);
  return out;
}

/* out = the number of elements of t[0..n) that differ from the expression want (of i). */
#define COUNT_BAD(out, t, n, want)                                              \
  do {                                                                          \
    const float *got_ = fetch(ctx, comm, &(t), host);                           \
    out = 0;                                                                    \
    for (int64_t i = 0; i < (n); i++) out += got_[i] != (float)(want);          \
  } while (0)

int dist_collectives(nt_ctx *ctx, nt_comm *comm) {
  const int W = nt_comm_world(comm), R = nt_comm_rank(comm);
  const int64_t n = 13, full_n = n * W;
  const nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  float *v = calloc((size_t)full_n, sizeof(float)), *host = calloc((size_t)full_n, sizeof(float));
  int bad = 0;
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = dts[d];
    const char *dn = nt_dtype_name(dt);
    /* all_reduce SUM and MAX */
    for (int64_t i = 0; i < n; i++) v[i] = (float)(R + 1 + i % 5);
    nt_tensor t = make(ctx, dt, v, n);
    CHECK_OK(ctx, nt_comm_all_reduce(comm, ctx, &t, NT_REDUCE_SUM));
    COUNT_BAD(bad, t, n, (float)(W * (W + 1) / 2 + W * (i % 5)));
    CHECK(bad == 0, "%s all_reduce sum", dn);
    nt_tensor_free(ctx, &t);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((R * 3 + i) % (W + 2)) - 2.0f;
    t = make(ctx, dt, v, n);
    CHECK_OK(ctx, nt_comm_all_reduce(comm, ctx, &t, NT_REDUCE_MAX));
    bad = 0;
    fetch(ctx, comm, &t, host);
    for (int64_t i = 0; i < n; i++) {
      float m = -1e9f;
      for (int r = 0; r < W; r++) {
        float x = (float)((r * 3 + i) % (W + 2)) - 2.0f;
        m = x > m ? x : m;
      }
      bad += host[i] != m;
    }
    CHECK(bad == 0, "%s all_reduce max", dn);
    nt_tensor_free(ctx, &t);
    /* reduce_scatter, in place (shard = own slice) and out of place */
    for (int oop = 0; oop < 2; oop++) {
      for (int64_t j = 0; j < full_n; j++) v[j] = (float)(R + j % 7);
      nt_tensor full = make(ctx, dt, v, full_n);
      nt_tensor shard = oop ? make(ctx, dt, v, n) : full;
      if (!oop) shard = nt_flat_view(&full, R * n, n);
      CHECK_OK(ctx, nt_comm_reduce_scatter(comm, ctx, &full, &shard));
      COUNT_BAD(bad, shard, n, (float)(W * (W - 1) / 2 + W * ((R * n + i) % 7)));
      CHECK(bad == 0,
            "%s reduce_scatter (%s)", dn, oop ? "out of place" : "in place");
      if (oop) nt_tensor_free(ctx, &shard);
      nt_tensor_free(ctx, &full);
    }
    /* all_gather, in place and out of place */
    for (int oop = 0; oop < 2; oop++) {
      for (int64_t j = 0; j < full_n; j++) v[j] = j / n == R ? (float)(R * 16 + j % n) : -7.0f;
      nt_tensor full = make(ctx, dt, v, full_n);
      for (int64_t i = 0; i < n; i++) v[i] = (float)(R * 16 + i);
      nt_tensor shard = oop ? make(ctx, dt, v, n) : full;
      if (!oop) shard = nt_flat_view(&full, R * n, n);
      CHECK_OK(ctx, nt_comm_all_gather(comm, ctx, &shard, &full));
      COUNT_BAD(bad, full, full_n, (float)((i / n) * 16 + i % n));
      CHECK(bad == 0, "%s all_gather (%s)", dn,
            oop ? "out of place" : "in place");
      if (oop) nt_tensor_free(ctx, &shard);
      nt_tensor_free(ctx, &full);
    }
    /* broadcast from the last rank */
    for (int64_t i = 0; i < n; i++) v[i] = (float)(R * 10 + i);
    t = make(ctx, dt, v, n);
    CHECK_OK(ctx, nt_comm_broadcast(comm, ctx, &t, W - 1));
    COUNT_BAD(bad, t, n, (float)((W - 1) * 10 + i));
    CHECK(bad == 0, "%s broadcast", dn);
    nt_tensor_free(ctx, &t);
  }
  free(v);
  free(host);
  CHECK_OK(ctx, nt_comm_barrier(comm, ctx));
  int32_t mine = 1000 + R, *all = calloc((size_t)W, sizeof *all);
  CHECK_OK(ctx, nt_comm_gather_bytes(comm, ctx, &mine, sizeof mine, all));
  bad = 0;
  for (int r = 0; r < W; r++) bad += all[r] != 1000 + r;
  CHECK(bad == 0, "gather_bytes");
  free(all);
  const char cfg[] = "same configuration everywhere";
  CHECK_OK(ctx, nt_comm_check_config(comm, ctx, cfg, sizeof cfg));
  CHECK_OK(ctx, nt_comm_check_fingerprint(comm, ctx));
  CHECK(nt_comm_seq(comm) > 20, "collectives counted: %lld", (long long)nt_comm_seq(comm));
  return 0;
}
