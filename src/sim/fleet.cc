#include "sim/fleet.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fmt/format.h>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <queue>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "router/admission.h"
#include "router/placement.h"
#include "router/replica_registry.h"

namespace basalt::sim {

using Clock = std::chrono::steady_clock;

namespace {

// Virtual seconds as the router objects' clock: a fixed origin, an hour in,
// so that "long ago" (a never-scraped state's zero time point) stays long ago.
Clock::time_point at(double t_s) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(3600 + t_s)));
}

// Percentiles of values with multiplicities, as loadgen::percentile over the
// expanded list (numpy's linear method).
struct Weighted {
  std::vector<std::pair<double, int64_t>> items;  // (value, count)
  void add(double value, int64_t count) {
    if (count > 0) items.emplace_back(value, count);
  }
  loadgen::Summary summarize() {
    loadgen::Summary s;
    std::sort(items.begin(), items.end());
    int64_t n = 0;
    double sum = 0;
    for (const auto& [v, c] : items) {
      n += c;
      sum += v * static_cast<double>(c);
    }
    if (n == 0) return s;
    auto value_at = [&](int64_t rank) {
      int64_t seen = 0;
      for (const auto& [v, c] : items) {
        seen += c;
        if (rank < seen) return v;
      }
      return items.back().first;
    };
    auto pct = [&](double p) {
      const double rank = p / 100 * static_cast<double>(n - 1);
      const auto lo = static_cast<int64_t>(std::floor(rank));
      const double frac = rank - static_cast<double>(lo);
      const double a = value_at(lo);
      return frac == 0 ? a : a + frac * (value_at(lo + 1) - a);
    };
    s.count = n;
    s.mean = sum / static_cast<double>(n);
    s.min = items.front().first;
    s.max = items.back().first;
    s.median = pct(50);
    s.p90 = pct(90);
    s.p95 = pct(95);
    s.p99 = pct(99);
    return s;
  }
};

enum class Phase { kStarting, kReady, kDraining, kGone };

struct Running {
  int64_t request = 0;
  int64_t prefill_left = 0;  // prompt tokens still to prefill
  int64_t generated = 0;
  int64_t chunk = 0;     // prefill tokens in the step under way
  bool decoding = false;  // takes a decode token in the step under way
};

struct SimReplica {
  std::string id;
  std::shared_ptr<router::ReplicaState> state = std::make_shared<router::ReplicaState>();
  Phase phase = Phase::kStarting;
  double requested_s = 0, ready_s = 0;
  std::deque<int64_t> waiting;
  std::vector<Running> running;
  int64_t kv_used = 0;
  bool stepping = false;
  double step_start_s = 0;
  int64_t step_decode = 0;
  double prefill_tokens_total = 0;
  // Prefix cache: groups, most recently used first.
  std::list<int64_t> lru;
  std::unordered_map<int64_t, std::pair<std::list<int64_t>::iterator, int64_t>> cached;  // group -> (where, tokens)
  int64_t cached_tokens = 0;

  bool holds(int64_t group) const { return group >= 0 && cached.count(group) == 1; }
  void touch(int64_t group) {
    auto it = cached.find(group);
    lru.splice(lru.begin(), lru, it->second.first);
  }
  // Makes room for `tokens` more cached (evicting the least recently used).
  bool make_room(int64_t tokens, int64_t capacity) {
    while (!lru.empty() && kv_used + cached_tokens + tokens > capacity) {
      const int64_t victim = lru.back();
      cached_tokens -= cached[victim].second;
      cached.erase(victim);
      lru.pop_back();
    }
    return kv_used + cached_tokens + tokens <= capacity;
  }
  void insert(int64_t group, int64_t tokens, int64_t capacity) {
    if (group < 0 || tokens <= 0 || holds(group)) return;
    if (!make_room(tokens, capacity)) return;
    lru.push_front(group);
    cached[group] = {lru.begin(), tokens};
    cached_tokens += tokens;
  }
};

struct RequestState {
  int replica = -1;
  uint64_t attempt = 0;
  bool via_queue = false;
  double first_token_s = -1, last_token_s = -1, end_s = -1;
  bool failed = false;
};

enum class EventKind { kStepEnd, kReplicaReady, kTick, kPump };

struct Event {
  double t_s;
  uint64_t seq;
  EventKind kind;
  int replica;
  bool operator>(const Event& o) const { return t_s != o.t_s ? t_s > o.t_s : seq > o.seq; }
};

class Fleet {
 public:
  Fleet(const FleetConfig& config, const std::vector<SimRequest>& requests)
      : c_(config), reqs_(requests), state_(requests.size()), rng_(config.seed) {
    if (c_.autoscale) scaler_.emplace(*c_.autoscale);
    for (int64_t i = 0; i < c_.replicas; ++i) add_replica(0, /*ready=*/true);
    desired_ = c_.replicas;
  }

  SimResult run() {
    const double interval = std::chrono::duration<double>(c_.scrape.interval).count();
    push(0, EventKind::kTick, -1);
    size_t next_arrival = 0;
    while (finished_ < static_cast<int64_t>(reqs_.size())) {
      const bool arrival_first =
          next_arrival < reqs_.size() && (events_.empty() || reqs_[next_arrival].arrival_s <= events_.top().t_s);
      if (arrival_first) {
        now_ = reqs_[next_arrival].arrival_s;
        arrive(static_cast<int64_t>(next_arrival++));
        continue;
      }
      BASALT_CHECK(!events_.empty(), "simulation stalled with {} requests unfinished",
                   static_cast<int64_t>(reqs_.size()) - finished_);
      const Event e = events_.top();
      events_.pop();
      now_ = e.t_s;
      switch (e.kind) {
        case EventKind::kStepEnd: step_end(e.replica); break;
        case EventKind::kReplicaReady: replica_ready(e.replica); break;
        case EventKind::kTick:
          tick();
          push(now_ + interval, EventKind::kTick, -1);
          break;
        case EventKind::kPump:
          pump_scheduled_ = false;
          pump();
          break;
      }
    }
    return result();
  }

 private:
  void push(double t, EventKind kind, int replica) { events_.push({t, seq_++, kind, replica}); }

  int add_replica(double t, bool ready) {
    auto r = std::make_unique<SimReplica>();
    r->id = fmt::format("sim://replica-{}", replicas_.size());
    r->requested_s = t;
    r->phase = ready ? Phase::kReady : Phase::kStarting;
    r->ready_s = ready ? t : t + c_.cold_start_s;
    replicas_.push_back(std::move(r));
    const int index = static_cast<int>(replicas_.size()) - 1;
    if (!ready) {
      ++cold_starts_;
      push(t + c_.cold_start_s, EventKind::kReplicaReady, index);
    }
    max_replicas_ = std::max(max_replicas_, active_replicas());
    return index;
  }

  int64_t active_replicas() const {
    int64_t n = 0;
    for (const auto& r : replicas_) n += (r->phase == Phase::kReady || r->phase == Phase::kStarting) ? 1 : 0;
    return n;
  }

  void retire(SimReplica& r) {
    if (r.phase == Phase::kReady || r.phase == Phase::kDraining) ready_seconds_ += now_ - r.ready_s;
    r.phase = Phase::kGone;
    gpu_seconds_ += now_ - r.requested_s;
  }

  void replica_ready(int index) {
    SimReplica& r = *replicas_[static_cast<size_t>(index)];
    if (r.phase != Phase::kStarting) return;  // cancelled meanwhile
    r.phase = Phase::kReady;
    r.ready_s = now_;
    pump();
  }

  // The candidates the gateway would consider now, in replica order.
  void candidates(const SimRequest& q, std::vector<router::Candidate>& out, std::vector<int>& index) {
    out.clear();
    index.clear();
    const Clock::time_point t = at(now_);
    for (size_t i = 0; i < replicas_.size(); ++i) {
      SimReplica& r = *replicas_[i];
      if (r.phase != Phase::kReady) continue;
      router::Candidate cand;
      cand.id = r.id;
      cand.load = router::load_of(*r.state, t, c_.scrape);
      if (r.holds(q.prefix_group))
        cand.cached = static_cast<double>(q.prefix_tokens) / static_cast<double>(q.prompt_tokens);
      out.push_back(cand);
      index.push_back(static_cast<int>(i));
    }
  }

  // The replica the policy puts first for request `i`, or -1 when none is ready.
  int choose(int64_t i, uint64_t turn, uint64_t random) {
    const SimRequest& q = reqs_[static_cast<size_t>(i)];
    candidates(q, cands_, cand_index_);
    if (cands_.empty()) return -1;
    router::PickInput in;
    in.turn = turn;
    in.random = random;
    in.cache_threshold = c_.cache_threshold;
    in.balance_abs = c_.balance_abs;
    in.balance_rel = c_.balance_rel;
    const std::vector<size_t> order = router::preference(c_.policy, cands_, in);
    return cand_index_[order.front()];
  }

  bool any_ready() const {
    for (const auto& r : replicas_)
      if (r->phase == Phase::kReady) return true;
    return false;
  }

  void arrive(int64_t i) {
    const SimRequest& q = reqs_[static_cast<size_t>(i)];
    if (!c_.saturation_gate && any_ready()) {
      dispatch(i);
      return;
    }
    router::AdmissionRequest a;
    a.tenant = "sim";
    a.class_name = "default";
    a.cost = q.prompt_tokens + q.output_tokens;
    a.queue_deadline = std::chrono::milliseconds(static_cast<int64_t>(c_.queue_deadline_s * 1000));
    a.ready = [this, i] {
      const int first = choose(i, turn_, 0);
      if (first < 0) return false;
      if (!c_.saturation_gate) return true;
      return !router::saturated(*replicas_[static_cast<size_t>(first)]->state, at(now_), c_.scrape);
    };
    router::AdmissionQueue::Id id = 0;
    state_[static_cast<size_t>(i)].via_queue = true;
    queued_tokens_ += static_cast<double>(a.cost);
    const int64_t cost = a.cost;
    auto refused = admission_.submit(std::move(a), at(now_), [this, i, cost](const router::AdmissionDecision& d) {
      queued_tokens_ -= static_cast<double>(cost);
      if (d.dispatched) dispatch(i);
      else fail(i);
    }, &id);
    if (refused) {
      queued_tokens_ -= static_cast<double>(cost);
      fail(i);
      return;
    }
    pump();
    max_gateway_queue_ = std::max<int64_t>(max_gateway_queue_, static_cast<int64_t>(admission_.queued()));
  }

  void pump() {
    if (admission_.queued() == 0) return;
    admission_.pump(at(now_));
    if (admission_.queued() > 0 && !pump_scheduled_) {
      pump_scheduled_ = true;
      push(now_ + 0.05, EventKind::kPump, -1);  // the gateway checks its queue every 50 ms
    }
  }

  void fail(int64_t i) {
    RequestState& s = state_[static_cast<size_t>(i)];
    s.failed = true;
    s.end_s = now_;
    ++finished_;
  }

  void dispatch(int64_t i) {
    const int index = choose(i, turn_++, rng_());
    BASALT_CHECK(index >= 0, "internal: a request dispatched with no replica ready");
    const SimRequest& q = reqs_[static_cast<size_t>(i)];
    prompt_mean_ = prompt_seen_ == 0 ? static_cast<double>(q.prompt_tokens)
                                     : 0.1 * static_cast<double>(q.prompt_tokens) + 0.9 * prompt_mean_;
    ++prompt_seen_;
    SimReplica& r = *replicas_[static_cast<size_t>(index)];
    RequestState& s = state_[static_cast<size_t>(i)];
    s.replica = index;
    s.attempt = r.state->attempt_started();
    r.waiting.push_back(i);
    max_replica_queue_ = std::max<int64_t>(max_replica_queue_, static_cast<int64_t>(r.waiting.size()));
    start_step(index);
  }

  void start_step(int index) {
    SimReplica& r = *replicas_[static_cast<size_t>(index)];
    if (r.stepping || r.phase == Phase::kStarting || r.phase == Phase::kGone) return;
    const StepTable& t = c_.table;
    int64_t budget = t.step_token_budget;
    int64_t decode = 0, prefill = 0, context = 0;
    double pairs = 0;
    for (Running& run : r.running) {
      run.chunk = 0;
      run.decoding = run.prefill_left == 0;
      if (!run.decoding) continue;
      ++decode;
      context += reqs_[static_cast<size_t>(run.request)].prompt_tokens + run.generated;
    }
    budget -= decode;
    for (Running& run : r.running) {
      if (run.decoding || budget <= 0) continue;
      run.chunk = std::min(run.prefill_left, budget);
      budget -= run.chunk;
      prefill += run.chunk;
      pairs += StepTable::chunk_pairs(reqs_[static_cast<size_t>(run.request)].prompt_tokens - run.prefill_left,
                                      run.chunk);
    }
    while (!r.waiting.empty() && budget > 0 && static_cast<int64_t>(r.running.size()) < t.max_running) {
      const int64_t i = r.waiting.front();
      const SimRequest& q = reqs_[static_cast<size_t>(i)];
      const int64_t need = q.prompt_tokens + q.output_tokens;
      if (r.kv_used + need > t.kv_capacity_tokens) break;
      r.waiting.pop_front();
      r.kv_used += need;
      max_kv_usage_ =
          std::max(max_kv_usage_, static_cast<double>(r.kv_used) / static_cast<double>(t.kv_capacity_tokens));
      r.make_room(0, t.kv_capacity_tokens);  // the cache yields to running requests
      const bool hit = r.holds(q.prefix_group);
      if (hit) {
        r.touch(q.prefix_group);
        cached_prompt_tokens_ += q.prefix_tokens;
      } else {
        r.insert(q.prefix_group, q.prefix_tokens, t.kv_capacity_tokens);
      }
      Running run;
      run.request = i;
      run.prefill_left = q.prompt_tokens - (hit ? q.prefix_tokens : 0);
      run.chunk = std::min(run.prefill_left, budget);
      budget -= run.chunk;
      prefill += run.chunk;
      pairs += StepTable::chunk_pairs(q.prompt_tokens - run.prefill_left, run.chunk);
      r.running.push_back(run);
    }
    if (decode == 0 && prefill == 0) return;
    r.stepping = true;
    r.step_start_s = now_;
    r.step_decode = decode;
    r.prefill_tokens_total += static_cast<double>(prefill);
    push(now_ + t.step_ms({decode, context, prefill, pairs}) / 1000, EventKind::kStepEnd, index);
  }

  void step_end(int index) {
    SimReplica& r = *replicas_[static_cast<size_t>(index)];
    r.stepping = false;
    const double step_ms = (now_ - r.step_start_s) * 1000;
    int64_t gaps = 0;
    bool ended = false;
    std::vector<Running> still;
    still.reserve(r.running.size());
    for (Running& run : r.running) {
      const SimRequest& q = reqs_[static_cast<size_t>(run.request)];
      RequestState& s = state_[static_cast<size_t>(run.request)];
      if (run.decoding) {
        ++run.generated;
        ++gaps;
        s.last_token_s = now_;
      } else if (run.chunk > 0) {
        run.prefill_left -= run.chunk;
        if (run.prefill_left == 0) {
          run.generated = 1;
          s.first_token_s = s.last_token_s = now_;
          r.state->attempt_answering(s.attempt);  // streamed: the gateway sees the first token
          ttft_window_.emplace_back(now_, (now_ - q.arrival_s) * 1000);
        }
      }
      run.chunk = 0;
      if (run.generated >= q.output_tokens) {
        s.end_s = now_;
        r.kv_used -= q.prompt_tokens + q.output_tokens;
        r.state->attempt_ended(s.attempt, /*answering=*/true);
        if (s.via_queue) admission_.finished("sim");
        ++finished_;
        ended = true;
      } else {
        still.push_back(run);
      }
    }
    itl_.add(step_ms, gaps);
    step_seconds_ += step_ms / 1000;
    batch_seconds_ += static_cast<double>(r.step_decode) * step_ms / 1000;
    r.running = std::move(still);
    if (r.phase == Phase::kDraining && r.running.empty() && r.waiting.empty()) {
      retire(r);
      return;
    }
    start_step(index);
    if (ended) pump();
  }

  // Every scrape interval: the scrape, the autoscaler, the timeline.
  void tick() {
    const Clock::time_point t = at(now_);
    int64_t ready = 0, starting = 0, draining = 0, waiting = 0, running = 0;
    for (const auto& rp : replicas_) {
      SimReplica& r = *rp;
      if (r.phase == Phase::kStarting) ++starting;
      if (r.phase == Phase::kDraining) ++draining;
      if (r.phase != Phase::kReady && r.phase != Phase::kDraining) continue;
      router::ReplicaLoad load;
      load.waiting = static_cast<double>(r.waiting.size());
      load.running = static_cast<double>(r.running.size());
      load.kv_usage = static_cast<double>(r.kv_used) / static_cast<double>(c_.table.kv_capacity_tokens);
      load.prefill_tokens = r.prefill_tokens_total;
      router::MetricsScraper::record(*r.state, load, t);
      waiting += static_cast<int64_t>(r.waiting.size());
      running += static_cast<int64_t>(r.running.size());
      if (r.phase == Phase::kReady) ++ready;
    }
    while (!ttft_window_.empty() && ttft_window_.front().first < now_ - 60) ttft_window_.pop_front();
    if (scaler_) autoscale(t, ready);
    if (c_.timeline)
      timeline_.push_back({now_, ready, starting, draining, desired_, static_cast<int64_t>(admission_.queued()),
                           waiting, running});
    pump();
  }

  void autoscale(Clock::time_point t, int64_t ready) {
    const router::AutoscaleConfig& ac = scaler_->config();
    router::AutoscaleObservation o;
    o.now_s = now_;
    o.ready = ready;
    o.waiting = static_cast<int64_t>(admission_.queued());
    switch (ac.metric) {
      case router::AutoscaleMetric::kConcurrency: {
        double load = 0;
        for (const auto& r : replicas_)
          if (r->phase == Phase::kReady) load += static_cast<double>(router::load_of(*r->state, t, c_.scrape));
        o.observed = (load + static_cast<double>(o.waiting)) / static_cast<double>(std::max<int64_t>(1, ready));
        break;
      }
      case router::AutoscaleMetric::kQueueTime: {
        router::PoolLoad pool;
        pool.queued_tokens = queued_tokens_;
        for (const auto& r : replicas_) {
          if (r->phase != Phase::kReady) continue;
          const router::PrefillEstimate e =
              router::prefill_estimate(*r->state, t, c_.scrape, prompt_mean_, c_.assumed_prefill_rate);
          pool.pending_prefill_tokens += e.pending_tokens;
          pool.prefill_tokens_per_s += e.tokens_per_s;
        }
        o.observed = router::estimated_queue_ms(pool) / 1000;
        break;
      }
      case router::AutoscaleMetric::kTtftP95: {
        std::vector<double> ttfts;
        ttfts.reserve(ttft_window_.size());
        for (const auto& [when, ms] : ttft_window_) ttfts.push_back(ms / 1000);
        std::sort(ttfts.begin(), ttfts.end());
        o.observed = loadgen::percentile(ttfts, 95);
        break;
      }
    }
    desired_ = scaler_->observe(o).desired;
    int64_t active = active_replicas();
    while (active < desired_) {
      add_replica(now_, /*ready=*/false);
      ++active;
    }
    // Down: replicas still starting first (newest first), then the least loaded ready one.
    for (size_t k = replicas_.size(); k-- > 0 && active > desired_;) {
      SimReplica& r = *replicas_[k];
      if (r.phase != Phase::kStarting) continue;
      retire(r);
      --active;
    }
    while (active > desired_) {
      SimReplica* victim = nullptr;
      size_t least = std::numeric_limits<size_t>::max();
      for (const auto& r : replicas_) {
        if (r->phase != Phase::kReady) continue;
        const size_t load = r->running.size() + r->waiting.size();
        if (load < least) {
          least = load;
          victim = r.get();
        }
      }
      if (victim == nullptr) break;
      victim->phase = Phase::kDraining;
      victim->state->draining = true;
      if (victim->running.empty() && victim->waiting.empty() && !victim->stepping) retire(*victim);
      --active;
    }
  }

  SimResult result() {
    SimResult out;
    out.requests = static_cast<int64_t>(reqs_.size());
    out.slo_ttft_ms = c_.slo_ttft_ms;
    std::vector<double> ttft, e2e;
    int64_t good = 0;
    double end = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const SimRequest& q = reqs_[i];
      const RequestState& s = state_[i];
      end = std::max(end, s.end_s);
      loadgen::RequestDetail* detail = nullptr;
      if (c_.detailed) {
        detail = &out.details.emplace_back();
        detail->index = static_cast<int64_t>(i);
        detail->scheduled_s = q.arrival_s;
        detail->input_tokens = q.prompt_tokens;
      }
      if (s.failed) {
        ++out.failed;
        if (detail != nullptr) detail->error = "failed: refused or past the queue deadline";
        continue;
      }
      ++out.completed;
      out.input_tokens += q.prompt_tokens;
      out.output_tokens += q.output_tokens;
      const double t_ms = (s.first_token_s - q.arrival_s) * 1000;
      ttft.push_back(t_ms);
      e2e.push_back((s.end_s - q.arrival_s) * 1000);
      if (t_ms <= c_.slo_ttft_ms) ++good;
      if (detail != nullptr) {
        detail->ttft_ms = t_ms;
        detail->e2e_ms = e2e.back();
        detail->output_tokens = q.output_tokens;
      }
    }
    now_ = end;
    for (const auto& r : replicas_)
      if (r->phase != Phase::kGone) retire(*r);
    out.duration_s = end;
    if (end > 0) {
      out.request_throughput = static_cast<double>(out.completed) / end;
      out.output_throughput = static_cast<double>(out.output_tokens) / end;
    }
    out.slo_attainment = out.requests == 0 ? 1 : static_cast<double>(good) / static_cast<double>(out.requests);
    out.ttft_ms = loadgen::summarize(std::move(ttft));
    out.e2e_ms = loadgen::summarize(std::move(e2e));
    out.itl_ms = itl_.summarize();
    out.gpu_hours = gpu_seconds_ * static_cast<double>(c_.table.gpus_per_replica) / 3600;
    out.cold_starts = cold_starts_;
    out.max_replicas = max_replicas_;
    out.max_gateway_queue = max_gateway_queue_;
    out.max_replica_queue = max_replica_queue_;
    out.cached_prompt_tokens = cached_prompt_tokens_;
    out.prefix_hit_rate =
        out.input_tokens == 0 ? 0 : static_cast<double>(cached_prompt_tokens_) / static_cast<double>(out.input_tokens);
    out.mean_decode_batch = step_seconds_ > 0 ? batch_seconds_ / step_seconds_ : 0;
    out.busy_fraction = ready_seconds_ > 0 ? step_seconds_ / ready_seconds_ : 0;
    out.max_kv_usage = max_kv_usage_;
    out.timeline = std::move(timeline_);
    return out;
  }

  const FleetConfig& c_;
  const std::vector<SimRequest>& reqs_;
  std::vector<RequestState> state_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<SimReplica>> replicas_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  int64_t finished_ = 0;
  uint64_t turn_ = 0;
  router::AdmissionQueue admission_;
  bool pump_scheduled_ = false;
  double queued_tokens_ = 0;
  std::optional<router::PoolAutoscaler> scaler_;
  int64_t desired_ = 0;
  double prompt_mean_ = 0;
  int64_t prompt_seen_ = 0;
  std::deque<std::pair<double, double>> ttft_window_;  // (when, TTFT ms) of the last 60 s
  Weighted itl_;
  std::vector<router::Candidate> cands_;
  std::vector<int> cand_index_;
  double gpu_seconds_ = 0, ready_seconds_ = 0, step_seconds_ = 0, batch_seconds_ = 0, max_kv_usage_ = 0;
  int64_t cold_starts_ = 0, max_replicas_ = 0, max_gateway_queue_ = 0, max_replica_queue_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  std::vector<TimelinePoint> timeline_;
};

}  // namespace

void validate(const FleetConfig& c, const std::vector<SimRequest>& requests) {
  BASALT_CHECK(!c.table.decode_ms.empty() && c.table.prefill_tokens_per_s > 0 && c.table.kv_capacity_tokens >= 1,
               "the step table is incomplete");
  BASALT_CHECK(c.replicas >= 0, "--replicas must be >= 0, got {}", c.replicas);
  BASALT_CHECK(c.replicas >= 1 || c.autoscale, "--replicas 0 needs --autoscale (nothing would ever serve)");
  BASALT_CHECK(std::isfinite(c.cold_start_s) && c.cold_start_s >= 0, "--cold-start must be >= 0 seconds, got {}",
               c.cold_start_s);
  BASALT_CHECK(std::isfinite(c.queue_deadline_s) && c.queue_deadline_s > 0,
               "--queue-deadline must be > 0 seconds, got {}", c.queue_deadline_s);
  BASALT_CHECK(std::isfinite(c.slo_ttft_ms) && c.slo_ttft_ms > 0, "--slo-ttft-ms must be > 0, got {}", c.slo_ttft_ms);
  BASALT_CHECK(c.scrape.interval.count() > 0, "--scrape-interval must be > 0");
  BASALT_CHECK(std::isfinite(c.assumed_prefill_rate) && c.assumed_prefill_rate > 0,
               "--assumed-prefill-rate must be > 0");
  double last = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimRequest& q = requests[i];
    BASALT_CHECK(std::isfinite(q.arrival_s) && q.arrival_s >= last, "request {}: arrivals must be sorted and finite",
                 i);
    last = q.arrival_s;
    BASALT_CHECK(q.prompt_tokens >= 1 && q.output_tokens >= 1, "request {}: prompt and output must be >= 1 token", i);
    BASALT_CHECK(q.prefix_tokens >= 0 && q.prefix_tokens < q.prompt_tokens,
                 "request {}: its shared prefix ({} tokens) must be shorter than its prompt ({})", i, q.prefix_tokens,
                 q.prompt_tokens);
    BASALT_CHECK(q.prompt_tokens + q.output_tokens <= c.table.kv_capacity_tokens,
                 "request {}: {} prompt + {} output tokens do not fit a replica's KV pool ({} tokens)", i,
                 q.prompt_tokens, q.output_tokens, c.table.kv_capacity_tokens);
  }
}

SimResult simulate(const FleetConfig& config, const std::vector<SimRequest>& requests) {
  validate(config, requests);
  return Fleet(config, requests).run();
}

nlohmann::json sim_result_json(const SimResult& r) {
  auto summary = [](const loadgen::Summary& s) {
    return nlohmann::json{{"count", s.count}, {"mean", s.mean},   {"min", s.min}, {"median", s.median},
                          {"p90", s.p90},     {"p95", s.p95},     {"p99", s.p99}, {"max", s.max}};
  };
  nlohmann::json j = {{"requests", r.requests},
                      {"completed", r.completed},
                      {"failed", r.failed},
                      {"input_tokens", r.input_tokens},
                      {"output_tokens", r.output_tokens},
                      {"duration_s", r.duration_s},
                      {"request_throughput", r.request_throughput},
                      {"output_throughput", r.output_throughput},
                      {"slo_ttft_ms", r.slo_ttft_ms},
                      {"slo_attainment", r.slo_attainment},
                      {"ttft_ms", summary(r.ttft_ms)},
                      {"itl_ms", summary(r.itl_ms)},
                      {"e2e_ms", summary(r.e2e_ms)},
                      {"gpu_hours", r.gpu_hours},
                      {"cold_starts", r.cold_starts},
                      {"max_replicas", r.max_replicas},
                      {"max_gateway_queue", r.max_gateway_queue},
                      {"max_replica_queue", r.max_replica_queue},
                      {"cached_prompt_tokens", r.cached_prompt_tokens},
                      {"prefix_hit_rate", r.prefix_hit_rate},
                      {"mean_decode_batch", r.mean_decode_batch},
                      {"busy_fraction", r.busy_fraction},
                      {"max_kv_usage", r.max_kv_usage}};
  if (!r.timeline.empty()) {
    nlohmann::json points = nlohmann::json::array();
    for (const TimelinePoint& p : r.timeline)
      points.push_back({{"t_s", p.t_s},
                        {"ready", p.ready},
                        {"starting", p.starting},
                        {"draining", p.draining},
                        {"desired", p.desired},
                        {"gateway_queued", p.gateway_queued},
                        {"replica_waiting", p.replica_waiting},
                        {"running", p.running}});
    j["timeline"] = std::move(points);
  }
  if (!r.details.empty()) j["details"] = loadgen::request_details_json(r.details);
  return j;
}

std::string sim_result_table(const SimResult& r, const std::string& title) {
  std::string out = fmt::format("=== {} ===\n", title);
  out += fmt::format("{:<28}{} ({} completed, {} failed)\n", "requests", r.requests, r.completed, r.failed);
  out += fmt::format("{:<28}{:.1f}\n", "duration (s)", r.duration_s);
  out += fmt::format("{:<28}{:.2f} req/s, {:.0f} output tok/s\n", "throughput", r.request_throughput,
                     r.output_throughput);
  out += fmt::format("{:<28}{:.2f} % of requests within TTFT {:g} ms\n", "SLO attainment", r.slo_attainment * 100,
                     r.slo_ttft_ms);
  auto row = [&out](const char* name, const loadgen::Summary& s) {
    out += fmt::format("{:<28}mean {:.1f}  median {:.1f}  p90 {:.1f}  p99 {:.1f}  max {:.1f}\n", name, s.mean,
                       s.median, s.p90, s.p99, s.max);
  };
  row("TTFT (ms)", r.ttft_ms);
  row("ITL (ms)", r.itl_ms);
  row("E2E (ms)", r.e2e_ms);
  out += fmt::format("{:<28}{:.3f}\n", "GPU-hours", r.gpu_hours);
  out += fmt::format("{:<28}{} (largest fleet {})\n", "cold starts", r.cold_starts, r.max_replicas);
  out += fmt::format("{:<28}gateway {}, one replica {}\n", "max queue", r.max_gateway_queue, r.max_replica_queue);
  out += fmt::format("{:<28}{:.1f} % of prompt tokens\n", "prefix cache hits", r.prefix_hit_rate * 100);
  out += fmt::format("{:<28}mean decode batch {:.1f}, busy {:.1f} % of ready time, peak KV {:.1f} %\n", "replicas",
                     r.mean_decode_batch, r.busy_fraction * 100, r.max_kv_usage * 100);
  return out;
}

}  // namespace basalt::sim
