#include "loadgen/stats.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace basalt::loadgen {
namespace {

TEST(Percentile, InterpolatesBetweenRanksLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);   // rank 1.5
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);   // rank 2.7
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);  // rank 2.97
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(Percentile, RejectsOutOfRange) {
  EXPECT_THROW(percentile({1, 2}, -1), Error);
  EXPECT_THROW(percentile({1, 2}, 100.5), Error);
}

TEST(Summarize, HandComputedValues) {
  // Unsorted on purpose; sorted: 10 20 30 40 50.
  const Summary s = summarize({50, 10, 40, 20, 30});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 30);
  EXPECT_DOUBLE_EQ(s.min, 10);
  EXPECT_DOUBLE_EQ(s.median, 30);
  EXPECT_DOUBLE_EQ(s.p90, 46);    // rank 3.6
  EXPECT_DOUBLE_EQ(s.p95, 48);    // rank 3.8
  EXPECT_DOUBLE_EQ(s.p99, 49.6);  // rank 3.96
  EXPECT_DOUBLE_EQ(s.max, 50);
  const Summary e = summarize({});
  EXPECT_EQ(e.count, 0);
  EXPECT_EQ(e.p99, 0);
}

TEST(Summarize, OrderedPercentiles) {
  std::vector<double> v;
  for (int i = 0; i < 1000; ++i) v.push_back((i * 7919) % 1000 * 0.37);
  const Summary s = summarize(v);
  EXPECT_LE(s.min, s.median);
  EXPECT_LE(s.median, s.p90);
  EXPECT_LE(s.p90, s.p95);
  EXPECT_LE(s.p95, s.p99);
  EXPECT_LE(s.p99, s.max);
}

TEST(Tpot, ExcludesTheFirstToken) {
  EXPECT_DOUBLE_EQ(time_per_output_token_ms(110, 10, 11), 10);  // 100 ms over 10 gaps
  EXPECT_DOUBLE_EQ(time_per_output_token_ms(50, 50, 1), 0);
  EXPECT_DOUBLE_EQ(time_per_output_token_ms(50, 50, 0), 0);
}

TEST(Goodput, CountsRequestsMeetingEverySetSlo) {
  const std::vector<RequestLatency> r = {{100, 10}, {300, 10}, {100, 30}, {300, 30}, {200, 20}};
  EXPECT_EQ(count_good(r, {}), 5);                  // no SLO: all good
  EXPECT_EQ(count_good(r, {200, 0}), 3);            // TTFT <= 200: 100, 100, 200
  EXPECT_EQ(count_good(r, {0, 20}), 3);             // TPOT <= 20: 10, 10, 20
  EXPECT_EQ(count_good(r, {200, 20}), 2);           // both: {100,10}, {200,20}
  EXPECT_EQ(count_good(r, {50, 5}), 0);
  EXPECT_TRUE(meets_slo({200, 20}, {200, 20}));     // limits are inclusive
}

}  // namespace
}  // namespace basalt::loadgen
