#include "router/route_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <fmt/format.h>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "server/http_auth.h"
#include "server/openai_protocol.h"
#include "server/prometheus_text.h"

namespace basalt::router {

namespace {

using Clock = std::chrono::steady_clock;

// The path as the gateway names it in metrics and logs.
std::string route_of(const std::string& path) {
  static const char* kKnown[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                                 "/health",         "/ready",               "/metrics",   "/version",  "/v1/autoscale"};
  for (const char* k : kKnown)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path == "/v1/workflows" || path.rfind("/v1/workflows/", 0) == 0) return "/v1/workflows";
  return "other";
}

bool routed_by_model(const std::string& route) {
  return route == "/v1/completions" || route == "/v1/chat/completions" || route == "/tokenize" ||
         route == "/detokenize";
}

HttpResponse json_error(int status, const std::string& message, const std::string& type, const std::string& param = {}) {
  HttpResponse r;
  r.status = status;
  r.body = error_body(status, message, type, param);
  return r;
}

// A seed for a request that has none: 63 random bits (what JSON and the
// replica's parser take as a non-negative integer).
int64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return static_cast<int64_t>(rng() >> 1);
}

std::string gateway_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("route-{:016x}", rng());
}

bool serves(const ReplicaSpec& spec, const std::string& model) {
  return spec.model.empty() || model.empty() || spec.model == model;
}

// A prompt's estimated tokens: its bytes / 4 (about what BPE tokenizers
// make of English), or one per token id.
int64_t prompt_estimate(const nlohmann::json& prompt) {
  if (prompt.is_string()) return static_cast<int64_t>(prompt.get_ref<const std::string&>().size() + 3) / 4;
  if (prompt.is_number_integer()) return 1;
  if (prompt.is_array()) {
    int64_t n = 0;
    for (const nlohmann::json& part : prompt) n += prompt_estimate(part);
    return n;
  }
  return static_cast<int64_t>(prompt.dump().size() + 3) / 4;  // chat messages
}

// A tenant's request while it waits in the admission queue, then the
// ProxyProducer it becomes there, or the 429 it gets.
class QueuedProducer : public ResponseProducer {
 public:
  struct Hooks {
    // Queues the request; returns a refusal made at once.
    std::function<std::optional<AdmissionDecision>(AdmissionQueue::Decided, AdmissionQueue::Id*)> submit;
    std::function<bool(AdmissionQueue::Id)> cancel;
    std::function<std::unique_ptr<ProxyProducer>(const AdmissionDecision&)> dispatched;  // it may go: its producer
    std::function<HttpResponse(const AdmissionDecision&)> refused;  // its answer, counted and refunded
    std::function<void()> dropped;    // dispatched after its client went
    std::function<void()> cancelled;  // its client went while it was queued
  };

  explicit QueuedProducer(Hooks hooks) : slot_(std::make_shared<Slot>()) { slot_->hooks = std::move(hooks); }
  ~QueuedProducer() override { abort(); }

  void start(std::function<void()> wake) override {
    {
      std::lock_guard<std::mutex> lock(slot_->mu);
      slot_->wake = std::move(wake);
    }
    AdmissionQueue::Id id = 0;
    const std::optional<AdmissionDecision> refused =
        slot_->hooks.submit([slot = slot_](const AdmissionDecision& d) { slot->decide(d); }, &id);
    if (refused) {
      slot_->decide(*refused);
      return;
    }
    std::lock_guard<std::mutex> lock(slot_->mu);
    slot_->id = id;
    slot_->queued = true;
  }

  void pull(Output& out) override {
    ProxyProducer* inner = nullptr;
    {
      std::lock_guard<std::mutex> lock(slot_->mu);
      if (slot_->refusal) {
        out.head = std::move(*slot_->refusal);
        slot_->refusal.reset();
        out.done = true;
        return;
      }
      inner = slot_->inner.get();
    }
    if (inner != nullptr) inner->pull(out);
  }

  void abort() override {
    ProxyProducer* inner = nullptr;
    bool queued = false;
    AdmissionQueue::Id id = 0;
    {
      std::lock_guard<std::mutex> lock(slot_->mu);
      if (slot_->aborted) return;
      slot_->aborted = true;
      slot_->wake = nullptr;
      inner = slot_->inner.get();
      queued = slot_->queued && !slot_->decided;
      id = slot_->id;
    }
    if (inner != nullptr) {
      inner->abort();
    } else if (queued && slot_->hooks.cancel(id)) {
      slot_->hooks.cancelled();
    }
  }

 private:
  struct Slot {
    Hooks hooks;
    std::mutex mu;  // what follows
    std::function<void()> wake;
    std::unique_ptr<ProxyProducer> inner;
    std::optional<HttpResponse> refusal;
    AdmissionQueue::Id id = 0;
    bool queued = false;
    bool decided = false;
    bool aborted = false;

    void decide(const AdmissionDecision& d) {
      std::unique_lock<std::mutex> lock(mu);
      decided = true;
      if (aborted) {
        lock.unlock();
        if (d.dispatched) {
          hooks.dropped();
        } else {
          hooks.refused(d);
        }
        return;
      }
      if (d.dispatched) {
        inner = hooks.dispatched(d);
        inner->start(wake);  // under mu: pull() and abort() wait for the producer to exist
        return;
      }
      refusal = hooks.refused(d);
      const std::function<void()> w = wake;
      lock.unlock();
      if (w) w();
    }
  };
  std::shared_ptr<Slot> slot_;
};

// Work done every `interval` on an io_context until stop(): tick() runs
// under mu, the next one is armed only after it, and none runs once stop()
// has returned (stop() waits for a tick in progress).
struct PeriodicWork : std::enable_shared_from_this<PeriodicWork> {
  std::mutex mu;  // held while ticking; guards the timer
  bool stopped = false;
  boost::asio::steady_timer timer;
  std::chrono::milliseconds interval;

  PeriodicWork(boost::asio::io_context& io, std::chrono::milliseconds every) : timer(io), interval(every) {}
  virtual ~PeriodicWork() = default;
  virtual void tick() = 0;  // under mu

  void start() {
    std::lock_guard<std::mutex> lock(mu);
    arm();
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mu);
    stopped = true;
    timer.cancel();
  }

 private:
  void arm() {  // under mu
    timer.expires_after(interval);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      const auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mu);
      if (self->stopped) return;
      self->tick();
      self->arm();
    });
  }
};

}  // namespace

// The admission queue, and what pumps it: requests as they come, the
// events that may free a replica (posted to the client io_context), and a
// 50 ms timer.
struct RouteServer::Admission : PeriodicWork {
  AdmissionQueue queue;
  boost::asio::io_context& io;

  explicit Admission(boost::asio::io_context& i) : PeriodicWork(i, std::chrono::milliseconds(50)), io(i) {}

  void tick() override { queue.pump(Clock::now()); }
  void pump() {
    std::lock_guard<std::mutex> lock(mu);
    if (!stopped) queue.pump(Clock::now());
  }
  void pump_soon() {
    boost::asio::post(io, [weak = weak_from_this()] {
      if (const auto self = weak.lock()) static_cast<Admission&>(*self).pump();
    });
  }
};

// The autoscaled pools' policies (router/autoscaler.h), evaluated on a
// timer, and what their last evaluation decided.
struct RouteServer::Autoscaling : PeriodicWork {
  struct PoolStatus {
    AutoscaleConfig config;
    int64_t ready = 0;
    int64_t desired = 0;
    int64_t waiting = 0;
    double observed = 0;
    std::string reason;
  };
  std::vector<PoolAutoscaler> scalers;  // under mu
  std::function<void()> evaluate;       // the server's: one evaluation of every pool, under mu
  mutable std::mutex status_mu;  // guards status
  std::vector<PoolStatus> status;

  Autoscaling(boost::asio::io_context& io, std::chrono::milliseconds every) : PeriodicWork(io, every) {}

  void tick() override { evaluate(); }
  void run_once() {
    std::lock_guard<std::mutex> lock(mu);
    if (!stopped) evaluate();
  }
  std::vector<PoolStatus> last() const {
    std::lock_guard<std::mutex> lock(status_mu);
    return status;
  }
};

namespace {

// Seconds, counted per bucket of kLatencyBounds (and past the last).
constexpr double kLatencyBounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
struct LatencyHistogram {
  std::vector<uint64_t> buckets = std::vector<uint64_t>(std::size(kLatencyBounds) + 1, 0);
  uint64_t count = 0;
  double sum = 0;
  void add(double seconds) {
    const auto bucket = std::lower_bound(std::begin(kLatencyBounds), std::end(kLatencyBounds), seconds);
    ++buckets[static_cast<size_t>(bucket - std::begin(kLatencyBounds))];
    ++count;
    sum += seconds;
  }
};

// The share of a prompt its first replica held, counted per bucket of
// kShareBounds.
constexpr double kShareBounds[] = {0, 0.1, 0.25, 0.5, 0.75, 0.9, 1};
struct ShareHistogram {
  std::vector<uint64_t> buckets = std::vector<uint64_t>(std::size(kShareBounds) + 1, 0);
  uint64_t count = 0;
  double sum = 0;
  void add(double share) {
    const auto bucket = std::lower_bound(std::begin(kShareBounds), std::end(kShareBounds), share);
    ++buckets[static_cast<size_t>(bucket - std::begin(kShareBounds))];
    ++count;
    sum += share;
  }
};

}  // namespace

// Counters shared with the requests in flight (their callbacks may end
// after the server).
struct RouteServer::Shared {
  bool log_requests = true;
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;                 // (route, status)
  std::map<std::pair<std::string, std::string>, int64_t> attempts;       // (replica, outcome)
  std::map<std::string, uint64_t> round_robin;                             // per model
  std::map<std::pair<std::string, std::string>, int64_t> failovers;       // (replica that failed, reason)
  std::map<std::pair<std::string, std::string>, int64_t> retries;         // (replica retried away from, reason)
  std::map<std::pair<std::string, int>, int64_t> tenant_requests;         // (tenant, status), forwarded
  std::map<std::pair<std::string, std::string>, int64_t> rejections;      // (tenant, reason)
  std::map<std::pair<std::string, bool>, int64_t> pool_requests;          // (pool, overflowed)
  std::map<std::pair<std::string, std::string>, int64_t> region_refusals;  // (tenant, reason)
  // Answered requests (2xx): time to the first byte by the replica that
  // sent it, and in all by the last replica tried; both by tenant too.
  std::map<std::string, LatencyHistogram> replica_ttft, replica_total, tenant_ttft, tenant_total;
  // Cache-aware: the prompt's share its first replica held, approximate [0] or exact [1].
  ShareHistogram cached_share[2];
  // The gateway's own time with relayed events and bodies (no lock: atomics).
  AddedLatency added_latency;
  std::atomic<int64_t> in_flight{0};
  // The prompts' estimated tokens, an EWMA over completions and chats (0
  // before the first): what a replica's waiting request is taken to hold.
  std::atomic<double> average_prompt_tokens{0};
  // Answered requests' seconds to the first byte over the last kTtftWindow,
  // by the pool label of the replica that sent it (the autoscaler's
  // ttft_p95), at most kTtftSamples per pool.
  static constexpr std::chrono::seconds kTtftWindow{60};
  static constexpr size_t kTtftSamples = 4096;
  std::map<std::string, std::deque<std::pair<Clock::time_point, double>>> recent_ttft;

  void note_ttft(const std::string& pool, double seconds, Clock::time_point now) {  // under mu
    auto& samples = recent_ttft[pool];
    samples.emplace_back(now, seconds);
    while (!samples.empty() && (samples.size() > kTtftSamples || samples.front().first < now - kTtftWindow))
      samples.pop_front();
  }
  // The 95th percentile of the window's samples of `pool` (empty: every
  // pool); 0 without any.
  double ttft_p95(const std::string& pool, Clock::time_point now) {
    std::vector<double> values;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [name, samples] : recent_ttft) {
        if (!pool.empty() && name != pool) continue;
        for (const auto& [at, seconds] : samples)
          if (at >= now - kTtftWindow) values.push_back(seconds);
      }
    }
    if (values.empty()) return 0;
    const size_t k = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(values.size()))) - 1;
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
    return values[k];
  }

  void note_prompt(int64_t tokens) {
    constexpr double kWeight = 0.05;  // of the newest prompt
    double old = average_prompt_tokens.load();
    const double t = static_cast<double>(tokens);
    while (!average_prompt_tokens.compare_exchange_weak(old, old == 0 ? t : kWeight * t + (1 - kWeight) * old)) {
    }
  }
  void count_region_refusal(const std::string& tenant, const char* reason) {
    std::lock_guard<std::mutex> lock(mu);
    ++region_refusals[{tenant, reason}];
  }

  void count_request(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{route, status}];
  }
  void count_attempt(const std::string& replica, AttemptOutcome outcome) {
    std::lock_guard<std::mutex> lock(mu);
    ++attempts[{replica, attempt_outcome_name(outcome)}];
  }
  // A 429 of the gateway's, counted under its tenant and reason.
  HttpResponse rejection(const std::string& tenant, const std::string& reason, int retry_after_s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++rejections[{tenant, reason}];
    }
    const char* message = reason == "rate"          ? "this API key's request rate limit is reached"
                          : reason == "tokens"      ? "this API key's token rate limit is reached"
                          : reason == "concurrency" ? "this API key has as many requests running as it may"
                          : reason == "queue_full"  ? "this API key has as many requests queued as it may"
                          : reason == "deadline"    ? "the request waited in the gateway's queue past its class's deadline"
                          : reason == "saturated"   ? "the replicas are saturated and this API key's requests are sheddable"
                                                    : "refused";
    HttpResponse r = json_error(429, message, "rate_limit_error");
    r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
    return r;
  }
};

RouteServer::RouteServer(ReplicaRegistry& registry, boost::asio::io_context& client_io, RouteServerOptions options,
                         HttpClientOptions client_options)
    : registry_(registry),
      options_(std::move(options)),
      clients_(client_io, std::move(client_options)),
      shared_(std::make_shared<Shared>()),
      prefixes_(options_.prefix) {
  shared_->log_requests = options_.log_requests;
  for (const AutoscaleConfig& c : options_.autoscale)  // before anything starts
    BASALT_CHECK(autoscaled(c.pool) == &c, "autoscaling: pool '{}' is given twice", c.pool);
  if (options_.health_checks) {
    health_ = std::make_unique<HealthChecker>(registry_, client_io, options_.health);
    health_->start();
  }
  if (options_.scrape_metrics) {
    scraper_ = std::make_unique<MetricsScraper>(registry_, client_io, options_.scrape);
    scraper_->start();
  }
  admission_ = std::make_shared<Admission>(client_io);
  // Its 50 ms pump also lets requests held for a pool scaled to zero go.
  if (options_.tenants != nullptr || !options_.autoscale.empty()) admission_->start();
  if (!options_.autoscale.empty()) {
    autoscaling_ = std::make_shared<Autoscaling>(client_io, options_.scrape.interval);
    for (const AutoscaleConfig& c : options_.autoscale) autoscaling_->scalers.emplace_back(c);
    autoscaling_->evaluate = [this] { evaluate_pools(); };
    autoscaling_->run_once();
    autoscaling_->start();
  }
  if (options_.policy == Policy::kCacheAware && !options_.tokenizers.empty()) {
    tokenizer_pool_ = std::make_unique<boost::asio::thread_pool>(std::max(1, options_.tokenizer_threads));
    KvEventsOptions events = options_.kv_events;
    if (events.api_key.empty()) events.api_key = options_.upstream_api_key;
    kv_events_ = std::make_unique<KvEventSubscriber>(registry_, client_io, kv_index_, std::move(events));
    kv_events_->start();
  }
}

RouteServer::~RouteServer() {
  if (tokenizer_pool_) {
    tokenizer_pool_->stop();
    tokenizer_pool_->join();
  }
  if (kv_events_) kv_events_->stop();
  if (autoscaling_) autoscaling_->stop();
  admission_->stop();
  if (health_) health_->stop();
  if (scraper_) scraper_->stop();
}

std::vector<const Replica*> RouteServer::candidates(const Snapshot& snapshot, const Routing& routing,
                                                    const std::vector<std::string>& tried, Clock::time_point now) const {
  std::vector<const Replica*> out;
  for (const Replica& r : snapshot.replicas) {
    if (r.state->draining.load() || !r.state->healthy.load() || !serves(r.spec, routing.model)) continue;
    if (!region_allowed(routing.regions, r.spec.region)) continue;  // never, whatever else fails
    if (std::find(tried.begin(), tried.end(), r.spec.id) != tried.end()) continue;
    std::lock_guard<std::mutex> lock(r.state->mu);
    if (r.state->breaker.available(now)) out.push_back(&r);
  }
  return out;
}

double RouteServer::pool_eqt_ms(const Snapshot& snapshot, const std::string& pool, Clock::time_point now) const {
  PoolLoad load;
  load.queued_tokens = static_cast<double>(queued_tokens_->of(pool));
  const double average_prompt = shared_->average_prompt_tokens.load();
  for (const Replica& r : snapshot.replicas) {
    if ((!pool.empty() && r.spec.pool != pool) || r.state->draining.load() || !r.state->healthy.load()) continue;
    const PrefillEstimate e =
        prefill_estimate(*r.state, now, options_.scrape, average_prompt, options_.assumed_prefill_rate);
    load.pending_prefill_tokens += e.pending_tokens;
    load.prefill_tokens_per_s += e.tokens_per_s;
  }
  return estimated_queue_ms(load);
}

std::pair<std::string, bool> RouteServer::choose_pool(const Routing& routing, const Snapshot& snapshot,
                                                      Clock::time_point now) {
  const std::string& home = routing.home_pool;
  if (home.empty() || routing.ttft_slo_ms <= 0) return {home, false};
  if (!overflow_.observe(home, routing.class_name, pool_eqt_ms(snapshot, home, now), routing.ttft_slo_ms) ||
      routing.overflow_pools.empty())
    return {home, false};
  const std::vector<const Replica*> usable = candidates(snapshot, routing, {}, now);
  std::vector<OverflowOption> options;
  for (const std::string& pool : routing.overflow_pools) {
    OverflowOption o;
    o.pool = pool;
    o.reachable = std::any_of(usable.begin(), usable.end(), [&](const Replica* r) { return r->spec.pool == pool; });
    o.eqt_ms = o.reachable ? pool_eqt_ms(snapshot, pool, now) : 0;
    options.push_back(o);
  }
  const std::optional<size_t> chosen = choose_overflow_pool(options, routing.ttft_slo_ms);
  if (!chosen) return {home, false};
  return {routing.overflow_pools[*chosen], true};
}

std::vector<std::vector<const Replica*>> RouteServer::by_pool(const Routing& routing, const std::string& chosen,
                                                              const std::vector<const Replica*>& candidates) {
  if (routing.home_pool.empty()) return {candidates};
  std::vector<std::string> pools = {chosen};
  if (chosen != routing.home_pool) pools.push_back(routing.home_pool);
  for (const std::string& p : routing.overflow_pools)
    if (std::find(pools.begin(), pools.end(), p) == pools.end()) pools.push_back(p);
  std::vector<std::vector<const Replica*>> groups;
  for (const std::string& pool : pools) {
    std::vector<const Replica*> group;
    for (const Replica* r : candidates)
      if (r->spec.pool == pool) group.push_back(r);
    if (!group.empty()) groups.push_back(std::move(group));
  }
  return groups;
}

std::shared_ptr<const TokenizerBundle> RouteServer::tokenizer_for(const std::string& model) const {
  if (const auto it = options_.tokenizers.find(model); it != options_.tokenizers.end()) return it->second;
  if (model.empty() && options_.tokenizers.size() == 1) return options_.tokenizers.begin()->second;
  return nullptr;
}

double RouteServer::cached_share(const Routing& routing, const Replica& replica, Clock::time_point now,
                                 bool* exact) const {
  *exact = false;
  double share = 0;
  Clock::duration provisional = options_.prefix.ttl;
  if (routing.exact) {
    if (const int32_t block_size = kv_index_.block_size(replica.spec.id); block_size > 0) {
      const std::vector<uint64_t>& hashes = routing.exact->hashes(block_size);
      const std::optional<size_t> matched = kv_index_.match(replica.spec.id, hashes);
      if (matched && !hashes.empty()) {
        *exact = true;
        share = static_cast<double>(*matched) / static_cast<double>(hashes.size());
        provisional = options_.provisional_window;  // what its events have not shown yet
      }
    }
  }
  if (!routing.blocks.empty()) {
    const std::string_view id = replica.spec.id;
    const size_t sent = prefixes_.match(std::span<const std::string_view>(&id, 1), routing.blocks, now,
                                        std::span<const Clock::duration>(&provisional, 1))[0];
    share = std::max(share, static_cast<double>(sent) / static_cast<double>(routing.blocks.size()));
  }
  return share;
}

std::vector<size_t> RouteServer::order(const Routing& routing, const std::vector<const Replica*>& group,
                                       uint64_t turn, uint64_t random, Clock::time_point now) const {
  std::vector<Candidate> loads;
  for (const Replica* r : group) {
    Candidate c{r->spec.id, load_of(*r->state, now, options_.scrape)};
    bool exact = false;
    if (options_.policy == Policy::kCacheAware) c.cached = cached_share(routing, *r, now, &exact);
    loads.push_back(c);
  }
  PickInput in;
  in.turn = turn;
  in.random = random;
  in.session = routing.session;
  return preference(options_.policy, loads, in);
}

bool RouteServer::first_choice_saturated(const Routing& routing) {
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const auto now = Clock::now();
  const std::vector<const Replica*> replicas = candidates(*snapshot, routing, {}, now);
  // None: an autoscaled pool wakes (scale from zero); otherwise the proxy answers that.
  if (replicas.empty()) return autoscaled(routing.home_pool) != nullptr;
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    turn = shared_->round_robin[routing.model];  // the turn pick() will take
  }
  // The pool pick() would choose now: a request held at an overflowing
  // home goes as soon as an overflow pool qualifies.
  const std::vector<std::vector<const Replica*>> groups =
      by_pool(routing, choose_pool(routing, *snapshot, now).first, replicas);
  if (groups.empty()) return autoscaled(routing.home_pool) != nullptr;
  const std::vector<size_t> preferred = order(routing, groups.front(), turn, 0, now);
  return saturated(*groups.front()[preferred.front()]->state, now, options_.scrape);
}

bool RouteServer::pool_saturated(const Routing& routing) {
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const auto now = Clock::now();
  std::vector<const Replica*> replicas;
  for (const auto& group : by_pool(routing, routing.home_pool, candidates(*snapshot, routing, {}, now)))
    replicas.insert(replicas.end(), group.begin(), group.end());
  return !replicas.empty() && std::all_of(replicas.begin(), replicas.end(), [&](const Replica* r) {
    return saturated(*r->state, now, options_.scrape);
  });
}

const AutoscaleConfig* RouteServer::autoscaled(const std::string& pool) const {
  for (const AutoscaleConfig& c : options_.autoscale)
    if (c.pool == pool) return &c;
  return nullptr;
}

bool RouteServer::held_for_zero(const Routing& routing) {
  if (autoscaled(routing.home_pool) == nullptr) return false;
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const std::vector<std::vector<const Replica*>> groups =
      by_pool(routing, routing.home_pool, candidates(*snapshot, routing, {}, Clock::now()));
  return std::all_of(groups.begin(), groups.end(), [](const auto& group) { return group.empty(); });
}

std::shared_ptr<const Replica> RouteServer::pick(const Routing& routing, const std::vector<std::string>& tried) {
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const auto now = Clock::now();
  Placement& placement = *routing.placement;
  // The first attempt chooses the request's pool; later ones keep it.
  std::string chosen;
  bool overflowed = false;
  bool decided = false;
  {
    std::lock_guard<std::mutex> lock(placement.mu);
    decided = placement.decided;
    chosen = placement.pool;
    overflowed = placement.overflowed;
  }
  if (!decided) std::tie(chosen, overflowed) = choose_pool(routing, *snapshot, now);
  const std::vector<std::vector<const Replica*>> groups =
      by_pool(routing, chosen, candidates(*snapshot, routing, tried, now));
  uint64_t turn = 0;
  if (!groups.empty()) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    turn = shared_->round_robin[routing.model]++;
  }
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const uint64_t random = rng();
  for (const std::vector<const Replica*>& group : groups) {
    for (const size_t k : order(routing, group, turn, random, now)) {
      const Replica* r = group[k];
      {
        std::lock_guard<std::mutex> lock(r->state->mu);
        if (!r->state->breaker.acquire(now)) continue;
      }
      if (tried.empty() && options_.policy == Policy::kCacheAware) {
        bool exact = false;
        const double share = cached_share(routing, *r, now, &exact);
        std::lock_guard<std::mutex> lock(shared_->mu);
        shared_->cached_share[exact ? 1 : 0].add(share);
      }
      // The prompt's blocks are (about to be) in that replica's cache.
      prefixes_.insert(r->spec.id, routing.blocks, now);
      {
        std::lock_guard<std::mutex> lock(placement.mu);
        if (!placement.decided) {
          placement.decided = true;
          placement.pool = chosen;
          placement.overflowed = overflowed && r->spec.pool == chosen;
          std::lock_guard<std::mutex> shared_lock(shared_->mu);
          ++shared_->pool_requests[{r->spec.pool, placement.overflowed}];
        }
        placement.region = r->spec.region;
      }
      // Shares the snapshot's ownership: the replica stays valid while the
      // request holds it, whatever set() does meanwhile.
      return std::shared_ptr<const Replica>(snapshot, r);
    }
  }
  if (!routing.regions.empty()) {
    std::lock_guard<std::mutex> lock(placement.mu);
    placement.ran_out_in_region = true;
  }
  return nullptr;  // none left, or their half-open trials were taken meanwhile
}

namespace {

// An attempt's end, told to its replica's breaker (which pick() acquired).
void report(const Replica& replica, AttemptOutcome outcome) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(replica.state->mu);
  CircuitBreaker& b = replica.state->breaker;
  switch (outcome) {
    case AttemptOutcome::kAnswered: b.success(now); break;
    case AttemptOutcome::kBusy:
    case AttemptOutcome::kCancelled: b.release(); break;
    case AttemptOutcome::kUnavailable:
    case AttemptOutcome::kFailed: b.failure(now); break;
    case AttemptOutcome::kUnreachable: b.eject(now); break;
  }
}

// A forwarded request's `request` log line: what is known when it arrives,
// then how it ended.
struct RequestLog {
  std::string remote, method, route, model, tenant, trace_id;
  // Where it ran; a request that ended in the admission queue has none.
  struct Ran {
    const std::vector<std::string>& tried;
    const std::string& pool;
    const std::string& region;
    double ttft_s = -1;
  };
  void emit(int status, const Ran* ran, double queue_s, double total_s) const {
    LogLine line("request", status >= 500 ? LogLevel::kWarning : LogLevel::kInfo);
    line.add("remote", remote)
        .add("method", method)
        .add("path", route)
        .add("model", model)
        .add("tenant", tenant)
        .add("status", status)
        .add("attempts", ran != nullptr ? static_cast<int64_t>(ran->tried.size()) : int64_t{0});
    if (ran != nullptr) {
      std::string replicas;
      for (const std::string& id : ran->tried) replicas += (replicas.empty() ? "" : ",") + id;
      line.add("replicas", replicas).add("pool", ran->pool).add("region", ran->region);
    }
    line.add("trace_id", trace_id).add("queue_s", queue_s);
    if (ran != nullptr) line.add("ttft_s", ran->ttft_s);
    line.add("total_s", total_s).emit();
  }
};

}  // namespace

HandlerResult RouteServer::handle(HttpRequest& request) {
  const std::string route = route_of(request.path);
  const auto answer = [&](HttpResponse r) {
    shared_->count_request(route, r.status);
    if (shared_->log_requests && route != "/metrics" && route != "/health" && route != "/ready")
      LogLine("request", r.status >= 500 ? LogLevel::kWarning : LogLevel::kInfo)
          .add("remote", request.remote)
          .add("method", request.method)
          .add("path", route)
          .add("status", r.status)
          .emit();
    return HandlerResult{std::move(r), nullptr};
  };
  const auto need = [&](const char* method) {
    return request.method == method || (std::string_view(method) == "GET" && request.method == "HEAD");
  };
  if (route == "/health") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    HttpResponse r;
    r.body = R"({"status":"ok"})";
    return answer(std::move(r));
  }
  if (route == "/ready") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
    const bool any = std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(), [](const Replica& r) {
      return !r.state->draining.load() && r.state->healthy.load();
    });
    HttpResponse r;
    r.status = any ? 200 : 503;
    r.body = any ? R"({"status":"ready"})" : error_body(503, "no listed replica is healthy", "server_error");
    return answer(std::move(r));
  }
  // The tenant, when the key is one of the tenants file's.
  std::optional<Tenant> tenant;
  TenantBook* book = options_.tenants != nullptr && !options_.tenants->empty() ? options_.tenants : nullptr;
  if (book != nullptr) {
    if (const auto h = request.header("authorization"); h && h->substr(0, 7) == "Bearer ")
      tenant = book->find(h->substr(7));
  }
  if (!tenant && (book != nullptr || !options_.api_keys.empty()) &&
      (options_.api_keys.empty() || !bearer_authorized(request, options_.api_keys))) {
    HttpResponse r = json_error(401, "a valid API key is required ('Authorization: Bearer KEY')", "invalid_request_error");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return answer(std::move(r));
  }
  if (route == "/metrics") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_text();
    return answer(std::move(r));
  }
  if (route == "/v1/autoscale") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    HttpResponse r;
    r.body = autoscale_json();
    return answer(std::move(r));
  }
  if (route == "/v1/workflows") {
    if (!options_.workflows) return answer(json_error(404, "no workflows are loaded (--workflows)", "invalid_request_error"));
    return options_.workflows(request);
  }
  if (route == "other") return answer(json_error(404, "no such endpoint: " + request.path, "invalid_request_error"));
  const bool by_model = routed_by_model(route);
  if (by_model ? request.method != "POST" : !need("GET"))
    return answer(json_error(405, by_model ? "use POST" : "use GET or HEAD", "invalid_request_error"));
  Routing routing;
  if (tenant) routing.tenant = tenant->name;
  // Where it may go (a hard filter) and where it should (its pools).
  AllowedRegions allowed = allowed_regions(tenant ? std::span<const std::string>(tenant->regions)
                                                  : std::span<const std::string>(),
                                           request.header("x-basalt-region"));
  if (allowed.status != 0) {
    if (allowed.status == 403) shared_->count_region_refusal(routing.tenant, "forbidden");
    return answer(json_error(allowed.status, allowed.message,
                             allowed.status == 403 ? "permission_error" : "invalid_request_error"));
  }
  routing.regions = std::move(allowed.regions);
  routing.home_pool = tenant && !tenant->pool.empty() ? tenant->pool : options_.home_pool;
  if (tenant) {
    routing.overflow_pools = tenant->overflow_pools;
    routing.class_name = tenant->class_name;
    routing.ttft_slo_ms = tenant->ttft_slo_ms;
  }
  std::string& model = routing.model;
  std::string& session = routing.session;
  if (auto h = request.header(options_.session_header); h && !options_.session_header.empty())
    session = std::string(h->substr(0, 256));
  bool stream = false;
  // A tenant's completion or chat waits in the admission queue.
  bool queued = false;
  Cost cost;
  if (by_model) {
    try {
      nlohmann::json body = parse_json_object(request.body);
      if (const auto it = body.find("model"); it != body.end() && it->is_string()) model = it->get<std::string>();
      if (const auto it = body.find("user"); session.empty() && it != body.end() && it->is_string())
        session = it->get<std::string>().substr(0, 256);
      if (route == "/v1/completions" || route == "/v1/chat/completions") {
        stream = body.value("stream", false) == true && !body.contains("basalt_resume");
        bool changed = false;
        {
          const auto prompt = body.find(route == "/v1/completions" ? "prompt" : "messages");
          cost.prompt = prompt != body.end() ? prompt_estimate(*prompt) : 0;
          shared_->note_prompt(cost.prompt);  // the size a replica's waiting request is taken to have
        }
        if (tenant) {
          queued = true;
          int64_t max_tokens = route == "/v1/completions" ? 16 : 1024;
          for (const char* field : {"max_tokens", "max_completion_tokens"})
            if (const auto m = body.find(field); m != body.end() && m->is_number_integer() && m->get<int64_t>() >= 0)
              max_tokens = std::min<int64_t>(m->get<int64_t>(), int64_t{1} << 30);
          int64_t n = 1;
          if (const auto c = body.find("n"); c != body.end() && c->is_number_integer())
            n = std::clamp<int64_t>(c->get<int64_t>(), 1, 128);
          cost.completion = max_tokens * n;
          // The tenant's namespace in the replicas' caches, and its class's
          // priority (the replica's scheduler then agrees with the gateway).
          if (!tenant->share_cache) {
            const auto salt = body.find("cache_salt");
            body["cache_salt"] =
                TenantBook::cache_salt(*tenant, salt != body.end() && salt->is_string() ? salt->get<std::string>() : "");
          }
          body["priority"] = tenant->priority;
          changed = true;
        }
        if (options_.policy == Policy::kCacheAware) {
          const auto salt = body.find("cache_salt");
          const std::string scope =
              model + '\x1f' + (salt != body.end() && salt->is_string() ? salt->get<std::string>() : "");
          const auto prompt = body.find(route == "/v1/completions" ? "prompt" : "messages");
          if (prompt != body.end())
            routing.blocks = prefixes_.blocks(scope, prompt->is_string() ? prompt->get<std::string>() : prompt->dump());
        }
        if (!body.contains("seed") || body["seed"].is_null()) {
          body["seed"] = random_seed();
          changed = true;
        }
        if (changed) request.body = body.dump();
        if (options_.policy == Policy::kCacheAware) {
          if (std::shared_ptr<const TokenizerBundle> tokenizer = tokenizer_for(model)) {
            const auto salt = body.find("cache_salt");
            routing.exact = std::make_shared<ExactPrompt>(
                std::move(tokenizer), request.body, route == "/v1/chat/completions",
                salt != body.end() && salt->is_string() ? salt->get_ref<const std::string&>() : std::string_view());
          }
        }
      }
    } catch (const ApiError& e) {
      HttpResponse r;
      r.status = e.status();
      r.body = e.body();
      return answer(std::move(r));
    }
    const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
    const bool known = std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(),
                                   [&](const Replica& r) { return serves(r.spec, model); });
    // An autoscaled pool scaled to zero lists no replica: which models it
    // serves is known once one is ready.
    const std::string& home = routing.home_pool;
    const bool none_listed =
        autoscaled(home) != nullptr &&
        std::none_of(snapshot->replicas.begin(), snapshot->replicas.end(),
                     [&](const Replica& r) { return home.empty() || r.spec.pool == home; });
    if (!known && !none_listed)
      return answer(json_error(404, "the model '" + model + "' is not served here", "invalid_request_error", "model"));
  }
  if (tenant) {
    const TenantBook::Admission a = book->admit(tenant->name, Clock::now(), queued ? cost.total() : 0, queued);
    if (!a.admitted) return answer(shared_->rejection(tenant->name, a.reason, a.retry_after_s));
    if (queued && tenant->sheddable && pool_saturated(routing)) {
      book->refund(tenant->name, cost.total());
      return answer(shared_->rejection(tenant->name, "saturated", 1));
    }
  }
  // A request for a model, whose autoscaled pool has no replica to take
  // it now, waits for one (scale from zero).
  const bool held = !queued && by_model && held_for_zero(routing);
  return forward(request, route, std::move(routing), stream, queued ? &*tenant : nullptr, cost, held);
}

HandlerResult RouteServer::forward(HttpRequest& request, const std::string& route, Routing routing, bool stream,
                                   const Tenant* queued_tenant, Cost cost, bool held) {
  const std::string model = routing.model;
  const std::string tenant = routing.tenant;  // routing itself moves into pick below
  // A prompt to tokenize before the first pick: its producer does that first.
  const auto tokenizing_first = [this, exact = routing.exact](std::unique_ptr<ResponseProducer> producer) {
    if (!exact || !tokenizer_pool_) return producer;
    return std::unique_ptr<ResponseProducer>(
        std::make_unique<TokenizingProducer>(*tokenizer_pool_, exact, std::move(producer)));
  };
  const bool queued = queued_tenant != nullptr || held;
  // The saturation gate reads the routing too.
  const Routing gate_routing = queued ? routing : Routing{};
  ProxyRequest p;
  p.max_attempts = options_.max_attempts;
  p.failover.enabled = stream;
  p.failover.max_failovers = options_.max_failovers;
  p.failover.stall_timeout = options_.stall_timeout;
  p.upstream.method = request.method == "HEAD" ? "GET" : request.method;
  p.upstream.path = request.target;
  p.upstream.body = std::move(request.body);
  if (!p.upstream.body.empty())
    p.upstream.headers.emplace_back("Content-Type",
                                    std::string(request.header("content-type").value_or("application/json")));
  if (auto id = request.header("x-request-id"); id && valid_client_id(*id)) {
    p.upstream.headers.emplace_back("X-Request-Id", std::string(*id));
  } else if (routed_by_model(route)) {
    p.upstream.headers.emplace_back("X-Request-Id", gateway_request_id());
  }
  p.trace = trace_of(request.header("traceparent"), request.header("tracestate"));
  const RequestLog request_log{request.remote, request.method, route, model, tenant, p.trace->trace_id};
  if (!options_.upstream_api_key.empty())
    p.upstream.headers.emplace_back("Authorization", "Bearer " + options_.upstream_api_key);
  if (!routing.regions.empty()) {
    std::string names;
    for (const std::string& r : routing.regions) names += (names.empty() ? "" : ", ") + r;
    p.no_replica_message = "no replica inside the allowed regions (" + names +
                           ") is available for this request; it is not sent outside them";
  }
  const std::shared_ptr<Placement> placement = routing.placement;
  const std::string home_pool = routing.home_pool;
  p.pick = [this, routing = std::move(routing)](const std::vector<std::string>& tried) { return pick(routing, tried); };
  std::shared_ptr<Shared> shared = shared_;
  p.observe.attempt = [shared](const Replica& replica, AttemptOutcome outcome) {
    report(replica, outcome);
    shared->count_attempt(replica.spec.id, outcome);
  };
  p.observe.failover = [shared](const ReplicaSpec& replica, const char* reason) {
    std::lock_guard<std::mutex> lock(shared->mu);
    ++shared->failovers[{replica.id, reason}];
  };
  p.observe.retry = [shared](const ReplicaSpec& from, AttemptOutcome why) {
    std::lock_guard<std::mutex> lock(shared->mu);
    ++shared->retries[{from.id, attempt_outcome_name(why)}];
  };
  p.added_latency = std::shared_ptr<AddedLatency>(shared, &shared->added_latency);
  TenantBook* book = !tenant.empty() ? options_.tenants : nullptr;
  const std::weak_ptr<Admission> admission = admission_;
  if (queued) {
    // A replica that began answering may have room for the next.
    p.observe.head = [admission] {
      if (const auto a = admission.lock()) a->pump_soon();
    };
  }
  // Seconds the request waited in the admission queue (set before its
  // producer starts, read after it ends).
  const auto queue_s = std::make_shared<double>(0);
  // When its first byte went out, and from which replica.
  struct FirstByte {
    std::mutex mu;
    double seconds = -1;
    std::string replica;
    std::string pool;  // the replica's pool label
  };
  const auto first_byte = std::make_shared<FirstByte>();
  p.observe.first_byte = [first_byte, start = Clock::now()](const ReplicaSpec& replica) {
    std::lock_guard<std::mutex> lock(first_byte->mu);
    first_byte->seconds = std::chrono::duration<double>(Clock::now() - start).count();
    first_byte->replica = replica.id;
    first_byte->pool = replica.pool;
  };
  p.observe.finished = [shared, route, request_log, book, tenant, queued, admission, cost, queue_s, placement,
                        first_byte, start = Clock::now()](int status, const std::vector<std::string>& tried,
                                                          int64_t completion_tokens) {
    shared->in_flight.fetch_sub(1);
    const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
    double ttft_s = -1;
    std::string ttft_replica, ttft_pool;
    {
      std::lock_guard<std::mutex> lock(first_byte->mu);
      ttft_s = first_byte->seconds;
      ttft_replica = first_byte->replica;
      ttft_pool = first_byte->pool;
    }
    if (status >= 200 && status < 300 && !tried.empty()) {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->replica_total[tried.back()].add(total_s);
      if (!tenant.empty()) shared->tenant_total[tenant].add(total_s);
      if (ttft_s >= 0) {
        shared->replica_ttft[ttft_replica].add(ttft_s);
        if (!tenant.empty()) shared->tenant_ttft[tenant].add(ttft_s);
        shared->note_ttft(ttft_pool, ttft_s, Clock::now());
      }
    }
    std::string pool, region;
    bool ran_out_in_region = false;
    {
      std::lock_guard<std::mutex> lock(placement->mu);
      pool = placement->pool;
      region = placement->region;
      ran_out_in_region = placement->ran_out_in_region;
    }
    if (ran_out_in_region) shared->count_region_refusal(tenant, "no_replica");
    if (book != nullptr) book->release(tenant);
    if (queued) {
      if (book != nullptr && completion_tokens >= 0) book->refund(tenant, cost.completion - completion_tokens);
      if (const auto a = admission.lock()) {
        a->queue.finished(tenant);
        a->pump_soon();
      }
    }
    shared->count_request(route, status);
    if (!tenant.empty()) {
      std::lock_guard<std::mutex> lock(shared->mu);
      ++shared->tenant_requests[{tenant, status}];
    }
    if (!shared->log_requests) return;
    const RequestLog::Ran ran{tried, pool, region, ttft_s};
    request_log.emit(status, &ran, *queue_s, total_s);
  };
  HandlerResult result;
  if (!queued) {
    shared->in_flight.fetch_add(1);
    result.producer = tokenizing_first(std::make_unique<ProxyProducer>(clients_, std::move(p)));
    return result;
  }
  // The request ended without running: its tokens back, its status counted and logged.
  const auto ended_unrun = [shared, route, request_log, book, tenant, cost,
                            start = Clock::now()](int status, double waited_s) {
    if (book != nullptr) book->refund(tenant, cost.total());
    shared->count_request(route, status);
    if (!shared->log_requests) return;
    const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
    // A client gone while queued waited all of it.
    request_log.emit(status, nullptr, waited_s >= 0 ? waited_s : total_s, total_s);
  };
  AdmissionRequest entry;
  entry.tenant = tenant;
  entry.cost = cost.total();
  if (queued_tenant != nullptr) {
    entry.class_name = queued_tenant->class_name;
    entry.priority = queued_tenant->priority;
    entry.weight = queued_tenant->weight;
    entry.max_concurrency = queued_tenant->limits.max_concurrency;
    entry.max_queued = queued_tenant->limits.max_queued;
    entry.queue_deadline = std::chrono::milliseconds(queued_tenant->queue_deadline_ms);
    entry.ready = [this, gate_routing] { return !first_choice_saturated(gate_routing); };
  } else {
    // Held for its pool (no tenant: class and tenant ""): it goes once a replica can take it.
    entry.queue_deadline = options_.cold_start_timeout;
    entry.ready = [this, gate_routing] { return !held_for_zero(gate_routing); };
  }
  QueuedProducer::Hooks hooks;
  auto request_for_proxy = std::make_shared<ProxyRequest>(std::move(p));
  // Its tokens count in its home pool's EQT while it waits, once.
  const auto unqueue = [queued_tokens = queued_tokens_, queued_requests = queued_requests_, home_pool,
                        tokens = cost.total(), left = std::make_shared<std::atomic<bool>>(false)] {
    if (left->exchange(true)) return;
    queued_tokens->remove(home_pool, tokens);
    queued_requests->remove(home_pool, 1);
  };
  queued_tokens_->add(home_pool, cost.total());
  queued_requests_->add(home_pool, 1);
  hooks.submit = [admission = admission_, entry = std::move(entry), unqueue](AdmissionQueue::Decided decided,
                                                                             AdmissionQueue::Id* id) {
    auto refused = admission->queue.submit(entry, Clock::now(), std::move(decided), id);
    if (refused) {
      unqueue();
    } else {
      admission->pump();
    }
    return refused;
  };
  hooks.cancel = [admission](AdmissionQueue::Id id) {
    const auto a = admission.lock();
    return a && a->queue.cancel(id);
  };
  hooks.dispatched = [this, shared, book, tenant, request_for_proxy, queue_s, unqueue](const AdmissionDecision& d) {
    unqueue();
    *queue_s = d.waited_s;
    shared->in_flight.fetch_add(1);
    if (book != nullptr) book->started(tenant);
    return std::make_unique<ProxyProducer>(clients_, std::move(*request_for_proxy));
  };
  hooks.refused = [shared, tenant, ended_unrun, unqueue, home_pool,
                   timeout_s = std::chrono::duration<double>(options_.cold_start_timeout).count()](
                      const AdmissionDecision& d) {
    unqueue();
    if (tenant.empty()) {  // held for its pool: none turned ready in time
      HttpResponse r = json_error(
          503,
          fmt::format("no replica of {} became ready within {} s (the gateway's --cold-start-timeout)",
                      home_pool.empty() ? std::string("the replicas") : "pool '" + home_pool + "'", timeout_s),
          "server_error");
      r.headers.emplace_back("Retry-After", std::to_string(d.retry_after_s));
      ended_unrun(503, d.waited_s);
      return r;
    }
    HttpResponse r = shared->rejection(tenant, d.reason, d.retry_after_s);
    ended_unrun(429, d.waited_s);
    return r;
  };
  hooks.dropped = [admission, tenant, ended_unrun, unqueue] {
    unqueue();
    if (const auto a = admission.lock()) {
      a->queue.finished(tenant);
      a->pump_soon();
    }
    ended_unrun(499, -1);
  };
  hooks.cancelled = [ended_unrun, unqueue] {
    unqueue();
    ended_unrun(499, -1);
  };
  result.producer = tokenizing_first(std::make_unique<QueuedProducer>(std::move(hooks)));
  return result;
}

void RouteServer::note_rejection(const TransportRejection& r) {
  const std::string route = r.path.empty() ? "other" : route_of(r.path);
  shared_->count_request(route, r.status);
  if (shared_->log_requests) transport_rejection_line(r, route).emit();
}

void RouteServer::evaluate_pools() {
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const auto now = Clock::now();
  std::vector<Autoscaling::PoolStatus> status;
  for (PoolAutoscaler& scaler : autoscaling_->scalers) {
    const AutoscaleConfig& c = scaler.config();
    AutoscaleObservation o;
    o.now_s = std::chrono::duration<double>(now.time_since_epoch()).count();
    double load = 0;
    for (const Replica& r : snapshot->replicas) {
      if ((!c.pool.empty() && r.spec.pool != c.pool) || r.state->draining.load() || !r.state->healthy.load()) continue;
      ++o.ready;
      if (c.metric == AutoscaleMetric::kConcurrency)
        load += static_cast<double>(load_of(*r.state, now, options_.scrape));
    }
    o.waiting = c.pool.empty() ? queued_requests_->total() : queued_requests_->of(c.pool);
    switch (c.metric) {
      case AutoscaleMetric::kConcurrency:
        o.observed = (load + static_cast<double>(o.waiting)) / static_cast<double>(std::max<int64_t>(1, o.ready));
        break;
      case AutoscaleMetric::kQueueTime: o.observed = pool_eqt_ms(*snapshot, c.pool, now) / 1000; break;
      case AutoscaleMetric::kTtftP95: o.observed = shared_->ttft_p95(c.pool, now); break;
    }
    const AutoscaleDecision d = scaler.observe(o);
    status.push_back({c, o.ready, d.desired, o.waiting, o.observed, d.reason});
  }
  std::lock_guard<std::mutex> lock(autoscaling_->status_mu);
  autoscaling_->status = std::move(status);
}

std::string RouteServer::autoscale_json() const {
  nlohmann::json pools = nlohmann::json::array();
  if (autoscaling_) {
    for (const Autoscaling::PoolStatus& p : autoscaling_->last()) {
      const AutoscaleConfig& c = p.config;
      pools.push_back({{"pool", c.pool},
                       {"metric", autoscale_metric_name(c.metric)},
                       {"target", c.target},
                       {"min", c.min_replicas},
                       {"max", c.max_replicas},
                       {"up_after_s", c.up_after_s},
                       {"down_after_s", c.down_after_s},
                       {"current", p.ready},
                       {"desired", p.desired},
                       // Not finite (a queue time with no replica): null.
                       {"observed", std::isfinite(p.observed) ? nlohmann::json(p.observed) : nlohmann::json()},
                       {"waiting", p.waiting},
                       {"reason", p.reason}});
    }
  }
  return nlohmann::json{{"pools", std::move(pools)}}.dump();
}

std::string RouteServer::metrics_text() const {
  PrometheusText out;
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  // Read before shared_->mu is taken: a pump holds the queue's lock while
  // its gate takes shared_->mu.
  const auto queue_depths = admission_->queue.depths();
  const auto queue_waits = admission_->queue.waits();
  const std::vector<Autoscaling::PoolStatus> autoscaled_pools =
      autoscaling_ ? autoscaling_->last() : std::vector<Autoscaling::PoolStatus>{};
  // The pools the listed replicas name, with their EQT (it reads shared_ too).
  std::map<std::string, double> pool_eqt_s;
  for (const Replica& r : snapshot->replicas)
    if (!r.spec.pool.empty() && !pool_eqt_s.count(r.spec.pool))
      pool_eqt_s[r.spec.pool] = pool_eqt_ms(*snapshot, r.spec.pool, Clock::now()) / 1000;
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!autoscaled_pools.empty()) {
    out.family("basalt_route_desired_replicas", "gauge",
               "Replicas each autoscaled pool should have, by the gateway's autoscaler (docs/DEPLOY.md section 4; "
               "pool \"\": every replica)");
    for (const Autoscaling::PoolStatus& p : autoscaled_pools)
      out.sample("basalt_route_desired_replicas", static_cast<double>(p.desired), {{"pool", p.config.pool}});
    out.family("basalt_route_ready_replicas", "gauge",
               "Replicas of each autoscaled pool that take requests now (listed, not draining, healthy)");
    for (const Autoscaling::PoolStatus& p : autoscaled_pools)
      out.sample("basalt_route_ready_replicas", static_cast<double>(p.ready), {{"pool", p.config.pool}});
    out.family("basalt_route_autoscale_observed", "gauge",
               "The metric each autoscaled pool is scaled by, as last observed (concurrency: requests per ready "
               "replica; queue_time, ttft_p95: seconds)");
    for (const Autoscaling::PoolStatus& p : autoscaled_pools)
      out.sample("basalt_route_autoscale_observed", p.observed,
                 {{"pool", p.config.pool}, {"metric", autoscale_metric_name(p.config.metric)}});
  }
  out.family("basalt_route_pool_estimated_queue_seconds", "gauge",
             "Estimated queue time of each pool: tokens queued for it here and waiting in its replicas over their "
             "prefill rate (+Inf without a replica to take them)");
  for (const auto& [pool, eqt] : pool_eqt_s)
    out.sample("basalt_route_pool_estimated_queue_seconds", eqt, {{"pool", pool}});
  out.family("basalt_route_pool_overflowing", "gauge",
             "1 while a home pool overflows for a class (its EQT went above the class's ttft_slo_ms and has not "
             "fallen below 0.8 of it since)");
  for (const auto& [key, on] : overflow_.states())
    out.sample("basalt_route_pool_overflowing", on ? 1 : 0, {{"pool", key.first}, {"class", key.second}});
  out.family("basalt_route_pool_requests_total", "counter",
             "Requests by the pool of the replica their first attempt went to, and whether they overflowed there");
  for (const auto& [key, n] : shared_->pool_requests)
    out.sample("basalt_route_pool_requests_total", static_cast<double>(n),
               {{"pool", key.first}, {"overflow", key.second ? "true" : "false"}});
  out.family("basalt_route_region_refusals_total", "counter",
             "Requests refused for their regions: forbidden (X-Basalt-Region outside the tenant's, 403), no_replica "
             "(no replica left inside them; never sent outside)");
  for (const auto& [key, n] : shared_->region_refusals)
    out.sample("basalt_route_region_refusals_total", static_cast<double>(n),
               {{"tenant", key.first}, {"reason", key.second}});
  out.family("basalt_route_requests_total", "counter", "Requests the gateway answered, by route and status");
  for (const auto& [key, n] : shared_->requests)
    out.sample("basalt_route_requests_total", static_cast<double>(n),
               {{"route", key.first}, {"status", std::to_string(key.second)}});
  out.gauge("basalt_route_requests_in_flight", "Forwarded requests not yet answered in full",
            static_cast<double>(shared_->in_flight.load()));
  out.family("basalt_route_replica_attempts_total", "counter",
             "Attempts on each replica, by how they ended (answered, retryable, failed, cancelled)");
  for (const auto& [key, n] : shared_->attempts)
    out.sample("basalt_route_replica_attempts_total", static_cast<double>(n),
               {{"replica", key.first}, {"outcome", key.second}});
  out.family("basalt_route_tenant_requests_total", "counter", "Forwarded requests by tenant and status");
  for (const auto& [key, n] : shared_->tenant_requests)
    out.sample("basalt_route_tenant_requests_total", static_cast<double>(n),
               {{"tenant", key.first}, {"status", std::to_string(key.second)}});
  out.family("basalt_route_rejections_total", "counter",
             "Requests answered 429 at the gateway, by tenant and reason (rate, tokens, concurrency, queue_full, "
             "deadline, saturated)");
  for (const auto& [key, n] : shared_->rejections)
    out.sample("basalt_route_rejections_total", static_cast<double>(n), {{"tenant", key.first}, {"reason", key.second}});
  if (options_.tenants != nullptr) {
    out.family("basalt_route_tenant_running", "gauge", "A tenant's requests being forwarded now");
    for (const auto& [name, n] : options_.tenants->running())
      out.sample("basalt_route_tenant_running", static_cast<double>(n), {{"tenant", name}});
  }
  out.family("basalt_route_queue_depth", "gauge", "Requests waiting in the gateway's admission queue, by class and tenant");
  for (const auto& [key, n] : queue_depths)
    out.sample("basalt_route_queue_depth", static_cast<double>(n), {{"class", key.first}, {"tenant", key.second}});
  out.family("basalt_route_queue_wait_seconds", "histogram",
             "Seconds requests waited in the admission queue before going to a replica, by class");
  for (const auto& [class_name, w] : queue_waits)
    out.histogram_samples("basalt_route_queue_wait_seconds", AdmissionQueue::kWaitBounds,
                          std::span<const uint64_t>(w.buckets.data(), std::size(AdmissionQueue::kWaitBounds)), w.count,
                          w.sum, {{"class", class_name}});
  const auto latency = [&out](const char* name, const char* help, const char* label,
                              const std::map<std::string, LatencyHistogram>& histograms) {
    out.family(name, "histogram", help);
    for (const auto& [key, h] : histograms)
      out.histogram_samples(name, kLatencyBounds, std::span<const uint64_t>(h.buckets.data(), std::size(kLatencyBounds)),
                            h.count, h.sum, {{label, key}});
  };
  latency("basalt_route_replica_ttft_seconds",
          "Seconds from a request's arrival to its answer's first byte, by the replica that sent it (answered requests)",
          "replica", shared_->replica_ttft);
  latency("basalt_route_replica_request_seconds",
          "Seconds from a request's arrival to its answer's end, by the last replica tried (answered requests)",
          "replica", shared_->replica_total);
  latency("basalt_route_tenant_ttft_seconds",
          "Seconds from a request's arrival to its answer's first byte, by tenant (answered requests)", "tenant",
          shared_->tenant_ttft);
  latency("basalt_route_tenant_request_seconds",
          "Seconds from a request's arrival to its answer's end, by tenant (answered requests)", "tenant",
          shared_->tenant_total);
  out.family("basalt_route_prefix_cached_ratio", "histogram",
             "Cache-aware routing: the share of a prompt's blocks its first replica held, by how that was known "
             "(exact: the replica's KV events; approximate: where the gateway sent prompts)");
  for (int mode = 0; mode < 2; ++mode) {
    const ShareHistogram& h = shared_->cached_share[mode];
    if (h.count != 0)
      out.histogram_samples("basalt_route_prefix_cached_ratio", kShareBounds,
                            std::span<const uint64_t>(h.buckets.data(), std::size(kShareBounds)), h.count, h.sum,
                            {{"mode", mode == 1 ? "exact" : "approximate"}});
  }
  if (kv_events_) {
    out.family("basalt_route_kv_events_live", "gauge",
               "1 while a replica's KV events are read (its cached prefixes known exactly)");
    for (const Replica& r : snapshot->replicas)
      out.sample("basalt_route_kv_events_live", kv_index_.block_size(r.spec.id) > 0 ? 1 : 0, {{"replica", r.spec.id}});
    out.family("basalt_route_kv_index_blocks", "gauge", "Blocks a replica's KV events say it holds");
    for (const Replica& r : snapshot->replicas)
      out.sample("basalt_route_kv_index_blocks", static_cast<double>(kv_index_.blocks(r.spec.id)),
                 {{"replica", r.spec.id}});
    out.family("basalt_route_kv_events_resyncs_total", "counter",
               "Times a replica's KV-event stream ended after its snapshot (a gap, an error, the replica gone) and "
               "had to be read again");
    for (const auto& [id, n] : kv_events_->resyncs())
      out.sample("basalt_route_kv_events_resyncs_total", static_cast<double>(n), {{"replica", id}});
  }
  out.family("basalt_route_failovers_total", "counter",
             "Streams resumed on another replica, by the replica that failed them and why (eof, stall, cut)");
  for (const auto& [key, n] : shared_->failovers)
    out.sample("basalt_route_failovers_total", static_cast<double>(n), {{"replica", key.first}, {"reason", key.second}});
  out.family("basalt_route_retries_total", "counter",
             "Attempts after a request's first, before anything reached its client, by the replica retried away "
             "from and how its attempt ended (busy: 429, unavailable: 502/503/504, unreachable: no connection, "
             "failed: broken or timed out)");
  for (const auto& [key, n] : shared_->retries)
    out.sample("basalt_route_retries_total", static_cast<double>(n), {{"replica", key.first}, {"reason", key.second}});
  out.family("basalt_route_added_latency_seconds", "histogram",
             "Seconds the gateway held what it relayed: from reading the last byte of a replica's stream event "
             "(kind=event) or whole answer (kind=body) to handing it to the client connection's write");
  const auto residence = [&out](const char* kind, const ResidenceHistogram& h) {
    const ResidenceHistogram::Counts c = h.counts();
    out.histogram_samples("basalt_route_added_latency_seconds", ResidenceHistogram::kBounds,
                          std::span<const uint64_t>(c.buckets.data(), std::size(ResidenceHistogram::kBounds)), c.count,
                          c.sum, {{"kind", kind}});
  };
  residence("event", shared_->added_latency.event);
  residence("body", shared_->added_latency.body);
  out.family("basalt_route_replica_in_flight", "gauge", "Attempts running on each listed replica");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_in_flight", static_cast<double>(r.state->in_flight.load()),
               {{"replica", r.spec.id}});
  out.family("basalt_route_replica_draining", "gauge", "1 for a listed replica that takes no new requests");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_draining", r.state->draining.load() ? 1 : 0, {{"replica", r.spec.id}});
  out.family("basalt_route_replica_healthy", "gauge", "1 while a replica's /ready probes pass");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_healthy", r.state->healthy.load() ? 1 : 0, {{"replica", r.spec.id}});
  const auto now = Clock::now();
  out.family("basalt_route_replica_breaker_state", "gauge",
             "A replica's circuit breaker: 0 closed, 1 half-open (one trial at a time), 2 open");
  for (const Replica& r : snapshot->replicas) {
    std::lock_guard<std::mutex> state_lock(r.state->mu);
    out.sample("basalt_route_replica_breaker_state", static_cast<double>(r.state->breaker.state(now)),
               {{"replica", r.spec.id}});
  }
  // What the last scrape of each replica said (replicas without a good one have no sample).
  struct Scraped {
    std::string id;
    ScrapedLoad load;
  };
  std::vector<Scraped> scraped;
  for (const Replica& r : snapshot->replicas) {
    std::lock_guard<std::mutex> state_lock(r.state->mu);
    scraped.push_back({r.spec.id, r.state->scraped});
  }
  out.family("basalt_route_replica_waiting", "gauge", "Requests waiting in each replica, by its last good scrape");
  for (const Scraped& r : scraped)
    if (r.load.valid) out.sample("basalt_route_replica_waiting", r.load.waiting, {{"replica", r.id}});
  out.family("basalt_route_replica_running", "gauge", "Requests running in each replica, by its last good scrape");
  for (const Scraped& r : scraped)
    if (r.load.valid) out.sample("basalt_route_replica_running", r.load.running, {{"replica", r.id}});
  out.family("basalt_route_replica_kv_usage", "gauge", "Each replica's KV cache usage, 0 to 1, by its last good scrape");
  for (const Scraped& r : scraped)
    if (r.load.valid) out.sample("basalt_route_replica_kv_usage", r.load.kv_usage, {{"replica", r.id}});
  out.family("basalt_route_replica_scrape_failures_total", "counter",
             "Scrapes of a replica's /metrics that failed (no answer, not 200, or numbers missing)");
  for (const Scraped& r : scraped)
    out.sample("basalt_route_replica_scrape_failures_total", static_cast<double>(r.load.failures), {{"replica", r.id}});
  out.family("basalt_route_replica_ejections_total", "counter",
             "Times a replica was taken out at once for refusing or dropping a connection");
  for (const Replica& r : snapshot->replicas) {
    std::lock_guard<std::mutex> state_lock(r.state->mu);
    out.sample("basalt_route_replica_ejections_total", static_cast<double>(r.state->breaker.ejections()),
               {{"replica", r.spec.id}});
  }
  std::string text = out.take();
  if (options_.extra_metrics) text += options_.extra_metrics();
  return text;
}

}  // namespace basalt::router
