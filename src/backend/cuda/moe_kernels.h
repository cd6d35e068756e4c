// Launcher of the MoE routing kernel (moe_kernels.cu), with a plain interface
// (raw device pointers and sizes) so that the .cu file needs no host-library
// headers. moe.h is the checked API on top; call that instead.
//
// Contract: moe_route enqueues one kernel on `stream` and returns
// cudaGetLastError(). Sizes are trusted: the caller has checked shapes,
// dtypes, placement and that 0 < experts <= kMoeMaxExperts, experts %
// groups == 0, 0 < topk_groups <= groups <= kMoeMaxGroups, 0 < top_k <=
// min(kMoeMaxTopK, topk_groups * experts / groups) and tokens > 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace basalt::cuda_kernels {

inline constexpr int kMoeMaxExperts = 256;  // 8 per lane of the token's warp
inline constexpr int kMoeMaxGroups = 32;    // one lane per group
inline constexpr int kMoeMaxTopK = 32;      // one lane per chosen expert

struct MoeRouteArgs {
  const float* logits;  // [tokens, experts]
  const float* bias;    // [experts], or null
  int32_t* ids;         // [tokens, top_k]
  float* weights;       // [tokens, top_k]
  int64_t tokens;
  int experts, groups, topk_groups, top_k;
  bool softmax;  // softmax scoring; sigmoid otherwise
  bool normalize;
  float scaling;
};

cudaError_t moe_route(const MoeRouteArgs& args, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
