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
//  * The algorithm for each (dtype, M, N, K, bias) is chosen once, at the
//    shape's first call, and cached. cuBLASLt's heuristic proposes up to 8
//    under a 32 MiB workspace; for calls of up to 256 rows (decode steps,
//    where its first choice measured up to 11 % slower than another of its
//    candidates on the H100, bench/README) each is timed on that first
//    call's own tensors, from HBM, and the fastest kept (set_tuning(false):
//    the heuristic's first). The first
//    call of a tuned shape takes milliseconds more, and its output is the
//    last run's; calls during a stream capture take the heuristic's first.
//    Different algorithms sum in different orders, so a tuned plan can
//    round otherwise than the untuned one (within f32 accumulation).
//  * A CublasLt object owns its handle and workspace; it is not thread-safe
//    (one per stream, used by the thread that drives that stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace basalt {

struct GemmTuningStats {
  int tuned = 0;         // plans chosen by timing
  double seconds = 0.0;  // host time those choices took
};

class CublasLt {
 public:
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream = nullptr);

  // Timing the heuristic's candidates for decode-sized calls (on by
  // default); affects plans made after the call.
  void set_tuning(bool on);
  GemmTuningStats tuning_stats() const;

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
