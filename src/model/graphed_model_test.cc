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
#include "runtime/speculative.h"
#include "testing/replaying_backend.h"

namespace basalt {
namespace {

const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";
const std::string kDeepSeek = std::string(BASALT_TESTDATA) + "/models/deepseek_v3";

using testing::ReplayingCpuBackend;

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

std::vector<std::vector<int32_t>> run(Model& model, Backend& backend, const std::vector<EngineRequest>& requests,
                                      const SpeculativeOptions& speculative = {}, std::vector<Usage>* usage = nullptr) {
  EngineOptions o;
  o.speculative = speculative;
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
    if (usage != nullptr) usage->push_back(r.usage);
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
  // Sizes 1, 2, 4, 5, 8 and 12 (16 capped at max_batch), all in prepare().
  EXPECT_EQ(stats.recordings, 6);
  EXPECT_EQ(replaying.recordings, 6);
  EXPECT_GT(stats.replays, 10);
  EXPECT_GT(stats.direct, 0);  // the prefills
}

// Verification steps (a sequence's last token and its drafts, the same
// number of rows for every sequence) are recorded per (sequences, rows)
// when first met, and replayed after; steps whose sequences verify
// different numbers of drafts run directly. The tokens are plain decoding's.
TEST(GraphedModel, VerificationStepsAreRecordedByRowsPerSequence) {
  CpuBackend cpu;
  ReplayingCpuBackend replaying;
  auto plain = load_model(kLlama, cpu);
  auto graphed = make_graphed_model(load_model(kLlama, replaying), replaying, {.max_batch = 12});
  std::vector<EngineRequest> requests = crowd(3);
  for (EngineRequest& q : requests) {  // greedy and long: a random model's text loops, and n-gram lookup drafts
    q.params.temperature = 0.0f;
    q.params.max_tokens = 48;
  }
  SpeculativeOptions ngram = speculative_options("ngram", 3);
  ngram.ngram_min = 1;
  ngram.adaptive_from_batch = 0;  // always 3 drafts where the lookup finds 3
  const auto expected = run(*plain, cpu, requests);
  EXPECT_EQ(run(*graphed, replaying, requests, ngram), expected);
  // One request alone: its verification steps have one shape each.
  const std::vector<EngineRequest> one(requests.begin(), requests.begin() + 1);
  EXPECT_EQ(run(*graphed, replaying, one, ngram)[0], expected[0]);
  const GraphStats stats = graph_stats(*graphed);
  EXPECT_GT(stats.recordings, 6) << "direct " << stats.direct << " replays " << stats.replays;
  EXPECT_GT(stats.replays, stats.recordings);
  EXPECT_EQ(replaying.recordings, stats.recordings);
}

// MTP's steps keep the final hidden states for the draft head: those are
// recorded too (a shape of their own), decode and verification alike.
TEST(GraphedModel, StepsThatKeepHiddenStatesAreRecorded) {
  CpuBackend cpu;
  ReplayingCpuBackend replaying;
  auto plain = load_model(kDeepSeek, cpu);
  auto graphed = make_graphed_model(load_model(kDeepSeek, replaying), replaying, {.max_batch = 8});
  std::vector<EngineRequest> requests = crowd(2);
  for (EngineRequest& q : requests) q.params.max_tokens = 16;
  const auto expected = run(*plain, cpu, requests);
  EXPECT_EQ(run(*graphed, replaying, requests, speculative_options("mtp", 2)), expected);
  const std::vector<EngineRequest> one(requests.begin(), requests.begin() + 1);
  EXPECT_EQ(run(*graphed, replaying, one, speculative_options("mtp", 2))[0], expected[0]);
  const GraphStats stats = graph_stats(*graphed);
  EXPECT_GT(stats.recordings, 5) << "direct " << stats.direct << " replays " << stats.replays;  // 1, 2, 4, 5, 8, then more
  EXPECT_GT(stats.replays, stats.recordings);
}

// The draft head (MTP) is graphed with its model: its passes over a step
// whose sequences all have the same rows, and its chained passes, replay
// recordings. It drafts what the plain head drafts (the CPU is batch
// invariant): the same drafts accepted, step for step.
TEST(GraphedModel, DraftHeadStepsAreRecordedAndDraftWhatThePlainHeadDrafts) {
  CpuBackend cpu;
  ReplayingCpuBackend replaying;
  auto plain = load_model(kDeepSeek, cpu);
  auto graphed = make_graphed_model(load_model(kDeepSeek, replaying), replaying, {.max_batch = 8});
  ASSERT_NE(graphed->draft_head(), nullptr);
  std::vector<EngineRequest> requests = crowd(3);
  for (EngineRequest& q : requests) q.params.max_tokens = 20;
  for (const int k : {1, 3}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    SpeculativeOptions mtp = speculative_options("mtp", k);
    mtp.adaptive_from_batch = 0;
    std::vector<Usage> expected_usage, usage;
    const auto expected = run(*plain, cpu, requests, mtp, &expected_usage);
    const GraphStats before = graph_stats(*graphed);
    EXPECT_EQ(run(*graphed, replaying, requests, mtp, &usage), expected);
    ASSERT_EQ(usage.size(), expected_usage.size());
    int64_t drafts = 0;
    for (size_t i = 0; i < usage.size(); ++i) {
      EXPECT_EQ(usage[i].draft_tokens, expected_usage[i].draft_tokens) << i;
      EXPECT_EQ(usage[i].accepted_tokens, expected_usage[i].accepted_tokens) << i;
      drafts += usage[i].draft_tokens;
    }
    EXPECT_GT(drafts, 0);
    const GraphStats after = graph_stats(*graphed);
    EXPECT_GT(after.head_recordings, before.head_recordings);
    EXPECT_GT(after.head_replays - before.head_replays, after.head_recordings - before.head_recordings);
    EXPECT_GT(after.head_direct, before.head_direct);  // the prompts' passes
  }
  EXPECT_EQ(graph_stats(*plain).head_replays, 0);
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
