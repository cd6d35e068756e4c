// The autoscaler's policy driven by recorded metric sequences (step load, a
// burst, idle to zero, scale from zero), and the --autoscale text.
#include "router/autoscaler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace basalt::router {
namespace {

AutoscaleConfig config(int64_t min, int64_t max, double target = 8) {
  AutoscaleConfig c;
  c.min_replicas = min;
  c.max_replicas = max;
  c.target = target;
  c.up_after_s = 30;
  c.down_after_s = 300;
  return c;
}

// Runs `sequence` through a fresh autoscaler; the desired count after each.
std::vector<int64_t> desired_after(const AutoscaleConfig& c, const std::vector<AutoscaleObservation>& sequence) {
  PoolAutoscaler scaler(c);
  std::vector<int64_t> out;
  for (const AutoscaleObservation& o : sequence) out.push_back(scaler.observe(o).desired);
  return out;
}

// Every `step` seconds from `from` to before `to`: `ready` replicas, the metric at `observed`.
void record(std::vector<AutoscaleObservation>& s, double from, double to, double step, int64_t ready, double observed,
            int64_t waiting = 0) {
  for (double t = from; t < to; t += step) s.push_back({t, ready, observed, waiting});
}

TEST(Autoscaler, StepLoadRaisesOnceItHasLastedUpAfter) {
  std::vector<AutoscaleObservation> s;
  record(s, 0, 10, 5, 2, 6);     // 6 per replica against 8: within the band
  record(s, 10, 60, 5, 2, 16);   // twice the target from t = 10
  record(s, 60, 120, 5, 4, 8);   // the new replicas carry it: on target
  const std::vector<int64_t> d = desired_after(config(1, 10), s);
  ASSERT_EQ(d.size(), 24u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(d[i], 2) << "t = " << s[i].now_s;  // to t = 35: above, held
  EXPECT_EQ(d[8], 4);  // t = 40: 30 s above, ceil(2 * 16 / 8)
  for (size_t i = 9; i < d.size(); ++i) EXPECT_EQ(d[i], 4) << "t = " << s[i].now_s;
}

TEST(Autoscaler, ABurstShorterThanUpAfterDoesNotScaleAndTheNextCountsFromItsStart) {
  std::vector<AutoscaleObservation> s;
  record(s, 0, 10, 5, 2, 6);
  record(s, 10, 35, 5, 2, 40);  // 25 s at five times the target
  record(s, 35, 50, 5, 2, 6);
  record(s, 50, 85, 5, 2, 40);  // a second burst: 30 s from t = 50 at t = 80
  const std::vector<int64_t> d = desired_after(config(1, 8), s);
  for (size_t i = 0; i < d.size(); ++i) {
    const double t = s[i].now_s;
    EXPECT_EQ(d[i], t < 80 ? 2 : 8) << "t = " << t;  // ceil(2 * 40 / 8) = 10, clamped to max 8
  }
}

TEST(Autoscaler, IdleStepsDownOnePerDownAfterToZero) {
  // The replicas follow the desired count; nothing arrives.
  for (const int64_t min : {0, 1}) {
    PoolAutoscaler scaler(config(min, 8));
    int64_t ready = 4;
    std::vector<std::pair<double, int64_t>> changes;  // (when, to)
    int64_t last = -1;
    for (double t = 0; t <= 1500; t += 10) {
      const AutoscaleDecision d = scaler.observe({t, ready, 0, 0});
      if (d.desired != last) changes.push_back({t, d.desired});
      last = d.desired;
      ready = d.desired;
    }
    std::vector<std::pair<double, int64_t>> expected = {{0, 4}, {300, 3}, {600, 2}, {900, 1}};
    if (min == 0) expected.push_back({1200, 0});
    EXPECT_EQ(changes, expected) << "min " << min;
  }
}

TEST(Autoscaler, LowLoadStepsDownNoFurtherThanWhatItNeeds) {
  std::vector<AutoscaleObservation> s;
  record(s, 0, 1000, 10, 4, 3);  // 3 per replica on 4: ceil(4 * 3 / 8) = 2 would do
  const std::vector<int64_t> d = desired_after(config(1, 8), s);
  for (size_t i = 0; i < d.size(); ++i) {
    const double t = s[i].now_s;
    EXPECT_EQ(d[i], t < 300 ? 4 : t < 600 ? 3 : 2) << "t = " << t;
  }
}

TEST(Autoscaler, ARequestWaitingAtZeroWakesThePoolAtOnceAndIdleTakesItBackToZero) {
  std::vector<AutoscaleObservation> s;
  record(s, 0, 100, 10, 0, 0);        // scaled to zero, idle
  record(s, 100, 130, 5, 0, 1, 1);    // a request waits from t = 100: no replica yet
  record(s, 130, 200, 5, 1, 1);       // the replica is ready and serves it
  record(s, 200, 500, 5, 1, 0);       // idle again
  const std::vector<int64_t> d = desired_after(config(0, 4), s);
  for (size_t i = 0; i < d.size(); ++i) {
    const double t = s[i].now_s;
    // Held at 1 while it waited and for down_after from the wake-up (t = 100).
    EXPECT_EQ(d[i], t < 100 ? 0 : t < 400 ? 1 : 0) << "t = " << t;
  }
  // Nothing but the waiting requests wakes it: without them it stays at zero.
  std::vector<AutoscaleObservation> idle;
  record(idle, 0, 300, 10, 0, 0);
  for (const int64_t n : desired_after(config(0, 4), idle)) EXPECT_EQ(n, 0);
}

TEST(Autoscaler, SecondsMetricsScaleByTheRatioAndStayInsideTheBounds) {
  AutoscaleConfig c = config(1, 6, 0.5);
  c.metric = AutoscaleMetric::kTtftP95;
  std::vector<AutoscaleObservation> s;
  record(s, 0, 40, 5, 1, 1.2);  // 1.2 s against 0.5 s on one replica: ceil(2.4) = 3
  record(s, 40, 80, 5, 3, 1);   // still above on three: ceil(6) = 6, 30 s after the first raise
  record(s, 80, 120, 5, 6, 2);  // far above, at max
  const std::vector<int64_t> d = desired_after(c, s);
  for (size_t i = 0; i < d.size(); ++i) {
    const double t = s[i].now_s;
    EXPECT_EQ(d[i], t < 30 ? 1 : t < 60 ? 3 : 6) << "t = " << t;
  }
  PoolAutoscaler scaler(c);
  EXPECT_EQ(scaler.observe({0, 9, 0, 0}).desired, 6);  // more ready than max: max
}

TEST(Autoscaler, TheReasonSaysWhy) {
  PoolAutoscaler scaler(config(0, 4));
  EXPECT_NE(scaler.observe({0, 0, 0, 0}).reason.find("first observation"), std::string::npos);
  EXPECT_NE(scaler.observe({5, 0, 0, 2}).reason.find("2 request(s) wait with no replica ready"), std::string::npos);
  EXPECT_NE(scaler.observe({10, 1, 20, 0}).reason.find("above 1.1 x target"), std::string::npos);
  EXPECT_NE(scaler.observe({15, 1, 7, 0}).reason.find("within"), std::string::npos);
}

TEST(Autoscaler, ParsesTheFlagAndNamesWhatIsWrong) {
  const AutoscaleConfig c =
      parse_autoscale("pool=eu-a metric=queue_time target=0.5 min=0 max=12 up_after=45s down_after=10m", "--autoscale");
  EXPECT_EQ(c.pool, "eu-a");
  EXPECT_EQ(c.metric, AutoscaleMetric::kQueueTime);
  EXPECT_DOUBLE_EQ(c.target, 0.5);
  EXPECT_EQ(c.min_replicas, 0);
  EXPECT_EQ(c.max_replicas, 12);
  EXPECT_DOUBLE_EQ(c.up_after_s, 45);
  EXPECT_DOUBLE_EQ(c.down_after_s, 600);
  const AutoscaleConfig defaults = parse_autoscale("", "--autoscale");
  EXPECT_EQ(defaults.pool, "");
  EXPECT_EQ(defaults.metric, AutoscaleMetric::kConcurrency);
  EXPECT_DOUBLE_EQ(defaults.target, 8);
  EXPECT_EQ(defaults.min_replicas, 1);
  EXPECT_EQ(defaults.max_replicas, 8);
  const auto error_of = [](const std::string& text) {
    try {
      parse_autoscale(text, "--autoscale");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("size=3").find("unknown key 'size'"), std::string::npos);
  EXPECT_NE(error_of("target").find("'target' is not key=value"), std::string::npos);
  EXPECT_NE(error_of("metric=latency").find("metric 'latency'"), std::string::npos);
  EXPECT_NE(error_of("target=0").find("target '0' must be a number above 0"), std::string::npos);
  EXPECT_NE(error_of("target=nan").find("target 'nan'"), std::string::npos);
  EXPECT_NE(error_of("min=1.5").find("min '1.5' must be a whole number"), std::string::npos);
  EXPECT_NE(error_of("max=0").find("max must be at least 1"), std::string::npos);
  EXPECT_NE(error_of("min=5 max=3").find("min (5) is above max (3)"), std::string::npos);
  EXPECT_NE(error_of("up_after=-1s").find("up_after '-1s' must be seconds"), std::string::npos);
  EXPECT_NE(error_of("down_after=2d").find("down_after '2d'"), std::string::npos);
  EXPECT_NE(error_of("pool=a/b").find("pool 'a/b' is not a pool name"), std::string::npos);
  EXPECT_NE(error_of("min=1 min=2").find("min is given twice"), std::string::npos);
  EXPECT_NE(error_of("metric=ttft_p95").find("metric ttft_p95 needs a target"), std::string::npos);
  EXPECT_NE(error_of("target=0x10").find("target '0x10'"), std::string::npos);
}

}  // namespace
}  // namespace basalt::router
