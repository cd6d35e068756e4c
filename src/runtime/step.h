// One engine step as it passes from the scheduler to the model runner and
// back: the StepPlan (what to compute and sample), the StepResult (what was
// sampled), and the FutureToken that lets a plan consume a token its
// predecessor has not sampled yet.
//
// Contract: a StepPlan is built by Scheduler::schedule() on the scheduling
// thread and is then read-only until Scheduler::update() takes it back with
// its StepResult. The runner reads only the plan's batch arrays and rows (and
// the shared logits processors and constraints they point to); the
// scheduler's bookkeeping (`requests`, `sampled`) is its own. Plans run in
// the order they were scheduled.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/forward_batch.h"
#include "runtime/request.h"

namespace basalt {

class LogitsProcessor;
class TokenConstraint;

// A draft whose value the step before has not brought to the host yet: the
// draft head still runs on the device when its step's samples come back
// (StepResult::complete_proposals). A plan carries it in token_ids and a
// row's `draft`, and names it in StepPlan::device_drafts: the runner moves
// it into the step's input ids on the device, without waiting, and writes
// its value into the plan once the forward pass is queued.
constexpr int32_t kPendingDraft = -2;

// An input token that the step launched just before this one samples
// (overlap): row `row` of that step's sampled tokens goes to input `index`
// of this step. The runner resolves it before the forward pass.
struct FutureToken {
  size_t index = 0;  // position in StepPlan::token_ids
  int32_t row = 0;   // sampled row of the previous step
};

struct StepPlan {
  uint64_t id = 0;
  ForwardMode mode = ForwardMode::kExtend;
  // The ForwardBatch, as host arrays (model/forward_batch.h gives their
  // meaning). A FutureToken's input holds -1 until resolved.
  std::vector<int32_t> token_ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  uint64_t futures_of = 0;  // the step whose tokens the futures are (0: none)
  std::vector<FutureToken> futures;
  // The kPendingDraft inputs: input `index` takes the draft the head of
  // step drafts_of made for that step's result row `row` (the row whose
  // StepResult::proposals holds it).
  uint64_t drafts_of = 0;
  std::vector<FutureToken> device_drafts;
  // Run the model's draft head after sampling (SpeculativeAlgorithm::kMtp):
  // the forward pass keeps its final hidden states, and per sequence
  // next_known holds the token after its last input when that is known
  // already (a prefill chunk that does not end the prompt), else -1.
  bool capture_hidden = false;
  std::vector<int32_t> next_known;
  // How many tokens the draft head drafts per sampling sequence: the first
  // from the target's hidden state, each next from the head's own hidden
  // state and the token it drafted before (a chain).
  int draft_chain = 1;
  // SpeculativeOptions::drafts_behind_samples: a head's single drafts may
  // come back after the samples (StepResult::complete_proposals).
  bool drafts_behind_samples = false;
  // Run the draft model after sampling (SpeculativeAlgorithm::kDraft): it
  // reads the tokens each sequence kept and drafts draft_chain tokens after
  // the one sampled.
  bool run_draft_model = false;

  // One per sampled logits row, in order. The processor and constraint are
  // the request's, which outlives every plan that names it (a finished
  // request is kept until its last launched step is updated).
  struct SampleRow {
    LogitsProcessor* processor = nullptr;
    TokenConstraint* constraint = nullptr;  // may be null
    SamplingRow sampling;
    int logprobs = 0;
    bool sampled_logprob = false;  // report the drawn token's logprob
    // Speculative decoding: >= 0 when the next row is the same request's,
    // one position on, whose input is this draft token. The rows of one
    // request form a group: its first row samples after the last known
    // token, each later row after one more draft. A draft is accepted while
    // the row before it sampled exactly it (StepResult::accepted).
    int32_t draft = -1;
  };
  std::vector<SampleRow> rows;
  // Prompt scoring (SamplingParams::prompt_logprobs): after the sampled
  // rows' entries, logit_rows has one per ScoreRow, whose logits score
  // `token` (the prompt token after that position) with `logprobs`
  // alternatives. Nothing is sampled from them, and no processor or mask
  // touches them.
  struct ScoreRow {
    int32_t token = 0;
    int logprobs = 0;
  };
  std::vector<ScoreRow> score_rows;
  // Whether the last step before it ran back to back with it (for the
  // "bubble" metric).
  bool chained = false;

  // The scheduler's: the requests in the batch and, per sampled row, whose.
  std::vector<Request*> requests;
  std::vector<Request*> sampled;
  std::vector<Request*> scored;  // per score row, whose

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Back to a new plan's state, keeping the arrays' capacity (the scheduler
  // refills plans whose steps are done).
  void clear();
};

inline void StepPlan::clear() {
  id = 0;
  mode = ForwardMode::kExtend;
  for (auto* v : {&token_ids, &positions, &out_slots, &kv_slots, &logit_rows, &next_known}) v->clear();
  q_start.assign(1, 0);
  kv_start.assign(1, 0);
  futures_of = 0;
  futures.clear();
  drafts_of = 0;
  device_drafts.clear();
  capture_hidden = false;
  draft_chain = 1;
  drafts_behind_samples = false;
  run_draft_model = false;
  rows.clear();
  score_rows.clear();
  chained = false;
  requests.clear();
  sampled.clear();
  scored.clear();
}

struct StepResult {
  std::vector<int32_t> next;                     // per sampled row
  std::vector<std::vector<TokenLogprob>> logprobs;  // per row, top alternatives when asked
  std::vector<float> sampled_logprobs;           // per row; NaN where not asked
  std::vector<PromptLogprob> prompt_scores;         // per score row
  // Per sampled row, only when some row failed (empty otherwise): the
  // error of a row whose constraint threw (a grammar too ambiguous to
  // follow, say). That request fails alone; its sample is meaningless.
  std::vector<std::string> row_errors;
  // Per sampled row, only when the step has draft groups (empty otherwise):
  // on a group's first row, how many of its drafts were accepted (the
  // group's first 1 + accepted sampled tokens are the request's next
  // tokens; the rest are dropped).
  std::vector<int32_t> accepted;
  // Per sampled row, only when the plan captured hidden states: on a
  // group's first row, the draft head's tokens for after the group's last
  // accepted token (up to draft_chain of them; empty: none).
  std::vector<std::vector<int32_t>> proposals;
  // Set when the proposals are still on their way from the device (their
  // tokens are kPendingDraft, their number final): the host takes the
  // samples, updates its requests and plans the next step while the draft
  // head runs. Waits for the drafts and writes them into `proposals`; call
  // it once, before the next step runs.
  std::function<void(StepResult&)> complete_proposals;
  std::string error;                             // non-empty: the step failed
  Clock::time_point exec_start, exec_end;
};

}  // namespace basalt
