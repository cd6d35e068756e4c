// DeepSeek V2/V3 models on the GPU: the DeepSeek fixtures of testdata/models
// (bf16 weights; block FP8 with partial 128-blocks) against the CPU backend
// and transformers, both MLA forms, the bundled model's greedy text, and
// decode steps replayed from CUDA graphs (routing, the experts and MLA all
// recorded). Skips where no device is present.
//
// Tolerances. The bf16 fixtures differ from the CPU backend by the GPU's
// 16-bit rounding of activations into cuBLASLt GEMMs and bf16 tensor-core
// attention (the dense fixtures' 2e-2). The FP8 fixture also quantizes every
// linear layer's activations to e4m3 per 1x128 group, as DeepSeek-V3's
// inference does, where the CPU backend and transformers multiply the f32
// activations: e4m3 keeps 3 mantissa bits, so each activation moves by up to
// 2^-4 of itself (about 2-3% RMS over a row), and a layer's outputs by about
// as much relative to their size; over the fixture's layers the logits stay
// within 1e-1 of the CPU backend's (norm-wise).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "model/deepseek_v3.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "model/reference_test_util.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/engine_test_util.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";
const std::string kRoot = std::string(BASALT_TESTDATA) + "/..";

bool is_fp8(const std::string& name) { return name.find("fp8") != std::string::npos; }

DeepseekModel& as_deepseek(Model& model) { return dynamic_cast<DeepseekModel&>(model); }

class CudaDeepseek : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Every fixture prompt, all positions' logits, in each MLA form (absorbed runs
// the latent-cache attention kernel on prefill-shaped batches too).
TEST_P(CudaDeepseek, PrefillLogitsMatchTheCpuBackend) {
  const std::string dir = kModels + GetParam();
  CpuBackend cpu;
  CudaBackend gpu;
  auto cpu_model = load_model(dir, cpu);
  auto gpu_model = load_model(dir, gpu);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const nlohmann::json meta = testing::read_json(dir + "/reference.json");
  const int64_t V = cpu_model->config().vocab_size;
  const double tolerance = is_fp8(GetParam()) ? 1e-1 : 2e-2;
  for (const MlaForm form : {MlaForm::kExpanded, MlaForm::kAbsorbed}) {
    as_deepseek(*gpu_model).set_mla_form(form);
    as_deepseek(*cpu_model).set_mla_form(form);
    for (size_t p = 0; p < meta["prompt_lengths"].size(); ++p) {
      const Tensor ids = ref.tensor("prompt_" + std::to_string(p) + ".ids");
      const std::span<const int32_t> tokens(ids.data<const int32_t>(), static_cast<size_t>(ids.numel()));
      const int64_t n = ids.numel();
      const ForwardBatch batch = single_sequence_batch(tokens, 0, /*all_logits=*/true);
      KvBuffers cpu_kv = cpu_model->allocate_kv(n), gpu_kv = gpu_model->allocate_kv(n);
      Tensor cpu_logits = Tensor::empty({n, V}, DType::kF32);
      cpu_model->forward(batch, cpu_kv, cpu_logits);
      Tensor gpu_logits = gpu.empty({n, V}, DType::kF32);
      gpu_model->forward(batch, gpu_kv, gpu_logits);
      const double error = testing::relative_error(cuda_to_host(gpu_logits), cpu_logits);
      EXPECT_LT(error, tolerance) << GetParam() << " prompt length " << n << " form "
                                  << (form == MlaForm::kAbsorbed ? "absorbed" : "expanded");
      std::printf("[ deepseek ] %s form %s prompt %zu: relative error %.3g\n", GetParam().c_str(),
                  form == MlaForm::kAbsorbed ? "absorbed" : "expanded", p, error);
    }
  }
}

// Greedy decode (prefill in the expanded form, then absorbed decode steps) up
// to the first near-tie of the reference. The FP8 fixture's tokens may part
// earlier (quantized activations, see the header): it is held to the steps
// whose margin is at least 0.1.
TEST_P(CudaDeepseek, GreedyDecodeFollowsTransformers) {
  CudaBackend gpu;
  auto model = load_model(kModels + GetParam(), gpu);
  if (is_fp8(GetParam())) {
    testing::expect_greedy_matches_reference(*model, gpu, kModels + GetParam(), /*min_margin=*/0.1,
                                             /*min_compared=*/1);
  } else {
    testing::expect_greedy_matches_reference(*model, gpu, kModels + GetParam(), /*min_margin=*/0.02,
                                             /*min_compared=*/4);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDeepseek,
                         ::testing::Values("deepseek_v2_lite", "deepseek_v3", "deepseek_v3_fp8"));

// The bundled model (a small DeepSeek-V3) on the GPU writes the text
// transformers writes (testdata/bundled, from the committed bf16 weights), up
// to the first step where the reference's top two are within 0.02.
TEST(CudaBundled, GreedyTextMatchesTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = kRoot + "/models/basalt-mini";
  CudaBackend gpu;
  auto model = load_model(dir, gpu);
  const Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  const nlohmann::json meta = testing::read_json(kRoot + "/testdata/bundled/basalt-mini.json");
  for (size_t p = 0; p < meta["greedy"].size(); ++p) {
    const nlohmann::json& g = meta["greedy"][p];
    const std::vector<int32_t> ids = tokenizer.encode(g["prompt"].get<std::string>(), true);
    ASSERT_EQ(ids, g["prompt_ids"].get<std::vector<int32_t>>()) << g["prompt"];
    const std::vector<int32_t> want = g["output_ids"].get<std::vector<int32_t>>();
    const std::vector<double> margins = g["margins"].get<std::vector<double>>();
    GenerateOptions options;
    options.max_tokens = static_cast<int>(want.size());
    options.temperature = 0.0f;
    options.ignore_eos = true;
    const GenerateResult got = generate(*model, gpu, ids, options);
    ASSERT_EQ(got.output_ids.size(), want.size());
    size_t compared = 0;
    for (size_t i = 0; i < want.size() && margins[i] >= 0.02; ++i, ++compared)
      EXPECT_EQ(got.output_ids[i], want[i]) << "prompt " << p << " step " << i;
    EXPECT_GE(compared, 8u) << "too few comparable steps";
    EXPECT_EQ(tokenizer.decode(std::span(got.output_ids).first(compared), false),
              tokenizer.decode(std::span(want).first(compared), false));
  }
}

// A crowd of requests through the engine twice on the GPU: launched directly
// and replayed from CUDA graphs (prepare() records every decode size up
// front; the MoE and MLA ops run inside the capture). Greedy and seeded
// tokens agree but where a padded batch changes a kernel's choice near a tie.
TEST(CudaDeepseekGraphs, ReplayedDecodeStepsMatchDirectOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string name : {"deepseek_v3", "deepseek_v3_fp8"}) {
    const std::string dir = kModels + name;
    CudaBackend gpu;
    auto direct = load_model(dir, gpu);
    auto graphed = make_graphed_model(load_model(dir, gpu), gpu, {.max_batch = 16});
    std::mt19937 rng(5);
    std::vector<EngineRequest> requests;
    for (int r = 0; r < 9; ++r) {
      EngineRequest q;
      std::uniform_int_distribution<int32_t> id(2, 200);
      const int n = 2 + (r * 5) % 23;
      for (int i = 0; i < n; ++i) q.prompt.push_back(id(rng));
      q.params.temperature = r % 2 == 0 ? 0.0f : 0.9f;
      q.params.seed = 40 + r;
      q.params.max_tokens = 8 + r % 5;
      q.params.ignore_eos = true;
      requests.push_back(q);
    }
    std::vector<RequestOutput> outputs[2];
    for (int which = 0; which < 2; ++which) {
      EngineOptions o;
      o.eos_ids = direct->config().eos_token_ids;
      o.kv_slots = 1024;
      o.check_invariants = true;
      Engine engine(which == 0 ? *direct : *graphed, gpu, nullptr, o);
      const int64_t recorded = graph_stats(*graphed).recordings;
      if (which == 1) {
        EXPECT_GT(recorded, 0) << name;
      }
      outputs[which] = testing::run_all(engine, requests);
      EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
      EXPECT_EQ(graph_stats(*graphed).recordings, recorded) << name << ": recorded while serving";
    }
    int same = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      ASSERT_EQ(outputs[1][r].reason, FinishReason::kLength) << outputs[1][r].error;
      same += outputs[0][r].output_ids == outputs[1][r].output_ids;
    }
    EXPECT_GE(same, 8) << name << ": of 9 requests";
    EXPECT_GT(graph_stats(*graphed).replays, 10) << name;
  }
}

}  // namespace
}  // namespace basalt
