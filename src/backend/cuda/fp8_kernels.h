// Launchers of the block-FP8 kernels (fp8_kernels.cu): the per-token FP8
// activation quantizer and the weight-streaming block-FP8 linear, with a
// plain interface (raw device pointers and sizes) so that the .cu file needs
// no host-library headers. fp8.h and fp8_linear.h are the checked APIs on
// top; call those instead.
//
// Contract:
//  * quantize_fp8_groups enqueues one kernel on `stream` and returns
//    cudaGetLastError(). x is f32 (x_bf16 false) or bf16 [rows, cols]; q is
//    e4m3 bytes [rows, cols]; the scale of (row r, group g) goes to
//    scales[r * groups + g] (token-major, [rows, ceil(cols / 128)]), or to
//    scales[g * rows + r] with groups_outer ([ceil(cols / 128), rows], the
//    layout cuBLASLt's VEC128 scales and linear_fp8_stream read). Sizes are
//    trusted: the caller has checked shapes, dtypes and placement; rows and
//    cols are positive. The rule itself is stated in fp8.h. The kernel is a
//    programmatic dependent launch (element_types.cuh): it waits for the
//    kernels before it, then lets its successor start.
//  * linear_fp8_stream: out[t, n] = sum over 128-column blocks b of
//    (sum_{k in b} e4m3(q[t, k]) * e4m3(w[n, k])) * act_scales[b * rows + t]
//    * w_scales[(n / 128) * ceil(cols / 128) + b], f32 accumulation; out f32
//    (out_bf16 false) or bf16 [rows, n_out]. q e4m3 [rows, cols]; w e4m3
//    [n_out, cols]; act_scales f32 [ceil(cols / 128), rows]; w_scales f32
//    [ceil(n_out / 128), ceil(cols / 128)]. The products of two e4m3 values
//    are exact in f32; each block's sum is accumulated on the tensor cores
//    (mma.sync m16n8k32 e4m3, f32) and scaled once. Every size >= 1 works;
//    cols a multiple of 16 with q and w 16-byte aligned takes the vector
//    loads. Weights stream once per 16 tokens (one pass for decode). A
//    programmatic dependent launch: weights are requested before waiting for
//    the kernels before it. `variant` forces a pipeline depth (benchmarks):
//    1: 2 blocks of 128 columns in flight per warp, 2: 4; 0 picks by shape
//    (fp8_kernels.cu says how, from measurements). Every depth computes the
//    same sums in the same order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace basalt::cuda_kernels {

// Elements per quantization group (kFp8BlockSize of backend.h).
inline constexpr int kFp8Group = 128;

cudaError_t quantize_fp8_groups(const void* x, bool x_bf16, uint8_t* q, float* scales, int64_t rows, int64_t cols,
                                cudaStream_t stream, bool groups_outer = false);

inline constexpr int kFp8StreamVariants = 2;
cudaError_t linear_fp8_stream(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales,
                              void* out, bool out_bf16, int64_t rows, int64_t n_out, int64_t cols, cudaStream_t stream,
                              int variant = 0);

}  // namespace basalt::cuda_kernels
