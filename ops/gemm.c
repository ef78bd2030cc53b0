/* nt_gemm: argument checks, dispatch, and the CPU reference (OpenBLAS sgemm on fp32 copies of
 * the inputs; the output, aux and epilogue rounded exactly as the GPU stores them). */
#include "ops/gemm_internal.h"
#include "core/convert.h"
#include "ops/gelu_rule.h"
#include <cblas.h>
#include <math.h>
#include <string.h>

nt_gemm_opts nt_gemm_defaults(void) {
  nt_gemm_opts o;
  memset(&o, 0, sizeof o);
  o.alpha = 1.0f;
  o.alpha_set = true;
  return o;
}

static const char *epi_name(nt_gemm_epilogue e) {
  static const char *n[] = {"NONE", "BIAS", "GELU_AUX", "RELU", "DGELU"};
  return ((int)e >= 0 && e <= NT_EPI_DGELU) ? n[e] : "?";
}

static bool is_fp8(nt_dtype t) { return t == NT_FP8_E4M3 || t == NT_FP8_E5M2; }

static nt_status check_dtypes(nt_ctx *ctx, const nt_tensor *A, const nt_tensor *B,
                              const nt_tensor *D) {
  nt_dtype a = A->dtype, b = B->dtype, d = D->dtype;
  if (is_fp8(a) || is_fp8(b)) {
    if (!is_fp8(a) || !is_fp8(b))
      return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm: A is %s and B is %s: FP8 needs both inputs FP8",
                      nt_dtype_name(a), nt_dtype_name(b));
    if (a == NT_FP8_E5M2 && b == NT_FP8_E5M2)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED,
                      "gemm: FP8 e5m2 x e5m2 is not supported (cuBLASLt's FP8 kernels take at "
                      "most one e5m2 input; make A or B e4m3)");
    if (d != NT_F32 && d != NT_F16 && d != NT_BF16)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm: FP8 inputs give D in f32, f16 or bf16, not %s",
                      nt_dtype_name(d));
    return NT_OK;
  }
  if (a != b)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm: A is %s but B is %s (inputs share one dtype)",
                    nt_dtype_name(a), nt_dtype_name(b));
  bool ok = (a == NT_F32 && d == NT_F32) || (a == NT_F16 && (d == NT_F16 || d == NT_F32)) ||
            (a == NT_BF16 && (d == NT_BF16 || d == NT_F32));
  if (!ok)
    return NT_ERROR(ctx, NT_ERR_DTYPE,
                    "gemm: %s inputs with a %s output are not supported (f32->f32, f16->f16|f32, "
                    "bf16->bf16|f32)", nt_dtype_name(a), nt_dtype_name(d));
  return NT_OK;
}

static nt_status check_rank(nt_ctx *ctx, const nt_tensor *t, const char *what) {
  char b[96];
  if (t->ndim == 2 || t->ndim == 3) return NT_OK;
  return NT_ERROR(ctx, NT_ERR_SHAPE, "gemm: %s must be 2-D or 3-D [batch, rows, cols], got %s",
                  what, nt_tensor_describe(t, b, sizeof b));
}

/* Batch size and batch stride of a 2-D or 3-D operand (size 1 broadcasts: stride 0). */
static void batch_of(const nt_tensor *t, int64_t *n, int64_t *stride) {
  *n = t->ndim == 3 ? t->shape[0] : 1;
  *stride = (t->ndim == 3 && t->shape[0] > 1) ? t->stride[0] : 0;
}

static nt_status check_epilogue(nt_ctx *ctx, nt_gemm_problem *p) {
  const nt_gemm_opts *o = p->o;
  char b1[96], b2[96];
  nt_gemm_epilogue e = o->epilogue;
  if ((int)e < 0 || e > NT_EPI_DGELU)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "gemm: unknown epilogue %d", (int)e);
  if (p->batch > 1 && (e == NT_EPI_GELU_AUX || e == NT_EPI_DGELU))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "gemm: epilogue %s on a batched product (batch %lld)",
                    epi_name(e), (long long)p->batch);
  bool wants_bias = e == NT_EPI_BIAS || e == NT_EPI_GELU_AUX || e == NT_EPI_RELU;
  if (e == NT_EPI_BIAS && !o->bias)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "gemm: epilogue BIAS without a bias tensor");
  if (o->bias && wants_bias) {
    const nt_tensor *bias = o->bias;
    if (bias->ndim != 1 || bias->shape[0] != p->N || (bias->shape[0] > 1 && bias->stride[0] != 1))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "gemm: bias must be a contiguous [%lld] (N), got %s",
                      (long long)p->N, nt_tensor_describe(bias, b1, sizeof b1));
    if (bias->dtype != NT_F32 && bias->dtype != p->D->dtype)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm: bias is %s; it must be f32 or D's dtype %s",
                      nt_dtype_name(bias->dtype), nt_dtype_name(p->D->dtype));
    nt_status st = nt_check_device(ctx, bias, "gemm bias");
    if (st) return st;
  }
  if (e == NT_EPI_GELU_AUX || e == NT_EPI_DGELU) {
    const nt_tensor *x = o->aux;
    if (!x)
      return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "gemm: epilogue %s needs the aux tensor",
                      epi_name(e));
    if (x->ndim != p->D->ndim || x->shape[x->ndim - 2] != p->M || x->shape[x->ndim - 1] != p->N ||
        (p->N > 1 && x->stride[x->ndim - 1] != 1))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "gemm: aux %s must match D %s with unit last stride",
                      nt_tensor_describe(x, b1, sizeof b1), nt_tensor_describe(p->D, b2, sizeof b2));
    if (x->dtype != p->D->dtype)
      return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm: aux is %s; it must be D's dtype %s",
                      nt_dtype_name(x->dtype), nt_dtype_name(p->D->dtype));
    nt_status st = nt_check_device(ctx, x, "gemm aux");
    if (st) return st;
    p->x_m = x->stride[x->ndim - 2];
    p->x_batch = 0;
  }
  return NT_OK;
}

/* opts.c: read only at beta != 0; it stands in for D as C, so it must look exactly like D. */
static nt_status check_c(nt_ctx *ctx, const nt_gemm_problem *p) {
  const nt_tensor *c = p->o->c, *D = p->D;
  char b1[96], b2[96];
  if (!c || p->o->beta == 0.0f) return NT_OK;
  bool same = c->ndim == D->ndim && c->dtype == D->dtype;
  for (int i = 0; same && i < D->ndim; i++)
    same = c->shape[i] == D->shape[i] && (D->shape[i] == 1 || c->stride[i] == D->stride[i]);
  if (!same)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "gemm: C %s must have D's shape, strides and dtype (D %s)",
                    nt_tensor_describe(c, b1, sizeof b1), nt_tensor_describe(D, b2, sizeof b2));
  if (is_fp8(p->A->dtype))
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "gemm: a separate C with FP8 inputs");
  return nt_check_device(ctx, c, "gemm C");
}

nt_status nt_gemm(nt_ctx *ctx, const nt_tensor *A, const nt_tensor *B, nt_tensor *D,
                  const nt_gemm_opts *opts) {
  nt_gemm_opts defaults = nt_gemm_defaults();
  const nt_gemm_opts *o = opts ? opts : &defaults;
  char ba[96], bb[96], bd[96];
  nt_status st;
  if (!A || !B || !D) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "gemm: A, B and D are required");
  if ((st = check_rank(ctx, A, "A")) || (st = check_rank(ctx, B, "B")) ||
      (st = check_rank(ctx, D, "D")))
    return st;
  if ((st = nt_check_device(ctx, A, "gemm A")) || (st = nt_check_device(ctx, B, "gemm B")) ||
      (st = nt_check_device(ctx, D, "gemm D")))
    return st;
  if ((st = check_dtypes(ctx, A, B, D))) return st;

  nt_gemm_problem p;
  memset(&p, 0, sizeof p);
  p.A = A; p.B = B; p.D = D; p.o = o;
  p.alpha = (o->alpha_set || o->alpha != 0.0f) ? o->alpha : 1.0f;
  int ra = A->ndim - 2, rb = B->ndim - 2, rd = D->ndim - 2;
  /* op(A)[m, k]: A[m, k] or, transposed, A[k, m]. */
  int am = o->trans_a ? ra + 1 : ra, ak = o->trans_a ? ra : ra + 1;
  int bk = o->trans_b ? rb + 1 : rb, bn = o->trans_b ? rb : rb + 1;
  p.M = A->shape[am]; p.K = A->shape[ak]; p.N = B->shape[bn];
  p.a_m = A->stride[am]; p.a_k = A->stride[ak];
  p.b_k = B->stride[bk]; p.b_n = B->stride[bn];
  p.d_m = D->stride[rd]; p.d_n = D->stride[rd + 1];
  if (B->shape[bk] != p.K || D->shape[rd] != p.M || D->shape[rd + 1] != p.N)
    return NT_ERROR(ctx, NT_ERR_SHAPE,
                    "gemm: op(A) is [%lld, %lld] (A %s%s), op(B) is [%lld, %lld] (B %s%s), D is %s: "
                    "need op(A) [M, K], op(B) [K, N], D [M, N]",
                    (long long)p.M, (long long)p.K, nt_tensor_describe(A, ba, sizeof ba),
                    o->trans_a ? ", trans_a" : "", (long long)B->shape[bk], (long long)p.N,
                    nt_tensor_describe(B, bb, sizeof bb), o->trans_b ? ", trans_b" : "",
                    nt_tensor_describe(D, bd, sizeof bd));
  int64_t na, nb, nd;
  batch_of(A, &na, &p.a_batch);
  batch_of(B, &nb, &p.b_batch);
  nd = D->ndim == 3 ? D->shape[0] : 1;
  p.d_batch = D->ndim == 3 ? D->stride[0] : 0;
  if ((na != 1 && na != nd) || (nb != 1 && nb != nd) || (D->ndim == 2 && (na > 1 || nb > 1)))
    return NT_ERROR(ctx, NT_ERR_SHAPE,
                    "gemm: batch sizes A %lld, B %lld, D %lld do not fit (A and B have D's batch "
                    "or 1; D is 3-D when A or B is batched)", (long long)na, (long long)nb,
                    (long long)nd);
  p.batch = nd;
  if ((st = check_epilogue(ctx, &p)) || (st = check_c(ctx, &p))) return st;
  if (p.M == 0 || p.N == 0 || p.batch == 0) return NT_OK;

  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_gemm_cuda(ctx, &p);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "gemm: CUDA tensors without the CUDA backend");
#endif
  }
  return nt_gemm_cpu(ctx, &p);
}

void nt_gemm_get_stats(nt_ctx *ctx, nt_gemm_stats *out) {
  memset(out, 0, sizeof *out);
#ifdef NT_HAVE_CUDA
  if (nt_ctx_is_cuda(ctx)) nt_gemm_cuda_stats(ctx, out);
#else
  (void)ctx;
#endif
}

/* ---- CPU reference ---------------------------------------------------------------------- */

/* An fp32 operand for sgemm: the F32 tensor itself when one of its strides is 1, otherwise a
 * packed row-major copy ([rows, cols], elements converted from the tensor's dtype). */
typedef struct {
  const float *p;
  int lda;
  bool trans;
} sg_operand;

static void pack(const nt_tensor *t, const char *base, int64_t rows, int64_t cols, int64_t s_r,
                 int64_t s_c, float scale, float *out) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      out[r * cols + c] = scale * nt_load_f32(base, t->dtype, r * s_r + c * s_c);
}

static sg_operand operand(const nt_tensor *t, const char *base, int64_t rows, int64_t cols,
                          int64_t s_r, int64_t s_c, float scale, float *buf) {
  sg_operand op = {buf, (int)cols, false};
  if (t->dtype == NT_F32 && scale == 1.0f) {
    if ((s_c == 1 || cols == 1) && s_r >= cols && s_r > 0)
      return (sg_operand){(const float *)base, (int)s_r, false};
    if ((s_r == 1 || rows == 1) && s_c >= rows && s_c > 0)
      return (sg_operand){(const float *)base, (int)s_c, true};
  }
  pack(t, base, rows, cols, s_r, s_c, scale, buf);
  return op;
}

static float act_relu(float x) { return x > 0.0f ? x : 0.0f; }

nt_status nt_gemm_cpu(nt_ctx *ctx, const nt_gemm_problem *p) {
  const nt_gemm_opts *o = p->o;
  int64_t M = p->M, N = p->N, K = p->K;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "gemm (CPU): dims beyond 2^31");
  size_t es = sizeof(float);
  float *fa = NULL, *fb = NULL, *acc = NULL;
  nt_status st;
  if ((st = nt_alloc(ctx, (size_t)(M * K + 1) * es, (void **)&fa))) goto done;
  if ((st = nt_alloc(ctx, (size_t)(K * N + 1) * es, (void **)&fb))) goto done;
  if ((st = nt_alloc(ctx, (size_t)(M * N + 1) * es, (void **)&acc))) goto done;
  /* FP8: the stored values are value * scale; the product is scaled back. */
  float sa = o->scale_inv_a ? *o->scale_inv_a : 1.0f, sb = o->scale_inv_b ? *o->scale_inv_b : 1.0f;
  if (!is_fp8(p->A->dtype)) sa = sb = 1.0f;
  size_t ea = nt_dtype_size(p->A->dtype), eb = nt_dtype_size(p->B->dtype);
  size_t ed = nt_dtype_size(p->D->dtype);
  nt_gemm_epilogue e = o->epilogue;
  const nt_tensor *bias = (e == NT_EPI_BIAS || e == NT_EPI_GELU_AUX || e == NT_EPI_RELU) ? o->bias
                                                                                         : NULL;
  for (int64_t b = 0; b < p->batch; b++) {
    const char *pa = (const char *)p->A->data + (size_t)(b * p->a_batch) * ea;
    const char *pb = (const char *)p->B->data + (size_t)(b * p->b_batch) * eb;
    char *pd = (char *)p->D->data + (size_t)(b * p->d_batch) * ed;
    const char *pc = o->c ? (const char *)o->c->data + (size_t)(b * p->d_batch) * ed : pd;
    sg_operand oa = operand(p->A, pa, M, K, p->a_m, p->a_k, sa, fa);
    sg_operand ob = operand(p->B, pb, K, N, p->b_k, p->b_n, sb, fb);
    if (K == 0) {
      memset(acc, 0, (size_t)(M * N) * es);
    } else {
      cblas_sgemm(CblasRowMajor, oa.trans ? CblasTrans : CblasNoTrans,
                  ob.trans ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, p->alpha, oa.p,
                  oa.lda, ob.p, ob.lda, 0.0f, acc, (int)N);
    }
    for (int64_t m = 0; m < M; m++) {
      for (int64_t n = 0; n < N; n++) {
        int64_t di = m * p->d_m + n * p->d_n;
        float v = acc[m * N + n];
        if (o->beta != 0.0f) v += o->beta * nt_load_f32(pc, p->D->dtype, di);
        if (bias) v += nt_load_f32(bias->data, bias->dtype, n);
        switch (e) {
          case NT_EPI_GELU_AUX: {
            nt_store_f32(o->aux->data, o->aux->dtype, m * p->x_m + n, v);
            v = nt_gelu(v);
            break;
          }
          case NT_EPI_RELU: v = act_relu(v); break;
          case NT_EPI_DGELU: {
            v *= nt_gelu_grad(nt_load_f32(o->aux->data, o->aux->dtype, m * p->x_m + n));
            break;
          }
          default: break;
        }
        nt_store_f32(pd, p->D->dtype, di, v);
      }
    }
  }
done:
  nt_free(ctx, fa);
  nt_free(ctx, fb);
  nt_free(ctx, acc);
  return st;
}

nt_status nt_gemm_bias_grad(nt_ctx *ctx, const nt_tensor *dy, nt_tensor *db) {
  char b1[96], b2[96];
  if (!dy || !db)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "gemm_bias_grad: dy and db are required");
  nt_status st;
  if ((st = nt_check_device(ctx, dy, "gemm_bias_grad dy")) ||
      (st = nt_check_device(ctx, db, "gemm_bias_grad db")) ||
      (st = nt_check_dtype(ctx, db, NT_F32, "gemm_bias_grad db")))
    return st;
  if (dy->dtype != NT_F32 && dy->dtype != NT_F16 && dy->dtype != NT_BF16)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "gemm_bias_grad: dy is %s (F32, F16 or BF16)",
                    nt_dtype_name(dy->dtype));
  if (dy->ndim != 2 || (dy->shape[1] > 1 && dy->stride[1] != 1) || db->ndim != 1 ||
      db->shape[0] != dy->shape[1] || (db->shape[0] > 1 && db->stride[0] != 1))
    return NT_ERROR(ctx, NT_ERR_SHAPE,
                    "gemm_bias_grad: dy %s must be [M, N] with unit stride along N and db %s a "
                    "contiguous [N]", nt_tensor_describe(dy, b1, sizeof b1),
                    nt_tensor_describe(db, b2, sizeof b2));
  int64_t M = dy->shape[0], N = dy->shape[1];
  if (M == 0 || N == 0) return NT_OK;
  if (nt_ctx_is_cuda(ctx)) {
#ifdef NT_HAVE_CUDA
    return nt_gemmk_colsum_add(ctx, dy->dtype, dy->data, dy->stride[0], M, N, (float *)db->data);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "gemm_bias_grad: CUDA tensors without the CUDA backend");
#endif
  }
  float *g = (float *)db->data;
  for (int64_t n = 0; n < N; n++) {
    double s = 0.0;
    for (int64_t m = 0; m < M; m++) s += nt_load_f32(dy->data, dy->dtype, m * dy->stride[0] + n);
    g[n] += (float)s;
  }
  return NT_OK;
}
