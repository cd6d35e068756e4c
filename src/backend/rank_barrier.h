// RankBarrier: where the threads of one process's ranks wait for each other
// inside a collective (the in-process and node communicators).
//
// Contract: wait() returns once `count` threads have called it since the
// last time it returned; it may be used again at once (a generation count
// keeps a fast thread's next wait from passing the one still draining).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace basalt {

class RankBarrier {
 public:
  explicit RankBarrier(int count) : count_(count) {}

  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  const int count_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace basalt
