// The CPU backend's own check of the MoE experts it runs (moe.cc): Backend
// checks expert 0 of a moe_experts call; each expert a call routes tokens to
// is checked here before its weights are read.
#pragma once

#include "backend/backend.h"
#include "core/error.h"

namespace basalt::cpu {

// w is [n, k]: f32, bf16 or f16, or f8_e4m3 with scale_inv f32
// [ceil(n/128), ceil(k/128)], or an integer format (core/int_weights.h).
inline void check_linear_weight(const LinearWeight& w, int64_t n, int64_t k, const char* op,
                                const char* name) {
  if (w.int_quantized()) {
    const IntWeightLayout& l = w.int_layout;
    const std::string error = int_layout_error(l);
    BASALT_CHECK(error.empty() && l.in_features == k, "{}: {}: {} (in_features {}, expected {})", op, name, error,
                 l.in_features, k);
    BASALT_CHECK(w.weight.device() == Device::kCpu && w.weight.dtype() == (l.bits == 8 ? DType::kI8 : DType::kU8) &&
                     w.weight.shape() == Shape({n, l.code_columns()}) && w.weight.raw() != nullptr,
                 "{}: {} codes must be a host {} [{}, {}], got {}", op, name, l.bits == 8 ? "i8" : "u8", n,
                 l.code_columns(), w.weight.describe());
    BASALT_CHECK(w.scales.device() == Device::kCpu && w.scales.dtype() == DType::kF16 &&
                     w.scales.shape() == Shape({n, l.scale_columns()}) && w.scales.raw() != nullptr,
                 "{}: {} scales must be a host f16 [{}, {}], got {}", op, name, n, l.scale_columns(),
                 w.scales.describe());
    return;
  }
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
