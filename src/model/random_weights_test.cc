// Random weights (Checkpoint::random, Weights::kRandom): the dtypes and
// answers a checkpoint of the config would give; DeepSeek-V3's published
// shape loads at its published 671B parameters (without its MTP layer)
// from config.json alone; the bundled model's shape runs, and its random
// weights are the same however the ranks split them (tensor parallelism
// over 2 ranks and DP attention give one rank's logits).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/data_parallel.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace basalt {
namespace {

const std::string kRoot = std::string(BASALT_TESTDATA) + "/..";

TEST(RandomWeights, TheCheckpointAnswersAsTheConfigsWould) {
  const Checkpoint fp8 = Checkpoint::random({.fp8_linears = true, .router_bias = true, .num_layers = 4}, "x");
  EXPECT_EQ(fp8.get("model.layers.0.self_attn.q_a_proj.weight", {64, 32}).dtype(), DType::kF8E4M3);
  EXPECT_EQ(fp8.get("model.layers.0.self_attn.q_a_proj.weight_scale_inv", {1, 1}).dtype(), DType::kF32);
  EXPECT_EQ(fp8.get("model.layers.1.mlp.gate.weight", {16, 32}).dtype(), DType::kBF16);  // the router
  EXPECT_EQ(fp8.get("model.embed_tokens.weight", {100, 32}).dtype(), DType::kBF16);
  EXPECT_TRUE(fp8.has("model.layers.0.mlp.down_proj.weight_scale_inv"));
  EXPECT_TRUE(fp8.has("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(fp8.has("lm_head.weight"));
  EXPECT_FALSE(fp8.has("model.layers.4.enorm.weight")) << "no MTP layer";
  EXPECT_FALSE(fp8.has("model.layers.1.mlp.experts.gate_up_proj")) << "experts one by one";
  const Checkpoint plain = Checkpoint::random({.tied_lm_head = true, .num_layers = 2}, "y");
  EXPECT_FALSE(plain.has("lm_head.weight"));
  EXPECT_FALSE(plain.has("model.layers.0.mlp.down_proj.weight_scale_inv"));
  EXPECT_EQ(plain.get("model.layers.0.mlp.down_proj.weight", {8, 8}).dtype(), DType::kBF16);
  // Norms are ones; weights small, finite, different from tensor to tensor,
  // the same on every call.
  const Tensor norm = plain.get("model.norm.weight", {8}).to_f32();
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(norm.data<float>()[i], 1.0f);
  const Tensor a = plain.get("model.layers.0.mlp.up_proj.weight", {64, 64}).to_f32();
  const Tensor b = plain.get("model.layers.1.mlp.up_proj.weight", {64, 64}).to_f32();
  const Tensor again = plain.get("model.layers.0.mlp.up_proj.weight", {64, 64}).to_f32();
  int differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(a.data<float>()[i]));
    EXPECT_LE(std::fabs(a.data<float>()[i]), 0.0501f);  // 0.05 in bf16
    EXPECT_EQ(a.data<float>()[i], again.data<float>()[i]);
    differ += a.data<float>()[i] != b.data<float>()[i];
  }
  EXPECT_GT(differ, a.numel() / 2);
  const Tensor codes = fp8.get("model.layers.2.mlp.up_proj.weight", {256, 256});
  for (int64_t i = 0; i < codes.numel(); ++i)
    ASSERT_NE(codes.data<const uint8_t>()[i] & 0x7F, 0x7F) << "an e4m3 NaN at " << i;
  EXPECT_THROW(plain.get("model.norm.weight"), Error) << "a shape is needed";
}

TEST(RandomWeights, DeepseekV3LoadsAtItsPublishedSizeFromItsConfigAlone) {
  CpuBackend cpu;
  auto model = load_model(kRoot + "/models/shapes/deepseek-v3", cpu, {}, {}, Weights::kRandom);
  const std::string summary = model->summary();
  // 671B parameters without the MTP layer (DeepSeek-V3 technical report).
  EXPECT_NE(summary.find("61 layers (3 dense, 58 MoE), no MTP layer"), std::string::npos) << summary;
  EXPECT_NE(summary.find("671 B parameters"), std::string::npos) << summary;
  EXPECT_NE(summary.find("fp8 e4m3 with 128x128 block scales"), std::string::npos) << summary;
  EXPECT_EQ(model->kv_bytes_per_slot(DType::kBF16), 61u * 576u * 2u) << "70 KB per token";
}

TEST(RandomWeights, TheBundledShapeRunsTheSameOverRanks) {
  const std::string dir = kRoot + "/models/basalt-mini";
  CpuBackend cpu;
  auto one = load_model(dir, cpu, {}, {}, Weights::kRandom);
  auto two = load_tensor_parallel(dir, 2, [](int) { return make_cpu_backend_with_threads(1); }, {}, nullptr, {},
                                  Weights::kRandom);
  auto dp = load_data_parallel(dir, 2, [](int) { return make_cpu_backend_with_threads(1); }, {},
                               std::chrono::microseconds(1000), Weights::kRandom);
  const std::vector<int32_t> ids = {5, 17, 300, 42};
  const int64_t V = one->config().vocab_size;
  auto last_logits = [&](Model& m) {
    KvBuffers kv = m.allocate_kv(8);
    Tensor logits = Tensor::empty({1, V}, DType::kF32);
    m.forward(single_sequence_batch(ids, 0), kv, logits);
    return logits;
  };
  const Tensor want = last_logits(*one), tp = last_logits(*two), ranked = last_logits(dp->rank(1));
  double scale = 0;
  for (int64_t i = 0; i < V; ++i) {
    ASSERT_TRUE(std::isfinite(want.data<float>()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want.data<float>()[i])));
  }
  EXPECT_GT(scale, 0.0);
  for (int64_t i = 0; i < V; ++i) {
    EXPECT_NEAR(tp.data<float>()[i], want.data<float>()[i], 1e-4 * scale + 1e-6) << i;
    EXPECT_NEAR(ranked.data<float>()[i], want.data<float>()[i], 1e-4 * scale + 1e-6) << i;
  }
}

}  // namespace
}  // namespace basalt
