#include "backend/cuda/gemv_kernels.h"

#include "backend/cuda/element_types.cuh"

namespace basalt::cuda_kernels {
namespace {

constexpr int kWarps = 8;

// Eight 16-bit weights from one 16-byte load, widened to f32.
__device__ __forceinline__ void widen(const uint4& raw, bf16, float* out) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void widen(const uint4& raw, __half, float* out) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// One warp per output column n: lanes stride over k in groups of 8, each
// group one 16-byte weight load; M accumulators per lane, reduced by shuffles.
template <typename W, int M>
__global__ void gemv_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ out, int64_t n, int64_t k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (col >= n) return;
  const uint4* row = reinterpret_cast<const uint4*>(w + col * k);
  const int64_t groups = k / 8;
  float acc[M];
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int64_t g = lane; g < groups; g += 32) {
    const uint4 raw = __ldg(row + g);
    float wf[8];
    widen(raw, W{}, wf);
    for (int m = 0; m < M; ++m) {
      const float4* xs = reinterpret_cast<const float4*>(x + m * k + g * 8);
      const float4 a = __ldg(xs), b = __ldg(xs + 1);
      acc[m] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z +
                wf[7] * b.w;
    }
  }
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) out[m * n + col] = v + (bias ? bias[col] : 0.0f);
  }
}

template <typename W>
cudaError_t launch(const float* x, const W* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  switch (m) {
#define BASALT_GEMV_CASE(M) \
  case M:                   \
    gemv_kernel<W, M><<<blocks, kWarps * 32, 0, stream>>>(x, w, bias, out, n, k); \
    break;
    BASALT_GEMV_CASE(1)
    BASALT_GEMV_CASE(2)
    BASALT_GEMV_CASE(3)
    BASALT_GEMV_CASE(4)
    BASALT_GEMV_CASE(5)
    BASALT_GEMV_CASE(6)
    BASALT_GEMV_CASE(7)
    BASALT_GEMV_CASE(8)
#undef BASALT_GEMV_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemv(Elem weight, const float* x, const void* w, const float* bias, float* out, int64_t m, int64_t n,
                 int64_t k, cudaStream_t stream) {
  if (weight == Elem::kBF16) return launch(x, static_cast<const bf16*>(w), bias, out, m, n, k, stream);
  if (weight == Elem::kF16) return launch(x, static_cast<const __half*>(w), bias, out, m, n, k, stream);
  return cudaErrorInvalidValue;
}

}  // namespace basalt::cuda_kernels
