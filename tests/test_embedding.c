/* CPU embedding: forward against fp64 in every dtype, backward (dwte with repeated tokens,
 * dwpe) against finite differences and accumulation, out-of-range ids and shape errors. */
#include "ops/embedding.h"
#include "tests/memops_test.h"

enum { B = 3, T = 7, C = 37, V = 11, TMAX = 9 };

static void test_forward(nt_ctx *ctx, nt_test_rng *r, nt_dtype dt) {
  int64_t ts[2] = {B, T}, es[2] = {V, C}, ps[2] = {TMAX, C}, os[3] = {B, T, C};
  int32_t tok[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)nt_test_uniform(r, 0, V);
  float *wte = memops_random(r, V * C, -1, 1), *wpe = memops_random(r, TMAX * C, -1, 1);
  memops_round(wte, V * C, dt);
  memops_round(wpe, TMAX * C, dt);
  nt_tensor tt = memops_ints(ctx, 2, ts, tok), et = memops_tensor(ctx, dt, 2, es, wte);
  nt_tensor pt = memops_tensor(ctx, dt, 2, ps, wpe), ot = memops_tensor(ctx, dt, 3, os, NULL);
  double ref[B * T * C];
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) ref[i * C + c] = (double)wte[tok[i] * C + c] + wpe[(i % T) * C + c];
  CHECK_OK(ctx, nt_embedding_forward(ctx, &tt, &et, &pt, &ot));
  float *ov = memops_values(ctx, &ot);
  /* about twice the measured (docs/tolerances.md) */
  double tol = dt == NT_F32 ? 5.5e-8 : dt == NT_F16 ? 4.6e-4 : 3.5e-3;
  CHECK(nt_test_note(dt, memops_rel_err_fd(ov, ref, B * T * C)) < tol, "%s forward err %g", nt_dtype_name(dt),
        memops_rel_err_fd(ov, ref, B * T * C));
  free(ov);
  /* Without wpe: exactly the token rows. */
  CHECK_OK(ctx, nt_embedding_forward(ctx, &tt, &et, NULL, &ot));
  ov = memops_values(ctx, &ot);
  int exact = 1;
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) exact &= ov[i * C + c] == wte[tok[i] * C + c];
  CHECK(exact, "%s forward without wpe copies wte rows", nt_dtype_name(dt));
  free(ov); free(wte); free(wpe);
  nt_tensor_free(ctx, &tt); nt_tensor_free(ctx, &et); nt_tensor_free(ctx, &pt); nt_tensor_free(ctx, &ot);
}

typedef struct {
  nt_ctx *ctx;
  int32_t *tok;
  float *p; /* wte [V*C] then wpe [TMAX*C] */
  float *R;
} emb_state;

static double emb_loss(void *sp) {
  emb_state *s = sp;
  int64_t ts[2] = {B, T}, es[2] = {V, C}, ps[2] = {TMAX, C}, os[3] = {B, T, C};
  float out[B * T * C];
  nt_tensor tt = nt_tensor_view(s->tok, NT_I32, nt_cpu(), 2, ts);
  nt_tensor et = nt_tensor_view(s->p, NT_F32, nt_cpu(), 2, es);
  nt_tensor pt = nt_tensor_view(s->p + V * C, NT_F32, nt_cpu(), 2, ps);
  nt_tensor ot = nt_tensor_view(out, NT_F32, nt_cpu(), 3, os);
  nt_embedding_forward(s->ctx, &tt, &et, &pt, &ot);
  return memops_dot(out, s->R, B * T * C);
}

static void test_backward(nt_ctx *ctx, nt_test_rng *r) {
  int64_t ts[2] = {B, T}, es[2] = {V, C}, ps[2] = {TMAX, C}, os[3] = {B, T, C}, np = (V + TMAX) * C;
  int32_t tok[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = i % 4 == 0 ? 2 : (int32_t)nt_test_uniform(r, 0, V);
  float *p = memops_random(r, np, -1, 1), *R = memops_random(r, B * T * C, -1, 1);
  float *g0 = memops_random(r, np, -1, 1), *g = malloc((size_t)np * sizeof(float));
  memcpy(g, g0, (size_t)np * sizeof(float));
  nt_tensor tt = nt_tensor_view(tok, NT_I32, nt_cpu(), 2, ts), dout = nt_tensor_view(R, NT_F32, nt_cpu(), 3, os);
  nt_tensor dwte = nt_tensor_view(g, NT_F32, nt_cpu(), 2, es), dwpe = nt_tensor_view(g + V * C, NT_F32, nt_cpu(), 2, ps);
  CHECK_OK(ctx, nt_embedding_backward(ctx, &tt, &dout, &dwte, &dwpe));
  for (int64_t i = 0; i < np; i++) g[i] -= g0[i];
  double *num = malloc((size_t)np * sizeof(double));
  emb_state s = {ctx, tok, p, R};
  memops_fd(emb_loss, &s, p, np, 1e-3f, num);
  CHECK(memops_rel_err_fd(g, num, V * C) < 1e-3, "dwte vs finite differences %g",
        memops_rel_err_fd(g, num, V * C));
  CHECK(memops_rel_err_fd(g + V * C, num + V * C, TMAX * C) < 1e-3, "dwpe vs finite differences %g",
        memops_rel_err_fd(g + V * C, num + V * C, TMAX * C));
  /* dwpe rows past T get nothing; the += left them at their start values (now 0 here). */
  int untouched = 1;
  for (int64_t i = (V + T) * C; i < np; i++) untouched &= g[i] == 0.0f;
  CHECK(untouched, "dwpe rows t >= T untouched");
  free(p); free(R); free(g0); free(g); free(num);
}

static void test_errors(nt_ctx *ctx) {
  int64_t ts[2] = {B, T}, es[2] = {V, C}, ps[2] = {5, C}, os[3] = {B, T, C}, os2[3] = {B, T, C + 1};
  int32_t tok[B * T] = {0};
  nt_tensor et = memops_tensor(ctx, NT_F32, 2, es, NULL), ot = memops_tensor(ctx, NT_F32, 3, os, NULL);
  nt_tensor pt = memops_tensor(ctx, NT_F32, 2, ps, NULL), o2 = memops_tensor(ctx, NT_F32, 3, os2, NULL);
  nt_tensor tf = memops_tensor(ctx, NT_F32, 2, ts, NULL), oh = memops_tensor(ctx, NT_F16, 3, os, NULL);
  tok[5] = V;
  nt_tensor big = memops_ints(ctx, 2, ts, tok);
  tok[5] = -1;
  nt_tensor neg = memops_ints(ctx, 2, ts, tok);
  tok[5] = 0;
  nt_tensor good = memops_ints(ctx, 2, ts, tok);
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_embedding_forward(ctx, &big, &et, NULL, &ot));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_embedding_forward(ctx, &neg, &et, NULL, &ot));
  CHECK_ERR(ctx, NT_ERR_INVALID_ARG, nt_embedding_backward(ctx, &big, &ot, &et, NULL));
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_embedding_forward(ctx, &good, &et, &pt, &ot)); /* T > Tmax */
  CHECK_ERR(ctx, NT_ERR_SHAPE, nt_embedding_forward(ctx, &good, &et, NULL, &o2));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_embedding_forward(ctx, &tf, &et, NULL, &ot));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_embedding_forward(ctx, &good, &et, NULL, &oh));
  CHECK_ERR(ctx, NT_ERR_DTYPE, nt_embedding_backward(ctx, &good, &ot, &oh, NULL));
  nt_tensor_free(ctx, &et); nt_tensor_free(ctx, &ot); nt_tensor_free(ctx, &pt); nt_tensor_free(ctx, &o2);
  nt_tensor_free(ctx, &tf); nt_tensor_free(ctx, &oh); nt_tensor_free(ctx, &big); nt_tensor_free(ctx, &neg);
  nt_tensor_free(ctx, &good);
}

int main(void) {
  nt_ctx *ctx;
  if (nt_ctx_create(&ctx, nt_cpu())) return 1;
  nt_test_rng r = {3};
  for (int d = 0; d < 3; d++) test_forward(ctx, &r, memops_float_dtypes[d]);
  test_backward(ctx, &r);
  test_errors(ctx);
  nt_ctx_free(ctx);
  return nt_test_finish();
}
