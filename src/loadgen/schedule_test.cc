#include "loadgen/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace basalt::loadgen {
namespace {

TEST(Schedule, UnlimitedRateSendsAllAtOnce) {
  for (double rate : {0.0, static_cast<double>(INFINITY)}) {
    const std::vector<double> t = arrival_times(5, {rate, 1});
    ASSERT_EQ(t.size(), 5u);
    for (double x : t) EXPECT_EQ(x, 0);
  }
}

TEST(Schedule, PoissonGapsHaveTheRightMeanAndSpread) {
  const int n = 20000;
  const double rate = 10;
  const std::vector<double> t = arrival_times(n, {rate, 42});
  ASSERT_EQ(t.size(), static_cast<size_t>(n));
  double sum = 0, sum2 = 0, prev = 0;
  int under_mean = 0;
  for (double x : t) {
    const double gap = x - prev;
    ASSERT_GE(gap, 0);
    sum += gap;
    sum2 += gap * gap;
    under_mean += gap < 1 / rate ? 1 : 0;
    prev = x;
  }
  const double mean = sum / n;
  const double sd = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.1, 0.1 * 0.03);  // exponential: mean 1/rate
  EXPECT_NEAR(sd / mean, 1.0, 0.05);   // and coefficient of variation 1
  // P(gap < mean) = 1 - 1/e for an exponential.
  EXPECT_NEAR(static_cast<double>(under_mean) / n, 1 - std::exp(-1.0), 0.015);
}

TEST(Schedule, SeedReproduces) {
  EXPECT_EQ(arrival_times(100, {5, 7}), arrival_times(100, {5, 7}));
  EXPECT_NE(arrival_times(100, {5, 7}), arrival_times(100, {5, 8}));
  const std::vector<double> t = arrival_times(3, {5, 7});
  EXPECT_GT(t[0], 0);
  EXPECT_LT(t[0], t[1]);
}

TEST(Schedule, BurstMultipliesTheRateForItsPeriod) {
  LoadShape s{10, 3, 5, 100, 100};  // 10/s, 50/s during [100, 200)
  const std::vector<double> t = arrival_times(9000, s);
  int before = 0, during = 0;
  for (double x : t) {
    if (x < 100) ++before;
    else if (x < 200) ++during;
  }
  EXPECT_NEAR(before, 1000, 100);  // ~3 sigma
  EXPECT_NEAR(during, 5000, 220);
  EXPECT_DOUBLE_EQ(s.rate_at(50), 10);
  EXPECT_DOUBLE_EQ(s.rate_at(150), 50);
  EXPECT_DOUBLE_EQ(s.rate_at(200), 10);
}

TEST(Schedule, DiurnalRateFollowsTheSine) {
  LoadShape s{100, 5};
  s.diurnal_amplitude = 0.8;
  s.diurnal_period_s = 400;  // peak 180/s around t = 100, trough 20/s around t = 300
  EXPECT_DOUBLE_EQ(s.rate_at(100), 180);
  EXPECT_NEAR(s.rate_at(300), 20, 1e-9);
  const std::vector<double> t = arrival_times(40000, s);  // 100/s on average: ~400 s
  int peak = 0, trough = 0;
  for (double x : t) {
    if (x >= 50 && x < 150) ++peak;
    else if (x >= 250 && x < 350) ++trough;
  }
  // The integral of 100 (1 + 0.8 sin(2 pi t / 400)) over [50, 150) and [250, 350).
  const double swing = 0.8 * 100 * 400 / std::numbers::pi * std::sqrt(0.5);
  EXPECT_NEAR(peak, 10000 + swing, 400);  // ~3 sigma
  EXPECT_NEAR(trough, 10000 - swing, 250);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_EQ(t, arrival_times(40000, s));
}

TEST(Schedule, RejectsBadShapes) {
  EXPECT_THROW(arrival_times(1, {-1, 0}), Error);
  EXPECT_THROW(arrival_times(1, {NAN, 0}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 0, 0, 1}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 2, -1, 1}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 2, 0, -1}), Error);
  EXPECT_THROW(arrival_times(-1, {1, 0}), Error);
  LoadShape diurnal{1, 0};
  diurnal.diurnal_amplitude = 1.5;
  EXPECT_THROW(arrival_times(1, diurnal), Error);
  diurnal.diurnal_amplitude = 0.5;
  diurnal.diurnal_period_s = 0;
  EXPECT_THROW(arrival_times(1, diurnal), Error);
}

}  // namespace
}  // namespace basalt::loadgen
