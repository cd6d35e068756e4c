// CudaBackend::moe_route against the CPU backend: DeepSeek-V3's router
// (sigmoid, bias, 8 groups of 32, 4 groups kept, top 8, normalized, x2.5),
// DeepSeek-V2-lite's (softmax, no groups), V2's (softmax, groups ranked by
// their best score), small and odd shapes, and inputs full of exact ties;
// T = 1, 7 and 4096. ids must be equal, weights within 1e-6 relative each.
// Outputs are poisoned before each call. Skips where no device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

struct RouteCase {
  std::string name;
  int64_t experts;
  MoeRouteParams params;
  bool with_bias;
};

const MoeRouteParams kV3{MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f};
const MoeRouteParams kV2Lite{MoeScoring::kSoftmax, 6, 1, 1, false, 1.0f};
const MoeRouteParams kV2{MoeScoring::kSoftmax, 6, 8, 3, false, 16.0f};

const RouteCase kCases[] = {
    {"deepseek-v3", 256, kV3, true},
    {"deepseek-v2-lite", 64, kV2Lite, false},
    {"deepseek-v2 groups", 160, kV2, false},
    {"sigmoid groups without bias", 256, {MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f}, false},
    {"sigmoid, 16 groups of 1", 16, {MoeScoring::kSigmoid, 4, 16, 8, true, 1.0f}, true},
    {"softmax with bias, unnormalized", 40, {MoeScoring::kSoftmax, 5, 4, 2, false, 1.5f}, true},
    {"32 groups, top 32", 256, {MoeScoring::kSigmoid, 32, 32, 16, true, 1.0f}, true},
    {"one expert", 1, {MoeScoring::kSoftmax, 1, 1, 1, true, 1.0f}, false},
    {"every expert", 24, {MoeScoring::kSigmoid, 24, 3, 3, true, 2.0f}, true},
};

// Runs both backends on the same inputs and compares.
void expect_same_route(CudaBackend& cuda, const Tensor& logits, const Tensor* bias, const MoeRouteParams& p) {
  CpuBackend cpu;
  const int64_t T = logits.dim(0);
  Tensor want_ids = Tensor::empty({T, p.top_k}, DType::kI32);
  Tensor want_w = testing::poisoned({T, p.top_k});
  cpu.moe_route(logits, bias, p, want_ids, want_w);

  const Tensor d_logits = cuda_to_device(logits);
  const Tensor d_bias = bias ? cuda_to_device(*bias) : Tensor();
  Tensor ids = cuda_empty({T, p.top_k}, DType::kI32), w = cuda_empty({T, p.top_k}, DType::kF32);
  cuda_fill_bytes(ids, 0xFF);  // -1
  cuda_fill_bytes(w, 0xFF);    // NaN
  cuda.moe_route(d_logits, bias ? &d_bias : nullptr, p, ids, w);
  cuda.synchronize();
  const Tensor got_ids = cuda_to_host(ids), got_w = cuda_to_host(w);
  int reported = 0;
  for (int64_t i = 0; i < T * p.top_k && reported < 5; ++i) {
    const int32_t gi = got_ids.data<const int32_t>()[i], wi = want_ids.data<const int32_t>()[i];
    const float gw = got_w.data<const float>()[i], ww = want_w.data<const float>()[i];
    const bool id_ok = gi == wi;
    const bool w_ok = std::fabs(static_cast<double>(gw) - ww) <= 1e-6 * std::fabs(static_cast<double>(ww));
    if (!id_ok || !w_ok) {
      ++reported;
      ADD_FAILURE() << "token " << i / p.top_k << " slot " << i % p.top_k << ": id " << gi << " (cpu " << wi
                    << "), weight " << gw << " (cpu " << ww << ")";
    }
  }
}

TEST(CudaMoe, RouteMatchesCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (const RouteCase& c : kCases)
    for (int64_t T : {1, 7, 4096}) {
      SCOPED_TRACE(c.name + ", T = " + std::to_string(T));
      const Tensor logits = testing::random_tensor(rng, {T, c.experts}, DType::kF32, 2.0f);
      const Tensor bias = testing::random_tensor(rng, {c.experts}, DType::kF32, 0.05f);
      expect_same_route(cuda, logits, c.with_bias ? &bias : nullptr, c.params);
    }
}

// Logits and bias drawn from a handful of values: scores, biased scores and
// group values tie everywhere, so every choice rests on the lower-id rule.
TEST(CudaMoe, RouteTiesGoToTheLowerId) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (const RouteCase& c : kCases)
    for (int64_t T : {1, 7, 4096}) {
      SCOPED_TRACE(c.name + ", ties, T = " + std::to_string(T));
      Tensor logits = Tensor::empty({T, c.experts}, DType::kF32);
      for (int64_t i = 0; i < logits.numel(); ++i)
        logits.data<float>()[i] = static_cast<float>(rng.integer(-2, 2)) * 0.5f;
      Tensor bias = Tensor::empty({c.experts}, DType::kF32);
      for (int64_t e = 0; e < c.experts; ++e) bias.data<float>()[e] = static_cast<float>(rng.integer(0, 1)) * 0.25f;
      expect_same_route(cuda, logits, c.with_bias ? &bias : nullptr, c.params);
      // All-equal rows: the chosen ids are the lowest of the kept groups.
      const Tensor flat = Tensor::zeros({T, c.experts}, DType::kF32);
      expect_same_route(cuda, flat, nullptr, c.params);
    }
}

// The hand-made case of the CPU tests: group 1's two experts sum above group
// 0's single best one.
TEST(CudaMoe, RouteGroupMaskingByHand) {
  REQUIRE_DEVICE();
  CudaBackend cuda;
  const Tensor logits = cuda_to_device(Tensor::from_f32({1, 8}, std::vector<float>{3, -6, 2, 2, -1, -1, -2, -2}));
  const Tensor bias = cuda_to_device(Tensor::zeros({8}, DType::kF32));
  const MoeRouteParams p{MoeScoring::kSigmoid, 2, 4, 1, true, 1.0f};
  Tensor ids = cuda_empty({1, 2}, DType::kI32), w = cuda_empty({1, 2}, DType::kF32);
  cuda.moe_route(logits, &bias, p, ids, w);
  cuda.synchronize();
  const Tensor got_ids = cuda_to_host(ids), got_w = cuda_to_host(w);
  EXPECT_EQ(got_ids.data<const int32_t>()[0], 2);
  EXPECT_EQ(got_ids.data<const int32_t>()[1], 3);
  EXPECT_NEAR(got_w.data<const float>()[0], 0.5f, 1e-6);
  EXPECT_NEAR(got_w.data<const float>()[1], 0.5f, 1e-6);
}

TEST(CudaMoe, RouteRejectsWhatItCannotRun) {
  REQUIRE_DEVICE();
  CudaBackend cuda;
  const Tensor logits = cuda_empty({2, 512}, DType::kF32);
  Tensor ids = cuda_empty({2, 8}, DType::kI32), w = cuda_empty({2, 8}, DType::kF32);
  // 512 experts are more than the kernel holds.
  EXPECT_THROW(cuda.moe_route(logits, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 8, 4, true, 1.0f}, ids, w),
               Error);
  const Tensor small = cuda_empty({2, 256}, DType::kF32);
  // top_k above 32; groups that do not divide the experts; topk_groups 0.
  Tensor ids33 = cuda_empty({2, 33}, DType::kI32), w33 = cuda_empty({2, 33}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 33, 1, 1, true, 1.0f}, ids33, w33),
               Error);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 3, 1, true, 1.0f}, ids, w),
               Error);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 8, 0, true, 1.0f}, ids, w),
               Error);
  // 64 groups, wrong output shapes, a host tensor, a bias of the wrong size.
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 64, 8, true, 1.0f}, ids, w),
               Error);
  const MoeRouteParams v3 = kV3;
  Tensor short_ids = cuda_empty({2, 7}, DType::kI32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, v3, short_ids, w), Error);
  Tensor host_w = Tensor::empty({2, 8}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, v3, ids, host_w), Error);
  const Tensor bias = cuda_empty({255}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, &bias, v3, ids, w), Error);
  // The other DeepSeek ops still throw.
  Tensor out = cuda_empty({2, 256}, DType::kF32);
  EXPECT_THROW(cuda.moe_experts(small, ids, w, {}, out), Error);
}

}  // namespace
}  // namespace basalt
