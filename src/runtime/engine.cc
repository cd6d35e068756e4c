#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "runtime/kv_pool.h"
#include "runtime/logits_processor.h"
#include "runtime/radix_cache.h"
#include "runtime/stop_checker.h"

namespace basalt {

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

// --- RequestStream ----------------------------------------------------------

std::optional<EngineEvent> RequestStream::next_event() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || taken_last_; });
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.kind == EngineEvent::Kind::kFinished) taken_last_ = true;
  return e;
}

std::optional<EngineEvent> RequestStream::try_next_event() {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.kind == EngineEvent::Kind::kFinished) taken_last_ = true;
  return e;
}

std::optional<EngineEvent> RequestStream::next_event_until(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, until, [&] { return !events_.empty() || taken_last_; }))
    return std::nullopt;
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.kind == EngineEvent::Kind::kFinished) taken_last_ = true;
  return e;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void RequestStream::cancel() {
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    engine = engine_;
  }
  if (engine != nullptr) engine->cancel(id_);
}

void RequestStream::push(EngineEvent event) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    if (event.kind == EngineEvent::Kind::kFinished) {
      finished_ = true;
      engine_ = nullptr;
    }
    events_.push_back(std::move(event));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

void RequestStream::set_listener(std::function<void()> listener) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    pending = !events_.empty();
  }
  if (pending && listener) listener();
}

void RequestStream::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  engine_ = nullptr;
}

RequestOutput collect(RequestStream& stream) {
  RequestOutput out;
  while (std::optional<EngineEvent> e = stream.next_event()) {
    out.text += e->text;
    if (e->kind == EngineEvent::Kind::kToken) {
      out.output_ids.push_back(e->token);
      if (!e->logprobs.empty()) out.top_logprobs.push_back(std::move(e->logprobs));
      continue;
    }
    out.reason = e->reason;
    out.stop_reason = std::move(e->stop_reason);
    out.error = std::move(e->error);
    out.usage = e->usage;
    out.seed = e->seed;
  }
  return out;
}

// --- the scheduler ----------------------------------------------------------

namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

struct Sequence {
  uint64_t id = 0;
  uint64_t arrival = 0;
  RequestHandle stream;
  EngineRequest request;
  uint64_t seed = 0;
  Clock::time_point submitted;
  Clock::time_point last_token;
  bool admitted_once = false;

  std::vector<int32_t> tokens;  // prompt, then output
  int64_t prompt_len = 0;
  int num_output = 0;

  // slots[i] holds token i's KV; slots.size() == kv_done between steps.
  std::vector<int32_t> slots;
  int64_t kv_done = 0;
  int64_t tree_len = 0;       // slots[0, tree_len) are the tree's (locked)
  RadixNode* node = nullptr;  // locked while running

  std::optional<LogitsProcessor> processor;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopChecker> checker;
  Usage usage;

  // This step.
  int64_t step_start = 0;
  int64_t step_len = 0;
  bool scheduled = false;
  bool preempted = false;

  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - kv_done; }
  std::span<const int32_t> token_span(int64_t n) const {
    return std::span<const int32_t>(tokens.data(), static_cast<size_t>(n));
  }
};

class Scheduler {
 public:
  Scheduler(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions options);

  void run();

  // The inbox (any thread).
  void post(std::unique_ptr<Sequence> seq);
  void post_cancel(uint64_t id);
  void request_stop();
  int64_t drain_and_clear();
  EngineMetrics metrics() const;
  int64_t capacity() const { return pool_.capacity(); }

 private:
  void intake(std::unique_ptr<Sequence> seq);
  std::string invalid(const Sequence& seq) const;
  void step();
  // Scheduling: returns the sequences of this step's batch.
  std::vector<Sequence*> schedule();
  bool allocate_for(Sequence& seq, int64_t n);
  void preempt(Sequence& seq);
  Sequence* pick_victim();
  int64_t live_running() const;
  bool shares_uncached_prefix(const Sequence& seq, const std::vector<const Sequence*>& admitted);
  bool admit(Sequence& seq, int64_t budget);
  int64_t reserve_of(const Sequence& seq) const;
  std::vector<Sequence*> admission_order();
  // After a forward: caches the sequence's computed prefix, moving its lock.
  void cache_progress(Sequence& seq);
  // Processes one sampled token; returns true when the sequence finished.
  bool on_token(Sequence& seq, int32_t token, std::vector<TokenLogprob> logprobs);
  std::string push_text(Sequence& seq, std::string piece, bool check, std::optional<std::string>& stop);
  void finish(Sequence& seq, FinishReason reason, StopReason stop_reason = {},
              std::string error = {}, std::string text = {});
  void free_kv(Sequence& seq, bool cache_it);
  void remove_finished();
  void fail_all(const std::string& message);
  void publish();

  Model& model_;
  Backend& backend_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  int32_t vocab_;
  std::vector<int32_t> eos_ids_;
  KvPool pool_;
  KvBuffers kv_;
  RadixCache cache_;

  std::vector<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<std::unique_ptr<Sequence>> done_;  // finished this step
  uint64_t next_arrival_ = 0;
  EngineMetrics m_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> cancels_;
  bool stop_ = false;
  bool clear_requested_ = false;
  uint64_t clear_generation_ = 0;
  int64_t clear_result_ = 0;
  std::condition_variable clear_cv_;
  EngineMetrics snapshot_;
};

namespace {

int64_t pool_slots(const Model& model, const EngineOptions& o) {
  if (o.kv_slots > 0) return o.kv_slots;
  const size_t budget = o.kv_budget_bytes ? o.kv_budget_bytes : KvPool::host_memory_budget(0.1);
  const int64_t from_budget = KvPool::slots_for_budget(model.kv_bytes_per_slot(o.kv_dtype), budget);
  const int64_t cap = static_cast<int64_t>(o.max_running) * model.config().max_position_embeddings;
  const int64_t slots = std::min(from_budget, std::max<int64_t>(cap, 1));
  BASALT_CHECK(slots > 0, "the KV budget of {} bytes holds no token slot", budget);
  return slots;
}

}  // namespace

Scheduler::Scheduler(Model& model, Backend& backend, const Tokenizer* tokenizer,
                     EngineOptions options)
    : model_(model),
      backend_(backend),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      vocab_(static_cast<int32_t>(model.config().vocab_size)),
      eos_ids_(options_.eos_ids ? *options_.eos_ids : model.config().eos_token_ids),
      pool_(pool_slots(model, options_)),
      kv_(model.allocate_kv(pool_.capacity(), options_.kv_dtype)),
      cache_(pool_, RadixCacheOptions{options_.radix_cache, options_.eviction}) {
  BASALT_CHECK(options_.step_token_budget >= 1, "step_token_budget must be >= 1, got {}",
               options_.step_token_budget);
  BASALT_CHECK(options_.max_running >= 1, "max_running must be >= 1, got {}", options_.max_running);
  BASALT_CHECK(options_.output_reserve >= 0, "output_reserve must be >= 0");
  m_.kv_capacity = pool_.capacity();
  snapshot_ = m_;
}

void Scheduler::post(std::unique_ptr<Sequence> seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(seq));
  }
  cv_.notify_one();
}

void Scheduler::post_cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

void Scheduler::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
}

int64_t Scheduler::drain_and_clear() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t generation = clear_generation_;
  clear_requested_ = true;
  cv_.notify_one();
  clear_cv_.wait(lock, [&] { return clear_generation_ != generation || stop_; });
  return clear_result_;
}

EngineMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void Scheduler::publish() {
  m_.running = static_cast<int64_t>(running_.size());
  m_.queued = static_cast<int64_t>(waiting_.size());
  m_.kv_used = cache_.locked_tokens() + cache_.held_tokens();
  m_.kv_cached = cache_.cached_tokens();
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = m_;
}

void Scheduler::run() {
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> inbox;
    std::vector<uint64_t> cancels;
    bool clear = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || !waiting_.empty() ||
               !running_.empty() || clear_requested_;
      });
      if (stop_) break;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      clear = clear_requested_;
    }
    for (auto& seq : inbox) intake(std::move(seq));
    for (uint64_t id : cancels) {
      for (auto* list : {&waiting_, &running_})
        for (auto& seq : *list)
          if (seq->id == id) finish(*seq, FinishReason::kCancelled);
    }
    const Clock::time_point now = Clock::now();
    for (auto* list : {&waiting_, &running_})
      for (auto& seq : *list)
        if (seq->request.deadline && now >= *seq->request.deadline)
          finish(*seq, FinishReason::kDeadline);
    remove_finished();

    if (!waiting_.empty() || !running_.empty()) {
      try {
        step();
      } catch (const std::exception& e) {
        fail_all(std::string("engine step failed: ") + e.what());
      }
      remove_finished();
      if (options_.check_invariants) cache_.check_invariants();
    } else if (clear) {
      cache_.evict(pool_.capacity());
      cache_.check_invariants();
      publish();  // the caller reads metrics that include everything before
      std::lock_guard<std::mutex> lock(mu_);
      clear_result_ = pool_.free_slots();
      clear_requested_ = false;
      ++clear_generation_;
      clear_cv_.notify_all();
    }
    publish();
  }
  // Stopping: whatever is left is cancelled.
  std::vector<std::unique_ptr<Sequence>> inbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
  }
  for (auto& seq : inbox) {
    EngineEvent ev;
    ev.kind = EngineEvent::Kind::kFinished;
    ev.reason = FinishReason::kCancelled;
    ev.error = "the engine stopped";
    seq->stream->push(std::move(ev));
  }
  for (auto* list : {&waiting_, &running_})
    for (auto& seq : *list) finish(*seq, FinishReason::kCancelled, {}, "the engine stopped");
  remove_finished();
  clear_cv_.notify_all();
}

std::string Scheduler::invalid(const Sequence& seq) const {
  const EngineRequest& r = seq.request;
  if (r.prompt.empty()) return "the prompt is empty";
  for (int32_t id : r.prompt)
    if (id < 0 || id >= vocab_)
      return fmt::format("prompt token id {} is outside the vocabulary (0..{})", id, vocab_ - 1);
  try {
    r.params.validate(vocab_, options_.max_logprobs);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (r.params.n != 1) return fmt::format("n must be 1, got {}", r.params.n);
  if (!r.params.stop.empty() && tokenizer_ == nullptr)
    return "stop strings need a tokenizer to match against the text";
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens;
  if (need > model_.config().max_position_embeddings)
    return fmt::format("prompt ({} tokens) plus max_tokens ({}) exceeds the model's context length ({})",
                       r.prompt.size(), r.params.max_tokens, model_.config().max_position_embeddings);
  if (need > pool_.capacity())
    return fmt::format("prompt ({} tokens) plus max_tokens ({}) can never fit in the KV pool ({} slots)",
                       r.prompt.size(), r.params.max_tokens, pool_.capacity());
  return {};
}

void Scheduler::intake(std::unique_ptr<Sequence> seq) {
  ++m_.requests_submitted;
  seq->arrival = next_arrival_++;
  seq->prompt_len = static_cast<int64_t>(seq->request.prompt.size());
  seq->usage.prompt_tokens = seq->prompt_len;
  seq->seed = seq->request.params.seed ? *seq->request.params.seed : random_seed();
  if (std::string why = invalid(*seq); !why.empty()) {
    finish(*seq, FinishReason::kError, {}, std::move(why));
    done_.push_back(std::move(seq));
    return;
  }
  if (seq->request.params.max_tokens == 0) {
    finish(*seq, FinishReason::kLength);
    done_.push_back(std::move(seq));
    return;
  }
  try {
    seq->tokens = seq->request.prompt;
    seq->processor.emplace(seq->request.params, vocab_, eos_ids_, seq->request.prompt);
    if (tokenizer_ != nullptr) {
      seq->decoder.emplace(*tokenizer_, seq->request.params.skip_special_tokens);
      seq->checker.emplace(seq->request.params.stop, seq->request.params.include_stop_str_in_output);
    }
  } catch (const std::exception& e) {
    finish(*seq, FinishReason::kError, {}, e.what());
    done_.push_back(std::move(seq));
    return;
  }
  waiting_.push_back(std::move(seq));
}

int64_t Scheduler::reserve_of(const Sequence& seq) const {
  const int64_t out_left = seq.request.params.max_tokens - seq.num_output;
  const int64_t unallocated = static_cast<int64_t>(seq.tokens.size()) -
                              static_cast<int64_t>(seq.slots.size());
  return std::max<int64_t>(unallocated, 0) + std::min(out_left, options_.output_reserve);
}

bool Scheduler::allocate_for(Sequence& seq, int64_t n) {
  std::optional<std::vector<int32_t>> got = cache_.allocate(n);
  if (!got) return false;
  seq.slots.insert(seq.slots.end(), got->begin(), got->end());
  return true;
}

void Scheduler::free_kv(Sequence& seq, bool cache_it) {
  std::vector<int32_t> release;
  if (cache_it && seq.kv_done > 0) {
    InsertResult ins = cache_.insert(seq.request.cache_namespace, seq.token_span(seq.kv_done),
                                     std::span<const int32_t>(seq.slots.data(), static_cast<size_t>(seq.kv_done)));
    release = std::move(ins.duplicates);
    release.insert(release.end(), seq.slots.begin() + seq.kv_done, seq.slots.end());
  } else {
    release.assign(seq.slots.begin() + seq.tree_len, seq.slots.end());
  }
  if (!release.empty()) cache_.release(release);
  cache_.unlock(seq.node);
  seq.node = nullptr;
  seq.slots.clear();
  seq.kv_done = 0;
  seq.tree_len = 0;
}

void Scheduler::preempt(Sequence& seq) {
  free_kv(seq, /*cache_it=*/false);
  seq.preempted = true;
  seq.scheduled = false;
  ++seq.usage.preemptions;
  ++m_.preemptions;
}

Sequence* Scheduler::pick_victim() {
  Sequence* victim = nullptr;
  for (auto& s : running_) {
    if (s->preempted || s->stream == nullptr) continue;
    if (victim == nullptr || s->request.priority < victim->request.priority ||
        (s->request.priority == victim->request.priority && s->arrival > victim->arrival))
      victim = s.get();
  }
  return victim;
}

int64_t Scheduler::live_running() const {
  int64_t n = 0;
  for (const auto& s : running_) n += (!s->preempted && s->stream != nullptr) ? 1 : 0;
  return n;
}

// In-batch prefix sharing: a request whose prompt shares at least
// kInBatchPrefix uncached leading tokens with one admitted in this same step
// waits a step, so that it finds them in the cache instead of computing them
// a second time.
constexpr int64_t kInBatchPrefix = 32;

bool Scheduler::shares_uncached_prefix(const Sequence& seq,
                                       const std::vector<const Sequence*>& admitted) {
  if (!cache_.enabled() || admitted.empty()) return false;
  const int64_t len = static_cast<int64_t>(seq.tokens.size()) - 1;
  int64_t common = 0;
  for (const Sequence* a : admitted) {
    if (a->request.cache_namespace != seq.request.cache_namespace) continue;
    const int64_t n = std::min<int64_t>(len, static_cast<int64_t>(a->tokens.size()));
    int64_t i = 0;
    while (i < n && a->tokens[static_cast<size_t>(i)] == seq.tokens[static_cast<size_t>(i)]) ++i;
    common = std::max(common, i);
  }
  if (common < kInBatchPrefix) return false;
  const int64_t cached = static_cast<int64_t>(
      cache_.match_prefix(seq.request.cache_namespace, seq.token_span(len)).slots.size());
  return common - cached >= kInBatchPrefix;
}

std::vector<Sequence*> Scheduler::admission_order() {
  std::vector<Sequence*> order;
  for (auto& s : waiting_) order.push_back(s.get());
  std::vector<int64_t> match(order.size(), 0);
  const bool lpm = options_.policy == SchedulePolicy::kLongestPrefixMatch && cache_.enabled() &&
                   static_cast<int>(waiting_.size()) <= options_.lpm_max_queue;
  std::unordered_map<const Sequence*, int64_t> matched;
  if (lpm)
    for (Sequence* s : order)
      matched[s] = static_cast<int64_t>(
          cache_.match_prefix(s->request.cache_namespace, s->token_span(static_cast<int64_t>(s->tokens.size()) - 1))
              .slots.size());
  std::stable_sort(order.begin(), order.end(), [&](const Sequence* a, const Sequence* b) {
    if (a->request.priority != b->request.priority) return a->request.priority > b->request.priority;
    if (lpm && matched[a] != matched[b]) return matched[a] > matched[b];
    return a->arrival < b->arrival;
  });
  return order;
}

bool Scheduler::admit(Sequence& seq, int64_t budget) {
  const int64_t len = static_cast<int64_t>(seq.tokens.size());
  PrefixMatch match = cache_.match_prefix(seq.request.cache_namespace, seq.token_span(len - 1));
  cache_.lock(match.last_node);
  const int64_t matched = static_cast<int64_t>(match.slots.size());
  int64_t reserved = 0;
  for (auto& s : running_)
    if (!s->preempted) reserved += reserve_of(*s);
  const int64_t available = pool_.free_slots() + cache_.evictable_tokens() - reserved;
  const int64_t need = (len - matched) + std::min<int64_t>(seq.request.params.max_tokens - seq.num_output,
                                                           options_.output_reserve);
  const bool alone = running_.empty();
  if (need > available && !alone) {
    cache_.unlock(match.last_node);
    return false;
  }
  seq.node = match.last_node;
  seq.slots = std::move(match.slots);
  seq.kv_done = matched;
  seq.tree_len = matched;
  const int64_t n = std::min(len - matched, budget);
  if (!allocate_for(seq, n)) {
    free_kv(seq, false);
    return false;
  }
  if (!seq.admitted_once) {
    seq.admitted_once = true;
    seq.usage.cached_prompt_tokens = std::min(matched, seq.prompt_len);
    m_.prompt_tokens += static_cast<uint64_t>(seq.prompt_len);
    m_.cached_prompt_tokens += static_cast<uint64_t>(seq.usage.cached_prompt_tokens);
    seq.usage.queue_seconds = seconds(Clock::now() - seq.submitted);
    m_.queue_time.observe(seq.usage.queue_seconds);
  }
  seq.step_start = seq.kv_done;
  seq.step_len = n;
  seq.scheduled = true;
  return true;
}

std::vector<Sequence*> Scheduler::schedule() {
  std::stable_sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
    if (a->request.priority != b->request.priority) return a->request.priority > b->request.priority;
    return a->arrival < b->arrival;
  });
  for (auto* list : {&waiting_, &running_})
    for (auto& s : *list) {
      s->scheduled = false;
      s->preempted = false;
    }
  int64_t budget = options_.step_token_budget;
  const uint64_t preemptions_before = m_.preemptions;
  // 1. Decodes: one token each, preempting when no slot is left.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (s.preempted || s.remaining() != 1) continue;
    bool ok = false;
    while (!s.preempted) {
      if (allocate_for(s, 1)) {
        ok = true;
        break;
      }
      Sequence* victim = pick_victim();
      if (victim == &s && live_running() == 1) break;
      preempt(*victim);
    }
    if (ok) {
      s.step_start = s.kv_done;
      s.step_len = 1;
      s.scheduled = true;
      --budget;
    } else if (!s.preempted) {
      finish(s, FinishReason::kError, {}, "no KV slot for a lone request");
    }
  }
  // 2. Prefill chunks of running requests.
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.preempted || s.scheduled || s.stream == nullptr || budget <= 0) continue;
    const int64_t avail = pool_.free_slots() + cache_.evictable_tokens();
    const int64_t n = std::min({s.remaining(), budget, avail});
    if (n <= 0 || !allocate_for(s, n)) continue;
    s.step_start = s.kv_done;
    s.step_len = n;
    s.scheduled = true;
    budget -= n;
  }
  // Preempted requests go back to the queue.
  for (auto& sp : running_)
    if (sp->preempted) waiting_.push_back(std::move(sp));
  std::erase_if(running_, [](const auto& p) { return p == nullptr; });
  // 3. Admission, unless memory ran out in this step (running requests first).
  const bool memory_short = m_.preemptions != preemptions_before && !running_.empty();
  if (!memory_short && budget > 0 && static_cast<int>(running_.size()) < options_.max_running &&
      !waiting_.empty()) {
    std::vector<const Sequence*> admitted_now;
    for (Sequence* s : admission_order()) {
      if (budget <= 0 || static_cast<int>(running_.size()) >= options_.max_running) break;
      if (shares_uncached_prefix(*s, admitted_now)) continue;  // next step, from the cache
      if (!admit(*s, budget)) {
        if (live_running() == 0) finish(*s, FinishReason::kError, {}, "the request does not fit in the KV pool");
        break;
      }
      s->preempted = false;
      admitted_now.push_back(s);
      budget -= s->step_len;
      auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p.get() == s; });
      running_.push_back(std::move(*it));
      waiting_.erase(it);
    }
  }
  std::vector<Sequence*> batch;
  for (auto& s : running_)
    if (s->scheduled && s->stream != nullptr) batch.push_back(s.get());
  if (batch.empty() && !running_.empty()) {
    // Partial prefills hold memory that none of them can extend: make room.
    Sequence* victim = pick_victim();
    preempt(*victim);
    for (auto& sp : running_)
      if (sp->preempted) waiting_.push_back(std::move(sp));
    std::erase_if(running_, [](const auto& p) { return p == nullptr; });
  }
  return batch;
}

void Scheduler::cache_progress(Sequence& seq) {
  if (!cache_.enabled() || seq.kv_done <= seq.tree_len) return;
  const uint64_t ns = seq.request.cache_namespace;
  const std::span<const int32_t> tokens = seq.token_span(seq.kv_done);
  InsertResult ins = cache_.insert(ns, tokens, std::span<const int32_t>(seq.slots.data(), static_cast<size_t>(seq.kv_done)));
  PrefixMatch match = cache_.match_prefix(ns, tokens);
  BASALT_CHECK(static_cast<int64_t>(match.slots.size()) == seq.kv_done,
               "radix cache: {} of {} inserted tokens matched", match.slots.size(), seq.kv_done);
  cache_.lock(match.last_node);
  cache_.unlock(seq.node);
  seq.node = match.last_node;
  std::copy(match.slots.begin(), match.slots.end(), seq.slots.begin());
  seq.tree_len = seq.kv_done;
  if (!ins.duplicates.empty()) cache_.release(ins.duplicates);
}

std::string Scheduler::push_text(Sequence& seq, std::string piece, bool check,
                                 std::optional<std::string>& stop) {
  if (piece.empty()) return {};
  StopChecker::Result r = seq.checker->feed(piece, check);
  stop = std::move(r.stop);
  return std::move(r.text);
}

bool Scheduler::on_token(Sequence& seq, int32_t token, std::vector<TokenLogprob> logprobs) {
  const SamplingParams& p = seq.request.params;
  const Clock::time_point now = Clock::now();
  if (seq.num_output == 0) m_.ttft.observe(seconds(now - seq.submitted));
  else m_.inter_token.observe(seconds(now - seq.last_token));
  seq.last_token = now;
  seq.tokens.push_back(token);
  ++seq.num_output;
  ++seq.usage.completion_tokens;
  ++m_.output_tokens;
  seq.processor->append(token);

  EngineEvent ev;
  ev.kind = EngineEvent::Kind::kToken;
  ev.token = token;
  ev.logprobs = std::move(logprobs);
  const int produced = seq.num_output;
  const bool past_min = produced >= p.min_tokens;
  const bool check = produced > p.min_tokens;
  const bool is_eos = past_min && !p.ignore_eos && contains(eos_ids_, token);
  const bool is_stop_id = past_min && contains(p.stop_token_ids, token);
  const bool has_text = seq.checker.has_value();
  std::optional<FinishReason> reason;
  StopReason stop_reason;
  bool stopped_by_string = false;
  const auto push = [&]() -> std::optional<std::string> {
    if (token >= tokenizer_->vocab_size()) return std::nullopt;
    std::optional<std::string> stop;
    ev.text += push_text(seq, seq.decoder->push(token), check, stop);
    return stop;
  };
  if (is_eos || is_stop_id) {
    reason = FinishReason::kStop;
    if (is_stop_id && !is_eos) stop_reason = token;
    if (has_text && p.include_stop_str_in_output) {
      if (auto stop = push()) {
        stop_reason = std::move(*stop);
        stopped_by_string = true;
      }
    }
  } else if (has_text) {
    if (auto stop = push()) {
      reason = FinishReason::kStop;
      stop_reason = std::move(*stop);
      stopped_by_string = true;
    }
  }
  if (!reason && produced >= p.max_tokens) reason = FinishReason::kLength;
  seq.stream->push(std::move(ev));
  if (!reason) return false;
  std::string tail;
  if (has_text && !stopped_by_string) {
    std::optional<std::string> stop;
    tail = push_text(seq, seq.decoder->flush(), check, stop);
    if (stop) {
      reason = FinishReason::kStop;
      stop_reason = std::move(*stop);
    } else {
      tail += seq.checker->flush();
    }
  }
  finish(seq, *reason, std::move(stop_reason), {}, std::move(tail));
  return true;
}

void Scheduler::finish(Sequence& seq, FinishReason reason, StopReason stop_reason, std::string error,
                       std::string text) {
  if (seq.stream == nullptr) return;
  if (!seq.slots.empty() || seq.node != nullptr)
    free_kv(seq, reason != FinishReason::kError && cache_.enabled());
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::kFinished;
  ev.reason = reason;
  ev.stop_reason = std::move(stop_reason);
  ev.error = std::move(error);
  ev.text = std::move(text);
  ev.usage = seq.usage;
  ev.seed = seq.seed;
  switch (reason) {
    case FinishReason::kCancelled: ++m_.requests_cancelled; break;
    case FinishReason::kError: ++m_.requests_failed; break;
    case FinishReason::kDeadline: ++m_.requests_expired; break;
    default: ++m_.requests_finished; break;
  }
  m_.end_to_end.observe(seconds(Clock::now() - seq.submitted));
  seq.stream->push(std::move(ev));
  seq.stream = nullptr;
  seq.scheduled = false;
}

void Scheduler::remove_finished() {
  for (auto* list : {&waiting_, &running_})
    std::erase_if(*list, [](const auto& s) { return s->stream == nullptr; });
  done_.clear();
}

void Scheduler::fail_all(const std::string& message) {
  for (auto* list : {&waiting_, &running_})
    for (auto& s : *list)
      if (s->stream != nullptr) {
        // KV written by a failed step is not trusted: nothing is cached.
        free_kv(*s, false);
        finish(*s, FinishReason::kError, {}, message);
      }
}

void Scheduler::step() {
  const Clock::time_point t_step = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  std::vector<Sequence*> batch = schedule();
  ++m_.steps;
  if (batch.empty()) return;

  // The ForwardBatch.
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  std::vector<Sequence*> sampled;
  for (Sequence* s : batch) {
    for (int64_t i = 0; i < s->step_len; ++i) {
      const int64_t pos = s->step_start + i;
      ids.push_back(s->tokens[static_cast<size_t>(pos)]);
      positions.push_back(static_cast<int32_t>(pos));
      out_slots.push_back(s->slots[static_cast<size_t>(pos)]);
    }
    const int64_t end = s->step_start + s->step_len;
    kv_slots.insert(kv_slots.end(), s->slots.begin(), s->slots.begin() + end);
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
    if (end == static_cast<int64_t>(s->tokens.size())) {
      logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      sampled.push_back(s);
    }
    if (s->step_start < s->prompt_len) m_.prefill_tokens += static_cast<uint64_t>(
        std::min(end, s->prompt_len) - s->step_start);
  }
  // The model wants at least one logits row; an all-prefill step computes one it ignores.
  const bool dummy_row = logit_rows.empty();
  if (dummy_row) logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
  const auto i32 = [](const std::vector<int32_t>& v) {
    return Tensor::from_i32({static_cast<int64_t>(v.size())}, v);
  };
  ForwardBatch fb;
  fb.token_ids = i32(ids);
  fb.positions = i32(positions);
  fb.out_slots = i32(out_slots);
  fb.attention.q_start = i32(q_start);
  fb.attention.kv_start = i32(kv_start);
  fb.attention.kv_slots = i32(kv_slots);
  fb.logit_rows = i32(logit_rows);
  const int64_t L = static_cast<int64_t>(logit_rows.size());
  double cpu_sched = thread_cpu_seconds() - cpu0;

  // Execute: the model, then the sampler.
  Tensor logits = backend_.empty({L, vocab_}, DType::kF32);
  model_.forward(fb, kv_, logits);
  std::vector<int32_t> next;
  std::vector<std::vector<TokenLogprob>> logprobs(sampled.size());
  if (!sampled.empty()) {
    const size_t V = static_cast<size_t>(vocab_);
    bool want_logprobs = false, active = false;
    for (Sequence* s : sampled) {
      want_logprobs |= s->request.params.logprobs > 0;
      active |= s->processor->active();
    }
    Tensor host = Tensor::empty({L, vocab_}, DType::kF32);
    if (want_logprobs) {
      Tensor lp = backend_.empty({L, vocab_}, DType::kF32);
      backend_.log_softmax(logits, lp);
      backend_.copy(lp, host);
      for (size_t r = 0; r < sampled.size(); ++r)
        if (sampled[r]->request.params.logprobs > 0)
          logprobs[r] = top_k_logprobs(std::span<const float>(host.data<float>() + r * V, V),
                                       sampled[r]->request.params.logprobs);
    }
    if (active) {
      backend_.copy(logits, host);
      for (size_t r = 0; r < sampled.size(); ++r)
        if (sampled[r]->processor->active())
          sampled[r]->processor->apply(std::span<float>(host.data<float>() + r * V, V));
      backend_.copy(host, logits);
    }
    std::vector<SamplingRow> rows;
    for (Sequence* s : sampled)
      rows.push_back(s->request.params.row(s->seed, static_cast<uint64_t>(s->num_output)));
    Tensor out = backend_.empty({L}, DType::kI32);
    backend_.sample(logits, rows, out);
    Tensor host_out = Tensor::empty({L}, DType::kI32);
    backend_.copy(out, host_out);
    next.assign(host_out.data<int32_t>(), host_out.data<int32_t>() + L);
  }

  // Process: the KV is written; cache prefill progress, then the tokens.
  const double cpu1 = thread_cpu_seconds();
  for (Sequence* s : batch) {
    s->kv_done += s->step_len;
    const bool prefill = s->step_start < static_cast<int64_t>(s->tokens.size()) - 1;
    if (prefill) cache_progress(*s);
  }
  for (size_t r = 0; r < sampled.size(); ++r) on_token(*sampled[r], next[r], std::move(logprobs[r]));
  cpu_sched += thread_cpu_seconds() - cpu1;
  m_.schedule_time.observe(cpu_sched);
  m_.step_time.observe(seconds(Clock::now() - t_step));
}

// --- Engine -----------------------------------------------------------------

Engine::Engine(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions options)
    : model_(&model), backend_(&backend), tokenizer_(tokenizer) {
  start(std::move(options));
}

Engine::Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
               std::unique_ptr<Tokenizer> tokenizer, EngineOptions options)
    : owned_backend_(std::move(backend)),
      owned_model_(std::move(model)),
      owned_tokenizer_(std::move(tokenizer)),
      model_(owned_model_.get()),
      backend_(owned_backend_.get()),
      tokenizer_(owned_tokenizer_.get()) {
  start(std::move(options));
}

void Engine::start(EngineOptions options) {
  scheduler_ = std::make_unique<Scheduler>(*model_, *backend_, tokenizer_, std::move(options));
  thread_ = std::thread([this] { scheduler_->run(); });
}

Engine::~Engine() {
  scheduler_->request_stop();
  thread_.join();
}

RequestHandle Engine::submit(EngineRequest request) {
  static std::atomic<uint64_t> next_id{1};
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id.fetch_add(1);
  seq->stream = std::make_shared<RequestStream>(seq->id, this);
  seq->request = std::move(request);
  seq->submitted = Clock::now();
  RequestHandle handle = seq->stream;
  scheduler_->post(std::move(seq));
  return handle;
}

void Engine::cancel(uint64_t id) { scheduler_->post_cancel(id); }

EngineMetrics Engine::metrics() const { return scheduler_->metrics(); }

int64_t Engine::kv_capacity() const { return scheduler_->capacity(); }

int64_t Engine::drain_and_clear_cache() { return scheduler_->drain_and_clear(); }

}  // namespace basalt
