#include "model/data_parallel.h"

#include <condition_variable>
#include <exception>
#include <fmt/format.h>
#include <mutex>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/deepseek_v3.h"
#include "model/rank_threads.h"

namespace basalt {
namespace {

class Group;

// What rank r's scheduler sees: rank r's model, stepped with the group.
class RankView final : public Model {
 public:
  RankView(Group& group, int rank) : group_(group), rank_(rank) {}
  const ModelConfig& config() const override;
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override;
  size_t kv_bytes_per_slot(DType dtype) const override;
  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override;
  std::string summary() const override;

 private:
  Group& group_;
  const int rank_;
};

class Group final : public DataParallelGroup {
 public:
  Group(const std::string& dir, int world, const RankBackendFactory& make_backend, const LoadProgress& progress,
        std::chrono::microseconds round_wait, Weights weights)
      : threads_(world), round_wait_(round_wait), waiting_(static_cast<size_t>(world), nullptr) {
    std::vector<std::unique_ptr<Communicator>> comms = make_local_group(world);
    ranks_.resize(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.comm = std::move(comms[static_cast<size_t>(r)]);
      rank.backend = make_backend(r);
      BASALT_CHECK(rank.backend != nullptr && rank.backend->device() == Device::kCpu,
                   "DP attention runs its ranks on the CPU backend for now");
      rank.view = std::make_unique<RankView>(*this, r);
    }
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      std::unique_ptr<Model> model =
          load_model(dir, *rank.backend, r == 0 ? progress : LoadProgress{}, RankRole{rank.comm.get(), true}, weights);
      rank.model.reset(dynamic_cast<DeepseekModel*>(model.get()));
      BASALT_CHECK(rank.model != nullptr, "{}: DP attention needs a DeepSeek model", dir);
      (void)model.release();
    });
  }

  int world() const override { return threads_.world(); }
  Model& rank(int r) override {
    BASALT_CHECK(r >= 0 && r < world(), "DP attention: rank {} of {}", r, world());
    return *ranks_[static_cast<size_t>(r)].view;
  }
  DeepseekModel& model(int r) const { return *ranks_[static_cast<size_t>(r)].model; }
  void set_activity(std::function<bool(int)> busy) override {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = std::move(busy);
  }

  // Rank r's step: joins the next round and returns once it has run.
  void forward(int r, const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) {
    // What the rank's model checks only after its first exchange is checked
    // here, so that a bad call fails alone, before the round.
    const ModelConfig& c = model(r).config();
    const int64_t rows = batch.logit_rows.numel(), tokens = batch.num_tokens();
    BASALT_CHECK(logits.device() == Device::kCpu && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                     logits.dim(0) == rows && logits.dim(1) == c.vocab_size,
                 "forward: logits must be host f32 [{}, {}], got {}", rows, c.vocab_size, logits.describe());
    BASALT_CHECK(hidden == nullptr || (hidden->device() == Device::kCpu && hidden->dtype() == DType::kF32 &&
                                       hidden->rank() == 2 && hidden->dim(0) == tokens &&
                                       hidden->dim(1) == c.hidden_size),
                 "forward: hidden must be host f32 [{}, {}], got {}", tokens, c.hidden_size, hidden->describe());
    Step mine{&batch, &kv, &logits, hidden, false, nullptr};
    std::unique_lock<std::mutex> lock(mu_);
    BASALT_CHECK(waiting_[static_cast<size_t>(r)] == nullptr, "DP attention: rank {} is already in a step", r);
    waiting_[static_cast<size_t>(r)] = &mine;
    ++num_waiting_;
    changed_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + round_wait_;
    while (!mine.done) {
      const bool queued = waiting_[static_cast<size_t>(r)] == &mine;
      if (running_ || !queued) {
        changed_.wait(lock);
      } else if (everyone_busy_is_in() || std::chrono::steady_clock::now() >= deadline) {
        lead_round(lock);
      } else {
        changed_.wait_until(lock, deadline);
      }
    }
    if (mine.error) std::rethrow_exception(mine.error);
  }

  struct Step {
    const ForwardBatch* batch;
    KvBuffers* kv;
    Tensor* logits;
    Tensor* hidden;
    bool done = false;
    std::exception_ptr error;
  };

 private:
  struct Rank {
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<DeepseekModel> model;
    std::unique_ptr<RankView> view;
  };

  // Whether every rank that may hand in a batch has (mu_ held).
  bool everyone_busy_is_in() const {
    if (num_waiting_ == world()) return true;
    if (!busy_) return false;
    for (int q = 0; q < world(); ++q)
      if (waiting_[static_cast<size_t>(q)] == nullptr && busy_(q)) return false;
    return true;
  }

  // Runs the steps handed in so far, every other rank idle; called with mu_
  // held, which it releases while the round runs.
  void lead_round(std::unique_lock<std::mutex>& lock) {
    std::vector<Step*> round = waiting_;
    std::fill(waiting_.begin(), waiting_.end(), nullptr);
    num_waiting_ = 0;
    running_ = true;
    lock.unlock();
    const std::vector<std::exception_ptr> errors = threads_.run([&](int q) {
      const Step* step = round[static_cast<size_t>(q)];
      if (step == nullptr) {
        model(q).forward_idle();
      } else {
        model(q).forward(*step->batch, *step->kv, *step->logits, step->hidden);
      }
    });
    std::exception_ptr idle_error;
    for (size_t q = 0; q < round.size(); ++q)
      if (round[q] == nullptr && errors[q] && !idle_error) idle_error = errors[q];
    lock.lock();
    for (size_t q = 0; q < round.size(); ++q) {
      if (round[q] == nullptr) continue;
      round[q]->error = errors[q] ? errors[q] : idle_error;
      round[q]->done = true;
    }
    running_ = false;
    changed_.notify_all();
  }

  RankThreads threads_;  // destroyed after ranks_ (see tensor_parallel.cc)
  std::vector<Rank> ranks_;
  const std::chrono::microseconds round_wait_;
  std::mutex mu_;  // what follows
  std::condition_variable changed_;
  std::vector<Step*> waiting_;  // per rank: its step for the next round, or null
  int num_waiting_ = 0;
  std::function<bool(int)> busy_;  // set_activity
  bool running_ = false;
};

const ModelConfig& RankView::config() const { return group_.model(rank_).config(); }
KvBuffers RankView::allocate_kv(int64_t num_slots, DType dtype) const {
  return group_.model(rank_).allocate_kv(num_slots, dtype);
}
size_t RankView::kv_bytes_per_slot(DType dtype) const { return group_.model(rank_).kv_bytes_per_slot(dtype); }
void RankView::forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) {
  group_.forward(rank_, batch, kv, logits, hidden);
}
std::string RankView::summary() const {
  const std::string own = group_.model(rank_).summary();
  return fmt::format("DP attention over {} ranks (this is rank {}){}{}", group_.world(), rank_,
                     own.empty() ? "" : "; ", own);
}

}  // namespace

std::unique_ptr<DataParallelGroup> load_data_parallel(const std::string& dir, int world,
                                                      const RankBackendFactory& make_backend,
                                                      const LoadProgress& progress,
                                                      std::chrono::microseconds round_wait, Weights weights) {
  return std::make_unique<Group>(dir, world, make_backend, progress, round_wait, weights);
}

}  // namespace basalt
