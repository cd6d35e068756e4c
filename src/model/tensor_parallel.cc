#include "model/tensor_parallel.h"

#include <fmt/format.h>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/rank_threads.h"

namespace basalt {
namespace {

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                      const LoadProgress& progress)
      : threads_(world) {
    std::vector<std::unique_ptr<Communicator>> group = make_local_group(world);
    ranks_.resize(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.comm = std::move(group[static_cast<size_t>(r)]);
      rank.backend = make_backend(r);
      BASALT_CHECK(rank.backend != nullptr && rank.backend->device() == Device::kCpu,
                   "tensor parallelism runs its ranks on the CPU backend for now");
    }
    // Each rank reads its own shard; only rank 0 reports progress (the
    // ranks read the same files' pages at about the same pace).
    threads_.run_or_throw([&](int r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.model = load_model(dir, *rank.backend, r == 0 ? progress : LoadProgress{}, RankRole{rank.comm.get()});
    });
  }

  const ModelConfig& config() const override { return ranks_[0].model->config(); }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    KvBuffers all;
    all.num_slots = num_slots;
    for (const Rank& rank : ranks_) {
      KvBuffers own = rank.model->allocate_kv(num_slots, dtype);
      all.k.insert(all.k.end(), own.k.begin(), own.k.end());
      all.v.insert(all.v.end(), own.v.begin(), own.v.end());
    }
    return all;
  }

  size_t kv_bytes_per_slot(DType dtype) const override {
    size_t bytes = 0;
    for (const Rank& rank : ranks_) bytes += rank.model->kv_bytes_per_slot(dtype);
    return bytes;
  }

  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    const size_t layers = static_cast<size_t>(config().num_layers);
    BASALT_CHECK(kv.k.size() == layers * ranks_.size() && kv.v.size() == kv.k.size(),
                 "forward: KV buffers have {} layers, {} ranks of {} layers need {}", kv.k.size(), ranks_.size(),
                 layers, layers * ranks_.size());
    // What only rank 0 is given is checked here, before any rank starts: a
    // rank that failed after a collective would leave the others waiting in
    // the next one.
    const int64_t rows = batch.logit_rows.numel(), tokens = batch.num_tokens();
    BASALT_CHECK(logits.device() == Device::kCpu && logits.dtype() == DType::kF32 && logits.rank() == 2 &&
                     logits.dim(0) == rows && logits.dim(1) == config().vocab_size,
                 "forward: logits must be host f32 [{}, {}], got {}", rows, config().vocab_size, logits.describe());
    BASALT_CHECK(hidden == nullptr || (hidden->device() == Device::kCpu && hidden->dtype() == DType::kF32 &&
                                       hidden->rank() == 2 && hidden->dim(0) == tokens &&
                                       hidden->dim(1) == config().hidden_size),
                 "forward: hidden must be host f32 [{}, {}], got {}", tokens, config().hidden_size,
                 hidden->describe());
    threads_.run_or_throw([&](int r) {
      KvBuffers own;
      own.num_slots = kv.num_slots;
      const auto first = static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * layers);
      own.k.assign(kv.k.begin() + first, kv.k.begin() + first + static_cast<std::ptrdiff_t>(layers));
      own.v.assign(kv.v.begin() + first, kv.v.begin() + first + static_cast<std::ptrdiff_t>(layers));
      if (r == 0) {
        ranks_[0].model->forward(batch, own, logits, hidden);
        return;
      }
      // The other ranks' logits are the same; each writes its own copy,
      // into a buffer kept across steps and grown to the largest step's.
      Rank& rank = ranks_[static_cast<size_t>(r)];
      if (rank.logits.numel() < logits.numel()) rank.logits = Tensor::empty({logits.numel()}, DType::kF32);
      Tensor scratch = rank.logits.rows(0, logits.numel()).reshape(logits.shape());
      rank.model->forward(batch, own, scratch, nullptr);
    });
  }

  std::string summary() const override {
    const std::string own = ranks_[0].model->summary();
    return fmt::format("tensor parallel over {} ranks{}{}", ranks_.size(), own.empty() ? "" : "; rank 0: ", own);
  }

 private:
  struct Rank {
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    Tensor logits;  // f32, ranks other than 0: where their copy of the logits goes
  };

  // Declared before ranks_, so destroyed after them: the threads run the
  // ranks' work, and nothing is running once the model is destroyed.
  RankThreads threads_;
  std::vector<Rank> ranks_;
};

}  // namespace

std::unique_ptr<Model> load_tensor_parallel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                                            const LoadProgress& progress) {
  return std::make_unique<TensorParallelModel>(dir, world, make_backend, progress);
}

}  // namespace basalt
