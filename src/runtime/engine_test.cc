// The engine against the single-request generator: radix cache on and off,
// crowds against requests run alone (greedy and seeded sampling), chunked
// prefill, preemption under a tiny pool, cancellation, deadlines, priorities,
// errors, and a multi-threaded stress run that must leave the pool whole.
// Every test of EngineMode runs with overlap off and on and with KV pages of
// 1, 4 and 16 slots: the outputs must be the generator's (hence the same for
// every page size), and with check_invariants every running request's slots
// are checked to be page-aligned after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/engine_test_util.h"
#include "runtime/generator.h"
#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using testing::expect_same;
using testing::greedy;
using testing::random_ids;
using testing::request;
using testing::run_all;
using testing::shared_prefix_prompts;

const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";
const std::string kDeepSeek = std::string(BASALT_TESTDATA) + "/models/deepseek_v3";

struct Fixture {
  explicit Fixture(const std::string& dir, bool with_tokenizer = false) {
    model = load_model(dir, backend);
    if (with_tokenizer) tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_file(dir + "/tokenizer.json"));
  }
  CpuBackend backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;

  GenerateResult alone(const std::vector<int32_t>& prompt, const SamplingParams& p) {
    GenerateOptions o;
    static_cast<SamplingParams&>(o) = p;
    o.eos_ids = model->config().eos_token_ids;
    return generate(*model, backend, tokenizer.get(), prompt, o);
  }
};

// Every engine test runs with overlap scheduling off and on, and with page
// sizes 1, 4 and 16 (EngineMode's parameters, set before each test): the
// outputs must not change.
bool g_overlap = false;
int32_t g_page = 1;

EngineOptions base() {
  EngineOptions o;
  o.overlap = g_overlap;
  o.page_size = g_page;
  return o;
}

// n rounded down to whole pages: what the radix cache can share.
int64_t whole_pages(int64_t n) { return n - n % g_page; }

class EngineMode : public ::testing::TestWithParam<std::tuple<bool, int32_t>> {
 protected:
  void SetUp() override {
    g_overlap = std::get<0>(GetParam());
    g_page = std::get<1>(GetParam());
  }
};

EngineOptions slots(int64_t n) {
  EngineOptions o = base();
  o.kv_slots = n;
  return o;
}

void cache_on_off(const std::string& dir) {
  Fixture f(dir);
  const auto prompts = shared_prefix_prompts(12, 40, 6, 7);
  std::vector<EngineRequest> requests;
  for (const auto& p : prompts) requests.push_back(request(p, greedy(8)));
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));

  std::vector<RequestOutput> outputs[2];
  for (int on = 0; on < 2; ++on) {
    EngineOptions o = base();
    o.kv_slots = 1024;
    o.radix_cache = on == 1;
    o.step_token_budget = 64;  // the prompts go in chunks
    o.check_invariants = true;
    Engine engine(*f.model, f.backend, nullptr, o);
    // One request first, so the rest find its prefix in the cache.
    outputs[on] = run_all(engine, {requests[0]});
    auto rest = run_all(engine, std::vector<EngineRequest>(requests.begin() + 1, requests.end()));
    outputs[on].insert(outputs[on].end(), rest.begin(), rest.end());
    const EngineMetrics m = engine.metrics();
    if (on == 1) {
      EXPECT_GT(m.cached_prompt_tokens, 0u);
      EXPECT_GT(m.cache_hit_rate(), 0.5);
      EXPECT_LT(m.prefill_tokens, m.prompt_tokens);
      EXPECT_EQ(outputs[on][1].usage.cached_prompt_tokens, whole_pages(40));
    } else {
      EXPECT_EQ(m.cached_prompt_tokens, 0u);
      EXPECT_EQ(m.prefill_tokens, m.prompt_tokens);
    }
    EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outputs[0][i].output_ids, outputs[1][i].output_ids) << "request " << i;
    expect_same(alone[i], outputs[1][i], "request " + std::to_string(i));
  }
}

TEST_P(EngineMode, RadixCacheOnAndOffGiveTheSameTokensLlama) { cache_on_off(kLlama); }
TEST_P(EngineMode, RadixCacheOnAndOffGiveTheSameTokensDeepSeek) { cache_on_off(kDeepSeek); }

TEST_P(EngineMode, ASharedPrefixArrivingTogetherIsComputedOnce) {
  Fixture f(kLlama);
  const auto prompts = shared_prefix_prompts(8, 64, 8, 13);
  std::vector<EngineRequest> requests;
  for (const auto& p : prompts) requests.push_back(request(p, greedy(4)));
  EngineOptions o = slots(1024);
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  run_all(engine, requests);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.prompt_tokens, 8u * 72u);
  EXPECT_EQ(m.prefill_tokens, 64u + 8u * 8u);
  EXPECT_EQ(m.cached_prompt_tokens, 7u * 64u);
}

TEST_P(EngineMode, AListenerHearsEveryEventWithoutPolling) {
  Fixture f(kLlama);
  Engine engine(*f.model, f.backend, nullptr, slots(256));
  std::mt19937 rng(5);
  RequestHandle h = engine.submit(request(random_ids(rng, 9), greedy(6)));
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  h->set_listener([&] {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    cv.notify_all();
  });
  int tokens = 0;
  bool done = false;
  while (!done) {
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return calls > 0; }));
      calls = 0;
    }
    while (std::optional<EngineEvent> e = h->try_next_event()) {
      if (e->kind == EngineEvent::Kind::kToken) ++tokens;
      else done = true;
    }
  }
  EXPECT_EQ(tokens, 6);
  h->set_listener({});
}

TEST_P(EngineMode, LongPromptsGoInChunksAndNamespacesDoNotShare) {
  Fixture f(kLlama);
  std::mt19937 rng(17);
  const std::vector<int32_t> prompt = random_ids(rng, 100);
  const GenerateResult alone = f.alone(prompt, greedy(10));
  EngineOptions o = slots(1024);
  o.step_token_budget = 8;  // 13 steps of prompt
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  const RequestOutput a = collect(*engine.submit(request(prompt, greedy(10), /*ns=*/1)));
  expect_same(alone, a, "chunked");
  EXPECT_EQ(a.usage.cached_prompt_tokens, 0);
  EXPECT_GE(engine.metrics().steps, 13u);  // the snapshot may lag the last step
  // Another tenant with the same prompt computes it again; the same tenant reuses it.
  const RequestOutput b = collect(*engine.submit(request(prompt, greedy(10), /*ns=*/2)));
  expect_same(alone, b, "other namespace");
  EXPECT_EQ(b.usage.cached_prompt_tokens, 0);
  const RequestOutput c = collect(*engine.submit(request(prompt, greedy(10), /*ns=*/1)));
  expect_same(alone, c, "same namespace");
  EXPECT_EQ(c.usage.cached_prompt_tokens, whole_pages(99));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

TEST_P(EngineMode, CrowdMatchesAloneGreedyAndSeeded) {
  Fixture f(kLlama);
  std::mt19937 rng(11);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 16; ++i) {
    SamplingParams p = greedy(6 + i % 7);
    if (i % 2 == 1) {
      p.temperature = 0.8f;
      p.top_k = i % 4 == 1 ? 20 : 0;
      p.top_p = 0.9f;
      p.seed = 1000 + i;
    }
    if (i % 5 == 0) p.repetition_penalty = 1.3f;
    if (i % 3 == 0) p.logprobs = 3;
    if (i % 7 == 3) p.ignore_eos = false;
    requests.push_back(request(random_ids(rng, 3 + static_cast<size_t>(i) * 5), p));
  }
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));
  EngineOptions o = base();
  o.kv_slots = 2048;
  o.step_token_budget = 48;
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  const auto out = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    expect_same(alone[i], out[i], "request " + std::to_string(i));
    EXPECT_EQ(out[i].seed, requests[i].params.seed ? *requests[i].params.seed : out[i].seed);
    ASSERT_EQ(out[i].top_logprobs.size(), requests[i].params.logprobs ? out[i].output_ids.size() : 0u);
    for (size_t t = 0; t < out[i].top_logprobs.size(); ++t)
      for (size_t k = 0; k < out[i].top_logprobs[t].size(); ++k) {
        EXPECT_EQ(out[i].top_logprobs[t][k].id, alone[i].top_logprobs[t][k].id);
        EXPECT_NEAR(out[i].top_logprobs[t][k].logprob, alone[i].top_logprobs[t][k].logprob, 1e-4);
      }
    EXPECT_EQ(out[i].usage.prompt_tokens, static_cast<int64_t>(requests[i].prompt.size()));
    EXPECT_EQ(out[i].usage.completion_tokens, static_cast<int64_t>(out[i].output_ids.size()));
  }
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

TEST_P(EngineMode, TextAndStopStringsMatchTheGenerator) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  const std::vector<int32_t> prompt = {139, 190, 81, 313, 198, 84};
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = greedy(24);
    p.temperature = i == 0 ? 0.0f : 1.0f;
    p.seed = 40 + i;
    if (i >= 2) p.stop = {"e", " t"};
    if (i == 3) p.include_stop_str_in_output = true;
    if (i == 4) p.min_tokens = 5;
    requests.push_back(request(prompt, p));
  }
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));
  Engine engine(*f.model, f.backend, f.tokenizer.get(), slots(512));
  const auto out = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) expect_same(alone[i], out[i], "request " + std::to_string(i));
}

// A request's last event reaching its stream means the metrics count it: a
// client reading metrics() after collecting everything sees every token
// (`basalt generate --batch` reported fewer output tokens than it printed).
// Tokens the engine made after a client-side stop string are discarded, not
// output.
TEST_P(EngineMode, MetricsCountEveryTokenWhenItsStreamEnds) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  std::mt19937 rng(11);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 300; ++i) requests.push_back(request(random_ids(rng, 3), greedy(4)));
  EngineOptions o = slots(4096);
  o.max_running = 128;
  Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
  const auto out = run_all(engine, requests);
  EngineMetrics m = engine.metrics();  // no drain: the streams' ends are enough
  EXPECT_EQ(m.output_tokens, 1200u);
  EXPECT_EQ(m.requests_finished, 300u);
  // A stop string ends the stream on the client side; the engine stops the
  // request when it hears of it, and what it made meanwhile is discarded.
  SamplingParams stopping = greedy(24);
  stopping.temperature = 1.0f;
  stopping.seed = 42;
  stopping.stop = {"Q"};  // the fixture model writes "... 3Q ..." here
  const RequestOutput stopped = collect(*engine.submit(request({139, 190, 81, 313, 198, 84}, stopping)));
  ASSERT_EQ(stopped.reason, FinishReason::kStop) << stopped.text;
  ASSERT_LT(stopped.output_ids.size(), 24u);
  EXPECT_EQ(stopped.usage.completion_tokens, static_cast<int64_t>(stopped.output_ids.size()));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  m = engine.metrics();
  EXPECT_EQ(m.output_tokens, 1200u + stopped.output_ids.size());
  EXPECT_EQ(m.requests_stopped, 1u);
}

// Forces one given sequence of tokens: only the next one is allowed.
class ForcedSequence : public TokenConstraint {
 public:
  explicit ForcedSequence(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  void fill_allowed(std::span<uint32_t> words) override {
    std::fill(words.begin(), words.end(), 0u);
    const int32_t t = ids_[std::min(next_, ids_.size() - 1)];
    words[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
    ++fills_;
  }
  void accept(int32_t token) override {
    EXPECT_EQ(token, ids_[std::min(next_, ids_.size() - 1)]);
    ++next_;
  }
  void rollback(int n) override { next_ -= static_cast<size_t>(n); }
  size_t accepted() const { return next_; }
  int fills() const { return fills_; }

 private:
  std::vector<int32_t> ids_;
  size_t next_ = 0;
  int fills_ = 0;
};

// Allows a fixed set of tokens.
class AllowedSet : public TokenConstraint {
 public:
  explicit AllowedSet(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  void fill_allowed(std::span<uint32_t> words) override {
    std::fill(words.begin(), words.end(), 0u);
    for (int32_t t : ids_) words[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
  }
  void accept(int32_t token) override {
    EXPECT_NE(std::find(ids_.begin(), ids_.end(), token), ids_.end()) << token;
  }
  void rollback(int) override {}

 private:
  std::vector<int32_t> ids_;
};

// The constraints' masks decide what is sampled, whatever the temperature,
// beside unconstrained requests that keep their own outputs.
TEST_P(EngineMode, TokenConstraintsDecideEveryToken) {
  Fixture f(kLlama);
  const std::vector<int32_t> forced = {7, 300, 41, 41, 2, 199, 5, 88};
  auto sequence = std::make_shared<ForcedSequence>(forced);
  SamplingParams hot = greedy(static_cast<int>(forced.size()));
  hot.temperature = 1.5f;
  hot.seed = 3;
  EngineRequest a = request({139, 190, 81}, hot);
  a.constraint = sequence;
  EngineRequest b = request({139, 190, 81, 313}, greedy(12));
  b.constraint = std::make_shared<AllowedSet>(std::vector<int32_t>{10, 20, 30, 319});
  EngineRequest c = request({139, 190, 81, 313}, greedy(12));  // unconstrained
  Engine engine(*f.model, f.backend, nullptr, slots(512));
  const auto out = run_all(engine, {a, b, c});
  EXPECT_EQ(out[0].output_ids, forced);
  EXPECT_EQ(sequence->accepted(), forced.size());
  EXPECT_EQ(sequence->fills(), static_cast<int>(forced.size()));
  ASSERT_EQ(out[1].output_ids.size(), 12u);
  for (int32_t t : out[1].output_ids) EXPECT_TRUE(t == 10 || t == 20 || t == 30 || t == 319) << t;
  expect_same(f.alone(c.prompt, c.params), out[2], "unconstrained");
}

void preemption_matches_alone(const std::string& dir) {
  Fixture f(dir);
  std::mt19937 rng(5);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(request(random_ids(rng, 12), greedy(28)));
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));
  for (bool cache : {false, true}) {
    EngineOptions o = base();
    o.kv_slots = 64;  // room for about two requests at a time
    o.output_reserve = 2;
    o.radix_cache = cache;
    o.check_invariants = true;
    Engine engine(*f.model, f.backend, nullptr, o);
    const auto out = run_all(engine, requests);
    int preempted = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      expect_same(alone[i], out[i], "request " + std::to_string(i));
      preempted += out[i].usage.preemptions;
    }
    EXPECT_GT(preempted, 0);
    EXPECT_EQ(engine.metrics().preemptions, static_cast<uint64_t>(preempted));
    EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  }
}

TEST_P(EngineMode, PreemptionUnderATinyPoolStillMatchesAloneLlama) { preemption_matches_alone(kLlama); }
TEST_P(EngineMode, PreemptionUnderATinyPoolStillMatchesAloneDeepSeek) { preemption_matches_alone(kDeepSeek); }

TEST_P(EngineMode, BadRequestsGetAnErrorEvent) {
  Fixture f(kLlama);
  Engine engine(*f.model, f.backend, nullptr, slots(32));
  const auto never = collect(*engine.submit(request(std::vector<int32_t>(20, 5), greedy(20))));
  EXPECT_EQ(never.reason, FinishReason::kError);
  EXPECT_NE(never.error.find("can never fit"), std::string::npos) << never.error;
  EXPECT_TRUE(never.output_ids.empty());
  EXPECT_EQ(collect(*engine.submit(request({}, greedy(2)))).reason, FinishReason::kError);
  EXPECT_EQ(collect(*engine.submit(request({1, 400}, greedy(2)))).reason, FinishReason::kError);
  SamplingParams bad = greedy(2);
  bad.top_p = 0;
  EXPECT_EQ(collect(*engine.submit(request({1, 2}, bad))).reason, FinishReason::kError);
  SamplingParams stop = greedy(2);
  stop.stop = {"x"};
  EXPECT_NE(collect(*engine.submit(request({1, 2}, stop))).error.find("tokenizer"), std::string::npos);
  const auto zero = collect(*engine.submit(request({1, 2}, greedy(0))));
  EXPECT_EQ(zero.reason, FinishReason::kLength);
  EXPECT_TRUE(zero.output_ids.empty());
  // The engine still works afterwards.
  EXPECT_EQ(collect(*engine.submit(request({1, 2, 3}, greedy(4)))).output_ids.size(), 4u);
  EXPECT_EQ(engine.metrics().requests_failed, 5u);
  // A request the per-request state refuses (here: end-of-sequence ids outside
  // the vocabulary) is an error event too, and the engine keeps serving.
  EngineOptions bad_eos = slots(32);
  bad_eos.eos_ids = std::vector<int32_t>{999};
  Engine other(*f.model, f.backend, nullptr, bad_eos);
  const auto refused = collect(*other.submit(request({1, 2}, greedy(2))));
  EXPECT_EQ(refused.reason, FinishReason::kError);
  EXPECT_FALSE(refused.error.empty());
  EXPECT_EQ(collect(*other.submit(request({1, 2}, greedy(2)))).reason, FinishReason::kError);
}

TEST_P(EngineMode, DeadlinesEndRequests) {
  Fixture f(kLlama);
  Engine engine(*f.model, f.backend, nullptr, slots(512));
  EngineRequest past = request({1, 2, 3}, greedy(8));
  past.deadline = Clock::now() - std::chrono::seconds(1);
  const auto a = collect(*engine.submit(past));
  EXPECT_EQ(a.reason, FinishReason::kDeadline);
  EXPECT_TRUE(a.output_ids.empty());
  EngineRequest soon = request({1, 2, 3}, greedy(250));
  soon.deadline = Clock::now() + std::chrono::milliseconds(1);
  const auto b = collect(*engine.submit(soon));
  EXPECT_EQ(b.reason, FinishReason::kDeadline);
  EXPECT_LT(b.output_ids.size(), 250u);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

TEST_P(EngineMode, HigherPriorityIsAdmittedFirst) {
  Fixture f(kLlama);
  EngineOptions o = base();
  o.kv_slots = 512;
  o.max_running = 1;
  o.policy = SchedulePolicy::kFcfs;  // within a priority class: arrival order
  Engine engine(*f.model, f.backend, nullptr, o);
  RequestHandle first = engine.submit(request({1, 2, 3}, greedy(250)));
  ASSERT_TRUE(first->next_event().has_value());  // running now
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = request({4, 5, static_cast<int32_t>(6 + i)}, greedy(40));
    r.priority = i % 3;  // 0 1 2 0 1 2
    handles.push_back(engine.submit(r));
  }
  // Admission order: the time each waited in the queue (they were submitted
  // within microseconds; each admission waits for a 40-token request).
  std::vector<double> queued(handles.size());
  collect(*first);
  for (size_t i = 0; i < handles.size(); ++i) queued[i] = collect(*handles[i]).usage.queue_seconds;
  std::vector<int> order = {0, 1, 2, 3, 4, 5};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return queued[a] < queued[b]; });
  // With one running request each finishes before the next is admitted:
  // priority 2 (requests 2, 5), then 1 (1, 4), then 0 (0, 3), FCFS within.
  EXPECT_EQ(order, (std::vector<int>{2, 5, 1, 4, 0, 3}));
}

TEST_P(EngineMode, CancellationAtRandomPointsFreesEverything) {
  Fixture f(kLlama);
  EngineOptions o = base();
  o.kv_slots = 600;
  o.step_token_budget = 32;
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  std::mt19937 rng(3);
  const auto prompts = shared_prefix_prompts(24, 30, 10, 9);
  std::vector<RequestHandle> handles;
  for (int round = 0; round < 3; ++round) {
    for (const auto& p : prompts) handles.push_back(engine.submit(request(p, greedy(20))));
    for (int i = 0; i < 30; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      handles[rng() % handles.size()]->cancel();
    }
  }
  int cancelled = 0;
  for (auto& h : handles) {
    const auto out = collect(*h);
    if (out.reason == FinishReason::kCancelled) ++cancelled;
    else EXPECT_EQ(out.output_ids.size(), 20u);
    h->cancel();  // after the end: nothing happens
  }
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  EXPECT_EQ(engine.metrics().requests_cancelled, static_cast<uint64_t>(cancelled));
}

TEST_P(EngineMode, DestroyingTheEngineCancelsWhatIsLeft) {
  Fixture f(kLlama);
  std::vector<RequestHandle> handles;
  std::optional<EngineEvent> first;
  {
    Engine engine(*f.model, f.backend, nullptr, slots(512));
    for (int i = 0; i < 4; ++i) handles.push_back(engine.submit(request({1, 2, static_cast<int32_t>(3 + i)}, greedy(250))));
    first = handles[0]->next_event();
    ASSERT_TRUE(first.has_value());
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    RequestOutput out = collect(*handles[i]);  // every stream ends
    // The event taken above (request 0 may have finished before the engine went).
    if (i == 0 && first->kind == EngineEvent::Kind::kToken) out.output_ids.insert(out.output_ids.begin(), first->token);
    if (out.reason != FinishReason::kCancelled) {
      EXPECT_EQ(out.reason, FinishReason::kLength);
      EXPECT_EQ(out.output_ids.size(), 250u);
    }
    handles[i]->cancel();
  }
}

TEST_P(EngineMode, StressFromFourThreads) {
  Fixture f(kLlama);
  EngineOptions o = base();
  // Small enough that decoding requests get preempted: with pages of 16 the
  // reserves are whole pages, so 160 slots (10 pages) rarely run dry; 6 pages
  // still hold the largest request (63 tokens).
  o.kv_slots = g_page == 16 ? 96 : 160;
  o.step_token_budget = 64;
  o.max_running = 24;
  o.output_reserve = 1;
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  const auto prefixes = shared_prefix_prompts(4, 24, 0, 21);
  std::atomic<int> finished{0}, errors{0};
  std::vector<std::vector<std::pair<EngineRequest, RequestOutput>>> done(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<RequestHandle> mine;
      std::vector<EngineRequest> sent;
      for (int i = 0; i < 60; ++i) {
        std::vector<int32_t> p = prefixes[rng() % 4];
        p.resize(1 + rng() % 24);
        const auto q = random_ids(rng, rng() % 16);
        p.insert(p.end(), q.begin(), q.end());
        SamplingParams sp = greedy(1 + static_cast<int>(rng() % 24));
        if (rng() % 2) {
          sp.temperature = 1.0f;
          sp.seed = rng();
        }
        sp.ignore_eos = rng() % 2;
        EngineRequest r = request(p, sp, rng() % 2);
        r.priority = static_cast<int>(rng() % 3);
        if (rng() % 10 == 0) r.deadline = Clock::now() + std::chrono::milliseconds(rng() % 50);
        if (rng() % 40 == 0) r.params.max_tokens = 500;  // can never fit
        sent.push_back(r);
        mine.push_back(engine.submit(r));
        if (rng() % 8 == 0) mine[rng() % mine.size()]->cancel();
      }
      for (size_t i = 0; i < mine.size(); ++i) {
        const auto out = collect(*mine[i]);
        done[static_cast<size_t>(t)].emplace_back(sent[i], out);
        ++finished;
        if (out.reason == FinishReason::kError) ++errors;
        if (out.reason == FinishReason::kLength) {
          EXPECT_EQ(out.usage.completion_tokens, static_cast<int64_t>(out.output_ids.size()));
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(finished.load(), 240);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_submitted, 240u);
  EXPECT_EQ(m.requests_finished + m.requests_cancelled + m.requests_failed + m.requests_expired, 240u);
  EXPECT_EQ(m.requests_failed, static_cast<uint64_t>(errors.load()));
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.queued, 0);
  EXPECT_GT(m.ttft.count, 0u);
  EXPECT_GT(m.schedule_time.count, 0u);
  EXPECT_GT(m.preemptions, 0u);
  // Every request that ran to its end, preempted or not, gave what it gives
  // alone (the engine is idle now, so the model is free).
  int compared = 0;
  for (const auto& list : done)
    for (const auto& [r, out] : list) {
      if (out.reason != FinishReason::kLength && out.reason != FinishReason::kStop) continue;
      SamplingParams p = r.params;
      p.seed = out.seed;
      EXPECT_EQ(out.output_ids, f.alone(r.prompt, p).output_ids);
      ++compared;
    }
  EXPECT_GT(compared, 150);
}

}  // namespace
}  // namespace basalt

namespace basalt {
namespace {

TEST_P(EngineMode, OwnsItsModelBackendAndTokenizer) {
  auto backend = std::make_unique<CpuBackend>();
  auto model = load_model(kLlama, *backend);
  auto tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_file(kLlama + "/tokenizer.json"));
  Engine engine(std::move(backend), std::move(model), std::move(tokenizer), slots(256));
  const RequestOutput out = collect(*engine.submit(request({139, 190, 81}, greedy(5))));
  EXPECT_EQ(out.output_ids.size(), 5u);
  EXPECT_FALSE(out.text.empty());
  EXPECT_EQ(engine.kv_capacity(), 256);
}

// Requests that stop on sampled tokens (eos, stop ids) finish on step N's
// token while, with overlap, they are already in step N+1: the extra rows are
// dropped and their slots freed, and the outputs do not change.
TEST_P(EngineMode, RequestsStoppingOnASampledTokenMatchAlone) {
  Fixture f(kLlama);
  std::mt19937 rng(23);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 24; ++i) {
    SamplingParams p = greedy(30);
    p.temperature = 1.0f;
    p.seed = 500 + i;
    p.ignore_eos = false;
    // Common ids of the random model: most requests stop early.
    for (int32_t id = 2; id < 40; ++id) p.stop_token_ids.push_back(id);
    if (i % 4 == 0) p.min_tokens = 3;
    if (i % 3 == 0) p.repetition_penalty = 1.2f;
    requests.push_back(request(random_ids(rng, 4 + static_cast<size_t>(i) % 9), p));
  }
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));
  EngineOptions o = slots(512);
  o.step_token_budget = 16;
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  const auto out = run_all(engine, requests);
  int stopped = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    expect_same(alone[i], out[i], "request " + std::to_string(i));
    stopped += out[i].reason == FinishReason::kStop && out[i].output_ids.size() < 30u;
  }
  EXPECT_GT(stopped, 4);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  const EngineMetrics m = engine.metrics();
  if (g_overlap) {
    EXPECT_GT(m.discarded_tokens, 0u);
  } else {
    EXPECT_EQ(m.discarded_tokens, 0u);
  }
  EXPECT_GT(m.execute_time.count, 0u);
  EXPECT_GT(m.bubble.count, 0u);
}

TEST_P(EngineMode, SamplesOfOnePromptShareItsPrefill) {
  Fixture f(kLlama);
  std::mt19937 rng(29);
  for (size_t len : {5u, 40u, 100u}) {
    const std::vector<int32_t> prompt = random_ids(rng, len);
    SamplingParams p = greedy(6);
    p.temperature = 1.0f;
    p.seed = 77;
    for (bool cache : {true, false}) {
      EngineOptions o = slots(1024);
      o.radix_cache = cache;
      o.step_token_budget = 32;  // the 100-token prompt goes in chunks
      o.check_invariants = true;
      Engine engine(*f.model, f.backend, nullptr, o);
      const int n = 4;
      std::vector<RequestHandle> handles = engine.submit_n(request(prompt, p), n);
      ASSERT_EQ(handles.size(), static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        const RequestOutput out = collect(*handles[static_cast<size_t>(i)]);
        SamplingParams pi = p;
        pi.seed = sample_seed(77, i);
        expect_same(f.alone(prompt, pi), out, "sample " + std::to_string(i));
        EXPECT_EQ(out.seed, sample_seed(77, i));
      }
      const EngineMetrics m = engine.metrics();
      const uint64_t L = len;
      EXPECT_EQ(m.prompt_tokens, n * L);
      if (cache) {
        // Prefilled once; the others compute only the last prompt token (with
        // pages: the tokens past the last whole page before it).
        const auto shared = static_cast<uint64_t>(whole_pages(static_cast<int64_t>(L) - 1));
        EXPECT_EQ(m.prefill_tokens, L + (n - 1) * (L - shared)) << len;
        EXPECT_EQ(m.cached_prompt_tokens, (n - 1) * shared) << len;
      } else {
        EXPECT_EQ(m.prefill_tokens, n * L) << len;
        EXPECT_EQ(m.cached_prompt_tokens, 0u);
      }
      EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
    }
  }
}

TEST_P(EngineMode, SamplesDifferAndSampleZeroIsAPlainSubmit) {
  Fixture f(kLlama);
  Engine engine(*f.model, f.backend, nullptr, slots(1024));
  const std::vector<int32_t> prompt = {5, 9, 14, 200, 31, 7};
  SamplingParams p = greedy(12);
  p.temperature = 1.0f;
  p.seed = 1234;
  std::vector<RequestOutput> seeded;
  for (auto& h : engine.submit_n(request(prompt, p), 5)) seeded.push_back(collect(*h));
  const RequestOutput plain = collect(*engine.submit(request(prompt, p)));
  EXPECT_EQ(seeded[0].output_ids, plain.output_ids);
  for (size_t i = 0; i < seeded.size(); ++i)
    for (size_t j = i + 1; j < seeded.size(); ++j)
      EXPECT_NE(seeded[i].output_ids, seeded[j].output_ids) << i << " " << j;
  // Unseeded: each sample draws its own seed.
  p.seed.reset();
  std::vector<RequestOutput> unseeded;
  for (auto& h : engine.submit_n(request(prompt, p), 5)) unseeded.push_back(collect(*h));
  for (size_t i = 1; i < unseeded.size(); ++i) EXPECT_NE(unseeded[i].seed, unseeded[0].seed);
  bool any_differ = false;
  for (size_t i = 1; i < unseeded.size(); ++i) any_differ |= unseeded[i].output_ids != unseeded[0].output_ids;
  EXPECT_TRUE(any_differ);
  // n out of range: one handle, an error.
  for (int n : {0, -3, Engine::kMaxSamples + 1}) {
    std::vector<RequestHandle> bad = engine.submit_n(request(prompt, p), n);
    ASSERT_EQ(bad.size(), 1u);
    const RequestOutput out = collect(*bad[0]);
    EXPECT_EQ(out.reason, FinishReason::kError);
    EXPECT_NE(out.error.find("n must be in 1..128"), std::string::npos) << out.error;
  }
  EXPECT_EQ(engine.submit_n(request(prompt, p), Engine::kMaxSamples).size(),
            static_cast<size_t>(Engine::kMaxSamples));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

TEST_P(EngineMode, TheDrawnTokensLogprobIsReported) {
  Fixture f(kLlama);
  EngineOptions o = slots(1024);
  o.max_logprobs = 100000;
  Engine engine(*f.model, f.backend, nullptr, o);
  const int32_t vocab = f.model->config().vocab_size;
  SamplingParams p = greedy(10);
  p.temperature = 1.0f;
  p.seed = 77;
  p.sampled_logprob = true;
  SamplingParams all = p;
  all.logprobs = vocab;  // every alternative, to look the drawn one up
  const std::vector<int32_t> prompt = {3, 17, 250, 41};
  int events = 0;
  for (const SamplingParams& params : {p, all}) {
    RequestHandle h = engine.submit(request(prompt, params));
    while (std::optional<EngineEvent> e = h->next_event()) {
      if (e->kind != EngineEvent::Kind::kToken) continue;
      ASSERT_FALSE(std::isnan(e->logprob));
      EXPECT_LE(e->logprob, 0.0f);
      if (params.logprobs == 0) {
        EXPECT_TRUE(e->logprobs.empty());
        continue;
      }
      ASSERT_EQ(e->logprobs.size(), static_cast<size_t>(vocab));
      const auto it = std::find_if(e->logprobs.begin(), e->logprobs.end(),
                                   [&](const TokenLogprob& t) { return t.id == e->token; });
      ASSERT_NE(it, e->logprobs.end());
      EXPECT_EQ(it->logprob, e->logprob);
      ++events;
    }
  }
  EXPECT_EQ(events, 10);
  // Not asked for: NaN.
  SamplingParams none = greedy(2);
  RequestHandle h = engine.submit(request(prompt, none));
  while (std::optional<EngineEvent> e = h->next_event()) {
    if (e->kind == EngineEvent::Kind::kToken) {
      EXPECT_TRUE(std::isnan(e->logprob));
    }
  }
}

// After every step, every running request's KV is page-aligned: its slots
// cover its positions in whole pages, position p sits at offset p % P of one
// page and positions [k*P, (k+1)*P) share it; its cached part is whole pages;
// and the pages past its cached part are its own (no other running request
// reads them). The workload has shared prefixes, namespaces, chunked
// prefill, n samples, a small pool (preemptions) and a cancellation.
TEST_P(EngineMode, EveryRunningRequestsSlotsArePageAlignedAfterEveryStep) {
  Fixture f(kLlama);
  const int64_t P = g_page;
  std::mutex mu;
  int64_t steps = 0, shared_steps = 0;
  std::vector<std::string> violations;
  EngineOptions o = base();
  // 80 slots hold one 66-token request but never two of them to the end, and
  // with no output reserve a second one is admitted: preemptions.
  o.kv_slots = 5 * 16;
  o.step_token_budget = 24;
  o.output_reserve = 0;
  o.check_invariants = true;
  o.on_step = [&](std::span<const EngineOptions::RequestKv> running) {
    std::lock_guard<std::mutex> lock(mu);
    ++steps;
    std::unordered_map<int32_t, uint64_t> own;  // page -> the request whose own page it is
    std::unordered_map<int32_t, uint64_t> shared;
    bool any_shared = false;
    const auto bad = [&](uint64_t id, const std::string& what) {
      if (violations.size() < 20) violations.push_back("request " + std::to_string(id) + ": " + what);
    };
    for (const auto& r : running) {
      if (static_cast<int64_t>(r.slots.size()) != (r.kv_len + P - 1) / P * P)
        bad(r.id, "slots " + std::to_string(r.slots.size()) + " for kv " + std::to_string(r.kv_len));
      if (r.cached_len % P != 0 || r.cached_len > r.kv_len) bad(r.id, "cached part not whole pages");
      any_shared |= r.cached_len > 0;
      for (size_t p = 0; p < r.slots.size(); ++p) {
        if (r.slots[p] % P != static_cast<int64_t>(p) % P) bad(r.id, "position at the wrong offset");
        if (p % static_cast<size_t>(P) != 0 && r.slots[p] != r.slots[p - 1] + 1)
          bad(r.id, "a page split across pages");
      }
      for (size_t p = 0; p < r.slots.size(); p += static_cast<size_t>(P)) {
        const int32_t page = r.slots[p] / static_cast<int32_t>(P);
        if (static_cast<int64_t>(p) < r.cached_len) shared[page] = r.id;
        else if (!own.emplace(page, r.id).second) bad(r.id, "owns a page another request owns");
      }
    }
    for (const auto& [page, id] : own)
      if (shared.count(page)) bad(id, "owns a page another request shares");
    shared_steps += any_shared;
  };
  Engine engine(*f.model, f.backend, nullptr, o);
  std::vector<EngineRequest> requests;
  for (const auto& p : shared_prefix_prompts(10, 37, 9, 31)) {
    SamplingParams sp = greedy(20);
    if (requests.size() % 2 == 1) {
      sp.temperature = 1.0f;
      sp.seed = 900 + requests.size();
    }
    requests.push_back(request(p, sp, requests.size() % 3 == 0 ? 1 : 0));
  }
  std::vector<GenerateResult> alone;
  for (const auto& r : requests) alone.push_back(f.alone(r.prompt, r.params));
  std::vector<RequestHandle> handles;
  for (const auto& r : requests) handles.push_back(engine.submit(r));
  // Samples of one prompt run together once it is cached: 66 tokens each, two
  // of them do not fit the pool to the end.
  SamplingParams sampled = greedy(20);
  sampled.temperature = 1.0f;
  sampled.seed = 5;
  std::vector<RequestHandle> samples = engine.submit_n(request(requests[0].prompt, sampled), 3);
  RequestHandle cancelled = engine.submit(request(requests[1].prompt, greedy(30)));
  ASSERT_TRUE(cancelled->next_event().has_value());
  cancelled->cancel();
  for (size_t i = 0; i < handles.size(); ++i)
    expect_same(alone[i], collect(*handles[i]), "request " + std::to_string(i));
  for (auto& h : samples) EXPECT_EQ(collect(*h).output_ids.size(), 20u);
  collect(*cancelled);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(violations.empty()) << violations.front();
  EXPECT_GT(steps, 20);
  EXPECT_GT(shared_steps, 0);  // some request read a cached prefix
  // Preemption usually happens here too, but when depends on arrival timing;
  // PreemptionUnderATinyPool* assert it for every page size, with the same
  // per-step page checks (check_invariants).
  RecordProperty("preemptions", static_cast<int>(engine.metrics().preemptions));
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineMode,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 4, 16)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, int32_t>>& info) {
                           return std::string(std::get<0>(info.param) ? "OverlapOn" : "OverlapOff") +
                                  "Page" + std::to_string(std::get<1>(info.param));
                         });

TEST(EnginePages, PageSizeAndPoolSizeAreChecked) {
  Fixture f(kLlama);
  EngineOptions o;
  o.kv_slots = 100;
  o.page_size = 0;
  EXPECT_THROW(Engine(*f.model, f.backend, nullptr, o), Error);
  o.page_size = 128;  // more than the pool
  EXPECT_THROW(Engine(*f.model, f.backend, nullptr, o), Error);
  o.page_size = 16;  // rounded down to whole pages
  {
    Engine engine(*f.model, f.backend, nullptr, o);
    EXPECT_EQ(engine.kv_capacity(), 96);
    EXPECT_EQ(engine.drain_and_clear_cache(), 96);
  }
  // From a byte budget: whole pages too.
  o.kv_slots = 0;
  o.kv_budget_bytes = f.model->kv_bytes_per_slot(o.kv_dtype) * 1000;
  {
    Engine engine(*f.model, f.backend, nullptr, o);
    EXPECT_EQ(engine.kv_capacity(), 992);
  }
  // A request fits when its tokens fit in whole pages: 20 + 12 is two pages
  // of 16, 20 + 13 would need three.
  o.kv_budget_bytes = 0;
  o.kv_slots = 32;
  Engine engine(*f.model, f.backend, nullptr, o);
  EXPECT_EQ(collect(*engine.submit(request(std::vector<int32_t>(20, 5), greedy(12)))).output_ids.size(), 12u);
  const RequestOutput never = collect(*engine.submit(request(std::vector<int32_t>(20, 5), greedy(13))));
  EXPECT_EQ(never.reason, FinishReason::kError);
  EXPECT_NE(never.error.find("can never fit"), std::string::npos) << never.error;
  EXPECT_EQ(engine.drain_and_clear_cache(), 32);
}

TEST(EngineMetrics, HistogramBucketsAndQuantiles) {
  Histogram h;
  EXPECT_EQ(h.quantile(0.5), 0.0);
  for (int i = 0; i < 90; ++i) h.observe(0.002);  // the 3 ms bucket
  for (int i = 0; i < 10; ++i) h.observe(200.0);  // above every bound
  EXPECT_EQ(h.count, 100u);
  EXPECT_EQ(h.buckets[3], 90u);
  EXPECT_EQ(h.buckets.back(), 10u);
  EXPECT_DOUBLE_EQ(h.quantile(0.5), 3e-3);
  EXPECT_DOUBLE_EQ(h.quantile(0.99), 200.0);
  EXPECT_DOUBLE_EQ(h.max, 200.0);
  EXPECT_NEAR(h.mean(), (90 * 0.002 + 10 * 200.0) / 100, 1e-12);
  EngineMetrics m;
  EXPECT_EQ(m.cache_hit_rate(), 0.0);
  m.prompt_tokens = 8;
  m.cached_prompt_tokens = 6;
  EXPECT_DOUBLE_EQ(m.cache_hit_rate(), 0.75);
}

}  // namespace
}  // namespace basalt
