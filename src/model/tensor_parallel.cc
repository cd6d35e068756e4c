#include "model/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/rank_buffers.h"
#include "model/rank_threads.h"

namespace basalt {
namespace {

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                      const LoadProgress& progress, Backend* first, const RankGroupFactory& make_group,
                      Weights weights, const std::optional<GraphOptions>& graphs)
      : threads_(world) {
    ranks_.resize(static_cast<size_t>(world));
    std::vector<Backend*> backends;
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      if (r == 0 && first != nullptr) {
        rank.backend = first;
      } else {
        rank.owned_backend = make_backend(r);
        rank.backend = rank.owned_backend.get();
      }
      BASALT_CHECK(rank.backend != nullptr, "tensor parallelism: no backend for rank {}", r);
      BASALT_CHECK(r == 0 || rank.backend->device() == backends.front()->device(),
                   "tensor parallelism: rank {} runs on {}, rank 0 on {}", r, rank.backend->name(),
                   backends.front()->name());
      backends.push_back(rank.backend);
    }
    std::vector<std::unique_ptr<Communicator>> group =
        make_group ? make_group(backends) : make_local_group(world, backends);
    BASALT_CHECK(group.size() == static_cast<size_t>(world), "tensor parallelism: a group of {} for {} ranks",
                 group.size(), world);
    for (int r = 0; r < world; ++r) ranks_[static_cast<size_t>(r)].comm = std::move(group[static_cast<size_t>(r)]);
    // Each rank reads its own shard; only rank 0 reports progress (the
    // ranks read the same files' pages at about the same pace).
    // Graphs per rank, each recording its rank's collectives, where every
    // rank can record them; all ranks take the same path for a batch, so
    // they record and replay in step.
    bool record = graphs.has_value();
    for (const Rank& rank : ranks_) record = record && rank.backend->can_record() && rank.comm->can_record();
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      rank.model =
          load_model(dir, *rank.backend, r == 0 ? progress : LoadProgress{}, RankRole{rank.comm.get()}, weights);
      if (record) rank.model = make_graphed_model(std::move(rank.model), *rank.backend, *graphs);
    });
    graphed_ = record;
  }

  bool graphed() const { return graphed_; }
  GraphStats rank_stats(int r) const { return graph_stats(*ranks_[static_cast<size_t>(r)].model); }

  // Each rank's graphs record on its own view of the KV (model/graphed_model.h).
  void prepare(KvBuffers& kv) override {
    const size_t layers = static_cast<size_t>(config().num_layers);
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      rank.model->prepare(rank.kv.of(kv, static_cast<size_t>(r), layers));
    });
  }

  const ModelConfig& config() const override { return ranks_[0].model->config(); }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    // Each rank allocates on its own thread (its device current there).
    std::vector<KvBuffers> own(ranks_.size());
    threads_.run_or_throw([&](int r) {
      const Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      own[static_cast<size_t>(r)] = rank.model->allocate_kv(num_slots, dtype);
    });
    return concatenated_kv(own, num_slots);
  }

  size_t kv_bytes_per_slot(DType dtype) const override {
    size_t bytes = 0;
    for (const Rank& rank : ranks_) bytes += rank.model->kv_bytes_per_slot(dtype);
    return bytes;
  }

  // What only rank 0 is given, checked before any rank starts: a rank that
  // failed after a collective would leave the others waiting in the next one.
  void check_forward(const ForwardBatch& batch, const KvBuffers& kv, const Tensor& logits,
                     const Tensor* hidden) const {
    const size_t layers = static_cast<size_t>(config().num_layers);
    BASALT_CHECK(kv.k.size() == layers * ranks_.size() && kv.v.size() == kv.k.size(),
                 "forward: KV buffers have {} layers, {} ranks of {} layers need {}", kv.k.size(), ranks_.size(),
                 layers, layers * ranks_.size());
    const int64_t rows = batch.logit_rows.numel(), tokens = batch.num_tokens();
    const Device device = ranks_[0].backend->device();
    BASALT_CHECK(logits.device() == device && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                     logits.dim(0) == rows && logits.dim(1) == config().vocab_size,
                 "forward: logits must be f32 [{}, {}] on rank 0's {}, got {}", rows, config().vocab_size,
                 ranks_[0].backend->name(), logits.describe());
    BASALT_CHECK(hidden == nullptr || (hidden->device() == device && hidden->dtype() == DType::kF32 &&
                                       hidden->rank() == 2 && hidden->dim(0) == tokens &&
                                       hidden->dim(1) == config().hidden_size),
                 "forward: hidden must be f32 [{}, {}] on rank 0's {}, got {}", tokens, config().hidden_size,
                 ranks_[0].backend->name(), hidden->describe());
  }

  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    const size_t layers = static_cast<size_t>(config().num_layers);
    check_forward(batch, kv, logits, hidden);
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.backend->make_current();
      KvBuffers& own = rank.kv.of(kv, static_cast<size_t>(r), layers);
      if (r == 0) {
        rank.model->forward(batch, own, logits, hidden);
        return;
      }
      // The other ranks' logits are the same; each writes its own copy.
      Tensor own_logits = scratch(*rank.backend, rank.logits, logits.shape());
      rank.model->forward(batch, own, own_logits, nullptr);
    });
  }

  // The ranks' draft heads (DeepSeek's MTP layer, each rank its shard) run
  // as one, as the ranks' models do; null when rank 0's model has none.
  DraftHead* draft_head() override { return ranks_[0].model->draft_head() != nullptr ? &head_ : nullptr; }
  void check_head(const ForwardBatch& batch, const Tensor& hidden, const KvBuffers& kv, const Tensor& logits,
                  const Tensor* hidden_out) const {
    head_.check(batch, hidden, kv, logits, hidden_out);
  }

  std::string summary() const override {
    const std::string own = ranks_[0].model->summary();
    const int world = ranks_[0].comm->world_size();
    if (world != static_cast<int>(ranks_.size()))  // ranks on other machines too (model/multi_node.h)
      return fmt::format("tensor parallel over {} ranks, ranks {}-{} here{}{}", world, ranks_[0].comm->rank(),
                         ranks_.back().comm->rank(),
                         own.empty() ? "" : fmt::format("; rank {}: ", ranks_[0].comm->rank()), own);
    return fmt::format("tensor parallel over {} ranks{}{}", ranks_.size(), own.empty() ? "" : "; rank 0: ", own);
  }

 private:
  struct Rank {
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Backend> owned_backend;  // null where rank 0 runs on the caller's
    Backend* backend = nullptr;
    std::unique_ptr<Model> model;
    // f32, ranks other than 0, kept across steps and grown to the largest:
    // their copy of the logits, and for the draft head rank 0's hidden
    // states and their copy of its hidden output.
    Tensor logits, head_hidden, head_hidden_out;
    RankKvView kv, head_kv;
  };

  // The draft head over the ranks: the caller's hidden states are rank 0's
  // (Model::forward gives them only there), so each pass first broadcasts
  // them; each rank then runs its shard of the head on its own slice of the
  // KV (one layer per rank, in rank order, as allocate_kv lays it out), and
  // rank 0 writes the logits and hidden output the caller gave.
  class Head final : public DraftHead {
   public:
    explicit Head(TensorParallelModel& m) : m_(m) {}

    KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
      std::vector<KvBuffers> own(m_.ranks_.size());
      m_.threads_.run_or_throw([&](int r) {
        const Rank& rank = m_.ranks_[static_cast<size_t>(r)];
        rank.backend->make_current();
        own[static_cast<size_t>(r)] = rank.model->draft_head()->allocate_kv(num_slots, dtype);
      });
      return concatenated_kv(own, num_slots);
    }

    size_t kv_bytes_per_slot(DType dtype) const override {
      size_t bytes = 0;
      for (const Rank& rank : m_.ranks_) bytes += rank.model->draft_head()->kv_bytes_per_slot(dtype);
      return bytes;
    }

    // Checked before any rank starts, as forward() does: a rank that failed
    // after a collective would leave the others waiting.
    void check(const ForwardBatch& batch, const Tensor& hidden, const KvBuffers& kv, const Tensor& logits,
               const Tensor* hidden_out) const {
      const size_t world = m_.ranks_.size();
      BASALT_CHECK(kv.k.size() % world == 0 && kv.v.size() == kv.k.size(),
                   "draft head: KV buffers have {} layers, not a multiple of the {} ranks", kv.k.size(), world);
      const int64_t T = batch.num_tokens(), H = m_.config().hidden_size;
      const Device device = m_.ranks_[0].backend->device();
      BASALT_CHECK(hidden.device() == device && hidden.rank() == 2 && hidden.dim(0) == T && hidden.dim(1) == H &&
                       hidden.dtype() == DType::kF32,
                   "draft head: hidden must be f32 [{}, {}] on rank 0's device, got {}", T, H, hidden.describe());
      const int64_t rows = batch.logit_rows.numel(), V = m_.config().vocab_size;
      BASALT_CHECK(logits.device() == device && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                       logits.dim(0) == rows && logits.dim(1) == V,
                   "draft head: logits must be f32 [{}, {}] on rank 0's device, got {}", rows, V, logits.describe());
      BASALT_CHECK(hidden_out == nullptr || (hidden_out->device() == device && hidden_out->dtype() == DType::kF32 &&
                                             hidden_out->rank() == 2 && hidden_out->dim(0) == T &&
                                             hidden_out->dim(1) == H),
                   "draft head: hidden_out must be f32 [{}, {}] on rank 0's device, got {}", T, H,
                   hidden_out->describe());
    }

    void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                 Tensor* hidden_out) override {
      check(batch, hidden, kv, logits, hidden_out);
      const size_t layers = kv.k.size() / m_.ranks_.size();
      const int64_t T = batch.num_tokens(), H = m_.config().hidden_size;
      m_.threads_.run_or_throw([&](int r) {
        Rank& rank = m_.ranks_[static_cast<size_t>(r)];
        rank.backend->make_current();
        KvBuffers& own = rank.head_kv.of(kv, static_cast<size_t>(r), layers);
        Tensor h = r == 0 ? hidden : scratch(*rank.backend, rank.head_hidden, {T, H});
        rank.comm->broadcast(h, 0);
        DraftHead& head = *rank.model->draft_head();
        if (r == 0) {
          head.forward(batch, h, own, logits, hidden_out);
          return;
        }
        Tensor own_logits = scratch(*rank.backend, rank.logits, logits.shape());
        Tensor own_hidden = hidden_out != nullptr ? scratch(*rank.backend, rank.head_hidden_out, {T, H}) : Tensor();
        head.forward(batch, h, own, own_logits, hidden_out != nullptr ? &own_hidden : nullptr);
      });
    }

   private:
    TensorParallelModel& m_;
  };

  // Declared before ranks_, so destroyed after them: the threads run the
  // ranks' work, and nothing is running once the model is destroyed.
  mutable RankThreads threads_;  // allocate_kv runs on it too
  std::vector<Rank> ranks_;
  bool graphed_ = false;
  Head head_{*this};
};

}  // namespace

std::unique_ptr<Model> load_tensor_parallel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                                            const LoadProgress& progress, Backend* first,
                                            const RankGroupFactory& make_group, Weights weights,
                                            const std::optional<GraphOptions>& graphs) {
  return std::make_unique<TensorParallelModel>(dir, world, make_backend, progress, first, make_group, weights,
                                               graphs);
}

void check_tensor_parallel_forward(const Model& model, const ForwardBatch& batch, const KvBuffers& kv,
                                   const Tensor& logits, const Tensor* hidden) {
  const auto* tp = dynamic_cast<const TensorParallelModel*>(&model);
  BASALT_CHECK(tp != nullptr, "check_tensor_parallel_forward: not a tensor-parallel model");
  tp->check_forward(batch, kv, logits, hidden);
}

void check_tensor_parallel_head_forward(Model& model, const ForwardBatch& batch, const Tensor& hidden,
                                        const KvBuffers& kv, const Tensor& logits, const Tensor* hidden_out) {
  auto* tp = dynamic_cast<TensorParallelModel*>(&model);
  BASALT_CHECK(tp != nullptr && tp->draft_head() != nullptr,
               "check_tensor_parallel_head_forward: not a tensor-parallel model with a draft head");
  tp->check_head(batch, hidden, kv, logits, hidden_out);
}

bool tensor_parallel_graphed(const Model& model) {
  const auto* tp = dynamic_cast<const TensorParallelModel*>(&model);
  return tp != nullptr && tp->graphed();
}

GraphStats tensor_parallel_graph_stats(const Model& model, int rank) {
  const auto* tp = dynamic_cast<const TensorParallelModel*>(&model);
  BASALT_CHECK(tp != nullptr, "tensor_parallel_graph_stats: not a tensor-parallel model");
  return tp->rank_stats(rank);
}

}  // namespace basalt
