// CpuBackend::linear against the reference, across both kernel regimes
// (few tokens: in-register conversion; many tokens: f32 panels), every weight
// dtype, sizes that leave remainders in every blocking dimension, with and
// without bias, and with pools of several sizes. bf16 weights in the default
// mode (activations rounded to bf16) are held to core/bf16_product.h's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear.h"
#include "backend/reference_ops.h"
#include "core/bf16_product.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::count_nan;
using testing::poisoned;
using testing::random_tensor;
using testing::relative_error;
using testing::TestRng;

// bf16 weights on a backend in the default mode: the bits of
// core/bf16_product.h's definition, then the bias added in f32.
void expect_bf16_definition(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
  const int64_t tokens = x.dim(0), in = x.dim(1), outs = w.dim(0);
  std::vector<uint16_t> row(static_cast<size_t>(bf16_padded_columns(in)));
  int64_t differing = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    round_activations_bf16(x.data<const float>() + t * in, in, row.data());
    for (int64_t n = 0; n < outs; ++n) {
      float want = bf16_dot_reference(row.data(), w.data<const uint16_t>() + n * in, in);
      if (bias != nullptr) want += bias->to_f32().data<const float>()[n];
      const float got = out.data<const float>()[t * outs + n];
      differing += std::memcmp(&want, &got, sizeof(float)) != 0;
    }
  }
  EXPECT_EQ(differing, 0) << tokens << "x" << in << " -> " << outs << " bf16, activations rounded";
}

void expect_linear_matches(CpuBackend& backend, TestRng& rng, int64_t tokens, int64_t in,
                           int64_t outs, DType w_dtype, DType bias_dtype, bool with_bias) {
  const Tensor x = random_tensor(rng, {tokens, in}, DType::kF32);
  const Tensor w = random_tensor(rng, {outs, in}, w_dtype, 0.5f);
  const Tensor bias = random_tensor(rng, {outs}, bias_dtype);
  Tensor out = poisoned({tokens, outs}), ref = poisoned({tokens, outs});
  backend.linear(x, w, with_bias ? &bias : nullptr, out);
  if (w_dtype == DType::kBF16 && backend.bf16_activations() == cpu::Bf16Activations::kRounded) {
    expect_bf16_definition(x, w, with_bias ? &bias : nullptr, out);
    return;
  }
  reference::linear(x, w, with_bias ? &bias : nullptr, ref);
  EXPECT_EQ(count_nan(out), 0) << tokens << "x" << in << " -> " << outs << " " << dtype_name(w_dtype);
  // ||out - ref|| / ||ref|| < 1e-5, plus a term for cancellation: a lone dot
  // product whose terms cancel has a large relative error in any f32 order,
  // so the error is also allowed 1e-6 of the sum of |x| |w| products.
  Tensor abs_out = poisoned({tokens, outs});
  Tensor abs_x = testing::clone(x), abs_w = w.to_f32();
  for (int64_t i = 0; i < abs_x.numel(); ++i) abs_x.data<float>()[i] = std::fabs(abs_x.data<float>()[i]);
  for (int64_t i = 0; i < abs_w.numel(); ++i) abs_w.data<float>()[i] = std::fabs(abs_w.data<float>()[i]);
  reference::linear(abs_x, abs_w, nullptr, abs_out);
  EXPECT_LE(testing::error_norm(out, ref), 1e-5 * testing::norm(ref) + 1e-6 * testing::norm(abs_out))
      << tokens << "x" << in << " -> " << outs << " " << dtype_name(w_dtype)
      << (with_bias ? " with bias" : "") << ", relative error " << relative_error(out, ref);
}

// Every dtype in the default mode; bf16 weights also with f32 activations
// (--dtype float32), which the reference's exact sums bound.
TEST(CpuLinear, OddShapesEveryDtypeBothRegimes) {
  TestRng rng;
  CpuBackend backend, exact(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  const int64_t panel = cpu::linear_panel_min_tokens();
  const std::vector<int64_t> token_counts = {1, 2, 3, 4, 5, panel - 1, panel, panel + 3, 17, 64, 65};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    for (int64_t tokens : token_counts) {
      for (int64_t in : {1, 3, 17, 63, 64, 65, 129}) {
        for (int64_t outs : {1, 3, 7, 13, 64}) {
          expect_linear_matches(backend, rng, tokens, in, outs, dtype, DType::kF32, (in + outs) % 2);
          if (dtype == DType::kBF16)
            expect_linear_matches(exact, rng, tokens, in, outs, dtype, DType::kF32, (in + outs) % 2);
        }
      }
    }
  }
}

TEST(CpuLinear, KBlockingAndTokenBlockingBoundaries) {
  TestRng rng;
  CpuBackend backend, exact(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  // in beyond one K-block (1024) with remainders; tokens beyond one token block (128).
  for (const auto& [tokens, in, outs] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 2047, 33}, {3, 3000, 20}, {9, 1025, 31}, {64, 2048, 37}, {130, 1100, 19},
           {257, 96, 70}}) {
    expect_linear_matches(backend, rng, tokens, in, outs, DType::kBF16, DType::kF32, true);
    expect_linear_matches(exact, rng, tokens, in, outs, DType::kBF16, DType::kF32, true);
  }
}

TEST(CpuLinear, BiasDtypes) {
  TestRng rng;
  CpuBackend backend;
  for (DType bias_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    expect_linear_matches(backend, rng, 3, 40, 24, DType::kBF16, bias_dtype, true);
    expect_linear_matches(backend, rng, 20, 40, 24, DType::kF16, bias_dtype, true);
  }
}

TEST(CpuLinear, SameResultOnEveryPoolSize) {
  TestRng rng;
  for (int threads : {1, 3, 5}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool);
    for (int64_t tokens : {1, 4, 33}) {
      expect_linear_matches(backend, rng, tokens, 300, 101, DType::kBF16, DType::kF32, true);
    }
  }
}

TEST(CpuLinear, EmptyDimensions) {
  CpuBackend backend;
  // in = 0: every output is the bias (or zero).
  const Tensor x = Tensor::empty({3, 0}, DType::kF32);
  const Tensor w = Tensor::empty({5, 0}, DType::kBF16);
  const Tensor bias = Tensor::from_f32({5}, std::vector<float>{1, 2, 3, 4, 5});
  Tensor out = poisoned({3, 5});
  backend.linear(x, w, &bias, out);
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data<float>()[i], 1.0f + i % 5);
  // tokens = 0: nothing to do.
  Tensor none = Tensor::empty({0, 5}, DType::kF32);
  backend.linear(Tensor::empty({0, 0}, DType::kF32), w, nullptr, none);
}

// The MoE experts multiply bf16 weights as the backend's mode says: one
// expert taking every token with weight 1 gives, bit for bit, down(silu(gate
// x) * up x) through linear in the same mode, and the two modes differ.
TEST(CpuLinear, MoeExpertsOnBf16WeightsFollowTheMode) {
  TestRng rng;
  const int64_t T = 5, H = 70, I = 36;
  const Tensor x = random_tensor(rng, {T, H}, DType::kF32);
  MoeExpert expert;
  expert.gate.weight = random_tensor(rng, {I, H}, DType::kBF16, 0.2f);
  expert.up.weight = random_tensor(rng, {I, H}, DType::kBF16, 0.2f);
  expert.down.weight = random_tensor(rng, {H, I}, DType::kBF16, 0.2f);
  const Tensor ids = Tensor::from_i32({T, 1}, std::vector<int32_t>(T, 0));
  const Tensor weights = Tensor::from_f32({T, 1}, std::vector<float>(T, 1.0f));
  std::vector<Tensor> results;
  for (const auto mode : {cpu::Bf16Activations::kRounded, cpu::Bf16Activations::kF32}) {
    CpuBackend backend(&ThreadPool::global(), mode);
    Tensor out = poisoned({T, H});
    backend.moe_experts(x, ids, weights, std::vector<MoeExpert>{expert}, out);
    Tensor gate = poisoned({T, I}), up = poisoned({T, I}), want = poisoned({T, H});
    backend.linear(x, expert.gate.weight, nullptr, gate);
    backend.linear(x, expert.up.weight, nullptr, up);
    for (int64_t i = 0; i < T * I; ++i) {
      const float g = gate.data<float>()[i];
      gate.data<float>()[i] = g / (1.0f + std::exp(-g)) * up.data<float>()[i];
    }
    backend.linear(gate, expert.down.weight, nullptr, want);
    EXPECT_EQ(std::memcmp(out.raw(), want.raw(), sizeof(float) * T * H), 0)
        << (mode == cpu::Bf16Activations::kF32 ? "f32" : "rounded") << " activations";
    results.push_back(std::move(out));
  }
  EXPECT_NE(std::memcmp(results[0].raw(), results[1].raw(), sizeof(float) * T * H), 0);
  EXPECT_LT(relative_error(results[0], results[1]), 1e-2);
}

TEST(CpuLinearChecks, RejectsMismatches) {
  CpuBackend backend;
  const Tensor x = Tensor::zeros({2, 8}, DType::kF32);
  const Tensor w = Tensor::zeros({4, 8}, DType::kBF16);
  Tensor out = Tensor::zeros({2, 4}, DType::kF32);
  const Tensor bias_wrong = Tensor::zeros({5}, DType::kF32);
  const Tensor bias_i32 = Tensor::zeros({4}, DType::kI32);
  EXPECT_THROW(backend.linear(x, Tensor::zeros({4, 7}, DType::kBF16), nullptr, out), Error);
  Tensor out_wrong = Tensor::zeros({2, 5}, DType::kF32);
  EXPECT_THROW(backend.linear(x, w, nullptr, out_wrong), Error);
  Tensor out_bf16 = Tensor::zeros({2, 4}, DType::kBF16);
  EXPECT_THROW(backend.linear(x, w, nullptr, out_bf16), Error);
  EXPECT_THROW(backend.linear(Tensor::zeros({2, 8}, DType::kBF16), w, nullptr, out), Error);
  EXPECT_THROW(backend.linear(x, Tensor::zeros({4, 8}, DType::kI32), nullptr, out), Error);
  EXPECT_THROW(backend.linear(x, w.reshape({32}), nullptr, out), Error);
  EXPECT_THROW(backend.linear(x, w, &bias_wrong, out), Error);
  EXPECT_THROW(backend.linear(x, w, &bias_i32, out), Error);
  // out over its own input.
  Tensor square = Tensor::zeros({2, 2}, DType::kF32);
  EXPECT_THROW(backend.linear(square, Tensor::zeros({2, 2}, DType::kF32), nullptr, square), Error);
  try {
    backend.linear(x, Tensor::zeros({4, 7}, DType::kBF16), nullptr, out);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("linear"), std::string::npos) << message;
    EXPECT_NE(message.find("[4, 7]"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace basalt
