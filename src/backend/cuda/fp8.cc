#include "backend/cuda/fp8.h"

#include "backend/backend.h"
#include "backend/cuda/fp8_kernels.h"
#include "core/error.h"

namespace basalt {

static_assert(cuda_kernels::kFp8Group == kFp8BlockSize, "the quantizer's group is the FP8 block edge");

namespace {

void quantize(const Tensor& x, Tensor& q, Tensor& scales, bool groups_outer, cudaStream_t stream) {
  BASALT_CHECK(x.device() == Device::kCuda && q.device() == Device::kCuda && scales.device() == Device::kCuda,
               "cuda quantize_fp8_groups: tensors must be on the device, got x {}, q {}, scales {}", x.describe(),
               q.describe(), scales.describe());
  BASALT_CHECK(x.rank() == 2 && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16),
               "cuda quantize_fp8_groups: x must be f32 or bf16 [T, K], got {}", x.describe());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const int64_t groups = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  BASALT_CHECK(q.dtype() == DType::kF8E4M3 && q.shape() == x.shape(),
               "cuda quantize_fp8_groups: q must be f8_e4m3 [{}, {}], got {}", rows, cols, q.describe());
  const Shape scale_shape = groups_outer ? Shape({groups, rows}) : Shape({rows, groups});
  BASALT_CHECK(scales.dtype() == DType::kF32 && scales.shape() == scale_shape,
               "cuda quantize_fp8_groups: scales must be f32 [{}, {}], got {}", scale_shape[0], scale_shape[1],
               scales.describe());
  if (rows == 0 || cols == 0) return;
  const cudaError_t status =
      cuda_kernels::quantize_fp8_groups(x.raw(), x.dtype() == DType::kBF16, static_cast<uint8_t*>(q.raw()),
                                        scales.data<float>(), rows, cols, stream, groups_outer);
  BASALT_CHECK(status == cudaSuccess, "cuda quantize_fp8_groups: launch failed: {}", cudaGetErrorString(status));
}

}  // namespace

void cuda_quantize_fp8_groups(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream) {
  quantize(x, q, scales, false, stream);
}

void cuda_quantize_fp8_groups_outer(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream) {
  quantize(x, q, scales, true, stream);
}

}  // namespace basalt
