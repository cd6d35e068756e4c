// Routing policies on synthetic candidates, and the prefix index behind
// cache-aware routing.
#include "router/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "router/prefix_index.h"

namespace basalt::router {
namespace {

// The candidates' ids are views of `ids`, which must outlive them.
std::vector<Candidate> with_loads(const std::vector<std::string>& ids, std::vector<int64_t> loads) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < ids.size(); ++i) c.push_back({ids[i], loads[i]});
  return c;
}

std::vector<size_t> order(Policy p, const std::vector<Candidate>& c, uint64_t turn, uint64_t random,
                          std::string_view session) {
  PickInput in;
  in.turn = turn;
  in.random = random;
  in.session = session;
  return preference(p, c, in);
}

const std::vector<std::string> kIds = {"http://a:1", "http://b:1", "http://c:1", "http://d:1"};

TEST(Policy, RoundRobinRotatesAndLeastLoadTakesTheEmptiest) {
  const auto c = with_loads(kIds, {3, 0, 2, 0});
  EXPECT_EQ(order(Policy::kRoundRobin, c, 5, 0, ""), (std::vector<size_t>{1, 2, 3, 0}));
  // Least load: 1 and 3 tie at 0, rotated by the turn.
  EXPECT_EQ(order(Policy::kLeastLoad, c, 0, 0, ""), (std::vector<size_t>{1, 3, 2, 0}));
  EXPECT_EQ(order(Policy::kLeastLoad, c, 2, 0, ""), (std::vector<size_t>{3, 1, 2, 0}));
}

TEST(Policy, PowerOfTwoPutsTheLessLoadedOfTwoDrawsFirst) {
  const auto c = with_loads(kIds, {5, 1, 9, 0});
  std::map<size_t, int> firsts;
  for (uint64_t r = 0; r < 400; ++r) {
    const std::vector<size_t> pref = order(Policy::kPowerOfTwo, c, 0, r * 2654435761u, "");
    ASSERT_EQ(pref.size(), 4u);
    ASSERT_LE(c[pref[0]].load, c[pref[1]].load);
    ++firsts[pref[0]];
  }
  // The most loaded (c, 9) never comes first; the least (d, 0) most often.
  EXPECT_EQ(firsts.count(2), 0u);
  EXPECT_GT(firsts[3], firsts[1]);
  EXPECT_GT(firsts[1], firsts[0]);
  EXPECT_EQ(order(Policy::kPowerOfTwo, with_loads({"x"}, {4}), 0, 7, ""), (std::vector<size_t>{0}));
}

TEST(Policy, SessionsStayPutAndARemovedReplicaMovesOnlyItsOwn) {
  const auto all = with_loads(kIds, {0, 0, 0, 0});
  std::map<std::string, std::string> home;
  std::map<std::string, int> per_replica;
  for (int s = 0; s < 200; ++s) {
    const std::string key = "session-" + std::to_string(s);
    const std::string id(all[order(Policy::kSession, all, s, s, key)[0]].id);
    // The same key, any turn or draw: the same replica.
    EXPECT_EQ(std::string(all[order(Policy::kSession, all, 99, 7, key)[0]].id), id);
    home[key] = id;
    ++per_replica[id];
  }
  for (const auto& id : kIds) EXPECT_GT(per_replica[id], 25) << id;  // spread, about 50 each
  // Without replica b, b's sessions move and nobody else's does.
  const std::vector<std::string> three_ids = {kIds[0], kIds[2], kIds[3]};  // the candidates' ids point here
  const auto three = with_loads(three_ids, {0, 0, 0});
  for (const auto& [key, id] : home) {
    const std::string now(three[order(Policy::kSession, three, 0, 0, key)[0]].id);
    if (id != kIds[1]) {
      EXPECT_EQ(now, id) << key;
    }
  }
  // No key: round-robin.
  EXPECT_EQ(order(Policy::kSession, all, 1, 0, ""), (std::vector<size_t>{1, 2, 3, 0}));
}

TEST(Policy, CacheAwareTakesTheLongestMatchUnlessItIsTooShortOrTheReplicaTooBusy) {
  std::vector<Candidate> c = with_loads(kIds, {4, 0, 2, 1});
  c[0].cached = 0.8;
  c[2].cached = 0.8;
  c[3].cached = 0.2;
  PickInput in;
  // a and c hold 8 of 10 blocks: c first, being less loaded; then a; then d, holding 2.
  EXPECT_EQ(preference(Policy::kCacheAware, c, in), (std::vector<size_t>{2, 0, 3, 1}));
  // Below the threshold (3 of 10 needed) the match is not trusted: by load.
  for (auto& x : c) x.cached = std::min(x.cached, 0.2);
  EXPECT_EQ(preference(Policy::kCacheAware, c, in), (std::vector<size_t>{1, 3, 2, 0}));
  // A replica both 32 requests above the least loaded and 1.5 times it goes last, match or not.
  c = with_loads(kIds, {40, 5, 6, 50});
  c[0].cached = 1;
  c[3].cached = 1;
  EXPECT_EQ(preference(Policy::kCacheAware, c, in), (std::vector<size_t>{1, 2, 0, 3}));
  c = with_loads(kIds, {36, 5, 6, 50});  // 31 above: not overloaded
  c[0].cached = 1;
  EXPECT_EQ(preference(Policy::kCacheAware, c, in)[0], 0u);
}

TEST(Policy, NamesParseAndAWrongOneSaysWhichFlag) {
  EXPECT_EQ(parse_policy("least-load"), Policy::kLeastLoad);
  EXPECT_EQ(parse_policy("cache-aware"), Policy::kCacheAware);
  EXPECT_STREQ(policy_name(parse_policy("power-of-two")), "power-of-two");
  try {
    parse_policy("fastest");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--policy fastest"), std::string::npos) << e.what();
  }
}

TEST(PrefixIndex, MatchesLeadingBlocksPerReplicaWithinItsTime) {
  PrefixIndex index({.block_bytes = 4, .max_blocks = 8, .max_entries_per_replica = 6, .ttl = std::chrono::seconds(60)});
  const auto t = PrefixIndex::Clock::now();
  const std::vector<uint64_t> abc = index.blocks("m", "aaaabbbbccccdd");  // the partial "dd" is no block
  ASSERT_EQ(abc.size(), 3u);
  EXPECT_EQ(index.blocks("m", "aaaabbbbcccc"), abc);
  // A block names its whole prefix: "bbbb" after another first block is another block.
  EXPECT_NE(index.blocks("m", "xxxxbbbb")[1], abc[1]);
  // The scope (model, cache namespace) is part of every block.
  EXPECT_NE(index.blocks("other", "aaaabbbbcccc")[0], abc[0]);
  index.insert("r1", std::span(abc).first(2), t);
  index.insert("r2", abc, t);
  const std::vector<std::string_view> ids = {"r1", "r2", "r3"};
  EXPECT_EQ(index.match(ids, abc, t), (std::vector<size_t>{2, 3, 0}));
  const std::vector<uint64_t> axx = index.blocks("m", "aaaaxxxx");
  EXPECT_EQ(index.match(ids, axx, t), (std::vector<size_t>{1, 1, 0}));
  // Past the time to live nothing matches.
  EXPECT_EQ(index.match(ids, abc, t + std::chrono::seconds(61)), (std::vector<size_t>{0, 0, 0}));
  // Past 6 entries the least recently sent go, a prompt's first block last.
  index.insert("r1", index.blocks("m", "qqqqrrrrsssstttt"), t);
  EXPECT_EQ(index.entries("r1"), 6u);
  EXPECT_EQ(index.match(ids, abc, t)[0], 2u);  // r1's first two blocks were sent before, and stay
  index.insert("r1", index.blocks("m", "1111222233334444"), t);
  EXPECT_EQ(index.entries("r1"), 6u);
  EXPECT_EQ(index.match(ids, abc, t)[0], 0u);
}

}  // namespace
}  // namespace basalt::router
