// Argument checks shared by the CPU backend's DeepSeek ops (moe.cc, mla.cc).
#pragma once

#include "backend/backend.h"
#include "core/error.h"

namespace basalt::cpu {

inline void expect(const Tensor& t, const char* op, const char* name, DType dtype, int rank) {
  BASALT_CHECK(t.device() == Device::kCpu && t.dtype() == dtype && t.rank() == rank &&
                   (t.numel() == 0 || t.raw() != nullptr),
               "{}: {} must be a host {} tensor of rank {}, got {}", op, name, dtype_name(dtype),
               rank, t.describe());
}

inline void expect_shape(const Tensor& t, const char* op, const char* name, const Shape& shape) {
  BASALT_CHECK(t.shape() == shape, "{}: {} must have shape {}, got {}", op, name,
               shape_string(shape), t.describe());
}

inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// w is [n, k]: f32, bf16 or f16, or f8_e4m3 with scale_inv f32
// [ceil(n/128), ceil(k/128)].
inline void check_linear_weight(const LinearWeight& w, int64_t n, int64_t k, const char* op,
                                const char* name) {
  BASALT_CHECK(w.weight.device() == Device::kCpu && w.weight.rank() == 2 && w.weight.dim(0) == n &&
                   w.weight.dim(1) == k && w.weight.raw() != nullptr,
               "{}: {} must be a host weight [{}, {}], got {}", op, name, n, k,
               w.weight.describe());
  if (w.block_fp8()) {
    const int64_t bn = (n + kFp8BlockSize - 1) / kFp8BlockSize;
    const int64_t bk = (k + kFp8BlockSize - 1) / kFp8BlockSize;
    BASALT_CHECK(w.weight.dtype() == DType::kF8E4M3, "{}: {} has block scales but is {}", op, name,
                 w.weight.describe());
    BASALT_CHECK(w.scale_inv.device() == Device::kCpu && w.scale_inv.dtype() == DType::kF32 &&
                     w.scale_inv.shape() == Shape({bn, bk}),
                 "{}: {} scale_inv must be f32 [{}, {}], got {}", op, name, bn, bk,
                 w.scale_inv.describe());
  } else {
    BASALT_CHECK(w.weight.dtype() == DType::kF32 || w.weight.dtype() == DType::kBF16 ||
                     w.weight.dtype() == DType::kF16 || w.weight.dtype() == DType::kF8E4M3,
                 "{}: {} must be f32, bf16, f16 or f8_e4m3, got {}", op, name, w.weight.describe());
  }
}

}  // namespace basalt::cpu
