#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <pthread.h>
#include <set>
#include <pthread.h>
#include <utility>

#include "core/error.h"
#include "runtime/delivery.h"
#include "runtime/kv_manager.h"
#include "runtime/model_runner.h"
#include "runtime/token_constraint.h"

namespace basalt {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The pool's size in slots: whole pages.
int64_t pool_slots(Model& model, const EngineOptions& o) {
  const int64_t page = o.page_size;
  BASALT_CHECK(page >= 1, "page_size must be >= 1, got {}", page);
  if (o.kv_slots > 0) {
    BASALT_CHECK(o.kv_slots >= page, "kv_slots ({}) holds no page of {} slots", o.kv_slots, page);
    return o.kv_slots - o.kv_slots % page;
  }
  const size_t budget = o.kv_budget_bytes ? o.kv_budget_bytes : KvPool::host_memory_budget(0.1);
  // The draft model's KV and the draft head's sit slot for slot beside the model's.
  const DraftHead* head = drafts_with_head(o.speculative.algorithm) ? model.draft_head() : nullptr;
  const size_t per_slot = model.kv_bytes_per_slot(o.kv_dtype) +
                          (o.draft_model ? o.draft_model->kv_bytes_per_slot(o.kv_dtype) : 0) +
                          (head != nullptr ? head->kv_bytes_per_slot(o.kv_dtype) : 0);
  const int64_t from_budget = KvPool::slots_for_budget(per_slot, budget, o.page_size);
  const int64_t cap = static_cast<int64_t>(o.max_running) * model.config().max_position_embeddings;
  const int64_t cap_pages = (std::max<int64_t>(cap, 1) + page - 1) / page * page;
  const int64_t slots = std::min(from_budget, cap_pages);
  BASALT_CHECK(slots > 0, "the KV budget of {} bytes holds no page of {} token slots", budget, page);
  return slots;
}

}  // namespace

// The scheduling thread's world, and the inbox other threads reach it by.
struct Engine::Parts {
  EngineOptions options;
  KvManager kv;
  Scheduler scheduler;
  LocalModelRunner runner;
  StepPipeline pipeline;  // after the runner: its thread stops first

  std::shared_ptr<StopLedger> ledger = std::make_shared<StopLedger>();
  Delivery delivery;
  // The scheduling thread's own.
  Delivery::Batch batch;  // this iteration's new streams and updates
  std::shared_ptr<StepPipeline::Step> inflight;  // launched, not updated (overlap)
  // Updated, with its drafts still on their way (StepResult::complete_proposals):
  // the step planned next takes them on the device; the requests take them
  // before the next step is updated.
  std::shared_ptr<StepPipeline::Step> drafts_due;

  // The inbox.
  struct Submission {
    std::unique_ptr<Request> request;
    RequestHandle stream;
  };
  struct Stop {
    uint64_t id;
    int kept_tokens;
  };
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Submission> submissions;
  std::vector<uint64_t> cancels;
  std::vector<Stop> stops;
  std::vector<std::pair<uint64_t, KvEventListener>> subscribes;
  std::vector<uint64_t> unsubscribes;
  std::set<uint64_t> subscribers;  // the scheduling thread's
  bool stopping = false;
  bool clear_requested = false;
  uint64_t clear_generation = 0;
  int64_t clear_result = 0;
  std::condition_variable clear_cv;
  EngineMetrics snapshot;

  Parts(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions o, int64_t slots)
      : options(std::move(o)),
        kv(slots, options.page_size, RadixCacheOptions{options.radix_cache, options.eviction}),
        scheduler(kv, scheduler_options(model, tokenizer, options)),
        runner(model, backend, slots, options.kv_dtype, options.draft_model.get()),
        // With speculation the steps that may draft run on the scheduling
        // thread (Engine::loop); the rest overlap as without it.
        pipeline(runner, options.overlap) {
    BASALT_CHECK(options.speculative.algorithm != SpeculativeAlgorithm::kMtp || model.draft_head() != nullptr,
                 "speculative decoding with mtp: the model has no multi-token-prediction layer");
    BASALT_CHECK(options.speculative.algorithm != SpeculativeAlgorithm::kEagle || model.draft_head() != nullptr,
                 "speculative decoding with eagle: no EAGLE head was loaded beside the model");
    BASALT_CHECK(options.speculative.algorithm != SpeculativeAlgorithm::kDraft || options.draft_model != nullptr,
                 "speculative decoding with a draft model: no draft model was given (--speculative-draft-model)");
    snapshot = scheduler.metrics();
  }

  static SchedulerOptions scheduler_options(const Model& model, const Tokenizer* tokenizer, const EngineOptions& o) {
    SchedulerOptions s;
    s.max_running = o.max_running;
    s.step_token_budget = o.step_token_budget;
    s.output_reserve = o.output_reserve;
    s.policy = o.policy;
    s.lpm_max_queue = o.lpm_max_queue;
    s.vocab_size = static_cast<int32_t>(model.config().vocab_size);
    s.max_context = model.config().max_position_embeddings;
    s.eos_ids = o.eos_ids ? *o.eos_ids : model.config().eos_token_ids;
    s.max_logprobs = o.max_logprobs;
    s.score_rows_per_step = o.score_rows_per_step;
    s.stop_strings = tokenizer != nullptr;
    s.jump_forward = o.jump_forward;
    s.speculative = o.speculative;
    return s;
  }

  void publish() {
    EngineMetrics m = scheduler.metrics();
    m.running = scheduler.running();
    m.queued = scheduler.waiting();
    m.kv_used = kv.used();
    m.kv_cached = kv.cached();
    std::lock_guard<std::mutex> lock(mu);
    snapshot = m;
  }

  // Hands this iteration's updates and KV events to the delivery thread.
  void deliver(std::vector<RequestUpdate>& updates) {
    if (!subscribers.empty()) batch.kv_events = kv.take_events();
    batch.updates = std::move(updates);
    updates = delivery.spare_updates();
    delivery.post(std::move(batch));
    batch = Delivery::Batch{};
  }
};

Engine::Engine(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions options)
    : model_(&model), backend_(&backend), tokenizer_(tokenizer) {
  start(std::move(options));
}

Engine::Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model, std::unique_ptr<Tokenizer> tokenizer,
               EngineOptions options)
    : owned_backend_(std::move(backend)),
      owned_model_(std::move(model)),
      owned_tokenizer_(std::move(tokenizer)),
      model_(owned_model_.get()),
      backend_(owned_backend_.get()),
      tokenizer_(owned_tokenizer_.get()) {
  start(std::move(options));
}

void Engine::start(EngineOptions options) {
  const int64_t slots = pool_slots(*model_, options);
  parts_ = std::make_unique<Parts>(*model_, *backend_, tokenizer_, std::move(options), slots);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    parts_->stopping = true;
  }
  parts_->cv.notify_one();
  thread_.join();
}

RequestHandle Engine::submit(EngineRequest request) {
  std::vector<Pending> one;
  one.push_back({std::move(request), nullptr, {}});
  return enqueue(std::move(one)).front();
}

std::vector<RequestHandle> Engine::submit_batch(std::vector<EngineRequest> requests) {
  std::vector<Pending> all;
  all.reserve(requests.size());
  for (EngineRequest& r : requests) all.push_back({std::move(r), nullptr, {}});
  return enqueue(std::move(all));
}

std::vector<RequestHandle> Engine::enqueue(std::vector<Pending> pending) {
  static std::atomic<uint64_t> next_id{1};
  std::vector<Parts::Submission> made;
  std::vector<RequestHandle> handles;
  made.reserve(pending.size());
  handles.reserve(pending.size());
  for (Pending& p : pending) {
    auto r = std::make_unique<Request>();
    r->id = next_id.fetch_add(1);
    if (p.group != nullptr) {
      if (*p.group == 0) *p.group = r->id;
      r->group = *p.group;
    }
    r->refusal = std::move(p.refusal);
    EngineRequest& request = p.request;
    if (!request.params.seed) request.params.seed = random_seed();
    r->seed = *request.params.seed;
    r->request = std::move(request);
    r->submitted = Clock::now();
    StreamOwner* owner = this;
    OutputProcessor output(tokenizer_, r->request.params, r->seed);
    if (!r->request.resume_output.empty()) {
      std::string why = output.prime(r->request.resume_output);
      if (r->refusal.empty()) r->refusal = std::move(why);
      if (output.primed_stop()) r->resume_end = {FinishReason::kStop, StopReason{}};
    }
    auto stream = std::make_shared<RequestStream>(r->id, owner, std::move(output), parts_->ledger);
    handles.push_back(stream);
    made.push_back({std::move(r), std::move(stream)});
  }
  {
    // One lock for all: the scheduler takes them in at the same step.
    std::lock_guard<std::mutex> lock(parts_->mu);
    for (Parts::Submission& m : made) parts_->submissions.push_back(std::move(m));
  }
  parts_->cv.notify_one();
  return handles;
}

std::vector<RequestHandle> Engine::submit_n(EngineRequest request, int n) {
  std::vector<Pending> samples;
  if (n < 1 || n > kMaxSamples) {
    samples.push_back({std::move(request), nullptr, fmt::format("n must be in 1..{}, got {}", kMaxSamples, n)});
    return enqueue(std::move(samples));
  }
  request.params.n = 1;
  const std::optional<uint64_t> seed = request.params.seed;
  uint64_t group = 0;  // the samples share the first one's id (enqueue sets it)
  for (int i = 0; i < n; ++i) {
    EngineRequest r = i + 1 < n ? request : std::move(request);
    if (seed) r.params.seed = sample_seed(*seed, i);
    // Each sample walks its own grammar; the first gets the caller's.
    if (i > 0 && r.constraint) r.constraint = r.constraint->fresh_copy();
    samples.push_back({std::move(r), n > 1 ? &group : nullptr, {}});
  }
  return enqueue(std::move(samples));
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    parts_->cancels.push_back(id);
  }
  parts_->cv.notify_one();
}

void Engine::stop(uint64_t id, int kept_tokens) {
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    parts_->stops.push_back({id, kept_tokens});
  }
  parts_->cv.notify_one();
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    m = parts_->snapshot;
  }
  // Streams whose stop string came after the engine's own finish.
  const uint64_t late = parts_->ledger->discarded_tokens.load();
  m.output_tokens -= std::min(late, m.output_tokens);
  m.discarded_tokens += late;
  m.requests_stopped += parts_->ledger->stopped_requests.load();
  return m;
}

int64_t Engine::kv_capacity() const { return parts_->kv.capacity(); }

int64_t Engine::load() const {
  std::lock_guard<std::mutex> lock(parts_->mu);
  return parts_->snapshot.running + parts_->snapshot.queued + static_cast<int64_t>(parts_->submissions.size());
}

uint64_t Engine::subscribe_kv_events(KvEventListener listener) {
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    parts_->subscribes.emplace_back(id, std::move(listener));
  }
  parts_->cv.notify_one();
  return id;
}

void Engine::unsubscribe_kv_events(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(parts_->mu);
    parts_->unsubscribes.push_back(id);
  }
  parts_->cv.notify_one();
}

int64_t Engine::drain_and_clear_cache() {
  Parts& p = *parts_;
  std::unique_lock<std::mutex> lock(p.mu);
  const uint64_t generation = p.clear_generation;
  p.clear_requested = true;
  p.cv.notify_one();
  p.clear_cv.wait(lock, [&] { return p.clear_generation != generation || p.stopping; });
  return p.clear_result;
}

void Engine::run() {
  pthread_setname_np(pthread_self(), "basalt-sched");  // for top, perf and gdb
  Parts& p = *parts_;
  Scheduler& scheduler = p.scheduler;
  std::vector<RequestUpdate> updates;
  bool chained = false;  // no idle wait since the last step
  for (;;) {
    std::vector<Parts::Submission> submissions;
    std::vector<uint64_t> cancels;
    std::vector<Parts::Stop> stops;
    std::vector<std::pair<uint64_t, KvEventListener>> subscribes;
    std::vector<uint64_t> unsubscribes;
    bool clear = false;
    {
      std::unique_lock<std::mutex> lock(p.mu);
      const auto ready = [&] {
        return p.stopping || !p.submissions.empty() || !p.cancels.empty() || !p.stops.empty() ||
               !p.subscribes.empty() || !p.unsubscribes.empty() || scheduler.has_requests() ||
               p.clear_requested || p.inflight != nullptr;
      };
      if (!ready()) {
        chained = false;
        p.cv.wait(lock, ready);
      }
      if (p.stopping) break;
      submissions.swap(p.submissions);
      cancels.swap(p.cancels);
      stops.swap(p.stops);
      subscribes.swap(p.subscribes);
      unsubscribes.swap(p.unsubscribes);
      clear = p.clear_requested;
    }
    // KV-event subscribers: events are computed while there is one; a new
    // one starts from a snapshot of the cache as it is now.
    for (auto& [id, listener] : subscribes) {
      if (p.subscribers.empty()) p.kv.set_event_block_size(p.options.kv_event_block_size);
      p.subscribers.insert(id);
      p.batch.subscribe.push_back({id, std::move(listener), p.kv.event_block_size(), p.kv.snapshot()});
    }
    for (uint64_t id : unsubscribes) {
      if (p.subscribers.erase(id) == 0) continue;
      p.batch.unsubscribe.push_back(id);
      if (p.subscribers.empty()) p.kv.set_event_block_size(0);
    }
    const Clock::time_point t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    double exec_cpu = 0;  // the runner's work when it ran on this thread
    for (auto& s : submissions) {
      p.batch.streams.emplace_back(s.request->id, std::move(s.stream));
      scheduler.add(std::move(s.request), updates);
    }
    for (uint64_t id : cancels) scheduler.finish(id, FinishReason::kCancelled, updates);
    for (const Parts::Stop& s : stops) scheduler.finish(s.id, FinishReason::kStop, updates, {}, s.kept_tokens);
    scheduler.expire(Clock::now(), updates);

    // Overlap on: launch step N+1, then take step N's results while N+1
    // runs. Overlap off: launch a step and take its results at once.
    bool stepped = false;
    // The drafts of a step whose head was still running when it was
    // updated: a step planned since took them on the device (its runner
    // resolved them there); the requests take them before the next update.
    auto update = [&](const std::shared_ptr<StepPipeline::Step>& done) {
      if (p.drafts_due != nullptr && p.drafts_due != done) {
        const std::shared_ptr<StepPipeline::Step> due = std::move(p.drafts_due);
        p.drafts_due.reset();
        due->result.complete_proposals(due->result);
        due->result.complete_proposals = nullptr;
        scheduler.resolve_proposals(due->result);
      }
      scheduler.update(*done->plan, done->result, updates);
      if (done->result.complete_proposals) p.drafts_due = done;
    };
    try {
      std::shared_ptr<StepPipeline::Step> launched;
      bool taken = false;
      // Drafts follow a request's last token: while some request may draft,
      // the step in flight is taken before the next is planned.
      if (p.inflight != nullptr && scheduler.wants_drafts()) {
        const std::shared_ptr<StepPipeline::Step> done = std::move(p.inflight);
        p.inflight.reset();
        const double c = thread_cpu_seconds();
        p.pipeline.wait(*done);
        exec_cpu += thread_cpu_seconds() - c;
        update(done);
        taken = true;
      }
      if (scheduler.has_requests()) {
        std::shared_ptr<StepPlan> plan = scheduler.schedule(updates);
        if (plan != nullptr) {
          plan->chained = chained;
          // A step the next round would take before planning (it verifies
          // drafts, or its requests may draft after it) runs here and is
          // taken now: handing it to the runner's thread would only add the
          // hand-off's latency to a step nothing overlaps.
          const bool take_now = p.pipeline.threaded() && p.inflight == nullptr && scheduler.wants_drafts();
          launched = take_now ? p.pipeline.launch_inline(std::move(plan)) : p.pipeline.launch(std::move(plan));
        }
      }
      std::shared_ptr<StepPipeline::Step> done =
          p.pipeline.threaded() && !(launched && launched->on_caller) ? std::exchange(p.inflight, launched) : launched;
      stepped = launched != nullptr || done != nullptr || taken;
      if (done != nullptr) {
        const double c = thread_cpu_seconds();
        p.pipeline.wait(*done);
        exec_cpu += thread_cpu_seconds() - c;
        update(done);
      }
      if (stepped) chained = true;
      if (stepped && p.options.check_invariants) scheduler.check_invariants();
    } catch (const std::exception& e) {
      // A failed step: the one in flight is waited out and dropped, every
      // request fails, and the cache is emptied.
      if (p.inflight != nullptr) p.pipeline.wait(*p.inflight);
      p.inflight.reset();
      p.drafts_due.reset();
      scheduler.fail_all(std::string("engine step failed: ") + e.what(), updates);
      chained = false;
    }
    if (stepped) {
      if (p.options.on_step) {
        const std::vector<RequestKvView> kv = scheduler.running_kv();
        p.options.on_step(kv);
      }
      EngineMetrics& m = scheduler.metrics();
      m.schedule_time.observe(thread_cpu_seconds() - cpu0 - exec_cpu);
      m.step_time.observe(seconds(Clock::now() - t0));
    }
    const bool idle = !scheduler.has_requests() && p.inflight == nullptr;
    if (clear && idle) {
      const int64_t free_slots = p.kv.clear_cache();
      p.kv.check_invariants(0);
      // Every update reaches its stream first: a stream that found a stop
      // string after the engine had finished its request counts the tokens
      // made past it when the engine's finish arrives (StopLedger).
      p.deliver(updates);
      p.delivery.flush();
      p.publish();  // the caller reads metrics that include everything before
      std::lock_guard<std::mutex> lock(p.mu);
      p.clear_result = free_slots;
      p.clear_requested = false;
      ++p.clear_generation;
      p.clear_cv.notify_all();
    }
    // Metrics first: a client that sees its request's last event finds it
    // counted.
    p.publish();
    p.deliver(updates);
  }
  // Stopping: the step in flight is waited out and dropped; whatever is left
  // is cancelled.
  if (p.inflight != nullptr) p.pipeline.wait(*p.inflight);
  p.inflight.reset();
  std::vector<Parts::Submission> submissions;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    submissions.swap(p.submissions);
  }
  for (auto& s : submissions) {
    RequestUpdate u;
    u.id = s.request->id;
    u.finished = true;
    u.reason = FinishReason::kCancelled;
    u.error = "the engine stopped";
    s.stream->push(std::move(u));
  }
  scheduler.cancel_all("the engine stopped", updates);
  p.publish();
  p.deliver(updates);
  p.delivery.detach_all();
  p.clear_cv.notify_all();
}

}  // namespace basalt
