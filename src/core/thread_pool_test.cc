#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace basalt {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, NestedCallsRunSerially) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallel_for(6, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 60);
}

TEST(ThreadPool, RethrowsExceptions) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t b, int64_t) {
    if (b > 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  // Still usable afterwards.
  std::atomic<int64_t> count{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { count += e - b; });
  EXPECT_EQ(count.load(), 100);
}

TEST(ThreadPool, MinChunkLimitsSplitting) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  pool.parallel_for(10, [&](int64_t, int64_t) { calls++; }, 100);
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace basalt

namespace basalt {
namespace {

TEST(ThreadPool, ManySmallJobsOnAnOversubscribedPool) {
  // More threads than cores, so workers are often descheduled mid-job: every
  // job must still run each chunk exactly once, with its own function.
  ThreadPool pool(6);
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 1 + job % 13;
    std::atomic<int64_t> sum{0};
    pool.parallel_for(n, [&, job](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i + job;
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2 + n * job) << job;
  }
}

}  // namespace
}  // namespace basalt
