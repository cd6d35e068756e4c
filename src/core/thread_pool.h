// ThreadPool: fork-join parallelism over index ranges for CPU kernels.
//
// Contract: parallel_for(n, fn) splits [0, n) into at most size() contiguous
// chunks, runs fn(begin, end) on each (one on the calling thread), and returns
// when all are done. Exceptions thrown by fn are rethrown on the caller. A
// parallel_for issued from inside a running fn, or from a second thread while
// one is in flight, runs serially on the caller (no deadlock, no oversubscription).
// Workers spin briefly before sleeping, because decode issues hundreds of small
// parallel regions per token and a futex wake-up per region would dominate.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace basalt {

class ThreadPool {
 public:
  // threads <= 0 means one per hardware thread (BASALT_NUM_THREADS overrides).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // min_chunk: the smallest range worth handing to a thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t min_chunk = 1);

  // The process-wide pool used by the CPU backend.
  static ThreadPool& global();
  // Sizes the global pool before its first use (the --threads flag); false
  // when it already exists with another size.
  static bool set_global_threads(int threads);

 private:
  void worker_loop();
  // Claims and runs chunks of job `tag` until none is left.
  void run_chunks(uint32_t tag, const std::function<void(int64_t, int64_t)>& fn, int64_t n,
                  int chunks);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  // (job tag << 32) | index of the next unclaimed chunk. The tag ties a claim
  // to its job, so a worker that wakes late never runs a chunk of a newer job
  // with an older job's function.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_chunks_{0};
  std::atomic<bool> busy_{false};
  bool stop_ = false;
  // The job in flight.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::exception_ptr job_error_;
  std::mutex error_mutex_;
};

}  // namespace basalt
