// Placement: allowed regions from a tenant and a header, EQT, the overflow
// hysteresis and the choice of an overflow pool.
#include "router/placement.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace basalt::router {
namespace {

TEST(Placement, NamesAreShortAndPlain) {
  EXPECT_TRUE(valid_placement_name("eu-west.1_a"));
  EXPECT_FALSE(valid_placement_name(""));
  EXPECT_FALSE(valid_placement_name("eu west"));
  EXPECT_FALSE(valid_placement_name("eu,us"));
  EXPECT_FALSE(valid_placement_name(std::string(65, 'a')));
  EXPECT_TRUE(valid_placement_name(std::string(64, 'a')));
}

TEST(Placement, TheHeaderOnlyNarrowsTheTenantsRegions) {
  const std::vector<std::string> tenant = {"eu", "ch"};
  // No header: the tenant's.
  AllowedRegions a = allowed_regions(tenant, std::nullopt);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.regions, tenant);
  // Narrowed, spaces and repeats tolerated.
  a = allowed_regions(tenant, " ch , ch");
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.regions, std::vector<std::string>{"ch"});
  // Outside the tenant's: 403 naming the region, nothing allowed.
  a = allowed_regions(tenant, "eu,us");
  EXPECT_EQ(a.status, 403);
  EXPECT_NE(a.message.find("us"), std::string::npos) << a.message;
  EXPECT_TRUE(a.regions.empty());
  // Malformed: 400.
  for (const char* bad : {"", ",", "eu,,ch", "e u", "eu;ch"}) {
    a = allowed_regions(tenant, bad);
    EXPECT_EQ(a.status, 400) << bad;
    EXPECT_NE(a.message.find("X-Basalt-Region"), std::string::npos);
  }
  std::string seventeen = "r0";
  for (int i = 1; i < 17; ++i) seventeen += ",r" + std::to_string(i);
  EXPECT_EQ(allowed_regions({}, seventeen).status, 400);
  // A tenant without regions: the header alone restricts.
  a = allowed_regions({}, "us");
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.regions, std::vector<std::string>{"us"});
  EXPECT_TRUE(allowed_regions({}, std::nullopt).regions.empty());
}

TEST(Placement, AnUnlabelledReplicaIsOutsideEveryRegion) {
  const std::vector<std::string> eu = {"eu"};
  EXPECT_TRUE(region_allowed(eu, "eu"));
  EXPECT_FALSE(region_allowed(eu, "us"));
  EXPECT_FALSE(region_allowed(eu, ""));
  EXPECT_TRUE(region_allowed({}, ""));  // no constraint
}

TEST(Placement, EstimatedQueueTimeIsTokensOverRate) {
  PoolLoad load;
  load.queued_tokens = 3000;
  load.pending_prefill_tokens = 1000;
  load.prefill_tokens_per_s = 2000;
  EXPECT_DOUBLE_EQ(estimated_queue_ms(load), 2000);
  load.queued_tokens = 0;
  load.pending_prefill_tokens = 0;
  EXPECT_DOUBLE_EQ(estimated_queue_ms(load), 0);
  load.prefill_tokens_per_s = 0;  // no replica to take anything
  EXPECT_TRUE(std::isinf(estimated_queue_ms(load)));
  load.prefill_tokens_per_s = std::nan("");
  EXPECT_TRUE(std::isinf(estimated_queue_ms(load)));
}

TEST(Placement, OverflowStartsAboveTheObjectiveAndStopsBelowFourFifths) {
  OverflowTracker t;
  EXPECT_FALSE(t.observe("a", "live", 1000, 1000));  // at the objective: not above
  EXPECT_TRUE(t.observe("a", "live", 1001, 1000));
  // Below the objective but not below 800: still overflowing.
  EXPECT_TRUE(t.observe("a", "live", 999, 1000));
  EXPECT_TRUE(t.observe("a", "live", 800, 1000));
  EXPECT_FALSE(t.observe("a", "live", 799, 1000));
  // And between the two it stays off.
  EXPECT_FALSE(t.observe("a", "live", 900, 1000));
  // Per pool and class.
  EXPECT_TRUE(t.observe("a", "live", 1500, 1000));
  EXPECT_FALSE(t.observe("a", "batch", 1500, 2000));
  EXPECT_FALSE(t.observe("b", "live", 10, 1000));
  const auto states = t.states();
  EXPECT_TRUE(states.at({"a", "live"}));
  EXPECT_FALSE(states.at({"a", "batch"}));
  EXPECT_FALSE(states.at({"b", "live"}));
}

TEST(Placement, OverflowGoesToTheLeastQueuedPoolBelowTheObjective) {
  std::vector<OverflowOption> o = {{"b", 600, true}, {"c", 300, true}, {"d", 100, false}};
  // d is lowest but unreachable (region, model or health): c.
  EXPECT_EQ(choose_overflow_pool(o, 1000), std::optional<size_t>(1));
  // Ties go to the first listed.
  o[0].eqt_ms = 300;
  EXPECT_EQ(choose_overflow_pool(o, 1000), std::optional<size_t>(0));
  // None below the objective: none (the request stays home).
  EXPECT_EQ(choose_overflow_pool(o, 300), std::nullopt);
  EXPECT_EQ(choose_overflow_pool({}, 1000), std::nullopt);
}

TEST(Placement, QueuedTokensPerPool) {
  QueuedTokens q;
  q.add("a", 100);
  q.add("a", 50);
  q.add("", 7);
  EXPECT_EQ(q.of("a"), 150);
  EXPECT_EQ(q.of(""), 7);
  q.remove("a", 100);
  EXPECT_EQ(q.of("a"), 50);
  q.remove("a", 500);  // never below 0
  EXPECT_EQ(q.of("a"), 0);
  EXPECT_EQ(q.of("z"), 0);
}

}  // namespace
}  // namespace basalt::router
