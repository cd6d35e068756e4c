// Dense linear layers on the GPU through cuBLASLt: out = x · wᵀ (+ bias),
// with weights in the Hugging Face layout [out_features, in_features].
//
// Contract:
//  * x [M, K] and w [N, K] share a dtype (f32, bf16 or f16); out [M, N] has
//    that dtype or f32; bias (optional) [N] has out's dtype and is fused
//    into the GEMM's epilogue. Every tensor is on the device. Shapes, dtypes
//    and placement are checked on the host; a mismatch throws basalt::Error.
//  * Accumulation is f32 (CUBLAS_COMPUTE_32F, no TF32 for f32 inputs), so
//    a bf16 result is the f32 sum rounded once.
//  * The algorithm for each (dtype, M, N, K, bias) is chosen once by
//    cuBLASLt's heuristic under a 32 MiB workspace and cached.
//  * A CublasLt object owns its handle and workspace; it is not thread-safe
//    (one per stream, used by the thread that drives that stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace basalt {

class CublasLt {
 public:
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream = nullptr);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Decode-sized linear on the tensor cores (gemv_kernels.h): x [m, k] with
// 1 <= m <= 16, f32 or w's dtype; w bf16 or f16 [n, k]; bias f32 [n] or
// null; out [m, n] f32 or w's dtype. Streams the weights once, with no
// activation cast and no workspace. skinny_linear_fits says whether the
// tensors qualify (k a multiple of 32, 16-byte aligned rows).
bool skinny_linear_fits(const Tensor& x, const Tensor& w);
// `variant` forces a kernel configuration (gemv_kernels.h; benchmarks only).
void skinny_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream = nullptr,
                   int variant = 0);

// The batch-invariant linear (CudaBackend's batch-invariant mode): the same
// tensors as skinny_linear but any number of rows, each row computed with
// the tensor-core GEMV's arithmetic whatever the call's size, so a row gives
// the same bits alone, in a verification step or in a batch
// (gemv_kernels.h, kGemvRowInvariant).
bool row_invariant_linear_fits(const Tensor& x, const Tensor& w);
void row_invariant_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                          cudaStream_t stream = nullptr);

}  // namespace basalt
