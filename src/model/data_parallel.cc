#include "model/data_parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <fmt/format.h>
#include <mutex>
#include <utility>
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
  DraftHead* draft_head() override;

 private:
  // Rank r's MTP layer, its passes stepped with the group as forward() is.
  class Head final : public DraftHead {
   public:
    Head(Group& group, int rank) : group_(group), rank_(rank) {}
    KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override;
    size_t kv_bytes_per_slot(DType dtype) const override;
    void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                 Tensor* hidden_out) override;

   private:
    Group& group_;
    const int rank_;
  };

  Group& group_;
  const int rank_;
  Head head_{group_, rank_};
};

class Group final : public DataParallelGroup {
 public:
  Group(const std::string& dir, int world, const RankBackendFactory& make_backend, const LoadProgress& progress,
        std::chrono::microseconds round_wait, Weights weights, const RankGroupFactory& make_group, DpMoe moe)
      : threads_(world), round_wait_(round_wait), moe_(moe), waiting_(static_cast<size_t>(world), nullptr) {
    ranks_.resize(static_cast<size_t>(world));
    std::vector<Backend*> backends;
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend = make_backend(r);
      BASALT_CHECK(rank.backend != nullptr, "DP attention: no backend for rank {}", r);
      BASALT_CHECK(r == 0 || rank.backend->device() == backends.front()->device(),
                   "DP attention: rank {} runs on {}, rank 0 on {}", r, rank.backend->name(),
                   backends.front()->name());
      backends.push_back(rank.backend.get());
      rank.view = std::make_unique<RankView>(*this, r);
    }
    std::vector<std::unique_ptr<Communicator>> comms =
        make_group                                    ? make_group(backends)
        : backends.front()->device() == Device::kCpu ? make_local_group(world)
                                                      : make_local_group(world, backends);
    BASALT_CHECK(comms.size() == static_cast<size_t>(world), "DP attention: a group of {} for {} ranks",
                 comms.size(), world);
    for (int r = 0; r < world; ++r) ranks_[static_cast<size_t>(r)].comm = std::move(comms[static_cast<size_t>(r)]);
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      std::unique_ptr<Model> model =
          load_model(dir, *rank.backend, r == 0 ? progress : LoadProgress{}, RankRole{rank.comm.get(), true, moe},
                     weights);
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
  Backend& backend(int r) override {
    BASALT_CHECK(r >= 0 && r < world(), "DP attention: rank {} of {}", r, world());
    return *ranks_[static_cast<size_t>(r)].backend;
  }
  DeepseekModel& model(int r) const { return *ranks_[static_cast<size_t>(r)].model; }
  DpMoe moe() const { return moe_; }
  void set_activity(std::function<bool(int)> busy) override {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = std::move(busy);
  }

  // Rank r's step (head_in null) or pass of its MTP layer (head_in its
  // hidden states; `hidden` the head's hidden output, may be null): joins
  // the next round of that kind and returns once it has run.
  void forward(int r, const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden,
               const Tensor* head_in = nullptr) {
    // What the rank's model checks only after its first exchange is checked
    // here, so that a bad call fails alone, before the round.
    const ModelConfig& c = model(r).config();
    const int64_t rows = batch.logit_rows.numel(), tokens = batch.num_tokens();
    const char* what = head_in != nullptr ? "draft head" : "forward";
    const Backend& own = *ranks_[static_cast<size_t>(r)].backend;
    BASALT_CHECK(logits.device() == own.device() && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                     logits.dim(0) == rows && logits.dim(1) == c.vocab_size,
                 "{}: logits must be f32 [{}, {}] on rank {}'s {}, got {}", what, rows, c.vocab_size, r, own.name(),
                 logits.describe());
    for (const Tensor* states : {static_cast<const Tensor*>(hidden), head_in})
      BASALT_CHECK(states == nullptr || (states->device() == own.device() && states->dtype() == DType::kF32 &&
                                         states->rank() == 2 && states->dim(0) == tokens &&
                                         states->dim(1) == c.hidden_size),
                   "{}: hidden states must be f32 [{}, {}] on rank {}'s {}, got {}", what, tokens, c.hidden_size, r,
                   own.name(), states->describe());
    BASALT_CHECK(head_in == nullptr || model(r).draft_head() != nullptr, "draft head: {} has no MTP layer",
                 model(r).summary());
    Step mine{&batch, &kv, &logits, hidden, head_in, false, nullptr, 0};
    std::unique_lock<std::mutex> lock(mu_);
    mine.arrival = ++arrivals_;
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
    const Tensor* head_in;  // non-null: a pass of the MTP layer
    bool done = false;
    std::exception_ptr error;
    uint64_t arrival = 0;  // order of handing in, for which kind of round runs first
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

  // Runs the steps handed in so far of one kind (model steps, or passes of
  // the MTP layer: the kind of the one handed in first), every other rank
  // idle in it; a rank waiting with the other kind stays queued for the
  // next round. Called with mu_ held, which it releases while the round runs.
  void lead_round(std::unique_lock<std::mutex>& lock) {
    const Step* first = nullptr;
    for (const Step* step : waiting_)
      if (step != nullptr && (first == nullptr || step->arrival < first->arrival)) first = step;
    const bool heads = first != nullptr && first->head_in != nullptr;
    std::vector<Step*> round(waiting_.size(), nullptr);
    for (size_t q = 0; q < waiting_.size(); ++q) {
      if (waiting_[q] == nullptr || (waiting_[q]->head_in != nullptr) != heads) continue;
      round[q] = std::exchange(waiting_[q], nullptr);
      --num_waiting_;
    }
    running_ = true;
    lock.unlock();
    if (moe_ == DpMoe::kGather) {
      // The leader sees every rank's batch: it agrees the rows the ranks pad
      // to for this round, so that no rank all-gathers and reads the counts.
      int64_t rows = 0;
      for (const Step* step : round)
        if (step != nullptr) rows = std::max(rows, step->batch->num_tokens());
      for (int q = 0; q < world(); ++q) model(q).set_step_rows(rows);
    }
    const std::vector<std::exception_ptr> errors = threads_.run([&](int q) {
      ranks_[static_cast<size_t>(q)].backend->make_current();
      const Step* step = round[static_cast<size_t>(q)];
      if (step == nullptr) {
        if (heads) model(q).forward_mtp_idle();
        else model(q).forward_idle();
      } else if (heads) {
        model(q).draft_head()->forward(*step->batch, *step->head_in, *step->kv, *step->logits, step->hidden);
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
  const DpMoe moe_;
  std::mutex mu_;  // what follows
  std::condition_variable changed_;
  std::vector<Step*> waiting_;  // per rank: its step for the next round, or null
  int num_waiting_ = 0;
  uint64_t arrivals_ = 0;
  std::function<bool(int)> busy_;  // set_activity
  bool running_ = false;
};

const ModelConfig& RankView::config() const { return group_.model(rank_).config(); }
KvBuffers RankView::allocate_kv(int64_t num_slots, DType dtype) const {
  group_.backend(rank_).make_current();
  return group_.model(rank_).allocate_kv(num_slots, dtype);
}
size_t RankView::kv_bytes_per_slot(DType dtype) const { return group_.model(rank_).kv_bytes_per_slot(dtype); }
void RankView::forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) {
  group_.forward(rank_, batch, kv, logits, hidden);
}
DraftHead* RankView::draft_head() { return group_.model(rank_).draft_head() != nullptr ? &head_ : nullptr; }
KvBuffers RankView::Head::allocate_kv(int64_t num_slots, DType dtype) const {
  group_.backend(rank_).make_current();
  return group_.model(rank_).draft_head()->allocate_kv(num_slots, dtype);
}
size_t RankView::Head::kv_bytes_per_slot(DType dtype) const {
  return group_.model(rank_).draft_head()->kv_bytes_per_slot(dtype);
}
void RankView::Head::forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                             Tensor* hidden_out) {
  group_.forward(rank_, batch, kv, logits, hidden_out, &hidden);
}
std::string RankView::summary() const {
  const std::string own = group_.model(rank_).summary();
  return fmt::format("DP attention over {} ranks (this is rank {}), experts by {}{}{}", group_.world(), rank_,
                     group_.moe() == DpMoe::kGather ? "gathering" : "the exchange", own.empty() ? "" : "; ", own);
}

}  // namespace

std::unique_ptr<DataParallelGroup> load_data_parallel(const std::string& dir, int world,
                                                      const RankBackendFactory& make_backend,
                                                      const LoadProgress& progress,
                                                      std::chrono::microseconds round_wait, Weights weights,
                                                      const RankGroupFactory& make_group, DpMoe moe) {
  return std::make_unique<Group>(dir, world, make_backend, progress, round_wait, weights, make_group, moe);
}

}  // namespace basalt
