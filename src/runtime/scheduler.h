// Scheduler: continuous batching as a pure state machine, with no threads and
// no model. schedule() plans a step; update(plan, result) takes the step's
// sampled tokens back and reports what happened to each request. The engine
// (runtime/engine.h) drives it from its scheduling thread and hands the plans
// to a model runner; the tests drive it with a fake runner.
//
// Contract:
//  * add() validates a request (it may finish at once with an error) and
//    queues it; finish() ends one early (cancellation, deadline, a stop
//    string the client side found); every request ends with exactly one
//    finished update, and its KV goes back (cached when it ended well).
//  * Plans run in the order schedule() made them. With overlap the engine
//    schedules step N+1 before it updates step N: a request whose input is
//    step N's token gets a FutureToken, and one whose last token (max_tokens)
//    is in flight is not scheduled again.
//  * Outputs depend only on each request (its prompt, params and seed), not
//    on what else is batched, given batch-invariant kernels.
//
// Each step brings every running request's computed tokens toward its
// target (request.h), within a per-step token budget:
//  1. requests whose known tokens all have KV (decoding: one token, later a
//     token and its drafts) take what they need, preempting the
//     lowest-priority, latest running request when no KV slot is left;
//  2. requests catching up (a prompt, or outputs recomputed after a
//     preemption) take a chunk of what the budget and memory leave (chunked
//     prefill; each chunk's whole pages enter the radix cache as soon as it
//     is launched);
//  3. queued requests are admitted while the budget, max_running and memory
//     allow (unless this step preempted): highest priority first, then
//     longest cached prefix (FCFS past lpm_max_queue waiting), each needing
//     its uncached prompt plus an output reserve to fit in free + evictable
//     slots minus the running requests' reserves. A request sharing at least
//     32 uncached leading tokens with one admitted in this step waits a step
//     and takes them from the cache; the samples of one submit_n wait for the
//     first one's prompt.
//  A request scoring its prompt (SamplingParams::prompt_logprobs) takes no
//  cached prefix past its last scored position, and a step scores at most
//  score_rows_per_step positions (their logits rows are whole
//  vocabularies), which bounds such a request's chunks.
//  A preempted request frees its unshared KV, drops its lock and is
//  recomputed later from its tokens so far. A request that fits the pool
//  alone always progresses.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine_metrics.h"
#include "runtime/kv_manager.h"
#include "runtime/request.h"
#include "runtime/speculative.h"
#include "runtime/step.h"

namespace basalt {

enum class SchedulePolicy : uint8_t { kFcfs, kLongestPrefixMatch };

struct SchedulerOptions {
  int max_running = 64;
  // Tokens per step (decode tokens plus prefill chunks); >= 1.
  int64_t step_token_budget = 512;
  // Output slots reserved per request at admission (at most its max_tokens).
  int64_t output_reserve = 16;
  SchedulePolicy policy = SchedulePolicy::kLongestPrefixMatch;
  int lpm_max_queue = 128;
  int32_t vocab_size = 0;
  int64_t max_context = 0;  // the model's context length
  std::vector<int32_t> eos_ids;
  int max_logprobs = kDefaultMaxLogprobs;
  // Prompt positions one step may score (SamplingParams::prompt_logprobs);
  // 0: as many as 256 MiB of logits and logprobs hold (236 rows of a
  // 128K-token vocabulary).
  int64_t score_rows_per_step = 0;
  // Whether stop strings can be matched (a tokenizer exists on the client side).
  bool stop_strings = true;
  // Jump-forward: where a constrained request's grammar forces text (a
  // property name, `", "`, closing brackets), that text, spelled as the
  // tokenizer spells it, is drafted and verified in one step. Exact: the
  // output is token for token that of plain decoding.
  bool jump_forward = false;
  // Speculative decoding: drafts for decoding requests (runtime/speculative.h).
  SpeculativeOptions speculative;
};

// A running request's KV, for tests that watch every step.
struct RequestKvView {
  uint64_t id = 0;
  int64_t kv_len = 0;      // positions computed or being computed by a launched step
  int64_t cached_len = 0;  // leading positions whose slots are the radix cache's
  std::span<const int32_t> slots;
};

class Scheduler {
 public:
  Scheduler(KvManager& kv, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request, or finishes it at once (an update) when it is invalid.
  void add(std::unique_ptr<Request> request, std::vector<RequestUpdate>& updates);
  // Ends a request early; nothing when it is unknown or finished. kStop with
  // kept_tokens: a stop string ended it on the client side after that many
  // output tokens (the ones produced after it are discarded).
  void finish(uint64_t id, FinishReason reason, std::vector<RequestUpdate>& updates, std::string error = {},
              std::optional<int> kept_tokens = std::nullopt);
  // Finishes every request whose deadline is past.
  void expire(Clock::time_point now, std::vector<RequestUpdate>& updates);

  // Plans the next step, or null when no request can run now. A request that
  // can never run (it does not fit the pool even alone) finishes in updates.
  std::shared_ptr<StepPlan> schedule(std::vector<RequestUpdate>& updates);
  // Takes a planned step's results, in plan order. Throws basalt::Error when
  // the step failed (result.error); the caller then calls fail_all(). A row
  // that failed alone (result.row_errors) finishes its request with kError.
  void update(StepPlan& plan, StepResult& result, std::vector<RequestUpdate>& updates);
  // The drafts of the last updated step, once its result's
  // complete_proposals has run: each running request's proposal gets its
  // tokens (a plan made since carries them as kPendingDraft, which its
  // runner resolves). Call it before the next step is updated.
  void resolve_proposals(const StepResult& result);
  // After a failed step (every launched step is done or dropped): finishes
  // every request with the error and empties the cache, since launched
  // chunks entered it before their KV was written.
  void fail_all(const std::string& message, std::vector<RequestUpdate>& updates);
  // Finishes everything (the engine is stopping).
  void cancel_all(const std::string& message, std::vector<RequestUpdate>& updates);

  bool has_requests() const { return !waiting_.empty() || !running_.empty(); }
  // Whether a running request may draft in the next step (speculation, or
  // jump-forward with a constrained request running), or has a verification
  // in flight: drafts follow a request's last token, and a verification's
  // accepted count decides it, so with overlap the engine updates the step
  // in flight before it plans.
  bool wants_drafts() const;
  // Launched steps not updated yet.
  bool step_in_flight() const { return processed_step_ < next_step_id_; }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  std::vector<RequestKvView> running_kv() const;
  // Recounts the KV accounting and every request's invariants (request.h).
  void check_invariants() const;
  EngineMetrics& metrics() { return m_; }

 private:
  std::string invalid(const Request& r) const;
  // Takes in request.resume_output (EngineRequest); why it cannot, or "".
  std::string resume(Request& r);
  // The KV a finishing request may cache: its launched positions, less those
  // of a step still in flight that samples for it (an overlap's extra row).
  int64_t settled_kv(const Request& r) const;
  bool in_flight(const Request& r) const { return r.last_step > processed_step_; }
  // The step in flight samples the request's last token (max_tokens).
  static bool samples_its_last(const Request& r) { return r.pending > 0 && r.num_output + r.pending >= r.max_tokens; }
  std::vector<Request*> plan_batch(std::vector<RequestUpdate>& updates);
  // Fills r.drafts for the step being planned; whether there are any.
  bool propose_drafts(Request& r);
  // Whether the load (running and waiting requests) is too large to draft
  // (SpeculativeOptions::disable_from_batch).
  bool drafting_off() const;
  // The request's proposal from row `row` of a step's result (pending or not).
  void take_proposal(Request& r, StepResult& result, size_t row);
  // Takes the results of the draft group whose first sampled row is
  // `first`: the accepted tokens, the rejected positions' KV rolled back.
  // Returns the group's last row.
  size_t take_verified(StepPlan& plan, StepResult& result, size_t first, Clock::time_point now,
                       std::vector<RequestUpdate>& updates);
  std::shared_ptr<StepPlan> fresh_plan();
  void preempt(Request& r);
  Request* pick_victim();
  int64_t live_running() const;
  bool shares_uncached_prefix(const Request& r, const std::vector<const Request*>& admitted);
  bool sibling_prefilling(const Request& r, const std::vector<const Request*>& admitted) const;
  bool admit(Request& r, int64_t budget);
  // Of n positions from `from` that request r would take this step, how
  // many fit what is left of the step's prompt-scoring allowance.
  int64_t within_score_allowance(const Request& r, int64_t from, int64_t n) const;
  int64_t reserve_of(const Request& r) const;
  std::vector<Request*> admission_order();
  void requeue_preempted();
  // One sampled token; true when the request finished.
  bool on_token(Request& r, int32_t token, std::vector<TokenLogprob> logprobs, float logprob,
                Clock::time_point now, std::vector<RequestUpdate>& updates);
  void end(Request& r, FinishReason reason, std::vector<RequestUpdate>& updates, StopReason stop_reason = {},
           std::string error = {});
  void release_kv(Request& r, bool cache_it);
  void remove_finished();

  KvManager& kv_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  // Finished, but in a launched step not updated yet.
  std::vector<std::unique_ptr<Request>> retired_;
  uint64_t next_arrival_ = 0;
  uint64_t next_step_id_ = 0;
  uint64_t processed_step_ = 0;  // every step up to this id has been updated
  uint64_t in_flight_step_ = 0;  // the latest launched step while not updated (0: none)
  std::optional<Clock::time_point> last_exec_end_;
  // Bookkeeping that spares a pass over every request per step.
  bool running_unsorted_ = false;   // an admission may have broken (priority, arrival) order
  int64_t finished_unremoved_ = 0;  // finished requests still in waiting_ or running_
  int64_t deadlines_ = 0;           // live requests with a deadline
  std::vector<Request*> prefill_candidates_;
  int64_t score_rows_per_step_ = 0;        // prompt positions a step may score
  int64_t score_allowance_ = 0;            // of those, left in the step being planned
  std::vector<int32_t> score_logit_rows_;  // the step's score rows' logits rows, while planning
  // Plans handed out before; one that nobody else holds any more (its step
  // is updated and dropped) is refilled, arrays and all.
  std::vector<std::shared_ptr<StepPlan>> plan_pool_;
  EngineMetrics m_;
};

}  // namespace basalt
