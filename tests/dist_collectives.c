/* Every collective of dist/comm.h in F32, F16 and BF16 against values worked out here
 * (small integers, exact in every dtype), in place and out of place; part of dist_train
 * (--mode collectives). */
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"
#include "testutil.h"

/* A host tensor of dtype dt holding vals (rounded to dt); freed with free(t.data). */
static nt_tensor make(nt_dtype dt, const float *vals, int64_t n) {
  void *data = calloc((size_t)n, nt_dtype_size(dt));
  for (int64_t i = 0; i < n; i++) {
    if (dt == NT_F32) ((float *)data)[i] = vals[i];
    else if (dt == NT_F16) ((uint16_t *)data)[i] = nt_f32_to_f16(vals[i]);
    else ((uint16_t *)data)[i] = nt_f32_to_bf16(vals[i]);
  }
  return nt_tensor_view(data, dt, nt_cpu(), 1, &n);
}

static float at(const nt_tensor *t, int64_t i) {
  if (t->dtype == NT_F32) return ((float *)t->data)[i];
  uint16_t h = ((uint16_t *)t->data)[i];
  return t->dtype == NT_F16 ? nt_f16_to_f32(h) : nt_bf16_to_f32(h);
}

/* out = the number of elements of t[0..n) that differ from the expression want (of i). */
#define COUNT_BAD(out, t, n, want)                                              \
  do {                                                                          \
    out = 0;                                                                    \
    for (int64_t i = 0; i < (n); i++) out += at(&(t), i) != (float)(want);      \
  } while (0)

int dist_collectives(nt_ctx *ctx, nt_comm *comm) {
  const int W = nt_comm_world(comm), R = nt_comm_rank(comm);
  const int64_t n = 13, full_n = n * W;
  const nt_dtype dts[3] = {NT_F32, NT_F16, NT_BF16};
  float *v = calloc((size_t)full_n, sizeof(float));
  int bad = 0;
  for (int d = 0; d < 3; d++) {
    nt_dtype dt = dts[d];
    const char *dn = nt_dtype_name(dt);
    /* all_reduce SUM and MAX */
    for (int64_t i = 0; i < n; i++) v[i] = (float)(R + 1 + i % 5);
    nt_tensor t = make(dt, v, n);
    CHECK_OK(ctx, nt_comm_all_reduce(comm, ctx, &t, NT_REDUCE_SUM));
    COUNT_BAD(bad, t, n, (float)(W * (W + 1) / 2 + W * (i % 5)));
    CHECK(bad == 0, "%s all_reduce sum", dn);
    free(t.data);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((R * 3 + i) % (W + 2)) - 2.0f;
    t = make(dt, v, n);
    CHECK_OK(ctx, nt_comm_all_reduce(comm, ctx, &t, NT_REDUCE_MAX));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
      float m = -1e9f;
      for (int r = 0; r < W; r++) {
        float x = (float)((r * 3 + i) % (W + 2)) - 2.0f;
        m = x > m ? x : m;
      }
      bad += at(&t, i) != m;
    }
    CHECK(bad == 0, "%s all_reduce max", dn);
    free(t.data);
    /* reduce_scatter, in place (shard = own slice) and out of place */
    for (int oop = 0; oop < 2; oop++) {
      for (int64_t j = 0; j < full_n; j++) v[j] = (float)(R + j % 7);
      nt_tensor full = make(dt, v, full_n);
      nt_tensor shard = oop ? make(dt, v, n) : full;
      if (!oop) {
        shard.data = (char *)full.data + (size_t)(R * n) * nt_dtype_size(dt);
        shard.shape[0] = n;
      }
      CHECK_OK(ctx, nt_comm_reduce_scatter(comm, ctx, &full, &shard));
      COUNT_BAD(bad, shard, n, (float)(W * (W - 1) / 2 + W * ((R * n + i) % 7)));
      CHECK(bad == 0,
            "%s reduce_scatter (%s)", dn, oop ? "out of place" : "in place");
      if (oop) free(shard.data);
      free(full.data);
    }
    /* all_gather, in place and out of place */
    for (int oop = 0; oop < 2; oop++) {
      for (int64_t j = 0; j < full_n; j++) v[j] = j / n == R ? (float)(R * 16 + j % n) : -7.0f;
      nt_tensor full = make(dt, v, full_n);
      for (int64_t i = 0; i < n; i++) v[i] = (float)(R * 16 + i);
      nt_tensor shard = oop ? make(dt, v, n) : full;
      if (!oop) {
        shard.data = (char *)full.data + (size_t)(R * n) * nt_dtype_size(dt);
        shard.shape[0] = n;
      }
      CHECK_OK(ctx, nt_comm_all_gather(comm, ctx, &shard, &full));
      COUNT_BAD(bad, full, full_n, (float)((i / n) * 16 + i % n));
      CHECK(bad == 0, "%s all_gather (%s)", dn,
            oop ? "out of place" : "in place");
      if (oop) free(shard.data);
      free(full.data);
    }
    /* broadcast from the last rank */
    for (int64_t i = 0; i < n; i++) v[i] = (float)(R * 10 + i);
    t = make(dt, v, n);
    CHECK_OK(ctx, nt_comm_broadcast(comm, ctx, &t, W - 1));
    COUNT_BAD(bad, t, n, (float)((W - 1) * 10 + i));
    CHECK(bad == 0, "%s broadcast", dn);
    free(t.data);
  }
  free(v);
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
