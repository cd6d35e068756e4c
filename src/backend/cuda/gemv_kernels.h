// Small-M linear layers (decode): out[m, :] = x[m, :] · wᵀ (+ bias) for up to
// 16 rows m, with the weights streamed once from memory: one warp per weight
// row (a warp owning 1, 2 or 4 rows) for m <= kGemvDefaultRowExactRows, the
// tensor cores (mma.sync) above (see gemv_kernels.cu for both schemes).
// Launched as programmatic dependent launches: a GEMV's blocks may start
// streaming weights while the kernel before it finishes, and wait for it
// before reading x. Plain launcher interface (see elementwise_kernels.h for
// why).
//
// Contract: 1 <= m <= kGemvMaxRows (any m for kGemvRowInvariant); k a
// multiple of 32; x and w rows 16-byte aligned; w bf16 or f16 [n, k]; x f32
// or w's dtype [m, k] (f32 rows are rounded to w's dtype as they are read);
// bias f32 [n] or null; out f32 or w's dtype [m, n]. f32 accumulation in a
// fixed order; a row's result does not depend on the other rows within one
// kernel configuration, and the default's rows are what one-row calls give
// up to kGemvDefaultRowExactRows rows (it changes configuration above).
// Anything else returns cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

inline constexpr int64_t kGemvMaxRows = 16;
inline constexpr int64_t kRowKernelMaxRows = 8;

// variant: kGemvDefault picks by m; 1..3 force a tensor-core configuration
// (1: 8 warps x 4 chunks in flight, 2: 4 x 8, 3: 8 x 2); kGemvRowKernel the
// warp-per-row kernel with its rows per warp picked by m, and
// kGemvRowKernel1/2/4 with 1, 2 or 4 weight rows per warp (all four only for
// m <= kRowKernelMaxRows; otherwise configuration 1). For benchmarks and
// tests. Every row of the warp-per-row kernel is what a one-row call
// computes, whatever its rows per warp.
// kGemvRowInvariant takes any m >= 1 (not only up to kGemvMaxRows) and
// computes every row with configuration 1's arithmetic, tokens in blocks of
// 32: a row's bits do not depend on m or on the other rows (the CUDA
// backend's batch-invariant mode, cuda_backend.h). Up to 96 rows it runs
// configuration 1 itself in blocks of 32 tokens; above, a tiled kernel with
// the same per-element arithmetic (64 x 64 tiles through shared memory), well
// short of cuBLASLt at prefill sizes (bench/README, "Batch-invariant mode").
inline constexpr int kGemvDefault = 0;
inline constexpr int kGemvRowKernel = 4;
inline constexpr int kGemvRowInvariant = 5;
inline constexpr int kGemvRowKernel1 = 6;
inline constexpr int kGemvRowKernel2 = 7;
inline constexpr int kGemvRowKernel4 = 8;
// The default takes the warp-per-row kernel up to this many rows, so its
// rows are what one-row calls give (a speculative verification of up to
// this many rows computes what the decode steps it stands for would).
inline constexpr int64_t kGemvDefaultRowExactRows = 5;
cudaError_t gemv(Elem x_type, Elem w_type, Elem out_type, const void* x, const void* w, const float* bias, void* out,
                 int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant = kGemvDefault);

}  // namespace basalt::cuda_kernels
