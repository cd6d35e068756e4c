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
#include "model/forward_batch.h"
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
  void prepare(KvBuffers& kv) override;
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
        std::chrono::microseconds round_wait, Weights weights, const RankGroupFactory& make_group, DpMoe moe,
        const std::optional<GraphOptions>& graphs, bool dense_tp)
      : threads_(world),
        round_wait_(round_wait),
        moe_(moe),
        dense_tp_(dense_tp),
        waiting_(static_cast<size_t>(world), nullptr) {
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
    // Graphs per rank where every rank records its collectives, by gathering
    // only (the exchange sizes its collectives on the host in each layer).
    graphed_ = graphs.has_value() && moe == DpMoe::kGather;
    for (const Rank& rank : ranks_) graphed_ = graphed_ && rank.backend->can_record() && rank.comm->can_record();
    GraphOptions graph_options = graphs.value_or(GraphOptions{});
    graph_options.record_on_demand = false;  // the group records, every rank at once (record_graphs)
    max_batch_ = graph_options.max_batch;
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      std::unique_ptr<Model> model =
          load_model(dir, *rank.backend, r == 0 ? progress : LoadProgress{},
                     RankRole{rank.comm.get(), true, moe, dense_tp}, weights);
      rank.model = dynamic_cast<DeepseekModel*>(model.get());
      BASALT_CHECK(rank.model != nullptr, "{}: DP attention needs a DeepSeek model", dir);
      rank.owner = graphed_ ? make_graphed_model(std::move(model), *rank.backend, graph_options) : std::move(model);
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
  bool dense_tp() const { return dense_tp_; }
  GraphStats graph_stats(int r) const override {
    BASALT_CHECK(r >= 0 && r < world(), "DP attention: rank {} of {}", r, world());
    return basalt::graph_stats(*ranks_[static_cast<size_t>(r)].owner);
  }

  // Rank r's engine hands in its KV before its first step; once every rank
  // has handed one in since the last recording, the last to hand in records
  // every rank's graphs on them, between rounds. Until then rounds run
  // eagerly (a rank with a new engine alone: its old graphs point at the old
  // KV, and recording is a collective affair).
  void prepare(int r, KvBuffers& kv) {
    if (!graphed_) return;
    std::unique_lock<std::mutex> lock(mu_);
    ranks_[static_cast<size_t>(r)].kv = &kv;
    ranks_[static_cast<size_t>(r)].kv_new = true;
    recorded_ = false;
    std::vector<KvBuffers*> every;
    for (const Rank& rank : ranks_) {
      if (!rank.kv_new) return;
      every.push_back(rank.kv);
    }
    for (Rank& rank : ranks_) rank.kv_new = false;
    changed_.wait(lock, [&] { return !running_; });
    running_ = true;
    lock.unlock();
    const std::vector<std::exception_ptr> errors = record_graphs(every);
    lock.lock();
    recorded_ = true;
    running_ = false;
    changed_.notify_all();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }
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
    std::unique_ptr<Model> owner;    // the rank's model, in a GraphedModel when graphed_
    DeepseekModel* model = nullptr;  // the model itself (owner's, or inside it)
    KvBuffers* kv = nullptr;         // graphed_: what prepare() was given, the graphs' KV
    bool kv_new = false;             // graphed_: kv handed in since the last recording
    Tensor logits;                   // graphed_: [max_batch, vocab] f32 for padded steps
    std::unique_ptr<RankView> view;
  };

  // Whether `step` is a decode step the recorded graphs take: one query row
  // per sequence, every row's logits, host tensors, no hidden states.
  static bool plain_decode(const Step& step) {
    const ForwardBatch& b = *step.batch;
    const int64_t t = b.num_tokens();
    if (step.hidden != nullptr || t < 1 || b.attention.q_start.numel() != t + 1 || b.logit_rows.numel() != t)
      return false;
    for (const Tensor* h : {&b.token_ids, &b.positions, &b.out_slots, &b.logit_rows, &b.attention.q_start,
                            &b.attention.kv_start, &b.attention.kv_slots})
      if (h->device() != Device::kCpu || h->dtype() != DType::kI32) return false;
    const int32_t* q = b.attention.q_start.data<const int32_t>();
    const int32_t* rows = b.logit_rows.data<const int32_t>();
    for (int64_t i = 0; i < t; ++i)
      if (q[i] != i || rows[i] != i) return false;
    return q[t] == t;
  }

  // A decode batch padded on the host to `size` sequences, the padding
  // ones as a graphed model pads (a query at position 0, no keys, no KV
  // written): the graphs of `size` replay it.
  static ForwardBatch padded_decode(const ForwardBatch& b, int64_t size) {
    const int64_t t = b.num_tokens();
    const auto grown = [&](const Tensor& src, int64_t n, int32_t fill) {
      std::vector<int32_t> v(src.data<const int32_t>(), src.data<const int32_t>() + src.numel());
      v.resize(static_cast<size_t>(n), fill);
      return v;
    };
    std::vector<int32_t> q(static_cast<size_t>(size + 1)), rows(static_cast<size_t>(size));
    for (int64_t i = 0; i <= size; ++i) q[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < size; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const int32_t keys = b.attention.kv_start.data<const int32_t>()[t];
    // The slots (every sequence's keys, the large array) are the step's
    // own: padding sequences read none.
    ForwardBatch p = host_forward_batch(grown(b.token_ids, size, 0), grown(b.positions, size, 0),
                                        grown(b.out_slots, size, -1), q, grown(b.attention.kv_start, size + 1, keys),
                                        {}, rows);
    p.attention.kv_slots = b.attention.kv_slots;
    p.mode = b.mode;
    return p;
  }

  // Every rank's graphs, recorded together on the KV each handed in
  // (GraphedModel::prepare: every decode size in one order, on batches of
  // padding rows): the ranks' batches are of one size in each recording, so
  // every rank's model pads its MoE rows to its own count
  // (kStepRowsOwnTokens) and the collectives recorded match.
  std::vector<std::exception_ptr> record_graphs(const std::vector<KvBuffers*>& kv) {
    for (int q = 0; q < world(); ++q) model(q).set_step_rows(DeepseekModel::kStepRowsOwnTokens);
    return threads_.run([&](int q) {
      ranks_[static_cast<size_t>(q)].backend->make_current();
      model(q).reserve_step_rows(max_batch_);
      ranks_[static_cast<size_t>(q)].owner->prepare(*kv[static_cast<size_t>(q)]);
    });
  }

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
    // Graphs (recorded in prepare): a round of decode steps replays them,
    // each rank's batch padded to the round's largest (the graphs of one
    // size hold collectives of one size); other rounds run directly.
    const bool replays = graphed_ && recorded_ && !heads;
    lock.unlock();
    int64_t rows = 0, graph_size = 0;
    bool decodes = replays;
    for (const Step* step : round)
      if (step != nullptr) {
        rows = std::max(rows, step->batch->num_tokens());
        decodes = decodes && plain_decode(*step);
      }
    if (decodes && rows <= max_batch_) rows = graph_size = graph_padded_size(rows, max_batch_);
    if (moe_ == DpMoe::kGather) {
      // The leader sees every rank's batch: it agrees the rows the ranks pad
      // to for this round, so that no rank all-gathers and reads the counts.
      // A rank replaying a graph takes its own (padded) count, as when the
      // graph was recorded.
      for (int q = 0; q < world(); ++q)
        model(q).set_step_rows(graph_size > 0 && round[static_cast<size_t>(q)] != nullptr
                                   ? DeepseekModel::kStepRowsOwnTokens
                                   : rows);
    }
    const std::vector<std::exception_ptr> errors = threads_.run([&](int q) {
      Rank& rank = ranks_[static_cast<size_t>(q)];
      rank.backend->make_current();
      const Step* step = round[static_cast<size_t>(q)];
      if (step == nullptr) {
        if (heads) model(q).forward_mtp_idle();
        else model(q).forward_idle();
      } else if (heads) {
        model(q).draft_head()->forward(*step->batch, *step->head_in, *step->kv, *step->logits, step->hidden);
      } else if (graph_size > 0) {
        if (rank.logits.raw() == nullptr)
          rank.logits = rank.backend->empty({max_batch_, model(q).config().vocab_size}, DType::kF32);
        Tensor padded_logits = rank.logits.rows(0, graph_size);
        rank.owner->forward(padded_decode(*step->batch, graph_size), *step->kv, padded_logits, nullptr);
        rank.backend->copy(rank.logits.rows(0, step->batch->num_tokens()), *step->logits);
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
  const bool dense_tp_;  // the dense MLPs and shared experts split over the ranks (RankRole::dense_tp)
  bool graphed_ = false;  // each rank's model records CUDA graphs (or what its backend records)
  int max_batch_ = 0;     // graphed_: the most sequences a recorded step takes
  std::mutex mu_;  // what follows
  std::condition_variable changed_;
  std::vector<Step*> waiting_;  // per rank: its step for the next round, or null
  int num_waiting_ = 0;
  uint64_t arrivals_ = 0;
  std::function<bool(int)> busy_;  // set_activity
  bool running_ = false;
  bool recorded_ = false;  // graphed_: the graphs are recorded on the ranks' KV handed in last
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
void RankView::prepare(KvBuffers& kv) { group_.prepare(rank_, kv); }
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
  return fmt::format("DP attention over {} ranks (this is rank {}), experts by {}, dense MLPs and shared experts {}{}{}",
                     group_.world(), rank_, group_.moe() == DpMoe::kGather ? "gathering" : "the exchange",
                     group_.dense_tp() ? "split over the ranks" : "whole on each rank", own.empty() ? "" : "; ", own);
}

}  // namespace

std::unique_ptr<DataParallelGroup> load_data_parallel(const std::string& dir, int world,
                                                      const RankBackendFactory& make_backend,
                                                      const LoadProgress& progress,
                                                      std::chrono::microseconds round_wait, Weights weights,
                                                      const RankGroupFactory& make_group, DpMoe moe,
                                                      const std::optional<GraphOptions>& graphs, bool dense_tp) {
  return std::make_unique<Group>(dir, world, make_backend, progress, round_wait, weights, make_group, moe, graphs,
                                 dense_tp);
}

}  // namespace basalt
