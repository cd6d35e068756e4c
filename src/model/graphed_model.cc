#include "model/graphed_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
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

// The most query rows per sequence a recorded step takes: a verification
// step's last token and up to 7 drafts.
constexpr int64_t kMaxRowsPerSequence = 8;

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
    if (!recordable(batch, kv)) {
      ++stats_.direct;
      model_->forward(batch, kv, logits, hidden);
      return;
    }
    const int64_t t = batch.num_tokens();
    const int rows = rows_per_sequence(batch);
    const int size = padded_size(t / rows, options_.max_batch / rows);
    const Shape shape{size, rows, hidden != nullptr};
    stage(batch, size, rows);
    auto it = graphs_.find(shape);
    const bool recorded = it != graphs_.end() || record_shape(shape, kv);
    if (recorded) {
      if (it == graphs_.end()) it = graphs_.find(shape);
      it->second->replay();
      ++stats_.replays;
    } else {
      ++stats_.direct;  // the backend cannot record: the direct run of record_shape stands
    }
    const Tensor first = logits_.rows(0, t);
    backend_.copy(first, logits);
    if (hidden != nullptr) {
      const Tensor states = hidden_.rows(0, t);
      backend_.copy(states, *hidden);
    }
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
      if (graphs_.count({size, 1, false}) != 0) continue;
      ForwardBatch empty;
      empty.token_ids = Tensor::empty({0}, DType::kI32);
      empty.positions = empty.out_slots = empty.logit_rows = empty.attention.kv_slots = empty.token_ids;
      empty.attention.q_start = empty.attention.kv_start = Tensor::from_i32({1}, std::vector<int32_t>{0});
      stage(empty, size, 1);
      if (!record_shape({size, 1, false}, kv)) return;
    }
  }

  GraphStats stats() const { return stats_; }

 private:
  // Records the graph of `size` on the staged inputs. A direct run comes
  // first: it loads kernels and makes the backend's plans outside the
  // recording, and its KV writes are the ones the replay repeats. False
  // when the backend cannot record.
  // A recorded step's shape: sequences (padded), query rows each, and
  // whether it writes the final hidden states (a draft head reads them).
  struct Shape {
    int size = 0, rows = 1;
    bool hidden = false;
    bool operator<(const Shape& o) const {
      return std::tie(size, rows, hidden) < std::tie(o.size, o.rows, o.hidden);
    }
  };

  bool record_shape(const Shape& shape, KvBuffers& kv) {
    ForwardBatch padded = device_batch(shape.size, shape.rows);
    const int64_t t = int64_t{shape.size} * shape.rows;
    Tensor out = logits_.rows(0, t);
    if (shape.hidden && hidden_.raw() == nullptr)
      hidden_ = backend_.empty({options_.max_batch, config().hidden_size}, DType::kF32);
    Tensor states = shape.hidden ? hidden_.rows(0, t) : Tensor();
    model_->forward(padded, kv, out, shape.hidden ? &states : nullptr);
    // The ops are enqueued once, here; the tensors are captured by value (as
    // handles) for a backend whose replay re-runs them.
    KvBuffers* storage = &kv;
    const bool with_hidden = shape.hidden;
    std::unique_ptr<RecordedOps> graph = backend_.record([this, padded, out, states, storage, with_hidden]() mutable {
      model_->forward(padded, *storage, out, with_hidden ? &states : nullptr);
    });
    if (graph == nullptr) {
      unsupported_ = true;
      return false;
    }
    ++stats_.recordings;
    graphs_.emplace(shape, std::move(graph));
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
    const int64_t seqs = batch.attention.q_start.numel() - 1;
    if (seqs < 1 || batch.logit_rows.numel() != t || batch.attention.kv_start.numel() != seqs + 1 ||
        t % seqs != 0 || t / seqs > kMaxRowsPerSequence)
      return false;
    const int64_t per = t / seqs;
    const int32_t* rows = batch.logit_rows.data<const int32_t>();
    const int32_t* q = batch.attention.q_start.data<const int32_t>();
    for (int64_t i = 0; i < t; ++i)
      if (rows[i] != i) return false;
    for (int64_t s = 0; s <= seqs; ++s)
      if (q[s] != s * per) return false;
    const int64_t kv_used = batch.attention.kv_slots.numel();
    if (batch.attention.kv_start.data<const int32_t>()[seqs] != kv_used) return false;
    // Padded to a recorded count of sequences, the rows must still fit.
    if (int64_t{padded_size(seqs, static_cast<int>(options_.max_batch / per))} * per > options_.max_batch) return false;
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

  // Query rows per sequence of a batch recordable() took.
  static int rows_per_sequence(const ForwardBatch& batch) {
    return static_cast<int>(batch.num_tokens() / (batch.attention.q_start.numel() - 1));
  }

  // Writes the batch, padded to `size` sequences of `rows` query rows each,
  // into the static inputs.
  void stage(const ForwardBatch& batch, int size, int rows) {
    const int64_t t = batch.num_tokens();
    const int64_t seqs = batch.attention.q_start.numel() - 1;
    int32_t* s = staging_.data<int32_t>();
    const auto put = [&](int64_t offset, const Tensor& src, int64_t n) {
      std::copy_n(src.data<const int32_t>(), n, s + offset);
    };
    put(off_ids(), batch.token_ids, t);
    put(off_positions(), batch.positions, t);
    put(off_out_slots(), batch.out_slots, t);
    put(off_logit_rows(), batch.logit_rows, t);
    put(off_q_start(), batch.attention.q_start, seqs + 1);
    put(off_kv_start(), batch.attention.kv_start, seqs + 1);
    const int64_t kv_used = batch.attention.kv_slots.numel();
    put(off_kv_slots(), batch.attention.kv_slots, kv_used);
    for (int64_t i = t; i < int64_t{size} * rows; ++i) {  // padding rows: no keys, written nowhere
      s[off_ids() + i] = 0;
      s[off_positions() + i] = 0;
      s[off_out_slots() + i] = -1;
      s[off_logit_rows() + i] = static_cast<int32_t>(i);
    }
    for (int64_t q = seqs; q < size; ++q) {  // padding sequences of `rows` queries each
      s[off_q_start() + q + 1] = static_cast<int32_t>((q + 1) * rows);
      s[off_kv_start() + q + 1] = static_cast<int32_t>(kv_used);
    }
    const int64_t n = off_kv_slots() + kv_used;
    const Tensor src = staging_.rows(0, n);
    Tensor dst = inputs_.rows(0, n);
    backend_.copy(src, dst);
  }

  ForwardBatch device_batch(int size, int rows) const {
    const int64_t t = int64_t{size} * rows;
    ForwardBatch b;
    b.token_ids = inputs_.rows(off_ids(), t);
    b.positions = inputs_.rows(off_positions(), t);
    b.out_slots = inputs_.rows(off_out_slots(), t);
    b.logit_rows = inputs_.rows(off_logit_rows(), t);
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
  Tensor hidden_;  // [max_batch, hidden_size] f32, once a step wants hidden states
  std::map<Shape, std::unique_ptr<RecordedOps>> graphs_;
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
