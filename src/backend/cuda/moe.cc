#include "backend/cuda/moe.h"

#include <limits>

#include "backend/cuda/moe_kernels.h"
#include "core/error.h"

namespace basalt {
namespace {

void require(const Tensor& t, const char* name, DType dtype, int rank) {
  BASALT_CHECK(t.device() == Device::kCuda && t.dtype() == dtype && t.rank() == rank,
               "cuda moe_route: {} must be a device {} tensor of rank {}, got {}", name, dtype_name(dtype), rank,
               t.describe());
}

}  // namespace

void cuda_moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& p, Tensor& ids,
                    Tensor& weights, cudaStream_t stream) {
  using cuda_kernels::kMoeMaxExperts;
  using cuda_kernels::kMoeMaxGroups;
  using cuda_kernels::kMoeMaxTopK;
  require(logits, "logits", DType::kF32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  BASALT_CHECK(p.top_k > 0 && p.num_groups > 0 && E % p.num_groups == 0 && p.topk_groups > 0 &&
                   p.topk_groups <= p.num_groups && p.top_k <= p.topk_groups * (E / p.num_groups),
               "cuda moe_route: top_k {}, num_groups {}, topk_groups {} do not fit {} experts", p.top_k,
               p.num_groups, p.topk_groups, E);
  BASALT_CHECK(E <= kMoeMaxExperts && p.num_groups <= kMoeMaxGroups && p.top_k <= kMoeMaxTopK,
               "cuda moe_route: supports up to {} experts, {} groups and top_k {}; got {}, {} and {}", kMoeMaxExperts,
               kMoeMaxGroups, kMoeMaxTopK, E, p.num_groups, p.top_k);
  BASALT_CHECK(T <= std::numeric_limits<int32_t>::max(), "cuda moe_route: {} tokens are too many", T);
  require(ids, "ids", DType::kI32, 2);
  require(weights, "weights", DType::kF32, 2);
  BASALT_CHECK(ids.shape() == Shape({T, p.top_k}) && weights.shape() == Shape({T, p.top_k}),
               "cuda moe_route: ids {} and weights {} must be [{}, {}]", ids.describe(), weights.describe(), T,
               p.top_k);
  if (bias) {
    require(*bias, "bias", DType::kF32, 1);
    BASALT_CHECK(bias->dim(0) == E, "cuda moe_route: bias {} must be [{}]", bias->describe(), E);
  }
  if (T == 0) return;
  cuda_kernels::MoeRouteArgs args{};
  args.logits = logits.data<const float>();
  args.bias = bias ? bias->data<const float>() : nullptr;
  args.ids = ids.data<int32_t>();
  args.weights = weights.data<float>();
  args.tokens = T;
  args.experts = static_cast<int>(E);
  args.groups = p.num_groups;
  args.topk_groups = p.topk_groups;
  args.top_k = p.top_k;
  args.softmax = p.scoring == MoeScoring::kSoftmax;
  args.normalize = p.normalize;
  args.scaling = p.scaling;
  const cudaError_t status = cuda_kernels::moe_route(args, stream);
  BASALT_CHECK(status == cudaSuccess, "cuda moe_route: launch failed: {}", cudaGetErrorString(status));
}

}  // namespace basalt
