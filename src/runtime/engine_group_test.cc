// The engines of DP-attention ranks behind one EngineGroup, on the CPU with
// ranks as threads: requests spread over the ranks give the tokens one
// engine over the whole model gives, n samples stay on one rank, metrics add
// up, and the merged KV-event stream is numbered without gaps, starts with a
// snapshot, and passes a block's removal on only when no rank holds it.
#include "runtime/engine_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "model/data_parallel.h"
#include "testing/engine_test_util.h"

namespace basalt {
namespace {

using testing::greedy;
using testing::request;
using testing::run_all;

const std::string kDeepseek = std::string(BASALT_TESTDATA) + "/models/deepseek_v3";

// A DP group over `world` ranks and an engine per rank, each sampling on a
// CPU backend of its own.
struct Ranks {
  explicit Ranks(int world, EngineOptions options = {}) {
    group = load_data_parallel(kDeepseek, world, [](int) { return make_cpu_backend_with_threads(1); });
    std::vector<std::unique_ptr<Engine>> engines;
    for (int r = 0; r < world; ++r) {
      samplers.push_back(std::make_unique<CpuBackend>());
      engines.push_back(std::make_unique<Engine>(group->rank(r), *samplers.back(), nullptr, options));
    }
    engines_group = std::make_unique<EngineGroup>(std::move(engines));
  }
  std::unique_ptr<DataParallelGroup> group;
  std::vector<std::unique_ptr<CpuBackend>> samplers;
  std::unique_ptr<EngineGroup> engines_group;  // stops its engines first
};

EngineOptions slots(int64_t n) {
  EngineOptions o;
  o.kv_slots = n;
  return o;
}

TEST(EngineGroup, RequestsOverTheRanksGiveWhatOneEngineGives) {
  CpuBackend backend;
  auto whole = load_model(kDeepseek, backend);
  Engine alone(*whole, backend, nullptr, slots(512));
  Ranks ranks(2, slots(256));
  std::vector<EngineRequest> requests;
  const auto prompts = testing::shared_prefix_prompts(6, 20, 7, 3);
  for (const auto& p : prompts) requests.push_back(request(p, greedy(5)));
  const std::vector<RequestOutput> want = run_all(alone, requests);
  const std::vector<RequestOutput> got = run_all(*ranks.engines_group, requests);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].output_ids, want[i].output_ids) << "request " << i;
  }
  // Submitted at once, with nothing cached yet, they spread over both ranks
  // (each within two requests of the other).
  const uint64_t on0 = ranks.engines_group->engine(0).metrics().requests_submitted;
  const uint64_t on1 = ranks.engines_group->engine(1).metrics().requests_submitted;
  EXPECT_EQ(on0 + on1, 6u);
  EXPECT_LE(on0 > on1 ? on0 - on1 : on1 - on0, 2u) << on0 << " and " << on1;
  // n samples all go to one rank.
  EngineRequest sampled = request(prompts[0], greedy(3));
  for (RequestHandle& h : ranks.engines_group->submit_n(sampled, 4)) EXPECT_EQ(collect(*h).output_ids.size(), 3u);
  const uint64_t after0 = ranks.engines_group->engine(0).metrics().requests_submitted;
  const uint64_t after1 = ranks.engines_group->engine(1).metrics().requests_submitted;
  EXPECT_TRUE((after0 == on0 + 4 && after1 == on1) || (after0 == on0 && after1 == on1 + 4));
  const EngineMetrics m = ranks.engines_group->metrics();
  EXPECT_EQ(m.requests_finished, 10u);
  EXPECT_EQ(m.kv_capacity, 512);
  EXPECT_EQ(ranks.engines_group->kv_capacity(), 512);
  EXPECT_EQ(m.ttft.count, 10u);
  EXPECT_EQ(m.output_tokens, 6u * 5u + 4u * 3u);
}

// A prompt whose prefix one rank has cached goes to that rank (its next
// turn finds the prefix), unless that rank is much busier than the other.
TEST(EngineGroup, APromptGoesWhereItsPrefixIsCached) {
  Ranks ranks(2, slots(256));
  EngineGroup& group = *ranks.engines_group;
  std::mt19937 rng(4);
  const std::vector<int32_t> turn1 = testing::random_ids(rng, 40);
  const RequestOutput first = collect(*group.submit(request(turn1, greedy(2))));
  ASSERT_TRUE(first.error.empty()) << first.error;
  const int holder = group.engine(0).metrics().requests_submitted == 1 ? 0 : 1;
  // The holder's KV events arrive on its delivery thread.
  for (int i = 0; i < 1000 && group.cached_prefix_blocks(holder, 0, turn1) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(group.cached_prefix_blocks(holder, 0, turn1), 2u);
  EXPECT_EQ(group.cached_prefix_blocks(1 - holder, 0, turn1), 0u);
  // The second turn (the first one's prompt and more), several times over:
  // each finds 32 of its tokens cached, on the holder.
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> turn2 = turn1;
    for (int32_t t : testing::random_ids(rng, 10)) turn2.push_back(t);
    const RequestOutput next = collect(*group.submit(request(turn2, greedy(2))));
    ASSERT_TRUE(next.error.empty()) << next.error;
    EXPECT_GE(next.usage.cached_prompt_tokens, 32) << i;
  }
  EXPECT_EQ(group.engine(holder).metrics().requests_submitted, 4u);
  EXPECT_EQ(group.engine(1 - holder).metrics().requests_submitted, 0u);
  // Another namespace shares nothing.
  EXPECT_EQ(group.cached_prefix_blocks(holder, 7, turn1), 0u);
}

TEST(EngineGroup, TheMergedKvEventsAreTheUnionOfTheRanksCaches) {
  Ranks ranks(2, slots(256));
  EngineGroup& group = *ranks.engines_group;
  using Index = std::set<std::pair<uint64_t, uint64_t>>;
  std::mutex mu;
  std::condition_variable changed;
  Index index;
  uint64_t seq = 0;
  bool in_order = true;
  size_t removals = 0;
  const uint64_t id = group.subscribe_kv_events([&](const KvEventBatch& b) {
    std::lock_guard<std::mutex> lock(mu);
    in_order &= b.seq == seq + 1 && b.snapshot == (b.seq == 1);
    seq = b.seq;
    for (const KvEvent& e : b.events)
      for (uint64_t h : e.block_hashes) {
        if (e.kind == KvEvent::Kind::kStored) {
          index.insert({e.ns, h});
        } else {
          in_order &= index.erase({e.ns, h}) == 1;
          ++removals;
        }
      }
    changed.notify_all();
  });
  // The same 40-token prompt on both ranks (requests alternate): both cache
  // its two 16-token blocks.
  std::mt19937 rng(9);
  const std::vector<int32_t> prompt = testing::random_ids(rng, 40);
  run_all(group, {request(prompt, greedy(2)), request(prompt, greedy(2))});
  const uint64_t first = kv_block_hash(0, 0, std::span<const int32_t>(prompt).first(16));
  auto wait_for = [&](const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(10), done);
  };
  EXPECT_TRUE(wait_for([&] { return index.count({0, first}) == 1; }));
  // Rank 0 lets go of them: rank 1 still holds them, nothing is removed.
  group.engine(0).drain_and_clear_cache();
  group.engine(0).metrics();  // a round trip through rank 0's scheduler: its events are out
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(removals, 0u);
    EXPECT_EQ(index.count({0, first}), 1u);
  }
  // Rank 1 too: now they are gone.
  group.engine(1).drain_and_clear_cache();
  EXPECT_TRUE(wait_for([&] { return index.empty(); }));
  group.unsubscribe_kv_events(id);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(in_order);
  EXPECT_GT(removals, 0u);
}

}  // namespace
}  // namespace basalt
