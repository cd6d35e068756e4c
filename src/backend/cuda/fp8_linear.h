// The block-FP8 linear layer on the GPU (DeepSeek-V3's weights), computed
// as DeepSeek-V3's own inference does it: the activations are quantized per
// token in 1x128 groups (fp8.h), then multiplied in FP8 with f32
// accumulation, each 128-column block's partial sums scaled once by the
// token's group scale times the weight block's scale_inv.
//
// Contract:
//  * x f32 or bf16 [T, K]; w f8_e4m3 [N, K] (the Hugging Face layout);
//    scale_inv f32 [ceil(N / 128), ceil(K / 128)] (partial last blocks
//    allowed); out f32 or bf16 [T, N]; all on the device, contiguous.
//    Shapes, dtypes and placement are checked on the host; a mismatch throws
//    basalt::Error before anything is launched.
//  * out[t, n] = sum over 128-column blocks b of
//      (sum_{k in b} q[t, k] * w[n, k]) * act_scale[t, b] * scale_inv[n / 128, b]
//    where q, act_scale = the quantizer of fp8.h applied to x. The products
//    of two e4m3 values are exact; the sums are f32 (in an order that
//    depends on the path); a bf16 out is the f32 result rounded once.
//    Against the unquantized product x · dequant(w)ᵀ the quantization of x
//    alone costs up to 2^-4 of |x[t, k]| per element (half an e4m3 ulp), so
//    |out - exact| <= 2^-4 * sum_k |x[t, k]| |w_deq[n, k]|, and about 2^-4 /
//    sqrt(3 K') of it in a typical row (rounding errors of random sign).
//  * Three paths, the same arithmetic:
//    - streaming (decode): our kernel (fp8_kernels.h) reads each weight byte
//      once per 16 tokens, on the tensor cores (mma.sync e4m3); any shape;
//    - cuBLASLt (prefill): block-scaled FP8 (VEC128 scales for the
//      activations, BLK128x128 for the weights; sm_90, TN, f32 compute).
//      cuBLASLt takes T and N multiples of 4, K a multiple of 16, 16-byte
//      aligned w and out, and whatever else its heuristic accepts (asked
//      once per shape and cached); the weight scales go to it as they are
//      when ceil(K / 128) is a multiple of 4, through a padded copy on the
//      stream otherwise.
//    - wgmma (prefill, Hopper): our TMA-fed warp-specialized kernel
//      (moe_gemm_kernels.h: dense_fp8_gemm_tma, the routed experts' GEMM run
//      on one matrix, in clusters of two CTAs), with row-major activation
//      scales; sm_90a, f32 out, K a multiple of 16 and a 16-byte aligned w.
//    kAuto takes the streaming kernel up to kFp8StreamingMaxRows tokens and
//    cuBLASLt above, where it takes the shape (the streaming kernel
//    otherwise). Not the wgmma kernel: at DeepSeek-V3's six shapes it is
//    slower than cuBLASLt on five at 1K and 4K tokens (bench/README.md,
//    basalt_bench_cuda_fp8_gemm). kStreaming, kCublas and kWgmma force a
//    path (tests, benchmarks; kCublas and kWgmma throw where they do not
//    take the shape).
//  * Scratch (the quantized activations and their scales, a padded weight
//    scale copy) comes from cuda_empty, so the op records into CUDA graphs
//    (device.h's graph pool); nothing waits for the device. The quantizer
//    and the streaming kernel are programmatic dependent launches.
//  * A CudaFp8Linear owns a cuBLASLt handle and a 32 MiB workspace; it is
//    not thread-safe (one per stream, like CublasLt of gemm.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace basalt {

enum class Fp8LinearPath { kAuto, kStreaming, kCublas, kWgmma };

// Up to this many tokens kAuto streams the weights with our kernel; above
// it, cuBLASLt where it takes the shape (bench/cuda_fp8_gemm_bench.cc and
// the comment at its use in fp8_linear.cc say why 16, and what is left to
// measure).
inline constexpr int64_t kFp8StreamingMaxRows = 8;

class CudaFp8Linear {
 public:
  CudaFp8Linear();
  ~CudaFp8Linear();
  CudaFp8Linear(const CudaFp8Linear&) = delete;
  CudaFp8Linear& operator=(const CudaFp8Linear&) = delete;

  // `variant` forces the streaming kernel's pipeline depth (fp8_kernels.h),
  // or the wgmma kernel's CTAs a cluster (1: one; 0 and 2: two); benchmarks
  // and tests only.
  void linear(const Tensor& x, const Tensor& w, const Tensor& scale_inv, Tensor& out, cudaStream_t stream = nullptr,
              Fp8LinearPath path = Fp8LinearPath::kAuto, int variant = 0);
  // Whether cuBLASLt takes a [T, K] x [N, K]ᵀ product into `out_dtype`
  // (f32 or bf16) with these pointers' alignment; asks its heuristic once
  // per shape.
  bool cublas_takes(int64_t T, int64_t N, int64_t K, DType out_dtype, const void* w, const void* out);
  // Whether the wgmma kernel takes it (the device and the operands' layout).
  static bool wgmma_takes(int64_t T, int64_t N, int64_t K, DType out_dtype, const void* w);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace basalt
