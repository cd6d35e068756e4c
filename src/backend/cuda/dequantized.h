// Block-FP8 weights dequantized once to bf16 on the device, kept per weight.
// The MLA ops use it for kv_b (as SGLang keeps bf16 w_kc / w_vc), and the
// CUDA backend for every FP8 weight when FP8 is computed weight-only
// (Fp8Compute::kW8A16).
//
// Contract:
//  * bf16(w, op): w is a device block-FP8 LinearWeight (f8_e4m3 [n, k] with
//    f32 scale_inv [ceil(n / 128), ceil(k / 128)]; anything else throws
//    basalt::Error naming `op`); returns a device bf16 [n, k] tensor with
//    weight * scale_inv[r / 128, c / 128] rounded to nearest even, the same
//    tensor for every call with the same weight.
//  * Entries are keyed by the weight's device pointer and shape and hold the
//    FP8 weight and its scales, so their memory (and so the key) cannot be
//    handed to another weight while the entry lives. A model's weights live
//    as long as the backend anyway; the bf16 copies (2 bytes a weight) are
//    freed with this object.
//  * The dequantization runs on a private stream that is synchronised before
//    bf16() returns, so a first use inside a graph capture on another stream
//    works and is never recorded. Not thread-safe (one per backend).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

class CudaDequantizedWeights {
 public:
  CudaDequantizedWeights();
  ~CudaDequantizedWeights();
  CudaDequantizedWeights(const CudaDequantizedWeights&) = delete;
  CudaDequantizedWeights& operator=(const CudaDequantizedWeights&) = delete;

  Tensor bf16(const LinearWeight& w, const char* op);

 private:
  struct Entry {
    LinearWeight source;  // keeps the FP8 weight's memory (and so the key) unique
    Tensor bf16;
  };
  cudaStream_t setup_stream_ = nullptr;
  std::map<std::tuple<const void*, int64_t, int64_t>, Entry> entries_;
};

}  // namespace basalt
