#include "backend/cuda/dequantized.h"

#include <memory>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_kernels.h"
#include "core/error.h"

namespace basalt {

CudaDequantizedWeights::CudaDequantizedWeights() {
  BASALT_CUDA_CHECK(cudaStreamCreateWithFlags(&setup_stream_, cudaStreamNonBlocking));
}

CudaDequantizedWeights::~CudaDequantizedWeights() {
  entries_.clear();
  if (setup_stream_ != nullptr) (void)cudaStreamDestroy(setup_stream_);
}

Tensor CudaDequantizedWeights::bf16(const LinearWeight& w, const char* op) {
  const Tensor& weight = w.weight;
  BASALT_CHECK(weight.device() == Device::kCuda && weight.rank() == 2 && weight.dtype() == DType::kF8E4M3 &&
                   weight.raw() != nullptr,
               "cuda {}: a block-FP8 weight must be a device f8_e4m3 [n, k] tensor, got {}", op, weight.describe());
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  const int64_t rb = (rows + kFp8BlockSize - 1) / kFp8BlockSize, cb = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  BASALT_CHECK(w.scale_inv.device() == Device::kCuda && w.scale_inv.dtype() == DType::kF32 &&
                   w.scale_inv.rank() == 2 && w.scale_inv.dim(0) == rb && w.scale_inv.dim(1) == cb,
               "cuda {}: a block-FP8 weight's scale_inv must be device f32 [{}, {}], got {}", op, rb, cb,
               w.scale_inv.describe());
  const auto key = std::make_tuple(weight.raw(), rows, cols);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.bf16;
  void* raw = nullptr;
  BASALT_CUDA_CHECK(cudaMalloc(&raw, static_cast<size_t>(rows * cols) * 2));
  std::shared_ptr<void> owner(raw, [](void* p) { (void)cudaFree(p); });
  const cudaError_t status = cuda_kernels::mla_dequant_fp8(static_cast<const uint8_t*>(weight.raw()),
                                                           w.scale_inv.data<const float>(), raw, rows, cols,
                                                           setup_stream_);
  BASALT_CHECK(status == cudaSuccess, "cuda {}: dequantizing a {}x{} FP8 weight failed: {}", op, rows, cols,
               cudaGetErrorString(status));
  BASALT_CUDA_CHECK(cudaStreamSynchronize(setup_stream_));
  Tensor out = Tensor::wrap(raw, {rows, cols}, DType::kBF16, std::move(owner), Device::kCuda);
  entries_.emplace(key, Entry{w, out});
  return out;
}

}  // namespace basalt
