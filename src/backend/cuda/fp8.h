// Per-token FP8 quantization of activations for the block-FP8 linear
// (DeepSeek-V3): each row of x is cut into groups of kFp8BlockSize (128)
// columns, the last one partial when K is not a multiple of 128, and every
// group gets its own scale.
//
// Contract:
//  * x f32 or bf16 [T, K]; q f8_e4m3 [T, K]; scales f32 [T, ceil(K / 128)];
//    all on the device (Device::kCuda). Shapes, dtypes and placement are
//    checked on the host and a mismatch throws basalt::Error before anything
//    is launched. T = 0 or K = 0 launches nothing.
//  * For the group of row t, columns [128 g, min(128 g + 128, K)):
//      amax = max |x| over the group (in f32; bf16 widens exactly),
//      scale = amax / 448 (an f32 division; 448 is e4m3's largest finite
//              value), or 1 where that quotient is not > 0 (an all-zero
//              group, or amax so small that amax / 448 underflows), so no
//              division is ever by zero,
//      q = e4m3(x / scale): the f32 quotient rounded to nearest even and
//          saturated to +-448 (__nv_cvt_float_to_fp8 with __NV_SATFINITE).
//    Dequantized, fp8e4m3_to_f32(q) * scale; the largest element of a
//    non-zero group maps to +-448, and |x - dequantized| <= max(|x| * 2^-4,
//    scale * 2^-10) up to f32 rounding of the division (half an e4m3 ulp).
//    This is the rule of model/quantize.h for weights, applied to 1x128
//    groups, except the underflow case (there quantize.h would divide by 0).
//  * x must be finite: a NaN is skipped by the amax (fmaxf) and converts to
//    e4m3 NaN; an infinity makes its group's scale infinite. Neither throws.
//  * Enqueued on `stream` (the default stream when null); nothing waits.
//  * cuda_quantize_fp8_groups_outer is the same rule with the scales laid
//    out group-major, f32 [ceil(K / 128), T] (scale of row t, group g at
//    g * T + t): the layout of cuBLASLt's VEC128 scales and of the block-FP8
//    linear's streaming kernel (fp8_linear.h).
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace basalt {

void cuda_quantize_fp8_groups(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream = nullptr);
void cuda_quantize_fp8_groups_outer(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream = nullptr);

}  // namespace basalt
