// The per-token FP8 activation quantizer (see fp8_kernels.h, and fp8.h for
// the rule it computes).
//
// One warp per (row, group of 128 columns): lane l holds columns l, l + 32,
// l + 64 and l + 96 of the group (coalesced loads, 32 consecutive bytes per
// store), the warp's amax is a shuffle reduction (max is exact, so the order
// does not matter), and every lane converts its elements with the hardware
// e4m3 conversion (round to nearest even, saturated to +-448).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/fp8_kernels.h"

namespace basalt::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kPerLane = kFp8Group / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kE4m3Max = 448.0f;  // largest finite e4m3 (e4m3fn) value

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_groups_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scales,
                               int64_t rows, int64_t cols, int64_t groups) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t items = rows * groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // The loop bound is the same for every lane of a warp, so the full-mask
  // shuffles below always have all 32 lanes present.
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += stride) {
    const int64_t row = item / groups, group = item % groups;
    const int64_t begin = row * cols + group * kFp8Group;
    const int64_t width = cols - group * kFp8Group < kFp8Group ? cols - group * kFp8Group : kFp8Group;
    float v[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      v[i] = c < width ? to_f32(x[begin + c]) : 0.0f;
      amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, offset));
    // amax / 448 is never 0 here unless amax is 0 or so small that the
    // quotient underflows; 1 then (every element quantizes to +-0 or a tiny
    // value), so nothing ever divides by zero.
    float scale = amax / kE4m3Max;
    if (!(scale > 0.0f)) scale = 1.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < width) q[begin + c] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) scales[row * groups + group] = scale;
  }
}

}  // namespace

cudaError_t quantize_fp8_groups(const void* x, bool x_bf16, uint8_t* q, float* scales, int64_t rows, int64_t cols,
                                cudaStream_t stream) {
  const int64_t groups = (cols + kFp8Group - 1) / kFp8Group;
  const int64_t items = rows * groups;
  int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;  // the kernel strides over the rest
  const dim3 grid(static_cast<unsigned>(blocks));
  if (x_bf16)
    quantize_fp8_groups_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(x), q, scales, rows, cols,
                                                              groups);
  else
    quantize_fp8_groups_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), q, scales, rows, cols,
                                                              groups);
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
