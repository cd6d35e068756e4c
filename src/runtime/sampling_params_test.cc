// SamplingParams validation: every field's range, with the field named.
#include "runtime/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"

namespace basalt {
namespace {

// The message validate() throws for params changed by `edit`, or "" if valid.
std::string error_of(const std::function<void(SamplingParams&)>& edit, int max_logprobs = 20) {
  SamplingParams p;
  edit(p);
  try {
    p.validate(100, max_logprobs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SamplingParams, DefaultsAreValid) {
  EXPECT_EQ(error_of([](SamplingParams&) {}), "");
  SamplingParams p;
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_EQ(p.max_tokens, 16);
}

TEST(SamplingParams, EachBadFieldIsNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    std::function<void(SamplingParams&)> edit;
    const char* field;
  } cases[] = {
      {[](SamplingParams& p) { p.n = 0; }, "n must"},
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature"},
      {[nan](SamplingParams& p) { p.temperature = nan; }, "temperature"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k"},
      {[](SamplingParams& p) { p.top_p = 0; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p"},
      {[](SamplingParams& p) { p.min_p = -0.1f; }, "min_p"},
      {[](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.repetition_penalty = -1; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = 2.5f; }, "frequency_penalty"},
      {[](SamplingParams& p) { p.presence_penalty = -3; }, "presence_penalty"},
      {[nan](SamplingParams& p) { p.presence_penalty = nan; }, "presence_penalty"},
      {[](SamplingParams& p) { p.logit_bias[100] = 1; }, "logit_bias"},
      {[](SamplingParams& p) { p.logit_bias[-1] = 1; }, "logit_bias"},
      {[](SamplingParams& p) { p.logit_bias[5] = 101; }, "logit_bias"},
      {[](SamplingParams& p) { p.max_tokens = -1; }, "max_tokens"},
      {[](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens"},
      {[](SamplingParams& p) { p.min_tokens = 17; }, "min_tokens"},
      {[](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop"},
      {[](SamplingParams& p) { p.stop_token_ids = {3, 100}; }, "stop_token_ids"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs"},
      {[](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs"},
      {[](SamplingParams& p) { p.prompt_logprobs = -2; }, "prompt_logprobs"},
      {[](SamplingParams& p) {
         p.prompt_logprobs = 0;
         p.max_tokens = 0;
       },
       "prompt_logprobs"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of(c.edit);
    EXPECT_NE(message.find(c.field), std::string::npos) << c.field << ": '" << message << "'";
  }
}

TEST(SamplingParams, BoundaryValuesAreValid) {
  EXPECT_EQ(error_of([](SamplingParams& p) {
              p.temperature = 0;
              p.top_k = -1;
              p.top_p = 1;
              p.min_p = 1;
              p.frequency_penalty = -2;
              p.presence_penalty = 2;
              p.logit_bias = {{0, -100}, {99, 100}};
              p.min_tokens = 16;
              p.stop_token_ids = {0, 99};
              p.logprobs = 20;
              p.prompt_logprobs = 20;
            }),
            "");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logprobs = 50; }, 100), "");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.prompt_logprobs = 0; }), "");
}

TEST(SamplingParams, RowMapsTopKMinusOneToOff) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = -1;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  const SamplingRow row = p.row(42, 7);
  EXPECT_EQ(row.top_k, 0);
  EXPECT_FLOAT_EQ(row.temperature, 0.7f);
  EXPECT_FLOAT_EQ(row.top_p, 0.9f);
  EXPECT_FLOAT_EQ(row.min_p, 0.05f);
  EXPECT_EQ(row.seed, 42u);
  EXPECT_EQ(row.step, 7u);
}

TEST(SamplingParams, SeedsDifferAndSampleSeedsAreDerived) {
  EXPECT_NE(random_seed(), random_seed());
  EXPECT_EQ(sample_seed(9, 0), 9u);
  EXPECT_NE(sample_seed(9, 1), sample_seed(9, 2));
  EXPECT_NE(sample_seed(9, 1), 9u);
  EXPECT_EQ(sample_seed(9, 3), sample_seed(9, 3));
}

}  // namespace
}  // namespace basalt
