#include "runtime/engine.h"

#include <algorithm>
#include <limits>
#include <atomic>
#include <ctime>
#include <stdexcept>
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

  // slots[i] holds token i's KV. Whole pages, page-aligned (slot i is at
  // offset i % page_size of a page, positions [k*P, (k+1)*P) one page);
  // slots.size() == kv_done rounded up to whole pages between steps: the tail
  // of the last page takes the next positions.
  std::vector<int32_t> slots;
  int64_t kv_done = 0;
  int64_t tree_len = 0;       // slots[0, tree_len) are the tree's (locked); whole pages
  RadixNode* node = nullptr;  // locked while running

  // Built at intake, then used only by the executor (apply and append), which
  // may run a step after the sequence itself is gone: hence shared.
  std::shared_ptr<LogitsProcessor> processor;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopChecker> checker;
  Usage usage;

  // n > 1: the samples of one submit_n share a group (the first sample's id).
  uint64_t group = 0;
  std::string refusal;  // set by submit_n: an error event, whatever the request

  // This step.
  int64_t step_start = 0;
  int64_t step_len = 0;
  bool scheduled = false;
  bool preempted = false;

  // Launched steps. kv_done counts the KV positions of every launched step
  // (the executor runs steps in order, so a later step always finds them
  // written); `pending` counts tokens sampled by launched steps that process()
  // has not appended to `tokens` yet (at most 2 with overlap: the step being
  // processed and the one launched after it); pending_row is the row of the
  // latest one among its step's sampled tokens, which the next step's input
  // refers to as a future; inflight_len is the latest step's length, and
  // last_step its id (the sequence outlives its finish until that step is
  // processed).
  int pending = 0;
  int pending_row = 0;
  int64_t inflight_len = 0;
  uint64_t last_step = 0;

  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) + pending - kv_done; }
  std::span<const int32_t> token_span(int64_t n) const {
    return std::span<const int32_t>(tokens.data(), static_cast<size_t>(n));
  }
};

// One launched step: what the executor needs (built by the scheduler thread,
// then read only by the executor), its results (written by the executor,
// read by the scheduler after wait()), and the scheduler's own bookkeeping.
struct StepWork {
  uint64_t id = 0;
  ForwardBatch fb;
  // Inputs that are tokens sampled by step `futures_of` (the one launched just
  // before): fb.token_ids holds -(row + 1) there until the executor resolves it.
  uint64_t futures_of = 0;
  std::vector<size_t> future_positions;
  struct Row {
    std::shared_ptr<LogitsProcessor> processor;
    SamplingRow sampling;
    int logprobs = 0;
    bool sampled_logprob = false;  // report the drawn token's logprob
  };
  std::vector<Row> rows;  // one per sampled logits row, in order
  int64_t logit_rows = 0;
  bool chained = false;  // launched while the previous step ran or had just been processed

  // Results.
  std::vector<int32_t> next;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<float> sampled_logprobs;  // NaN where not asked for
  std::string error;
  Clock::time_point exec_start, exec_end;
  bool done = false;  // guarded by the executor's mutex when it has a thread

  // The scheduler's.
  std::vector<Sequence*> batch;
  std::vector<Sequence*> sampled;
};

// Runs steps in launch order: resolves future inputs from the previous step's
// tokens, runs the model and the sampler, and appends each sampled token to
// its request's LogitsProcessor. With a thread (overlap on), launch() queues
// and returns at once and wait() blocks until that step is done; without one,
// wait() runs the step on the caller.
class Executor {
 public:
  Executor(Model& model, Backend& backend, KvBuffers& kv, int32_t vocab, bool threaded)
      : model_(model), backend_(backend), kv_(kv), vocab_(vocab) {
    if (threaded) thread_ = std::thread([this] { loop(); });
  }
  ~Executor() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  bool threaded() const { return thread_.joinable(); }

  void launch(std::shared_ptr<StepWork> work) {
    if (!threaded()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_one();
  }

  void wait(StepWork& work) {
    if (!threaded()) {
      if (!work.done) {
        run(work);
        work.done = true;
      }
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return work.done; });
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<StepWork> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      run(*work);
      {
        std::lock_guard<std::mutex> lock(mu_);
        work->done = true;
      }
      done_cv_.notify_all();
    }
  }

  void run(StepWork& w);

  Model& model_;
  Backend& backend_;
  KvBuffers& kv_;
  const int32_t vocab_;
  // The last step that succeeded and its sampled tokens (executor only).
  uint64_t last_id_ = 0;
  std::vector<int32_t> last_next_;

  std::mutex mu_;
  std::condition_variable cv_;       // work queued or stop
  std::condition_variable done_cv_;  // a step is done
  std::deque<std::shared_ptr<StepWork>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

void Executor::run(StepWork& w) {
  w.exec_start = Clock::now();
  try {
    if (w.futures_of != 0) {
      BASALT_CHECK(w.futures_of == last_id_, "step {} needs the tokens of step {}, which failed",
                   w.id, w.futures_of);
      int32_t* ids = w.fb.token_ids.data<int32_t>();
      for (size_t i : w.future_positions) {
        const size_t row = static_cast<size_t>(-ids[i] - 1);
        BASALT_CHECK(row < last_next_.size(), "future row {} of {}", row, last_next_.size());
        ids[i] = last_next_[row];
      }
    }
    last_id_ = 0;
    const int64_t L = w.logit_rows;
    Tensor logits = backend_.empty({L, vocab_}, DType::kF32);
    model_.forward(w.fb, kv_, logits);
    w.logprobs.assign(w.rows.size(), {});
    w.sampled_logprobs.assign(w.rows.size(), std::numeric_limits<float>::quiet_NaN());
    w.next.clear();
    if (!w.rows.empty()) {
      // Only token ids and the requested logprobs cross to the host: the
      // logprobs (raw, before the processors' edits) are reduced on the
      // device to each row's top entries and the drawn token's value.
      int top = 0;
      bool want_sampled = false, active = false;
      for (const StepWork::Row& row : w.rows) {
        top = std::max(top, row.logprobs);
        want_sampled |= row.sampled_logprob;
        active |= row.processor->active();
      }
      top = std::min(top, vocab_);
      Tensor lp;
      if (top > 0 || want_sampled) {
        lp = backend_.empty({L, vocab_}, DType::kF32);
        backend_.log_softmax(logits, lp);
      }
      if (top > kMaxTopKRows) {
        // Beyond what top_k_rows serves (a server configured for more than
        // 64 logprobs): the rows come to the host.
        Tensor host_lp = Tensor::empty({L, vocab_}, DType::kF32);
        backend_.copy(lp, host_lp);
        const size_t V = static_cast<size_t>(vocab_);
        for (size_t r = 0; r < w.rows.size(); ++r)
          if (w.rows[r].logprobs > 0)
            w.logprobs[r] = top_k_logprobs(std::span<const float>(host_lp.data<float>() + r * V, V),
                                           w.rows[r].logprobs);
      } else if (top > 0) {
        Tensor values = backend_.empty({L, top}, DType::kF32);
        Tensor ids = backend_.empty({L, top}, DType::kI32);
        backend_.top_k_rows(lp, top, values, ids);
        Tensor host_values = Tensor::empty({L, top}, DType::kF32);
        Tensor host_ids = Tensor::empty({L, top}, DType::kI32);
        backend_.copy(values, host_values);
        backend_.copy(ids, host_ids);
        for (size_t r = 0; r < w.rows.size(); ++r) {
          const int n = std::min(w.rows[r].logprobs, top);
          for (int j = 0; j < n; ++j) {
            const size_t at = r * static_cast<size_t>(top) + static_cast<size_t>(j);
            w.logprobs[r].push_back({host_ids.data<int32_t>()[at], host_values.data<float>()[at]});
          }
        }
      }
      if (active) {
        std::vector<LogitEdit> edits;
        for (size_t r = 0; r < w.rows.size(); ++r)
          if (w.rows[r].processor->active())
            w.rows[r].processor->edits(static_cast<int32_t>(r), edits);
        backend_.adjust_logits(logits, edits);
      }
      std::vector<SamplingRow> rows;
      for (const StepWork::Row& row : w.rows) rows.push_back(row.sampling);
      Tensor out = backend_.empty({L}, DType::kI32);
      backend_.sample(logits, rows, out);
      Tensor host_out = Tensor::empty({L}, DType::kI32);
      backend_.copy(out, host_out);
      w.next.assign(host_out.data<int32_t>(), host_out.data<int32_t>() + w.rows.size());
      if (want_sampled) {
        Tensor sampled = backend_.empty({L}, DType::kF32);
        backend_.gather_rows(lp, out, sampled);
        Tensor host_sampled = Tensor::empty({L}, DType::kF32);
        backend_.copy(sampled, host_sampled);
        for (size_t r = 0; r < w.rows.size(); ++r)
          if (w.rows[r].sampled_logprob) w.sampled_logprobs[r] = host_sampled.data<float>()[r];
      }
      for (size_t r = 0; r < w.rows.size(); ++r) w.rows[r].processor->append(w.next[r]);
    }
    last_next_ = w.next;
    last_id_ = w.id;
  } catch (const std::exception& e) {
    w.error = e.what();
    if (w.error.empty()) w.error = "unknown error";
  }
  w.exec_end = Clock::now();
}

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
  // Schedules a step and hands it to the executor; null when nothing runs.
  std::shared_ptr<StepWork> launch(bool chained);
  // Takes a finished step's results: tokens, events, finishes.
  void process(StepWork& work);
  // After a failed step: waits out the step in flight, fails every request
  // and empties the cache (a failed step's KV may already be in it).
  void recover(const std::string& message);
  // The KV a finishing request may cache: its launched positions, less those
  // of a step still in flight that samples for it (an overlap's extra row).
  int64_t settled_kv(const Sequence& seq) const;
  bool in_flight(const Sequence& seq) const { return seq.last_step > processed_step_; }
  // Overlap: the step in flight samples the request's last token (max_tokens),
  // so it gets no extra row.
  static bool samples_its_last(const Sequence& seq) {
    return seq.pending > 0 && seq.num_output + seq.pending >= seq.request.params.max_tokens;
  }
  // Scheduling: returns the sequences of this step's batch.
  std::vector<Sequence*> schedule();
  bool allocate_for(Sequence& seq, int64_t n);
  void preempt(Sequence& seq);
  Sequence* pick_victim();
  int64_t live_running() const;
  bool shares_uncached_prefix(const Sequence& seq, const std::vector<const Sequence*>& admitted);
  bool sibling_prefilling(const Sequence& seq, const std::vector<const Sequence*>& admitted) const;
  bool admit(Sequence& seq, int64_t budget);
  int64_t reserve_of(const Sequence& seq) const;
  std::vector<Sequence*> admission_order();
  // After a forward: caches the sequence's computed prefix, moving its lock.
  void cache_progress(Sequence& seq);
  // Processes one sampled token; returns true when the sequence finished.
  bool on_token(Sequence& seq, int32_t token, std::vector<TokenLogprob> logprobs, float logprob);
  std::string push_text(Sequence& seq, std::string piece, bool check, std::optional<std::string>& stop);
  void finish(Sequence& seq, FinishReason reason, StopReason stop_reason = {},
              std::string error = {}, std::string text = {});
  void free_kv(Sequence& seq, bool cache_it);
  void remove_finished();
  void fail_all(const std::string& message);
  void publish();
  // check_invariants: every request's slots are whole, page-aligned pages
  // covering its KV, and what requests hold outside the tree is the cache's
  // held count. on_step: the test hook.
  void check_requests() const;
  void report_step() const;

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
  // Finished, but in a launched step not processed yet.
  std::vector<std::unique_ptr<Sequence>> retired_;
  uint64_t next_arrival_ = 0;
  uint64_t next_step_id_ = 0;
  uint64_t processed_step_ = 0;  // every step up to this id has been processed
  std::shared_ptr<StepWork> inflight_;  // launched, not processed (overlap)
  std::optional<Clock::time_point> last_exec_end_;
  EngineMetrics m_;
  Executor executor_;  // after kv_: its thread stops before the KV goes

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

// The pool's size in slots: whole pages.
int64_t pool_slots(const Model& model, const EngineOptions& o) {
  const int64_t page = o.page_size;
  BASALT_CHECK(page >= 1, "page_size must be >= 1, got {}", page);
  if (o.kv_slots > 0) {
    BASALT_CHECK(o.kv_slots >= page, "kv_slots ({}) holds no page of {} slots", o.kv_slots, page);
    return o.kv_slots - o.kv_slots % page;
  }
  const size_t budget = o.kv_budget_bytes ? o.kv_budget_bytes : KvPool::host_memory_budget(0.1);
  const int64_t from_budget = KvPool::slots_for_budget(model.kv_bytes_per_slot(o.kv_dtype), budget,
                                                       o.page_size);
  const int64_t cap = static_cast<int64_t>(o.max_running) * model.config().max_position_embeddings;
  const int64_t cap_pages = (std::max<int64_t>(cap, 1) + page - 1) / page * page;
  const int64_t slots = std::min(from_budget, cap_pages);
  BASALT_CHECK(slots > 0, "the KV budget of {} bytes holds no page of {} token slots", budget, page);
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
      pool_(pool_slots(model, options_), options_.page_size),
      kv_(model.allocate_kv(pool_.capacity(), options_.kv_dtype)),
      cache_(pool_, RadixCacheOptions{options_.radix_cache, options_.eviction}),
      executor_(model, backend, kv_, vocab_, options_.overlap) {
  BASALT_CHECK(options_.step_token_budget >= 1, "step_token_budget must be >= 1, got {}",
               options_.step_token_budget);
  BASALT_CHECK(options_.max_running >= 1, "max_running must be >= 1, got {}", options_.max_running);
  BASALT_CHECK(options_.output_reserve >= 0, "output_reserve must be >= 0");
  // Before the first step: a model that records work (CUDA graphs) does it
  // now, against this KV storage, rather than in the middle of serving.
  model.prepare(kv_);
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
  bool chained = false;  // no idle wait since the last step
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> inbox;
    std::vector<uint64_t> cancels;
    bool clear = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || !waiting_.empty() ||
               !running_.empty() || clear_requested_ || inflight_ != nullptr;
      };
      if (!ready()) {
        chained = false;
        cv_.wait(lock, ready);
      }
      if (stop_) break;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      clear = clear_requested_;
    }
    const Clock::time_point t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    double exec_cpu = 0;  // the executor's work when it ran on this thread
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

    // Overlap on: launch step N+1, then process step N while N+1 runs.
    // Overlap off: launch a step and process it at once.
    bool stepped = false;
    try {
      std::shared_ptr<StepWork> launched;
      if (!waiting_.empty() || !running_.empty()) launched = launch(chained);
      std::shared_ptr<StepWork> done =
          executor_.threaded() ? std::exchange(inflight_, launched) : launched;
      stepped = launched != nullptr || done != nullptr;
      if (done != nullptr) {
        const double c = thread_cpu_seconds();
        executor_.wait(*done);
        exec_cpu = thread_cpu_seconds() - c;
        process(*done);
      }
      if (stepped) chained = true;
    } catch (const std::exception& e) {
      recover(std::string("engine step failed: ") + e.what());
      chained = false;
    }
    remove_finished();
    std::erase_if(retired_, [&](const auto& s) { return !in_flight(*s); });
    if (stepped) {
      if (options_.check_invariants) {
        cache_.check_invariants();
        check_requests();
      }
      if (options_.on_step) report_step();
      m_.schedule_time.observe(thread_cpu_seconds() - cpu0 - exec_cpu);
      m_.step_time.observe(seconds(Clock::now() - t0));
    }
    if (clear && waiting_.empty() && running_.empty() && inflight_ == nullptr) {
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
  // Stopping: the step in flight is waited out and dropped; whatever is left
  // is cancelled.
  if (inflight_ != nullptr) executor_.wait(*inflight_);
  inflight_.reset();
  processed_step_ = next_step_id_;
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
  retired_.clear();
  clear_cv_.notify_all();
}

void Scheduler::check_requests() const {
  int64_t held = 0;
  for (const auto* list : {&waiting_, &running_})
    for (const auto& s : *list) {
      BASALT_ASSERT(static_cast<int64_t>(s->slots.size()) == pool_.rounded(s->kv_done));
      BASALT_ASSERT(s->tree_len <= s->kv_done && s->tree_len % pool_.page_size() == 0);
      BASALT_ASSERT(pool_.is_page_aligned(s->slots));
      held += static_cast<int64_t>(s->slots.size()) - s->tree_len;
    }
  for (const auto& s : retired_) BASALT_ASSERT(s->slots.empty() && s->node == nullptr);
  BASALT_ASSERT(held == cache_.held_tokens());
  // Requests and the tree hold whole pages: no page is partly free.
  BASALT_ASSERT(pool_.free_slots() == pool_.free_pages() * pool_.page_size());
}

void Scheduler::report_step() const {
  std::vector<EngineOptions::RequestKv> kv;
  for (const auto& s : running_)
    if (s->stream != nullptr && !s->preempted)
      kv.push_back({s->id, s->kv_done, s->tree_len, std::span<const int32_t>(s->slots)});
  options_.on_step(kv);
}

void Scheduler::recover(const std::string& message) {
  if (inflight_ != nullptr) executor_.wait(*inflight_);
  inflight_.reset();
  processed_step_ = next_step_id_;  // every launched step is done; their results are dropped
  last_exec_end_.reset();
  fail_all(message);
  // Launched steps insert their prefill chunks into the cache before they
  // run; the failed one's KV is not trusted, so nothing cached is kept.
  cache_.evict(pool_.capacity());
}

std::string Scheduler::invalid(const Sequence& seq) const {
  const EngineRequest& r = seq.request;
  if (!seq.refusal.empty()) return seq.refusal;
  if (r.prompt.empty()) return "the prompt is empty";
  for (int32_t id : r.prompt)
    if (id < 0 || id >= vocab_)
      return fmt::format("prompt token id {} is outside the vocabulary (0..{})", id, vocab_ - 1);
  try {
    r.params.validate(vocab_, options_.max_logprobs);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (r.params.n != 1)
    return fmt::format("n must be 1, got {} (Engine::submit_n gives several samples)", r.params.n);
  if (!r.params.stop.empty() && tokenizer_ == nullptr)
    return "stop strings need a tokenizer to match against the text";
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens;
  if (need > model_.config().max_position_embeddings)
    return fmt::format("prompt ({} tokens) plus max_tokens ({}) exceeds the model's context length ({})",
                       r.prompt.size(), r.params.max_tokens, model_.config().max_position_embeddings);
  if (pool_.rounded(need) > pool_.capacity())
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
    seq->processor = std::make_shared<LogitsProcessor>(seq->request.params, vocab_, eos_ids_,
                                                       seq->request.prompt);
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

// Slots the request may still take: its known tokens without a slot plus the
// output reserve, in whole pages, less the tail of its last page.
int64_t Scheduler::reserve_of(const Sequence& seq) const {
  const int64_t out_left = seq.request.params.max_tokens - seq.num_output;
  const auto have = static_cast<int64_t>(seq.slots.size());
  const int64_t want = std::max(static_cast<int64_t>(seq.tokens.size()), have) +
                       std::min(out_left, options_.output_reserve);
  return pool_.rounded(want) - have;
}

// Slots for positions [kv_done, kv_done + n): the tail of the last page first,
// then whole new pages.
bool Scheduler::allocate_for(Sequence& seq, int64_t n) {
  const int64_t need = seq.kv_done + n - static_cast<int64_t>(seq.slots.size());
  if (need <= 0) return true;
  std::optional<std::vector<int32_t>> got = cache_.allocate(need);
  if (!got) return false;
  seq.slots.insert(seq.slots.end(), got->begin(), got->end());
  return true;
}

// Caching takes the whole pages of the settled KV; the partial last page (and
// anything past the settled KV) goes back to the pool.
void Scheduler::free_kv(Sequence& seq, bool cache_it) {
  std::vector<int32_t> release;
  const int64_t done = cache_.page_floor(settled_kv(seq));
  if (cache_it && done > 0) {
    InsertResult ins = cache_.insert(seq.request.cache_namespace, seq.token_span(done),
                                     std::span<const int32_t>(seq.slots.data(), static_cast<size_t>(done)));
    release = std::move(ins.duplicates);
    release.insert(release.end(), seq.slots.begin() + done, seq.slots.end());
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

// The samples of one submit_n: the first one admitted prefills the prompt;
// the others wait until its whole prompt is in the cache (however short it
// is), then compute only the last prompt token themselves.
bool Scheduler::sibling_prefilling(const Sequence& seq,
                                   const std::vector<const Sequence*>& admitted) const {
  if (seq.group == 0 || !cache_.enabled() || seq.prompt_len < 2) return false;
  for (const Sequence* a : admitted)
    if (a->group == seq.group) return true;
  for (const auto& r : running_)
    if (r.get() != &seq && r->group == seq.group && !r->preempted && r->stream != nullptr &&
        r->kv_done < r->prompt_len)
      return true;
  return false;
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
  // matched is whole pages; the rest is allocated in whole pages.
  const int64_t need =
      pool_.rounded(len + std::min<int64_t>(seq.request.params.max_tokens - seq.num_output,
                                            options_.output_reserve)) -
      matched;
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
    if (s.preempted || s.stream == nullptr || s.remaining() != 1 || samples_its_last(s)) continue;
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
    if (s.preempted || s.scheduled || s.stream == nullptr || budget <= 0 || samples_its_last(s))
      continue;
    const int64_t avail = pool_.free_slots() + cache_.evictable_tokens() +
                          (static_cast<int64_t>(s.slots.size()) - s.kv_done);
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
      if (s->pending > 0) continue;  // preempted with a token in flight: after it lands
      if (shares_uncached_prefix(*s, admitted_now)) continue;  // next step, from the cache
      if (sibling_prefilling(*s, admitted_now)) continue;      // n > 1: after the first sample's prompt
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
  const bool progress_in_flight =
      std::any_of(running_.begin(), running_.end(), [&](const auto& s) { return in_flight(*s); });
  if (batch.empty() && !running_.empty() && !progress_in_flight) {
    // Partial prefills hold memory that none of them can extend: make room.
    Sequence* victim = pick_victim();
    preempt(*victim);
    for (auto& sp : running_)
      if (sp->preempted) waiting_.push_back(std::move(sp));
    std::erase_if(running_, [](const auto& p) { return p == nullptr; });
  }
  return batch;
}

// Whole pages only: the partial last page stays the request's, for the next
// chunk or decode token.
void Scheduler::cache_progress(Sequence& seq) {
  const int64_t whole = cache_.page_floor(seq.kv_done);
  if (!cache_.enabled() || whole <= seq.tree_len) return;
  const uint64_t ns = seq.request.cache_namespace;
  const std::span<const int32_t> tokens = seq.token_span(whole);
  InsertResult ins = cache_.insert(ns, tokens, std::span<const int32_t>(seq.slots.data(), static_cast<size_t>(whole)));
  PrefixMatch match = cache_.match_prefix(ns, tokens);
  BASALT_CHECK(static_cast<int64_t>(match.slots.size()) == whole,
               "radix cache: {} of {} inserted tokens matched", match.slots.size(), whole);
  cache_.lock(match.last_node);
  cache_.unlock(seq.node);
  seq.node = match.last_node;
  std::copy(match.slots.begin(), match.slots.end(), seq.slots.begin());
  seq.tree_len = whole;
  if (!ins.duplicates.empty()) cache_.release(ins.duplicates);
}

std::string Scheduler::push_text(Sequence& seq, std::string piece, bool check,
                                 std::optional<std::string>& stop) {
  if (piece.empty()) return {};
  StopChecker::Result r = seq.checker->feed(piece, check);
  stop = std::move(r.stop);
  return std::move(r.text);
}

bool Scheduler::on_token(Sequence& seq, int32_t token, std::vector<TokenLogprob> logprobs, float logprob) {
  const SamplingParams& p = seq.request.params;
  const Clock::time_point now = Clock::now();
  if (seq.num_output == 0) m_.ttft.observe(seconds(now - seq.submitted));
  else m_.inter_token.observe(seconds(now - seq.last_token));
  seq.last_token = now;
  seq.tokens.push_back(token);
  ++seq.num_output;
  ++seq.usage.completion_tokens;
  ++m_.output_tokens;

  EngineEvent ev;
  ev.kind = EngineEvent::Kind::kToken;
  ev.token = token;
  ev.logprobs = std::move(logprobs);
  ev.logprob = logprob;
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
    case FinishReason::kStop: ++m_.requests_finished; ++m_.requests_stopped; break;
    case FinishReason::kLength: ++m_.requests_finished; break;
  }
  m_.end_to_end.observe(seconds(Clock::now() - seq.submitted));
  seq.stream->push(std::move(ev));
  seq.stream = nullptr;
  seq.scheduled = false;
}

void Scheduler::remove_finished() {
  for (auto* list : {&waiting_, &running_}) {
    for (auto& s : *list)  // a step in flight still points at it
      if (s->stream == nullptr && in_flight(*s)) retired_.push_back(std::move(s));
    std::erase_if(*list, [](const auto& s) { return s == nullptr || s->stream == nullptr; });
  }
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

int64_t Scheduler::settled_kv(const Sequence& seq) const {
  if (seq.pending == 0) return seq.kv_done;
  return std::max(seq.tree_len, seq.kv_done - seq.inflight_len);
}

std::shared_ptr<StepWork> Scheduler::launch(bool chained) {
  std::vector<Sequence*> batch = schedule();
  ++m_.steps;
  if (batch.empty()) return nullptr;
  auto w = std::make_shared<StepWork>();
  w->id = ++next_step_id_;
  w->chained = chained;

  // The ForwardBatch. An input not sampled yet (overlap: the token the step in
  // flight samples for this request) is a future: -(its row + 1).
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  for (Sequence* s : batch) {
    const int64_t known = static_cast<int64_t>(s->tokens.size());
    for (int64_t i = 0; i < s->step_len; ++i) {
      const int64_t pos = s->step_start + i;
      if (pos < known) {
        ids.push_back(s->tokens[static_cast<size_t>(pos)]);
      } else {
        BASALT_CHECK(pos == known && s->pending > 0 && inflight_ != nullptr &&
                         s->last_step == inflight_->id,
                     "request {}: input {} is neither known nor sampled by the step in flight",
                     s->id, pos);
        w->futures_of = inflight_->id;
        w->future_positions.push_back(ids.size());
        ids.push_back(-(s->pending_row + 1));
      }
      positions.push_back(static_cast<int32_t>(pos));
      out_slots.push_back(s->slots[static_cast<size_t>(pos)]);
    }
    const int64_t end = s->step_start + s->step_len;
    kv_slots.insert(kv_slots.end(), s->slots.begin(), s->slots.begin() + end);
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
    if (end == known + s->pending) {
      logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      w->sampled.push_back(s);
      const SamplingParams& p = s->request.params;
      w->rows.push_back(StepWork::Row{
          s->processor, p.row(s->seed, static_cast<uint64_t>(s->num_output + s->pending)), p.logprobs,
          p.logprobs > 0 || p.sampled_logprob});
    }
    if (s->step_start < s->prompt_len) m_.prefill_tokens += static_cast<uint64_t>(
        std::min(end, s->prompt_len) - s->step_start);
  }
  // The model wants at least one logits row; an all-prefill step computes one it ignores.
  if (logit_rows.empty()) logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
  const auto i32 = [](const std::vector<int32_t>& v) {
    return Tensor::from_i32({static_cast<int64_t>(v.size())}, v);
  };
  w->fb.token_ids = i32(ids);
  w->fb.positions = i32(positions);
  w->fb.out_slots = i32(out_slots);
  w->fb.attention.q_start = i32(q_start);
  w->fb.attention.kv_start = i32(kv_start);
  w->fb.attention.kv_slots = i32(kv_slots);
  w->fb.logit_rows = i32(logit_rows);
  w->logit_rows = static_cast<int64_t>(logit_rows.size());

  // The step's KV counts as written from now on: the executor runs steps in
  // order, so any later step that reads it (a decode, or a request matching a
  // prefill chunk in the cache) runs after this one wrote it.
  for (Sequence* s : batch) {
    const bool prefill = s->step_start < static_cast<int64_t>(s->tokens.size()) - 1;
    s->kv_done += s->step_len;
    s->inflight_len = s->step_len;
    s->last_step = w->id;
    if (prefill) cache_progress(*s);
  }
  for (size_t r = 0; r < w->sampled.size(); ++r) {
    ++w->sampled[r]->pending;
    w->sampled[r]->pending_row = static_cast<int>(r);
  }
  w->batch = std::move(batch);
  executor_.launch(w);
  return w;
}

void Scheduler::process(StepWork& w) {
  processed_step_ = w.id;
  m_.execute_time.observe(seconds(w.exec_end - w.exec_start));
  if (w.chained && last_exec_end_)
    m_.bubble.observe(std::max(0.0, seconds(w.exec_start - *last_exec_end_)));
  last_exec_end_ = w.exec_end;
  if (!w.error.empty()) throw std::runtime_error(w.error);
  for (size_t r = 0; r < w.sampled.size(); ++r) {
    Sequence& s = *w.sampled[r];
    --s.pending;
    if (s.stream == nullptr) {  // finished meanwhile: an overlap's extra row
      ++m_.discarded_tokens;
      continue;
    }
    on_token(s, w.next[r], std::move(w.logprobs[r]), w.sampled_logprobs[r]);
  }
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

RequestHandle Engine::submit(EngineRequest request) { return submit(std::move(request), nullptr, {}); }

RequestHandle Engine::submit(EngineRequest request, uint64_t* group, std::string refusal) {
  static std::atomic<uint64_t> next_id{1};
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id.fetch_add(1);
  if (group != nullptr) {
    if (*group == 0) *group = seq->id;
    seq->group = *group;
  }
  seq->refusal = std::move(refusal);
  seq->stream = std::make_shared<RequestStream>(seq->id, this);
  seq->request = std::move(request);
  seq->submitted = Clock::now();
  RequestHandle handle = seq->stream;
  scheduler_->post(std::move(seq));
  return handle;
}

std::vector<RequestHandle> Engine::submit_n(EngineRequest request, int n) {
  std::vector<RequestHandle> handles;
  if (n < 1 || n > kMaxSamples) {
    handles.push_back(submit(std::move(request), nullptr,
                             fmt::format("n must be in 1..{}, got {}", kMaxSamples, n)));
    return handles;
  }
  request.params.n = 1;
  const std::optional<uint64_t> seed = request.params.seed;
  uint64_t group = 0;
  for (int i = 0; i < n; ++i) {
    EngineRequest r = i + 1 < n ? request : std::move(request);
    if (seed) r.params.seed = sample_seed(*seed, i);
    handles.push_back(submit(std::move(r), n > 1 ? &group : nullptr, {}));
  }
  return handles;
}

void Engine::cancel(uint64_t id) { scheduler_->post_cancel(id); }

EngineMetrics Engine::metrics() const { return scheduler_->metrics(); }

int64_t Engine::kv_capacity() const { return scheduler_->capacity(); }

int64_t Engine::drain_and_clear_cache() { return scheduler_->drain_and_clear(); }

}  // namespace basalt
