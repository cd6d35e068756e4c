// Autoscaler: the autoscaler's brain in the gateway (docs/DEPLOY.md §4): per
// pool, how many replicas it should have, from what the gateway observes of
// it. Kubernetes acts on the number (KEDA or the HPA reads it from the
// gateway's /metrics as basalt_route_desired_replicas); the gateway only
// computes it.
//
// Contract:
//  * AutoscaleConfig: the pool (a replica label pool=; empty: every
//    replica), the metric and its target, the bounds [min_replicas,
//    max_replicas] and the hysteresis times up_after_s and down_after_s.
//    The metrics (what the gateway feeds, router/route_server.h):
//      concurrency: requests running and waiting per ready replica (the
//        replicas' scraped numbers, the gateway's requests queued for the
//        pool included), target in requests per replica;
//      queue_time: the pool's estimated queue time (ROUTER.md §5, EQT),
//        target in seconds;
//      ttft_p95: the 95th percentile of the gateway's own times to first
//        byte of the pool's answered requests over the last minute, target
//        in seconds.
//    parse_autoscale() reads the `--autoscale` text ('pool=a
//    metric=concurrency target=8 min=0 max=8 up_after=30s down_after=5m';
//    every key optional, defaults as below); an unknown key, a value out of
//    range (target > 0; 0 <= min <= max, 1 <= max <= 1000; times 0 to a
//    day, a number of seconds or with s, m or h), or a key given twice is a
//    basalt::Error naming the flag and the key.
//  * PoolAutoscaler::observe() is fed one observation at a time, in time
//    order; time is passed in (no clock inside), so recorded sequences
//    drive it as the gateway does every --metrics-interval. It returns the
//    decision: the desired replica count and why, in words.
//  * proposal = ceil(ready * observed / target), clamped to [min, max]
//    (no replica ready: 0 before the clamp).
//  * The first observation sets desired to the ready replicas, clamped.
//  * Up: once observed has been above 1.1 × target in every observation
//    for up_after (its first such observation up_after ago or earlier),
//    desired becomes the proposal when that is higher.
//  * Down: once observed has been below 0.7 × target for down_after,
//    desired goes one step down, not below the proposal.
//  * Every change of desired restarts both times at that observation, so
//    a further raise needs up_after more and a further step down
//    down_after more (at most one step down per down_after). Between 0.7
//    and 1.1 × target desired stays and both times end.
//  * Scale from zero: while requests wait in the gateway for the pool and
//    no replica of it is ready, desired is at least 1 at once (no
//    up_after: those requests wait for it), whatever the metric says, and
//    the reason says so; max is at least 1, so this always holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace basalt::router {

enum class AutoscaleMetric { kConcurrency, kQueueTime, kTtftP95 };

const char* autoscale_metric_name(AutoscaleMetric metric);

struct AutoscaleConfig {
  std::string pool;  // empty: every replica
  AutoscaleMetric metric = AutoscaleMetric::kConcurrency;
  double target = 8;  // requests per replica, or seconds
  int64_t min_replicas = 1;
  int64_t max_replicas = 8;
  double up_after_s = 30;
  double down_after_s = 300;
};

// `text` as above; `where` names it in errors ("--autoscale").
AutoscaleConfig parse_autoscale(std::string_view text, std::string_view where);

struct AutoscaleObservation {
  double now_s = 0;          // seconds on a monotonic clock, never decreasing
  int64_t ready = 0;         // the pool's replicas that take requests now
  double observed = 0;       // the metric's value now
  int64_t waiting = 0;       // requests the gateway holds for the pool while none is ready
};

struct AutoscaleDecision {
  int64_t desired = 0;
  std::string reason;
};

class PoolAutoscaler {
 public:
  explicit PoolAutoscaler(AutoscaleConfig config);
  AutoscaleDecision observe(const AutoscaleObservation& observation);
  const AutoscaleConfig& config() const { return config_; }

 private:
  AutoscaleConfig config_;
  std::optional<int64_t> desired_;    // none before the first observation
  std::optional<double> above_since_;  // observed > 1.1 × target since then
  std::optional<double> below_since_;  // observed < 0.7 × target since then
};

}  // namespace basalt::router
