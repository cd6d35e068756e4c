// Skinny linear layers (decode): out[m, :] = x[m, :] · wᵀ (+ bias) for a few
// rows m, reading f32 activations and 16-bit weights directly, so decode does
// not pay an activation cast and a GEMM sized for large M. Plain launcher
// interface (see elementwise_kernels.h for why).
//
// Contract: 1 <= m <= kGemvMaxRows, k a multiple of 8, weight rows 16-byte
// aligned; x f32 [m, k], w bf16 or f16 [n, k], bias f32 [n] or null, out f32
// [m, n]. f32 accumulation; each output is one warp's sum in a fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

inline constexpr int64_t kGemvMaxRows = 8;

cudaError_t gemv(Elem weight, const float* x, const void* w, const float* bias, float* out, int64_t m, int64_t n,
                 int64_t k, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
