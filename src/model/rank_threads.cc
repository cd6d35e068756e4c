#include "model/rank_threads.h"

#include "core/error.h"

namespace basalt {

RankThreads::RankThreads(int world) : world_(world) {
  BASALT_CHECK(world >= 1, "a model split over ranks needs at least one, got {}", world);
  for (int r = 0; r < world; ++r) threads_.emplace_back([this, r] { serve(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<std::exception_ptr> RankThreads::run(const std::function<void(int)>& job) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &job;
  errors_.assign(static_cast<size_t>(world_), nullptr);
  pending_ = world_;
  ++generation_;
  work_.notify_all();
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  return std::move(errors_);
}

void RankThreads::run_or_throw(const std::function<void(int)>& job) {
  for (const std::exception_ptr& e : run(job))
    if (e) std::rethrow_exception(e);
}

void RankThreads::serve(int r) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(r);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<size_t>(r)] = error;
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace basalt
