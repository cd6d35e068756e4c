// Helpers shared by the engine's tests on the CPU (engine_test.cc) and on the
// GPU (runtime/cuda_engine_test.cc): request builders, random prompts,
// running a list of requests to completion, and comparing an engine's output
// with the single-request generator's. Header-only, for tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"

namespace basalt::testing {

// Greedy, exactly max_tokens tokens (eos ignored).
inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// n ids uniform in [2, vocab): the fixtures' vocabularies have 320 ids.
inline std::vector<int32_t> random_ids(std::mt19937& rng, size_t n, int32_t vocab = 320) {
  std::uniform_int_distribution<int32_t> d(2, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n prompts: one shared system prompt of `prefix` ids followed by a distinct
// question of `question` ids each.
inline std::vector<std::vector<int32_t>> shared_prefix_prompts(int n, size_t prefix, size_t question,
                                                               uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> system = random_ids(rng, prefix);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = system;
    const auto q = random_ids(rng, question);
    p.insert(p.end(), q.begin(), q.end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

inline EngineRequest request(std::vector<int32_t> prompt, SamplingParams p, uint64_t ns = 0) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params = std::move(p);
  r.cache_namespace = ns;
  return r;
}

// Submits every request at once (an Engine's first step sees them all, so
// the steps do not depend on thread timing), then collects each stream, in
// order.
inline std::vector<RequestOutput> run_all(EngineClient& engine, const std::vector<EngineRequest>& requests) {
  std::vector<RequestHandle> handles = engine.submit_batch(requests);
  std::vector<RequestOutput> out;
  for (auto& h : handles) out.push_back(collect(*h));
  return out;
}

// The engine's output equals the generator's: ids, text, finish and stop reasons.
inline void expect_same(const GenerateResult& want, const RequestOutput& got, const std::string& what) {
  EXPECT_EQ(got.output_ids, want.output_ids) << what << ": " << got.error;
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(to_string(got.reason), want.finish_reason) << what;
  EXPECT_EQ(got.stop_reason, want.stop_reason) << what;
}

}  // namespace basalt::testing
