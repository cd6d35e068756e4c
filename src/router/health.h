// HealthChecker: the gateway's active health checks (docs/ROUTER.md §3):
// every `interval` a GET /ready to each listed replica, answered 200 within
// `timeout` or failed. `failures_to_unhealthy` failures in a row mark the
// replica unhealthy (no new requests), `successes_to_healthy` successes
// healthy again; a success also lets an open circuit breaker try the
// replica (half-open) without waiting out its open time.
//
// Contract: as router/replica_poller.h's, whose rounds it is (probes never
// overlap for one replica; probes cancelled by stop() are not recorded).
// record() is the bookkeeping of one probe, for tests.
#pragma once

#include <chrono>
#include <memory>

#include "router/replica_poller.h"
#include "router/replica_registry.h"

namespace basalt::router {

struct HealthOptions {
  std::chrono::milliseconds interval{2000};
  std::chrono::milliseconds timeout{1000};
  int failures_to_unhealthy = 2;
  int successes_to_healthy = 2;
};

class HealthChecker {
 public:
  HealthChecker(ReplicaRegistry& registry, boost::asio::io_context& io, HealthOptions options = {});
  void start() { poller_.start(); }
  void stop() { poller_.stop(); }

  static void record(ReplicaState& state, bool ok, const HealthOptions& options,
                     std::chrono::steady_clock::time_point now);

 private:
  ReplicaPoller poller_;
};

}  // namespace basalt::router
