// Structured output through the engine: a GrammarConstraint per request
// (and per sample) keeps every output a sentence of its grammar, with
// jump-forward on and off, overlap on and off and every page size; the
// outputs do not depend on overlap, and jump-forward saves sampling steps.
#include <gtest/gtest.h>

#include <string_view>

#include "core/error.h"
#include "grammar/structured_output.h"
#include "runtime/grammar_constraint.h"
#include "testing/engine_mode_test_util.h"
#include "testing/engine_test_util.h"

namespace basalt {
namespace {

using namespace basalt::testing;

// Long fixed stretches (jump-forward takes them) between short free parts.
const char* kRecordGrammar = R"(
  root  ::= "{\"name\": \"" [a-z]{1,6} "\", \"count\": " [1-9] [0-9]? ", \"ok\": " ("true" | "false") "}"
)";
// The grammar's language, checked by hand (not by the grammar engine).
bool is_record(std::string_view t) {
  auto take = [&](std::string_view lit) {
    if (t.substr(0, lit.size()) != lit) return false;
    t.remove_prefix(lit.size());
    return true;
  };
  auto count_of = [&](char lo, char hi, size_t most) {
    size_t n = 0;
    while (n < most && n < t.size() && t[n] >= lo && t[n] <= hi) ++n;
    t.remove_prefix(n);
    return n;
  };
  if (!take("{\"name\": \"")) return false;
  const size_t letters = count_of('a', 'z', 6);
  if (letters < 1 || !take("\", \"count\": ") || count_of('1', '9', 1) != 1) return false;
  count_of('0', '9', 1);
  if (!take(", \"ok\": ") || !(take("true") || take("false"))) return false;
  return take("}") && t.empty();
}

struct ConstrainedRun {
  std::vector<RequestOutput> outputs;
  EngineMetrics metrics;
};

ConstrainedRun run_constrained(Fixture& f, bool jump_forward, bool overlap, int n) {
  GrammarCache cache(TokenVocabulary::from_tokenizer(*f.tokenizer, static_cast<int32_t>(f.model->config().vocab_size),
                                                     f.model->config().eos_token_ids));
  StructuredOutputSpec spec{StructuredOutputSpec::Kind::kGrammar, kRecordGrammar};
  const std::shared_ptr<const TokenMasker> masker = cache.get(spec);
  EngineOptions o = slots(2048);
  o.overlap = overlap;
  o.jump_forward = jump_forward;
  Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) {
    SamplingParams p;
    p.max_tokens = 200;
    p.temperature = i == 0 ? 0.0f : 1.0f;
    p.seed = 11 + static_cast<uint64_t>(i);
    EngineRequest r{{139, 190, 81, 313 + i}, p, 0, 0, std::nullopt,
                    std::make_shared<GrammarConstraint>(masker, f.tokenizer.get()), {}, {}};
    for (RequestHandle& h : engine.submit_n(std::move(r), n)) handles.push_back(std::move(h));
  }
  // And one unconstrained request beside them.
  handles.push_back(engine.submit(EngineRequest{{139, 190}, greedy(12), 0, 0, std::nullopt, nullptr, {}, {}}));
  ConstrainedRun run;
  for (RequestHandle& h : handles) run.outputs.push_back(collect(*h));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  run.metrics = engine.metrics();
  return run;
}

// Jump-forward drafts the forced text and verifies it: the documents are
// the grammar's sentences and, greedy or sampled, with n > 1 and beside an
// unconstrained request, token for token those of plain decoding, in fewer
// steps. Overlap (a parameter) waits for the step in flight while a
// constrained request runs, and changes nothing either.
TEST_P(EngineMode, JumpForwardGivesTheTokensOfPlainDecodingInFewerSteps) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  const ConstrainedRun sampled = run_constrained(f, /*jump_forward=*/false, g_overlap, 2);
  const ConstrainedRun jumped = run_constrained(f, /*jump_forward=*/true, g_overlap, 2);
  for (const ConstrainedRun* run : {&sampled, &jumped}) {
    ASSERT_EQ(run->outputs.size(), 7u);
    for (size_t i = 0; i + 1 < run->outputs.size(); ++i) {
      const RequestOutput& o = run->outputs[i];
      EXPECT_EQ(o.reason, FinishReason::kStop) << o.text;
      EXPECT_TRUE(is_record(o.text)) << o.text;
    }
    EXPECT_EQ(run->outputs.back().output_ids.size(), 12u);  // the unconstrained one is untouched
  }
  for (size_t i = 0; i < sampled.outputs.size(); ++i)
    EXPECT_EQ(jumped.outputs[i].output_ids, sampled.outputs[i].output_ids) << "request " << i;
  EXPECT_EQ(sampled.metrics.jump_forward_tokens, 0u);
  EXPECT_EQ(sampled.metrics.draft_tokens, 0u);
  EXPECT_GT(jumped.metrics.jump_forward_tokens, 20u);
  EXPECT_EQ(jumped.metrics.jump_forward_tokens, jumped.metrics.accepted_draft_tokens);
  EXPECT_LT(jumped.metrics.steps, sampled.metrics.steps);
}

// Alone, with a grammar that is mostly forced text: most drafts are
// accepted, and every accepted draft is a step saved (greedy and sampled).
TEST_P(EngineMode, EachAcceptedForcedDraftSavesAStep) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  GrammarCache cache(TokenVocabulary::from_tokenizer(*f.tokenizer, static_cast<int32_t>(f.model->config().vocab_size),
                                                     f.model->config().eos_token_ids));
  const auto grammar = cache.get({StructuredOutputSpec::Kind::kGrammar,
                                  R"(root ::= ("{\"name\": \"" [a-z]{1,4} "\", \"count\": " [1-9] "}\n")+)"});
  for (uint64_t seed = 0; seed < 3; ++seed) {
    ConstrainedRun runs[2];
    for (int jump = 0; jump < 2; ++jump) {
      EngineOptions o = slots(2048);
      o.jump_forward = jump == 1;
      o.check_invariants = true;
      Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
      SamplingParams p;
      p.max_tokens = 60;
      p.temperature = seed == 0 ? 0.0f : 1.0f;
      p.seed = seed;
      EngineRequest r{{139, 190, 81}, p, 0, 0, std::nullopt, std::make_shared<GrammarConstraint>(grammar, f.tokenizer.get()), {}, {}};
      runs[jump].outputs.push_back(collect(*engine.submit(std::move(r))));
      EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
      runs[jump].metrics = engine.metrics();
    }
    const EngineMetrics& m = runs[1].metrics;
    EXPECT_EQ(runs[1].outputs[0].output_ids, runs[0].outputs[0].output_ids) << "seed " << seed;
    EXPECT_GT(m.accepted_draft_tokens * 2, m.draft_tokens) << "seed " << seed;
    // With overlap, plain decoding also runs a step past the request's last
    // token (computed and dropped); jump-forward waits for each step.
    if (g_overlap) {
      EXPECT_GE(runs[0].metrics.steps - m.steps, m.jump_forward_tokens) << "seed " << seed;
    } else {
      EXPECT_EQ(runs[0].metrics.steps - m.steps, m.jump_forward_tokens) << "seed " << seed;
    }
    EXPECT_LT(m.steps * 3, runs[0].metrics.steps * 2) << "seed " << seed;
  }
}

// A constraint that fails after some tokens, as a grammar too ambiguous to
// follow does: its request ends with the error, the others in its steps
// go on untouched.
class FailingConstraint : public TokenConstraint {
 public:
  FailingConstraint(int fail_at, bool in_accept) : fail_at_(fail_at), in_accept_(in_accept) {}
  void fill_allowed(std::span<uint32_t>) override {
    if (!in_accept_ && accepted_ == fail_at_) throw Error("the constraint gave up");
  }
  void accept(int32_t) override {
    if (in_accept_ && accepted_ == fail_at_) throw Error("the constraint gave up");
    ++accepted_;
  }
  void rollback(int n) override { accepted_ -= n; }
  std::shared_ptr<TokenConstraint> fresh_copy() const override {
    return std::make_shared<FailingConstraint>(fail_at_, in_accept_);
  }

 private:
  int fail_at_;
  bool in_accept_;
  int accepted_ = 0;
};

TEST_P(EngineMode, AFailingConstraintFailsOnlyItsRequest) {
  Fixture f(kLlama);
  EngineOptions o = slots(2048);
  Engine engine(*f.model, f.backend, nullptr, o);
  const RequestOutput alone = collect(*engine.submit(EngineRequest{{7, 8, 9}, greedy(24), 0, 0, std::nullopt, nullptr, {}, {}}));
  for (bool in_accept : {false, true}) {
    RequestHandle failing = engine.submit(EngineRequest{{139, 190}, greedy(40), 0, 0, std::nullopt,
                                                        std::make_shared<FailingConstraint>(5, in_accept), {}, {}});
    RequestHandle beside = engine.submit(EngineRequest{{7, 8, 9}, greedy(24), 0, 0, std::nullopt, nullptr, {}, {}});
    const RequestOutput failed = collect(*failing);
    EXPECT_EQ(failed.reason, FinishReason::kError);
    EXPECT_NE(failed.error.find("the constraint gave up"), std::string::npos) << failed.error;
    EXPECT_LE(failed.output_ids.size(), 5u);
    const RequestOutput other = collect(*beside);
    EXPECT_EQ(other.reason, FinishReason::kLength);
    EXPECT_EQ(other.output_ids, alone.output_ids);
  }
  EXPECT_EQ(engine.metrics().requests_failed, 2u);
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

// A token outside the mask reaches accept() only through a bug; the error
// names the token and says whether the mask itself let it through, which
// tells a masker bug from a sampler that ignored the mask.
// A structured request resumed after k of its tokens (EngineRequest::
// resume_output) continues as the full run did, for every k, with
// jump-forward on: the grammar, its distinct items and its bounded strings
// are primed with the resumed tokens.
TEST_P(EngineMode, ResumedStructuredRequestsContinueAsTheFullRun) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  GrammarCache cache(TokenVocabulary::from_tokenizer(*f.tokenizer, static_cast<int32_t>(f.model->config().vocab_size),
                                                     f.model->config().eos_token_ids));
  const auto masker = cache.get({StructuredOutputSpec::Kind::kJsonSchema,
                                 R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true,
                                     "items": {"type": "string", "maxLength": 4}, "minItems": 2, "maxItems": 3},
                                     "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                                     "required": ["tags", "n"], "additionalProperties": false})"});
  EngineOptions o = base();
  o.kv_slots = 4096;
  o.jump_forward = true;
  o.check_invariants = true;
  Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
  for (uint64_t seed : {1, 2}) {
    SamplingParams p;
    p.max_tokens = 60;
    p.temperature = 1.0f;
    p.seed = seed;
    EngineRequest full = testing::request({139, 190, 81}, p);
    full.constraint = std::make_shared<GrammarConstraint>(masker, f.tokenizer.get());
    const RequestOutput whole = collect(*engine.submit(full));
    ASSERT_TRUE(whole.error.empty()) << whole.error;
    ASSERT_GE(whole.output_ids.size(), 4u);
    EXPECT_TRUE(whole.text.starts_with("{\"tags\":[\"")) << whole.text;  // items to keep distinct
    std::vector<EngineRequest> resumed;
    for (size_t k = 1; k < whole.output_ids.size(); ++k) {
      EngineRequest r = full;
      r.constraint = std::make_shared<GrammarConstraint>(masker, f.tokenizer.get());
      r.resume_output.assign(whole.output_ids.begin(), whole.output_ids.begin() + static_cast<std::ptrdiff_t>(k));
      resumed.push_back(std::move(r));
    }
    const std::vector<RequestOutput> out = run_all(engine, resumed);
    for (size_t j = 0; j < out.size(); ++j) {
      const size_t k = j + 1;
      EXPECT_EQ(out[j].output_ids, std::vector<int32_t>(whole.output_ids.begin() + static_cast<std::ptrdiff_t>(k),
                                                        whole.output_ids.end()))
          << "seed " << seed << " resumed after " << k << ": " << out[j].error;
      EXPECT_EQ(out[j].reason, whole.reason) << "seed " << seed << " resumed after " << k;
    }
    // The same burst without resume_output: dozens of constrained requests
    // joining one whose forced drafts are being verified (with overlap, the
    // batch grew past drafting while that verification was in flight, and
    // the next step was planned on a token nobody sampled: every request
    // failed).
    for (EngineRequest& r : resumed) {
      r.resume_output.clear();
      r.constraint = std::make_shared<GrammarConstraint>(masker, f.tokenizer.get());
    }
    for (const RequestOutput& o : run_all(engine, resumed))
      EXPECT_EQ(o.output_ids, whole.output_ids) << "seed " << seed << ": " << o.error;
  }
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
}

TEST(GrammarConstraint, ATokenOutsideTheMaskNamesItselfAndTheMask) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  GrammarCache cache(TokenVocabulary::from_tokenizer(*f.tokenizer, static_cast<int32_t>(f.model->config().vocab_size),
                                                     f.model->config().eos_token_ids));
  GrammarConstraint c(cache.get({StructuredOutputSpec::Kind::kGrammar, R"(root ::= "ab")"}));
  const std::vector<int32_t> b = f.tokenizer->encode("b", false);
  ASSERT_EQ(b.size(), 1u);
  try {
    c.accept(b[0]);
    ADD_FAILURE() << "accepted a token the grammar refuses";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("token {} (\"b\")", b[0])), std::string::npos) << m;
    EXPECT_NE(m.find("the mask refuses it; 0 tokens accepted before"), std::string::npos) << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineMode,
                         ::testing::Combine(::testing::Bool(), ::testing::Values<int32_t>(1, 16)));

}  // namespace
}  // namespace basalt
