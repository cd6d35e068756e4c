// Small-M linear layers (decode): out[m, :] = x[m, :] · wᵀ (+ bias) for up to
// 16 rows m, on the tensor cores with the weights streamed once from memory
// (see gemv_kernels.cu for the scheme). Plain launcher interface (see
// elementwise_kernels.h for why).
//
// Contract: 1 <= m <= kGemvMaxRows; k a multiple of 32; x and w rows 16-byte
// aligned; w bf16 or f16 [n, k]; x f32 or w's dtype [m, k] (f32 rows are
// rounded to w's dtype as they are read); bias f32 [n] or null; out f32 or
// w's dtype [m, n]. f32 accumulation in a fixed order (a row's result does
// not depend on the other rows). Anything else returns cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

inline constexpr int64_t kGemvMaxRows = 16;

cudaError_t gemv(Elem x_type, Elem w_type, Elem out_type, const void* x, const void* w, const float* bias, void* out,
                 int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
