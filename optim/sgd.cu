/* Fused SGD: the layout of adamw.cu (one launch per unit, one block per chunk, 4 elements per
 * thread, skip decided on the device) with the SGD rule. */
#include "optim/optim_common.h"
#include "optim/update_rules.h"
#include "optim/vec_access.cuh"
#include "core/cuda_util.h"
#include <type_traits>

namespace {

constexpr int kThreads = 256;

template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
sgd_kernel(const nt_optim_chunk *__restrict__ chunks, float *__restrict__ master,
           float *__restrict__ buf, const G *__restrict__ grad, P *__restrict__ lp,
           nt_sgd_hyper h, const nt_optim_record *__restrict__ rec, bool vec_ok) {
  if (rec->skip) return;
  const nt_optim_chunk c = chunks[blockIdx.x];
  const float neg_lr = rec->neg_lr[c.group];
  const float wd = rec->wd[c.group];
  const int first = rec->step == 1;
  const float clip = rec->clip_coef;
  const int64_t end = c.offset + c.length;
  const bool write_lp = !std::is_same<P, float>::value;
  for (int64_t i = c.offset + 4 * (int64_t)threadIdx.x; i < end; i += 4 * kThreads) {
    if (vec_ok && (i & 3) == 0 && i + 4 <= end) {
      float p[4], b[4] = {0, 0, 0, 0}, g[4];
      nt_vec::load4(master + i, p);
      if (buf) nt_vec::load4(buf + i, b);
      nt_vec::load4(grad + i, g);
#pragma unroll
      for (int e = 0; e < 4; e++)
        nt_sgd_update(&p[e], buf ? &b[e] : nullptr, g[e], clip, wd, neg_lr, first, &h);
      nt_vec::store4(master + i, p);
      if (buf) nt_vec::store4(buf + i, b);
      if (write_lp) nt_vec::store4(lp + i, p);
    } else {
      int64_t stop = i + 4 < end ? i + 4 : end;
      for (int64_t j = i; j < stop; j++) {
        float p = master[j], b = buf ? buf[j] : 0.0f;
        nt_sgd_update(&p, buf ? &b : nullptr, nt_to_f(grad[j]), clip, wd, neg_lr, first, &h);
        master[j] = p;
        if (buf) buf[j] = b;
        if (write_lp) lp[j] = nt_from_f<P>(p);
      }
    }
  }
}

template <typename G, typename P>
nt_status launch(nt_ctx *ctx, const nt_optim_chunk *chunks, int64_t n_chunks, float *master,
                 float *buf, const void *grad, void *lp, const nt_sgd_hyper *h, const nt_optim_record *rec) {
  const G *gp = static_cast<const G *>(grad);
  P *pp = std::is_same<P, float>::value ? nullptr : static_cast<P *>(lp);
  bool vec_ok = nt_vec::aligned4(master) && nt_vec::aligned4(buf) && nt_vec::aligned4(gp) &&
                nt_vec::aligned4(pp);
  if (n_chunks > 0x7fffffff)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "sgd: %lld chunks in one unit", (long long)n_chunks);
  sgd_kernel<G, P><<<(unsigned)n_chunks, kThreads, 0, nt_cuda_stream(ctx)>>>(
      chunks, master, buf, gp, pp, *h, rec, vec_ok);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename G>
nt_status launch_p(nt_ctx *ctx, nt_dtype pdt, const nt_optim_chunk *chunks, int64_t n_chunks,
                   float *master, float *buf, const void *grad, void *lp,
                   const nt_sgd_hyper *h, const nt_optim_record *rec) {
  switch (pdt) {
    case NT_F32: return launch<G, float>(ctx, chunks, n_chunks, master, buf, grad, lp, h, rec);
    case NT_F16: return launch<G, __half>(ctx, chunks, n_chunks, master, buf, grad, lp, h, rec);
    case NT_BF16:
      return launch<G, __nv_bfloat16>(ctx, chunks, n_chunks, master, buf, grad, lp, h, rec);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "sgd: params dtype %s", nt_dtype_name(pdt));
  }
}

}  // namespace

extern "C" nt_status nt_sgd_unit_cuda(nt_ctx *ctx, const nt_optim_chunk *chunks, int64_t n_chunks,
                                      float *master, float *buf, const void *grad, nt_dtype gdt,
                                      void *lp, nt_dtype pdt, const nt_sgd_hyper *h,
                                      const nt_optim_record *rec) {
  switch (gdt) {
    case NT_F32:
      return launch_p<float>(ctx, pdt, chunks, n_chunks, master, buf, grad, lp, h, rec);
    case NT_F16:
      return launch_p<__half>(ctx, pdt, chunks, n_chunks, master, buf, grad, lp, h, rec);
    case NT_BF16:
      return launch_p<__nv_bfloat16>(ctx, pdt, chunks, n_chunks, master, buf, grad, lp, h, rec);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "sgd: grads dtype %s", nt_dtype_name(gdt));
  }
}
