// Dynamic work sharing over the ThreadPool.
//
// Contract: dynamic_for(pool, n, grain, fn) runs fn(begin, end) over [0, n)
// in chunks of `grain` items (the last may be shorter) that the pool's
// threads claim one at a time until none are left, and returns when all have
// run. Unlike a static split, a thread that is slow (descheduled on a shared
// machine, an efficiency core, a cold cache) simply claims fewer chunks
// instead of holding every other thread up. parallel = false runs everything
// on the caller, for work too small to be worth a wake-up. Exceptions from fn
// propagate as from ThreadPool::parallel_for.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/thread_pool.h"

namespace basalt::cpu {

template <typename Fn>
void dynamic_for(ThreadPool& pool, int64_t n, int64_t grain, Fn&& fn, bool parallel = true) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  std::atomic<int64_t> next{0};
  const int64_t workers = parallel ? std::min<int64_t>(pool.size(), chunks) : 1;
  pool.parallel_for(workers, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      fn(c * grain, std::min(n, (c + 1) * grain));
    }
  });
}

// A grain that gives each thread about `per_thread` chunks to balance with.
inline int64_t balanced_grain(const ThreadPool& pool, int64_t n, int64_t per_thread = 8) {
  return std::max<int64_t>(1, n / (static_cast<int64_t>(pool.size()) * per_thread));
}

}  // namespace basalt::cpu
