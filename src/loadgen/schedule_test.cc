#include "loadgen/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

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

TEST(Schedule, RejectsBadShapes) {
  EXPECT_THROW(arrival_times(1, {-1, 0}), Error);
  EXPECT_THROW(arrival_times(1, {NAN, 0}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 0, 0, 1}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 2, -1, 1}), Error);
  EXPECT_THROW(arrival_times(1, {1, 0, 2, 0, -1}), Error);
  EXPECT_THROW(arrival_times(-1, {1, 0}), Error);
}

}  // namespace
}  // namespace basalt::loadgen
