// Speculative decoding: the n-gram proposer, and the engine with drafts,
// whose outputs must be those of plain decoding token for token (greedy and
// at temperature > 0, with and without a grammar, every page size), with
// drafts proposed and both accepted and rejected, the KV of rejected drafts
// given back and every invariant holding after every step.
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "core/error.h"
#include "grammar/structured_output.h"
#include "model/eagle_head.h"
#include "runtime/grammar_constraint.h"
#include "testing/engine_mode_test_util.h"
#include "testing/engine_test_util.h"

namespace basalt {
namespace {

using namespace basalt::testing;

TEST(NgramProposer, TheLatestEarlierMatchOfTheLongestSuffix) {
  const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3};
  // "2 3" occurred twice before: the latest (followed by 7 8 5 ...) wins.
  EXPECT_EQ(propose_ngram(t, 3, 2, 4), (std::vector<int32_t>{7, 8, 5}));
  // A longer suffix is tried first: "5 2 3" never recurs, "2 3" does.
  EXPECT_EQ(propose_ngram(t, 2, 2, 3), (std::vector<int32_t>{7, 8}));
  // What followed may be shorter than k where the text ends.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{4, 4, 4}, 5, 1, 2), (std::vector<int32_t>{4}));
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3, 4}, 3, 1, 3).empty());
  EXPECT_TRUE(propose_ngram(t, 0, 2, 4).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{}, 3, 1, 3).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{5}, 3, 1, 3).empty());
}

TEST(PredictionLookup, FollowsTheOutputAndFindsItsPlaceAgain) {
  const std::vector<int32_t> pred = {10, 11, 12, 13, 14, 15, 16, 17};
  {
    PredictionLookup p(pred);
    // Before any output: the prediction's start.
    EXPECT_EQ(p.propose(std::vector<int32_t>{}, 3), (std::vector<int32_t>{10, 11, 12}));
    // The output so far is the prediction's start: what follows it.
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11}, 3), (std::vector<int32_t>{12, 13, 14}));
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11, 12, 13, 14, 15}, 5), (std::vector<int32_t>{16, 17}));
    EXPECT_TRUE(p.propose(std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17}, 5).empty());  // all used
    EXPECT_TRUE(p.propose(std::vector<int32_t>{10, 11}, 0).empty());
  }
  {
    // A token the prediction does not have loses the place; the output's
    // longest suffix found in the prediction gives it back.
    PredictionLookup p(pred);
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11}, 2), (std::vector<int32_t>{12, 13}));
    EXPECT_TRUE(p.propose(std::vector<int32_t>{10, 11, 99}, 2).empty());  // 99 is nowhere in it
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11, 99, 13}, 2), (std::vector<int32_t>{14, 15}));
    // An inserted token, then the prediction again from where it was.
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11, 99, 13, 14, 15, 16}, 4), (std::vector<int32_t>{17}));
  }
  {
    // Deleted text: the output skips ahead, and the suffix finds where.
    PredictionLookup p(pred);
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 15}, 2), (std::vector<int32_t>{16, 17}));
  }
  {
    // A recurring token: the place is looked for from where the output left
    // the prediction, not from its start.
    PredictionLookup p(std::vector<int32_t>{1, 2, 7, 3, 4, 7, 5, 6});
    EXPECT_EQ(p.propose(std::vector<int32_t>{1, 2, 7, 3, 4}, 1), (std::vector<int32_t>{7}));
    EXPECT_EQ(p.propose(std::vector<int32_t>{1, 2, 7, 3, 4, 8, 7}, 2), (std::vector<int32_t>{5, 6}));
    // The longest suffix wins over a nearer shorter one: "2 7" is at the start.
    PredictionLookup q(std::vector<int32_t>{1, 2, 7, 3, 4, 7, 5, 6});
    EXPECT_EQ(q.propose(std::vector<int32_t>{1, 2, 7, 3, 4, 9, 2, 7}, 2), (std::vector<int32_t>{3, 4}));
  }
  {
    // An output that is not the one walked so far starts the walk again.
    PredictionLookup p(pred);
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11, 12}, 1), (std::vector<int32_t>{13}));
    EXPECT_EQ(p.propose(std::vector<int32_t>{10}, 2), (std::vector<int32_t>{11, 12}));
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 50}, 2), (std::vector<int32_t>{}));
    EXPECT_EQ(p.propose(std::vector<int32_t>{10, 11}, 2), (std::vector<int32_t>{12, 13}));
  }
  EXPECT_TRUE(PredictionLookup(std::vector<int32_t>{}).propose(std::vector<int32_t>{1, 2}, 3).empty());
}

// At temperature > 0 verification keeps the target's distribution, and a
// chi-square test over many seeds tells: a Markov chain over a few tokens is
// the target; a verification step after token x0 has a draft d drawn from
// another distribution, rows M[x0] and M[d] sampled by the real sampler with
// the request's seed at output indices 0 and 1; the output is what
// accepted_drafts() keeps, then (after a rejection) plain decoding's next
// draw. The pairs of output tokens must follow M[x0][a] * M[a][b]. A
// deliberately biased rule (take a likely draft even where the row sampled
// something else) must fail the same test.
TEST(Verification, KeepsTheTargetDistributionAtTemperatureOne) {
  constexpr int V = 4;
  const float M[V][V] = {{0.1f, 0.4f, 0.3f, 0.2f},
                         {0.5f, 0.1f, 0.2f, 0.2f},
                         {0.25f, 0.25f, 0.4f, 0.1f},
                         {0.3f, 0.3f, 0.2f, 0.2f}};
  const float q[V] = {0.05f, 0.15f, 0.7f, 0.1f};  // the proposer: not the target
  const int x0 = 0;
  CpuBackend cpu;
  const auto draw = [&](const float* probs, uint64_t seed, uint64_t index) {
    std::vector<float> logits(V);
    for (int v = 0; v < V; ++v) logits[static_cast<size_t>(v)] = std::log(probs[v]);
    const Tensor row = Tensor::from_f32({1, V}, logits);
    Tensor out = Tensor::empty({1}, DType::kI32);
    const SamplingRow sampling{1.0f, 0, 1.0f, 0.0f, seed, index};
    cpu.sample(row, std::span<const SamplingRow>(&sampling, 1), out);
    return out.data<int32_t>()[0];
  };
  // The output's first two tokens for one seed, under a rule.
  const auto pair_of = [&](uint64_t seed, bool biased) {
    std::mt19937 proposer(static_cast<uint32_t>(seed * 7919 + 1));
    std::discrete_distribution<int> from_q(q, q + V);
    const int32_t d = from_q(proposer);
    const int32_t s0 = draw(M[x0], seed, 0), s1 = draw(M[d], seed, 1);
    const int32_t sampled[] = {s0, s1};
    const size_t accepted = accepted_drafts(sampled, std::span<const int32_t>(&d, 1));
    if (biased && accepted == 0 && M[x0][d] >= 0.3f) return std::pair{d, s1};  // the bias
    if (accepted == 1) return std::pair{s0, s1};
    return std::pair{s0, draw(M[s0], seed, 1)};  // rejected: the next step draws index 1 after s0
  };
  const auto chi_square = [&](bool biased) {
    constexpr int kSeeds = 20000;
    double counts[V][V] = {};
    for (int s = 0; s < kSeeds; ++s) {
      const auto [a, b] = pair_of(1000 + static_cast<uint64_t>(s), biased);
      counts[a][b] += 1;
    }
    double x2 = 0;
    for (int a = 0; a < V; ++a)
      for (int b = 0; b < V; ++b) {
        const double expected = kSeeds * M[x0][a] * M[a][b];
        x2 += (counts[a][b] - expected) * (counts[a][b] - expected) / expected;
      }
    return x2;
  };
  // 15 degrees of freedom: 37.7 is the 0.1% critical value.
  const double exact = chi_square(false), biased = chi_square(true);
  EXPECT_LT(exact, 37.7) << "biased " << biased;
  EXPECT_GT(biased, 37.7) << "exact " << exact;
  // And the exact rule's pairs are plain decoding's, seed for seed.
  for (uint64_t seed = 1; seed < 200; ++seed) {
    const int32_t a = draw(M[x0], seed, 0);
    EXPECT_EQ(pair_of(seed, false), (std::pair{a, draw(M[a], seed, 1)})) << seed;
  }
}

TEST(NgramProposer, OptionsAndNames) {
  EXPECT_EQ(parse_speculative_algorithm("ngram"), SpeculativeAlgorithm::kNgram);
  EXPECT_EQ(parse_speculative_algorithm("none"), SpeculativeAlgorithm::kNone);
  EXPECT_EQ(parse_speculative_algorithm("mtp"), SpeculativeAlgorithm::kMtp);
  EXPECT_EQ(parse_speculative_algorithm("deepseek_mtp"), SpeculativeAlgorithm::kMtp);
  EXPECT_EQ(speculative_options("mtp", 4).num_draft_tokens, 4);  // one layer, chained
  for (const char* name : {"draft", "draft_model", "standalone"})
    EXPECT_EQ(parse_speculative_algorithm(name), SpeculativeAlgorithm::kDraft) << name;
  EXPECT_EQ(to_string(SpeculativeAlgorithm::kDraft), "draft");
  EXPECT_THROW(parse_speculative_algorithm("eagle9"), Error);
  SpeculativeOptions o;
  EXPECT_FALSE(o.enabled());
  o.algorithm = SpeculativeAlgorithm::kNgram;
  EXPECT_TRUE(o.enabled());
  o.num_draft_tokens = 17;
  EXPECT_THROW(o.validate(), Error);
  o.num_draft_tokens = 4;
  o.ngram_min = 0;
  EXPECT_THROW(o.validate(), Error);
}

struct SpecRun {
  std::vector<RequestOutput> outputs;
  EngineMetrics metrics;
};

// Prompts that repeat themselves, so that n-gram lookup finds drafts.
std::vector<std::vector<int32_t>> looping_prompts() {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> motif = random_ids(rng, 3 + static_cast<size_t>(i));
    std::vector<int32_t> p;
    for (int rep = 0; rep < 4; ++rep) p.insert(p.end(), motif.begin(), motif.end());
    prompts.push_back(p);
  }
  return prompts;
}

EngineOptions engine_options(bool speculative, int num_draft_tokens) {
  EngineOptions o = base();
  o.kv_slots = 4096;
  o.check_invariants = true;
  if (speculative) {
    o.speculative.algorithm = SpeculativeAlgorithm::kNgram;
    o.speculative.num_draft_tokens = num_draft_tokens;
    o.speculative.ngram_min = 1;
    o.speculative.ngram_max = 3;
  }
  return o;
}

// Every request's output, then the KV drained back whole, then the metrics.
SpecRun finish(Engine& engine, std::vector<RequestHandle>& handles) {
  SpecRun out;
  for (RequestHandle& h : handles) out.outputs.push_back(collect(*h));
  EXPECT_EQ(engine.drain_and_clear_cache(), engine.kv_capacity());
  out.metrics = engine.metrics();
  return out;
}

// Each looping prompt i submitted with params(i) (no request where it
// returns nullopt), then finish().
template <typename Params>
SpecRun run_looping(Engine& engine, Params params, const std::shared_ptr<const TokenMasker>& grammar = nullptr) {
  std::vector<RequestHandle> handles;
  int i = 0;
  for (const std::vector<int32_t>& prompt : looping_prompts()) {
    const std::optional<SamplingParams> p = params(i++, prompt);
    if (!p) continue;
    EngineRequest r = request(prompt, *p);
    if (grammar) r.constraint = std::make_shared<GrammarConstraint>(grammar, nullptr);
    handles.push_back(engine.submit(std::move(r)));
  }
  return finish(engine, handles);
}

// The looping prompts (or only the one at `only`), each with its own length.
SpecRun run(Fixture& f, bool speculative, float temperature, const std::shared_ptr<const TokenMasker>& grammar,
            int only = -1, int num_draft_tokens = 3, bool adaptive = true) {
  EngineOptions o = engine_options(speculative, num_draft_tokens);
  o.speculative.adaptive_from_batch = adaptive ? 1 : 0;
  Engine engine(*f.model, f.backend, f.tokenizer.get(), o);
  return run_looping(
      engine,
      [&](int i, const std::vector<int32_t>&) -> std::optional<SamplingParams> {
        if (only >= 0 && i != only) return std::nullopt;
        SamplingParams p;
        p.max_tokens = 20 + 7 * i;
        p.temperature = temperature;
        p.top_p = temperature > 0 ? 0.9f : 1.0f;
        p.seed = 40 + static_cast<uint64_t>(i);
        return p;
      },
      grammar);
}

void expect_same_outputs(const SpecRun& plain, const SpecRun& spec) {
  ASSERT_EQ(plain.outputs.size(), spec.outputs.size());
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    EXPECT_EQ(spec.outputs[i].output_ids, plain.outputs[i].output_ids) << "request " << i;
    EXPECT_EQ(spec.outputs[i].reason, plain.outputs[i].reason) << "request " << i;
  }
  EXPECT_EQ(spec.metrics.output_tokens, plain.metrics.output_tokens);
}

class Speculative : public EngineMode {};

// The looping prompts (or only the one at `only`) fed in chunks of 7
// tokens, several requests per step, each with its own length and seed, end
// of sequence ignored; `speculative` (and its draft model) applied.
SpecRun run_chunked(Fixture& f, float temperature, const SpeculativeOptions& speculative = {},
                    const std::shared_ptr<Model>& draft = nullptr, int only = -1) {
  EngineOptions o = base();
  o.kv_slots = 4096;
  o.check_invariants = true;
  o.step_token_budget = 7;  // prompts in chunks
  o.speculative = speculative;
  o.draft_model = draft;
  Engine engine(*f.model, f.backend, nullptr, o);
  return run_looping(engine, [&](int i, const std::vector<int32_t>&) -> std::optional<SamplingParams> {
    if (only >= 0 && i != only) return std::nullopt;
    SamplingParams p;
    p.max_tokens = 20 + 5 * i;
    p.temperature = temperature;
    p.seed = 90 + static_cast<uint64_t>(i);
    p.ignore_eos = true;
    return p;
  });
}

TEST_P(Speculative, GreedyOutputsAreThoseOfPlainDecoding) {
  Fixture f(kLlama);
  const SpecRun plain = run(f, false, 0.0f, nullptr);
  const SpecRun spec = run(f, true, 0.0f, nullptr);
  expect_same_outputs(plain, spec);
  EXPECT_EQ(plain.metrics.draft_tokens, 0u);
  EXPECT_GT(spec.metrics.draft_tokens, 0u);
  EXPECT_GT(spec.metrics.accepted_draft_tokens, 0u);
  EXPECT_LT(spec.metrics.accepted_draft_tokens, spec.metrics.draft_tokens);  // some were wrong, and cost nothing
  // Alone, a request that takes drafts needs fewer steps.
  for (int only = 0; only < 4; ++only) {
    const SpecRun one_plain = run(f, false, 0.0f, nullptr, only);
    const SpecRun one_spec = run(f, true, 0.0f, nullptr, only);
    expect_same_outputs(one_plain, one_spec);
    // With overlap, plain decoding plans once more while its last step is
    // in flight (an empty round, counted); the speculative steps run one
    // at a time.
    const uint64_t empty_rounds = g_overlap ? 1 : 0;
    EXPECT_EQ(one_plain.metrics.steps - one_spec.metrics.steps, one_spec.metrics.accepted_draft_tokens + empty_rounds)
        << "prompt " << only;
  }
  uint64_t by_position = 0;
  for (uint64_t n : spec.metrics.accepted_by_position) by_position += n;
  EXPECT_EQ(by_position, spec.metrics.accepted_draft_tokens);
  int64_t drafted = 0, accepted = 0;
  for (const RequestOutput& o : spec.outputs) {
    drafted += o.usage.draft_tokens;
    accepted += o.usage.accepted_tokens;
  }
  EXPECT_EQ(static_cast<uint64_t>(drafted), spec.metrics.draft_tokens);
  EXPECT_EQ(static_cast<uint64_t>(accepted), spec.metrics.accepted_draft_tokens);
}

// Every row draws with (seed, its output index), so at temperature > 0 too
// the tokens are those plain decoding draws.
TEST_P(Speculative, SampledOutputsAreThoseOfPlainDecoding) {
  Fixture f(kLlama);
  const SpecRun plain = run(f, false, 1.0f, nullptr);
  const SpecRun spec = run(f, true, 1.0f, nullptr);
  expect_same_outputs(plain, spec);
  EXPECT_GT(spec.metrics.draft_tokens, 0u);
}

// A grammar masks each draft row as if the drafts before it were accepted.
TEST_P(Speculative, ConstrainedOutputsAreThoseOfPlainDecoding) {
  Fixture f(kLlama, /*with_tokenizer=*/true);
  GrammarCache cache(TokenVocabulary::from_tokenizer(*f.tokenizer, static_cast<int32_t>(f.model->config().vocab_size),
                                                     f.model->config().eos_token_ids));
  // A small alphabet, so that the output repeats itself and drafts come
  // from it; the prompts' drafts mostly break the grammar (masked rows).
  const auto grammar = cache.get({StructuredOutputSpec::Kind::kGrammar, R"(root ::= [ab ]+ "." | "a"+ [cd]*)"});
  for (const float temperature : {0.0f, 1.0f}) {
    const SpecRun plain = run(f, false, temperature, grammar);
    const SpecRun spec = run(f, true, temperature, grammar);
    expect_same_outputs(plain, spec);
    EXPECT_GT(spec.metrics.accepted_draft_tokens, 0u) << temperature << ": " << spec.metrics.draft_tokens << " drafts";
  }
}

// Penalties, logit bias and min_tokens see each draft row as if the drafts
// before it were sampled: outputs stay plain decoding's, and drafts are
// still proposed and accepted.
TEST_P(Speculative, PenalisedOutputsAreThoseOfPlainDecoding) {
  Fixture f(kLlama);
  auto penalised = [&](bool speculative, float temperature) {
    Engine engine(*f.model, f.backend, nullptr, engine_options(speculative, 4));
    return run_looping(engine, [&](int i, const std::vector<int32_t>& prompt) -> std::optional<SamplingParams> {
      SamplingParams p;
      p.max_tokens = 24;
      p.temperature = temperature;
      p.seed = 70 + static_cast<uint64_t>(i);
      // Mild, so that the output still repeats itself and drafts land.
      if (i % 2 == 0) p.frequency_penalty = 0.2f;
      else p.repetition_penalty = 1.1f;
      if (i == 1) p.logit_bias = {{prompt[0], 0.5f}};
      if (i == 2) p.min_tokens = 10;
      p.presence_penalty = i == 3 ? 0.3f : 0.0f;
      return p;
    });
  };
  for (const float temperature : {0.0f, 1.0f}) {
    const SpecRun plain = penalised(false, temperature);
    const SpecRun spec = penalised(true, temperature);
    expect_same_outputs(plain, spec);
    EXPECT_GT(spec.metrics.draft_tokens, 0u) << temperature;
    if (temperature == 0.0f) {
      EXPECT_GT(spec.metrics.accepted_draft_tokens, 0u);
    }
  }
}

// MTP: the model's own multi-token-prediction layer drafts the token after
// the next one from each step's hidden states, and with k > 1 chains on
// its own hidden state for the tokens after that. Outputs are plain
// decoding's, greedy and sampled, with prompts fed in chunks (the head
// reads a chunk's next prompt token) and several requests per step; on the
// bundled model, whose MTP layer was trained with it, drafts are accepted.
TEST_P(Speculative, MtpDraftsGiveThePlainTokens) {
  for (const std::string& dir : {kDeepSeek, std::string(BASALT_MODEL_DIR)}) {
    Fixture f(dir);
    for (const float temperature : {0.0f, 1.0f}) {
      const SpecRun plain = run_chunked(f, temperature);
      for (int k = 1; k <= 3; k += 2) {
        const SpecRun mtp = run_chunked(f, temperature, speculative_options("mtp", k));
        expect_same_outputs(plain, mtp);
        EXPECT_GT(mtp.metrics.draft_tokens, 0u) << dir;
        if (dir != kDeepSeek && temperature == 0.0f) {
          EXPECT_GT(mtp.metrics.accepted_draft_tokens * 4, mtp.metrics.draft_tokens)
              << "k " << k << ": " << mtp.metrics.accepted_draft_tokens << " of " << mtp.metrics.draft_tokens;
          EXPECT_LT(mtp.metrics.steps, plain.metrics.steps) << "k " << k;
          // A chain's later drafts are accepted too. (Steps are no measure
          // here: the step budget of 7 tokens splits the drafts of several
          // requests over more steps.)
          if (k == 3) {
            ASSERT_GT(mtp.metrics.accepted_by_position.size(), 1u);
            EXPECT_GT(mtp.metrics.accepted_by_position[1], 0u);
          }
        }
        if (k == 1) {
          // Drafts that reach the host after the samples (the next step
          // planned meanwhile, the drafts written in before it runs) are
          // the drafts a step that waits for them gets: same tokens; and for
          // one request alone, same drafts accepted and same steps (with
          // several, where their submissions fall between the engine's
          // steps varies from run to run, and with it how the 7-token budget
          // splits their drafts: a loaded CI machine once counted 62 steps
          // against 59).
          SpeculativeOptions waiting = speculative_options("mtp", k);
          waiting.drafts_behind_samples = false;
          const SpecRun waited = run_chunked(f, temperature, waiting);
          expect_same_outputs(plain, waited);
          const SpecRun mtp_one = run_chunked(f, temperature, speculative_options("mtp", k), nullptr, 1);
          const SpecRun waited_one = run_chunked(f, temperature, waiting, nullptr, 1);
          expect_same_outputs(mtp_one, waited_one);
          EXPECT_GT(mtp_one.metrics.draft_tokens, 0u) << dir;
          EXPECT_EQ(waited_one.metrics.draft_tokens, mtp_one.metrics.draft_tokens) << dir;
          EXPECT_EQ(waited_one.metrics.accepted_draft_tokens, mtp_one.metrics.accepted_draft_tokens) << dir;
          EXPECT_EQ(waited_one.metrics.steps, mtp_one.metrics.steps) << dir;
        }
      }
    }
  }
  // A model without the layer is refused at once.
  Fixture llama(kLlama);
  EngineOptions o = base();
  o.kv_slots = 256;
  o.speculative = speculative_options("mtp", 1);
  try {
    Engine engine(*llama.model, llama.backend, nullptr, o);
    ADD_FAILURE() << "an engine with mtp on a model without the layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no multi-token-prediction layer"), std::string::npos) << e.what();
  }
}

// The bundled EAGLE head (models/basalt-mini-eagle, trained on the bundled
// model's own text) drafts in place of the MTP layer: plain decoding's
// tokens, greedy and sampled, alone and chained; greedy, its drafts are
// accepted and the steps fall.
TEST_P(Speculative, BundledEagleHeadGivesThePlainTokens) {
  const std::string dir = BASALT_MODEL_DIR;
  Fixture f(dir);
  f.model = with_draft_head(std::move(f.model), load_eagle_head(dir + "-eagle", f.backend, dir));
  for (const float temperature : {0.0f, 1.0f}) {
    const SpecRun plain = run_chunked(f, temperature);
    for (int k = 1; k <= 3; k += 2) {
      const SpecRun eagle = run_chunked(f, temperature, speculative_options("eagle", k));
      expect_same_outputs(plain, eagle);
      EXPECT_GT(eagle.metrics.draft_tokens, 0u);
      if (temperature == 0.0f) {
        // These prompts are random ids repeated, not the text it learned
        // from: a quarter accepted is the bar the MTP test sets too.
        EXPECT_GT(eagle.metrics.accepted_draft_tokens * 4, eagle.metrics.draft_tokens)
            << "k " << k << ": " << eagle.metrics.accepted_draft_tokens << " of " << eagle.metrics.draft_tokens;
      }
    }
  }
  // Steps are measured on each request alone: together, how the 7-token
  // budget splits their drafts over steps depends on where their
  // submissions fall between the engine's steps (a change of rounding once
  // left 48 steps against 48 with drafts accepted). Alone, a greedy request
  // whose drafts are accepted takes fewer steps.
  int measured = 0;
  for (int only = 0; only < static_cast<int>(looping_prompts().size()); ++only) {
    const SpecRun plain_one = run_chunked(f, 0.0f, {}, nullptr, only);
    const SpecRun eagle_one = run_chunked(f, 0.0f, speculative_options("eagle", 1), nullptr, only);
    expect_same_outputs(plain_one, eagle_one);
    if (eagle_one.metrics.accepted_draft_tokens > 0) {
      ++measured;
      EXPECT_LT(eagle_one.metrics.steps, plain_one.metrics.steps)
          << "request " << only << ": " << eagle_one.metrics.accepted_draft_tokens << " drafts accepted";
    }
  }
  EXPECT_GT(measured, 0) << "no request alone had a draft accepted";
}

// A separate draft model: it reads each step's kept tokens with its own KV
// beside the target's and drafts greedily from the token just sampled.
// Outputs are plain decoding's, greedy and sampled, prompts in chunks,
// several requests per step, k = 1 and 3. A model drafting for itself is
// accepted every time at temperature 0 (its KV mirrors the target's, so its
// logits are the target's); the bundled draft model, trained on the bundled
// model's data, has drafts accepted for the bundled model.
TEST_P(Speculative, DraftModelGivesThePlainTokens) {
  const std::string bundled = std::string(BASALT_MODEL_DIR);
  const std::string bundled_draft = bundled + "/../basalt-draft";
  for (const auto& [dir, draft_dir] : {std::pair{kLlama, kLlama}, std::pair{bundled, bundled_draft}}) {
    Fixture f(dir);
    const std::shared_ptr<Model> draft = load_model(draft_dir, f.backend);
    for (const float temperature : {0.0f, 1.0f}) {
      const SpecRun plain = run_chunked(f, temperature);
      for (int k = 1; k <= 3; k += 2) {
        const SpecRun spec = run_chunked(f, temperature, speculative_options("draft", k), draft);
        expect_same_outputs(plain, spec);
        const EngineMetrics& m = spec.metrics;
        EXPECT_GT(m.draft_tokens, 0u) << dir;
        if (temperature > 0.0f) continue;
        if (dir == draft_dir) {
          EXPECT_EQ(m.accepted_draft_tokens, m.draft_tokens) << "k " << k;
        } else {
          EXPECT_GT(m.accepted_draft_tokens * 5, m.draft_tokens)
              << "k " << k << ": " << m.accepted_draft_tokens << " of " << m.draft_tokens;
        }
      }
    }
  }
  // More sampling requests in one step than the draft's scratch slots: the
  // ones past them draft nothing, and every output is still plain decoding's.
  {
    Fixture llama(kLlama);
    std::shared_ptr<Model> self = load_model(kLlama, llama.backend);
    const auto crowd = [&](bool speculate) {
      EngineOptions o = base();
      o.kv_slots = 16384;
      o.max_running = 1100;
      o.step_token_budget = 4096;
      if (speculate) {
        o.speculative = speculative_options("draft", 1);
        o.speculative.disable_from_batch = 0;
        o.draft_model = self;
      }
      Engine engine(*llama.model, llama.backend, nullptr, o);
      std::vector<RequestHandle> handles;
      for (int i = 0; i < 1100; ++i) {
        SamplingParams p;
        p.max_tokens = 3;
        p.temperature = 0.0f;
        p.ignore_eos = true;
        handles.push_back(engine.submit(request({2 + i % 300, 3 + i % 200}, p)));
      }
      return finish(engine, handles);
    };
    expect_same_outputs(crowd(false), crowd(true));
  }
  // Without a draft model, or with one whose vocabulary is larger, the
  // engine is refused at once.
  Fixture llama(kLlama);
  EngineOptions o = base();
  o.kv_slots = 256;
  o.speculative = speculative_options("draft", 1);
  EXPECT_THROW(Engine(*llama.model, llama.backend, nullptr, o), Error);
  o.draft_model = load_model(bundled_draft, llama.backend);
  ASSERT_GT(o.draft_model->config().vocab_size, llama.model->config().vocab_size);
  try {
    Engine engine(*llama.model, llama.backend, nullptr, o);
    ADD_FAILURE() << "a draft model with a larger vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

// The off-switch: no drafts while the batch is at least
// disable_from_batch requests; the same tokens either way.
TEST_P(Speculative, NoDraftsInABatchAtTheOffSwitch) {
  Fixture f(kLlama);
  auto batch_of_four = [&](int off) {
    EngineOptions o = engine_options(true, 4);
    o.speculative.disable_from_batch = off;
    Engine engine(*f.model, f.backend, nullptr, o);
    return run_looping(engine, [](int, const std::vector<int32_t>&) -> std::optional<SamplingParams> {
      return greedy(24);
    });
  };
  const SpecRun never = batch_of_four(0), at_five = batch_of_four(5), at_one = batch_of_four(1);
  expect_same_outputs(never, at_one);
  expect_same_outputs(never, at_five);
  EXPECT_GT(never.metrics.draft_tokens, 0u);
  EXPECT_EQ(at_five.metrics.draft_tokens, never.metrics.draft_tokens);  // four never reach five
  EXPECT_EQ(at_one.metrics.draft_tokens, 0u);
  // Requests of different lengths: the batch falls past a switch at 3 as
  // they finish, and the last two draft (with overlap, the steps before
  // overlap and those after run one at a time); the tokens are the same.
  const auto shrinking = [&](int off) {
    EngineOptions o = engine_options(true, 4);
    o.speculative.disable_from_batch = off;
    Engine engine(*f.model, f.backend, nullptr, o);
    return run_looping(engine, [](int i, const std::vector<int32_t>&) -> std::optional<SamplingParams> {
      return greedy(12 + 10 * i);
    });
  };
  const SpecRun all_along = shrinking(0), from_two = shrinking(3);
  expect_same_outputs(all_along, from_two);
  EXPECT_GT(from_two.metrics.draft_tokens, 0u);
  EXPECT_LT(from_two.metrics.draft_tokens, all_along.metrics.draft_tokens);
  SpeculativeOptions bad = speculative_options("ngram", 4);
  bad.disable_from_batch = -1;
  EXPECT_THROW(bad.validate(), Error);
}

// Counts what speculation asks of a model: forward passes that keep hidden
// states, and the draft head's passes (the head is wrapped).
class CountingModel final : public Model {
 public:
  explicit CountingModel(Model& inner) : inner_(inner), head_(inner.draft_head(), *this) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override { return inner_.allocate_kv(num_slots, dtype); }
  size_t kv_bytes_per_slot(DType dtype) const override { return inner_.kv_bytes_per_slot(dtype); }
  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    passes += 1;
    hidden_passes += hidden != nullptr;
    inner_.forward(batch, kv, logits, hidden);
  }
  DraftHead* draft_head() override { return head_.inner != nullptr ? &head_ : nullptr; }
  int passes = 0, hidden_passes = 0, head_passes = 0;

 private:
  struct Head final : DraftHead {
    Head(DraftHead* h, CountingModel& m) : inner(h), model(m) {}
    KvBuffers allocate_kv(int64_t n, DType dtype) const override { return inner->allocate_kv(n, dtype); }
    size_t kv_bytes_per_slot(DType dtype) const override { return inner->kv_bytes_per_slot(dtype); }
    void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                 Tensor* hidden_out) override {
      ++model.head_passes;
      inner->forward(batch, hidden, kv, logits, hidden_out);
    }
    DraftHead* inner;
    CountingModel& model;
  };
  Model& inner_;
  Head head_;
};

// At the off-switch the draft head's and draft model's passes are left out
// too (no hidden states kept, no head or draft model pass), and the tokens
// are plain decoding's. (The switch set at 1 holds from the first step; at
// a higher one, when the batch first reaches it depends on when the
// engine's thread admits each request.)
TEST_P(Speculative, DraftPassesStopAtTheOffSwitch) {
  for (const char* algorithm : {"mtp", "draft"}) {
    SCOPED_TRACE(algorithm);
    const bool mtp = std::string(algorithm) == "mtp";
    Fixture f(mtp ? kDeepSeek : kLlama);
    const auto run_engine = [&](bool speculate, int off, CountingModel& target, CountingModel* draft) {
      EngineOptions o = engine_options(false, 0);
      if (speculate) {
        o.speculative = speculative_options(algorithm, 2);
        o.speculative.disable_from_batch = off;
        if (!mtp) o.draft_model = std::shared_ptr<Model>(draft, [](Model*) {});
      }
      Engine engine(target, f.backend, nullptr, o);
      std::vector<RequestHandle> handles;
      int i = 0;
      for (const std::vector<int32_t>& prompt : looping_prompts()) {
        if (i++ == 3) break;
        handles.push_back(engine.submit(request(prompt, greedy(16))));
      }
      return finish(engine, handles);
    };
    auto draft_model = load_model(kLlama, f.backend);
    CountingModel plain_target(*f.model), target(*f.model), never_target(*f.model);
    CountingModel draft(*draft_model), never_draft(*draft_model);
    const SpecRun plain = run_engine(false, 0, plain_target, nullptr);
    const SpecRun off = run_engine(true, 1, target, &draft);
    const SpecRun never = run_engine(true, 0, never_target, &never_draft);
    expect_same_outputs(plain, off);
    expect_same_outputs(plain, never);
    EXPECT_EQ(off.metrics.draft_tokens, 0u);
    EXPECT_EQ(target.hidden_passes, 0);
    EXPECT_EQ(target.head_passes, 0);
    EXPECT_EQ(draft.passes, 0);
    // Below the switch the passes run (the counters see them).
    EXPECT_GT(never.metrics.draft_tokens, 0u);
    if (mtp) {
      EXPECT_GT(never_target.hidden_passes, 0);
      EXPECT_GT(never_target.head_passes, 0);
    } else {
      EXPECT_GT(never_draft.passes, 0);
    }
  }
}

// Adaptive length: after a rejection at draft a a request drafts a + 1,
// so where the model disagrees fewer rows are wasted: fewer drafts, a
// higher share accepted, the same tokens.
TEST_P(Speculative, AdaptiveLengthDraftsLessWhereTheModelDisagrees) {
  Fixture f(kLlama);
  for (const float temperature : {0.0f, 1.0f}) {
    const SpecRun fixed = run(f, true, temperature, nullptr, -1, 8, /*adaptive=*/false);
    const SpecRun adaptive = run(f, true, temperature, nullptr, -1, 8, /*adaptive=*/true);
    expect_same_outputs(fixed, adaptive);
    EXPECT_LT(adaptive.metrics.draft_tokens, fixed.metrics.draft_tokens) << temperature;
    if (temperature > 0) continue;  // sampled, these prompts' drafts are all rejected
    EXPECT_GT(adaptive.metrics.accepted_draft_tokens * fixed.metrics.draft_tokens,
              fixed.metrics.accepted_draft_tokens * adaptive.metrics.draft_tokens)
        << temperature << ": " << adaptive.metrics.accepted_draft_tokens << "/" << adaptive.metrics.draft_tokens
        << " against " << fixed.metrics.accepted_draft_tokens << "/" << fixed.metrics.draft_tokens;
  }
}

// Predicted outputs draft from the client's text with or without the
// engine's own speculation: the output is plain decoding's whatever the
// prediction says, a right prediction takes most of the steps away, and the
// usage counts the prediction's drafts apart.
TEST_P(Speculative, PredictedOutputsAreThoseOfPlainDecoding) {
  Fixture f(kLlama);
  for (const float temperature : {0.0f, 1.0f}) {
    const SpecRun plain = run(f, false, temperature, nullptr);
    for (const bool engine_speculates : {false, true})
      for (const int edit : {0, 1, 2}) {
        // 0: the prediction is the output; 1: with a token changed and one
        // inserted in the middle; 2: unrelated tokens (drafts, if any, are
        // rejected; the output is the same).
        Engine engine(*f.model, f.backend, nullptr, engine_options(engine_speculates, 3));
        std::vector<RequestHandle> handles;
        std::mt19937 rng(7);
        int i = 0;
        for (const std::vector<int32_t>& prompt : looping_prompts()) {
          SamplingParams p;
          p.max_tokens = 20 + 7 * i;
          p.temperature = temperature;
          p.top_p = temperature > 0 ? 0.9f : 1.0f;
          p.seed = 40 + static_cast<uint64_t>(i);
          EngineRequest r = request(prompt, p);
          std::vector<int32_t> predicted = plain.outputs[static_cast<size_t>(i)].output_ids;
          if (edit == 1) {
            const size_t mid = predicted.size() / 2;
            predicted[mid] = (predicted[mid] + 1) % 200;
            predicted.insert(predicted.begin() + static_cast<std::ptrdiff_t>(mid / 2), 3);
          } else if (edit == 2) {
            predicted = random_ids(rng, predicted.size());
          }
          r.prediction = predicted;
          handles.push_back(engine.submit(std::move(r)));
          ++i;
        }
        const SpecRun got = finish(engine, handles);
        const std::string what = "temperature " + std::to_string(temperature) + (engine_speculates ? ", n-gram" : "") +
                                 ", edit " + std::to_string(edit);
        SCOPED_TRACE(what);
        expect_same_outputs(plain, got);
        int64_t accepted = 0, rejected = 0;
        for (const RequestOutput& o : got.outputs) {
          accepted += o.usage.prediction_accepted_tokens;
          rejected += o.usage.prediction_rejected_tokens;
          EXPECT_LE(o.usage.prediction_accepted_tokens, o.usage.accepted_tokens);
        }
        const auto total = static_cast<int64_t>(plain.metrics.output_tokens);
        if (edit == 0) {
          // Every token but the prefill's and each verification's last
          // (sampled after the drafts) was an accepted draft: at most 16
          // drafts a step, so at most 3 verifications for these lengths.
          EXPECT_GE(accepted, total - 4 - 4 * 3);
          EXPECT_EQ(rejected, 0);
          EXPECT_LT(got.metrics.steps * 3, plain.metrics.steps);
        }
        if (edit == 1) {
          EXPECT_GT(accepted, total / 2);
          EXPECT_GT(rejected, 0);
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, Speculative, ::testing::Combine(::testing::Values(false, true), ::testing::Values(1, 16)));

}  // namespace
}  // namespace basalt
