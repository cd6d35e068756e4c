#include "router/health.h"

#include <mutex>

namespace basalt::router {

HealthChecker::HealthChecker(ReplicaRegistry& registry, boost::asio::io_context& io, HealthOptions options)
    : poller_(registry, io, PollOptions{"/ready", options.interval, options.timeout, 1 << 16},
              [options](ReplicaState& state, const std::optional<PollAnswer>& answer) {
                record(state, answer && answer->status == 200, options, std::chrono::steady_clock::now());
              }) {}

void HealthChecker::record(ReplicaState& state, bool ok, const HealthOptions& options,
                           std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (ok) {
    state.probe_failures = 0;
    if (++state.probe_successes >= options.successes_to_healthy) state.healthy.store(true);
    state.breaker.probe_succeeded(now);
  } else {
    state.probe_successes = 0;
    if (++state.probe_failures >= options.failures_to_unhealthy) state.healthy.store(false);
  }
}

}  // namespace basalt::router
