// Tensor parallelism on the GPU: every rank a CUDA backend, here all on one
// GPU, their collectives through the in-process group (which stages device
// tensors through host memory; NCCL refuses two ranks on one GPU). The
// dense fixtures and DeepSeek's over 2 and 4 ranks against one GPU (the
// prefill logits, within the 16-bit rounding tolerance of the GPU tests)
// and against transformers (greedy, with rank 0 on the sampling backend);
// and NCCL's world of one through the same path. Skips where no device is
// present.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"
#include "testing/backend_test_util.h"
#include "testing/engine_test_util.h"
#include "testing/reference_test_util.h"
#ifdef BASALT_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

struct Case {
  std::string model;
  int world;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " over " << c.world << " GPU ranks"; }

class CudaTensorParallel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::unique_ptr<Model> over_gpu_ranks(const std::string& dir, int world, Backend* first = nullptr,
                                      const RankGroupFactory& group = {}) {
  return load_tensor_parallel(dir, world, [](int) { return std::make_unique<CudaBackend>(0); }, {}, first, group);
}

// Every fixture prompt's logits: the ranks against one GPU.
void expect_prefill_like_one_gpu(Model& ranks, const std::string& name, CudaBackend& gpu) {
  const std::string dir = kModels + name;
  auto one = load_model(dir, gpu);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const nlohmann::json meta = testing::read_json(dir + "/reference.json");
  const int64_t V = one->config().vocab_size;
  for (size_t p = 0; p < meta["prompt_lengths"].size(); ++p) {
    const Tensor ids = ref.tensor("prompt_" + std::to_string(p) + ".ids");
    const std::span<const int32_t> tokens(ids.data<const int32_t>(), static_cast<size_t>(ids.numel()));
    const int64_t n = ids.numel();
    const ForwardBatch batch = single_sequence_batch(tokens, 0, /*all_logits=*/true);
    KvBuffers one_kv = one->allocate_kv(n), ranks_kv = ranks.allocate_kv(n);
    Tensor want = gpu.empty({n, V}, DType::kF32), got = gpu.empty({n, V}, DType::kF32);
    one->forward(batch, one_kv, want);
    ranks.forward(batch, ranks_kv, got);
    EXPECT_LT(testing::relative_error(cuda_to_host(got), cuda_to_host(want)), name == "llama_bias" ? 1e-4 : 2e-2)
        << name << ", prompt length " << n;
  }
}

TEST_P(CudaTensorParallel, PrefillLogitsMatchOneGpu) {
  const auto [name, world] = GetParam();
  CudaBackend gpu;  // rank 0's backend: the logits it writes are in its stream
  auto ranks = over_gpu_ranks(kModels + name, world, &gpu);
  expect_prefill_like_one_gpu(*ranks, name, gpu);
}

TEST_P(CudaTensorParallel, GreedyDecodeFollowsTransformers) {
  const auto [name, world] = GetParam();
  CudaBackend gpu;  // samples, and is rank 0's backend
  auto ranks = over_gpu_ranks(kModels + name, world, &gpu);
  testing::expect_greedy_matches_reference(*ranks, gpu, kModels + name, /*min_margin=*/0.02, /*min_compared=*/4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallel,
                         ::testing::Values(Case{"llama", 2}, Case{"llama", 4}, Case{"llama_bias", 2},
                                           Case{"mistral", 4}, Case{"qwen2", 2}, Case{"qwen3", 4},
                                           Case{"deepseek_v2_lite", 2}, Case{"deepseek_v3", 2},
                                           Case{"deepseek_v3", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model + "_tp" + std::to_string(info.param.world);
                         });

#ifdef BASALT_HAVE_NCCL
std::vector<std::unique_ptr<Communicator>> nccl_group(std::span<Backend* const> backends) {
  std::vector<CudaBackend*> gpus;
  for (Backend* b : backends) gpus.push_back(dynamic_cast<CudaBackend*>(b));
  return make_nccl_group(gpus);
}

// NCCL's world of one: the collectives the layouts call (all-reduce after
// the attention and the MLP) run through NCCL on the one GPU.
TEST(CudaTensorParallelNccl, AWorldOfOneThroughNcclMatchesOneGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const RankGroupFactory nccl = nccl_group;
  for (const char* name : {"qwen3", "deepseek_v3"}) {
    CudaBackend gpu;
    auto ranks = over_gpu_ranks(kModels + name, 1, &gpu, nccl);
    expect_prefill_like_one_gpu(*ranks, name, gpu);
    testing::expect_greedy_matches_reference(*ranks, gpu, kModels + name, 0.02, 4);
  }
}

// Graphs per rank: over NCCL each rank records its own CUDA graphs with its
// collectives inside (prepare() every decode size, then verification and
// MTP-head shapes as they come), and an engine over them writes the tokens
// of one graphed GPU, bit for bit (a world of one's all-reduce adds
// nothing; the padded shapes, so the kernels, are the same). The in-process
// group, which stages through the host, is left eager.
TEST(CudaTensorParallelNccl, GraphsPerRankRecordTheirCollectivesAndReplay) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const RankGroupFactory nccl = nccl_group;
  const GraphOptions graphs{.max_batch = 8};
  for (const char* name : {"qwen3", "deepseek_v3"}) {
    const bool mtp = std::string(name) == "deepseek_v3";
    CudaBackend gpu;
    auto ranks = load_tensor_parallel(kModels + name, 1, [](int) { return std::make_unique<CudaBackend>(0); }, {},
                                      &gpu, nccl, Weights::kCheckpoint, graphs);
    ASSERT_TRUE(tensor_parallel_graphed(*ranks)) << name;
    auto one = make_graphed_model(load_model(kModels + name, gpu), gpu, graphs);
    std::mt19937 rng(17);
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 5; ++i) {
      const std::vector<int32_t> motif = testing::random_ids(rng, 3 + static_cast<size_t>(i));
      std::vector<int32_t> prompt;
      for (int rep = 0; rep < 3; ++rep) prompt.insert(prompt.end(), motif.begin(), motif.end());
      SamplingParams p = testing::greedy(12);
      p.ignore_eos = true;
      requests.push_back(testing::request(std::move(prompt), p));
    }
    std::vector<RequestOutput> outputs[2];
    for (int which = 0; which < 2; ++which) {
      EngineOptions o;
      o.kv_slots = 1024;
      o.check_invariants = true;
      if (mtp) o.speculative = speculative_options("mtp", 1);
      Engine engine(which == 0 ? *ranks : *one, gpu, nullptr, o);
      outputs[which].push_back(testing::run_all(engine, {requests[0]})[0]);  // alone: batch 1
      const auto rest = testing::run_all(engine, std::vector<EngineRequest>(requests.begin() + 1, requests.end()));
      outputs[which].insert(outputs[which].end(), rest.begin(), rest.end());
      EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
    }
    for (size_t i = 0; i < requests.size(); ++i)
      EXPECT_EQ(outputs[0][i].output_ids, outputs[1][i].output_ids) << name << ", request " << i;
    const GraphStats rank0 = tensor_parallel_graph_stats(*ranks, 0);
    EXPECT_GE(rank0.recordings, 5) << name << ": prepare() records sizes 1, 2, 4, 5 and 8";
    EXPECT_GT(rank0.replays, 10) << name;
    if (mtp) {
      EXPECT_GT(rank0.head_replays, 5) << name;
    }
  }
  // The in-process group cannot record: its ranks stay eager.
  CudaBackend gpu;
  auto local = load_tensor_parallel(kModels + "qwen3", 2, [](int) { return std::make_unique<CudaBackend>(0); }, {},
                                    &gpu, {}, Weights::kCheckpoint, graphs);
  EXPECT_FALSE(tensor_parallel_graphed(*local));
}
#endif

}  // namespace
}  // namespace basalt
