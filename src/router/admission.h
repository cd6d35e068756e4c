// AdmissionQueue: where the gateway holds tenants' completions and chats
// until a replica can take them (docs/ROUTER.md §4), so that who goes
// first is decided here, by class and weight, rather than by the order in
// which replicas' queues happen to fill.
//
// Order: strict priority between classes (a higher class's request always
// goes before a lower one's that could go as well); inside a class,
// start-time fair queueing across tenants: the head request of tenant t,
// of cost c (its estimated tokens), has start tag S = max(V, F_t); the
// smallest S goes (ties: the request that came first), then F_t = S + c/w_t
// and V = S, V being the class's virtual time. Inside a tenant, first come
// first served. The tag is taken when the request is considered, not when
// it arrived, so a tenant whose requests waited past its max_concurrency
// (they are not eligible meanwhile) gets no credit for the wait.
//
// A request leaves the queue when its tenant is below max_concurrency and
// its own `ready()` says yes (the gateway's saturation gate: its replica
// below saturation); a head that is not ready lets the next candidate in
// the order go. Refusals, each with the seconds after which a retry may
// pass (Retry-After, 1 to 60):
//  * "queue_full": the tenant already has max_queued requests queued
//    (submit() answers at once; Retry-After = the class's estimated
//    queue time);
//  * "deadline": the request waited queue_deadline; Retry-After = ceil of
//    the class's estimated queue time: the cost queued in it and in higher
//    classes over the tokens dispatched per second in the last 10 s (the
//    deadline itself while nothing was dispatched).
//
// Contract: every method is safe from any thread. pump() dispatches and
// expires; calls of it never overlap (a second waits for the first), and
// the `decided` callbacks run from pump() outside the queue's lock, once
// per request (never for a request cancel() removed or submit() refused).
// A request's `ready()` runs under the lock and must not call the queue.
// Each dispatched request ends with finished(tenant).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace basalt::router {

struct AdmissionRequest {
  std::string tenant;
  std::string class_name;
  int priority = 0;             // the class's: higher first
  double weight = 1;            // the tenant's share inside its class, > 0
  int64_t max_concurrency = 0;  // the tenant's dispatched and not finished; 0: no limit
  int64_t max_queued = 0;       // the tenant's queued; 0: no limit
  int64_t cost = 1;             // estimated tokens (prompt + completion)
  std::chrono::milliseconds queue_deadline{60000};
  std::function<bool()> ready;  // null: always
};

struct AdmissionDecision {
  bool dispatched = false;
  std::string reason;  // when refused: "queue_full" or "deadline"
  int retry_after_s = 0;
  double waited_s = 0;
};

class AdmissionQueue {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;
  using Decided = std::function<void(const AdmissionDecision&)>;

  // Queues `request` (its id in `*id`) and returns none, or refuses it at
  // once and returns why (then `decided` is dropped). Nothing is dispatched
  // here: pump() does that.
  std::optional<AdmissionDecision> submit(AdmissionRequest request, Clock::time_point now,
                                          Decided decided, Id* id);
  // Refuses the requests past their deadline, then dispatches, one by one,
  // while some request may go.
  void pump(Clock::time_point now);
  // Removes a queued request (its client went away); false when it was
  // not queued (already decided).
  bool cancel(Id id);
  void finished(const std::string& tenant);

  size_t queued() const;
  // Queued requests per (class, tenant), those with none included once
  // they have had some.
  std::map<std::pair<std::string, std::string>, int64_t> depths() const;
  // Seconds dispatched requests waited, per class: counts per bucket of
  // kWaitBounds (and past the last), and their sum.
  static constexpr double kWaitBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                           1,     2.5,  5,     10,   30,  60};
  struct Waits {
    std::vector<uint64_t> buckets = std::vector<uint64_t>(std::size(kWaitBounds) + 1, 0);
    uint64_t count = 0;
    double sum = 0;
  };
  std::map<std::string, Waits> waits() const;

 private:
  struct Entry {
    AdmissionRequest request;
    Decided decided;
    Clock::time_point enqueued;
    uint64_t seq = 0;
  };
  struct TenantQueue {
    std::string class_name;
    int priority = 0;
    double weight = 1;
    int64_t max_concurrency = 0;
    std::deque<Id> fifo;
    double finish = 0;  // F_t
    int64_t running = 0;
  };
  // Under mu_: the class's estimated queue time, seconds (none: no rate).
  std::optional<double> estimated_wait_s(int priority, Clock::time_point now);
  int retry_after(int priority, std::chrono::milliseconds deadline, Clock::time_point now);

  mutable std::mutex mu_;
  std::mutex pump_mu_;  // pump() one at a time
  Id next_id_ = 1;
  std::map<Id, Entry> entries_;
  std::map<std::string, TenantQueue> tenants_;
  std::map<std::string, double> virtual_time_;                    // per class
  std::deque<std::pair<Clock::time_point, int64_t>> dispatched_;  // the last 10 s: (when, cost)
  std::map<std::string, Waits> waits_;
};

}  // namespace basalt::router
