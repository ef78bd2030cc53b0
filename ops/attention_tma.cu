/* Tensor maps for the wgmma attention kernels (attention_tma.cuh). The encoder is a driver
 * function; the runtime hands out its entry point, so the library links no libcuda. */
#include <stdint.h>
#include <cudaTypedefs.h>
#include "ops/attention_tma.cuh"

namespace {

/* cuTensorMapEncodeTiled from the driver, found once (NULL where it is missing). */
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

bool nt_attn_map_view(nt_attn_map *map, const nt_attn_view &v, bool bf16, int B, int H, int T,
                      int rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode || T < rows) return false;
  const long long stride[3] = {v.st, v.sh, v.sb}, dim[3] = {T, H, B};   /* t, h, b */
  int order[3] = {0, 1, 2};
  for (int i = 1; i < 3; i++)
    for (int j = i; j > 0 && stride[order[j]] < stride[order[j - 1]]; j--) {
      const int x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  cuuint64_t gdim[4] = {64u, 0, 0, 0}, gstride[3];
  cuuint32_t box[4] = {64u, 1, 1, 1}, estride[4] = {1, 1, 1, 1};
  for (int i = 0; i < 3; i++) {
    const int d = order[i];
    if (stride[d] <= 0) return false;
    gdim[i + 1] = (cuuint64_t)dim[d];
    gstride[i] = (cuuint64_t)stride[d] * 2u;
    if (d == 0) box[i + 1] = (cuuint32_t)rows;
    map->pos[d] = i + 1;
  }
  return encode(&map->m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                4, v.p, gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool nt_attn_map_rows(CUtensorMap *map, const float *p, int BH, int T, int rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode || T < rows || T % 4 || ((uintptr_t)p & 15)) return false;
  cuuint64_t gdim[2] = {(cuuint64_t)T, (cuuint64_t)BH}, gstride[1] = {(cuuint64_t)T * 4u};
  cuuint32_t box[2] = {(cuuint32_t)rows, 1}, estride[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float *>(p), gdim, gstride,
                box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
