// LogitsProcessor against hand-computed rows.
#include "runtime/logits_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> applied(const LogitsProcessor& p, std::vector<float> row) {
  p.apply(row);
  return row;
}

TEST(LogitsProcessor, DefaultsChangeNothing) {
  SamplingParams params;
  const std::vector<int32_t> prompt = {1, 2, 3};
  LogitsProcessor p(params, 6, std::vector<int32_t>{5}, prompt);
  EXPECT_FALSE(p.active());
  p.append(2);
  EXPECT_FALSE(p.active());
  const std::vector<float> row = {1, -2, 3, 0, 5, -6};
  EXPECT_EQ(applied(p, row), row);
}

TEST(LogitsProcessor, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 1, 1, 3};
  LogitsProcessor p(params, 6, std::vector<int32_t>{}, prompt);
  EXPECT_TRUE(p.active());
  // Prompt tokens 0, 1, 3 are penalized; 2, 4, 5 are not; 0 stays 0.
  EXPECT_EQ(applied(p, {4, -3, 7, 0, 1, -1}), (std::vector<float>{2, -6, 7, 0, 1, -1}));
  // Output tokens join them, once however often they repeat.
  p.append(4);
  p.append(4);
  EXPECT_EQ(applied(p, {4, -3, 7, 0, 1, -1}), (std::vector<float>{2, -6, 7, 0, 0.5f, -1}));
  // A penalty below 1 rewards repetition with the same sign rule.
  params.repetition_penalty = 0.5f;
  LogitsProcessor q(params, 6, std::vector<int32_t>{}, prompt);
  EXPECT_EQ(applied(q, {4, -3, 7, 0, 1, -1}), (std::vector<float>{8, -1.5f, 7, 0, 1, -1}));
}

TEST(LogitsProcessor, FrequencyAndPresenceCountOutputOnly) {
  SamplingParams params;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 1.25f;
  const std::vector<int32_t> prompt = {2, 2, 2};  // the prompt does not count
  LogitsProcessor p(params, 5, std::vector<int32_t>{}, prompt);
  EXPECT_FALSE(p.active());
  EXPECT_EQ(applied(p, {0, 0, 0, 0, 0}), (std::vector<float>{0, 0, 0, 0, 0}));
  for (int32_t id : {1, 3, 1, 1}) p.append(id);
  EXPECT_TRUE(p.active());
  // token 1: count 3 -> 3 * 0.5 + 1.25 = 2.75; token 3: 0.5 + 1.25 = 1.75.
  EXPECT_EQ(applied(p, {1, 1, 1, 1, 1}), (std::vector<float>{1, -1.75f, 1, -0.75f, 1}));
  // Negative penalties encourage repetition.
  params.frequency_penalty = -1;
  params.presence_penalty = 0;
  LogitsProcessor q(params, 5, std::vector<int32_t>{}, prompt);
  q.append(4);
  q.append(4);
  EXPECT_EQ(applied(q, {0, 0, 0, 0, 0}), (std::vector<float>{0, 0, 0, 0, 2}));
}

TEST(LogitsProcessor, LogitBiasAdds) {
  SamplingParams params;
  params.logit_bias = {{0, -100}, {3, 2.5f}};
  LogitsProcessor p(params, 4, std::vector<int32_t>{}, std::vector<int32_t>{1});
  EXPECT_TRUE(p.active());
  EXPECT_EQ(applied(p, {1, 1, 1, 1}), (std::vector<float>{-99, 1, 1, 3.5f}));
}

TEST(LogitsProcessor, OrderIsMinTokensBiasThenPenalties) {
  // vLLM V1: min_tokens, logit_bias, then repetition, frequency, presence.
  SamplingParams params;
  params.logit_bias = {{1, 3}};
  params.repetition_penalty = 2;
  params.frequency_penalty = 1;
  params.presence_penalty = 0.5f;
  LogitsProcessor p(params, 3, std::vector<int32_t>{}, std::vector<int32_t>{});
  p.append(1);
  p.append(1);
  // token 1: (1 + 3) / 2 - (2 * 1 + 0.5) = -0.5; a penalty first would give 3.75.
  EXPECT_EQ(applied(p, {1, 1, 1}), (std::vector<float>{1, -0.5f, 1}));
  // A negative logit pushed positive by the bias is then divided.
  EXPECT_EQ(applied(p, {1, -1, 1}), (std::vector<float>{1, -1.5f, 1}));
}

TEST(LogitsProcessor, MinTokensSuppressesStopIdsUntilExactlyMinTokens) {
  SamplingParams params;
  params.min_tokens = 2;
  params.stop_token_ids = {3};
  const std::vector<int32_t> eos = {4};
  LogitsProcessor p(params, 5, eos, std::vector<int32_t>{0});
  const std::vector<float> row = {1, 2, 3, 4, 5};
  const std::vector<float> suppressed = {1, 2, 3, -kInf, -kInf};
  EXPECT_TRUE(p.active());
  EXPECT_EQ(applied(p, row), suppressed);  // 0 tokens out
  p.append(0);
  EXPECT_EQ(applied(p, row), suppressed);  // 1 token out
  p.append(1);
  EXPECT_FALSE(p.active());
  EXPECT_EQ(applied(p, row), row);  // 2 = min_tokens: lifted
  // With ignore_eos, eos is not a stop id and stays; stop ids are suppressed.
  params.ignore_eos = true;
  LogitsProcessor q(params, 5, eos, std::vector<int32_t>{0});
  EXPECT_EQ(applied(q, row), (std::vector<float>{1, 2, 3, -kInf, 5}));
  // Bias cannot lift a suppressed token.
  params.logit_bias = {{3, 100}};
  LogitsProcessor r(params, 5, eos, std::vector<int32_t>{0});
  EXPECT_EQ(applied(r, row)[3], -kInf);
}

TEST(LogitsProcessor, RejectsBadInput) {
  SamplingParams params;
  params.repetition_penalty = 1.5f;
  EXPECT_THROW(LogitsProcessor(params, 4, std::vector<int32_t>{}, std::vector<int32_t>{4}), Error);
  EXPECT_THROW(LogitsProcessor(params, 4, std::vector<int32_t>{9}, std::vector<int32_t>{0}), Error);
  params.logit_bias = {{7, 1}};
  EXPECT_THROW(LogitsProcessor(params, 4, std::vector<int32_t>{}, std::vector<int32_t>{0}), Error);
  SamplingParams ok;
  LogitsProcessor p(ok, 4, std::vector<int32_t>{}, std::vector<int32_t>{0});
  EXPECT_THROW(p.append(4), Error);
  std::vector<float> short_row(3);
  EXPECT_THROW(p.apply(short_row), Error);
}

}  // namespace
}  // namespace basalt
