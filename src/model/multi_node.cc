#include "model/multi_node.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/node_link.h"
#include "core/error.h"
#include "model/tensor_parallel.h"

namespace basalt {
namespace {

// The calls the leader sends, one byte each, then their arguments.
enum class Call : uint8_t { kForward = 1, kAllocateKv, kPrepare, kHeadAllocateKv, kHeadForward, kStop };

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  // An i32 tensor, copied to the host by `backend` where it is on a device
  // (a chained draft's token ids).
  void ids(const Tensor& t, Backend& backend) {
    BASALT_CHECK(t.dtype() == DType::kI32, "multi-node: batch tensors are i32, got {}", t.describe());
    Tensor host = t;
    if (t.device() != Device::kCpu) {
      host = Tensor::empty(t.shape(), t.dtype());
      backend.copy(t, host);
    }
    i64(host.numel());
    out_.append(static_cast<const char*>(host.raw()), host.nbytes());
  }
  void batch(const ForwardBatch& b, Backend& backend) {
    u8(static_cast<uint8_t>(b.mode));
    for (const Tensor* t : {&b.token_ids, &b.positions, &b.out_slots, &b.attention.q_start, &b.attention.kv_start,
                            &b.attention.kv_slots, &b.logit_rows})
      ids(*t, backend);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(in_[at_++]);
  }
  DType kv_dtype() {
    const uint8_t v = u8();
    BASALT_CHECK(v <= static_cast<uint8_t>(DType::kF8E4M3), "multi-node: a malformed call (KV dtype {})", v);
    return static_cast<DType>(v);
  }
  int64_t i64() {
    int64_t v;
    need(sizeof v);
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  Tensor ids() {
    const int64_t n = i64();
    BASALT_CHECK(n >= 0 && static_cast<uint64_t>(n) <= (in_.size() - at_) / 4,
                 "multi-node: a malformed call from the leader (a tensor of {} values)", n);
    std::vector<int32_t> values(static_cast<size_t>(n));
    if (n > 0) std::memcpy(values.data(), in_.data() + at_, static_cast<size_t>(n) * 4);
    at_ += static_cast<size_t>(n) * 4;
    return Tensor::from_i32({n}, values);
  }
  ForwardBatch batch() {
    ForwardBatch b;
    const uint8_t mode = u8();
    BASALT_CHECK(mode <= static_cast<uint8_t>(ForwardMode::kDraft), "multi-node: a malformed call (mode {})", mode);
    b.mode = static_cast<ForwardMode>(mode);
    for (Tensor* t : {&b.token_ids, &b.positions, &b.out_slots, &b.attention.q_start, &b.attention.kv_start,
                      &b.attention.kv_slots, &b.logit_rows})
      *t = ids();
    return b;
  }

 private:
  void need(size_t n) const {
    BASALT_CHECK(n <= in_.size() - at_, "multi-node: a malformed call from the leader (short by {} bytes)",
                 n - (in_.size() - at_));
  }
  const std::string& in_;
  size_t at_ = 0;
};

// The key of a KV allocation: its first tensor's memory.
const void* key_of(const KvBuffers& kv) { return kv.k.empty() ? nullptr : kv.k.front().raw(); }

class MultiNodeLeader final : public Model {
 public:
  MultiNodeLeader(std::unique_ptr<NodeLink> link, std::unique_ptr<Model> local, Backend& backend)
      : link_(std::move(link)), local_(std::move(local)), backend_(backend) {
    BASALT_CHECK(link_->node_rank() == 0, "multi-node: node {} is not the leader", link_->node_rank());
  }

  ~MultiNodeLeader() override {
    try {
      Writer w;
      w.u8(static_cast<uint8_t>(Call::kStop));
      link_->exchange(w.str());
    } catch (const std::exception&) {
      // A broken link: the other nodes have stopped already (or will, when
      // they find it broken).
    }
  }

  const ModelConfig& config() const override { return local_->config(); }
  size_t kv_bytes_per_slot(DType dtype) const override { return local_->kv_bytes_per_slot(dtype); }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    return allocate_everywhere(Call::kAllocateKv, num_slots, dtype, model_kv_,
                               [&] { return local_->allocate_kv(num_slots, dtype); });
  }

  void prepare(KvBuffers& kv) override {
    check_live(kv, model_kv_, "prepare");
    Writer w;
    w.u8(static_cast<uint8_t>(Call::kPrepare));
    run(w, [&] { local_->prepare(kv); });
  }

  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    check_live(kv, model_kv_, "forward");
    check_tensor_parallel_forward(*local_, batch, kv, logits, hidden);
    Writer w;
    w.u8(static_cast<uint8_t>(Call::kForward));
    w.batch(batch, backend_);
    run(w, [&] { local_->forward(batch, kv, logits, hidden); });
  }

  DraftHead* draft_head() override { return local_->draft_head() != nullptr ? &head_ : nullptr; }

  std::string summary() const override {
    return fmt::format("over {} nodes (this is node 0, the leader): {}", link_->nnodes(), local_->summary());
  }

 private:
  class Head final : public DraftHead {
   public:
    explicit Head(MultiNodeLeader& m) : m_(m) {}
    KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
      return m_.allocate_everywhere(Call::kHeadAllocateKv, num_slots, dtype, m_.head_kv_,
                                    [&] { return m_.local_->draft_head()->allocate_kv(num_slots, dtype); });
    }
    size_t kv_bytes_per_slot(DType dtype) const override {
      return m_.local_->draft_head()->kv_bytes_per_slot(dtype);
    }
    void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                 Tensor* hidden_out) override {
      m_.check_live(kv, m_.head_kv_, "the draft head's forward");
      check_tensor_parallel_head_forward(*m_.local_, batch, hidden, kv, logits, hidden_out);
      Writer w;
      w.u8(static_cast<uint8_t>(Call::kHeadForward));
      w.batch(batch, m_.backend_);
      m_.run(w, [&] { m_.local_->draft_head()->forward(batch, hidden, kv, logits, hidden_out); });
    }

   private:
    MultiNodeLeader& m_;
  };

  // The model's or its draft head's KV allocated on every node (`call`),
  // this node's by `allocate`; `live` becomes its key.
  template <typename Allocate>
  KvBuffers allocate_everywhere(Call call, int64_t num_slots, DType dtype, const void*& live,
                                Allocate allocate) const {
    Writer w;
    w.u8(static_cast<uint8_t>(call));
    w.i64(num_slots);
    w.u8(static_cast<uint8_t>(dtype));
    KvBuffers kv;
    run(w, [&] { kv = allocate(); });
    live = key_of(kv);
    return kv;
  }

  // Sends the call to the other nodes, runs this node's part, then learns
  // every node's outcome; the first failure (this node's first) is thrown.
  template <typename Body>
  void run(const Writer& call, Body body) const {
    link_->exchange(call.str());
    std::string mine;
    try {
      body();
    } catch (const std::exception& e) {
      mine = e.what();
    }
    const std::vector<std::string> outcomes = link_->exchange(mine);
    if (!mine.empty()) throw Error(mine);
    for (size_t k = 1; k < outcomes.size(); ++k)
      if (!outcomes[k].empty()) fail("node {}: {}", k, outcomes[k]);
  }

  void check_live(const KvBuffers& kv, const void* live, const char* what) const {
    BASALT_CHECK(key_of(kv) == live,
                 "multi-node {}: not the KV of the latest allocate_kv (over several nodes one allocation is live "
                 "at a time; the other nodes hold only theirs)",
                 what);
  }

  // Declared first: destroyed after local_, whose communicators use it.
  std::unique_ptr<NodeLink> link_;
  std::unique_ptr<Model> local_;
  Backend& backend_;  // its first rank's
  mutable const void* model_kv_ = nullptr;  // the live allocation's key, model and draft head
  mutable const void* head_kv_ = nullptr;
  Head head_{*this};
};

}  // namespace

std::unique_ptr<Model> make_multi_node_leader(std::unique_ptr<NodeLink> link, std::unique_ptr<Model> local,
                                              Backend& backend) {
  if (link->nnodes() == 1) return local;
  return std::make_unique<MultiNodeLeader>(std::move(link), std::move(local), backend);
}

void serve_multi_node_worker(NodeLink& link, Model& local, Backend& backend) {
  BASALT_CHECK(link.node_rank() > 0, "multi-node: the leader does not serve as a worker");
  const ModelConfig& config = local.config();
  KvBuffers kv, head_kv;
  for (;;) {
    const std::string call = link.exchange({})[0];
    Reader in(call);
    std::string error;
    try {
      switch (static_cast<Call>(in.u8())) {
        case Call::kStop:
          return;
        case Call::kAllocateKv: {
          const int64_t slots = in.i64();
          const DType dtype = in.kv_dtype();
          kv = KvBuffers();  // the earlier allocation goes first
          kv = local.allocate_kv(slots, dtype);
          break;
        }
        case Call::kPrepare:
          local.prepare(kv);
          break;
        case Call::kForward: {
          const ForwardBatch batch = in.batch();
          Tensor logits = backend.empty({batch.logit_rows.numel(), config.vocab_size}, DType::kF32);
          local.forward(batch, kv, logits, nullptr);
          break;
        }
        case Call::kHeadAllocateKv: {
          BASALT_CHECK(local.draft_head() != nullptr, "multi-node: this node's model has no draft head");
          const int64_t slots = in.i64();
          const DType dtype = in.kv_dtype();
          head_kv = KvBuffers();
          head_kv = local.draft_head()->allocate_kv(slots, dtype);
          break;
        }
        case Call::kHeadForward: {
          BASALT_CHECK(local.draft_head() != nullptr, "multi-node: this node's model has no draft head");
          const ForwardBatch batch = in.batch();
          // Its first rank's copy of the hidden states, which the head
          // overwrites with the leader's (a broadcast from rank 0).
          Tensor hidden = backend.empty({batch.num_tokens(), config.hidden_size}, DType::kF32);
          Tensor logits = backend.empty({batch.logit_rows.numel(), config.vocab_size}, DType::kF32);
          local.draft_head()->forward(batch, hidden, head_kv, logits, nullptr);
          break;
        }
        default:
          fail("multi-node: a malformed call from the leader (call {})", static_cast<int>(call.empty() ? 0 : call[0]));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    link.exchange(error);
  }
}

}  // namespace basalt
