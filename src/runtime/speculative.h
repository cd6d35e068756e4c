// Speculative decoding's proposals and options.
//
// A decoding request may carry draft tokens into a step: the step computes
// its last token and the drafts together (k + 1 rows of logits) and samples
// every row; a draft is accepted while the token sampled before it equals
// it (model_runner.h: StepResult::accepted). Because sampling draws with
// sampling_uniform(seed, output index) (backend/sampling_rng.h), the row for
// output index n draws exactly what plain decoding would draw there, so the
// tokens that come out are the tokens plain decoding gives, token for token,
// at any temperature, whatever was proposed: a wrong draft only costs the
// rows after it. Each draft is accepted with the probability the target
// model gives it, which is what rejection sampling (Leviathan et al. 2023)
// gives for a proposal that puts all its mass on one token, as n-gram
// lookup does.
//
// Adaptive length (SpeculativeOptions::adaptive_from_batch): with at least
// that many requests running, a request's next drafts are capped by its last
// verification, a + 1 after a rejection at draft a (the row that disagreed
// is worth one more try), twice the drafts after all were accepted, up to
// kMaxDrafts, so that where the model disagrees the rejected rows stay few.
// Rows cost compute on the CPU at any batch; on a GPU a few more rows cost
// almost nothing until the batch is large (bench/README.md has both).
//
// Jump-forward (SchedulerOptions::jump_forward) uses the same verification:
// where a constrained request's grammar forces text, that text is its
// drafts (TokenConstraint::forced_tokens), up to kMaxDrafts tokens, before
// any n-gram lookup.
//
// Contract: propose_ngram() is a pure function of its arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace basalt {

// The most drafts per request per step, from any proposer.
inline constexpr int kMaxDrafts = 16;

enum class SpeculativeAlgorithm : uint8_t {
  kNone,
  kNgram,  // prompt lookup: the tokens that followed the latest earlier match of the text's last n tokens
  // The model's own multi-token-prediction layer (Model::draft_head): after
  // each step it reads the target's final hidden states and the tokens that
  // follow them, keeps its own KV, and drafts the token after the next;
  // for k > 1 it runs again on its own hidden state and that draft, and so
  // on (a chain, as vLLM and SGLang run one MTP layer for several tokens).
  kMtp,
  // An EAGLE-style head trained on the target's hidden states
  // (model/eagle_head.h, loaded beside the model as its draft head): it
  // drafts exactly as kMtp does.
  kEagle,
  // A separate small model with the target's vocabulary
  // (EngineOptions::draft_model; models/basalt-draft beside the bundled
  // model): after each step it reads the tokens the step kept, with its own
  // KV slot for slot beside the target's, and drafts greedily from the token
  // just sampled on, a chain of k (SGLang's STANDALONE, vLLM's draft_model).
  kDraft,
};

// "mtp" (also "deepseek_mtp", vLLM's name), "eagle", "ngram" (also "prompt_lookup",
// vLLM's older name), "draft" (also "draft_model", vLLM's, and "standalone",
// SGLang's), "none"; throws
// basalt::Error for another name, listing these.
SpeculativeAlgorithm parse_speculative_algorithm(std::string_view name);
std::string_view to_string(SpeculativeAlgorithm algorithm);
// Whether the algorithm drafts with the model's draft head (Model::draft_head:
// MTP's layer or an EAGLE head), which reads the target's hidden states.
inline bool drafts_with_head(SpeculativeAlgorithm algorithm) {
  return algorithm == SpeculativeAlgorithm::kMtp || algorithm == SpeculativeAlgorithm::kEagle;
}

struct SpeculativeOptions {
  SpeculativeAlgorithm algorithm = SpeculativeAlgorithm::kNone;
  int num_draft_tokens = 4;  // most drafts per request per step (k)
  // n-gram lookup: the longest suffix tried first, down to the shortest.
  int ngram_max = 4;
  int ngram_min = 2;
  // Cap each request's drafts by its last verification (above) while at
  // least this many requests run; 0: never.
  int adaptive_from_batch = 1;
  // No drafts at all (n-gram, MTP or jump-forward's) while at least this
  // many requests run or wait: a large batch keeps the device busy, and rows it
  // verifies in vain cost compute (vLLM's speculative_disable_by_batch_size).
  // 0: never. The default lies between the batches measured (drafts pay at
  // 1 and lose at 64 on the H200 and the CPU; bench/README.md).
  int disable_from_batch = 32;
  // A draft head's single drafts (k = 1) reach the host after the step's
  // samples: the host updates its requests and plans the next step while
  // the head runs, and that step takes the drafts on the device, waiting
  // for their values only once its forward pass is queued
  // (StepPlan::device_drafts). false: the step returns once its
  // drafts are on the host too (what the benchmark compares against).
  bool drafts_behind_samples = true;
  bool enabled() const { return algorithm != SpeculativeAlgorithm::kNone && num_draft_tokens > 0; }
  // Throws basalt::Error when a field is out of range.
  void validate() const;
};

// The options --speculative-algorithm NAME --speculative-num-draft-tokens K
// give (the n-gram sizes at their defaults);
// throws basalt::Error for a bad name or count.
SpeculativeOptions speculative_options(std::string_view algorithm, int num_draft_tokens);

// Verification's rule: how many of `drafts` are accepted when the rows
// before them (the last token's, then each draft's) sampled `sampled`
// (drafts.size() + 1 of them, each drawn as plain decoding draws at its
// output index): while the row before a draft sampled exactly it. The
// output is then sampled[0 .. accepted], which is plain decoding's text.
size_t accepted_drafts(std::span<const int32_t> sampled, std::span<const int32_t> drafts);

// Up to `k` tokens to follow `tokens`: for n from max_n down to min_n, the
// latest earlier place where the last n tokens occur, and what followed it
// there (fewer than k where the text ends first). Empty when no such n-gram
// recurs.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int k, int min_n, int max_n);

// Predicted outputs (OpenAI's `prediction`): text the client expects most of
// the output to repeat (a file being edited, say), whose tokens a request
// drafts from, whatever the engine's own proposer. The lookup follows the
// output through the prediction: a cursor at the prediction token the next
// output token should be; each new output token that equals it moves it on;
// one that does not loses the place, and the place is found again at the
// first occurrence, at or after the last place that held, else anywhere, of
// the output's longest suffix (kPredictionMaxMatch tokens down to 1) in the
// prediction. Drafts are the prediction's tokens from the cursor. Finding
// the place again looks only where the output's last token occurs (an
// index built at the first loss), at most kRealignCandidates of those from
// each starting point, so that a long prediction costs a step little.
//
// Contract: propose() depends only on the prediction, the outputs it was
// shown before and the one it is shown now (an output that is not an
// extension of the last one shown starts the walk again).
class PredictionLookup {
 public:
  static constexpr int kPredictionMaxMatch = 8;
  static constexpr size_t kRealignCandidates = 256;

  explicit PredictionLookup(std::vector<int32_t> prediction) : prediction_(std::move(prediction)) {}
  // Up to k drafts to follow `output` (the request's output tokens so far).
  std::vector<int32_t> propose(std::span<const int32_t> output, int k);
  size_t size() const { return prediction_.size(); }

 private:
  void realign(std::span<const int32_t> output);

  std::vector<int32_t> prediction_;
  std::unordered_map<int32_t, std::vector<size_t>> where_;  // token -> its places, ascending (built when first lost)
  size_t cursor_ = 0;        // where the next output token should be; npos: lost
  size_t last_good_ = 0;     // the cursor's last place before it was lost
  size_t seen_ = 0;          // output tokens walked so far
  int32_t last_seen_ = -1;   // the last of them, to tell an unrelated output
};

}  // namespace basalt
