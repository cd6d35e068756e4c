#include "router/circuit_breaker.h"

namespace basalt::router {

void CircuitBreaker::settle(Clock::time_point now) {
  if (state_ == State::kOpen && now - opened_ >= options_.open_for) {
    state_ = State::kHalfOpen;
    successes_ = 0;
    trial_ = false;
  }
}

void CircuitBreaker::open(Clock::time_point now) {
  state_ = State::kOpen;
  opened_ = now;
  failures_ = 0;
  successes_ = 0;
  trial_ = false;
}

bool CircuitBreaker::available(Clock::time_point now) {
  settle(now);
  return state_ == State::kClosed || (state_ == State::kHalfOpen && !trial_);
}

bool CircuitBreaker::acquire(Clock::time_point now) {
  if (!available(now)) return false;
  if (state_ == State::kHalfOpen) trial_ = true;
  return true;
}

void CircuitBreaker::success(Clock::time_point now) {
  settle(now);
  if (state_ == State::kClosed) {
    failures_ = 0;
  } else if (state_ == State::kHalfOpen) {
    trial_ = false;
    if (++successes_ >= options_.successes_to_close) {
      state_ = State::kClosed;
      failures_ = 0;
    }
  }
}

void CircuitBreaker::failure(Clock::time_point now) {
  settle(now);
  if (state_ == State::kHalfOpen) {
    open(now);
  } else if (state_ == State::kClosed && ++failures_ >= options_.failures_to_open) {
    open(now);
  }
}

void CircuitBreaker::release() {
  if (state_ == State::kHalfOpen) trial_ = false;
}

void CircuitBreaker::eject(Clock::time_point now) {
  if (state_ != State::kOpen) ++ejections_;
  open(now);
}

void CircuitBreaker::probe_succeeded(Clock::time_point now) {
  settle(now);
  if (state_ == State::kOpen) {
    state_ = State::kHalfOpen;
    successes_ = 0;
    trial_ = false;
  }
}

CircuitBreaker::State CircuitBreaker::state(Clock::time_point now) {
  settle(now);
  return state_;
}

const char* breaker_state_name(CircuitBreaker::State state) {
  switch (state) {
    case CircuitBreaker::State::kClosed: return "closed";
    case CircuitBreaker::State::kHalfOpen: return "half_open";
    case CircuitBreaker::State::kOpen: return "open";
  }
  return "closed";
}

}  // namespace basalt::router
