/* NHWC Conv2d: argument checks, dispatch, and the CPU reference by direct loops (inputs widened
 * to fp32 once, sums in fp64, results rounded once to the output dtype). */
#include "ops/conv2d_nhwc.h"
#include "ops/conv2d_internal.h"
#include <stdlib.h>
#include <string.h>

#ifdef NT_HAVE_CUDA
nt_status nt_conv2d_nhwc_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                      const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                      bool relu);
nt_status nt_conv2d_nhwc_pool_forward_cuda(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                           const nt_tensor *b, nt_tensor *y, nt_tensor *argmax,
                                           nt_conv2d_params p, bool relu, bool y_nchw);
nt_status nt_conv2d_nhwc_backward_cuda(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                       const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                       const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                                       nt_conv2d_params p);
#endif

typedef nt_conv_dims dims;

/* dw: w's shape, in the input dtype or F32. */
static nt_status check_dw(nt_ctx *ctx, const nt_tensor *dw, const nt_tensor *w, nt_dtype dt) {
  const char *what = "conv2d_nhwc dw";
  if (dw->dtype != dt && dw->dtype != NT_F32)
    return NT_ERROR(ctx, NT_ERR_DTYPE, "%s: dtype %s (expected %s or f32)", what,
                    nt_dtype_name(dw->dtype), nt_dtype_name(dt));
  nt_status st = nt_conv2d_check_t(ctx, dw, 4, dw->dtype, what);
  return st ? st : nt_check_same_shape(ctx, dw, w, what);
}

/* Calls body(xi, wi, yi) for every (output, tap, input channel) whose input is inside x:
 * the one loop nest shared by the forward and both gradients. */
#define FOR_EACH_TAP(d, p, body)                                                             \
  for (int64_t n = 0; n < (d)->N; n++)                                                       \
    for (int64_t oh = 0; oh < (d)->OH; oh++)                                                 \
      for (int64_t ow = 0; ow < (d)->OW; ow++)                                               \
        for (int64_t co = 0; co < (d)->Cout; co++) {                                         \
          const int64_t yi = ((n * (d)->OH + oh) * (d)->OW + ow) * (d)->Cout + co;           \
          for (int64_t kh = 0; kh < (d)->KH; kh++) {                                         \
            const int64_t ih = oh * (p).stride - (p).pad + kh;                               \
            if (ih < 0 || ih >= (d)->H) continue;                                            \
            for (int64_t kw = 0; kw < (d)->KW; kw++) {                                       \
              const int64_t iw = ow * (p).stride - (p).pad + kw;                             \
              if (iw < 0 || iw >= (d)->W) continue;                                          \
              for (int64_t ci = 0; ci < (d)->Cin; ci++) {                                    \
                const int64_t xi = ((n * (d)->H + ih) * (d)->W + iw) * (d)->Cin + ci;        \
                const int64_t wi = ((co * (d)->Cin + ci) * (d)->KH + kh) * (d)->KW + kw;     \
                body;                                                                        \
              }                                                                              \
            }                                                                                \
          }                                                                                  \
        }

static nt_status forward_cpu(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                             const nt_tensor *b, nt_tensor *y, nt_conv2d_params p, bool relu,
                             const dims *d) {
  float *X = nt_conv2d_widen(x), *Wt = nt_conv2d_widen(w), *Bv = b ? nt_conv2d_widen(b) : NULL;
  const int64_t ny = nt_tensor_numel(y);
  double *acc = calloc((size_t)ny + 1, sizeof *acc);
  nt_status st = NT_OK;
  if (!X || !Wt || (b && !Bv) || !acc) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "conv2d_nhwc: out of host memory");
    goto done;
  }
  FOR_EACH_TAP(d, p, acc[yi] += (double)X[xi] * Wt[wi]);
  for (int64_t i = 0; i < ny; i++) {
    double v = acc[i] + (Bv ? Bv[i % d->Cout] : 0.0);
    if (relu && !(v > 0.0) && v == v) v = 0.0;   /* a NaN passes through, as torch */
    nt_store_f32(y->data, y->dtype, i, (float)v);
  }
done:
  free(X); free(Wt); free(Bv); free(acc);
  return st;
}

static nt_status backward_cpu(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                              const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                              const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                              nt_conv2d_params p, const dims *d) {
  float *G = nt_conv2d_widen(dy), *X = nt_conv2d_widen(x), *Wt = nt_conv2d_widen(w);
  const int64_t ny = nt_tensor_numel(dy), nx = nt_tensor_numel(x), nw = nt_tensor_numel(w);
  double *gx = calloc((size_t)nx + 1, sizeof(double));
  double *gw = calloc((size_t)nw + 1, sizeof(double));
  double *gb = calloc((size_t)d->Cout + 1, sizeof(double));
  nt_status st = NT_OK;
  if (!G || !X || !Wt || !gx || !gw || !gb) {
    st = NT_ERROR(ctx, NT_ERR_OOM, "conv2d_nhwc backward: out of host memory");
    goto done;
  }
  for (int64_t i = 0; relu_y && i < ny; i++)
    if (!(nt_load_f32(relu_y->data, relu_y->dtype, i) > 0.0f)) G[i] = 0.0f;
  for (int64_t i = 0; i < ny; i++) gb[i % d->Cout] += G[i];
  FOR_EACH_TAP(d, p, {
    gx[xi] += (double)G[yi] * Wt[wi];
    gw[wi] += (double)G[yi] * X[xi];
  });
  for (int64_t i = 0; dx && i < nx; i++) {
    const bool keep = !dx_mask || nt_load_f32(dx_mask->data, dx_mask->dtype, i) > 0.0f;
    nt_store_f32(dx->data, dx->dtype, i, keep ? (float)gx[i] : 0.0f);
  }
  for (int64_t i = 0; dw && i < nw; i++)
    nt_store_f32(dw->data, dw->dtype, i,
                 (float)((double)nt_load_f32(dw->data, dw->dtype, i) + gw[i]));
  for (int64_t i = 0; db && i < d->Cout; i++)
    nt_store_f32(db->data, db->dtype, i,
                 (float)((double)nt_load_f32(db->data, db->dtype, i) + gb[i]));
done:
  free(G); free(X); free(Wt); free(gx); free(gw); free(gb);
  return st;
}

nt_status nt_conv2d_nhwc_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                 const nt_tensor *b, nt_tensor *y, nt_conv2d_params p,
                                 bool relu) {
  dims d;
  nt_status st = nt_conv2d_check(ctx, x, w, y, p, true, &d, "conv2d_nhwc_forward");
  if (st) return st;
  if (b && (st = nt_conv2d_check_bias(ctx, b, x->dtype, d.Cout, "conv2d_nhwc b [Cout]")))
    return st;
  const nt_conv_arg outs[] = {{y, "y"}}, ins[] = {{x, "x"}, {w, "w"}, {b, "b"}};
  if ((st = nt_conv2d_check_apart(ctx, outs, 1, ins, 3, "conv2d_nhwc_forward"))) return st;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_conv2d_nhwc_forward_cuda(ctx, x, w, b, y, p, relu);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "conv2d_nhwc: CUDA tensor without the CUDA backend");
#endif
  }
  return forward_cpu(ctx, x, w, b, y, p, relu, &d);
}

nt_status nt_conv2d_nhwc_pool_forward(nt_ctx *ctx, const nt_tensor *x, const nt_tensor *w,
                                      const nt_tensor *b, nt_tensor *y, nt_tensor *argmax,
                                      nt_conv2d_params p, bool relu, bool y_nchw,
                                      nt_tensor *scratch) {
  if (!x || !w || !y || !argmax)
    return NT_ERROR(ctx, NT_ERR_INVALID_ARG, "conv2d_nhwc_pool_forward: NULL x, w, y or argmax");
  if (x->ndim != 4 || w->ndim != 4 || p.stride < 1)
    return NT_ERROR(ctx, NT_ERR_SHAPE,
                    "conv2d_nhwc_pool_forward: x and w must be 4-D, stride >= 1");
  /* the conv's output shape, for the checks of both ops */
  const int64_t OH = (x->shape[1] + 2 * p.pad - w->shape[2]) / p.stride + 1,
                OW = (x->shape[2] + 2 * p.pad - w->shape[3]) / p.stride + 1;
  const int64_t sz[4] = {x->shape[0], OH, OW, w->shape[0]};
  nt_tensor z = nt_tensor_view(NULL, x->dtype, x->device, 4, sz);
  dims d;
  nt_status st = nt_conv2d_check(ctx, x, w, &z, p, true, &d, "conv2d_nhwc_pool_forward");
  if (st) return st;
  if (b && (st = nt_conv2d_check_bias(ctx, b, x->dtype, d.Cout, "conv2d_nhwc b [Cout]")))
    return st;
  const int64_t PH = OH / 2, PW = OW / 2;
  const int64_t hwc[4] = {d.N, PH, PW, d.Cout}, chw[4] = {d.N, d.Cout, PH, PW};
  const int64_t *want = y_nchw ? chw : hwc;
  for (int i = 0; i < 4; i++)
    if ((st = nt_check_dim(ctx, y, i, want[i], "conv2d_nhwc_pool y")) ||
        (st = nt_check_dim(ctx, argmax, i, want[i], "conv2d_nhwc_pool argmax")))
      return st;
  if ((st = nt_conv2d_check_t(ctx, y, 4, x->dtype, "conv2d_nhwc_pool y")) ||
      (st = nt_conv2d_check_t(ctx, argmax, 4, NT_I32, "conv2d_nhwc_pool argmax")))
    return st;
  if (OH < 2 || OW < 2)
    return NT_ERROR(ctx, NT_ERR_SHAPE, "conv2d_nhwc_pool_forward: conv output %lldx%lld is "
                    "smaller than the 2x2 window", (long long)OH, (long long)OW);
  const nt_conv_arg outs[] = {{y, "y"}, {argmax, "argmax"}}, ins[] = {{x, "x"}, {w, "w"}, {b, "b"}};
  if ((st = nt_conv2d_check_apart(ctx, outs, 2, ins, 3, "conv2d_nhwc_pool_forward"))) return st;
#ifdef NT_HAVE_CUDA
  if (x->device.type == NT_DEV_CUDA && x->dtype != NT_F32) {
    /* the fused kernel's GEMM rows (the 4 conv outputs of each window) are numbered in int */
    const double rows = 4.0 * (double)d.N * (double)PH * (double)PW;
    if (rows > 2e9)
      return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "conv2d_nhwc_pool_forward: %lld images of %lldx%lld "
                      "windows are %.0f GEMM rows (4 per window), past the CUDA kernel's int "
                      "range (2e9)", (long long)d.N, (long long)PH, (long long)PW, rows);
    return nt_conv2d_nhwc_pool_forward_cuda(ctx, x, w, b, y, argmax, p, relu, y_nchw);
  }
#endif
  /* the two ops through a scratch conv output */
  nt_tensor t = {0}, own = {0};
  if (scratch) {
    if ((st = nt_conv2d_check_t(ctx, scratch, scratch->ndim, x->dtype, "conv2d_nhwc_pool scratch")))
      return st;
    if (nt_tensor_numel(scratch) < nt_tensor_numel(&z))
      return NT_ERROR(ctx, NT_ERR_SHAPE, "conv2d_nhwc_pool scratch: %lld elements, %lld needed",
                      (long long)nt_tensor_numel(scratch), (long long)nt_tensor_numel(&z));
    t = nt_tensor_view(scratch->data, x->dtype, x->device, 4, sz);
    /* the part the conv writes: apart from the inputs, y and argmax */
    const nt_conv_arg used[] = {{&t, "scratch"}},
                      others[] = {{x, "x"}, {w, "w"}, {b, "b"}, {y, "y"}, {argmax, "argmax"}};
    if ((st = nt_conv2d_check_apart(ctx, used, 1, others, 5, "conv2d_nhwc_pool_forward")))
      return st;
  } else {
    st = nt_tensor_alloc(ctx, &own, x->dtype, 4, sz);
    t = own;
  }
  if (!st) st = nt_conv2d_nhwc_forward(ctx, x, w, b, &t, p, relu);
  if (!st) st = nt_maxpool2d_nhwc_forward(ctx, &t, y, argmax, 2, y_nchw);
  nt_tensor_free(ctx, &own);
  return st;
}

nt_status nt_conv2d_nhwc_backward(nt_ctx *ctx, const nt_tensor *dy, const nt_tensor *relu_y,
                                  const nt_tensor *x, const nt_tensor *w, nt_tensor *dx,
                                  const nt_tensor *dx_mask, nt_tensor *dw, nt_tensor *db,
                                  nt_conv2d_params p) {
  dims d;
  nt_status st = nt_conv2d_check(ctx, x, w, dy, p, true, &d, "conv2d_nhwc_backward");
  if (st) return st;
  if (relu_y && ((st = nt_conv2d_check_t(ctx, relu_y, 4, x->dtype, "conv2d_nhwc relu_y")) ||
                 (st = nt_check_same_shape(ctx, relu_y, dy, "conv2d_nhwc relu_y vs dy"))))
    return st;
  if (dx && ((st = nt_conv2d_check_t(ctx, dx, 4, x->dtype, "conv2d_nhwc dx")) ||
             (st = nt_check_same_shape(ctx, dx, x, "conv2d_nhwc dx vs x"))))
    return st;
  if (dx && dx_mask &&
      ((st = nt_conv2d_check_t(ctx, dx_mask, 4, x->dtype, "conv2d_nhwc dx_mask")) ||
       (st = nt_check_same_shape(ctx, dx_mask, x, "conv2d_nhwc dx_mask vs x"))))
    return st;
  if (!dx) dx_mask = NULL;
  if (dw && (st = check_dw(ctx, dw, w, x->dtype))) return st;
  if (db && (st = nt_conv2d_check_bias(ctx, db, x->dtype, d.Cout, "conv2d_nhwc db [Cout]")))
    return st;
  const nt_conv_arg outs[] = {{dx, "dx"}, {dw, "dw"}, {db, "db"}},
                    ins[] = {{dy, "dy"}, {relu_y, "relu_y"}, {x, "x"}, {w, "w"},
                             {dx_mask, "dx_mask"}};
  if ((st = nt_conv2d_check_apart(ctx, outs, 3, ins, 5, "conv2d_nhwc_backward"))) return st;
  if (!dx && !dw && !db) return NT_OK;
  if (x->device.type == NT_DEV_CUDA) {
#ifdef NT_HAVE_CUDA
    return nt_conv2d_nhwc_backward_cuda(ctx, dy, relu_y, x, w, dx, dx_mask, dw, db, p);
#else
    return NT_ERROR(ctx, NT_ERR_NO_DEVICE, "conv2d_nhwc: CUDA tensor without the CUDA backend");
#endif
  }
  return backward_cpu(ctx, dy, relu_y, x, w, dx, dx_mask, dw, db, p, &d);
}
