// End-to-end numerics of the dense families against Hugging Face transformers.
//
// testdata/models/<name>/ holds a random-weight checkpoint saved by
// transformers, and reference.safetensors / reference.json hold what
// transformers (float32, eager attention) computed for it: full-sequence
// logits for prompts of several lengths and a greedy continuation with its
// top-2 margins (tools/fixtures/make_dense_fixtures.py made them).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/generator.h"
#include "testing/reference_test_util.h"

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

using testing::read_json;

class DenseReference : public ::testing::TestWithParam<std::string> {};

// Each fixture in both of the CPU's modes: f32 activations (--dtype float32)
// within f32 rounding of transformers' f32 run; and the default, where bf16
// weights meet activations rounded to bf16 (core/bf16_product.h), within
// what that rounding moves (fixtures with f32 weights give the same in both).
TEST_P(DenseReference, PrefillLogitsMatchTransformers) {
  CpuBackend exact(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  testing::expect_prefill_logits_match_reference(*load_model(kModels + GetParam(), exact), kModels + GetParam(),
                                                 GetParam());
  CpuBackend rounded;
  testing::expect_prefill_logits_match_reference(*load_model(kModels + GetParam(), rounded), kModels + GetParam(),
                                                 GetParam() + ", bf16 activations", 1e-2, 0.25);
}

TEST_P(DenseReference, GreedyContinuationMatchesTransformers) {
  const std::string dir = kModels + GetParam();
  CpuBackend exact(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  testing::expect_greedy_matches_reference(*load_model(dir, exact), exact, dir);
  CpuBackend rounded;
  testing::expect_greedy_matches_reference(*load_model(dir, rounded), rounded, dir, /*min_margin=*/0.02,
                                           /*min_compared=*/4);
}

INSTANTIATE_TEST_SUITE_P(Families, DenseReference,
                         ::testing::Values("llama", "llama_bias", "mistral", "qwen2", "qwen3"));

TEST(DenseModel, ChunkedPrefillEqualsOneShot) {
  // Feeding the prompt in pieces through the KV cache gives the same last
  // logits as one prefill: the cache and positions are consistent.
  CpuBackend backend;
  auto model = load_model(kModels + "mistral", backend);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 37 + 11) % 320);
  const int64_t vocab = model->config().vocab_size;

  KvBuffers kv_a = model->allocate_kv(21);
  Tensor a = Tensor::empty({1, vocab}, DType::kF32);
  model->forward(single_sequence_batch(prompt, 0), kv_a, a);

  KvBuffers kv_b = model->allocate_kv(21);
  Tensor b = Tensor::empty({1, vocab}, DType::kF32);
  const size_t cuts[] = {0, 7, 8, 20, 21};
  for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
    std::span<const int32_t> piece(prompt.data() + cuts[c], cuts[c + 1] - cuts[c]);
    model->forward(single_sequence_batch(piece, static_cast<int64_t>(cuts[c])), kv_b, b);
  }
  for (int64_t i = 0; i < vocab; ++i)
    EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-4) << i;
}

// Asked for them, forward also gives every token's final hidden state (after
// the final norm), and the logits are lm_head of those rows, unchanged.
TEST(DenseModel, ForwardGivesTheFinalHiddenStatesOnRequest) {
  // f32 activations: the logits are recomputed below from the hidden states in f32.
  CpuBackend backend(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  for (const char* name : {"llama", "qwen2"}) {
    SCOPED_TRACE(name);
    auto model = load_model(kModels + name, backend);
    const ModelConfig& c = model->config();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 9; ++i) prompt.push_back((i * 53 + 7) % 320);
    const ForwardBatch batch = single_sequence_batch(prompt, 0, /*all_logits=*/true);
    KvBuffers kv_a = model->allocate_kv(9), kv_b = model->allocate_kv(9);
    Tensor plain = Tensor::empty({9, c.vocab_size}, DType::kF32);
    Tensor with_hidden = Tensor::empty({9, c.vocab_size}, DType::kF32);
    Tensor hidden = Tensor::empty({9, c.hidden_size}, DType::kF32);
    model->forward(batch, kv_a, plain);
    model->forward(batch, kv_b, with_hidden, &hidden);
    for (int64_t i = 0; i < plain.numel(); ++i) ASSERT_EQ(plain.data<float>()[i], with_hidden.data<float>()[i]);
    // logits[t, v] = hidden[t, :] . lm_head[v, :] (the head is the embedding when tied).
    const Checkpoint ckpt = Checkpoint::open(kModels + name);
    const Tensor head = (ckpt.has("lm_head.weight") ? ckpt.get("lm_head.weight") : ckpt.get("model.embed_tokens.weight")).to_f32();
    for (int64_t t = 0; t < 9; t += 4)
      for (int64_t v = 0; v < c.vocab_size; v += 37) {
        double dot = 0;
        for (int64_t h = 0; h < c.hidden_size; ++h)
          dot += static_cast<double>(hidden.data<float>()[t * c.hidden_size + h]) *
                 head.data<float>()[v * c.hidden_size + h];
        EXPECT_NEAR(plain.data<float>()[t * c.vocab_size + v], dot, 1e-3) << t << " " << v;
      }
  }
}

TEST(DenseModel, RejectsShapeMismatchNamingTheTensor) {
  CpuBackend backend;
  // qwen3's checkpoint read with llama's config: q_proj shapes disagree.
  const auto tmp = std::filesystem::temp_directory_path() / "basalt_dense_mismatch";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  for (const char* f : {"model.safetensors"})
    std::filesystem::copy_file(kModels + "qwen3/" + f, tmp / f);
  nlohmann::json config = read_json(kModels + "qwen3/config.json");
  config["head_dim"] = 16;
  std::ofstream(tmp / "config.json") << config.dump();
  try {
    load_model(tmp.string(), backend);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("q_proj.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
  }
  std::filesystem::remove_all(tmp);
}

// Fewer layers in config.json than in the checkpoint: the extra layer's
// tensors are reported, not dropped.
TEST(DenseModel, RejectsAConfigWithFewerLayersThanTheCheckpoint) {
  CpuBackend backend;
  const auto tmp = std::filesystem::temp_directory_path() / "basalt_dense_layers";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  // The weights (sharded, with their index), not the transformers reference.
  for (const auto& e : std::filesystem::directory_iterator(kModels + "llama")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model", 0) == 0) std::filesystem::copy_file(e.path(), tmp / name);
  }
  nlohmann::json config = read_json(kModels + "llama/config.json");
  ASSERT_EQ(config["num_hidden_layers"], 2);
  config["num_hidden_layers"] = 1;
  std::ofstream(tmp / "config.json") << config.dump();
  try {
    load_model(tmp.string(), backend);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'model.layers.1."), std::string::npos) << message;
    EXPECT_NE(message.find("layers up to 1 but config.json's num_hidden_layers is 1"), std::string::npos)
        << message;
  }
  config["num_hidden_layers"] = 3;  // more than stored: the missing tensor is named
  std::ofstream(tmp / "config.json") << config.dump();
  try {
    load_model(tmp.string(), backend);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace basalt
