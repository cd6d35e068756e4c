// Request: the scheduler's state of one engine request, and the public
// request, event and usage types the engine's clients exchange with it.
//
// A request's progress is counted in tokens (vLLM v1's "computed tokens vs
// target tokens"): `tokens` are the known tokens (the prompt, then the
// output processed so far); `pending` more are being sampled by launched
// steps and not processed yet (overlap keeps up to two steps in flight); the
// target is tokens + pending, and every launched step moves kv.computed
// toward it. A prefill chunk, a decode token and the verification of draft
// tokens are all "bring computed up to the target", differing only in how
// far the target is ahead.
//
// Invariants between steps (Scheduler::check_invariants verifies them):
//   prompt_len <= tokens.size() == prompt_len + num_output
//   kv.cached <= kv.computed <= tokens.size() + pending
//   kv.slots.size() == rounded-up-to-pages(kv.computed) (the tail of the last
//     page takes the next positions), and the slots are page-aligned
//   kv.cached is a whole number of pages, and slots [0, kv.cached) are the
//     radix cache's (locked through kv.node)
//   num_output + pending <= params.max_tokens
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/logits_processor.h"
#include "runtime/radix_cache.h"
#include "runtime/sampling_params.h"
#include "runtime/speculative.h"

namespace basalt {

using Clock = std::chrono::steady_clock;

class TokenConstraint;

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// A prompt token's score (SamplingParams::prompt_logprobs): its logprob
// given the tokens before it, its rank in that distribution (1: the most
// likely; ties share the better rank) and the `prompt_logprobs` most likely
// tokens there. Raw model logprobs: no penalty, bias or mask applies.
struct PromptLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;
};

// Why a sequence stopped, as vLLM's stop_reason: nothing (length, or an eos
// id), the stop token id, or the stop string.
using StopReason = std::variant<std::monostate, int32_t, std::string>;

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t cache_namespace = 0;  // tenant / cache salt: no sharing across
  int priority = 0;              // higher is admitted first
  std::optional<Clock::time_point> deadline;
  // Restricts which tokens may be sampled (structured output); the engine
  // advances it with every accepted token. Null: any token.
  std::shared_ptr<TokenConstraint> constraint;
  // Output tokens an earlier run of this request already produced (a
  // gateway resuming a stream whose replica failed). The request continues
  // as that run would have after them: they count as output (max_tokens,
  // min_tokens, penalties, usage.completion_tokens, the grammar), the next
  // token is drawn at their count in the seed's sequence, and only tokens
  // after them are reported. A run that had ended with the last of them (an
  // end or stop token past min_tokens, a stop string, max_tokens) ends at
  // once as it did, reporting nothing new. A continuation the run could
  // not have made (tokens past such an end, more than max_tokens, a token
  // the grammar refuses) is refused with an error.
  std::vector<int32_t> resume_output;
  // Predicted outputs (OpenAI's `prediction`): tokens the client expects the
  // output to repeat. The request drafts from them (runtime/speculative.h,
  // PredictionLookup), with or without the engine's own speculation; the
  // output is what it would be without them.
  std::vector<int32_t> prediction;
};

enum class FinishReason : uint8_t { kStop, kLength, kCancelled, kError, kDeadline };
const char* to_string(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens found in the radix cache
  int preemptions = 0;
  double queue_seconds = 0;  // submit -> first admission
  // Speculative decoding (runtime/speculative.h): tokens proposed for this
  // request and verified, and how many of them were accepted.
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  // Of those, the drafts taken from EngineRequest::prediction (OpenAI's
  // accepted_prediction_tokens and, for the rejected ones,
  // rejected_prediction_tokens).
  int64_t prediction_accepted_tokens = 0;
  int64_t prediction_rejected_tokens = 0;
};

// What a client reads from a request's stream (runtime/request_stream.h).
struct EngineEvent {
  enum class Kind : uint8_t { kToken, kFinished };
  Kind kind = Kind::kToken;
  // kToken: the id; both kinds: text that became final.
  int32_t token = -1;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  // kToken: the drawn token's logprob (natural log of the full softmax at
  // temperature 1, before penalties and filters) when params.logprobs > 0 or
  // params.sampled_logprob; NaN otherwise.
  float logprob = std::numeric_limits<float>::quiet_NaN();
  // The first kToken event of a request with params.prompt_logprobs >= 0:
  // the scores of prompt tokens 1 .. prompt_len - 1, in order.
  std::vector<PromptLogprob> prompt_logprobs;
  // Both kinds: the request's usage as of this event (a token's counts the
  // output so far; the prompt-side figures, cached_prompt_tokens among
  // them, are final from the first token on).
  Usage usage;
  // kFinished:
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  uint64_t seed = 0;
};

// What the scheduler reports about one request after a step: token ids only
// (text is the client side's business, runtime/output_processor.h).
struct RequestUpdate {
  uint64_t id = 0;
  bool finished = false;  // a kFinished event; otherwise a token
  int32_t token = -1;
  std::vector<TokenLogprob> logprobs;
  float logprob = std::numeric_limits<float>::quiet_NaN();
  std::vector<PromptLogprob> prompt_logprobs;  // as EngineEvent's
  // The token ends the request as an eos or stop id (its text is left out
  // unless include_stop_str_in_output).
  bool stop_token = false;
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  Usage usage;  // as of this update
};

// One request's KV: which slots hold its positions, how many are computed,
// and how many of the leading ones belong to the radix cache. Changed only by
// the KvManager.
struct RequestKv {
  std::vector<int32_t> slots;  // slots[p] holds position p's KV
  int64_t computed = 0;        // positions written or being written by a launched step
  int64_t cached = 0;          // leading positions whose slots are the cache's (whole pages)
  RadixNode* node = nullptr;   // the cache node they end in, locked while the request runs
};

struct Request {
  // The fields every step reads or writes for every running request come
  // first, together on a few cache lines: with hundreds of requests running,
  // the step loop meets them cold (the forward pass has just streamed the
  // weights through the caches), and each line is a miss.
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then output
  int64_t prompt_len = 0;
  int num_output = 0;
  int resumed = 0;  // of num_output, the tokens of request.resume_output
  // The resumed run had ended with its last resumed token: how. Set at
  // submit for a stop string in its text (the output side then names the
  // string in the finish), else by Scheduler::resume.
  std::optional<std::pair<FinishReason, StopReason>> resume_end;
  // Launched steps not processed yet: tokens they sample for this request,
  // the row of the latest one (a FutureToken of the next step).
  int pending = 0;
  int pending_row = 0;
  bool finished = false;
  bool preempted = false;  // since its last admission (it waits to be recomputed)
  RequestKv kv;
  // The step being planned takes positions [step_start, step_start +
  // step_len) when planned_for is that step's id.
  uint64_t planned_for = 0;
  int64_t step_start = 0;
  int64_t step_len = 0;
  // Draft tokens the step being planned (then the one in flight) verifies
  // after the last known token: its positions past the known tokens
  // (runtime/speculative.h).
  std::vector<int32_t> drafts;
  bool drafts_forced = false;  // the drafts are text its grammar forces (jump-forward)
  bool drafts_predicted = false;  // the drafts are from request.prediction
  std::unique_ptr<PredictionLookup> prediction;  // request.prediction's lookup (null: none)
  std::vector<int32_t> proposal;  // the draft head's or draft model's tokens for after the last known one
  // >= 0 while `proposal` holds kPendingDraft tokens: the row of step
  // proposal_step's result whose proposal they are (Scheduler::resolve_proposals).
  int proposal_row = -1;
  uint64_t proposal_step = 0;
  // A step ran for it while the batch was too large to draft, without the
  // draft head's or draft model's pass: their KV misses its tokens from
  // there, so it drafts from them no more (n-gram and forced text still do).
  bool draft_kv_stale = false;
  int draft_cap = kMaxDrafts;  // the most drafts its next step may carry (SpeculativeOptions::adaptive_from_batch)
  // The latest launched step's length and id.
  int64_t inflight_len = 0;
  uint64_t last_step = 0;
  uint64_t seed = 0;
  Clock::time_point last_token;
  // Built at intake, then used only by the model runner (apply, append).
  std::unique_ptr<LogitsProcessor> processor;
  Usage usage;
  // What the step loop reads of `request` every step, copied at intake
  // (Scheduler::add; `request` never changes after it) so that it sits on
  // these lines rather than on the request's cold ones.
  SamplingRow sampling;  // the sample op's controls; each sample sets its step
  TokenConstraint* constraint = nullptr;  // request.constraint
  int max_tokens = 0;
  int min_tokens = 0;
  int logprobs = 0;
  int prompt_logprobs = -1;
  bool sampled_logprob = false;
  bool ignore_eos = false;
  bool has_stop_ids = false;  // request.params.stop_token_ids is not empty

  EngineRequest request;
  uint64_t arrival = 0;  // intake order
  uint64_t group = 0;    // the samples of one submit_n share the first sample's id
  Clock::time_point submitted;
  bool admitted_once = false;
  std::string refusal;  // set at submit: the request only gets an error
  // params.prompt_logprobs: prompt positions 0 .. prompt_scored - 1 have had
  // their next token scored (by a launched step), and the scores that have
  // come back, in order, wait for the first token's update. While positions
  // are left to score, the radix cache gives the request no prefix past
  // prompt_scored (those positions must be computed).
  int64_t prompt_scored = 0;
  std::vector<PromptLogprob> prompt_scores;

  int64_t target() const { return static_cast<int64_t>(tokens.size()) + pending; }
  int64_t remaining() const { return target() - kv.computed; }
  bool prefilling() const { return kv.computed < prompt_len; }
  // Known tokens before the last still lack KV (a prompt, or the outputs of a
  // preempted request being recomputed): that part may go in chunks. The
  // rest of the target (the last known token and those sampled after it, or
  // draft tokens to verify) goes in one step.
  bool catching_up() const { return kv.computed < static_cast<int64_t>(tokens.size()) - 1; }
  std::span<const int32_t> token_span(int64_t n) const {
    return std::span<const int32_t>(tokens.data(), static_cast<size_t>(n));
  }
};

}  // namespace basalt
