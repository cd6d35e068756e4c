// Test helper: a model's greedy continuation against a transformers fixture.
//
// A fixture's reference.json holds "greedy_prompt", "greedy_output" and the
// reference's top-2 "greedy_margins". Tokens are compared one for one until
// the reference itself was a near-tie (margin < 1e-4): past that point float
// noise may legitimately pick the other token.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/generator.h"

namespace basalt::testing {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// min_margin: compare until the reference's top-2 margin falls below it
// (1e-4 for f32 backends; larger where activations are rounded to 16 bits).
inline void expect_greedy_matches_reference(Model& model, Backend& backend, const std::string& fixture_dir,
                                            double min_margin = 1e-4, size_t min_compared = 8) {
  const nlohmann::json meta = read_json(fixture_dir + "/reference.json");
  const std::vector<int32_t> prompt = meta["greedy_prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> expected = meta["greedy_output"].get<std::vector<int32_t>>();
  const std::vector<double> margins = meta["greedy_margins"].get<std::vector<double>>();
  GenerateOptions options;
  options.max_tokens = static_cast<int>(expected.size());
  options.temperature = 0.0f;
  options.ignore_eos = true;
  const GenerateResult result = generate(model, backend, prompt, options);
  ASSERT_EQ(result.output_ids.size(), expected.size());
  size_t compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (margins[i] < min_margin) break;
    EXPECT_EQ(result.output_ids[i], expected[i]) << fixture_dir << " step " << i;
    ++compared;
  }
  EXPECT_GE(compared, min_compared) << "too few comparable steps in the fixture";
}

}  // namespace basalt::testing
