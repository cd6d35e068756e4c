#include "runtime/scheduler.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "runtime/allowed_tokens.h"
#include "runtime/logits_processor.h"
#include "runtime/token_constraint.h"

namespace basalt {
namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// In-batch prefix sharing: a request whose prompt shares at least this many
// uncached leading tokens with one admitted in the same step waits a step,
// so that it finds them in the cache instead of computing them again.
constexpr int64_t kInBatchPrefix = 32;

// The loops over running requests meet each one cold (in the engine the
// forward pass has just streamed the weights through the caches) and reach
// it through a pointer: starting the loads of a request a few places ahead
// overlaps those misses instead of taking them one after another.
constexpr size_t kPrefetchAhead = 4;

// Of positions [from, from + n), those whose next prompt token r still has
// to score.
int64_t positions_to_score(const Request& r, int64_t from, int64_t n) {
  if (r.prompt_logprobs < 0) return 0;
  return std::max<int64_t>(0,
                           std::min(from + n, r.prompt_len - 1) - std::max(from, r.prompt_scored));
}

void prefetch_step_fields(const Request* r) {
  // The step's fields are Request's leading members, up to `request`.
  const auto* head = reinterpret_cast<const char*>(r);
  const auto* end = reinterpret_cast<const char*>(&r->request);
  for (const char* line = head; line < end; line += 64) __builtin_prefetch(line);
}

}  // namespace

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kDeadline: return "deadline";
  }
  return "unknown";
}

Scheduler::Scheduler(KvManager& kv, SchedulerOptions options) : kv_(kv), options_(std::move(options)) {
  BASALT_CHECK(options_.step_token_budget >= 1, "step_token_budget must be >= 1, got {}",
               options_.step_token_budget);
  BASALT_CHECK(options_.max_running >= 1, "max_running must be >= 1, got {}", options_.max_running);
  BASALT_CHECK(options_.output_reserve >= 0, "output_reserve must be >= 0");
  BASALT_CHECK(options_.vocab_size > 0 && options_.max_context > 0, "the scheduler needs the vocabulary and context sizes");
  m_.kv_capacity = kv_.capacity();
  BASALT_CHECK(options_.score_rows_per_step >= 0, "score_rows_per_step must be >= 0");
  // A scored position's logits and logprobs are two f32 rows of the whole
  // vocabulary.
  constexpr int64_t kScoreBytes = int64_t{256} << 20;
  score_rows_per_step_ =
      options_.score_rows_per_step > 0
          ? options_.score_rows_per_step
          : std::max<int64_t>(16, kScoreBytes / (8 * static_cast<int64_t>(options_.vocab_size)));
}

Scheduler::~Scheduler() = default;

// --- requests in and out ------------------------------------------------------

std::string Scheduler::invalid(const Request& r) const {
  const EngineRequest& q = r.request;
  if (!r.refusal.empty()) return r.refusal;
  if (q.prompt.empty()) return "the prompt is empty";
  for (int32_t id : q.prompt)
    if (id < 0 || id >= options_.vocab_size)
      return fmt::format("prompt token id {} is outside the vocabulary (0..{})", id, options_.vocab_size - 1);
  try {
    q.params.validate(options_.vocab_size, options_.max_logprobs);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (q.params.n != 1) return fmt::format("n must be 1, got {} (Engine::submit_n gives several samples)", q.params.n);
  if (!q.params.stop.empty() && !options_.stop_strings) return "stop strings need a tokenizer to match against the text";
  const int64_t need = static_cast<int64_t>(q.prompt.size()) + q.params.max_tokens;
  if (need > options_.max_context)
    return fmt::format("prompt ({} tokens) plus max_tokens ({}) exceeds the model's context length ({})",
                       q.prompt.size(), q.params.max_tokens, options_.max_context);
  for (int32_t id : q.prediction)
    if (id < 0 || id >= options_.vocab_size)
      return fmt::format("prediction token id {} is outside the vocabulary (0..{})", id, options_.vocab_size - 1);
  if (static_cast<int64_t>(q.prediction.size()) > options_.max_context)
    return fmt::format("the prediction ({} tokens) is longer than the model's context length ({})",
                       q.prediction.size(), options_.max_context);
  if (kv_.rounded(need) > kv_.capacity())
    return fmt::format("prompt ({} tokens) plus max_tokens ({}) can never fit in the KV pool ({} slots)",
                       q.prompt.size(), q.params.max_tokens, kv_.capacity());
  return {};
}

void Scheduler::add(std::unique_ptr<Request> request, std::vector<RequestUpdate>& updates) {
  Request& r = *request;
  ++m_.requests_submitted;
  if (r.request.deadline) ++deadlines_;  // end() takes it back, whatever happens
  r.arrival = next_arrival_++;
  r.prompt_len = static_cast<int64_t>(r.request.prompt.size());
  r.usage.prompt_tokens = r.prompt_len;
  r.seed = r.request.params.seed ? *r.request.params.seed : random_seed();
  const SamplingParams& p = r.request.params;
  r.sampling = p.row(r.seed, 0);
  if (!p.allowed_token_ids.empty()) {
    // allowed_token_ids is a mask of its own; one request takes one mask.
    if (r.request.constraint == nullptr)
      r.request.constraint = std::make_shared<AllowedTokensConstraint>(p.allowed_token_ids, options_.vocab_size);
    else if (r.refusal.empty())
      r.refusal = "allowed_token_ids cannot be combined with structured output or a forced tool call";
  }
  r.constraint = r.request.constraint.get();
  r.max_tokens = p.max_tokens;
  r.min_tokens = p.min_tokens;
  r.logprobs = p.logprobs;
  r.prompt_logprobs = p.prompt_logprobs;
  r.sampled_logprob = p.sampled_logprob;
  r.ignore_eos = p.ignore_eos;
  r.has_stop_ids = !p.stop_token_ids.empty();
  if (std::string why = invalid(r); !why.empty()) return end(r, FinishReason::kError, updates, {}, std::move(why));
  if (r.request.params.max_tokens == 0) return end(r, FinishReason::kLength, updates);
  if (!r.request.prediction.empty()) r.prediction = std::make_unique<PredictionLookup>(r.request.prediction);
  try {
    r.tokens = r.request.prompt;
    r.processor = std::make_unique<LogitsProcessor>(r.request.params, options_.vocab_size, options_.eos_ids,
                                                    r.request.prompt);
    if (std::string why = resume(r); !why.empty()) return end(r, FinishReason::kError, updates, {}, std::move(why));
  } catch (const std::exception& e) {
    return end(r, FinishReason::kError, updates, {}, e.what());
  }
  // A continuation of a run that had ended (its last token, or a stop
  // string the output side found in its text) ends at once, as that run
  // did, with nothing new.
  if (r.resume_end) return end(r, r.resume_end->first, updates, std::move(r.resume_end->second));
  waiting_.push_back(std::move(request));
}

// A resumed request enters as one preempted after its resumed tokens: they
// are known tokens without KV (the recompute path prefills them with the
// prompt), they count as output, and the logits processor and the
// constraint have seen them, so the next token is the one the earlier run
// would have drawn (its sampling step is num_output, runtime/sampling_params.h).
std::string Scheduler::resume(Request& r) {
  const std::vector<int32_t>& resumed = r.request.resume_output;
  if (resumed.empty()) return {};
  const auto k = static_cast<int64_t>(resumed.size());
  if (k > r.max_tokens)
    return fmt::format("resume_output holds {} tokens and max_tokens is {}: more than the run could make", k,
                       r.max_tokens);
  std::vector<uint32_t> allowed;
  if (r.constraint != nullptr) allowed.resize(static_cast<size_t>(token_mask_words(options_.vocab_size)));
  for (int64_t j = 0; j < k; ++j) {
    const int32_t id = resumed[static_cast<size_t>(j)];
    if (id < 0 || id >= options_.vocab_size)
      return fmt::format("resume_output token {} ({}) is outside the vocabulary (0..{})", j, id,
                         options_.vocab_size - 1);
    const bool past_min = j + 1 >= r.min_tokens;
    const bool is_eos = past_min && !r.ignore_eos && contains(options_.eos_ids, id);
    const bool is_stop_id = past_min && r.has_stop_ids && contains(r.request.params.stop_token_ids, id);
    if ((is_eos || is_stop_id) && j + 1 < k)
      return fmt::format("resume_output already ends at token {} ({}, an end or stop token)", j, id);
    if (r.constraint != nullptr) {
      std::fill(allowed.begin(), allowed.end(), ~uint32_t{0});
      r.constraint->fill_allowed(allowed);
      if (((allowed[static_cast<size_t>(id) / 32] >> (static_cast<uint32_t>(id) % 32)) & 1u) == 0)
        return fmt::format("resume_output token {} ({}) is not allowed by the request's structured output there", j,
                           id);
      r.constraint->accept(id);
    }
    r.processor->append(id);
    r.tokens.push_back(id);
    // The run ended with this token: the request ends as it did (in
    // on_token's order: an end or stop token, then max_tokens).
    if (is_eos || is_stop_id) {
      StopReason stop_reason;
      if (is_stop_id && !is_eos) stop_reason = id;
      r.resume_end = {FinishReason::kStop, std::move(stop_reason)};
    } else if (j + 1 == r.max_tokens) {
      r.resume_end = {FinishReason::kLength, StopReason{}};
    }
  }
  r.num_output = static_cast<int>(k);
  r.resumed = static_cast<int>(k);
  r.usage.completion_tokens = k;
  return {};
}

void Scheduler::finish(uint64_t id, FinishReason reason, std::vector<RequestUpdate>& updates, std::string error,
                       std::optional<int> kept_tokens) {
  for (auto* list : {&waiting_, &running_})
    for (auto& r : *list) {
      if (r->id != id || r->finished) continue;
      if (kept_tokens && *kept_tokens < r->num_output) {
        // Tokens produced after the client side's stop string never reach
        // anyone: they count as discarded, not as output.
        const auto extra = static_cast<uint64_t>(r->num_output - *kept_tokens);
        m_.output_tokens -= extra;
        m_.discarded_tokens += extra;
        r->usage.completion_tokens = *kept_tokens;
      }
      end(*r, reason, updates, {}, std::move(error));
    }
  remove_finished();
}

void Scheduler::expire(Clock::time_point now, std::vector<RequestUpdate>& updates) {
  if (deadlines_ == 0) return;
  for (auto* list : {&waiting_, &running_})
    for (auto& r : *list)
      if (!r->finished && r->request.deadline && now >= *r->request.deadline)
        end(*r, FinishReason::kDeadline, updates);
  remove_finished();
}

void Scheduler::end(Request& r, FinishReason reason, std::vector<RequestUpdate>& updates, StopReason stop_reason,
                    std::string error) {
  if (r.finished) return;
  if (!r.kv.slots.empty() || r.kv.node != nullptr) release_kv(r, reason != FinishReason::kError && kv_.cache_enabled());
  switch (reason) {
    case FinishReason::kCancelled: ++m_.requests_cancelled; break;
    case FinishReason::kError: ++m_.requests_failed; break;
    case FinishReason::kDeadline: ++m_.requests_expired; break;
    case FinishReason::kStop: ++m_.requests_finished; ++m_.requests_stopped; break;
    case FinishReason::kLength: ++m_.requests_finished; break;
  }
  m_.end_to_end.observe(seconds(Clock::now() - r.submitted));
  RequestUpdate u;
  u.id = r.id;
  u.finished = true;
  u.reason = reason;
  u.stop_reason = std::move(stop_reason);
  u.error = std::move(error);
  u.usage = r.usage;
  updates.push_back(std::move(u));
  r.finished = true;
  r.planned_for = 0;
  ++finished_unremoved_;
  if (r.request.deadline) --deadlines_;
}

// Caching takes the whole pages of the settled KV; the partial last page (and
// anything past the settled KV) goes back to the pool.
void Scheduler::release_kv(Request& r, bool cache_it) {
  const int64_t settled = settled_kv(r);
  kv_.release(r.kv, r.request.cache_namespace, r.token_span(std::min<int64_t>(settled, static_cast<int64_t>(r.tokens.size()))),
              settled, cache_it);
}

int64_t Scheduler::settled_kv(const Request& r) const {
  if (r.pending == 0) return r.kv.computed;
  return std::max(r.kv.cached, r.kv.computed - r.inflight_len);
}

void Scheduler::remove_finished() {
  if (finished_unremoved_ > 0) {
    for (auto* list : {&waiting_, &running_}) {
      for (auto& r : *list)  // a step in flight still points at it
        if (r->finished && in_flight(*r)) retired_.push_back(std::move(r));
      std::erase_if(*list, [](const auto& r) { return r == nullptr || r->finished; });
    }
    finished_unremoved_ = 0;
  }
  if (!retired_.empty()) std::erase_if(retired_, [&](const auto& r) { return !in_flight(*r); });
}

void Scheduler::fail_all(const std::string& message, std::vector<RequestUpdate>& updates) {
  processed_step_ = next_step_id_;  // every launched step is done; their results are dropped
  in_flight_step_ = 0;
  for (auto* list : {&waiting_, &running_})
    for (auto& r : *list)
      if (!r->finished) {
        // KV written by a failed step is not trusted: nothing is cached.
        release_kv(*r, false);
        end(*r, FinishReason::kError, updates, {}, message);
      }
  // Launched steps insert their prefill chunks into the cache before they
  // run; the failed one's KV is not trusted, so nothing cached is kept.
  kv_.clear_cache();
  remove_finished();
}

void Scheduler::cancel_all(const std::string& message, std::vector<RequestUpdate>& updates) {
  processed_step_ = next_step_id_;
  in_flight_step_ = 0;
  for (auto* list : {&waiting_, &running_})
    for (auto& r : *list) end(*r, FinishReason::kCancelled, updates, {}, message);
  remove_finished();
}

// --- admission ------------------------------------------------------------------

// Slots the request may still take: its known tokens without a slot plus the
// output reserve, in whole pages, less the tail of its last page.
int64_t Scheduler::reserve_of(const Request& r) const {
  const int64_t out_left = r.request.params.max_tokens - r.num_output;
  const auto have = static_cast<int64_t>(r.kv.slots.size());
  const int64_t want =
      std::max(static_cast<int64_t>(r.tokens.size()), have) + std::min(out_left, options_.output_reserve);
  return kv_.rounded(want) - have;
}

void Scheduler::preempt(Request& r) {
  release_kv(r, /*cache_it=*/false);
  r.preempted = true;
  r.planned_for = 0;
  ++r.usage.preemptions;
  ++m_.preemptions;
}

Request* Scheduler::pick_victim() {
  Request* victim = nullptr;
  for (auto& r : running_) {
    if (r->preempted || r->finished) continue;
    if (victim == nullptr || r->request.priority < victim->request.priority ||
        (r->request.priority == victim->request.priority && r->arrival > victim->arrival))
      victim = r.get();
  }
  return victim;
}

int64_t Scheduler::live_running() const {
  int64_t n = 0;
  for (const auto& r : running_) n += (!r->preempted && !r->finished) ? 1 : 0;
  return n;
}

bool Scheduler::shares_uncached_prefix(const Request& r, const std::vector<const Request*>& admitted) {
  if (!kv_.cache_enabled() || admitted.empty()) return false;
  const int64_t len = static_cast<int64_t>(r.tokens.size()) - 1;
  int64_t common = 0;
  for (const Request* a : admitted) {
    if (a->request.cache_namespace != r.request.cache_namespace) continue;
    const int64_t n = std::min<int64_t>(len, static_cast<int64_t>(a->tokens.size()));
    int64_t i = 0;
    while (i < n && a->tokens[static_cast<size_t>(i)] == r.tokens[static_cast<size_t>(i)]) ++i;
    common = std::max(common, i);
  }
  if (common < kInBatchPrefix) return false;
  return common - kv_.cached_prefix(r.request.cache_namespace, r.token_span(len)) >= kInBatchPrefix;
}

// The samples of one submit_n: the first one admitted prefills the prompt;
// the others wait until its whole prompt is in the cache (however short it
// is), then compute only the last prompt token themselves.
bool Scheduler::sibling_prefilling(const Request& r, const std::vector<const Request*>& admitted) const {
  if (r.group == 0 || !kv_.cache_enabled() || r.prompt_len < 2) return false;
  for (const Request* a : admitted)
    if (a->group == r.group) return true;
  for (const auto& o : running_)
    if (o.get() != &r && o->group == r.group && !o->preempted && !o->finished && o->kv.computed < o->prompt_len)
      return true;
  return false;
}

std::vector<Request*> Scheduler::admission_order() {
  std::vector<Request*> order;
  for (auto& r : waiting_) order.push_back(r.get());
  const bool lpm = options_.policy == SchedulePolicy::kLongestPrefixMatch && kv_.cache_enabled() &&
                   static_cast<int>(waiting_.size()) <= options_.lpm_max_queue;
  std::unordered_map<const Request*, int64_t> matched;
  if (lpm)
    for (Request* r : order)
      matched[r] = kv_.cached_prefix(r->request.cache_namespace,
                                     r->token_span(static_cast<int64_t>(r->tokens.size()) - 1));
  std::stable_sort(order.begin(), order.end(), [&](const Request* a, const Request* b) {
    if (a->request.priority != b->request.priority) return a->request.priority > b->request.priority;
    if (lpm && matched[a] != matched[b]) return matched[a] > matched[b];
    return a->arrival < b->arrival;
  });
  return order;
}

bool Scheduler::admit(Request& r, int64_t budget) {
  const int64_t len = static_cast<int64_t>(r.tokens.size());
  // Positions still to score are computed, not taken from the cache.
  const bool scoring = r.prompt_logprobs >= 0 && r.prompt_scored < r.prompt_len - 1;
  const int64_t matched = kv_.take_cached_prefix(r.kv, r.request.cache_namespace,
                                                 r.token_span(scoring ? r.prompt_scored : len - 1));
  int64_t reserved = 0;
  for (auto& o : running_)
    if (!o->preempted) reserved += reserve_of(*o);
  const int64_t available = kv_.available() - reserved;
  // matched is whole pages; the rest is allocated in whole pages.
  const int64_t need =
      kv_.rounded(len + std::min<int64_t>(r.request.params.max_tokens - r.num_output, options_.output_reserve)) -
      matched;
  const bool alone = running_.empty();
  const int64_t n = within_score_allowance(r, matched, std::min(len - matched, budget));
  if ((need > available && !alone) || n <= 0 || !kv_.allocate(r.kv, n)) {
    release_kv(r, false);
    return false;
  }
  if (!r.admitted_once) {
    r.admitted_once = true;
    r.usage.cached_prompt_tokens = std::min(matched, r.prompt_len);
    m_.prompt_tokens += static_cast<uint64_t>(r.prompt_len);
    m_.cached_prompt_tokens += static_cast<uint64_t>(r.usage.cached_prompt_tokens);
    r.usage.queue_seconds = seconds(Clock::now() - r.submitted);
    m_.queue_time.observe(r.usage.queue_seconds);
  }
  r.step_start = r.kv.computed;
  r.step_len = n;
  r.planned_for = next_step_id_ + 1;
  score_allowance_ -= positions_to_score(r, r.step_start, n);
  return true;
}

int64_t Scheduler::within_score_allowance(const Request& r, int64_t from, int64_t n) const {
  if (positions_to_score(r, from, n) <= score_allowance_) return n;
  return std::max(from, r.prompt_scored) - from + score_allowance_;
}

void Scheduler::requeue_preempted() {
  for (auto& r : running_)
    if (r->preempted) waiting_.push_back(std::move(r));
  std::erase_if(running_, [](const auto& r) { return r == nullptr; });
}

// Running requests at the start of a step: in (priority, arrival) order, none
// preempted (preemption happens while planning, which requeues them).

// --- planning -------------------------------------------------------------------

std::vector<Request*> Scheduler::plan_batch(std::vector<RequestUpdate>& updates) {
  if (running_unsorted_) {
    std::stable_sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
      if (a->request.priority != b->request.priority) return a->request.priority > b->request.priority;
      return a->arrival < b->arrival;
    });
    running_unsorted_ = false;
  }
  const uint64_t step = next_step_id_ + 1;
  int64_t budget = options_.step_token_budget;
  score_allowance_ = score_rows_per_step_;
  const uint64_t preemptions_before = m_.preemptions;
  prefill_candidates_.clear();
  // 1. Requests whose known tokens have KV take the rest of their target in
  //    one go (a decode token), preempting for memory; those catching up
  //    (prefill, or recomputing after preemption) wait for what the budget
  //    leaves.
  for (size_t i = 0; i < running_.size(); ++i) {
    if (i + kPrefetchAhead < running_.size()) prefetch_step_fields(running_[i + kPrefetchAhead].get());
    Request& r = *running_[i];
    if (r.preempted || r.finished || r.remaining() < 1 || samples_its_last(r)) continue;
    if (r.pending > 0 && !r.drafts.empty()) continue;  // its verification is in flight (wants_drafts())
    if (r.catching_up()) {
      prefill_candidates_.push_back(&r);
      continue;
    }
    int64_t n = r.remaining();
    if (n == 1 && propose_drafts(r)) {
      // Drafts only where memory is at hand: they never preempt anyone.
      const int64_t with_drafts = n + static_cast<int64_t>(r.drafts.size());
      if (kv_.allocate(r.kv, with_drafts)) {
        n = with_drafts;
      } else {
        r.drafts.clear();
      }
    }
    bool ok = false;
    while (!r.preempted) {
      if (kv_.allocate(r.kv, n)) {
        ok = true;
        break;
      }
      Request* victim = pick_victim();
      if (victim == &r && live_running() == 1) break;
      preempt(*victim);
    }
    if (ok) {
      r.step_start = r.kv.computed;
      r.step_len = n;
      r.planned_for = step;
      budget -= n;
    } else if (!r.preempted) {
      end(r, FinishReason::kError, updates, {}, "no KV slot for a lone request");
    }
  }
  // 2. Chunks for those catching up, as far as budget and memory go.
  for (Request* rp : prefill_candidates_) {
    Request& r = *rp;
    if (budget <= 0) break;
    if (r.preempted || r.finished) continue;
    const int64_t avail = kv_.available() + (static_cast<int64_t>(r.kv.slots.size()) - r.kv.computed);
    const int64_t n =
        within_score_allowance(r, r.kv.computed, std::min({r.remaining(), budget, avail}));
    if (n <= 0 || !kv_.allocate(r.kv, n)) continue;
    r.step_start = r.kv.computed;
    r.step_len = n;
    r.planned_for = step;
    budget -= n;
    score_allowance_ -= positions_to_score(r, r.step_start, n);
  }
  const bool preempted_now = m_.preemptions != preemptions_before;
  if (preempted_now) requeue_preempted();
  // 3. Admission, unless memory ran out in this step (running requests first).
  const bool memory_short = preempted_now && !running_.empty();
  if (!memory_short && budget > 0 && static_cast<int>(running_.size()) < options_.max_running && !waiting_.empty()) {
    std::vector<const Request*> admitted_now;
    for (Request* r : admission_order()) {
      if (budget <= 0 || static_cast<int>(running_.size()) >= options_.max_running) break;
      if (r->finished) continue;
      if (r->pending > 0) continue;                             // preempted with a token in flight: after it lands
      if (shares_uncached_prefix(*r, admitted_now)) continue;  // next step, from the cache
      if (sibling_prefilling(*r, admitted_now)) continue;      // n > 1: after the first sample's prompt
      if (!admit(*r, budget)) {
        if (live_running() == 0)
          end(*r, FinishReason::kError, updates, {}, "the request does not fit in the KV pool");
        break;
      }
      r->preempted = false;
      admitted_now.push_back(r);
      budget -= r->step_len;
      auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p.get() == r; });
      running_.push_back(std::move(*it));
      waiting_.erase(it);
      running_unsorted_ = true;
    }
  }
  std::vector<Request*> batch;
  batch.reserve(running_.size());
  for (auto& r : running_)
    if (r->planned_for == step && !r->finished) batch.push_back(r.get());
  if (batch.empty() && !running_.empty() &&
      std::none_of(running_.begin(), running_.end(), [&](const auto& r) { return in_flight(*r); })) {
    // Partial prefills hold memory that none of them can extend: make room.
    if (Request* victim = pick_victim()) preempt(*victim);
    requeue_preempted();
  }
  return batch;
}

std::shared_ptr<StepPlan> Scheduler::fresh_plan() {
  // Steps in flight hold at most two plans (overlap), and the engine one
  // more until it drops the step it updated.
  constexpr size_t kPoolSize = 4;
  for (std::shared_ptr<StepPlan>& p : plan_pool_)
    if (p.use_count() == 1) {
      p->clear();
      return p;
    }
  auto plan = std::make_shared<StepPlan>();
  if (plan_pool_.size() < kPoolSize) plan_pool_.push_back(plan);
  return plan;
}

std::shared_ptr<StepPlan> Scheduler::schedule(std::vector<RequestUpdate>& updates) {
  std::vector<Request*> batch = plan_batch(updates);
  ++m_.steps;
  remove_finished();
  if (batch.empty()) return nullptr;
  std::shared_ptr<StepPlan> plan = fresh_plan();
  const uint64_t previous = step_in_flight() ? next_step_id_ : 0;
  plan->id = ++next_step_id_;
  size_t tokens = 0, kv_entries = 0;
  for (const Request* r : batch) {
    tokens += static_cast<size_t>(r->step_len);
    kv_entries += static_cast<size_t>(r->step_start + r->step_len);
  }
  plan->token_ids.reserve(tokens);
  plan->positions.reserve(tokens);
  plan->out_slots.reserve(tokens);
  plan->kv_slots.reserve(kv_entries);
  plan->q_start.reserve(batch.size() + 1);
  plan->kv_start.reserve(batch.size() + 1);
  plan->logit_rows.reserve(batch.size());
  plan->rows.reserve(batch.size());
  plan->sampled.reserve(batch.size());
  // Past the off-switch the draft head's and draft model's passes are left
  // out too (they are most of what speculation costs a step that drafts
  // nothing); the batch's requests then draft from them no more.
  const SpeculativeAlgorithm algorithm = options_.speculative.algorithm;
  const bool drafter = drafts_with_head(algorithm) || algorithm == SpeculativeAlgorithm::kDraft;
  const bool drafter_runs = drafter && !drafting_off();
  plan->capture_hidden = drafter_runs && drafts_with_head(algorithm);
  plan->draft_chain = std::max(1, options_.speculative.num_draft_tokens);
  plan->drafts_behind_samples = options_.speculative.drafts_behind_samples;
  plan->run_draft_model = drafter_runs && algorithm == SpeculativeAlgorithm::kDraft;
  if (drafter && !drafter_runs)
    for (Request* r : batch) {
      r->draft_kv_stale = true;
      r->proposal.clear();
      r->proposal_row = -1;
    }
  bool any_prefill = false, any_decode = false, any_drafts = false;
  score_logit_rows_.clear();
  for (size_t b = 0; b < batch.size(); ++b) {
    Request* r = batch[b];
    if (b + kPrefetchAhead < batch.size()) {
      // Its fields are warm from planning; its slots and last tokens are not.
      const Request* ahead = batch[b + kPrefetchAhead];
      __builtin_prefetch(ahead->kv.slots.data() + ahead->step_start);
      __builtin_prefetch(ahead->kv.slots.data());
      __builtin_prefetch(ahead->tokens.data() + ahead->tokens.size());
    }
    const int64_t known = static_cast<int64_t>(r->tokens.size());
    const auto drafts = static_cast<int64_t>(r->drafts.size());
    if (const int64_t n = positions_to_score(*r, r->step_start, r->step_len); n > 0) {
      // Each scored position's logits score the prompt token after it.
      const int64_t first = std::max(r->step_start, r->prompt_scored);
      for (int64_t pos = first; pos < first + n; ++pos) {
        score_logit_rows_.push_back(static_cast<int32_t>(plan->token_ids.size() +
                                                         static_cast<size_t>(pos - r->step_start)));
        plan->score_rows.push_back({r->tokens[static_cast<size_t>(pos + 1)], r->prompt_logprobs});
        plan->scored.push_back(r);
      }
      r->prompt_scored = first + n;
    }
    for (int64_t i = 0; i < r->step_len; ++i) {
      const int64_t pos = r->step_start + i;
      if (pos < known) {
        plan->token_ids.push_back(r->tokens[static_cast<size_t>(pos)]);
      } else if (pos - known < drafts) {
        const int32_t draft = r->drafts[static_cast<size_t>(pos - known)];
        if (draft == kPendingDraft) {
          // Still on the device, where the runner takes it from.
          BASALT_CHECK(r->proposal_row >= 0 && (plan->drafts_of == 0 || plan->drafts_of == r->proposal_step),
                       "request {}: a pending draft of no step's result", r->id);
          plan->drafts_of = r->proposal_step;
          plan->device_drafts.push_back(FutureToken{plan->token_ids.size(), r->proposal_row});
        }
        plan->token_ids.push_back(draft);
      } else {
        // The token the step in flight samples for this request.
        BASALT_CHECK(pos == known && r->pending > 0 && previous != 0 && r->last_step == previous,
                     "request {}: input {} is neither known nor sampled by the step in flight", r->id, pos);
        plan->futures_of = previous;
        plan->futures.push_back(FutureToken{plan->token_ids.size(), r->pending_row});
        plan->token_ids.push_back(-1);
      }
      plan->positions.push_back(static_cast<int32_t>(pos));
      plan->out_slots.push_back(r->kv.slots[static_cast<size_t>(pos)]);
    }
    const int64_t end_pos = r->step_start + r->step_len;
    plan->kv_slots.insert(plan->kv_slots.end(), r->kv.slots.begin(), r->kv.slots.begin() + end_pos);
    plan->q_start.push_back(static_cast<int32_t>(plan->token_ids.size()));
    plan->kv_start.push_back(static_cast<int32_t>(plan->kv_slots.size()));
    if (plan->capture_hidden) plan->next_known.push_back(end_pos < known ? r->tokens[static_cast<size_t>(end_pos)] : -1);
    const bool samples = end_pos == r->target() + drafts;
    (r->step_len == 1 + drafts && samples ? any_decode : any_prefill) = true;
    if (r->step_start < r->prompt_len)
      m_.prefill_tokens += static_cast<uint64_t>(std::min(end_pos, r->prompt_len) - r->step_start);
    // The step's KV counts as written from now on: steps run in order, so any
    // later step that reads it (a decode, or a request matching a prefill
    // chunk in the cache) runs after this one wrote it.
    const bool prefill = r->step_start < known - 1;
    kv_.advance(r->kv, r->step_len);
    r->inflight_len = r->step_len;
    r->last_step = plan->id;
    if (prefill) kv_.commit(r->kv, r->request.cache_namespace, r->tokens);
    if (samples) {
      // One row after the last known token, and one after each draft.
      const auto last = static_cast<int32_t>(plan->token_ids.size()) - 1;
      for (int64_t d = 0; d <= drafts; ++d) {
        plan->logit_rows.push_back(last - static_cast<int32_t>(drafts - d));
        SamplingRow sampling = r->sampling;
        sampling.step = static_cast<uint64_t>(r->num_output + r->pending);
        plan->rows.push_back(StepPlan::SampleRow{
            r->processor.get(), r->constraint, sampling, r->logprobs, r->logprobs > 0 || r->sampled_logprob});
        if (d < drafts) plan->rows.back().draft = r->drafts[static_cast<size_t>(d)];
        r->pending_row = static_cast<int>(plan->sampled.size());
        ++r->pending;
        plan->sampled.push_back(r);
      }
      if (drafts > 0) {
        any_drafts = true;
        m_.draft_tokens += static_cast<uint64_t>(drafts);
        r->usage.draft_tokens += drafts;
      }
    }
  }
  // A step with drafts is a verification (rows past one per request), or
  // mixed when it has prefill chunks too: models specialise only on pure
  // decode.
  if (any_drafts) plan->mode = any_prefill ? ForwardMode::kMixed : ForwardMode::kVerify;
  else plan->mode = any_prefill ? (any_decode ? ForwardMode::kMixed : ForwardMode::kExtend) : ForwardMode::kDecode;
  // The score rows' logits rows follow the sampled rows' (StepPlan::score_rows).
  plan->logit_rows.insert(plan->logit_rows.end(), score_logit_rows_.begin(),
                          score_logit_rows_.end());
  // The model wants at least one logits row; an all-prefill step computes one it ignores.
  if (plan->logit_rows.empty()) plan->logit_rows.push_back(static_cast<int32_t>(plan->token_ids.size()) - 1);
  plan->requests = std::move(batch);
  in_flight_step_ = plan->id;
  return plan;
}

bool Scheduler::propose_drafts(Request& r) {
  r.drafts.clear();
  r.drafts_forced = false;
  r.drafts_predicted = false;
  const SpeculativeOptions& spec = options_.speculative;
  const bool grammar = options_.jump_forward && r.constraint != nullptr;
  // Drafts follow the request's last known token: none while a step that
  // samples for it is in flight, and none in a batch large enough.
  if ((!grammar && !spec.enabled() && !r.prediction) || r.pending > 0 || drafting_off()) return false;
  const bool capped =
      spec.adaptive_from_batch > 0 && static_cast<int64_t>(running_.size()) >= spec.adaptive_from_batch;
  const int room = std::min(r.max_tokens - r.num_output - 1, capped ? r.draft_cap : kMaxDrafts);
  if (room <= 0) return false;
  if (grammar) {
    // The constraint is the runner's, which samples for this request only
    // in steps that are in flight (none now); forced_tokens() reads the
    // shared masker's grammar and vocabulary, which are immutable. It takes
    // the forced tokens; they go back at once.
    r.drafts = r.constraint->forced_tokens();
    if (!r.drafts.empty()) r.constraint->rollback(static_cast<int>(r.drafts.size()));
    r.drafts.resize(std::min(r.drafts.size(), static_cast<size_t>(room)));
    r.drafts_forced = !r.drafts.empty();
    if (r.drafts_forced) return true;
  }
  if (r.prediction) {
    // A predicted output outranks the engine's proposer: the client knows
    // the text. Where the output has left the prediction and no place for
    // it is found again, the proposer below drafts instead.
    const std::span<const int32_t> output(r.tokens.data() + r.prompt_len, r.tokens.size() - static_cast<size_t>(r.prompt_len));
    r.drafts = r.prediction->propose(output, room);
    r.drafts_predicted = !r.drafts.empty();
    if (r.drafts_predicted) return true;
  }
  if (!spec.enabled()) return false;
  if (drafts_with_head(spec.algorithm) || spec.algorithm == SpeculativeAlgorithm::kDraft) {
    if (r.draft_kv_stale) return false;
    const size_t n = std::min({r.proposal.size(), static_cast<size_t>(room),
                               static_cast<size_t>(spec.num_draft_tokens)});
    r.drafts.assign(r.proposal.begin(), r.proposal.begin() + static_cast<std::ptrdiff_t>(n));
    return !r.drafts.empty();
  }
  r.drafts = propose_ngram(r.tokens, std::min(spec.num_draft_tokens, room), spec.ngram_min, spec.ngram_max);
  return !r.drafts.empty();
}

bool Scheduler::drafting_off() const {
  // The queue counts (vLLM counts enqueued requests too): a burst that
  // arrives at once would otherwise draft in its first steps, while the
  // batch fills, and pay the drafts' passes for requests that stop
  // drafting a few steps later.
  const int off = options_.speculative.disable_from_batch;
  return off > 0 && static_cast<int64_t>(running_.size() + waiting_.size()) >= off;
}

bool Scheduler::wants_drafts() const {
  // A verification in flight decides by its accepted count where its
  // request's next input is: the next step is planned after it lands, even
  // when the batch has grown past drafting meanwhile (requests admitted
  // beside it), or that request would be planned on a token nobody samples.
  if (std::any_of(running_.begin(), running_.end(),
                  [](const std::unique_ptr<Request>& r) { return r->pending > 0 && !r->drafts.empty(); }))
    return true;
  if (drafting_off()) return false;
  if (options_.speculative.enabled()) return !running_.empty();
  const bool grammar = options_.jump_forward;
  return std::any_of(running_.begin(), running_.end(), [grammar](const std::unique_ptr<Request>& r) {
    return !r->finished && (r->prediction != nullptr || (grammar && r->constraint != nullptr));
  });
}

size_t Scheduler::take_verified(StepPlan& plan, StepResult& result, size_t first, Clock::time_point now,
                                std::vector<RequestUpdate>& updates) {
  Request& r = *plan.sampled[first];
  size_t last = first;
  while (plan.rows[last].draft >= 0) ++last;
  const auto drafts = static_cast<int64_t>(last - first);
  r.pending -= static_cast<int>(drafts + 1);
  r.drafts.clear();
  if (r.finished) {
    m_.discarded_tokens += static_cast<uint64_t>(drafts + 1);
    return last;
  }
  if (!result.row_errors.empty() && !result.row_errors[first].empty()) {
    end(r, FinishReason::kError, updates, {}, std::move(result.row_errors[first]));
    return last;
  }
  BASALT_CHECK(result.accepted.size() > first && result.accepted[first] >= 0 && result.accepted[first] <= drafts,
               "request {}: no verification result for its {} drafts", r.id, drafts);
  const int64_t accepted = result.accepted[first];
  take_proposal(r, result, first);
  // The KV of the rejected drafts' positions goes before any token lands,
  // so that a request ending here caches only verified positions.
  kv_.rollback(r.kv, drafts - accepted);
  m_.accepted_draft_tokens += static_cast<uint64_t>(accepted);
  if (r.drafts_forced) m_.jump_forward_tokens += static_cast<uint64_t>(accepted);
  if (r.drafts_predicted) {
    r.usage.prediction_accepted_tokens += accepted;
    r.usage.prediction_rejected_tokens += drafts - accepted;
  }
  r.draft_cap = accepted == drafts ? static_cast<int>(std::min<int64_t>(2 * drafts, kMaxDrafts))
                                   : static_cast<int>(accepted + 1);
  r.usage.accepted_tokens += accepted;
  if (m_.accepted_by_position.size() < static_cast<size_t>(drafts))
    m_.accepted_by_position.resize(static_cast<size_t>(drafts), 0);
  for (int64_t d = 0; d < accepted; ++d) ++m_.accepted_by_position[static_cast<size_t>(d)];
  m_.discarded_tokens += static_cast<uint64_t>(drafts - accepted);
  for (size_t row = first; row <= first + static_cast<size_t>(accepted); ++row)
    if (on_token(r, result.next[row], std::move(result.logprobs[row]), result.sampled_logprobs[row], now, updates))
      break;
  return last;
}

// --- results --------------------------------------------------------------------

bool Scheduler::on_token(Request& r, int32_t token, std::vector<TokenLogprob> logprobs, float logprob,
                         Clock::time_point now, std::vector<RequestUpdate>& updates) {
  if (r.num_output == r.resumed) m_.ttft.observe(seconds(now - r.submitted));
  else m_.inter_token.observe(seconds(now - r.last_token));
  r.last_token = now;
  r.tokens.push_back(token);
  ++r.num_output;
  ++r.usage.completion_tokens;
  ++m_.output_tokens;

  const bool past_min = r.num_output >= r.min_tokens;
  const bool is_eos = past_min && !r.ignore_eos && contains(options_.eos_ids, token);
  const bool is_stop_id = past_min && r.has_stop_ids && contains(r.request.params.stop_token_ids, token);
  RequestUpdate u;
  u.id = r.id;
  u.token = token;
  u.logprobs = std::move(logprobs);
  u.logprob = logprob;
  if (!r.prompt_scores.empty()) u.prompt_logprobs = std::exchange(r.prompt_scores, {});
  u.stop_token = is_eos || is_stop_id;
  u.usage = r.usage;
  updates.push_back(std::move(u));
  if (is_eos || is_stop_id) {
    StopReason stop_reason;
    if (is_stop_id && !is_eos) stop_reason = token;
    end(r, FinishReason::kStop, updates, std::move(stop_reason));
    return true;
  }
  if (r.num_output >= r.max_tokens) {
    end(r, FinishReason::kLength, updates);
    return true;
  }
  return false;
}

void Scheduler::update(StepPlan& plan, StepResult& result, std::vector<RequestUpdate>& updates) {
  processed_step_ = plan.id;
  if (in_flight_step_ == plan.id) in_flight_step_ = 0;
  m_.execute_time.observe(seconds(result.exec_end - result.exec_start));
  if (plan.chained && last_exec_end_) m_.bubble.observe(std::max(0.0, seconds(result.exec_start - *last_exec_end_)));
  last_exec_end_ = result.exec_end;
  if (!result.error.empty()) {
    last_exec_end_.reset();
    throw Error(result.error);
  }
  // The prompt scores first: a request's last ones come in the step that
  // samples its first token, whose update carries them all.
  BASALT_CHECK(result.prompt_scores.size() == plan.scored.size(),
               "step {}: {} prompt scores for {} score rows", plan.id, result.prompt_scores.size(),
               plan.scored.size());
  for (size_t s = 0; s < plan.scored.size(); ++s)
    if (!plan.scored[s]->finished)
      plan.scored[s]->prompt_scores.push_back(std::move(result.prompt_scores[s]));
  // The step's tokens all arrive now.
  const Clock::time_point now = Clock::now();
  updates.reserve(updates.size() + plan.sampled.size() + 8);
  for (size_t i = 0; i < plan.sampled.size(); ++i) {
    if (i + kPrefetchAhead < plan.sampled.size()) prefetch_step_fields(plan.sampled[i + kPrefetchAhead]);
    if (i + kPrefetchAhead / 2 < plan.sampled.size()) {
      // Its fields were asked for two requests ago: where its token goes.
      const Request* ahead = plan.sampled[i + kPrefetchAhead / 2];
      __builtin_prefetch(ahead->tokens.data() + ahead->tokens.size());
    }
    Request& r = *plan.sampled[i];
    if (plan.rows[i].draft >= 0) {
      i = take_verified(plan, result, i, now, updates);
      continue;
    }
    --r.pending;
    if (r.finished) {  // an overlap's extra row
      ++m_.discarded_tokens;
      continue;
    }
    if (!result.row_errors.empty() && !result.row_errors[i].empty()) {
      end(r, FinishReason::kError, updates, {}, std::move(result.row_errors[i]));
      continue;
    }
    take_proposal(r, result, i);
    on_token(r, result.next[i], std::move(result.logprobs[i]), result.sampled_logprobs[i], now, updates);
  }
  remove_finished();
}

void Scheduler::take_proposal(Request& r, StepResult& result, size_t row) {
  r.proposal = row < result.proposals.size() ? std::move(result.proposals[row]) : std::vector<int32_t>{};
  const bool pending = std::find(r.proposal.begin(), r.proposal.end(), kPendingDraft) != r.proposal.end();
  r.proposal_row = pending ? static_cast<int>(row) : -1;
  r.proposal_step = pending ? processed_step_ : 0;
}

void Scheduler::resolve_proposals(const StepResult& result) {
  for (const auto& r : running_) {
    if (r->proposal_row < 0) continue;
    const auto row = static_cast<size_t>(r->proposal_row);
    BASALT_CHECK(row < result.proposals.size() && result.proposals[row].size() == r->proposal.size(),
                 "request {}: its drafts came back as {} tokens, not {}", r->id,
                 row < result.proposals.size() ? result.proposals[row].size() : 0, r->proposal.size());
    r->proposal = result.proposals[row];
    r->proposal_row = -1;
  }
}

// --- checks ---------------------------------------------------------------------

std::vector<RequestKvView> Scheduler::running_kv() const {
  std::vector<RequestKvView> out;
  for (const auto& r : running_)
    if (!r->finished && !r->preempted) out.push_back({r->id, r->kv.computed, r->kv.cached, r->kv.slots});
  return out;
}

void Scheduler::check_invariants() const {
  int64_t held = 0;
  for (const auto* list : {&waiting_, &running_})
    for (const auto& r : *list) {
      kv_.check_request(r->kv);
      BASALT_CHECK(static_cast<int64_t>(r->tokens.size()) == r->prompt_len + r->num_output || r->tokens.empty(),
                   "request {}: {} tokens, prompt {} + output {}", r->id, r->tokens.size(), r->prompt_len,
                   r->num_output);
      BASALT_CHECK(r->kv.computed <= r->target(), "request {}: {} computed positions past its target {}", r->id,
                   r->kv.computed, r->target());
      BASALT_CHECK(r->num_output + r->pending <= r->request.params.max_tokens, "request {}: past max_tokens", r->id);
      held += static_cast<int64_t>(r->kv.slots.size()) - r->kv.cached;
    }
  for (const auto& r : retired_)
    BASALT_CHECK(r->kv.slots.empty() && r->kv.node == nullptr, "finished request {} still holds KV", r->id);
  kv_.check_invariants(held);
}

}  // namespace basalt
