// Whole dense models on the GPU against the CPU backend, on the transformers
// fixtures of testdata/models (bf16, f16 and f32 weights; q/k/v biases,
// q/k norms, sliding windows): prefill logits of every fixture prompt, greedy
// continuations through the generator, and the continuous-batching engine
// running a crowd of requests on the GPU. Skips where no device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemv_kernels.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "testing/reference_test_util.h"
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

// A graphed batch of up to kGemvDefaultRowExactRows sequences is padded to
// no more than that: the GEMV computes such rows each as a one-row call
// does and more on the tensor cores, so padding across that line would
// round a replayed step otherwise than the same step launched directly
// (graph_padded_size's recorded sizes follow the line by hand).
TEST(CudaGraphs, PaddingNeverCrossesTheGemvsExactRows) {
  for (int64_t t = 1; t <= cuda_kernels::kGemvDefaultRowExactRows; ++t)
    EXPECT_LE(graph_padded_size(t, 256), cuda_kernels::kGemvDefaultRowExactRows) << t << " sequences";
}

// Decode steps replayed from CUDA graphs give the tokens the directly
// launched steps give: up to 16 rows every op computes a row the same way
// whatever the batch (the small-M GEMV, row-wise kernels), so padding changes
// nothing; beyond, cuBLASLt may choose another algorithm for the padded M.
TEST(CudaGraphs, ReplayedDecodeStepsMatchDirectOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = kModels + "llama";  // bf16 weights, the GPU's usual case
  CudaBackend gpu;
  auto direct = load_model(dir, gpu);
  auto graphed = make_graphed_model(load_model(dir, gpu), gpu, {.max_batch = 32});
  for (const int count : {5, 21}) {
    std::mt19937 rng(11 + count);
    std::vector<EngineRequest> requests;
    for (int r = 0; r < count; ++r) {
      EngineRequest q;
      std::uniform_int_distribution<int32_t> id(2, 300);
      const int n = 2 + (r * 7) % 30;
      for (int i = 0; i < n; ++i) q.prompt.push_back(id(rng));
      q.params.temperature = r % 3 == 0 ? 0.0f : 0.9f;
      q.params.top_p = r % 3 == 2 ? 0.9f : 1.0f;
      q.params.seed = 500 + r;
      q.params.max_tokens = 10 + r % 7;
      q.params.ignore_eos = true;
      requests.push_back(q);
    }
    std::vector<RequestOutput> outputs[2];
    for (int which = 0; which < 2; ++which) {
      EngineOptions o;
      o.eos_ids = direct->config().eos_token_ids;
      o.kv_slots = 4096;
      o.overlap = which == 1;  // the graphs are recorded and replayed on the executor thread
      o.check_invariants = true;
      Engine engine(which == 0 ? *direct : *graphed, gpu, nullptr, o);
      // prepare() has recorded sizes 1, 2, 4, 5, 8, 16, 24 and 32 (unless this
      // engine's KV storage reuses the previous one's memory, when the
      // graphs recorded for that still hold); serving records nothing more.
      const int64_t recorded = graph_stats(*graphed).recordings;
      if (which == 1) {
        EXPECT_TRUE(recorded == 8 || recorded == 16) << recorded;
      }
      std::vector<RequestHandle> handles;
      for (const EngineRequest& q : requests) handles.push_back(engine.submit(q));
      for (RequestHandle& h : handles) outputs[which].push_back(collect(*h));
      EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
      EXPECT_EQ(graph_stats(*graphed).recordings, recorded);
    }
    int same = 0;
    for (int r = 0; r < count; ++r) {
      ASSERT_EQ(outputs[1][r].reason, FinishReason::kLength) << outputs[1][r].error;
      same += outputs[0][r].output_ids == outputs[1][r].output_ids;
    }
    if (count <= 16) {
      EXPECT_EQ(same, count);
    } else {
      EXPECT_GE(same, count - 2) << "of " << count;
    }
  }
  const GraphStats stats = graph_stats(*graphed);
  EXPECT_GT(stats.replays, 20);
  EXPECT_GT(stats.direct, 0);  // the prefills
  EXPECT_EQ(graph_stats(*direct).replays, 0);
}

// One padded decode batch, directly: the rows of the real sequences equal an
// unpadded direct forward bit for bit (3 rows run as a recorded 4-row batch).
TEST(CudaGraphs, PaddedRowsDoNotDisturbRealOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = kModels + "qwen3";  // q/k norms through the fused qkv kernel
  CudaBackend gpu;
  auto direct = load_model(dir, gpu);
  auto graphed = make_graphed_model(load_model(dir, gpu), gpu);
  const int64_t V = direct->config().vocab_size;
  KvBuffers kv_a = direct->allocate_kv(64, DType::kBF16), kv_b = graphed->allocate_kv(64, DType::kBF16);
  // Three sequences with 5, 9 and 2 cached tokens (slots 0.., 20.., 40..),
  // prefilled first, then one decode step each, three times.
  const std::vector<int> lengths = {5, 9, 2};
  for (Model* m : {direct.get(), graphed.get()}) {
    KvBuffers& kv = m == direct.get() ? kv_a : kv_b;
    for (size_t s = 0; s < lengths.size(); ++s) {
      std::vector<int32_t> ids, positions, slots, rows;
      for (int p = 0; p < lengths[s]; ++p) {
        ids.push_back(3 + p * 11 + static_cast<int32_t>(s));
        positions.push_back(p);
        slots.push_back(static_cast<int32_t>(20 * s) + p);
      }
      ForwardBatch b;
      b.token_ids = Tensor::from_i32({lengths[s]}, ids);
      b.positions = Tensor::from_i32({lengths[s]}, positions);
      b.out_slots = Tensor::from_i32({lengths[s]}, slots);
      b.attention.q_start = Tensor::from_i32({2}, std::vector<int32_t>{0, lengths[s]});
      b.attention.kv_start = Tensor::from_i32({2}, std::vector<int32_t>{0, lengths[s]});
      b.attention.kv_slots = Tensor::from_i32({lengths[s]}, slots);
      b.logit_rows = Tensor::from_i32({1}, std::vector<int32_t>{lengths[s] - 1});
      Tensor logits = gpu.empty({1, V}, DType::kF32);
      m->forward(b, kv, logits);
    }
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, rows;
    for (size_t s = 0; s < lengths.size(); ++s) {
      const int len = lengths[s] + step;
      ids.push_back(7 + step + static_cast<int32_t>(s));
      positions.push_back(len);
      out_slots.push_back(static_cast<int32_t>(20 * s) + len);
      for (int p = 0; p <= len; ++p) kv_slots.push_back(static_cast<int32_t>(20 * s) + p);
      q_start.push_back(static_cast<int32_t>(s + 1));
      kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
      rows.push_back(static_cast<int32_t>(s));
    }
    const ForwardBatch b = host_forward_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, rows);
    Tensor want = gpu.empty({3, V}, DType::kF32), got = gpu.empty({3, V}, DType::kF32);
    direct->forward(b, kv_a, want);
    graphed->forward(b, kv_b, got);
    const Tensor w = cuda_to_host(want), g = cuda_to_host(got);
    EXPECT_EQ(std::memcmp(w.raw(), g.raw(), w.nbytes()), 0) << "step " << step;
  }
  EXPECT_EQ(graph_stats(*graphed).replays, 3);
  EXPECT_EQ(graph_stats(*graphed).recordings, 1);
}

}  // namespace
}  // namespace basalt
