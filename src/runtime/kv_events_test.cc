// KV events of the radix cache: stored blocks carry the hash chain of
// runtime/kv_events.h computed from the sequence's tokens; an index kept
// from the events alone always equals the cache's snapshot, through random
// inserts, shared prefixes, namespaces and evictions, at page sizes 1, 4, 16.
#include "runtime/radix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

using Ids = std::vector<int32_t>;
using Index = std::set<std::pair<uint64_t, uint64_t>>;  // (namespace, block hash)

void apply_events(const std::vector<KvEvent>& events, Index& index) {
  for (const KvEvent& e : events)
    for (uint64_t h : e.block_hashes) {
      if (e.kind == KvEvent::Kind::kStored) EXPECT_TRUE(index.insert({e.ns, h}).second) << "stored twice";
      else EXPECT_EQ(index.erase({e.ns, h}), 1u) << "removed but never stored";
    }
}

Index index_of(const std::vector<KvEvent>& snapshot) {
  Index index;
  apply_events(snapshot, index);
  return index;
}

TEST(KvEvents, StoredBlocksCarryTheHashChainOfTheirTokens) {
  KvPool pool(256, 4);
  RadixCache cache(pool);
  cache.set_event_block_size(8);
  Ids tokens(21);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(100 + i);
  const auto slots = cache.allocate(static_cast<int64_t>(tokens.size()));
  ASSERT_TRUE(slots);
  cache.insert(5, tokens, std::span<const int32_t>(*slots).first(tokens.size()));
  std::vector<KvEvent> events = cache.take_events();
  // 21 tokens, whole pages: 20 cached, so two whole blocks of 8.
  ASSERT_EQ(events.size(), 1u);
  const KvEvent& e = events[0];
  EXPECT_EQ(e.kind, KvEvent::Kind::kStored);
  EXPECT_EQ(e.ns, 5u);
  EXPECT_EQ(e.parent_hash, 0u);
  const uint64_t h0 = kv_block_hash(0, 5, std::span<const int32_t>(tokens).first(8));
  const uint64_t h1 = kv_block_hash(h0, 5, std::span<const int32_t>(tokens).subspan(8, 8));
  EXPECT_EQ(e.block_hashes, (std::vector<uint64_t>{h0, h1}));
  EXPECT_EQ(e.token_ids, Ids(tokens.begin(), tokens.begin() + 16));
  EXPECT_TRUE(cache.take_events().empty());
  // Extending the sequence completes the third block only.
  Ids longer = tokens;
  for (int i = 0; i < 7; ++i) longer.push_back(7 + i);
  const auto more = cache.allocate(8);
  ASSERT_TRUE(more);
  Ids longer_slots(slots->begin(), slots->begin() + 20);
  longer_slots.insert(longer_slots.end(), more->begin(), more->end());
  cache.insert(5, longer, longer_slots);
  events = cache.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].parent_hash, h1);
  EXPECT_EQ(events[0].block_hashes,
            (std::vector<uint64_t>{kv_block_hash(h1, 5, std::span<const int32_t>(longer).subspan(16, 8))}));
  // The same tokens in another namespace are other blocks.
  EXPECT_NE(kv_block_hash(0, 6, std::span<const int32_t>(tokens).first(8)), h0);
  // Evicting everything removes every stored block.
  Index index;
  apply_events(cache.snapshot(), index);
  EXPECT_EQ(index.size(), 3u);
  cache.evict(pool.capacity());
  apply_events(cache.take_events(), index);
  EXPECT_TRUE(index.empty());
  EXPECT_TRUE(cache.snapshot().empty());
}

class KvEventsRandom : public ::testing::TestWithParam<int32_t> {};

TEST_P(KvEventsRandom, AnIndexBuiltFromEventsEqualsTheSnapshot) {
  const int32_t page = GetParam();
  const int32_t block = page >= 16 ? page : 16;
  std::mt19937 rng(17 + static_cast<uint32_t>(page));
  KvPool pool(512, page);
  RadixCache cache(pool);
  cache.set_event_block_size(block);
  Index index;
  std::vector<Ids> systems;
  for (int i = 0; i < 4; ++i) {
    Ids s(static_cast<size_t>(std::uniform_int_distribution<int>(10, 60)(rng)));
    for (auto& t : s) t = std::uniform_int_distribution<int32_t>(0, 50)(rng);
    systems.push_back(s);
  }
  for (int step = 0; step < 400; ++step) {
    Ids tokens = systems[rng() % systems.size()];
    const int extra = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < extra; ++i) tokens.push_back(std::uniform_int_distribution<int32_t>(0, 50)(rng));
    const uint64_t ns = rng() % 3;
    // A request: take its cached prefix, allocate the rest, insert, unlock.
    PrefixMatch match = cache.match_prefix(ns, tokens);
    cache.lock(match.last_node);
    const auto n = static_cast<int64_t>(tokens.size() - match.slots.size());
    Ids slots = match.slots;
    bool got = true;
    if (n > 0) {
      if (auto fresh = cache.allocate(n)) slots.insert(slots.end(), fresh->begin(), fresh->end());
      else got = false;
    }
    if (got) {
      InsertResult ins = cache.insert(ns, tokens, std::span<const int32_t>(slots).first(tokens.size()));
      std::vector<int32_t> give_back = ins.duplicates;
      give_back.insert(give_back.end(), slots.begin() + ins.cached_len, slots.end());
      if (!give_back.empty()) cache.release(give_back);
    }
    cache.unlock(match.last_node);
    if (rng() % 10 == 0) cache.evict(std::uniform_int_distribution<int64_t>(1, 200)(rng));
    apply_events(cache.take_events(), index);
    if (step % 50 == 0) {
      ASSERT_TRUE(index == index_of(cache.snapshot())) << "step " << step;
      cache.check_invariants();
    }
  }
  EXPECT_TRUE(index == index_of(cache.snapshot()));
  EXPECT_FALSE(index.empty());
  cache.evict(pool.capacity());
  apply_events(cache.take_events(), index);
  EXPECT_TRUE(index.empty());
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvEventsRandom, ::testing::Values(1, 4, 16));

TEST(KvEvents, BlockSizeMustBeWholePages) {
  KvPool pool(64, 4);
  RadixCache cache(pool);
  EXPECT_THROW(cache.set_event_block_size(6), Error);
  cache.set_event_block_size(0);  // off
  const auto slots = cache.allocate(8);
  cache.insert(0, Ids{1, 2, 3, 4, 5, 6, 7, 8}, *slots);
  EXPECT_TRUE(cache.take_events().empty());
  EXPECT_TRUE(cache.snapshot().empty());
}

}  // namespace
}  // namespace basalt
