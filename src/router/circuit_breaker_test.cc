// CircuitBreaker on a clock the test moves, and HealthChecker::record's
// streaks.
#include "router/circuit_breaker.h"

#include <gtest/gtest.h>

#include "router/health.h"

namespace basalt::router {
namespace {

using namespace std::chrono_literals;
using State = CircuitBreaker::State;

TEST(CircuitBreaker, OpensAfterFailuresInARowAndClosesAfterTrials) {
  CircuitBreaker b({.failures_to_open = 3, .open_for = 10s, .successes_to_close = 2});
  auto t = CircuitBreaker::Clock::time_point{} + 1h;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(b.acquire(t));
    b.failure(t);
  }
  ASSERT_TRUE(b.acquire(t));
  b.success(t);  // the streak starts again
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(b.acquire(t));
    b.failure(t);
  }
  EXPECT_EQ(b.state(t), State::kOpen);
  EXPECT_FALSE(b.available(t + 9s));
  // Half-open: one trial at a time.
  t += 10s;
  EXPECT_EQ(b.state(t), State::kHalfOpen);
  ASSERT_TRUE(b.acquire(t));
  EXPECT_FALSE(b.acquire(t));
  b.success(t);
  EXPECT_EQ(b.state(t), State::kHalfOpen);
  ASSERT_TRUE(b.acquire(t));
  b.success(t);
  EXPECT_EQ(b.state(t), State::kClosed);
  EXPECT_TRUE(b.acquire(t) && b.acquire(t));  // closed: no limit
}

TEST(CircuitBreaker, AFailedTrialOpensAgainAndAReleasedOneFreesTheSlot) {
  CircuitBreaker b({.failures_to_open = 1, .open_for = 5s, .successes_to_close = 1});
  auto t = CircuitBreaker::Clock::time_point{} + 1h;
  b.failure(t);
  t += 5s;
  ASSERT_TRUE(b.acquire(t));
  b.release();  // the client went away: no verdict
  ASSERT_TRUE(b.acquire(t));
  b.failure(t);
  EXPECT_EQ(b.state(t), State::kOpen);
  EXPECT_EQ(b.state(t + 4s), State::kOpen);
  EXPECT_EQ(b.state(t + 5s), State::kHalfOpen);
}

TEST(CircuitBreaker, EjectionOpensAtOnceAndAGoodProbeEndsTheWait) {
  CircuitBreaker b;
  auto t = CircuitBreaker::Clock::time_point{} + 1h;
  b.eject(t);
  EXPECT_EQ(b.state(t), State::kOpen);
  EXPECT_EQ(b.ejections(), 1);
  b.eject(t + 1s);  // still open: not counted again
  EXPECT_EQ(b.ejections(), 1);
  b.probe_succeeded(t + 2s);
  EXPECT_EQ(b.state(t + 2s), State::kHalfOpen);
  EXPECT_TRUE(b.acquire(t + 2s));
}

TEST(HealthChecker, StreaksOfProbesMarkAReplicaUnhealthyAndHealthy) {
  ReplicaState s;
  const HealthOptions o;  // 2 and 2
  const auto t = std::chrono::steady_clock::now();
  HealthChecker::record(s, false, o, t);
  EXPECT_TRUE(s.healthy.load());
  HealthChecker::record(s, false, o, t);
  EXPECT_FALSE(s.healthy.load());
  HealthChecker::record(s, true, o, t);
  EXPECT_FALSE(s.healthy.load());
  HealthChecker::record(s, false, o, t);
  HealthChecker::record(s, true, o, t);
  HealthChecker::record(s, true, o, t);
  EXPECT_TRUE(s.healthy.load());
}

}  // namespace
}  // namespace basalt::router
