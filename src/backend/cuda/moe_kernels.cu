// MoE routing on the device (see moe_kernels.h, and Backend::moe_route in
// backend.h for what it computes).
//
// One warp per token; lane l holds experts l, l + 32, ..., l + 224 in
// registers. The kernel repeats the CPU backend's f32 arithmetic operation
// for operation, so its ids and weights equal the CPU backend's wherever the
// scores do:
//  * sigmoid: 1 / (1 + e), e = exp(-x) taken in double and rounded to f32
//    (the CPU takes std::exp in f32: the two agree but for rare last-bit
//    differences of the host's expf, which is not correctly rounded in every
//    case);
//  * softmax: max in f32, e = f32(exp(x - max)) as above, z = the sum of the
//    e in double (a warp reduction here, a sequential sum on the CPU: the
//    order differs, which moves z in its last double bits only), score =
//    f32(e / z);
//  * choice = score + bias in f32; a group's value is first + second (with a
//    bias) or first (without) of its choices, found by the CPU's own scan in
//    expert order; groups rank by value, ties to the lower group; experts
//    outside the best topk_groups groups get choice -inf;
//  * top_k rounds of a warp arg-max over (choice, id), larger choice first
//    and the lower id on ties, each taking its winner out; a NaN choice ranks
//    as -inf (the CPU's order is unspecified for NaN);
//  * the weights' sum is an f32 sum in selection order, as on the CPU, then
//    w / sum (when normalize) and * scaling, each one f32 operation.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_kernels.h"

namespace basalt::cuda_kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kPerLane = kMoeMaxExperts / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int32_t kNoExpert = 0x7fffffff;  // ranks after every real expert

static_assert(kMoeMaxGroups <= 32 && kMoeMaxTopK <= 32, "one lane per group and per chosen expert");

// Whether (v, id) ranks before (best_v, best_id): larger value, then lower id.
__device__ __forceinline__ bool ranks_before(float v, int32_t id, float best_v, int32_t best_id) {
  return v > best_v || (v == best_v && id < best_id);
}

__global__ void __launch_bounds__(kThreads) moe_route_kernel(MoeRouteArgs a) {
  __shared__ float choice_shared[kWarpsPerBlock][kMoeMaxExperts];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  // The whole warp leaves together; nothing below synchronises the block.
  if (t >= a.tokens) return;
  const int E = a.experts;
  const float* row = a.logits + t * E;
  const float inf = __int_as_float(0x7f800000);

  float score[kPerLane], choice[kPerLane];
  if (a.softmax) {
    float x[kPerLane];
    float max = -inf;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      x[i] = e < E ? row[e] : -inf;
      max = fmaxf(max, x[i]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kFull, max, offset));
    double z = 0.0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      const float d = x[i] - max;
      score[i] = e < E ? static_cast<float>(exp(static_cast<double>(d))) : 0.0f;
      z += score[i];
    }
    // An xor butterfly: both partners add the same two values, so every lane
    // ends with the same z.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) z += __shfl_xor_sync(kFull, z, offset);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = static_cast<float>(static_cast<double>(score[i]) / z);
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      const float x = e < E ? row[e] : 0.0f;
      const float ex = static_cast<float>(exp(static_cast<double>(-x)));
      score[i] = 1.0f / (1.0f + ex);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    choice[i] = e < E ? score[i] + (a.bias ? a.bias[e] : 0.0f) : -inf;
  }

  if (a.groups > 1) {
    float* shared = choice_shared[warp];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E) shared[e] = choice[i];
    }
    __syncwarp();
    const int per_group = E / a.groups;
    float value = -inf;
    if (lane < a.groups) {
      float first = -inf, second = -inf;
      for (int e = lane * per_group; e < (lane + 1) * per_group; ++e) {
        const float c = shared[e];
        if (c > first) {
          second = first;
          first = c;
        } else if (c > second) {
          second = c;
        }
      }
      value = a.bias ? first + (per_group > 1 ? second : 0.0f) : first;
    }
    // Rank of this lane's group: the groups that come before it.
    int rank = 0;
    for (int g = 0; g < a.groups; ++g) {
      const float other = __shfl_sync(kFull, value, g);
      if (ranks_before(other, g, value, lane)) ++rank;
    }
    const unsigned keep = __ballot_sync(kFull, lane < a.groups && rank < a.topk_groups);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((keep >> (e / per_group)) & 1u)) choice[i] = -inf;
    }
  }

  // top_k rounds of arg-max; lane j keeps the j-th winner.
  unsigned taken = 0;
  int32_t my_id = kNoExpert;
  float my_score = 0.0f;
  for (int j = 0; j < a.top_k; ++j) {
    float best = -inf, best_score = 0.0f;
    int32_t best_id = kNoExpert;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e >= E || ((taken >> i) & 1u)) continue;
      const float c = choice[i] != choice[i] ? -inf : choice[i];
      if (ranks_before(c, e, best, best_id)) {
        best = c;
        best_id = e;
        best_score = score[i];
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(kFull, best, offset);
      const int32_t other_id = __shfl_xor_sync(kFull, best_id, offset);
      const float other_score = __shfl_xor_sync(kFull, best_score, offset);
      if (ranks_before(other, other_id, best, best_id)) {
        best = other;
        best_id = other_id;
        best_score = other_score;
      }
    }
    // (choice, id) pairs are distinct, so every lane holds the same winner.
    if (best_id != kNoExpert && best_id % 32 == lane) taken |= 1u << (best_id / 32);
    if (lane == j) {
      my_id = best_id;
      my_score = best_score;
    }
  }
  float sum = 0.0f;
  for (int j = 0; j < a.top_k; ++j) sum += __shfl_sync(kFull, my_score, j);
  if (lane < a.top_k) {
    float w = my_score;
    if (a.normalize) w /= sum;
    a.ids[t * a.top_k + lane] = my_id;
    a.weights[t * a.top_k + lane] = w * a.scaling;
  }
}

}  // namespace

cudaError_t moe_route(const MoeRouteArgs& args, cudaStream_t stream) {
  const int64_t blocks = (args.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  moe_route_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
