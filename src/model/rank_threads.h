// RankThreads: one thread per rank of a model split over ranks that run as
// threads of this process (model/tensor_parallel.h, model/data_parallel.h).
//
// Contract: run(job) runs job(rank) on every rank's thread at once (a
// collective inside it waits for all of them) and returns when every rank
// is done, with each rank's error, if it threw, at its index. One caller at
// a time. The destructor stops and joins the threads; a job running then is
// finished first.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace basalt {

class RankThreads {
 public:
  explicit RankThreads(int world);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int world() const { return world_; }
  std::vector<std::exception_ptr> run(const std::function<void(int)>& job);
  // run(), then the lowest rank's error rethrown, if any.
  void run_or_throw(const std::function<void(int)>& job);

 private:
  void serve(int rank);

  const int world_;
  std::vector<std::thread> threads_;
  std::mutex mu_;  // what follows
  std::condition_variable work_, done_;
  const std::function<void(int)>* job_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace basalt
