// The engine tests' shared setup on the CPU backend (engine_test.cc,
// engine_lifecycle_test.cc): fixture models, a Fixture that also runs the
// single-request generator, and the EngineMode parameters (overlap off and
// on, KV pages of 1, 4 and 16 slots) every engine test runs under.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace basalt::testing {

inline const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";
inline const std::string kDeepSeek = std::string(BASALT_TESTDATA) + "/models/deepseek_v3";

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
inline bool g_overlap = false;
inline int32_t g_page = 1;

inline EngineOptions base() {
  EngineOptions o;
  o.overlap = g_overlap;
  o.page_size = g_page;
  return o;
}

// n rounded down to whole pages: what the radix cache can share.
inline int64_t whole_pages(int64_t n) { return n - n % g_page; }

class EngineMode : public ::testing::TestWithParam<std::tuple<bool, int32_t>> {
 protected:
  void SetUp() override {
    g_overlap = std::get<0>(GetParam());
    g_page = std::get<1>(GetParam());
  }
};

inline EngineOptions slots(int64_t n) {
  EngineOptions o = base();
  o.kv_slots = n;
  return o;
}

}  // namespace basalt::testing
