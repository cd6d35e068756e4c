// LogitsProcessor against hand-computed rows.
#include "runtime/logits_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "runtime/generator.h"

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

// rollback(n) returns to the state n appends ago, whatever they touched
// (new ids, repeated ids, the min_tokens boundary): checked against a
// processor that never saw them, over random sequences.
TEST(LogitsProcessor, RollbackUndoesTheLastAppends) {
  SamplingParams params;
  params.min_tokens = 3;
  params.repetition_penalty = 1.3f;
  params.frequency_penalty = 0.4f;
  params.presence_penalty = 0.25f;
  params.logit_bias = {{4, 1.5f}};
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> eos = {7};
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(0, 7);
  for (int trial = 0; trial < 200; ++trial) {
    LogitsProcessor p(params, 8, eos, prompt), fresh(params, 8, eos, prompt);
    const int keep = trial % 6, extra = 1 + trial % 5;
    for (int i = 0; i < keep; ++i) {
      const int32_t t = id(rng);
      p.append(t);
      fresh.append(t);
    }
    for (int i = 0; i < extra; ++i) p.append(id(rng));
    p.rollback(extra);
    std::vector<LogitEdit> got, want;
    p.edits(0, got);
    fresh.edits(0, want);
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << "trial " << trial;
      EXPECT_EQ(got[i].suppress, want[i].suppress) << "trial " << trial;
      EXPECT_EQ(got[i].subtract, want[i].subtract) << "trial " << trial;
      EXPECT_EQ(got[i].repetition, want[i].repetition) << "trial " << trial;
    }
    EXPECT_EQ(p.active(), fresh.active());
    EXPECT_EQ(p.num_output_tokens(), fresh.num_output_tokens());
  }
  LogitsProcessor p(params, 8, eos, prompt);
  p.append(3);
  EXPECT_THROW(p.rollback(2), Error);
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

// bad_words_ids: a one-id word is always -inf; a longer one only where the
// output ends with its ids but the last (never the prompt); rollback takes
// a match back; other ids are untouched.
TEST(LogitsProcessor, BadWordsEndOnlyWhereTheirPrefixIsTheOutput) {
  SamplingParams params;
  params.bad_words_ids = {{4}, {1, 2, 3}, {2, 5}};
  const std::vector<int32_t> prompt = {1, 2};  // ends like the prefix of {1, 2, 3}: not matched
  LogitsProcessor p(params, 6, std::vector<int32_t>{0}, prompt);
  EXPECT_TRUE(p.active());
  const std::vector<float> row = {1, 1, 1, 1, 1, 1};
  EXPECT_EQ(applied(p, row), (std::vector<float>{1, 1, 1, 1, -kInf, 1}));
  p.append(1);
  EXPECT_EQ(applied(p, row), (std::vector<float>{1, 1, 1, 1, -kInf, 1}));
  p.append(2);
  EXPECT_EQ(applied(p, row), (std::vector<float>{1, 1, 1, -kInf, -kInf, -kInf}));
  p.append(1);
  EXPECT_EQ(applied(p, row), (std::vector<float>{1, 1, 1, 1, -kInf, 1}));
  p.rollback(1);
  EXPECT_EQ(applied(p, row), (std::vector<float>{1, 1, 1, -kInf, -kInf, -kInf}));
  // The same edits on the device path (edits()), beside a bias on a banned id.
  params.logit_bias = {{3, 2.0f}};
  LogitsProcessor q(params, 6, std::vector<int32_t>{0}, prompt);
  q.append(1);
  q.append(2);
  std::vector<LogitEdit> edits;
  q.edits(0, edits);
  std::vector<float> device_row = row;
  for (const LogitEdit& e : edits) device_row[static_cast<size_t>(e.token)] = apply_logit_edit(device_row[static_cast<size_t>(e.token)], e);
  EXPECT_EQ(device_row, (std::vector<float>{1, 1, 1, -kInf, -kInf, -kInf}));
  // A word with no ids, or an id outside the vocabulary, is refused.
  params.bad_words_ids = {{}};
  EXPECT_THROW(LogitsProcessor(params, 6, std::vector<int32_t>{0}, prompt), Error);
  params.bad_words_ids = {{1, 6}};
  EXPECT_THROW(LogitsProcessor(params, 6, std::vector<int32_t>{0}, prompt), Error);
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


// The four steps done one after the other, as vLLM does them: the order the
// merged edits must reproduce.
std::vector<float> sequential(const SamplingParams& params, std::span<const int32_t> eos,
                              std::span<const int32_t> prompt, std::span<const int32_t> output,
                              std::vector<float> x) {
  if (static_cast<int>(output.size()) < params.min_tokens) {
    if (!params.ignore_eos)
      for (int32_t id : eos) x[static_cast<size_t>(id)] = -kInf;
    for (int32_t id : params.stop_token_ids) x[static_cast<size_t>(id)] = -kInf;
  }
  for (const auto& [id, bias] : params.logit_bias) x[static_cast<size_t>(id)] += bias;
  if (params.repetition_penalty != 1.0f) {
    std::set<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(output.begin(), output.end());
    for (int32_t id : seen) {
      float& v = x[static_cast<size_t>(id)];
      v = v > 0 ? v / params.repetition_penalty : v * params.repetition_penalty;
    }
  }
  std::vector<int32_t> counts(x.size(), 0);
  for (int32_t id : output) ++counts[static_cast<size_t>(id)];
  for (size_t id = 0; id < x.size(); ++id)
    if (counts[id] > 0)
      x[id] -= params.frequency_penalty * static_cast<float>(counts[id]) + params.presence_penalty;
  return x;
}

// Equal as floats (so -0 == +0, the one difference LogitEdit allows), NaN
// matching NaN.
bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

TEST(LogitsProcessor, MergedEditsEqualTheSequentialOrder) {
  std::mt19937_64 rng(20261129);
  const int32_t vocab = 40;
  const auto pick = [&](int lo, int hi) {
    return static_cast<int32_t>(std::uniform_int_distribution<int>(lo, hi)(rng));
  };
  for (int trial = 0; trial < 300; ++trial) {
    SamplingParams params;
    const float penalties[] = {1.0f, 1.0f, 1.3f, 0.7f, 2.0f};
    params.repetition_penalty = penalties[pick(0, 4)];
    params.frequency_penalty = pick(0, 2) == 0 ? 0.0f : static_cast<float>(pick(-20, 20)) / 10.3f;
    params.presence_penalty = pick(0, 2) == 0 ? 0.0f : static_cast<float>(pick(-14, 14)) / 7.1f;
    params.min_tokens = pick(0, 4);
    params.ignore_eos = pick(0, 3) == 0;
    for (int b = pick(0, 8); b > 0; --b)
      params.logit_bias[pick(0, vocab - 1)] = static_cast<float>(pick(-970, 970)) / 9.7f;
    for (int t = pick(0, 2); t > 0; --t) params.stop_token_ids.push_back(pick(0, vocab - 1));
    const std::vector<int32_t> eos = {pick(0, vocab - 1), 3};  // 3 is also often biased
    params.logit_bias[3] = 2.5f;
    std::vector<int32_t> prompt;
    for (int t = pick(0, 12); t > 0; --t) prompt.push_back(pick(0, vocab - 1));
    LogitsProcessor processor(params, vocab, eos, prompt);
    std::vector<int32_t> output;
    for (int step = 0; step < 8; ++step) {
      std::vector<float> row(static_cast<size_t>(vocab));
      for (float& v : row) {
        const int kind = pick(0, 9);
        v = kind == 0 ? -kInf : kind == 1 ? 0.0f : kind == 2 ? -0.0f : kind == 3 ? kInf
                                                                      : static_cast<float>(pick(-500, 500)) / 13.0f;
      }
      const std::vector<float> want = sequential(params, eos, prompt, output, row);
      const std::vector<float> got = applied(processor, row);
      for (int32_t i = 0; i < vocab; ++i)
        EXPECT_TRUE(same_value(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]))
            << "trial " << trial << " step " << step << " token " << i << ": " << got[static_cast<size_t>(i)]
            << " != " << want[static_cast<size_t>(i)];
      // The edits name each token once, in order, on the row asked for.
      std::vector<LogitEdit> edits;
      processor.edits(7, edits);
      EXPECT_EQ(edits.empty(), !processor.active());
      for (size_t e = 0; e < edits.size(); ++e) {
        EXPECT_EQ(edits[e].row, 7);
        if (e > 0) {
          EXPECT_LT(edits[e - 1].token, edits[e].token);
        }
      }
      // Applied by a backend to one row of several, they give the same row.
      CpuBackend backend;
      Tensor logits = Tensor::zeros({9, vocab}, DType::kF32);
      std::copy(row.begin(), row.end(), logits.data<float>() + 7 * vocab);
      backend.adjust_logits(logits, edits);
      for (int32_t i = 0; i < vocab; ++i)
        EXPECT_TRUE(same_value(logits.data<float>()[7 * vocab + i], want[static_cast<size_t>(i)]));
      for (int32_t i = 0; i < vocab * 7; ++i) EXPECT_EQ(logits.data<float>()[i], 0.0f);
      const int32_t next = pick(0, vocab - 1);
      processor.append(next);
      output.push_back(next);
    }
  }
}

TEST(LogitsProcessor, EditsOfSeveralRowsAppend) {
  SamplingParams params;
  params.logit_bias[2] = 1.0f;
  LogitsProcessor p(params, 5, std::vector<int32_t>{}, std::vector<int32_t>{});
  std::vector<LogitEdit> edits;
  p.edits(0, edits);
  p.edits(3, edits);
  ASSERT_EQ(edits.size(), 2u);
  EXPECT_EQ(edits[0].row, 0);
  EXPECT_EQ(edits[1].row, 3);
  EXPECT_EQ(edits[1].token, 2);
  EXPECT_EQ(edits[1].bias, 1.0f);
}

// The engine reads logprobs through Backend::top_k_rows: on the CPU backend
// it returns exactly what top_k_logprobs does, ties and all.
TEST(LogitsProcessor, TopKRowsMatchesTopKLogprobs) {
  std::mt19937_64 rng(7);
  CpuBackend backend;
  for (int64_t vocab : {1, 5, 64, 1000}) {
    const int64_t rows = 6;
    Tensor x = Tensor::empty({rows, vocab}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(std::uniform_int_distribution<int>(-30, 0)(rng)) / 4.0f;
    x.data<float>()[0] = -kInf;
    for (int k : {1, 3, 20, 64}) {
      if (k > vocab) continue;
      Tensor values = Tensor::empty({rows, k}, DType::kF32), ids = Tensor::empty({rows, k}, DType::kI32);
      backend.top_k_rows(x, k, values, ids);
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<TokenLogprob> want = top_k_logprobs(
            std::span<const float>(x.data<float>() + r * vocab, static_cast<size_t>(vocab)), k);
        ASSERT_EQ(want.size(), static_cast<size_t>(k));
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(ids.data<int32_t>()[r * k + j], want[static_cast<size_t>(j)].id) << vocab << " " << k;
          EXPECT_EQ(values.data<float>()[r * k + j], want[static_cast<size_t>(j)].logprob);
        }
      }
    }
  }
}

}  // namespace
}  // namespace basalt
