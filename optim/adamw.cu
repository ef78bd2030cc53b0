/* Fused Adam/AdamW: one launch per unit, one block per chunk (optim_common.h). Each thread
 * updates 4 consecutive elements with 16-byte accesses where aligned; the step record decides
 * on the device whether the step is skipped. The F16/BF16 compute copy is written from the new
 * master weights in the same pass. */
#include "optim/optim_common.h"
#include "optim/update_rules.h"
#include "optim/vec_access.cuh"
#include "core/cuda_util.h"
#include <type_traits>

namespace {

constexpr int kThreads = 256;

/* P = float: the compute copy is the master itself (nothing extra to write). */
template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
adamw_kernel(const nt_optim_chunk *__restrict__ chunks, float *__restrict__ master,
             float *__restrict__ m, float *__restrict__ v, const G *__restrict__ grad,
             P *__restrict__ lp, nt_adam_hyper h, const nt_optim_record *__restrict__ rec,
             bool vec_ok) {
  if (rec->skip) return;
  const nt_optim_chunk c = chunks[blockIdx.x];
  const nt_adam_coefs k = nt_adam_coefs_make(rec, c.group);
  const float clip = rec->clip_coef;
  const int64_t end = c.offset + c.length;
  const bool write_lp = !std::is_same<P, float>::value;
  for (int64_t i = c.offset + 4 * (int64_t)threadIdx.x; i < end; i += 4 * kThreads) {
    if (vec_ok && (i & 3) == 0 && i + 4 <= end) {
      float p[4], mm[4], vv[4], g[4];
      nt_vec::load4(master + i, p);
      nt_vec::load4(m + i, mm);
      nt_vec::load4(v + i, vv);
      nt_vec::load4(grad + i, g);
#pragma unroll
      for (int e = 0; e < 4; e++) nt_adam_update(&p[e], &mm[e], &vv[e], g[e], clip, &h, &k);
      nt_vec::store4(master + i, p);
      nt_vec::store4(m + i, mm);
      nt_vec::store4(v + i, vv);
      if (write_lp) nt_vec::store4(lp + i, p);
    } else {
      int64_t stop = i + 4 < end ? i + 4 : end;
      for (int64_t j = i; j < stop; j++) {
        float p = master[j], mm = m[j], vv = v[j];
        nt_adam_update(&p, &mm, &vv, nt_to_f(grad[j]), clip, &h, &k);
        master[j] = p;
        m[j] = mm;
        v[j] = vv;
        if (write_lp) lp[j] = nt_from_f<P>(p);
      }
    }
  }
}

template <typename G, typename P>
nt_status launch(nt_ctx *ctx, const nt_optim_chunk *chunks, int64_t n_chunks, float *master,
                 float *m, float *v, const void *grad, void *lp, const nt_adam_hyper *h, const nt_optim_record *rec) {
  const G *gp = static_cast<const G *>(grad);
  P *pp = std::is_same<P, float>::value ? nullptr : static_cast<P *>(lp);
  bool vec_ok = nt_vec::aligned4(master) && nt_vec::aligned4(m) && nt_vec::aligned4(v) &&
                nt_vec::aligned4(gp) && nt_vec::aligned4(pp);
  if (n_chunks > 0x7fffffff)
    return NT_ERROR(ctx, NT_ERR_UNSUPPORTED, "adamw: %lld chunks in one unit", (long long)n_chunks);
  adamw_kernel<G, P><<<(unsigned)n_chunks, kThreads, 0, nt_cuda_stream(ctx)>>>(
      chunks, master, m, v, gp, pp, *h, rec, vec_ok);
  return NT_CUDA_LAUNCHED(ctx);
}

template <typename G>
nt_status launch_p(nt_ctx *ctx, nt_dtype pdt, const nt_optim_chunk *chunks, int64_t n_chunks,
                   float *master, float *m, float *v, const void *grad, void *lp,
                   const nt_adam_hyper *h, const nt_optim_record *rec) {
  switch (pdt) {
    case NT_F32: return launch<G, float>(ctx, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    case NT_F16: return launch<G, __half>(ctx, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    case NT_BF16:
      return launch<G, __nv_bfloat16>(ctx, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "adamw: params dtype %s", nt_dtype_name(pdt));
  }
}

}  // namespace

extern "C" nt_status nt_adamw_unit_cuda(nt_ctx *ctx, const nt_optim_chunk *chunks,
                                        int64_t n_chunks, float *master, float *m, float *v,
                                        const void *grad, nt_dtype gdt, void *lp, nt_dtype pdt,
                                        const nt_adam_hyper *h, const nt_optim_record *rec) {
  switch (gdt) {
    case NT_F32:
      return launch_p<float>(ctx, pdt, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    case NT_F16:
      return launch_p<__half>(ctx, pdt, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    case NT_BF16:
      return launch_p<__nv_bfloat16>(ctx, pdt, chunks, n_chunks, master, m, v, grad, lp, h, rec);
    default: return NT_ERROR(ctx, NT_ERR_DTYPE, "adamw: grads dtype %s", nt_dtype_name(gdt));
  }
}
