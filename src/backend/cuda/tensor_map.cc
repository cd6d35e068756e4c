#include "backend/cuda/tensor_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace basalt {
namespace {

static_assert(sizeof(TmaDescriptor) == sizeof(CUtensorMap) && alignof(TmaDescriptor) == alignof(CUtensorMap),
              "TmaDescriptor stands for CUtensorMap");

PFN_cuTensorMapEncodeTiled_v12000 encoder(std::string& error) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::string lookup_error = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                           &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      return fmt::format("the driver has no cuTensorMapEncodeTiled ({})", cudaGetErrorString(e));
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    return std::string();
  }();
  error = lookup_error;
  return fn;
}

}  // namespace

std::string encode_rows_u8(TmaDescriptor& out, const void* base, uint64_t rows, uint64_t row_bytes,
                           uint32_t box_rows, uint32_t box_bytes) {
  std::string error;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder(error);
  if (!encode) return error;
  const cuuint64_t dims[2] = {row_bytes, rows};
  const cuuint64_t strides[1] = {row_bytes};  // bytes from one row to the next
  const cuuint32_t box[2] = {box_bytes, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&out), CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
                            const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fmt::format("cuTensorMapEncodeTiled refused {} rows of {} bytes at {} (box {} x {}): error {}", rows,
                       row_bytes, fmt::ptr(base), box_rows, box_bytes, static_cast<int>(r));
  return std::string();
}

}  // namespace basalt
