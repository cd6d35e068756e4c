#include "runtime/kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"

namespace basalt {
namespace {

TEST(KvPoolTest, AllocatesAllOrNothing) {
  KvPool pool(8);
  EXPECT_EQ(pool.capacity(), 8);
  EXPECT_EQ(pool.free_slots(), 8);
  auto a = pool.allocate(5);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.free_slots(), 3);
  EXPECT_FALSE(pool.allocate(4).has_value());
  EXPECT_EQ(pool.free_slots(), 3);
  auto b = pool.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(pool.free_slots(), 0);
  pool.free(*a);
  pool.free(*b);
  EXPECT_EQ(pool.free_slots(), 8);
  pool.check_invariants();
  EXPECT_THROW(pool.allocate(0), Error);
}

TEST(KvPoolTest, DoubleFreeAndForeignSlotsThrowAndChangeNothing) {
  KvPool pool(4);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  pool.free(std::vector<int32_t>{(*a)[0]});
  EXPECT_THROW(pool.free(std::vector<int32_t>{(*a)[0]}), Error);
  // A span with a bad slot at the end frees none of the good ones before it.
  EXPECT_THROW(pool.free(std::vector<int32_t>{(*a)[1], 7}), Error);
  EXPECT_THROW(pool.free(std::vector<int32_t>{(*a)[1], -1}), Error);
  EXPECT_THROW(pool.free(std::vector<int32_t>{(*a)[1], (*a)[1]}), Error);
  EXPECT_TRUE(pool.is_allocated((*a)[1]));
  EXPECT_EQ(pool.free_slots(), 2);
  pool.check_invariants();
  pool.free(std::vector<int32_t>{(*a)[1], (*a)[2]});
  EXPECT_EQ(pool.free_slots(), 4);
  EXPECT_THROW(pool.free(std::vector<int32_t>{3}), Error);  // never allocated
  pool.check_invariants();
}

TEST(KvPoolTest, PageAlignmentOfASlotList) {
  KvPool pool(16, 4);
  using V = std::vector<int32_t>;
  EXPECT_TRUE(pool.is_page_aligned(V{}));
  EXPECT_TRUE(pool.is_page_aligned(V{8, 9, 10, 11, 0, 1}));  // pages 2, 0 (partial)
  EXPECT_FALSE(pool.is_page_aligned(V{9, 10}));               // position 0 at offset 1
  EXPECT_FALSE(pool.is_page_aligned(V{8, 9, 11}));            // a gap inside a page
  EXPECT_FALSE(pool.is_page_aligned(V{8, 9, 10, 11, 12, 1}));  // position 5 in another page
  auto a = pool.allocate(9);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(pool.is_page_aligned(*a));
  KvPool single(4);
  EXPECT_TRUE(single.is_page_aligned(V{3, 0, 2}));
}

TEST(KvPoolTest, PagesHandOutWholePagesAndComeBackWhenEmpty) {
  KvPool pool(12, 4);
  EXPECT_EQ(pool.free_pages(), 3);
  EXPECT_EQ(pool.rounded(5), 8);
  auto a = pool.allocate(5);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->size(), 8u);
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i] % 4, static_cast<int32_t>(i % 4));  // slot = page * 4 + offset
    EXPECT_EQ((*a)[i] / 4, (*a)[i - i % 4] / 4);
  }
  EXPECT_EQ(pool.free_pages(), 1);
  EXPECT_FALSE(pool.allocate(5).has_value());
  // Free three slots of the first page: the page stays in use.
  pool.free(std::span<const int32_t>(a->data(), 3));
  EXPECT_EQ(pool.free_slots(), 7);
  EXPECT_EQ(pool.free_pages(), 1);
  pool.check_invariants();
  pool.free(std::span<const int32_t>(a->data() + 3, 1));
  EXPECT_EQ(pool.free_pages(), 2);
  pool.free(std::span<const int32_t>(a->data() + 4, 4));
  EXPECT_EQ(pool.free_pages(), 3);
  EXPECT_EQ(pool.free_slots(), 12);
  pool.check_invariants();
  EXPECT_THROW(KvPool(10, 4), Error);
  EXPECT_THROW(KvPool(0), Error);
  EXPECT_THROW(KvPool(8, 0), Error);
}

TEST(KvPoolTest, SlotsForBudget) {
  EXPECT_EQ(KvPool::slots_for_budget(100, 1050), 10);
  EXPECT_EQ(KvPool::slots_for_budget(100, 1050, 4), 8);
  EXPECT_EQ(KvPool::slots_for_budget(100, 99), 0);
  EXPECT_EQ(KvPool::slots_for_budget(1, size_t{1} << 40), int64_t{1} << 31);
  EXPECT_THROW(KvPool::slots_for_budget(0, 100), Error);
  EXPECT_GT(KvPool::host_memory_bytes(), 0u);
  EXPECT_LE(KvPool::host_memory_budget(0.5), KvPool::host_memory_bytes() / 2 + 1);
  EXPECT_THROW(KvPool::host_memory_budget(0.0), Error);
  EXPECT_THROW(KvPool::host_memory_budget(1.5), Error);
}

TEST(KvPoolTest, RandomAllocateFreeKeepsTheBooks) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const int32_t page = static_cast<int32_t>(1 + rng() % 4);
    KvPool pool(page * 32, page);
    std::vector<std::vector<int32_t>> held;
    std::set<int32_t> owned;
    for (int step = 0; step < 500; ++step) {
      if (held.empty() || rng() % 2 == 0) {
        auto got = pool.allocate(static_cast<int64_t>(1 + rng() % 20));
        if (!got) continue;
        for (const int32_t s : *got) ASSERT_TRUE(owned.insert(s).second);
        held.push_back(std::move(*got));
      } else {
        const size_t i = rng() % held.size();
        std::vector<int32_t> slots = std::move(held[i]);
        held.erase(held.begin() + static_cast<ptrdiff_t>(i));
        std::shuffle(slots.begin(), slots.end(), rng);
        pool.free(slots);
        for (const int32_t s : slots) owned.erase(s);
      }
      ASSERT_EQ(pool.free_slots(), pool.capacity() - static_cast<int64_t>(owned.size()));
      pool.check_invariants();
    }
    for (const auto& slots : held) pool.free(slots);
    EXPECT_EQ(pool.free_slots(), pool.capacity());
    EXPECT_EQ(pool.free_pages(), 32);
  }
}

}  // namespace
}  // namespace basalt
