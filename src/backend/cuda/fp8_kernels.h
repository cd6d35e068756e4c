// Launcher of the per-token FP8 activation quantizer (fp8_kernels.cu), with a
// plain interface (raw device pointers and sizes) so that the .cu file needs
// no host-library headers. fp8.h is the checked API on top; call that instead.
//
// Contract: quantize_fp8_groups enqueues one kernel on `stream` and returns
// cudaGetLastError(). x is f32 (x_bf16 false) or bf16 [rows, cols]; q is
// e4m3 bytes [rows, cols]; scales f32 [rows, ceil(cols / 128)]. Sizes are
// trusted: the caller has checked shapes, dtypes and placement; rows and cols
// are positive. The rule itself is stated in fp8.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace basalt::cuda_kernels {

// Elements per quantization group (kFp8BlockSize of backend.h).
inline constexpr int kFp8Group = 128;

cudaError_t quantize_fp8_groups(const void* x, bool x_bf16, uint8_t* q, float* scales, int64_t rows, int64_t cols,
                                cudaStream_t stream);

}  // namespace basalt::cuda_kernels
