// The generator with the full sampling controls, on the small Llama fixture:
// determinism, penalties and bias in the expected direction, stop ids,
// min_tokens and stop strings through the streamed text.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";

class GeneratorSampling : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = new CpuBackend();
    model_ = load_model(kLlama, *backend_).release();
    tokenizer_ = new Tokenizer(Tokenizer::from_file(kLlama + "/tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete backend_;
  }

  static GenerateOptions greedy(int max_tokens) {
    GenerateOptions o;
    o.temperature = 0;
    o.max_tokens = max_tokens;
    o.ignore_eos = true;
    return o;
  }
  GenerateResult run(const GenerateOptions& o, const GenerateCallbacks& callbacks = {}) {
    return generate(*model_, *backend_, tokenizer_, prompt_, o, callbacks);
  }

  static CpuBackend* backend_;
  static Model* model_;
  static Tokenizer* tokenizer_;
  const std::vector<int32_t> prompt_ = {139, 190, 81, 313, 198, 84};
};
CpuBackend* GeneratorSampling::backend_ = nullptr;
Model* GeneratorSampling::model_ = nullptr;
Tokenizer* GeneratorSampling::tokenizer_ = nullptr;

int repeats(const std::vector<int32_t>& ids) {
  return static_cast<int>(ids.size() - std::set<int32_t>(ids.begin(), ids.end()).size());
}

TEST_F(GeneratorSampling, SameSeedSameOutputAndNoSeedDrawsOne) {
  GenerateOptions o;
  o.max_tokens = 24;
  o.ignore_eos = true;
  o.seed = 42;
  const GenerateResult a = run(o), b = run(o);
  EXPECT_EQ(a.output_ids, b.output_ids);
  EXPECT_EQ(a.seed, 42u);
  o.seed = 43;
  EXPECT_NE(run(o).output_ids, a.output_ids);
  o.seed.reset();
  const GenerateResult c = run(o), d = run(o);
  EXPECT_NE(c.seed, d.seed);
  EXPECT_NE(c.output_ids, d.output_ids);
  // The reported seed reproduces the run.
  o.seed = c.seed;
  EXPECT_EQ(run(o).output_ids, c.output_ids);
}

TEST_F(GeneratorSampling, DefaultsKeepTheGreedyReference) {
  const std::vector<int32_t> expected = {8, 75, 76, 250, 69, 133, 262, 30};
  const GenerateResult r = run(greedy(8));
  EXPECT_EQ(r.output_ids, expected);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(r.stop_reason));
}

TEST_F(GeneratorSampling, HugeRepetitionPenaltyNeverRepeats) {
  GenerateOptions o = greedy(48);
  const GenerateResult plain = run(o);
  EXPECT_GT(repeats(plain.output_ids), 0) << "the fixture should repeat without a penalty";
  o.repetition_penalty = 1e6f;
  const GenerateResult r = run(o);
  EXPECT_EQ(repeats(r.output_ids), 0);
  for (int32_t id : r.output_ids)
    EXPECT_EQ(std::count(prompt_.begin(), prompt_.end(), id), 0) << "prompt token " << id;
}

TEST_F(GeneratorSampling, FrequencyAndPresencePenaltiesReduceRepeats) {
  GenerateOptions o = greedy(48);
  const int plain = repeats(run(o).output_ids);
  o.frequency_penalty = 2;
  const int frequency = repeats(run(o).output_ids);
  EXPECT_LT(frequency, plain);
  o.frequency_penalty = 0;
  o.presence_penalty = 2;
  EXPECT_LT(repeats(run(o).output_ids), plain);
  // Negative penalties encourage repetition.
  o.presence_penalty = 0;
  o.frequency_penalty = -2;
  EXPECT_GT(repeats(run(o).output_ids), plain);
}

TEST_F(GeneratorSampling, LogitBiasForcesAndBansTokens) {
  GenerateOptions o = greedy(6);
  const GenerateResult plain = run(o);
  o.logit_bias = {{77, 100}};
  EXPECT_EQ(run(o).output_ids, std::vector<int32_t>(6, 77));
  o.logit_bias = {{plain.output_ids[0], -100}};
  const GenerateResult banned = run(o);
  EXPECT_EQ(std::count(banned.output_ids.begin(), banned.output_ids.end(), plain.output_ids[0]), 0);
}

TEST_F(GeneratorSampling, StopIdsEosAndMinTokens) {
  const GenerateResult plain = run(greedy(8));
  const int32_t first = plain.output_ids[0], third = plain.output_ids[2];
  // An eos id: "stop" with no stop_reason; the token is kept in output_ids.
  GenerateOptions o = greedy(8);
  o.ignore_eos = false;
  o.eos_ids = {first};
  GenerateResult r = run(o);
  EXPECT_EQ(r.output_ids, std::vector<int32_t>{first});
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(r.stop_reason));
  // ignore_eos ignores eos but not stop_token_ids.
  o.ignore_eos = true;
  o.stop_token_ids = {third};
  r = run(o);
  EXPECT_EQ(r.output_ids, std::vector<int32_t>(plain.output_ids.begin(), plain.output_ids.begin() + 3));
  EXPECT_EQ(r.finish_reason, "stop");
  ASSERT_TRUE(std::holds_alternative<int32_t>(r.stop_reason));
  EXPECT_EQ(std::get<int32_t>(r.stop_reason), third);
  // min_tokens = 3: the eos id cannot come first, so generation runs on; the
  // suppression is lifted at exactly 3 tokens.
  o = greedy(8);
  o.ignore_eos = false;
  o.eos_ids = {first};
  o.min_tokens = 3;
  r = run(o);
  ASSERT_GE(r.output_ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(r.output_ids[i], first) << i;
  // Forcing the eos id with a bias: it is held back until exactly min_tokens
  // tokens are out, then it comes and stops generation.
  o.logit_bias = {{first, 100}};
  r = run(o);
  ASSERT_EQ(r.output_ids.size(), 4u);
  EXPECT_EQ(r.output_ids[3], first);
  EXPECT_EQ(r.finish_reason, "stop");
}

TEST_F(GeneratorSampling, StopStringsCutTheStreamedText) {
  const GenerateResult plain = run(greedy(16));
  // The text without stops is the tokenizer's decode of the output.
  std::vector<int32_t> text_ids;
  for (int32_t id : plain.output_ids)
    if (id < tokenizer_->vocab_size()) text_ids.push_back(id);
  ASSERT_EQ(plain.text, tokenizer_->decode(text_ids, true));
  ASSERT_GE(plain.text.size(), 12u) << plain.text;
  // Stops taken from the middle of the text (whole characters), across
  // token boundaries.
  auto is_char_start = [&](size_t i) {
    return i == plain.text.size() || (static_cast<unsigned char>(plain.text[i]) & 0xC0) != 0x80;
  };
  int checked = 0;
  for (size_t at = 1; at + 4 < plain.text.size(); ++at) {
    for (size_t len : {1u, 3u, 4u}) {
      if (!is_char_start(at) || !is_char_start(at + len)) continue;
      const std::string stop = plain.text.substr(at, len);
      const size_t first = plain.text.find(stop);
      for (bool include : {false, true}) {
        GenerateOptions o = greedy(16);
        o.stop = {"never appears here", stop};
        o.include_stop_str_in_output = include;
        std::string streamed;
        GenerateCallbacks callbacks;
        callbacks.on_text = [&](std::string_view piece) { streamed.append(piece); };
        const GenerateResult r = run(o, callbacks);
        EXPECT_EQ(r.finish_reason, "stop");
        ASSERT_TRUE(std::holds_alternative<std::string>(r.stop_reason));
        EXPECT_EQ(std::get<std::string>(r.stop_reason), stop);
        EXPECT_EQ(r.text, plain.text.substr(0, first + (include ? stop.size() : 0))) << stop;
        EXPECT_EQ(streamed, r.text);
        // The output ends with the token that completed the stop string: the
        // text final before it did not yet contain the stop.
        ASSERT_LE(r.output_ids.size(), plain.output_ids.size());
        EXPECT_TRUE(std::equal(r.output_ids.begin(), r.output_ids.end(), plain.output_ids.begin()));
        IncrementalDecoder decoder(*tokenizer_, true);
        std::string final_before;
        for (size_t i = 0; i + 1 < r.output_ids.size(); ++i)
          if (r.output_ids[i] < tokenizer_->vocab_size()) final_before += decoder.push(r.output_ids[i]);
        EXPECT_LT(final_before.size(), first + stop.size()) << stop;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10);
}

TEST_F(GeneratorSampling, StopStringsWaitForMinTokens) {
  const GenerateResult plain = run(greedy(16));
  const std::string stop = plain.text.substr(0, 2);
  GenerateOptions o = greedy(16);
  o.stop = {stop};
  o.min_tokens = 16;
  const GenerateResult r = run(o);
  EXPECT_EQ(r.output_ids, plain.output_ids);
  EXPECT_EQ(r.finish_reason, "length");
}

TEST_F(GeneratorSampling, RejectsBadOptions) {
  GenerateOptions o = greedy(4);
  o.stop = {"x"};
  EXPECT_THROW(generate(*model_, *backend_, prompt_, o), Error);
  o.stop.clear();
  o.n = 2;
  EXPECT_THROW(run(o), Error);
  o.n = 1;
  o.logit_bias = {{320, 1}};
  EXPECT_THROW(run(o), Error);
  o.logit_bias.clear();
  o.repetition_penalty = 0;
  EXPECT_THROW(run(o), Error);
}

}  // namespace
}  // namespace basalt
