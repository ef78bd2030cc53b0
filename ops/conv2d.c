/* Conv2d: argument checks, dispatch, and the CPU reference by direct loops (inputs widened to
 * fp32 once, sums in fp64, results rounded to the output dtype). */
#include "ops/conv2d.h"
#include "ops/conv2d_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_conv2d_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p, bool relu);
nt_status nt_conv2d_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  nt_tensor *dw, nt_tensor *db, nt_conv2d_params p);
#endif

typedef nt_conv_dims conv_dims;

int nt_conv2d_chunk_images(int n, int64_t rows, double bytes, double mb) {
  if (n < 1) return 1;
  if (mb == 0.0) return n;
  double k;  /* images per chunk before balancing */
  if (mb > 0.0) {
    k = bytes > 0.0 ? floor(mb * 1048576.0 / bytes) : n;
  } else {
    k = bytes > 0.0 ? floor(NT_CONV_CHUNK_BYTES / bytes) : n;
    const double k_rows = rows > 0 ? ceil((double)NT_CONV_CHUNK_ROWS / (double)rows) : n;
    if (k < k_rows) k = k_rows;
    if (bytes > 0.0 && k * bytes > NT_CONV_CHUNK_MAX_BYTES)
      k = floor(NT_CONV_CHUNK_MAX_BYTES / bytes);
  }
  if (k < 1.0) k = 1.0;
  if (k >= n) return n;
  /* As many chunks as k requires, of equal size: the same number of GEMMs, less scratch. */
  const int chunks = (n + (int)k - 1) / (int)k;
  return (n + chunks - 1) / chunks;
}

static bool float_dtype(nt_dtype dt) { return dt == NT_F32 || dt == NT_F16 || dt == NT_BF16; }

nt_status nt_conv2d_check_t(nt_ctx *ctx, const nt_tensor *t, int ndim, nt_dtype dt,
                            const char *what) {
  nt_status st;
  if ((st = nt_check_device(ctx, t, what))) return st;
  if ((st = nt_check_ndim(ctx, t, ndim, what))) return st;
  if ((st = nt_check_dtype(ctx, t, dt, what))) return st;
  return nt_check_contiguous(ctx, t, what);
}

nt_status nt_conv2d_check_bias(nt_ctx *ctx, const nt_tensor *b, nt_dtype dt, int64_t cout,
                               const char *what) {
  if (b->dtype != dt && b->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s (expected %s or f32)", what,
                    nt_dtype_name(b->dtype), nt_dtype_name(dt));
  nt_status st = nt_conv2d_check_t(ctx, b, 1, b->dtype, what);
  return st ? st : nt_check_dim(ctx, b, 0, cout, what);
}

/* Whether a and b (either may be NULL: no) share a byte; both are contiguous, so each spans
 * nt_tensor_nbytes from its data. */
static bool overlap(const nt_tensor *a, const nt_tensor *b) {
  if (!a || !b || !nt_tensor_nbytes(a) || !nt_tensor_nbytes(b)) return false;
  const uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
  return a0 < b0 + nt_tensor_nbytes(b) && b0 < a0 + nt_tensor_nbytes(a);
}

nt_status nt_conv2d_check_apart(nt_ctx *ctx, const nt_conv_arg *outs, int n_out,
                                const nt_conv_arg *ins, int n_in, const char *what) {
  for (int i = 0; i < n_out; i++)
    for (int j = 0; j < n_in + i; j++) {
      const nt_conv_arg *other = j < n_in ? &ins[j] : &outs[j - n_in];
      if (overlap(outs[i].t, other->t))
        return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: %s overlaps %s in memory (an output may "
                        "share no memory with an input or another output)", what, outs[i].name,
                        other->name);
    }
  return NT_OK;
}

nt_status nt_conv2d_check(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                          const nt_tensor *y, nt_conv2d_params p, bool nhwc, conv_dims *d,
                          const char *what) {
  nt_status st;
  if (!x || !w || !y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: NULL x, w or y", what);
  if (!float_dtype(x->dtype))
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16)", what,
                    nt_dtype_name(x->dtype));
  const char *xs = nhwc ? "conv2d_nhwc x [N, H, W, Cin]" : "conv2d x [N, Cin, H, W]";
  const char *ys = nhwc ? "conv2d_nhwc y [N, OH, OW, Cout]" : "conv2d y [N, Cout, OH, OW]";
  if ((st = nt_conv2d_check_t(ctx, x, 4, x->dtype, xs))) return st;
  if ((st = nt_conv2d_check_t(ctx, w, 4, x->dtype, "conv2d w [Cout, Cin, KH, KW]"))) return st;
  if ((st = nt_conv2d_check_t(ctx, y, 4, x->dtype, ys))) return st;
  if (p.stride < 1 || p.pad < 0)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "%s: stride %d must be >= 1 and pad %d >= 0", what,
                    p.stride, p.pad);
  d->N = x->shape[0];
  d->Cin = x->shape[nhwc ? 3 : 1];
  d->H = x->shape[nhwc ? 1 : 2];
  d->W = x->shape[nhwc ? 2 : 3];
  d->Cout = w->shape[0]; d->KH = w->shape[2]; d->KW = w->shape[3];
  if (w->shape[1] != d->Cin)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: w has %lld input channels, x has %lld", what,
                    (long long)w->shape[1], (long long)d->Cin);
  if (d->KH < 1 || d->KW < 1 || d->H + 2 * p.pad < d->KH || d->W + 2 * p.pad < d->KW)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "%s: kernel %lldx%lld does not fit the padded %lldx%lld "
                    "input", what, (long long)d->KH, (long long)d->KW,
                    (long long)(d->H + 2 * p.pad), (long long)(d->W + 2 * p.pad));
  d->OH = (d->H + 2 * p.pad - d->KH) / p.stride + 1;
  d->OW = (d->W + 2 * p.pad - d->KW) / p.stride + 1;
  const int64_t nchw[4] = {d->N, d->Cout, d->OH, d->OW}, hwc[4] = {d->N, d->OH, d->OW, d->Cout};
  for (int i = 0; i < 4; i++)
    if ((st = nt_check_dim(ctx, y, i, (nhwc ? hwc : nchw)[i], ys))) return st;
  return NT_OK;
}

float *nt_conv2d_widen(const nt_tensor *t) {
  const int64_t n = nt_tensor_numel(t);
  float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; f && i < n; i++) f[i] = nt_load_f32(t->data, t->dtype, i);
  return f;
}

static nt_status conv_forward_cpu(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                  const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                  bool relu, const conv_dims *d) {
  float *X = nt_conv2d_widen(x), *Wt = nt_conv2d_widen(w), *Bv = b ? nt_conv2d_widen(b) : NULL;
  nt_status st = NT_OK;
  if (!X || !Wt || (b && !Bv)) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "conv2d: out of host memory");
    goto done;
  }
  for (int64_t n = 0; n < d->N; n++)
    for (int64_t co = 0; co < d->Cout; co++)
      for (int64_t oh = 0; oh < d->OH; oh++)
        for (int64_t ow = 0; ow < d->OW; ow++) {
          double acc = Bv ? Bv[co] : 0.0;
          for (int64_t ci = 0; ci < d->Cin; ci++)
            for (int64_t kh = 0; kh < d->KH; kh++) {
              const int64_t ih = oh * p.stride - p.pad + kh;
              if (ih < 0 || ih >= d->H) continue;
              for (int64_t kw = 0; kw < d->KW; kw++) {
                const int64_t iw = ow * p.stride - p.pad + kw;
                if (iw < 0 || iw >= d->W) continue;
                acc += (double)X[((n * d->Cin + ci) * d->H + ih) * d->W + iw] *
                       Wt[((co * d->Cin + ci) * d->KH + kh) * d->KW + kw];
              }
            }
          if (relu && !(acc > 0.0)) acc = acc != acc ? acc : 0.0;
          nt_store_f32(y->data, y->dtype, ((n * d->Cout + co) * d->OH + oh) * d->OW + ow,
                       (float)acc);
        }
done:
  free(X); free(Wt); free(Bv);
  return st;
}

static void add_into(nt_tensor *t, const double *g) {
  const int64_t n = nt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++)
    nt_store_f32(t->data, t->dtype, i, (float)((double)nt_load_f32(t->data, t->dtype, i) + g[i]));
}

/* relu_y (or NULL): the forward's ReLU output; dy counts only where relu_y > 0. */
static nt_status conv_backward_cpu(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                   const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                   nt_tensor *dw, nt_tensor *db, nt_conv2d_params p,
                                   const conv_dims *d) {
  float *G = nt_conv2d_widen(dy), *X = nt_conv2d_widen(x), *Wt = nt_conv2d_widen(w);
  for (int64_t i = 0; G && relu_y && i < nt_tensor_numel(dy); i++)
    if (!(nt_load_f32(relu_y->data, relu_y->dtype, i) > 0.0f)) G[i] = 0.0f;
  double *gx = calloc((size_t)nt_tensor_numel(x) + 1, sizeof(double));
  double *gw = calloc((size_t)nt_tensor_numel(w) + 1, sizeof(double));
  double *gb = calloc((size_t)d->Cout + 1, sizeof(double));
  nt_status st = NT_OK;
  if (!G || !X || !Wt || !gx || !gw || !gb) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "conv2d backward: out of host memory");
    goto done;
  }
  for (int64_t n = 0; n < d->N; n++)
    for (int64_t co = 0; co < d->Cout; co++)
      for (int64_t oh = 0; oh < d->OH; oh++)
        for (int64_t ow = 0; ow < d->OW; ow++) {
          const double g = G[((n * d->Cout + co) * d->OH + oh) * d->OW + ow];
          gb[co] += g;
          for (int64_t ci = 0; ci < d->Cin; ci++)
            for (int64_t kh = 0; kh < d->KH; kh++) {
              const int64_t ih = oh * p.stride - p.pad + kh;
              if (ih < 0 || ih >= d->H) continue;
              for (int64_t kw = 0; kw < d->KW; kw++) {
                const int64_t iw = ow * p.stride - p.pad + kw;
                if (iw < 0 || iw >= d->W) continue;
                const int64_t xi = ((n * d->Cin + ci) * d->H + ih) * d->W + iw;
                const int64_t wi = ((co * d->Cin + ci) * d->KH + kh) * d->KW + kw;
                gx[xi] += g * Wt[wi];
                gw[wi] += g * X[xi];
              }
            }
        }
  if (dx) add_into(dx, gx);
  if (dw) add_into(dw, gw);
  if (db) add_into(db, gb);
done:
  free(G); free(X); free(Wt); free(gx); free(gw); free(gb);
  return st;
}

static nt_status conv_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                              const nt_tensor *b, nt_tensor *y, nt_conv2d_params p, bool relu) {
  conv_dims d;
  nt_status st =
      nt_conv2d_check(ctx, x, w, y, p, false, &d, relu ? "conv2d_relu_forward" : "conv2d_forward");
  if (st) return st;
  if (b && (st = nt_conv2d_check_bias(ctx, b, x->dtype, d.Cout, "conv2d b [Cout]"))) return st;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_conv2d_forward_cuda(ctx, x, w, b, y, p, relu);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "conv2d: CUDA tensor without the CUDA backend");
#endif
  }
  return conv_forward_cpu(ctx, x, w, b, y, p, relu, &d);
}

nt_status nt_conv2d_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                            const nt_tensor *b, nt_tensor *y, nt_conv2d_params p) {
  return conv_forward(ctx, x, w, b, y, p, false);
}

nt_status nt_conv2d_relu_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p) {
  return conv_forward(ctx, x, w, b, y, p, true);
}

static nt_status conv_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                               const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                               nt_tensor *dw, nt_tensor *db, nt_conv2d_params p) {
  conv_dims d;
  nt_status st = nt_conv2d_check(ctx, x, w, dy, p, false, &d,
                            relu_y ? "conv2d_relu_backward" : "conv2d_backward");
  if (st) return st;
  if (relu_y && (st = nt_conv2d_check_t(ctx, relu_y, 4, x->dtype, "conv2d_relu_backward y")))
    return st;
  if (relu_y && (st = nt_check_same_shape(ctx, relu_y, dy, "conv2d_relu_backward y vs dy")))
    return st;
  if (dx && (st = nt_conv2d_check_t(ctx, dx, 4, x->dtype, "conv2d dx"))) return st;
  if (dx && (st = nt_check_same_shape(ctx, dx, x, "conv2d dx vs x"))) return st;
  if (dw && (st = nt_conv2d_check_t(ctx, dw, 4, dw->dtype == NT_F32 ? NT_F32 : x->dtype,
                                    "conv2d dw")))
    return st;
  if (dw && (st = nt_check_same_shape(ctx, dw, w, "conv2d dw vs w"))) return st;
  if (db && (st = nt_conv2d_check_bias(ctx, db, x->dtype, d.Cout, "conv2d db [Cout]"))) return st;
  if (!dx && !dw && !db) return NT_OK;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_conv2d_backward_cuda(ctx, dy, relu_y, x, w, dx, dw, db, p);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "conv2d: CUDA tensor without the CUDA backend");
#endif
  }
  return conv_backward_cpu(ctx, dy, relu_y, x, w, dx, dw, db, p, &d);
}

nt_status nt_conv2d_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *x,
                             const nt_tensor *w, nt_tensor *dx, nt_tensor *dw, nt_tensor *db,
                             nt_conv2d_params p) {
  return conv_backward(ctx, dy, NULL, x, w, dx, dw, db, p);
}

nt_status nt_conv2d_relu_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  nt_tensor *dw, nt_tensor *db, nt_conv2d_params p) {
  if (!y) return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "conv2d_relu_backward: NULL y");
  return conv_backward(ctx, dy, y, x, w, dx, dw, db, p);
}
