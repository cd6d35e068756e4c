#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace basalt {
namespace {

thread_local bool in_parallel_region = false;
std::atomic<int> g_global_threads{0};  // set by set_global_threads before first use
std::atomic<bool> g_global_created{false};

int default_threads() {
  if (int n = g_global_threads.load(); n > 0) return n;
  if (const char* env = std::getenv("BASALT_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void chunk_bounds(int64_t n, int chunks, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / chunks, extra = n % chunks;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = default_threads();
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool((g_global_created.store(true), 0));
  return pool;
}

bool ThreadPool::set_global_threads(int threads) {
  if (g_global_created.load()) return global().size() == threads;
  g_global_threads.store(threads);
  return true;
}

void ThreadPool::run_chunks(uint32_t tag, const std::function<void(int64_t, int64_t)>& fn,
                            int64_t n, int chunks) {
  in_parallel_region = true;
  for (;;) {
    uint64_t claim = claim_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(claim >> 32) != tag) break;
    const int index = static_cast<int>(claim & 0xffffffffu);
    if (index >= chunks) break;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    try {
      int64_t b, e;
      chunk_bounds(n, chunks, index, &b, &e);
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!job_error_) job_error_ = std::current_exception();
    }
    done_chunks_.fetch_add(1, std::memory_order_acq_rel);
  }
  in_parallel_region = false;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int chunks = static_cast<int>(std::min<int64_t>(size(), (n + min_chunk - 1) / min_chunk));
  bool expected = false;
  if (chunks <= 1 || in_parallel_region || !busy_.compare_exchange_strong(expected, true)) {
    fn(0, n);
    return;
  }
  uint32_t tag;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    job_error_ = nullptr;
    done_chunks_.store(0, std::memory_order_relaxed);
    tag = static_cast<uint32_t>(generation_.fetch_add(1, std::memory_order_acq_rel) + 1);
    claim_.store(static_cast<uint64_t>(tag) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks(tag, fn, n, chunks);
  while (done_chunks_.load(std::memory_order_acquire) != chunks) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::exception_ptr error = job_error_;
  busy_.store(false);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little for the next job before sleeping.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return generation_.load() != seen; });
    seen = generation_.load();
    if (stop_) return;
    const auto* job = job_;
    const int64_t n = job_n_;
    const int chunks = job_chunks_;
    lock.unlock();
    if (job != nullptr) run_chunks(static_cast<uint32_t>(seen), *job, n, chunks);
  }
}

}  // namespace basalt
