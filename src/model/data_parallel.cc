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
#include "model/rank_buffers.h"
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
        const std::optional<GraphOptions>& graphs, bool dense_tp, int attention_tp)
      : threads_(world),
        attention_tp_(attention_tp),
        round_wait_(round_wait),
        moe_(moe),
        dense_tp_(dense_tp) {
    BASALT_CHECK(attention_tp >= 1 && world % attention_tp == 0,
                 "DP attention: {} ranks do not make DP groups of {} (the attention TP ranks)", world, attention_tp);
    const int groups = world / attention_tp;
    waiting_.assign(static_cast<size_t>(groups), nullptr);
    ranks_.resize(static_cast<size_t>(world));
    std::vector<Backend*> backends;
    for (int q = 0; q < world; ++q) {
      Rank& rank = ranks_[static_cast<size_t>(q)];
      rank.backend = make_backend(q);
      BASALT_CHECK(rank.backend != nullptr, "DP attention: no backend for rank {}", q);
      BASALT_CHECK(q == 0 || rank.backend->device() == backends.front()->device(),
                   "DP attention: rank {} runs on {}, rank 0 on {}", q, rank.backend->name(),
                   backends.front()->name());
      backends.push_back(rank.backend.get());
    }
    for (int d = 0; d < groups; ++d) dps_.push_back(std::make_unique<Dp>(*this, d));
    // The group of every rank (the routed experts are split over it) and,
    // with attention TP, one of each DP group's ranks.
    const auto make = [&](std::span<Backend* const> members) {
      std::vector<std::unique_ptr<Communicator>> comms =
          make_group                                    ? make_group(members)
          : members.front()->device() == Device::kCpu ? make_local_group(static_cast<int>(members.size()))
                                                        : make_local_group(static_cast<int>(members.size()), members);
      BASALT_CHECK(comms.size() == members.size(), "DP attention: a group of {} for {} ranks", comms.size(),
                   members.size());
      return comms;
    };
    std::vector<std::unique_ptr<Communicator>> every = make(backends);
    for (int q = 0; q < world; ++q) ranks_[static_cast<size_t>(q)].comm = std::move(every[static_cast<size_t>(q)]);
    if (attention_tp > 1)
      for (int d = 0; d < groups; ++d) {
        std::vector<std::unique_ptr<Communicator>> own =
            make(std::span<Backend* const>(backends).subspan(static_cast<size_t>(d * attention_tp),
                                                               static_cast<size_t>(attention_tp)));
        for (int a = 0; a < attention_tp; ++a)
          ranks_[static_cast<size_t>(d * attention_tp + a)].attention = std::move(own[static_cast<size_t>(a)]);
      }
    // Graphs per rank where every rank records its collectives, by gathering
    // only (the exchange sizes its collectives on the host in each layer).
    graphed_ = graphs.has_value() && moe == DpMoe::kGather;
    for (const Rank& rank : ranks_)
      graphed_ = graphed_ && rank.backend->can_record() && rank.comm->can_record() &&
                 (rank.attention == nullptr || rank.attention->can_record());
    GraphOptions graph_options = graphs.value_or(GraphOptions{});
    graph_options.record_on_demand = false;  // the group records, every rank at once (record_graphs)
    max_batch_ = graph_options.max_batch;
    threads_.run_or_throw([&](int q) {
      Rank& rank = ranks_[static_cast<size_t>(q)];
      rank.backend->make_current();
      std::unique_ptr<Model> model =
          load_model(dir, *rank.backend, q == 0 ? progress : LoadProgress{},
                     RankRole{rank.comm.get(), true, moe, dense_tp, rank.attention.get()}, weights);
      rank.model = dynamic_cast<DeepseekModel*>(model.get());
      BASALT_CHECK(rank.model != nullptr, "{}: DP attention needs a DeepSeek model", dir);
      rank.owner = graphed_ ? make_graphed_model(std::move(model), *rank.backend, graph_options) : std::move(model);
    });
  }

  int world() const override { return static_cast<int>(dps_.size()); }
  int attention_tp() const { return attention_tp_; }
  Model& rank(int d) override {
    BASALT_CHECK(d >= 0 && d < world(), "DP attention: rank {} of {}", d, world());
    return dps_[static_cast<size_t>(d)]->view;
  }
  Backend& backend(int d) override {
    BASALT_CHECK(d >= 0 && d < world(), "DP attention: rank {} of {}", d, world());
    return *ranks_[static_cast<size_t>(d * attention_tp_)].backend;
  }
  // DP rank d's first rank's model (each of its ranks holds 1/attention_tp
  // of the heads; the config and the checks are the same on each).
  DeepseekModel& model(int d) const { return *ranks_[static_cast<size_t>(d * attention_tp_)].model; }
  DpMoe moe() const { return moe_; }
  bool dense_tp() const { return dense_tp_; }
  GraphStats graph_stats(int d) const override {
    BASALT_CHECK(d >= 0 && d < world(), "DP attention: rank {} of {}", d, world());
    return basalt::graph_stats(*ranks_[static_cast<size_t>(d * attention_tp_)].owner);
  }

  // DP rank d's KV: each of its ranks' (with attention TP the latent cache
  // is every rank's of the DP group: it is not split by heads), one after
  // another (model/rank_buffers.h); each rank allocates with its device
  // current, the first rank's last, so that it stays current.
  KvBuffers allocate_kv(int d, int64_t num_slots, DType dtype, bool head) const {
    std::vector<KvBuffers> own(static_cast<size_t>(attention_tp_));
    for (int a = attention_tp_ - 1; a >= 0; --a) {
      const Rank& rank = ranks_[static_cast<size_t>(d * attention_tp_ + a)];
      rank.backend->make_current();
      own[static_cast<size_t>(a)] = head ? rank.model->draft_head()->allocate_kv(num_slots, dtype)
                                         : rank.model->allocate_kv(num_slots, dtype);
    }
    return concatenated_kv(own, num_slots);
  }
  size_t kv_bytes_per_slot(int d, DType dtype, bool head) const {
    size_t bytes = 0;
    for (int a = 0; a < attention_tp_; ++a) {
      DeepseekModel* m = ranks_[static_cast<size_t>(d * attention_tp_ + a)].model;
      bytes += head ? m->draft_head()->kv_bytes_per_slot(dtype) : m->kv_bytes_per_slot(dtype);
    }
    return bytes;
  }

  // DP rank d's engine hands in its KV before its first step; once every DP
  // rank has handed one in since the last recording, the last to hand in
  // records every rank's graphs on them, between rounds. Until then rounds
  // run eagerly (a DP rank with a new engine alone: its old graphs point at
  // the old KV, and recording is a collective affair).
  void prepare(int d, KvBuffers& kv) {
    if (!graphed_) return;
    std::unique_lock<std::mutex> lock(mu_);
    Dp& dp = *dps_[static_cast<size_t>(d)];
    dp.kv = &kv;
    dp.kv_new = true;
    recorded_ = false;
    std::vector<KvBuffers*> every;
    for (const auto& other : dps_) {
      if (!other->kv_new) return;
      every.push_back(other->kv);
    }
    for (auto& other : dps_) other->kv_new = false;
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

  // DP rank d's step (head_in null) or pass of its MTP layer (head_in its
  // hidden states; `hidden` the head's hidden output, may be null): joins
  // the next round of that kind and returns once it has run.
  void forward(int d, const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden,
               const Tensor* head_in = nullptr) {
    // What the ranks' models check only after their first collective is
    // checked here, so that a bad call fails alone, before the round.
    const ModelConfig& c = model(d).config();
    const int64_t rows = batch.logit_rows.numel(), tokens = batch.num_tokens();
    const char* what = head_in != nullptr ? "draft head" : "forward";
    const Backend& own = backend(d);
    BASALT_CHECK(logits.device() == own.device() && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                     logits.dim(0) == rows && logits.dim(1) == c.vocab_size,
                 "{}: logits must be f32 [{}, {}] on rank {}'s {}, got {}", what, rows, c.vocab_size, d, own.name(),
                 logits.describe());
    for (const Tensor* states : {static_cast<const Tensor*>(hidden), head_in})
      BASALT_CHECK(states == nullptr || (states->device() == own.device() && states->dtype() == DType::kF32 &&
                                         states->rank() == 2 && states->dim(0) == tokens &&
                                         states->dim(1) == c.hidden_size),
                   "{}: hidden states must be f32 [{}, {}] on rank {}'s {}, got {}", what, tokens, c.hidden_size, d,
                   own.name(), states->describe());
    BASALT_CHECK(head_in == nullptr || model(d).draft_head() != nullptr, "draft head: {} has no MTP layer",
                 model(d).summary());
    const size_t layers = head_in != nullptr ? 1 : static_cast<size_t>(c.num_layers);
    BASALT_CHECK(kv.k.size() == layers * static_cast<size_t>(attention_tp_) && kv.v.size() == kv.k.size(),
                 "{}: KV buffers have {} layers, {} ranks of {} need {}", what, kv.k.size(), attention_tp_, layers,
                 layers * static_cast<size_t>(attention_tp_));
    Step mine{&batch, &kv, &logits, hidden, head_in, false, nullptr, 0};
    std::unique_lock<std::mutex> lock(mu_);
    mine.arrival = ++arrivals_;
    BASALT_CHECK(waiting_[static_cast<size_t>(d)] == nullptr, "DP attention: rank {} is already in a step", d);
    waiting_[static_cast<size_t>(d)] = &mine;
    ++num_waiting_;
    changed_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + round_wait_;
    while (!mine.done) {
      const bool queued = waiting_[static_cast<size_t>(d)] == &mine;
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
  // One rank: a thread, a backend and a model of its own.
  struct Rank {
    std::unique_ptr<Communicator> comm;       // every rank's group
    std::unique_ptr<Communicator> attention;  // its DP group's ranks (attention TP); null without
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> owner;    // the rank's model, in a GraphedModel when graphed_
    DeepseekModel* model = nullptr;  // the model itself (owner's, or inside it)
    RankKvView kv, head_kv;          // its layers of its DP rank's KV and MTP KV
    // Scratch (model/rank_buffers.h): the logits of padded steps (graphed_),
    // and, on a DP group's ranks after its first, their copy of the logits
    // and of the MTP layer's hidden input.
    Tensor logits, head_hidden;
  };
  // One DP rank: what its scheduler drives, the attention_tp_ ranks
  // [d * attention_tp_, (d + 1) * attention_tp_) running its batches.
  struct Dp {
    Dp(Group& group, int d) : view(group, d) {}
    RankView view;
    KvBuffers* kv = nullptr;  // graphed_: what prepare() was given, the graphs' KV
    bool kv_new = false;      // graphed_: kv handed in since the last recording
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

  // Rank q's layers of its DP rank's KV (or MTP KV).
  KvBuffers& rank_kv(int q, const KvBuffers& all, bool head) {
    Rank& rank = ranks_[static_cast<size_t>(q)];
    const size_t layers = all.k.size() / static_cast<size_t>(attention_tp_);
    return (head ? rank.head_kv : rank.kv).of(all, static_cast<size_t>(q % attention_tp_), layers);
  }

  // Every rank's graphs, recorded together on the KV each DP rank handed in
  // (kv[d]; GraphedModel::prepare: every decode size in one order, on
  // batches of padding rows): the ranks' batches are of one size in each
  // recording, so every rank's model pads its MoE rows to its own count
  // (kStepRowsOwnTokens) and the collectives recorded match.
  std::vector<std::exception_ptr> record_graphs(const std::vector<KvBuffers*>& kv) {
    for (Rank& rank : ranks_) rank.model->set_step_rows(DeepseekModel::kStepRowsOwnTokens);
    return threads_.run([&](int q) {
      Rank& rank = ranks_[static_cast<size_t>(q)];
      rank.backend->make_current();
      rank.model->reserve_step_rows(max_batch_);
      rank.owner->prepare(rank_kv(q, *kv[static_cast<size_t>(q / attention_tp_)], false));
    });
  }

  // Whether every DP rank that may hand in a batch has (mu_ held).
  bool everyone_busy_is_in() const {
    if (num_waiting_ == world()) return true;
    if (!busy_) return false;
    for (int d = 0; d < world(); ++d)
      if (waiting_[static_cast<size_t>(d)] == nullptr && busy_(d)) return false;
    return true;
  }

  // Runs the steps handed in so far of one kind (model steps, or passes of
  // the MTP layer: the kind of the one handed in first), every other DP
  // rank idle in it; a DP rank waiting with the other kind stays queued for
  // the next round. Called with mu_ held, which it releases while the round
  // runs. Each of a DP group's ranks runs its batch (attention TP); the
  // group's first writes the caller's outputs.
  void lead_round(std::unique_lock<std::mutex>& lock) {
    const Step* first = nullptr;
    for (const Step* step : waiting_)
      if (step != nullptr && (first == nullptr || step->arrival < first->arrival)) first = step;
    const bool heads = first != nullptr && first->head_in != nullptr;
    std::vector<Step*> round(waiting_.size(), nullptr);
    for (size_t d = 0; d < waiting_.size(); ++d) {
      if (waiting_[d] == nullptr || (waiting_[d]->head_in != nullptr) != heads) continue;
      round[d] = std::exchange(waiting_[d], nullptr);
      --num_waiting_;
    }
    running_ = true;
    // Graphs (recorded in prepare): a round of decode steps replays them,
    // each DP rank's batch padded to the round's largest (the graphs of one
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
    std::vector<ForwardBatch> padded(round.size());
    for (size_t d = 0; d < round.size(); ++d)
      if (graph_size > 0 && round[d] != nullptr) padded[d] = padded_decode(*round[d]->batch, graph_size);
    if (moe_ == DpMoe::kGather) {
      // The leader sees every DP rank's batch: it agrees the rows the ranks
      // pad to for this round, so that no rank all-gathers and reads the
      // counts. A rank replaying a graph takes its own (padded) count, as
      // when the graph was recorded.
      for (int q = 0; q < static_cast<int>(ranks_.size()); ++q)
        ranks_[static_cast<size_t>(q)].model->set_step_rows(
            graph_size > 0 && round[static_cast<size_t>(q / attention_tp_)] != nullptr
                ? DeepseekModel::kStepRowsOwnTokens
                : rows);
    }
    const std::vector<std::exception_ptr> errors = threads_.run([&](int q) {
      Rank& rank = ranks_[static_cast<size_t>(q)];
      rank.backend->make_current();
      const size_t d = static_cast<size_t>(q / attention_tp_);
      const bool writes = q % attention_tp_ == 0;  // the caller's outputs are the DP group's first rank's
      const Step* step = round[d];
      if (step == nullptr) {
        if (heads) rank.model->forward_mtp_idle();
        else rank.model->forward_idle();
        return;
      }
      KvBuffers& kv = rank_kv(q, *step->kv, heads);
      if (heads) {
        // The hidden states are the first rank's: its DP group's others
        // receive them.
        const Tensor& in = *step->head_in;
        Tensor h = writes ? in : scratch(*rank.backend, rank.head_hidden, in.shape());
        if (rank.attention != nullptr) rank.attention->broadcast(h, 0);
        Tensor own_logits = writes ? *step->logits : scratch(*rank.backend, rank.logits, step->logits->shape());
        rank.model->draft_head()->forward(*step->batch, h, kv, own_logits, writes ? step->hidden : nullptr);
      } else if (graph_size > 0) {
        Tensor padded_logits = scratch(*rank.backend, rank.logits, {graph_size, step->logits->dim(1)});
        rank.owner->forward(padded[d], kv, padded_logits, nullptr);
        if (writes) rank.backend->copy(padded_logits.rows(0, step->batch->num_tokens()), *step->logits);
      } else {
        Tensor own_logits = writes ? *step->logits : scratch(*rank.backend, rank.logits, step->logits->shape());
        rank.model->forward(*step->batch, kv, own_logits, writes ? step->hidden : nullptr);
      }
    });
    // A DP rank's error is its ranks' first; an idle rank's goes to every
    // DP rank of the round.
    std::exception_ptr idle_error;
    std::vector<std::exception_ptr> dp_errors(round.size());
    for (size_t q = 0; q < errors.size(); ++q) {
      const size_t d = q / static_cast<size_t>(attention_tp_);
      if (!errors[q]) continue;
      if (round[d] == nullptr && !idle_error) idle_error = errors[q];
      if (round[d] != nullptr && !dp_errors[d]) dp_errors[d] = errors[q];
    }
    lock.lock();
    for (size_t d = 0; d < round.size(); ++d) {
      if (round[d] == nullptr) continue;
      round[d]->error = dp_errors[d] ? dp_errors[d] : idle_error;
      round[d]->done = true;
    }
    running_ = false;
    changed_.notify_all();
  }

  RankThreads threads_;  // destroyed after ranks_ (see tensor_parallel.cc)
  std::vector<Rank> ranks_;
  std::vector<std::unique_ptr<Dp>> dps_;
  const int attention_tp_;  // ranks per DP group (their heads split over them)
  const std::chrono::microseconds round_wait_;
  const DpMoe moe_;
  const bool dense_tp_;  // the dense MLPs and shared experts split over the ranks (RankRole::dense_tp)
  bool graphed_ = false;  // each rank's model records CUDA graphs (or what its backend records)
  int max_batch_ = 0;     // graphed_: the most sequences a recorded step takes
  std::mutex mu_;  // what follows
  std::condition_variable changed_;
  std::vector<Step*> waiting_;  // per DP rank: its step for the next round, or null
  int num_waiting_ = 0;
  uint64_t arrivals_ = 0;
  std::function<bool(int)> busy_;  // set_activity
  bool running_ = false;
  bool recorded_ = false;  // graphed_: the graphs are recorded on the KV the DP ranks handed in last
};

const ModelConfig& RankView::config() const { return group_.model(rank_).config(); }
KvBuffers RankView::allocate_kv(int64_t num_slots, DType dtype) const {
  return group_.allocate_kv(rank_, num_slots, dtype, false);
}
size_t RankView::kv_bytes_per_slot(DType dtype) const { return group_.kv_bytes_per_slot(rank_, dtype, false); }
void RankView::forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) {
  group_.forward(rank_, batch, kv, logits, hidden);
}
void RankView::prepare(KvBuffers& kv) { group_.prepare(rank_, kv); }
DraftHead* RankView::draft_head() { return group_.model(rank_).draft_head() != nullptr ? &head_ : nullptr; }
KvBuffers RankView::Head::allocate_kv(int64_t num_slots, DType dtype) const {
  return group_.allocate_kv(rank_, num_slots, dtype, true);
}
size_t RankView::Head::kv_bytes_per_slot(DType dtype) const { return group_.kv_bytes_per_slot(rank_, dtype, true); }
void RankView::Head::forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                             Tensor* hidden_out) {
  group_.forward(rank_, batch, kv, logits, hidden_out, &hidden);
}
std::string RankView::summary() const {
  const std::string own = group_.model(rank_).summary();
  const int tp = group_.attention_tp();
  return fmt::format(
      "DP attention over {} ranks (this is rank {}{}), experts by {}, dense MLPs and shared experts {}{}{}",
      group_.world(), rank_,
      tp > 1 ? fmt::format(", its attention heads over {} ranks", tp) : std::string(),
      group_.moe() == DpMoe::kGather ? "gathering" : "the exchange",
      group_.dense_tp() ? fmt::format("split over the {} ranks", group_.world() * tp)
                        : tp > 1 ? fmt::format("split over its {} ranks", tp) : std::string("whole on each rank"),
      own.empty() ? "" : "; ", own);
}

}  // namespace

std::unique_ptr<DataParallelGroup> load_data_parallel(const std::string& dir, int world,
                                                      const RankBackendFactory& make_backend,
                                                      const LoadProgress& progress,
                                                      std::chrono::microseconds round_wait, Weights weights,
                                                      const RankGroupFactory& make_group, DpMoe moe,
                                                      const std::optional<GraphOptions>& graphs, bool dense_tp,
                                                      int attention_tp) {
  return std::make_unique<Group>(dir, world, make_backend, progress, round_wait, weights, make_group, moe, graphs,
                                 dense_tp, attention_tp);
}

}  // namespace basalt
