// GraphedModel on the CPU: a backend whose record() keeps the ops and whose
// replay() runs them again stands in for CUDA graphs, so the wrapper's own
// logic (which batches qualify, padding to the recorded sizes, static inputs,
// recording everything in prepare(), logits handed back) is checked against
// the plain model through the engine. The CPU backend is batch invariant, so
// padded steps must give exactly the unpadded tokens. The CUDA graphs
// themselves are tested on the GPU (model/cuda_model_test.cc).
#include "model/graphed_model.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "runtime/engine.h"

namespace basalt {
namespace {

const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";

class ReplayingCpuBackend final : public CpuBackend {
 public:
  std::unique_ptr<RecordedOps> record(const std::function<void()>& ops) override {
    class Replay final : public RecordedOps {
     public:
      explicit Replay(std::function<void()> ops) : ops_(std::move(ops)) {}
      void replay() override { ops_(); }

     private:
      std::function<void()> ops_;
    };
    ++recordings;
    return std::make_unique<Replay>(ops);
  }
  bool can_record() const override { return true; }
  int recordings = 0;
};

std::vector<EngineRequest> crowd(int count) {
  std::mt19937 rng(41);
  std::vector<EngineRequest> requests;
  for (int r = 0; r < count; ++r) {
    EngineRequest q;
    std::uniform_int_distribution<int32_t> id(2, 300);
    for (int i = 0; i < 3 + (r * 5) % 17; ++i) q.prompt.push_back(id(rng));
    q.params.temperature = r % 2 == 0 ? 0.0f : 0.8f;
    q.params.seed = 70 + r;
    q.params.max_tokens = 6 + r % 9;
    q.params.ignore_eos = true;
    requests.push_back(q);
  }
  return requests;
}

std::vector<std::vector<int32_t>> run(Model& model, Backend& backend, const std::vector<EngineRequest>& requests) {
  EngineOptions o;
  o.eos_ids = model.config().eos_token_ids;
  o.kv_slots = 1024;
  o.check_invariants = true;
  Engine engine(model, backend, nullptr, o);
  std::vector<RequestHandle> handles;
  for (const EngineRequest& q : requests) handles.push_back(engine.submit(q));
  std::vector<std::vector<int32_t>> out;
  for (RequestHandle& h : handles) {
    const RequestOutput r = collect(*h);
    EXPECT_EQ(r.reason, FinishReason::kLength) << r.error;
    out.push_back(r.output_ids);
  }
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  return out;
}

TEST(GraphedModel, ReplayedStepsEqualPlainOnesAndAllSizesAreRecordedUpFront) {
  CpuBackend cpu;
  ReplayingCpuBackend replaying;
  auto plain = load_model(kLlama, cpu);
  auto graphed = make_graphed_model(load_model(kLlama, replaying), replaying, {.max_batch = 12});
  const std::vector<EngineRequest> requests = crowd(11);
  EXPECT_EQ(run(*graphed, replaying, requests), run(*plain, cpu, requests));
  const GraphStats stats = graph_stats(*graphed);
  // Sizes 1, 2, 4, 8 and 12 (16 capped at max_batch), all in prepare().
  EXPECT_EQ(stats.recordings, 5);
  EXPECT_EQ(replaying.recordings, 5);
  EXPECT_GT(stats.replays, 10);
  EXPECT_GT(stats.direct, 0);  // the prefills
}

TEST(GraphedModel, BatchesBeyondMaxBatchRunDirectly) {
  ReplayingCpuBackend replaying;
  CpuBackend cpu;
  auto plain = load_model(kLlama, cpu);
  auto graphed = make_graphed_model(load_model(kLlama, replaying), replaying, {.max_batch = 2});
  const std::vector<EngineRequest> requests = crowd(5);
  EXPECT_EQ(run(*graphed, replaying, requests), run(*plain, cpu, requests));
  EXPECT_EQ(graph_stats(*graphed).recordings, 2);  // sizes 1 and 2
}

TEST(GraphedModel, ABackendWithoutRecordingRunsEverythingDirectly) {
  CpuBackend cpu;
  auto plain = load_model(kLlama, cpu);
  auto graphed = make_graphed_model(load_model(kLlama, cpu), cpu);
  const std::vector<EngineRequest> requests = crowd(4);
  EXPECT_EQ(run(*graphed, cpu, requests), run(*plain, cpu, requests));
  EXPECT_EQ(graph_stats(*graphed).recordings, 0);
  EXPECT_EQ(graph_stats(*graphed).replays, 0);
  EXPECT_EQ(graph_stats(*plain).direct, 0);  // not a GraphedModel
}

}  // namespace
}  // namespace basalt
