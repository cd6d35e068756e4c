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
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "testing/engine_mode_test_util.h"
#include "testing/engine_test_util.h"
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

using testing::EngineMode;
using testing::Fixture;
using testing::base;
using testing::kDeepSeek;
using testing::kLlama;
using testing::slots;
using testing::g_overlap;
using testing::g_page;
using testing::whole_pages;

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

// A batch submitted at once is taken in at one step: eight one-token
// requests get their tokens from a single step, whatever the submitting
// thread's timing (one by one, the scheduler may wake between them and take
// them in over several steps).
TEST_P(EngineMode, ABatchIsTakenInAtOneStep) {
  Fixture f(kLlama);
  std::mt19937 rng(23);
  std::vector<EngineRequest> batch;
  for (int i = 0; i < 8; ++i) batch.push_back(request(random_ids(rng, 5 + i), greedy(1)));
  for (int round = 0; round < 3; ++round) {
    Engine engine(*f.model, f.backend, nullptr, slots(1024));
    std::vector<RequestHandle> handles = engine.submit_batch(batch);
    ASSERT_EQ(handles.size(), batch.size());
    for (size_t i = 0; i < handles.size(); ++i) {
      const RequestOutput out = collect(*handles[i]);
      EXPECT_EQ(out.output_ids.size(), 1u) << out.error;
      EXPECT_EQ(out.usage.prompt_tokens, static_cast<int64_t>(batch[i].prompt.size())) << "request " << i;
    }
    EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
    // With overlap the next step is planned (and run) before the first's
    // tokens are known to end the requests.
    EXPECT_EQ(engine.metrics().steps, g_overlap ? 2u : 1u) << "round " << round;
  }
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

// vLLM's prompt_logprobs: each prompt token after the first scored as one
// pass over the whole prompt scores it (every position's logits), whatever
// the chunks, the scoring allowance that cuts them shorter, the page size,
// the requests beside it, and the cache: a second run of the same prompt
// computes it again rather than take it from there.
TEST_P(EngineMode, PromptLogprobsMatchOneWholePromptPass) {
  Fixture f(kLlama);
  std::mt19937 rng(31);
  const std::vector<int32_t> prompt = random_ids(rng, 45);
  const auto P = static_cast<int64_t>(prompt.size());
  const auto V = static_cast<int64_t>(f.model->config().vocab_size);
  constexpr int kTop = 3;
  // The reference: one forward pass with every position's logits.
  KvBuffers kv = f.model->allocate_kv(P);
  Tensor logits = Tensor::empty({P, V}, DType::kF32), lp = Tensor::empty({P, V}, DType::kF32);
  f.model->forward(single_sequence_batch(prompt, 0, /*all_logits=*/true), kv, logits);
  f.backend.log_softmax(logits, lp);
  const auto row = [&](int64_t i) {
    return std::span<const float>(lp.data<float>() + i * V, static_cast<size_t>(V));
  };

  EngineOptions o = slots(1024);
  o.step_token_budget = 16;    // the prompt goes in chunks
  o.score_rows_per_step = 10;  // which scoring cuts shorter still
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, nullptr, o);
  SamplingParams scored = greedy(3);
  scored.prompt_logprobs = kTop;
  // Plain requests beside it, one of them with the same prompt first (the
  // cache then holds it).
  std::vector<RequestOutput> first = run_all(engine, {request(prompt, greedy(3))});
  std::vector<RequestOutput> out = run_all(
      engine,
      {request(random_ids(rng, 30), greedy(5)), request(prompt, scored), request(prompt, scored)});
  for (int k = 1; k <= 2; ++k) {
    SCOPED_TRACE(::testing::Message() << "scored request " << k);
    const RequestOutput& o_k = out[static_cast<size_t>(k)];
    EXPECT_EQ(o_k.output_ids, first[0].output_ids);
    EXPECT_EQ(o_k.usage.cached_prompt_tokens, 0);
    ASSERT_EQ(static_cast<int64_t>(o_k.prompt_logprobs.size()), P - 1);
    for (int64_t i = 0; i + 1 < P; ++i) {
      const PromptLogprob& s = o_k.prompt_logprobs[static_cast<size_t>(i)];
      const int32_t token = prompt[static_cast<size_t>(i + 1)];
      EXPECT_EQ(s.token, token);
      EXPECT_NEAR(s.logprob, row(i)[static_cast<size_t>(token)], 1e-4) << i;
      const float at = row(i)[static_cast<size_t>(token)];
      EXPECT_EQ(s.rank,
                1 + std::count_if(row(i).begin(), row(i).end(), [&](float x) { return x > at; }))
          << i;
      const std::vector<TokenLogprob> want = top_k_logprobs(row(i), kTop);
      ASSERT_EQ(s.top.size(), want.size());
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(s.top[j].id, want[j].id) << i;
        EXPECT_NEAR(s.top[j].logprob, want[j].logprob, 1e-4) << i;
      }
    }
  }
  EXPECT_TRUE(out[0].prompt_logprobs.empty());
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
  std::shared_ptr<TokenConstraint> fresh_copy() const override { return std::make_shared<ForcedSequence>(ids_); }
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
  std::shared_ptr<TokenConstraint> fresh_copy() const override { return std::make_shared<AllowedSet>(ids_); }

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

// SamplingParams::allowed_token_ids (vLLM's): the scheduler gives the
// request a mask of its own, so only those ids are sampled, greedy and hot,
// in a batch with a request that has none; beside a constraint of its own
// the request is refused, as is an id outside the vocabulary.
TEST_P(EngineMode, AllowedTokenIdsDecideEveryToken) {
  Fixture f(kLlama);
  const std::vector<int32_t> allowed = {10, 20, 30, 319};
  SamplingParams greedy_allowed = greedy(12);
  greedy_allowed.allowed_token_ids = allowed;
  SamplingParams hot_allowed = greedy(12);
  hot_allowed.temperature = 2.0f;
  hot_allowed.seed = 5;
  hot_allowed.allowed_token_ids = allowed;
  EngineRequest a = request({139, 190, 81, 313}, greedy_allowed);
  EngineRequest b = request({139, 190, 81}, hot_allowed);
  EngineRequest c = request({139, 190, 81, 313}, greedy(12));  // none
  Engine engine(*f.model, f.backend, nullptr, slots(512));
  const auto out = run_all(engine, {a, b, c});
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(out[static_cast<size_t>(i)].output_ids.size(), 12u) << i;
    for (int32_t t : out[static_cast<size_t>(i)].output_ids)
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << "request " << i << ": " << t;
  }
  // The same mask as a constraint of the caller's gives the same tokens.
  EngineRequest same = request({139, 190, 81, 313}, greedy(12));
  same.constraint = std::make_shared<AllowedSet>(allowed);
  EXPECT_EQ(run_all(engine, {same})[0].output_ids, out[0].output_ids);
  expect_same(f.alone(c.prompt, c.params), out[2], "unconstrained");
  EngineRequest both = request({139, 190, 81}, greedy_allowed);
  both.constraint = std::make_shared<AllowedSet>(allowed);
  const auto refused = collect(*engine.submit(both));
  EXPECT_EQ(refused.reason, FinishReason::kError);
  EXPECT_NE(refused.error.find("allowed_token_ids cannot be combined"), std::string::npos) << refused.error;
  SamplingParams outside = greedy(2);
  outside.allowed_token_ids = {10, static_cast<int32_t>(f.model->config().vocab_size)};
  const auto bad = collect(*engine.submit(request({1, 2}, outside)));
  EXPECT_EQ(bad.reason, FinishReason::kError);
  EXPECT_NE(bad.error.find("allowed_token_ids"), std::string::npos) << bad.error;
}

// A request resumed after k of its output tokens (EngineRequest::
// resume_output) gives the rest of the full run's tokens, for every k:
// greedy, seeded sampling, penalties and min_tokens over the resumed
// tokens, a grammar-like constraint primed with them. Its text is the end
// of the full run's text, and usage counts every output token.
TEST_P(EngineMode, ResumedRequestsContinueAsTheFullRun) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  std::mt19937 rng(21);
  std::vector<EngineRequest> full;
  full.push_back(request(random_ids(rng, 9), greedy(12)));
  SamplingParams hot = greedy(12);
  hot.temperature = 0.9f;
  hot.top_p = 0.9f;
  hot.seed = 77;
  full.push_back(request(random_ids(rng, 7), hot));
  SamplingParams penalised = greedy(14);
  penalised.temperature = 1.0f;
  penalised.seed = 78;
  penalised.repetition_penalty = 1.3f;
  penalised.frequency_penalty = 0.5f;
  penalised.presence_penalty = 0.4f;
  penalised.min_tokens = 6;
  penalised.ignore_eos = false;
  penalised.stop = {"zq"};
  full.push_back(request(random_ids(rng, 11), penalised));
  const std::vector<int32_t> forced = {7, 300, 41, 41, 2, 199, 5, 88};
  SamplingParams constrained = greedy(static_cast<int>(forced.size()));
  constrained.temperature = 1.5f;
  constrained.seed = 3;
  full.push_back(request({139, 190, 81}, constrained));
  full.back().constraint = std::make_shared<ForcedSequence>(forced);

  EngineOptions o = base();
  o.kv_slots = 2048;
  o.step_token_budget = 16;  // prompt and resumed tokens go in chunks
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
  const std::vector<RequestOutput> whole = run_all(engine, full);
  std::vector<EngineRequest> resumed;
  std::vector<std::pair<size_t, size_t>> from;  // (full request, k)
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_TRUE(whole[i].error.empty()) << whole[i].error;
    const std::vector<int32_t>& ids = whole[i].output_ids;
    ASSERT_GE(ids.size(), 2u);
    for (size_t k = 1; k <= ids.size(); ++k) {  // all of them: it ends at once, as the run did
      EngineRequest r = full[i];
      if (r.constraint) r.constraint = r.constraint->fresh_copy();
      r.resume_output.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
      resumed.push_back(std::move(r));
      from.emplace_back(i, k);
    }
  }
  const std::vector<RequestOutput> out = run_all(engine, resumed);
  for (size_t j = 0; j < out.size(); ++j) {
    const auto [i, k] = from[j];
    const std::string what = "request " + std::to_string(i) + " resumed after " + std::to_string(k);
    const std::vector<int32_t>& ids = whole[i].output_ids;
    EXPECT_EQ(out[j].output_ids, std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end()))
        << what << ": " << out[j].error;
    EXPECT_EQ(out[j].reason, whole[i].reason) << what;
    EXPECT_EQ(out[j].stop_reason, whole[i].stop_reason) << what;
    EXPECT_TRUE(whole[i].text.ends_with(out[j].text)) << what << ": \"" << out[j].text << "\"";
    EXPECT_EQ(out[j].usage.completion_tokens, static_cast<int64_t>(ids.size())) << what;
  }
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

// A continuation the earlier run could not have made is refused with an
// error that says why, and nothing runs; one of a run that had ended ends
// at once as it did.
TEST_P(EngineMode, ResumedRequestsThatCannotContinueAreRefused) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  int32_t with_e = -1;  // a token whose text holds an "e"
  for (int32_t id = 2; id < 320 && with_e < 0; ++id) {
    const std::optional<std::string> bytes = f.tokenizer->token_bytes(id);
    if (bytes && bytes->find('e') != std::string::npos) with_e = id;
  }
  ASSERT_GE(with_e, 0);
  std::vector<EngineRequest> bad;
  std::vector<std::string> why;
  const auto add = [&](EngineRequest r, std::vector<int32_t> resume, std::string expected) {
    r.resume_output = std::move(resume);
    bad.push_back(std::move(r));
    why.push_back(std::move(expected));
  };
  add(request({5, 6, 7}, greedy(3)), {9, 10, 11, 12}, "more than the run could make");
  add(request({5, 6, 7}, greedy(8)), {9, 400, 11}, "outside the vocabulary");
  SamplingParams stop_id = greedy(8);
  stop_id.stop_token_ids = {41};
  add(request({5, 6, 7}, stop_id), {9, 41, 11}, "already ends at token 1");
  SamplingParams stop_string = greedy(8);
  stop_string.stop = {"e"};
  add(request({5, 6, 7}, stop_string), {with_e, 9}, "stop string \"e\"");
  EngineRequest limited = request({5, 6, 7}, greedy(8));
  limited.constraint = std::make_shared<AllowedSet>(std::vector<int32_t>{10, 20});
  add(limited, {10, 30}, "not allowed");
  // Before min_tokens, a stop id is ordinary output: that one continues.
  SamplingParams early = stop_id;
  early.min_tokens = 4;
  add(request({5, 6, 7}, early), {9, 41, 11}, "");
  Engine engine(*f.model, f.backend, f.tokenizer.get(), slots(512));
  const std::vector<RequestOutput> out = run_all(engine, bad);
  for (size_t i = 0; i < out.size(); ++i) {
    if (why[i].empty()) {
      EXPECT_TRUE(out[i].error.empty()) << out[i].error;
      EXPECT_EQ(out[i].usage.completion_tokens, 3 + static_cast<int64_t>(out[i].output_ids.size()));
      continue;
    }
    EXPECT_EQ(out[i].reason, FinishReason::kError) << i;
    EXPECT_NE(out[i].error.find(why[i]), std::string::npos) << i << ": " << out[i].error;
    EXPECT_TRUE(out[i].output_ids.empty()) << i;
  }
  // Runs that had ended with their last resumed token end at once, as they
  // did, with nothing new: max_tokens, a stop id, a stop string.
  std::vector<EngineRequest> ended;
  ended.push_back(request({5, 6, 7}, greedy(3)));
  ended.back().resume_output = {9, 10, 11};
  ended.push_back(request({5, 6, 7}, stop_id));
  ended.back().resume_output = {9, 41};
  ended.push_back(request({5, 6, 7}, stop_string));
  ended.back().resume_output = {9, with_e};
  const std::vector<RequestOutput> done = run_all(engine, ended);
  const FinishReason reasons[] = {FinishReason::kLength, FinishReason::kStop, FinishReason::kStop};
  const StopReason stops[] = {StopReason{}, StopReason{int32_t{41}}, StopReason{std::string("e")}};
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_TRUE(done[i].error.empty()) << i << ": " << done[i].error;
    EXPECT_EQ(done[i].reason, reasons[i]) << i;
    EXPECT_EQ(done[i].stop_reason, stops[i]) << i;
    EXPECT_TRUE(done[i].output_ids.empty()) << i;
    EXPECT_EQ(done[i].usage.completion_tokens, static_cast<int64_t>(ended[i].resume_output.size())) << i;
  }
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

// A KV-event subscriber's index, kept from its batches alone, equals what a
// later subscriber's snapshot says the cache holds; cached prompts are found
// under the hashes a router computes from their tokens.
TEST_P(EngineMode, KvEventSubscribersSeeWhatTheCacheHolds) {
  Fixture f(kLlama);
  using Index = std::set<std::pair<uint64_t, uint64_t>>;
  Index index;  // touched on the engine's delivery thread only, until the end
  uint64_t seq = 0;
  bool in_order = true;
  std::promise<bool> same;
  std::promise<Index> seen;
  // Declared after what its listeners touch: the engine stops calling them first.
  EngineOptions o = slots(160);  // small: requests evict each other's prefixes
  Engine engine(*f.model, f.backend, nullptr, o);
  const uint64_t a = engine.subscribe_kv_events([&](const KvEventBatch& b) {
    in_order &= b.seq == seq + 1 && b.snapshot == (b.seq == 1) && b.block_size == std::max<int32_t>(16, g_page);
    seq = b.seq;
    for (const KvEvent& e : b.events)
      for (uint64_t h : e.block_hashes) {
        if (e.kind == KvEvent::Kind::kStored) in_order &= index.insert({e.ns, h}).second;
        else in_order &= index.erase({e.ns, h}) == 1;
      }
  });
  const auto prompts = shared_prefix_prompts(12, 40, 12, 5);
  std::vector<EngineRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) requests.push_back(request(prompts[i], greedy(4), i % 3 == 0 ? 9 : 0));
  run_all(engine, requests);
  const uint64_t b = engine.subscribe_kv_events([&](const KvEventBatch& batch) {
    if (!batch.snapshot) return;
    Index snapshot;
    for (const KvEvent& e : batch.events)
      for (uint64_t h : e.block_hashes) snapshot.insert({e.ns, h});
    same.set_value(snapshot == index);
    seen.set_value(index);
  });
  EXPECT_TRUE(same.get_future().get());
  const Index held = seen.get_future().get();
  engine.unsubscribe_kv_events(a);
  engine.unsubscribe_kv_events(b);
  EXPECT_TRUE(in_order);
  EXPECT_FALSE(held.empty());
  // The last request's prompt stays cached: its first block is there.
  const std::vector<int32_t>& last = prompts.back();
  EXPECT_TRUE(held.count({0, kv_block_hash(0, 0, std::span<const int32_t>(last).first(16))}) == 1);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
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
  std::vector<Clock::time_point> submitted;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = request({4, 5, static_cast<int32_t>(6 + i)}, greedy(40));
    r.priority = i % 3;  // 0 1 2 0 1 2
    submitted.push_back(Clock::now());
    handles.push_back(engine.submit(r));
  }
  // Admission order: when each left the queue, its submission time plus the
  // time it waited. (The wait alone is not enough: on a loaded machine this
  // thread can be descheduled between two submissions for longer than one
  // 40-token request takes, so a later submission can wait less.)
  std::vector<double> admitted(handles.size());
  collect(*first);
  for (size_t i = 0; i < handles.size(); ++i) {
    const double since_first =
        std::chrono::duration<double>(submitted[i] - submitted[0]).count();
    admitted[i] = since_first + collect(*handles[i]).usage.queue_seconds;
  }
  std::vector<int> order = {0, 1, 2, 3, 4, 5};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return admitted[a] < admitted[b]; });
  // With one running request each finishes before the next is admitted:
  // priority 2 (requests 2, 5), then 1 (1, 4), then 0 (0, 3), FCFS within.
  EXPECT_EQ(order, (std::vector<int>{2, 5, 1, 4, 0, 3}));
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
