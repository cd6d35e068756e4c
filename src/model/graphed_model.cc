#include "model/graphed_model.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace basalt {

// The recorded sizes: 1, 2, 4, 5, 8, then every multiple of 8 up to
// max_batch. 5 is a size of its own because the GPU's skinny GEMV computes
// up to 5 rows each row as a one-row call does and 6 or more on the tensor
// cores (backend/cuda/gemv_kernels.h, kGemvDefaultRowExactRows): a batch of
// 5 padded to 8 would take the other kernel and round otherwise than the
// same batch launched directly.
int graph_padded_size(int64_t t, int max_batch) {
  if (t <= 1) return 1;
  if (t <= 2) return 2;
  if (t <= 4) return 4;
  if (t == 5) return static_cast<int>(std::min<int64_t>(5, max_batch));
  const int64_t up = (t + 7) / 8 * 8;
  return static_cast<int>(std::min<int64_t>(up, max_batch));
}

namespace {

// The most query rows per sequence a recorded step takes: a verification
// step's last token and up to 7 drafts.
constexpr int64_t kMaxRowsPerSequence = 8;

// Which logits rows a recorder takes: every row (logit_rows = 0..T-1: a
// model's steps, and a draft head's pass over a step's samples), and with
// kOnePerSequence also one row per sequence, anywhere in it (a draft
// head's pass that drafts from each sequence's last kept row).
enum class LogitRows { kEvery, kOnePerSequence };

// A recorded step's shape: sequences (padded), query rows each, whether it
// writes hidden states (a model's final ones for a draft head; a head's
// own, for chaining), and whether it computes every row's logits (else one
// per sequence).
struct Shape {
  int size = 0, rows = 1;
  bool hidden = false;
  bool every = true;
  bool operator<(const Shape& o) const {
    return std::tie(size, rows, hidden, every) < std::tie(o.size, o.rows, o.hidden, o.every);
  }
};

// Whether the batch wants every row's logits, in order.
bool every_row(const ForwardBatch& batch) {
  const int64_t t = batch.num_tokens();
  if (batch.logit_rows.numel() != t) return false;
  const int32_t* rows = batch.logit_rows.data<const int32_t>();
  for (int64_t i = 0; i < t; ++i)
    if (rows[i] != i) return false;
  return true;
}

// What the model and the draft head wrappers share: the static inputs of
// their recorded steps (the seven i32 arrays of a ForwardBatch, in one
// device buffer), which batches qualify, padding, and the recorded graphs,
// bound to one KvBuffers.
class Recorder {
 public:
  Recorder(Backend& backend, const GraphOptions& options, LogitRows logit_rows)
      : backend_(backend), options_(options), logit_rows_(logit_rows), unsupported_(!backend.can_record()) {}

  bool unsupported() const { return unsupported_; }
  GraphStats& stats() { return stats_; }
  const GraphStats& stats() const { return stats_; }

  // Whether `batch` takes the recorded path with `kv` (which it binds).
  bool accepts(const ForwardBatch& batch, KvBuffers& kv) {
    if (unsupported_) return false;
    const int64_t t = batch.num_tokens();
    if (t < 1 || t > options_.max_batch) return false;
    const Tensor* host[] = {&batch.positions, &batch.out_slots, &batch.logit_rows, &batch.attention.q_start,
                            &batch.attention.kv_start, &batch.attention.kv_slots};
    for (const Tensor* h : host)
      if (h->device() != Device::kCpu || h->dtype() != DType::kI32) return false;
    // The token ids may already be on the device (a draft head's chain
    // reads the drafts it just made there); they are copied in after the rest.
    if (batch.token_ids.dtype() != DType::kI32 || batch.token_ids.numel() != t ||
        (batch.token_ids.device() != Device::kCpu && batch.token_ids.device() != backend_.device()))
      return false;
    const int64_t seqs = batch.attention.q_start.numel() - 1;
    if (seqs < 1 || batch.attention.kv_start.numel() != seqs + 1 || t % seqs != 0 ||
        t / seqs > kMaxRowsPerSequence)
      return false;
    const int64_t per = t / seqs;
    const int32_t* q = batch.attention.q_start.data<const int32_t>();
    for (int64_t s = 0; s <= seqs; ++s)
      if (q[s] != s * per) return false;
    if (!every_row(batch)) {
      if (logit_rows_ != LogitRows::kOnePerSequence || batch.logit_rows.numel() != seqs) return false;
      const int32_t* rows = batch.logit_rows.data<const int32_t>();
      for (int64_t s = 0; s < seqs; ++s)
        if (rows[s] < s * per || rows[s] >= (s + 1) * per) return false;
    }
    const int64_t kv_used = batch.attention.kv_slots.numel();
    if (batch.attention.kv_start.data<const int32_t>()[seqs] != kv_used) return false;
    // Padded to a recorded count of sequences, the rows must still fit.
    if (int64_t{graph_padded_size(seqs, static_cast<int>(options_.max_batch / per))} * per > options_.max_batch)
      return false;
    bind(kv);
    return kv_used <= capacity_;
  }

  // The shape `batch` (which accepts() took) is padded to.
  Shape shape_of(const ForwardBatch& batch, bool hidden) const {
    const int64_t t = batch.num_tokens();
    const int rows = static_cast<int>(t / (batch.attention.q_start.numel() - 1));
    return {graph_padded_size(t / rows, options_.max_batch / rows), rows, hidden, every_row(batch)};
  }

  // Writes the batch, padded to the shape's sequences of its rows each,
  // into the static inputs.
  void stage(const ForwardBatch& batch, const Shape& shape) {
    const int size = shape.size, rows = shape.rows;
    const int64_t t = batch.num_tokens();
    const int64_t seqs = batch.attention.q_start.numel() - 1;
    int32_t* s = staging_.data<int32_t>();
    const auto put = [&](int64_t offset, const Tensor& src, int64_t n) {
      std::copy_n(src.data<const int32_t>(), n, s + offset);
    };
    const bool ids_on_host = batch.token_ids.device() == Device::kCpu;
    if (ids_on_host) put(off_ids(), batch.token_ids, t);
    put(off_positions(), batch.positions, t);
    put(off_out_slots(), batch.out_slots, t);
    put(off_logit_rows(), batch.logit_rows, batch.logit_rows.numel());
    put(off_q_start(), batch.attention.q_start, seqs + 1);
    put(off_kv_start(), batch.attention.kv_start, seqs + 1);
    const int64_t kv_used = batch.attention.kv_slots.numel();
    put(off_kv_slots(), batch.attention.kv_slots, kv_used);
    if (!ids_on_host) std::fill_n(s + off_ids(), t, 0);
    for (int64_t i = t; i < int64_t{size} * rows; ++i) {  // padding rows: no keys, written nowhere
      s[off_ids() + i] = 0;
      s[off_positions() + i] = 0;
      s[off_out_slots() + i] = -1;
      if (shape.every) s[off_logit_rows() + i] = static_cast<int32_t>(i);
    }
    for (int64_t q = seqs; q < size; ++q) {  // padding sequences of `rows` queries each
      s[off_q_start() + q + 1] = static_cast<int32_t>((q + 1) * rows);
      s[off_kv_start() + q + 1] = static_cast<int32_t>(kv_used);
      if (!shape.every) s[off_logit_rows() + q] = static_cast<int32_t>(q * rows);
    }
    const int64_t n = off_kv_slots() + kv_used;
    const Tensor src = staging_.rows(0, n);
    Tensor dst = inputs_.rows(0, n);
    // Without waiting for the device: the work queued before (the step
    // before, or the step this head pass follows) keeps it busy while the
    // host stages and launches this one.
    backend_.upload(src, dst);
    if (!ids_on_host) {  // the real rows' ids over the staged ones (the padding rows' stay 0)
      Tensor ids = inputs_.rows(off_ids(), t);
      backend_.copy(batch.token_ids, ids);
    }
  }

  // The static inputs as the batch of `shape`.
  ForwardBatch device_batch(const Shape& shape) const {
    const int64_t t = int64_t{shape.size} * shape.rows;
    ForwardBatch b;
    b.token_ids = inputs_.rows(off_ids(), t);
    b.positions = inputs_.rows(off_positions(), t);
    b.out_slots = inputs_.rows(off_out_slots(), t);
    b.logit_rows = inputs_.rows(off_logit_rows(), shape.every ? t : shape.size);
    b.attention.q_start = inputs_.rows(off_q_start(), shape.size + 1);
    b.attention.kv_start = inputs_.rows(off_kv_start(), shape.size + 1);
    b.attention.kv_slots = inputs_.rows(off_kv_slots(), capacity_);
    return b;
  }

  // Replays the graph of `shape` on the staged inputs, recording it first
  // if it is new: `step` runs the wrapped model or head on the static batch
  // once directly (which loads kernels and makes the backend's plans outside
  // the recording; its KV writes are the ones the replay repeats), then
  // inside the recording. False when the backend cannot record (the direct
  // run stands).
  bool replay(const Shape& shape, KvBuffers& kv, const std::function<void(const ForwardBatch&, KvBuffers&)>& step) {
    auto it = graphs_.find(shape);
    if (it == graphs_.end()) {
      const ForwardBatch padded = device_batch(shape);
      step(padded, kv);
      // The ops are enqueued once, here; what they read is captured by value
      // (as handles) for a backend whose replay re-runs them.
      KvBuffers* storage = &kv;
      std::unique_ptr<RecordedOps> graph = backend_.record([step, padded, storage] { step(padded, *storage); });
      if (graph == nullptr) {
        unsupported_ = true;
        ++stats_.direct;
        return false;
      }
      ++stats_.recordings;
      it = graphs_.emplace(shape, std::move(graph)).first;
    }
    it->second->replay();
    ++stats_.replays;
    return true;
  }

  bool recorded(const Shape& shape) const { return graphs_.count(shape) != 0; }
  void drop() { graphs_.clear(); }

  // Allocates the static inputs on first use and drops the graphs when the
  // KV storage changes (they point at every layer's K and V memory, and a
  // backend that replays by re-running the step reads the KvBuffers object
  // itself: a new one at the address of K and V memory freed before, as the
  // next engine on this model may get, is a change too).
  void bind(KvBuffers& kv) {
    std::vector<const void*> key{&kv};
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
  }

 private:
  // Offsets of the static input arrays (i32 elements) in inputs_.
  int64_t off_ids() const { return 0; }
  int64_t off_positions() const { return options_.max_batch; }
  int64_t off_out_slots() const { return 2 * int64_t{options_.max_batch}; }
  int64_t off_logit_rows() const { return 3 * int64_t{options_.max_batch}; }
  int64_t off_q_start() const { return 4 * int64_t{options_.max_batch}; }
  int64_t off_kv_start() const { return 5 * int64_t{options_.max_batch} + 1; }
  int64_t off_kv_slots() const { return 6 * int64_t{options_.max_batch} + 2; }

  Backend& backend_;
  GraphOptions options_;
  LogitRows logit_rows_;
  bool unsupported_;  // the backend cannot record: every batch runs directly
  std::vector<const void*> kv_key_;  // the KvBuffers, then the K and V memory, the graphs were recorded on
  int64_t kv_slots_ = 0;
  int64_t capacity_ = 0;
  Tensor inputs_, staging_;
  std::map<Shape, std::unique_ptr<RecordedOps>> graphs_;
  GraphStats stats_;
};

// A draft head whose drafting steps replay recorded graphs (see the header).
class GraphedHead final : public DraftHead {
 public:
  GraphedHead(DraftHead& head, Backend& backend, const GraphOptions& options, int64_t hidden_size, int64_t vocab)
      : head_(head), backend_(backend), options_(options), recorder_(backend, options, LogitRows::kOnePerSequence),
        hidden_size_(hidden_size), vocab_(vocab) {}

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override { return head_.allocate_kv(num_slots, dtype); }
  size_t kv_bytes_per_slot(DType dtype) const override { return head_.kv_bytes_per_slot(dtype); }

  void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
               Tensor* hidden_out) override {
    if (!recorder_.accepts(batch, kv) || hidden.device() != backend_.device() ||
        (!options_.record_on_demand && !recorder_.recorded(recorder_.shape_of(batch, hidden_out != nullptr)))) {
      ++recorder_.stats().direct;
      head_.forward(batch, hidden, kv, logits, hidden_out);
      return;
    }
    allocate();
    const int64_t t = batch.num_tokens(), wanted = batch.logit_rows.numel();
    const Shape shape = recorder_.shape_of(batch, hidden_out != nullptr);
    recorder_.stage(batch, shape);
    Tensor in = hidden_in_.rows(0, t);
    backend_.copy(hidden, in);
    const int64_t padded_t = int64_t{shape.size} * shape.rows;
    const Tensor states_in = hidden_in_.rows(0, padded_t);
    Tensor out_logits = logits_.rows(0, shape.every ? padded_t : shape.size);
    Tensor states_out = shape.hidden ? hidden_out_.rows(0, padded_t) : Tensor();
    const bool with_hidden = shape.hidden;
    DraftHead* head = &head_;
    const bool replayed = recorder_.replay(
        shape, kv, [head, states_in, out_logits, states_out, with_hidden](const ForwardBatch& b, KvBuffers& k) mutable {
          head->forward(b, states_in, k, out_logits, with_hidden ? &states_out : nullptr);
        });
    (void)replayed;  // without recording, the direct run inside replay() wrote the outputs
    const Tensor first = logits_.rows(0, wanted);
    backend_.copy(first, logits);
    if (hidden_out != nullptr) {
      const Tensor states = hidden_out_.rows(0, t);
      backend_.copy(states, *hidden_out);
    }
  }

  const GraphStats& stats() const { return recorder_.stats(); }

 private:
  void allocate() {
    if (hidden_in_.raw() != nullptr) return;
    hidden_in_ = backend_.empty({options_.max_batch, hidden_size_}, DType::kF32);
    const Tensor zeros = Tensor::from_f32({options_.max_batch, hidden_size_},
                                          std::vector<float>(static_cast<size_t>(options_.max_batch * hidden_size_)));
    backend_.copy(zeros, hidden_in_);  // padding rows read it: finite values
    hidden_out_ = backend_.empty({options_.max_batch, hidden_size_}, DType::kF32);
    logits_ = backend_.empty({options_.max_batch, vocab_}, DType::kF32);
  }

  DraftHead& head_;
  Backend& backend_;
  GraphOptions options_;
  Recorder recorder_;
  int64_t hidden_size_, vocab_;
  Tensor hidden_in_, hidden_out_, logits_;  // static: [max_batch, H], [max_batch, H], [max_batch, vocab] f32
};

class GraphedModel final : public Model {
 public:
  GraphedModel(std::unique_ptr<Model> model, Backend& backend, const GraphOptions& options)
      : model_(std::move(model)), backend_(backend), options_(options), recorder_(backend, options, LogitRows::kEvery) {
    BASALT_CHECK(options_.max_batch >= 1 && options_.max_batch <= 4096,
                 "graphed model: max_batch {} out of [1, 4096]", options_.max_batch);
    BASALT_CHECK(options_.kv_capacity >= 0, "graphed model: kv_capacity {} < 0", options_.kv_capacity);
    if (DraftHead* head = model_->draft_head())
      head_ = std::make_unique<GraphedHead>(*head, backend, options_, config().hidden_size, config().vocab_size);
  }

  const ModelConfig& config() const override { return model_->config(); }
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    return model_->allocate_kv(num_slots, dtype);
  }
  size_t kv_bytes_per_slot(DType dtype) const override { return model_->kv_bytes_per_slot(dtype); }
  std::string summary() const override { return model_->summary(); }
  // The recorded steps copy the ids in on the device; the others run the model's own forward.
  bool takes_device_token_ids() const override { return model_->takes_device_token_ids(); }

  DraftHead* draft_head() override { return head_.get(); }

  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    if (!recorder_.accepts(batch, kv) ||
        (!options_.record_on_demand && !recorder_.recorded(recorder_.shape_of(batch, hidden != nullptr)))) {
      ++recorder_.stats().direct;
      model_->forward(batch, kv, logits, hidden);
      return;
    }
    const int64_t t = batch.num_tokens();
    const Shape shape = recorder_.shape_of(batch, hidden != nullptr);
    recorder_.stage(batch, shape);
    run(shape, kv);
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
    if (recorder_.unsupported()) return;
    recorder_.bind(kv);
    if (!options_.record_on_demand) recorder_.drop();  // its caller records every rank afresh
    std::set<int> sizes;
    for (int64_t t = 1; t <= options_.max_batch; ++t) sizes.insert(graph_padded_size(t, options_.max_batch));
    for (const int size : sizes) {
      const Shape shape{size, 1, false, true};
      if (recorder_.recorded(shape)) continue;
      ForwardBatch empty;
      empty.token_ids = Tensor::empty({0}, DType::kI32);
      empty.positions = empty.out_slots = empty.logit_rows = empty.attention.kv_slots = empty.token_ids;
      empty.attention.q_start = empty.attention.kv_start = Tensor::from_i32({1}, std::vector<int32_t>{0});
      recorder_.stage(empty, shape);
      if (!run(shape, kv)) return;
    }
  }

  GraphStats stats() const {
    GraphStats s = recorder_.stats();
    if (head_ != nullptr) {
      s.head_replays = head_->stats().replays;
      s.head_direct = head_->stats().direct;
      s.head_recordings = head_->stats().recordings;
    }
    return s;
  }

 private:
  // Replays (recording first if new) the step of `shape` on the staged inputs.
  bool run(const Shape& shape, KvBuffers& kv) {
    allocate(shape.hidden);
    const int64_t t = int64_t{shape.size} * shape.rows;
    Tensor out = logits_.rows(0, t);
    Tensor states = shape.hidden ? hidden_.rows(0, t) : Tensor();
    const bool with_hidden = shape.hidden;
    Model* model = model_.get();
    return recorder_.replay(shape, kv, [model, out, states, with_hidden](const ForwardBatch& b, KvBuffers& k) mutable {
      model->forward(b, k, out, with_hidden ? &states : nullptr);
    });
  }

  void allocate(bool hidden) {
    if (logits_.raw() == nullptr) logits_ = backend_.empty({options_.max_batch, config().vocab_size}, DType::kF32);
    if (hidden && hidden_.raw() == nullptr)
      hidden_ = backend_.empty({options_.max_batch, config().hidden_size}, DType::kF32);
  }

  std::unique_ptr<Model> model_;
  Backend& backend_;
  GraphOptions options_;
  Recorder recorder_;
  Tensor logits_;  // [max_batch, vocab] f32
  Tensor hidden_;  // [max_batch, hidden_size] f32, once a step wants hidden states
  std::unique_ptr<GraphedHead> head_;  // the wrapped model's draft head, graphed too
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
