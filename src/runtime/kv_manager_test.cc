// KvManager: the request-level KV calls keep each request's slots whole,
// page-aligned and covering its computed positions, share cached prefixes,
// roll back rejected positions, and leave the pool whole after release.
#include "runtime/kv_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t from = 10) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

int64_t held(const std::vector<const RequestKv*>& kvs) {
  int64_t n = 0;
  for (const RequestKv* kv : kvs) n += static_cast<int64_t>(kv->slots.size()) - kv->cached;
  return n;
}

class KvManagerPages : public ::testing::TestWithParam<int32_t> {};

TEST_P(KvManagerPages, AdmitCommitShareAndRelease) {
  const int32_t P = GetParam();
  KvManager kv(64 * P, P);
  const std::vector<int32_t> tokens = iota_tokens(10 * P + 3);

  // A first request computes its prompt in two chunks and caches the pages.
  RequestKv a;
  EXPECT_EQ(kv.take_cached_prefix(a, 0, std::span<const int32_t>(tokens).first(tokens.size() - 1)), 0);
  ASSERT_TRUE(kv.allocate(a, 4 * P + 1));
  kv.advance(a, 4 * P + 1);
  kv.check_request(a);
  kv.commit(a, 0, tokens);
  EXPECT_EQ(a.cached, kv.page_floor(4 * P + 1));
  ASSERT_TRUE(kv.allocate(a, static_cast<int64_t>(tokens.size()) - a.computed));
  kv.advance(a, static_cast<int64_t>(tokens.size()) - a.computed);
  kv.commit(a, 0, tokens);
  EXPECT_EQ(a.cached, kv.page_floor(static_cast<int64_t>(tokens.size())));
  kv.check_request(a);
  kv.check_invariants(held({&a}));

  // A second request with the same prompt shares every cached page.
  RequestKv b;
  const int64_t matched = kv.take_cached_prefix(b, 0, std::span<const int32_t>(tokens).first(tokens.size() - 1));
  EXPECT_EQ(matched, kv.page_floor(static_cast<int64_t>(tokens.size()) - 1));
  EXPECT_TRUE(std::equal(b.slots.begin(), b.slots.end(), a.slots.begin()));
  kv.check_invariants(held({&a, &b}));
  // Another namespace shares nothing.
  RequestKv c;
  EXPECT_EQ(kv.take_cached_prefix(c, 7, tokens), 0);

  kv.release(a, 0, tokens, a.computed, /*cache_it=*/true);
  kv.release(b, 0, tokens, b.computed, /*cache_it=*/false);
  kv.release(c, 7, tokens, 0, false);
  EXPECT_TRUE(a.slots.empty() && a.node == nullptr && a.computed == 0);
  kv.check_invariants(0);
  EXPECT_EQ(kv.clear_cache(), kv.capacity());
}

TEST_P(KvManagerPages, RollbackGivesBackWholePagesPastTheNewEnd) {
  const int32_t P = GetParam();
  KvManager kv(32 * P, P);
  const std::vector<int32_t> tokens = iota_tokens(3 * P + 2);
  RequestKv r;
  kv.take_cached_prefix(r, 0, tokens);
  ASSERT_TRUE(kv.allocate(r, static_cast<int64_t>(tokens.size())));
  kv.advance(r, static_cast<int64_t>(tokens.size()));
  kv.commit(r, 0, tokens);
  const int64_t free_before = kv.free_slots();
  // Four draft positions, then three rejected.
  ASSERT_TRUE(kv.allocate(r, 4));
  kv.advance(r, 4);
  kv.check_request(r);
  kv.rollback(r, 3);
  kv.check_request(r);
  EXPECT_EQ(r.computed, static_cast<int64_t>(tokens.size()) + 1);
  EXPECT_EQ(static_cast<int64_t>(r.slots.size()), kv.rounded(r.computed));
  kv.check_invariants(held({&r}));
  // The cached pages cannot be rolled back.
  EXPECT_THROW(kv.rollback(r, r.computed - r.cached + 1), Error);
  kv.rollback(r, r.computed - r.cached);
  EXPECT_EQ(r.computed, r.cached);
  kv.check_request(r);
  kv.release(r, 0, tokens, r.computed, false);
  EXPECT_GE(kv.free_slots(), free_before);
  kv.check_invariants(0);
}

TEST_P(KvManagerPages, AllocationFailsWholeAndEvictsUnlockedEntries) {
  const int32_t P = GetParam();
  KvManager kv(4 * P, P);
  const std::vector<int32_t> tokens = iota_tokens(3 * P);
  RequestKv a;
  kv.take_cached_prefix(a, 0, tokens);
  ASSERT_TRUE(kv.allocate(a, 3 * P));
  kv.advance(a, 3 * P);
  RequestKv b;
  kv.take_cached_prefix(b, 1, tokens);
  EXPECT_FALSE(kv.allocate(b, 2 * P));  // only one page left
  EXPECT_TRUE(b.slots.empty());
  kv.check_invariants(held({&a, &b}));
  kv.release(a, 0, tokens, a.computed, true);  // cached, unlocked: evictable
  EXPECT_EQ(kv.available(), kv.capacity());
  EXPECT_TRUE(kv.allocate(b, 4 * P));  // evicts a's pages
  kv.advance(b, 4 * P);
  kv.check_invariants(held({&b}));
  kv.release(b, 1, tokens, 0, false);
  kv.check_invariants(0);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvManagerPages, ::testing::Values(1, 4, 16));

}  // namespace
}  // namespace basalt
