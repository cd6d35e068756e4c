// Whole dense models on the GPU against the CPU backend, on the transformers
// fixtures of testdata/models (bf16, f16 and f32 weights; q/k/v biases,
// q/k norms, sliding windows): prefill logits of every fixture prompt, greedy
// continuations through the generator, and the continuous-batching engine
// running a crowd of requests on the GPU. Skips where no device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "model/model.h"
#include "model/reference_test_util.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/generator.h"

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

class CudaModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// f32-weight fixtures multiply in f32; the others round activations to the
// weights' 16-bit type before each GEMM.
double logit_tolerance(const std::string& name) { return name == "llama_bias" ? 1e-4 : 2e-2; }

TEST_P(CudaModel, PrefillLogitsMatchTheCpuBackend) {
  const std::string dir = kModels + GetParam();
  CpuBackend cpu;
  CudaBackend gpu;
  auto cpu_model = load_model(dir, cpu);
  auto gpu_model = load_model(dir, gpu);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const nlohmann::json meta = testing::read_json(dir + "/reference.json");
  const int64_t V = cpu_model->config().vocab_size;
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
    const Tensor got = cuda_to_host(gpu_logits);
    EXPECT_LT(testing::relative_error(got, cpu_logits), logit_tolerance(GetParam()))
        << GetParam() << " prompt length " << n;
  }
}

TEST_P(CudaModel, GreedyDecodeFollowsTransformers) {
  CudaBackend gpu;
  auto model = load_model(kModels + GetParam(), gpu);
  // Past a near-tie of the reference (where 16-bit rounding may pick the
  // other token) the two continuations may part.
  testing::expect_greedy_matches_reference(*model, gpu, kModels + GetParam(), /*min_margin=*/0.02,
                                           /*min_compared=*/4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel,
                         ::testing::Values("llama", "llama_bias", "mistral", "qwen2", "qwen3"));

TEST(CudaEngine, ACrowdOnTheGpuMatchesTheCpuEngine) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = kModels + "llama_bias";  // f32 weights: the GPU and CPU agree closely
  CpuBackend cpu;
  CudaBackend gpu;
  auto cpu_model = load_model(dir, cpu);
  auto gpu_model = load_model(dir, gpu);
  std::mt19937 rng(7);
  std::vector<EngineRequest> requests;
  for (int r = 0; r < 12; ++r) {
    EngineRequest q;
    std::uniform_int_distribution<int32_t> id(2, 300);
    const int n = 3 + r * 5;
    for (int i = 0; i < n; ++i) q.prompt.push_back(id(rng));
    q.params.temperature = r % 2 == 0 ? 0.0f : 0.8f;
    q.params.seed = 100 + r;
    q.params.max_tokens = 12;
    q.params.ignore_eos = true;
    requests.push_back(q);
  }
  std::vector<RequestOutput> outputs[2];
  for (int device = 0; device < 2; ++device) {
    EngineOptions o;
    // Set explicitly: gcc 12 at -O1 with the sanitizers warns, wrongly, that
    // copying a disengaged optional<vector> reads it uninitialised.
    o.eos_ids = cpu_model->config().eos_token_ids;
    o.kv_slots = 2048;
    o.step_token_budget = 48;  // chunked prefill
    o.check_invariants = true;
    Engine engine(device == 0 ? *cpu_model : *gpu_model, device == 0 ? static_cast<Backend&>(cpu) : gpu, nullptr,
                  o);
    std::vector<RequestHandle> handles;
    for (const EngineRequest& q : requests) handles.push_back(engine.submit(q));
    for (RequestHandle& h : handles) outputs[device].push_back(collect(*h));
    EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  }
  int same = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    ASSERT_EQ(outputs[1][r].reason, FinishReason::kLength) << outputs[1][r].error;
    same += outputs[0][r].output_ids == outputs[1][r].output_ids;
  }
  // f32 GEMMs on both sides: near-ties aside, the same tokens.
  EXPECT_GE(same, 10) << "of 12 requests";
}

}  // namespace
}  // namespace basalt
