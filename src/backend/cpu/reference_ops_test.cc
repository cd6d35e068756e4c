// The reference ops against cases worked out by hand, so that the baseline
// every backend is compared with is itself checked.
#include "backend/reference_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/sampling_rng.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::i32_tensor;

std::vector<float> values(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

TEST(SamplingRng, MatchesTheDocumentedDefinition) {
  // Computed independently from the definition in sampling_rng.h.
  EXPECT_EQ(sampling_hash(0, 0), 0xa706dd2f4d197e6full);
  EXPECT_EQ(sampling_hash(1, 0), 0x5e41ab087439611eull);
  EXPECT_EQ(sampling_hash(0, 1), 0xb382a305f4414f5eull);
  EXPECT_EQ(sampling_hash(123456789, 42), 0xc5936dec7069e467ull);
  EXPECT_EQ(sampling_hash(~0ull, ~0ull), 0x445018e305810b78ull);
  EXPECT_EQ(sampling_uniform(0, 0), 10946269 * 0x1p-24f);
  EXPECT_EQ(sampling_uniform(123456789, 42), 12948333 * 0x1p-24f);
}

TEST(SamplingRng, IsUniformInUnitInterval) {
  double sum = 0.0;
  int below_half = 0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const float u = sampling_uniform(7, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    below_half += u < 0.5f;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  EXPECT_NEAR(below_half / static_cast<double>(kDraws), 0.5, 0.005);
}

TEST(ReferenceOps, Embedding) {
  Tensor table = Tensor::empty({3, 2}, DType::kBF16);
  const float rows[6] = {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, 4.0f};
  for (int i = 0; i < 6; ++i) table.data<uint16_t>()[i] = f32_to_bf16(rows[i]);
  Tensor out = testing::poisoned({2, 2});
  reference::embedding(i32_tensor({2, 0}), table, out);
  EXPECT_EQ(values(out), (std::vector<float>{3.0f, 4.0f, 1.0f, -2.0f}));
  EXPECT_THROW(reference::embedding(i32_tensor({3, 0}), table, out), Error);
}

TEST(ReferenceOps, LinearWithBias) {
  const Tensor x = Tensor::from_f32({2, 2}, std::vector<float>{1, 2, 3, 4});
  const Tensor w = Tensor::from_f32({3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1});
  const Tensor bias = Tensor::from_f32({3}, std::vector<float>{0.5f, 0.0f, -1.0f});
  Tensor out = testing::poisoned({2, 3});
  reference::linear(x, w, &bias, out);
  EXPECT_EQ(values(out), (std::vector<float>{1.5f, 2.0f, 2.0f, 3.5f, 4.0f, 6.0f}));
}

TEST(ReferenceOps, RmsNormAndAddRmsNorm) {
  const Tensor x = Tensor::from_f32({1, 2}, std::vector<float>{3, 4});
  const Tensor weight = Tensor::from_f32({2}, std::vector<float>{1, 2});
  Tensor out = testing::poisoned({1, 2});
  reference::rms_norm(x, weight, 0.0f, out);
  const float rms = std::sqrt(12.5f);  // mean of 9 and 16
  EXPECT_NEAR(out.data<float>()[0], 3.0f / rms, 1e-6);
  EXPECT_NEAR(out.data<float>()[1], 8.0f / rms, 1e-6);

  Tensor residual = Tensor::from_f32({1, 2}, std::vector<float>{1, 1});
  const Tensor delta = Tensor::from_f32({1, 2}, std::vector<float>{2, 3});
  reference::add_rms_norm(residual, delta, weight, 0.0f, out);
  EXPECT_EQ(values(residual), (std::vector<float>{3, 4}));
  EXPECT_NEAR(out.data<float>()[1], 8.0f / rms, 1e-6);
}

TEST(ReferenceOps, RopeStyles) {
  const Tensor inv_freq = Tensor::from_f32({2}, std::vector<float>{1.0f, 0.5f});
  const Tensor positions = i32_tensor({1});
  RopeParams params{.num_heads = 1, .head_dim = 4, .rotary_dim = 4, .inv_freq = &inv_freq};
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.5), s1 = std::sin(0.5);

  Tensor x = Tensor::from_f32({1, 4}, std::vector<float>{1, 2, 3, 4});
  reference::rope(x, positions, params);  // pairs (0, 2) at frequency 1, (1, 3) at 0.5
  EXPECT_NEAR(x.data<float>()[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(x.data<float>()[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x.data<float>()[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x.data<float>()[3], 4 * c1 + 2 * s1, 1e-6);

  params.style = RopeStyle::kInterleaved;  // pairs (0, 1) and (2, 3)
  x = Tensor::from_f32({1, 4}, std::vector<float>{1, 2, 3, 4});
  reference::rope(x, positions, params);
  EXPECT_NEAR(x.data<float>()[0], 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(x.data<float>()[1], 2 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x.data<float>()[2], 3 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x.data<float>()[3], 4 * c1 + 3 * s1, 1e-6);

  // Partial rotary with a scaling factor: only pair (0, 1) turns, scaled by 2.
  const Tensor one_freq = Tensor::from_f32({1}, std::vector<float>{1.0f});
  RopeParams partial{.num_heads = 1, .head_dim = 4, .rotary_dim = 2, .inv_freq = &one_freq,
                     .attention_scaling = 2.0f};
  x = Tensor::from_f32({1, 4}, std::vector<float>{1, 2, 3, 4});
  reference::rope(x, positions, partial);
  EXPECT_NEAR(x.data<float>()[0], 2 * (1 * c0 - 2 * s0), 1e-6);
  EXPECT_NEAR(x.data<float>()[1], 2 * (2 * c0 + 1 * s0), 1e-6);
  EXPECT_EQ(x.data<float>()[2], 3.0f);
  EXPECT_EQ(x.data<float>()[3], 4.0f);
}

TEST(ReferenceOps, StoreKvConvertsIntoSlots) {
  const Tensor k = Tensor::from_f32({2, 2}, std::vector<float>{1, 2, 3, 4});
  const Tensor v = Tensor::from_f32({2, 1}, std::vector<float>{5, 6});
  Tensor k_cache = Tensor::zeros({3, 2}, DType::kBF16);
  Tensor v_cache = Tensor::zeros({3, 1}, DType::kF32);
  reference::store_kv(k, v, i32_tensor({2, 0}), k_cache, v_cache);
  EXPECT_EQ(values(k_cache), (std::vector<float>{3, 4, 0, 0, 1, 2}));
  EXPECT_EQ(values(v_cache), (std::vector<float>{6, 0, 5}));
  EXPECT_THROW(reference::store_kv(k, v, i32_tensor({3, 0}), k_cache, v_cache), Error);
  // A negative slot is a padding token: nothing is stored for it.
  reference::store_kv(Tensor::from_f32({2, 2}, std::vector<float>{7, 8, 9, 10}),
                      Tensor::from_f32({2, 1}, std::vector<float>{11, 12}), i32_tensor({-1, 1}),
                      k_cache, v_cache);
  EXPECT_EQ(values(k_cache), (std::vector<float>{3, 4, 9, 10, 1, 2}));
  EXPECT_EQ(values(v_cache), (std::vector<float>{6, 12, 5}));
}

TEST(ReferenceOps, AttentionCausalWindowAndGqa) {
  // Two query heads share one kv head of dimension 1. Keys 0 and ln 3 give
  // softmax weights 1/4 and 3/4 to a query of 1 at scale 1.
  const float ln3 = std::log(3.0f);
  Tensor k_cache = Tensor::from_f32({2, 1}, std::vector<float>{0.0f, ln3});
  Tensor v_cache = Tensor::from_f32({2, 1}, std::vector<float>{4.0f, 8.0f});
  const Tensor q = Tensor::from_f32({2, 2}, std::vector<float>{1, 1, 1, 0});
  AttentionLayout layout{i32_tensor({0, 2}), i32_tensor({0, 2}), i32_tensor({0, 1})};
  AttentionParams params{.num_heads = 2, .num_kv_heads = 1, .head_dim = 1, .v_head_dim = 1,
                         .scale = 1.0f};
  Tensor out = testing::poisoned({2, 2});
  reference::attention(q, k_cache, v_cache, layout, params, out);
  // Row 0 sees key 0 only; row 1 sees both (head 1 of row 1 has q = 0: equal weights).
  EXPECT_NEAR(out.data<float>()[0], 4.0f, 1e-6);
  EXPECT_NEAR(out.data<float>()[1], 4.0f, 1e-6);
  EXPECT_NEAR(out.data<float>()[2], 0.25f * 4 + 0.75f * 8, 1e-5);
  EXPECT_NEAR(out.data<float>()[3], 6.0f, 1e-6);

  params.sliding_window = 1;  // each row sees its own key only
  reference::attention(q, k_cache, v_cache, layout, params, out);
  EXPECT_NEAR(out.data<float>()[2], 8.0f, 1e-6);

  // Slots are read through kv_slots: swapping them swaps keys and values.
  layout.kv_slots = i32_tensor({1, 0});
  params.sliding_window = 0;
  reference::attention(q, k_cache, v_cache, layout, params, out);
  EXPECT_NEAR(out.data<float>()[0], 8.0f, 1e-6);
  EXPECT_NEAR(out.data<float>()[2], 0.75f * 8 + 0.25f * 4, 1e-5);
}

TEST(ReferenceOps, SiluAndMulAndAdd) {
  const Tensor gate_up = Tensor::from_f32({1, 4}, std::vector<float>{0, 1, 3, 2});
  Tensor out = testing::poisoned({1, 2});
  reference::silu_and_mul(gate_up, out);
  EXPECT_EQ(out.data<float>()[0], 0.0f);
  EXPECT_NEAR(out.data<float>()[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);

  const Tensor a = Tensor::from_f32({2}, std::vector<float>{1, 2});
  Tensor sum = testing::poisoned({2});
  reference::add(a, a, sum);
  EXPECT_EQ(values(sum), (std::vector<float>{2, 4}));
}

TEST(ReferenceOps, SoftmaxAndLogSoftmax) {
  const Tensor x = Tensor::from_f32({1, 2}, std::vector<float>{0.0f, std::log(3.0f)});
  Tensor out = testing::poisoned({1, 2});
  reference::softmax(x, out);
  EXPECT_NEAR(out.data<float>()[0], 0.25f, 1e-6);
  EXPECT_NEAR(out.data<float>()[1], 0.75f, 1e-6);
  reference::log_softmax(x, out);
  EXPECT_NEAR(out.data<float>()[0], std::log(0.25f), 1e-6);
  EXPECT_NEAR(out.data<float>()[1], std::log(0.75f), 1e-6);
}

TEST(ReferenceOps, ArgmaxTakesLowestIndexAndSkipsNan) {
  const float nan = std::nanf("");
  const Tensor logits = Tensor::from_f32({3, 4}, std::vector<float>{1, 3, 3, nan,  //
                                                                    nan, nan, nan, nan,  //
                                                                    nan, -1, 5, 5});
  Tensor out = testing::poisoned({3}, DType::kI32);
  reference::argmax(logits, out);
  EXPECT_EQ(out.data<int32_t>()[0], 1);
  EXPECT_EQ(out.data<int32_t>()[1], 0);
  EXPECT_EQ(out.data<int32_t>()[2], 2);
}

TEST(ReferenceOps, SampleDrawsByTheDocumentedRule) {
  // Probabilities 1/4 and 3/4: token 0 iff u * 4 < 1 (weights 1/3 and 1).
  const Tensor logits = Tensor::from_f32({1, 2}, std::vector<float>{0.0f, std::log(3.0f)});
  Tensor out = testing::poisoned({1}, DType::kI32);
  int zeros = 0;
  for (uint64_t step = 0; step < 200; ++step) {
    const SamplingRow row{.seed = 11, .step = step};
    reference::sample(logits, std::span(&row, 1), out);
    const float w0 = std::exp(0.0f - std::log(3.0f));
    const double target = sampling_uniform(11, step) * (static_cast<double>(w0) + 1.0);
    EXPECT_EQ(out.data<int32_t>()[0], target < w0 ? 0 : 1) << "step " << step;
    zeros += out.data<int32_t>()[0] == 0;
  }
  EXPECT_GT(zeros, 20);
  EXPECT_LT(zeros, 80);
}

TEST(ReferenceOps, SampleFiltersByHand) {
  // Probabilities 0.5, 0.3, 0.2.
  const Tensor logits =
      Tensor::from_f32({1, 3}, std::vector<float>{std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  Tensor out = testing::poisoned({1}, DType::kI32);
  const auto tokens_drawn = [&](SamplingRow row) {
    std::vector<int> seen(3, 0);
    for (uint64_t step = 0; step < 300; ++step) {
      row.step = step;
      reference::sample(logits, std::span(&row, 1), out);
      seen[out.data<int32_t>()[0]]++;
    }
    return seen;
  };
  // top-p 0.6 keeps {0, 1}: the mass before token 1 (0.5) is below 0.6, before token 2 (0.8) not.
  std::vector<int> seen = tokens_drawn({.top_p = 0.6f});
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2], 0);
  // top-p 0.45 keeps {0} only: the mass before token 1 (0.5) is not below 0.45.
  seen = tokens_drawn({.top_p = 0.45f});
  EXPECT_EQ(seen[0], 300);
  // min-p 0.5 keeps weights >= 0.5 of the top: 1, 0.6 (token 2 has 0.4).
  seen = tokens_drawn({.min_p = 0.5f});
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2], 0);
  // top-k 2 drops token 2; temperature 0 is the argmax.
  seen = tokens_drawn({.top_k = 2});
  EXPECT_EQ(seen[2], 0);
  seen = tokens_drawn({.temperature = 0.0f});
  EXPECT_EQ(seen[0], 300);
}

TEST(ReferenceOps, SampleRejectsInvalidControls) {
  const Tensor logits = Tensor::from_f32({1, 2}, std::vector<float>{0, 1});
  Tensor out = testing::poisoned({1}, DType::kI32);
  for (const SamplingRow row : {SamplingRow{.temperature = -1.0f}, SamplingRow{.top_k = -1},
                                SamplingRow{.top_p = 0.0f}, SamplingRow{.min_p = 1.5f}}) {
    EXPECT_THROW(reference::sample(logits, std::span(&row, 1), out), Error);
  }
}

}  // namespace
}  // namespace basalt
