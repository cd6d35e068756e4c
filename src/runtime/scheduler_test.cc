// The scheduler alone, with a fake model runner and no threads: random
// request streams (shared prefixes, priorities, cancellations), small KV
// pools that force preemption, page sizes, chunked prefill and the overlap
// order (step N+1 planned before step N's results), with the scheduler's
// invariants checked after every call.
//
// The fake runner is a model whose "KV" is a hash chain: the entry written
// for position p holds p and a hash of every token up to p, read back from
// the entry of position p - 1 through the slots the plan names. Its next
// token is a function of that hash. So a request's output depends on its
// whole prefix as the KV holds it: a wrong slot, a stale cache entry or a
// wrongly shared page changes the output, and outputs are compared with the
// recurrence computed directly from each prompt.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kEos = 1;

uint64_t mix(uint64_t h, int32_t token) {
  h ^= static_cast<uint64_t>(token) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}
int32_t next_of(uint64_t h) { return 1 + static_cast<int32_t>((h >> 33) % (kVocab - 1)); }

// The recurrence, straight from the prompt.
std::vector<int32_t> reference_output(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  uint64_t h = 0;
  for (int32_t t : prompt) h = mix(h, t);
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < p.max_tokens) {
    const int32_t t = next_of(h);
    out.push_back(t);
    if (t == kEos && !p.ignore_eos && static_cast<int>(out.size()) >= p.min_tokens) break;
    h = mix(h, t);
  }
  return out;
}

class FakeRunner {
 public:
  explicit FakeRunner(int64_t slots) : kv_(static_cast<size_t>(slots), Entry{-1, 0}) {}

  // Runs a plan: resolves its futures from the previous step's tokens, then
  // reads and writes the hash-chain KV row by row.
  StepResult run(StepPlan& plan) {
    StepResult result;
    if (!plan.futures.empty()) {
      EXPECT_EQ(plan.futures_of, last_id_);
      for (const FutureToken& f : plan.futures) plan.token_ids[f.index] = last_next_.at(static_cast<size_t>(f.row));
    }
    std::vector<uint64_t> row_hash(plan.token_ids.size());
    const size_t seqs = plan.q_start.size() - 1;
    for (size_t s = 0; s < seqs; ++s) {
      const int32_t q0 = plan.q_start[s], q1 = plan.q_start[s + 1];
      const int32_t k0 = plan.kv_start[s], k1 = plan.kv_start[s + 1];
      const int32_t kv_len = k1 - k0;
      // Every position before this step's must hold its own entry.
      for (int32_t p = 0; p < kv_len - (q1 - q0); ++p) {
        const Entry& e = kv_.at(static_cast<size_t>(plan.kv_slots[static_cast<size_t>(k0 + p)]));
        if (e.position != p) {
          ADD_FAILURE() << "step " << plan.id << ": position " << p << " reads an entry of position " << e.position;
          result.error = "corrupt KV";
          return result;
        }
      }
      for (int32_t q = q0; q < q1; ++q) {
        const int32_t pos = plan.positions[static_cast<size_t>(q)];
        EXPECT_EQ(pos, kv_len - (q1 - q) );
        uint64_t h = 0;
        if (pos > 0) h = kv_.at(static_cast<size_t>(plan.kv_slots[static_cast<size_t>(k0 + pos - 1)])).hash;
        h = mix(h, plan.token_ids[static_cast<size_t>(q)]);
        kv_.at(static_cast<size_t>(plan.out_slots[static_cast<size_t>(q)])) = Entry{pos, h};
        row_hash[static_cast<size_t>(q)] = h;
      }
    }
    for (size_t r = 0; r < plan.rows.size(); ++r)
      result.next.push_back(next_of(row_hash.at(static_cast<size_t>(plan.logit_rows[r]))));
    // A score row's "rank" is the token the row predicts, so that a score
    // computed at the wrong position or from wrong KV shows.
    EXPECT_EQ(plan.logit_rows.size(), plan.rows.size() + plan.score_rows.size() +
                                          (plan.rows.empty() && plan.score_rows.empty()));
    for (size_t s = 0; s < plan.score_rows.size(); ++s) {
      const auto row = static_cast<size_t>(plan.logit_rows.at(plan.rows.size() + s));
      result.prompt_scores.push_back(
          {plan.score_rows[s].token, 0.0f, next_of(row_hash.at(row)), {}});
    }
    result.logprobs.assign(plan.rows.size(), {});
    result.sampled_logprobs.assign(plan.rows.size(), 0.0f);
    result.exec_start = result.exec_end = Clock::now();
    last_id_ = plan.id;
    last_next_ = result.next;
    return result;
  }

 private:
  struct Entry {
    int32_t position;
    uint64_t hash;
  };
  std::vector<Entry> kv_;
  uint64_t last_id_ = 0;
  std::vector<int32_t> last_next_;
};

struct Tracked {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> output;
  std::vector<PromptLogprob> prompt_scores;
  int finishes = 0;
  FinishReason reason = FinishReason::kLength;
  bool cancelled = false;
  int64_t cached = 0;
};

struct Case {
  int32_t page;
  bool overlap;
  int64_t slots;
  int64_t budget;
};

class SchedulerRandom : public ::testing::TestWithParam<std::tuple<int32_t, bool>> {};

// The fake model's vocabulary and end token, a context of max_context.
SchedulerOptions fake_model_options(int64_t max_context) {
  SchedulerOptions o;
  o.vocab_size = kVocab;
  o.max_context = max_context;
  o.eos_ids = {kEos};
  o.stop_strings = false;  // no tokenizer here
  return o;
}

// Drives the scheduler through a random request stream to the end.
void run_random(uint32_t seed, const Case& c) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << " page " << c.page << " overlap " << c.overlap);
  std::mt19937 rng(seed);
  KvManager kv(c.slots, c.page);
  SchedulerOptions o = fake_model_options(4096);
  o.max_running = 6;
  o.step_token_budget = c.budget;
  o.score_rows_per_step = 7;  // prompt-scoring requests' chunks are cut short (checked below)
  o.output_reserve = 4;
  Scheduler scheduler(kv, o);
  FakeRunner runner(c.slots);
  std::map<uint64_t, Tracked> requests;
  std::vector<std::vector<int32_t>> systems;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> s(static_cast<size_t>(std::uniform_int_distribution<int>(4, 40)(rng)));
    for (auto& t : s) t = std::uniform_int_distribution<int32_t>(2, kVocab - 1)(rng);
    systems.push_back(s);
  }
  uint64_t next_id = 1;
  const auto submit = [&](std::vector<RequestUpdate>& updates) {
    auto r = std::make_unique<Request>();
    r->id = next_id++;
    std::vector<int32_t> prompt = systems[std::uniform_int_distribution<size_t>(0, systems.size() - 1)(rng)];
    const int extra = std::uniform_int_distribution<int>(1, 30)(rng);
    for (int i = 0; i < extra; ++i) prompt.push_back(std::uniform_int_distribution<int32_t>(2, kVocab - 1)(rng));
    SamplingParams p;
    p.max_tokens = std::uniform_int_distribution<int>(1, 24)(rng);
    p.ignore_eos = rng() % 2 == 0;
    p.min_tokens = rng() % 4 == 0 ? std::min(p.max_tokens, 3) : 0;
    p.seed = 1;
    p.prompt_logprobs = rng() % 4 == 0 ? static_cast<int>(rng() % 3) : -1;
    r->request.prompt = prompt;
    r->request.params = p;
    r->request.priority = static_cast<int>(rng() % 3);
    r->request.cache_namespace = rng() % 5 == 0 ? 7 : 0;
    r->submitted = Clock::now();
    Tracked t;
    t.prompt = prompt;
    t.params = p;
    requests[r->id] = std::move(t);
    scheduler.add(std::move(r), updates);
  };
  const auto take = [&](std::vector<RequestUpdate>& updates) {
    for (RequestUpdate& u : updates) {
      Tracked& t = requests.at(u.id);
      ASSERT_EQ(t.finishes, 0) << "an update after the finish of request " << u.id;
      if (u.finished) {
        ++t.finishes;
        t.reason = u.reason;
        t.cached = u.usage.cached_prompt_tokens;
      } else {
        // A request's prompt scores come whole, with its first token.
        if (!u.prompt_logprobs.empty()) {
          EXPECT_TRUE(t.output.empty())
              << "prompt scores after the first token of request " << u.id;
          t.prompt_scores = std::move(u.prompt_logprobs);
        }
        t.output.push_back(u.token);
      }
    }
    updates.clear();
  };

  std::vector<RequestUpdate> updates;
  std::shared_ptr<StepPlan> inflight;
  StepResult inflight_result;
  int submitted = 0;
  for (int step = 0; step < 4000; ++step) {
    if (submitted < 40 && rng() % 3 == 0) {
      submit(updates);
      ++submitted;
    }
    if (rng() % 29 == 0 && next_id > 1) {
      const uint64_t id = 1 + rng() % (next_id - 1);
      if (requests.at(id).finishes == 0) {
        requests.at(id).cancelled = true;
        scheduler.finish(id, FinishReason::kCancelled, updates);
      }
    }
    std::shared_ptr<StepPlan> plan = scheduler.has_requests() ? scheduler.schedule(updates) : nullptr;
    if (plan) {
      ASSERT_LE(plan->score_rows.size(), 7u);
    }
    StepResult result;
    if (plan) result = runner.run(*plan);
    ASSERT_NO_THROW(scheduler.check_invariants());
    if (c.overlap) {
      if (inflight) scheduler.update(*inflight, inflight_result, updates);
      inflight = plan;
      inflight_result = std::move(result);
    } else if (plan) {
      scheduler.update(*plan, result, updates);
    }
    ASSERT_NO_THROW(scheduler.check_invariants());
    take(updates);
    if (submitted == 40 && !scheduler.has_requests() && !inflight) break;
  }
  ASSERT_FALSE(scheduler.has_requests()) << "requests left running";
  for (const auto& [id, t] : requests) {
    SCOPED_TRACE(testing::Message() << "request " << id);
    EXPECT_EQ(t.finishes, 1);
    const std::vector<int32_t> want = reference_output(t.prompt, t.params);
    if (t.cancelled && t.reason == FinishReason::kCancelled) {
      ASSERT_LE(t.output.size(), want.size());
      EXPECT_TRUE(std::equal(t.output.begin(), t.output.end(), want.begin()));
    } else {
      EXPECT_EQ(t.output, want);
      EXPECT_EQ(t.reason, want.back() == kEos && !t.params.ignore_eos ? FinishReason::kStop : FinishReason::kLength);
    }
    if (t.params.prompt_logprobs < 0 || t.output.empty()) {
      EXPECT_TRUE(t.prompt_scores.empty());
      continue;
    }
    // Every prompt token after the first, scored once, in order, from its
    // own prefix; none of the prompt came from the cache.
    EXPECT_EQ(t.cached, 0);
    ASSERT_EQ(t.prompt_scores.size(), t.prompt.size() - 1);
    uint64_t h = 0;
    for (size_t i = 0; i + 1 < t.prompt.size(); ++i) {
      h = mix(h, t.prompt[i]);
      EXPECT_EQ(t.prompt_scores[i].token, t.prompt[i + 1]) << i;
      EXPECT_EQ(t.prompt_scores[i].rank, next_of(h)) << i;
    }
  }
  const EngineMetrics& m = scheduler.metrics();
  EXPECT_EQ(m.requests_finished + m.requests_cancelled, requests.size());
  kv.check_invariants(0);
  EXPECT_EQ(kv.clear_cache(), kv.capacity());
}

TEST_P(SchedulerRandom, OutputsFollowEachPromptWhateverElseRuns) {
  const auto [page, overlap] = GetParam();
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    // A roomy pool (prefix sharing, no preemption) and a tight one (preemption).
    run_random(seed, Case{page, overlap, 2048, 64});
    run_random(seed + 100, Case{page, overlap, std::max<int64_t>(96, 8 * page), 24});
  }
}

INSTANTIATE_TEST_SUITE_P(PagesAndOverlap, SchedulerRandom,
                         ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Bool()));

// Invalid requests finish at once with an error and take no KV; the samples
// of a group wait for the first one's prompt; a cancelled queued request
// never runs.
TEST(Scheduler, RefusalsGroupsAndCancellation) {
  KvManager kv(256, 1);
  Scheduler scheduler(kv, fake_model_options(128));
  std::vector<RequestUpdate> updates;
  const auto make = [](uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->request.prompt = std::move(prompt);
    r->request.params.max_tokens = max_tokens;
    r->request.params.ignore_eos = true;
    r->request.params.seed = 3;
    return r;
  };
  scheduler.add(make(1, {}, 4), updates);
  scheduler.add(make(2, {5, kVocab}, 4), updates);
  scheduler.add(make(3, {5, 6}, 200), updates);  // past the context
  auto stop = make(4, {5, 6}, 4);
  stop->request.params.stop = {"x"};  // no tokenizer here
  scheduler.add(std::move(stop), updates);
  ASSERT_EQ(updates.size(), 4u);
  for (const RequestUpdate& u : updates) {
    EXPECT_TRUE(u.finished);
    EXPECT_EQ(u.reason, FinishReason::kError);
    EXPECT_FALSE(u.error.empty());
  }
  updates.clear();
  EXPECT_FALSE(scheduler.has_requests());

  // Three samples of one prompt: only the first is planned until its prompt
  // is in the cache.
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(2 + i);
  for (uint64_t id = 10; id < 13; ++id) {
    auto r = make(id, prompt, 2);
    r->group = 10;
    scheduler.add(std::move(r), updates);
  }
  auto later = make(20, {9, 9, 9}, 2);
  scheduler.add(std::move(later), updates);
  scheduler.finish(20, FinishReason::kCancelled, updates);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].reason, FinishReason::kCancelled);
  updates.clear();
  FakeRunner runner(256);
  std::shared_ptr<StepPlan> plan = scheduler.schedule(updates);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->requests.size(), 1u);
  EXPECT_EQ(plan->requests[0]->id, 10u);
  EXPECT_EQ(plan->mode, ForwardMode::kExtend);
  StepResult result = runner.run(*plan);
  scheduler.update(*plan, result, updates);
  // Then the siblings, one admission per step, each computing only the last
  // prompt token (the rest is the first sample's, from the cache).
  for (int step = 0; step < 2; ++step) {
    plan = scheduler.schedule(updates);
    ASSERT_TRUE(plan);
    EXPECT_EQ(plan->requests.size(), 2u);
    EXPECT_EQ(plan->num_tokens(), 2);
    EXPECT_EQ(plan->mode, ForwardMode::kDecode);
    result = runner.run(*plan);
    scheduler.update(*plan, result, updates);
    scheduler.check_invariants();
  }
  for (const RequestUpdate& u : updates)
    if (u.finished) {
      EXPECT_EQ(u.usage.cached_prompt_tokens, u.id == 10 ? 0 : 39) << u.id;
    }
}

// A head's single drafts still on the device when their step is updated
// (kPendingDraft proposals): the next plan takes each as a placeholder input
// and names the step and result row it comes from, for the runner to move it
// in on the device.
TEST(Scheduler, PendingDraftsAreNamedByTheirStepAndRow) {
  KvManager kv(256, 1);
  SchedulerOptions o = fake_model_options(128);
  o.speculative.algorithm = SpeculativeAlgorithm::kMtp;
  o.speculative.num_draft_tokens = 1;
  Scheduler scheduler(kv, o);
  std::vector<RequestUpdate> updates;
  for (uint64_t id : {1, 2}) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->request.prompt = {5, 6, static_cast<int32_t>(6 + id)};
    r->request.params.max_tokens = 8;
    r->request.params.ignore_eos = true;
    scheduler.add(std::move(r), updates);
  }
  const std::shared_ptr<StepPlan> first = scheduler.schedule(updates);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->rows.size(), 2u);
  StepResult result;
  result.next = {11, 12};
  result.logprobs.assign(2, {});
  result.sampled_logprobs.assign(2, 0.0f);
  result.proposals = {{kPendingDraft}, {kPendingDraft}};
  scheduler.update(*first, result, updates);

  const std::shared_ptr<StepPlan> next = scheduler.schedule(updates);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->mode, ForwardMode::kVerify);
  ASSERT_EQ(next->rows.size(), 4u);  // per request its last token's row and its draft's
  ASSERT_EQ(next->device_drafts.size(), 2u);
  EXPECT_EQ(next->drafts_of, first->id);
  for (size_t j = 0; j < 2; ++j) {
    const FutureToken& d = next->device_drafts[j];
    EXPECT_EQ(d.row, static_cast<int32_t>(j)) << j;  // its request's row in the first step's result
    const size_t row = 2 * j;  // the row sampling after the request's last known token
    EXPECT_EQ(next->rows[row].draft, kPendingDraft) << j;
    EXPECT_EQ(d.index, static_cast<size_t>(next->logit_rows[row]) + 1) << j;
    EXPECT_EQ(next->token_ids[d.index], kPendingDraft) << j;
    EXPECT_EQ(next->token_ids[d.index - 1], result.next[j]) << j;
  }
  // The values, once they are on the host, go to the requests alone.
  result.proposals = {{21}, {22}};
  scheduler.resolve_proposals(result);
  scheduler.check_invariants();
}

}  // namespace
}  // namespace basalt
