// Routing policies on synthetic candidates.
#include "router/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace basalt::router {
namespace {

std::vector<Candidate> with_loads(const std::vector<std::string>& ids, std::vector<int64_t> loads) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < ids.size(); ++i) c.push_back({ids[i], loads[i]});
  return c;
}

const std::vector<std::string> kIds = {"http://a:1", "http://b:1", "http://c:1", "http://d:1"};

TEST(Policy, RoundRobinRotatesAndLeastLoadTakesTheEmptiest) {
  const auto c = with_loads(kIds, {3, 0, 2, 0});
  EXPECT_EQ(preference(Policy::kRoundRobin, c, 5, 0, ""), (std::vector<size_t>{1, 2, 3, 0}));
  // Least load: 1 and 3 tie at 0, rotated by the turn.
  EXPECT_EQ(preference(Policy::kLeastLoad, c, 0, 0, ""), (std::vector<size_t>{1, 3, 2, 0}));
  EXPECT_EQ(preference(Policy::kLeastLoad, c, 2, 0, ""), (std::vector<size_t>{3, 1, 2, 0}));
}

TEST(Policy, PowerOfTwoPutsTheLessLoadedOfTwoDrawsFirst) {
  const auto c = with_loads(kIds, {5, 1, 9, 0});
  std::map<size_t, int> firsts;
  for (uint64_t r = 0; r < 400; ++r) {
    const std::vector<size_t> order = preference(Policy::kPowerOfTwo, c, 0, r * 2654435761u, "");
    ASSERT_EQ(order.size(), 4u);
    ASSERT_LE(c[order[0]].load, c[order[1]].load);
    ++firsts[order[0]];
  }
  // The most loaded (c, 9) never comes first; the least (d, 0) most often.
  EXPECT_EQ(firsts.count(2), 0u);
  EXPECT_GT(firsts[3], firsts[1]);
  EXPECT_GT(firsts[1], firsts[0]);
  EXPECT_EQ(preference(Policy::kPowerOfTwo, with_loads({"x"}, {4}), 0, 7, ""), (std::vector<size_t>{0}));
}

TEST(Policy, SessionsStayPutAndARemovedReplicaMovesOnlyItsOwn) {
  const auto all = with_loads(kIds, {0, 0, 0, 0});
  std::map<std::string, std::string> home;
  std::map<std::string, int> per_replica;
  for (int s = 0; s < 200; ++s) {
    const std::string key = "session-" + std::to_string(s);
    const std::string id(all[preference(Policy::kSession, all, s, s, key)[0]].id);
    // The same key, any turn or draw: the same replica.
    EXPECT_EQ(std::string(all[preference(Policy::kSession, all, 99, 7, key)[0]].id), id);
    home[key] = id;
    ++per_replica[id];
  }
  for (const auto& id : kIds) EXPECT_GT(per_replica[id], 25) << id;  // spread, about 50 each
  // Without replica b, b's sessions move and nobody else's does.
  const auto three = with_loads({kIds[0], kIds[2], kIds[3]}, {0, 0, 0});
  for (const auto& [key, id] : home) {
    const std::string now(three[preference(Policy::kSession, three, 0, 0, key)[0]].id);
    if (id != kIds[1]) {
      EXPECT_EQ(now, id) << key;
    }
  }
  // No key: round-robin.
  EXPECT_EQ(preference(Policy::kSession, all, 1, 0, ""), (std::vector<size_t>{1, 2, 3, 0}));
}

TEST(Policy, NamesParseAndAWrongOneSaysWhichFlag) {
  EXPECT_EQ(parse_policy("least-load"), Policy::kLeastLoad);
  EXPECT_STREQ(policy_name(parse_policy("power-of-two")), "power-of-two");
  try {
    parse_policy("cache-aware");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--policy cache-aware"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace basalt::router
