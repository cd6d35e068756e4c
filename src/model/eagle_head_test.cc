// EAGLE heads (model/eagle_head.h): the head's step against the PyTorch code
// that trains it (tools/train/train_eagle.py --fixture wrote
// testdata/eagle/llama_head: a random head for the llama fixture and that
// code's logits and hidden states for one input, in
// llama_head_expected.safetensors), loading errors, and
// speculation with a head through the engine (lossless whatever the head
// drafts).
#include "model/eagle_head.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/graphed_model.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"

namespace basalt {
namespace {

const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";
const std::string kDeepSeek = std::string(BASALT_TESTDATA) + "/models/deepseek_v3";
const std::string kFixtureHead = std::string(BASALT_TESTDATA) + "/eagle/llama_head";
const std::string kFixtureExpected = std::string(BASALT_TESTDATA) + "/eagle/llama_head_expected.safetensors";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(EagleHead, StepMatchesTheTrainersPyTorchCode) {
  CpuBackend cpu(&ThreadPool::global(), cpu::Bf16Activations::kF32);  // the trainer's f32 arithmetic
  auto target = load_model(kLlama, cpu);
  std::unique_ptr<DraftHead> head = load_eagle_head(kFixtureHead, cpu, kLlama);
  const SafetensorsFile expected = SafetensorsFile::open(kFixtureExpected);
  const Tensor tokens = expected.tensor("tokens"), positions = expected.tensor("positions");
  const Tensor hidden = expected.tensor("hidden").to_f32();
  const Tensor want_logits = expected.tensor("logits").to_f32(), want_hidden = expected.tensor("hidden_out").to_f32();
  const int64_t T = tokens.numel(), V = target->config().vocab_size, H = target->config().hidden_size;
  std::vector<int32_t> ids(tokens.data<const int32_t>(), tokens.data<const int32_t>() + T);
  std::vector<int32_t> pos(positions.data<const int32_t>(), positions.data<const int32_t>() + T);
  std::vector<int32_t> slots, rows, q_start{0, static_cast<int32_t>(T)};
  for (int64_t i = 0; i < T; ++i) {
    slots.push_back(static_cast<int32_t>(i));
    rows.push_back(static_cast<int32_t>(i));
  }
  const ForwardBatch batch = host_forward_batch(ids, pos, slots, q_start, q_start, slots, rows);
  KvBuffers kv = head->allocate_kv(T, DType::kF32);
  Tensor logits = Tensor::empty({T, V}, DType::kF32), out = Tensor::empty({T, H}, DType::kF32);
  head->forward(batch, hidden, kv, logits, &out);
  const auto close = [](const Tensor& got, const Tensor& want, const char* what) {
    ASSERT_EQ(got.numel(), want.numel()) << what;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(got.data<const float>()[i] - want.data<const float>()[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(want.data<const float>()[i])));
    }
    EXPECT_LT(worst, 1e-3 * std::max(1.0, scale)) << what << ": largest difference " << worst << " (scale " << scale << ")";
  };
  close(logits, want_logits, "logits");
  close(out, want_hidden, "hidden_out");
}

// Writes a random head for `target_dir` (a random layer and projection; the
// target's embedding and lm_head copied in when `own_embedding`, else
// shared from the target) to a fresh directory.
std::string random_head(const std::string& target_dir, const std::string& name, uint32_t seed, bool own_embedding) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::create_directories(dir);
  const Checkpoint target = Checkpoint::open(target_dir);
  const Tensor embed = target.get("model.embed_tokens.weight");
  const int64_t V = embed.dim(0), H = embed.dim(1), I = 2 * H, D = 16, heads = H / D;
  const Tensor lm_head = target.has("lm_head.weight") ? target.get("lm_head.weight") : embed;
  std::mt19937 rng(seed);
  const auto random = [&](Shape shape, float scale, float offset = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = offset + dist(rng);
    return Tensor::from_f32(shape, v);
  };
  const float w = 1.0f / std::sqrt(static_cast<float>(H));
  std::vector<std::pair<std::string, Tensor>> tensors = {
                     {"model.norm.weight", random({H}, 0.1f, 1.0f)},
                     {"eagle.fc.weight", random({H, 2 * H}, w)},
                     {"eagle.fc.bias", random({H}, 0.1f)},
                     {"model.layers.0.input_layernorm.weight", random({H}, 0.1f, 1.0f)},
                     {"model.layers.0.post_attention_layernorm.weight", random({H}, 0.1f, 1.0f)},
                     {"model.layers.0.self_attn.q_proj.weight", random({H, H}, w)},
                     {"model.layers.0.self_attn.k_proj.weight", random({H, H}, w)},
                     {"model.layers.0.self_attn.v_proj.weight", random({H, H}, w)},
                     {"model.layers.0.self_attn.o_proj.weight", random({H, H}, w)},
                     {"model.layers.0.mlp.gate_proj.weight", random({I, H}, w)},
                     {"model.layers.0.mlp.up_proj.weight", random({I, H}, w)},
                     {"model.layers.0.mlp.down_proj.weight", random({H, I}, w)}};
  if (own_embedding) {
    tensors.emplace_back("model.embed_tokens.weight", embed.to_f32());
    tensors.emplace_back("lm_head.weight", lm_head.to_f32());
  }
  write_safetensors((dir / "model.safetensors").string(), tensors);
  std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\", \"basalt_eagle_head\": true, \"hidden_size\": " << H
                                     << ", \"intermediate_size\": " << I << ", \"num_hidden_layers\": 1, "
                                     << "\"num_attention_heads\": " << heads << ", \"num_key_value_heads\": " << heads
                                     << ", \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, "
                                     << "\"max_position_embeddings\": 4096, \"vocab_size\": " << V << "}\n";
  return dir.string();
}

std::vector<RequestOutput> run(Model& model, Backend& backend, const SpeculativeOptions& speculative,
                               const std::vector<EngineRequest>& requests) {
  EngineOptions o;
  o.speculative = speculative;
  o.eos_ids = model.config().eos_token_ids;
  o.kv_slots = 2048;
  o.check_invariants = true;
  Engine engine(model, backend, nullptr, o);
  std::vector<RequestHandle> handles;
  for (const EngineRequest& q : requests) handles.push_back(engine.submit(q));
  std::vector<RequestOutput> out;
  for (RequestHandle& h : handles) out.push_back(collect(*h));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  return out;
}

// Whatever a head drafts, the output is plain decoding's (greedy and
// sampled, k 1 and 3), and the head drafts. DeepSeek's fixture gets an
// EAGLE head in place of its MTP layer (with its own copy of the embedding
// and lm_head); the llama fixture gets one that shares the model's.
// (GraphedModel wraps whatever draft head a model has: graphed_model_test.)
TEST(EagleHead, SpeculationWithAHeadGivesThePlainTokens) {
  for (const std::string& target_dir : {kLlama, kDeepSeek}) {
    SCOPED_TRACE(target_dir);
    const std::string head_dir = random_head(target_dir, "basalt_eagle_test_head", 5, target_dir == kDeepSeek);
    CpuBackend cpu;
    auto plain = load_model(target_dir, cpu);
    auto with_head = with_draft_head(load_model(target_dir, cpu), load_eagle_head(head_dir, cpu, target_dir));
    std::mt19937 rng(3);
    std::vector<EngineRequest> requests;
    for (int r = 0; r < 5; ++r) {
      EngineRequest q;
      std::uniform_int_distribution<int32_t> id(3, 200);
      for (int i = 0; i < 4 + 3 * r; ++i) q.prompt.push_back(id(rng));
      q.params.temperature = r % 2 == 0 ? 0.0f : 0.9f;
      q.params.seed = 10 + r;
      q.params.max_tokens = 12;
      q.params.ignore_eos = true;
      requests.push_back(q);
    }
    const std::vector<RequestOutput> expected = run(*plain, cpu, {}, requests);
    for (const int k : {1, 3}) {
      SpeculativeOptions eagle = speculative_options("eagle", k);
      eagle.adaptive_from_batch = 0;
      const std::vector<RequestOutput> got = run(*with_head, cpu, eagle, requests);
      int64_t drafts = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ(got[i].output_ids, expected[i].output_ids) << "k " << k << ", request " << i;
        drafts += got[i].usage.draft_tokens;
      }
      EXPECT_GT(drafts, 0) << "k " << k;
    }
    std::filesystem::remove_all(head_dir);
  }
}

TEST(EagleHead, LoadingErrorsNameTheProblem) {
  CpuBackend cpu;
  auto llama = load_model(kLlama, cpu);
  const std::string head_dir = random_head(kLlama, "basalt_eagle_test_errors", 6, false);
  // A head for a model of another hidden size.
  EXPECT_NE(error_of([&] { load_eagle_head(head_dir, cpu, std::string(BASALT_TESTDATA) + "/models/llama_bias"); })
                .find("hidden_size"),
            std::string::npos);
  // A head is not a model to serve, and a model is not a head.
  EXPECT_NE(error_of([&] { load_model(head_dir, cpu); }).find("is an EAGLE draft head"), std::string::npos);
  EXPECT_NE(error_of([&] { load_eagle_head(kLlama, cpu, kLlama); }).find("not an EAGLE draft head"),
            std::string::npos);
  // The engine refuses eagle speculation without a head.
  EngineOptions o;
  o.kv_slots = 64;
  o.speculative = speculative_options("eagle", 2);
  EXPECT_NE(error_of([&] { Engine engine(*llama, cpu, nullptr, o); }).find("no EAGLE head"), std::string::npos);
  std::filesystem::remove_all(head_dir);
}

}  // namespace
}  // namespace basalt
