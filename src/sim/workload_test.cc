#include "sim/workload.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace basalt::sim {
namespace {

loadgen::Conversation conversation(const std::string& system, int64_t system_tokens, int64_t question, int64_t out) {
  loadgen::Conversation c;
  if (!system.empty()) c.leading.push_back({"system", system});
  c.leading_tokens = system_tokens;
  c.turns.push_back({"q", question, out});
  return c;
}

TEST(SimWorkload, KeepsThePoolsOrderAndGroupsSharedPrefixes) {
  const std::vector<loadgen::Conversation> pool = {conversation("A", 100, 10, 5), conversation("B", 100, 20, 6),
                                                   conversation("A", 100, 30, 7), conversation("", 0, 40, 8)};
  const std::vector<SimRequest> r = requests_from(pool, {0.5, 1, 1.5, 2}, 1);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].prompt_tokens, 110);
  EXPECT_EQ(r[0].output_tokens, 5);
  EXPECT_EQ(r[0].prefix_tokens, 100);
  EXPECT_EQ(r[0].prefix_group, r[2].prefix_group);
  EXPECT_NE(r[0].prefix_group, r[1].prefix_group);
  EXPECT_EQ(r[3].prefix_group, -1);
  EXPECT_EQ(r[3].prefix_tokens, 0);
  EXPECT_EQ(r[3].prompt_tokens, 40);
  EXPECT_DOUBLE_EQ(r[3].arrival_s, 2);
}

TEST(SimWorkload, ALongerTraceDrawsFromThePool) {
  const std::vector<loadgen::Conversation> pool = {conversation("", 0, 10, 1), conversation("", 0, 20, 1)};
  const std::vector<double> arrivals(2000, 1.0);
  const std::vector<SimRequest> r = requests_from(pool, arrivals, 3);
  int64_t tens = 0, in_order = 0;
  for (size_t k = 0; k < r.size(); ++k) {
    tens += r[k].prompt_tokens == 10 ? 1 : 0;
    in_order += r[k].prompt_tokens == (k % 2 == 0 ? 10 : 20) ? 1 : 0;
  }
  EXPECT_NEAR(tens, 1000, 100);
  EXPECT_NEAR(in_order, 1000, 100);  // not the pool's order over and over
  EXPECT_EQ(requests_from(pool, arrivals, 3)[7].prompt_tokens, r[7].prompt_tokens);
}

TEST(SimWorkload, RefusesMultiTurnAndAnEmptyPool) {
  loadgen::Conversation c = conversation("", 0, 4, 4);
  c.turns.push_back(c.turns[0]);
  EXPECT_THROW(requests_from({c}, {0}, 0), Error);
  EXPECT_THROW(requests_from({}, {0}, 0), Error);
  EXPECT_TRUE(requests_from({}, {}, 0).empty());
}

TEST(SimWorkload, ArrivalsForADuration) {
  loadgen::LoadShape shape{50, 9};
  const std::vector<double> t = trace_arrivals(shape, 0, 100);
  EXPECT_NEAR(static_cast<double>(t.size()), 5000, 300);
  EXPECT_LT(t.back(), 100);
  // The same process as bench's: a prefix of its arrival_times.
  const std::vector<double> same = loadgen::arrival_times(static_cast<int64_t>(t.size()), shape);
  EXPECT_EQ(t, same);
  EXPECT_EQ(trace_arrivals(shape, 7, 0).size(), 7u);
  EXPECT_THROW(trace_arrivals(loadgen::LoadShape{0, 1}, 0, 10), Error);
}

}  // namespace
}  // namespace basalt::sim
