// HealthChecker: the gateway's active health checks (docs/ROUTER.md §3):
// every `interval` a GET /ready to each listed replica, answered 200 within
// `timeout` or failed. `failures_to_unhealthy` failures in a row mark the
// replica unhealthy (no new requests), `successes_to_healthy` successes
// healthy again; a success also lets an open circuit breaker try the
// replica (half-open) without waiting out its open time.
//
// Contract: runs on the io_context it is given (probes never overlap for
// one replica); start() and stop() from any thread; stop() (also the
// destructor) ends the ticks, probes in flight end as cancelled and are
// not recorded. record() is the bookkeeping of one probe, for tests.
#pragma once

#include <chrono>
#include <memory>

#include "router/replica_registry.h"

namespace boost::asio {
class io_context;
}

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
  ~HealthChecker();
  void start();
  void stop();

  static void record(ReplicaState& state, bool ok, const HealthOptions& options,
                     std::chrono::steady_clock::time_point now);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace basalt::router
