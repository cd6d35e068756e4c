#include "model/graphed_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

// The recorded sizes: 1, 2, 4, 8, then every multiple of 8 up to max_batch.
int padded_size(int64_t t, int max_batch) {
  if (t <= 1) return 1;
  if (t <= 2) return 2;
  if (t <= 4) return 4;
  const int64_t up = (t + 7) / 8 * 8;
  return static_cast<int>(std::min<int64_t>(up, max_batch));
}

class GraphedModel final : public Model {
 public:
  GraphedModel(std::unique_ptr<Model> model, Backend& backend, const GraphOptions& options)
      : model_(std::move(model)), backend_(backend), options_(options), unsupported_(!backend.can_record()) {
    BASALT_CHECK(options_.max_batch >= 1 && options_.max_batch <= 4096,
                 "graphed model: max_batch {} out of [1, 4096]", options_.max_batch);
    BASALT_CHECK(options_.kv_capacity >= 0, "graphed model: kv_capacity {} < 0", options_.kv_capacity);
  }

  const ModelConfig& config() const override { return model_->config(); }
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    return model_->allocate_kv(num_slots, dtype);
  }
  size_t kv_bytes_per_slot(DType dtype) const override { return model_->kv_bytes_per_slot(dtype); }
  std::string summary() const override { return model_->summary(); }

  DraftHead* draft_head() override { return model_->draft_head(); }

  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    // Hidden states are not part of the recordings: such steps run directly.
    if (hidden != nullptr || !recordable(batch, kv)) {
      ++stats_.direct;
      model_->forward(batch, kv, logits, hidden);
      return;
    }
    const int64_t t = batch.num_tokens();
    const int size = padded_size(t, options_.max_batch);
    stage(batch, size);
    auto it = graphs_.find(size);
    if (it == graphs_.end()) {
      if (!record_size(size, kv)) {  // the backend cannot record: stay direct
        ++stats_.direct;
        Tensor first = logits_.rows(0, t);
        backend_.copy(first, logits);
        return;
      }
      it = graphs_.find(size);
    }
    it->second->replay();
    ++stats_.replays;
    const Tensor first = logits_.rows(0, t);
    backend_.copy(first, logits);
  }

  // Records every size up to max_batch now, each on a batch of padding
  // rows only (one query, no keys, no KV written), so that serving never
  // pauses to record.
  void prepare(KvBuffers& kv) override {
    if (unsupported_) return;
    bind(kv);
    std::set<int> sizes;
    for (int64_t t = 1; t <= options_.max_batch; ++t) sizes.insert(padded_size(t, options_.max_batch));
    for (const int size : sizes) {
      if (graphs_.count(size) != 0) continue;
      ForwardBatch empty;
      empty.token_ids = Tensor::empty({0}, DType::kI32);
      empty.positions = empty.out_slots = empty.logit_rows = empty.attention.kv_slots = empty.token_ids;
      empty.attention.q_start = empty.attention.kv_start = Tensor::from_i32({1}, std::vector<int32_t>{0});
      stage(empty, size);
      if (!record_size(size, kv)) return;
    }
  }

  GraphStats stats() const { return stats_; }

 private:
  // Records the graph of `size` on the staged inputs. A direct run comes
  // first: it loads kernels and makes the backend's plans outside the
  // recording, and its KV writes are the ones the replay repeats. False
  // when the backend cannot record.
  bool record_size(int size, KvBuffers& kv) {
    ForwardBatch padded = device_batch(size);
    Tensor out = logits_.rows(0, size);
    model_->forward(padded, kv, out);
    // The ops are enqueued once, here; the tensors are captured by value (as
    // handles) for a backend whose replay re-runs them.
    KvBuffers* storage = &kv;
    std::unique_ptr<RecordedOps> graph =
        backend_.record([this, padded, out, storage]() mutable { model_->forward(padded, *storage, out); });
    if (graph == nullptr) {
      unsupported_ = true;
      return false;
    }
    ++stats_.recordings;
    graphs_.emplace(size, std::move(graph));
    return true;
  }

  // Offsets of the static input arrays (i32 elements) in inputs_.
  int64_t off_ids() const { return 0; }
  int64_t off_positions() const { return options_.max_batch; }
  int64_t off_out_slots() const { return 2 * int64_t{options_.max_batch}; }
  int64_t off_logit_rows() const { return 3 * int64_t{options_.max_batch}; }
  int64_t off_q_start() const { return 4 * int64_t{options_.max_batch}; }
  int64_t off_kv_start() const { return 5 * int64_t{options_.max_batch} + 1; }
  int64_t off_kv_slots() const { return 6 * int64_t{options_.max_batch} + 2; }

  bool recordable(const ForwardBatch& batch, KvBuffers& kv) {
    if (unsupported_) return false;
    const int64_t t = batch.num_tokens();
    if (t < 1 || t > options_.max_batch) return false;
    const Tensor* host[] = {&batch.token_ids, &batch.positions, &batch.out_slots, &batch.logit_rows,
                            &batch.attention.q_start, &batch.attention.kv_start, &batch.attention.kv_slots};
    for (const Tensor* h : host)
      if (h->device() != Device::kCpu || h->dtype() != DType::kI32) return false;
    if (batch.logit_rows.numel() != t || batch.attention.q_start.numel() != t + 1 ||
        batch.attention.kv_start.numel() != t + 1)
      return false;
    const int32_t* rows = batch.logit_rows.data<const int32_t>();
    const int32_t* q = batch.attention.q_start.data<const int32_t>();
    for (int64_t i = 0; i < t; ++i)
      if (rows[i] != i || q[i] != i) return false;
    if (q[t] != t) return false;
    const int64_t kv_used = batch.attention.kv_slots.numel();
    if (batch.attention.kv_start.data<const int32_t>()[t] != kv_used) return false;
    bind(kv);
    return kv_used <= capacity_;
  }

  // Allocates the static buffers on first use and drops the graphs when the
  // KV storage changes (they point at it).
  void bind(KvBuffers& kv) {
    // The graphs point at every layer's K and V memory: any change drops them.
    std::vector<const void*> key;
    for (const std::vector<Tensor>* side : {&kv.k, &kv.v})
      for (const Tensor& t : *side) key.push_back(t.raw());
    if (inputs_.raw() != nullptr && key == kv_key_ && kv.num_slots == kv_slots_) return;
    graphs_.clear();
    kv_key_ = std::move(key);
    kv_slots_ = kv.num_slots;
    capacity_ = options_.kv_capacity > 0 ? options_.kv_capacity : std::max<int64_t>(2 * kv.num_slots, 1);
    const int64_t n = off_kv_slots() + capacity_;
    inputs_ = backend_.empty({n}, DType::kI32);
    staging_ = Tensor::empty({n}, DType::kI32);
    logits_ = backend_.empty({options_.max_batch, config().vocab_size}, DType::kF32);
  }

  // Writes the batch, padded to `size` sequences, into the static inputs.
  void stage(const ForwardBatch& batch, int size) {
    const int64_t t = batch.num_tokens();
    int32_t* s = staging_.data<int32_t>();
    const auto put = [&](int64_t offset, const Tensor& src, int64_t n) {
      std::copy_n(src.data<const int32_t>(), n, s + offset);
    };
    put(off_ids(), batch.token_ids, t);
    put(off_positions(), batch.positions, t);
    put(off_out_slots(), batch.out_slots, t);
    put(off_logit_rows(), batch.logit_rows, t);
    put(off_q_start(), batch.attention.q_start, t + 1);
    put(off_kv_start(), batch.attention.kv_start, t + 1);
    const int64_t kv_used = batch.attention.kv_slots.numel();
    put(off_kv_slots(), batch.attention.kv_slots, kv_used);
    for (int64_t i = t; i < size; ++i) {  // one query, no keys, writes nowhere
      s[off_ids() + i] = 0;
      s[off_positions() + i] = 0;
      s[off_out_slots() + i] = -1;
      s[off_logit_rows() + i] = static_cast<int32_t>(i);
      s[off_q_start() + i + 1] = static_cast<int32_t>(i + 1);
      s[off_kv_start() + i + 1] = static_cast<int32_t>(kv_used);
    }
    const int64_t n = off_kv_slots() + kv_used;
    const Tensor src = staging_.rows(0, n);
    Tensor dst = inputs_.rows(0, n);
    backend_.copy(src, dst);
  }

  ForwardBatch device_batch(int size) const {
    ForwardBatch b;
    b.token_ids = inputs_.rows(off_ids(), size);
    b.positions = inputs_.rows(off_positions(), size);
    b.out_slots = inputs_.rows(off_out_slots(), size);
    b.logit_rows = inputs_.rows(off_logit_rows(), size);
    b.attention.q_start = inputs_.rows(off_q_start(), size + 1);
    b.attention.kv_start = inputs_.rows(off_kv_start(), size + 1);
    b.attention.kv_slots = inputs_.rows(off_kv_slots(), capacity_);
    return b;
  }

  std::unique_ptr<Model> model_;
  Backend& backend_;
  GraphOptions options_;
  bool unsupported_;  // the backend cannot record: every batch runs directly
  std::vector<const void*> kv_key_;  // the K and V memory the graphs were recorded on
  int64_t kv_slots_ = 0;
  int64_t capacity_ = 0;
  Tensor inputs_, staging_, logits_;
  std::map<int, std::unique_ptr<RecordedOps>> graphs_;
  GraphStats stats_;
};

}  // namespace

std::unique_ptr<Model> make_graphed_model(std::unique_ptr<Model> model, Backend& backend,
                                          const GraphOptions& options) {
  return std::make_unique<GraphedModel>(std::move(model), backend, options);
}

GraphStats graph_stats(const Model& model) {
  const auto* graphed = dynamic_cast<const GraphedModel*>(&model);
  return graphed != nullptr ? graphed->stats() : GraphStats{};
}

}  // namespace basalt
