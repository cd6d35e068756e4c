// CircuitBreaker: whether the gateway may send a replica requests, from how
// its recent ones ended (docs/ROUTER.md §3). A pure state machine on the
// caller's clock; not thread-safe (ReplicaState locks it).
//
//  * closed: requests go. `failures_to_open` failures in a row (a broken or
//    timed-out exchange, a 5xx, a stall) open it.
//  * open: nothing goes for `open_for`; then half-open. eject() (the
//    replica refused or dropped a connection: it is down, not slow) opens
//    it at once, and a good health probe ends the wait early.
//  * half-open: one trial request at a time (acquire() true for it);
//    `successes_to_close` successes close it, a failure opens it again.
// Unlike SGLang's breaker (all requests through when half-open, 10
// failures, 60 s), one trial at a time keeps a burst off a replica that
// has just come back.
#pragma once

#include <chrono>
#include <cstdint>

namespace basalt::router {

struct BreakerOptions {
  int failures_to_open = 5;
  std::chrono::milliseconds open_for{10000};
  int successes_to_close = 2;
};

class CircuitBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State : uint8_t { kClosed = 0, kHalfOpen = 1, kOpen = 2 };

  explicit CircuitBreaker(BreakerOptions options = {}) : options_(options) {}

  // Whether a request could go now (without taking the half-open trial).
  bool available(Clock::time_point now);
  // Takes the right to send one request now: always when closed, the one
  // trial when half-open; its end must be reported (success(), failure()
  // or release()).
  bool acquire(Clock::time_point now);
  void success(Clock::time_point now);
  void failure(Clock::time_point now);
  // An attempt that ended without telling (the client went away, a 429).
  void release();
  void eject(Clock::time_point now);
  // A health probe that succeeded: an open breaker goes half-open.
  void probe_succeeded(Clock::time_point now);
  State state(Clock::time_point now);
  int64_t ejections() const { return ejections_; }

 private:
  void open(Clock::time_point now);
  void settle(Clock::time_point now);  // open past open_for: half-open

  BreakerOptions options_;
  State state_ = State::kClosed;
  int failures_ = 0;   // in a row, closed
  int successes_ = 0;  // half-open
  bool trial_ = false;  // half-open: the trial is out
  Clock::time_point opened_{};
  int64_t ejections_ = 0;
};

const char* breaker_state_name(CircuitBreaker::State state);

}  // namespace basalt::router
