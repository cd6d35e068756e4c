#include "model/dense.h"

#include <cmath>
#include <cstring>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/eagle_head.h"
#include "model/quantize.h"
#include "model/rope.h"
#include "model/tp_shard.h"

namespace basalt {
namespace {

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  LinearWeight qkv_proj, o_proj;  // q, k and v projections stacked: [(Hq + 2 Hkv) D, H]
  Tensor qkv_bias, o_bias;  // undefined when absent
  Tensor q_norm, k_norm;                  // Qwen3
  LinearWeight gate_up_proj, down_proj;
  Tensor gate_up_bias, down_bias;
};

// Concatenates tensors of one dtype along dimension 0 on the host.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  BASALT_ASSERT(!parts.empty());
  Shape shape = parts[0].shape();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    BASALT_ASSERT(p.dtype() == parts[0].dtype() && p.rank() == parts[0].rank());
    rows += p.dim(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  char* dst = out.data<char>();
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

class DenseModel final : public Model {
 public:
  // `target` (EAGLE heads only, may be null): the checkpoint of the model
  // the head drafts for, whose embedding and lm_head the head uses where it
  // stores none of its own. `tp` (may be null: one rank): the tensor-parallel
  // group this rank belongs to (dense.h says what each rank holds).
  DenseModel(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend, const Checkpoint* target = nullptr,
             Communicator* tp = nullptr)
      : config_(config), backend_(backend), tp_(tp) {
    const ModelConfig& c = config_;
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    const int64_t q_out = c.num_heads * D, kv_out = c.num_kv_heads * D;
    plan_shards();
    const int64_t rank = tp_ != nullptr ? tp_->rank() : 0;

    const std::string embed_name = "model.embed_tokens.weight";
    const bool shared = c.eagle_head && target != nullptr;
    if (world_ == 1) {
      embed_tokens_ = weight(shared && !ckpt.has(embed_name) ? *target : ckpt, embed_name, {c.vocab_size, H});
    } else {
      // This rank's vocabulary rows and a zero row (model/tp_shard.h).
      const Tensor all = ckpt.get(embed_name, {c.vocab_size, H});
      check_dense_dtype(ckpt, embed_name, all);
      embed_tokens_ = to_backend(tp::vocab_shard(all, vocab_begin_, vocab_local_));
    }
    if (c.eagle_head) {
      eagle_fc_ = weight(ckpt, "eagle.fc.weight", {H, 2 * H});
      eagle_fc_bias_ = bias(ckpt, "eagle.fc.bias", H);
    }
    final_norm_ = weight(ckpt, "model.norm.weight", {H});
    const bool int_weights = c.int_weights.bits != 0;
    BASALT_CHECK(!int_weights || world_ == 1,
                 "{}: int{} weights run on one rank; tensor parallelism over them is not supported yet", ckpt.dir(),
                 c.int_weights.bits);
    if (c.tie_word_embeddings) {
      lm_head_ = embed_tokens_.rows(0, vocab_local_);
    } else if (int_weights) {
      lm_head_ = int_on_backend(read_int_linear(ckpt, "lm_head.weight", c.vocab_size, H, c));
    } else if (shared && !ckpt.has("lm_head.weight")) {
      // The target's lm_head, or its embedding where the two are tied.
      lm_head_ = weight(*target, target->has("lm_head.weight") ? "lm_head.weight" : embed_name, {c.vocab_size, H});
    } else {
      lm_head_ = sharded_rows(ckpt, "lm_head.weight", {c.vocab_size, H}, vocab_begin_, vocab_local_);
    }

    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights& w = layers_[static_cast<size_t>(l)];
      w.input_norm = weight(ckpt, p + "input_layernorm.weight", {H});
      w.post_attention_norm = weight(ckpt, p + "post_attention_layernorm.weight", {H});
      // Column-parallel q/k/v: this rank's query heads and the key/value
      // heads they read; row-parallel o_proj: the matching input columns.
      const int64_t q_begin = rank * heads_ * D, kv_begin = kv_head_begin_ * D;
      if (int_weights) {
        const std::string a = p + "self_attn.";
        w.qkv_proj = int_on_backend(concat_int_rows({read_int_linear(ckpt, a + "q_proj.weight", q_out, H, c),
                                                     read_int_linear(ckpt, a + "k_proj.weight", kv_out, H, c),
                                                     read_int_linear(ckpt, a + "v_proj.weight", kv_out, H, c)}));
        w.o_proj = int_on_backend(read_int_linear(ckpt, p + "self_attn.o_proj.weight", H, q_out, c));
      } else {
        const Tensor q_w = ckpt.get(p + "self_attn.q_proj.weight", {q_out, H}).rows(q_begin, heads_ * D);
        const Tensor k_w = ckpt.get(p + "self_attn.k_proj.weight", {kv_out, H}).rows(kv_begin, kv_heads_ * D);
        const Tensor v_w = ckpt.get(p + "self_attn.v_proj.weight", {kv_out, H}).rows(kv_begin, kv_heads_ * D);
        BASALT_CHECK(q_w.dtype() == k_w.dtype() && q_w.dtype() == v_w.dtype(), "{}: q/k/v_proj dtypes differ", p);
        check_dense_dtype(ckpt, p + "self_attn.q_proj.weight", q_w);
        w.qkv_proj = rows_to_backend({q_w, k_w, v_w});
        w.o_proj = sharded_columns(ckpt, p + "self_attn.o_proj.weight", {H, q_out}, q_begin, heads_ * D);
      }
      if (c.qkv_bias) {
        w.qkv_bias = to_backend(
            concat_rows({ckpt.get(p + "self_attn.q_proj.bias", {q_out}).rows(q_begin, heads_ * D).to_f32(),
                         ckpt.get(p + "self_attn.k_proj.bias", {kv_out}).rows(kv_begin, kv_heads_ * D).to_f32(),
                         ckpt.get(p + "self_attn.v_proj.bias", {kv_out}).rows(kv_begin, kv_heads_ * D).to_f32()}));
      }
      // A row-parallel layer's bias is added once: by rank 0, before the sum.
      if (c.o_bias && rank == 0) w.o_bias = bias(ckpt, p + "self_attn.o_proj.bias", H);
      if (c.o_bias && rank != 0) (void)ckpt.get(p + "self_attn.o_proj.bias", {H});
      if (c.qk_norm) {
        w.q_norm = weight(ckpt, p + "self_attn.q_norm.weight", {D});
        w.k_norm = weight(ckpt, p + "self_attn.k_norm.weight", {D});
      }
      // Column-parallel gate and up (this rank's slice of each), row-parallel down.
      const int64_t i_begin = rank * intermediate_;
      if (int_weights) {
        const std::string m = p + "mlp.";
        w.gate_up_proj = int_on_backend(concat_int_rows({read_int_linear(ckpt, m + "gate_proj.weight", I, H, c),
                                                         read_int_linear(ckpt, m + "up_proj.weight", I, H, c)}));
        w.down_proj = int_on_backend(read_int_linear(ckpt, p + "mlp.down_proj.weight", H, I, c));
      } else {
        const Tensor gate = ckpt.get(p + "mlp.gate_proj.weight", {I, H}).rows(i_begin, intermediate_);
        const Tensor up = ckpt.get(p + "mlp.up_proj.weight", {I, H}).rows(i_begin, intermediate_);
        BASALT_CHECK(gate.dtype() == up.dtype(), "{}: gate_proj and up_proj dtypes differ", p);
        check_dense_dtype(ckpt, p + "mlp.gate_proj.weight", gate);
        w.gate_up_proj = rows_to_backend({gate, up});
        w.down_proj = sharded_columns(ckpt, p + "mlp.down_proj.weight", {H, I}, i_begin, intermediate_);
      }
      if (c.mlp_bias) {
        const Tensor gate_b = ckpt.get(p + "mlp.gate_proj.bias", {I}).rows(i_begin, intermediate_).to_f32();
        const Tensor up_b = ckpt.get(p + "mlp.up_proj.bias", {I}).rows(i_begin, intermediate_).to_f32();
        w.gate_up_bias = to_backend(concat_rows({gate_b, up_b}));
        if (rank == 0) {
          w.down_bias = bias(ckpt, p + "mlp.down_proj.bias", H);
        } else {
          (void)ckpt.get(p + "mlp.down_proj.bias", {H});
        }
      }
    }

    const RopeFrequencies rope = rope_frequencies(c.rope_scaling, c.rope_theta, c.rotary_dim,
                                                  c.max_position_embeddings);
    inv_freq_ = to_backend(Tensor::from_f32({static_cast<int64_t>(rope.inv_freq.size())}, rope.inv_freq));
    rope_scaling_ = rope.attention_scaling;
  }

  const ModelConfig& config() const override { return config_; }

  size_t kv_bytes_per_slot(DType dtype) const override {
    return static_cast<size_t>(2 * config_.num_layers * kv_heads_ * config_.head_dim) * dtype_size(dtype);
  }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    KvBuffers kv;
    kv.num_slots = num_slots;
    const int64_t width = kv_heads_ * config_.head_dim;
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      kv.k.push_back(backend_.empty({num_slots, width}, dtype));
      kv.v.push_back(backend_.empty({num_slots, width}, dtype));
    }
    return kv;
  }

  bool takes_device_token_ids() const override { return world_ == 1; }
  using Model::forward;
  void forward(const ForwardBatch& host_batch, KvBuffers& kv, Tensor& logits, Tensor* hidden_out) override {
    if (world_ == 1) {
      const ForwardBatch batch = on_backend(host_batch, backend_);
      const int64_t T = batch.num_tokens();
      BASALT_CHECK(T > 0, "forward: empty batch");
      Tensor residual = backend_.empty({T, config_.hidden_size}, DType::kF32);
      backend_.embedding(batch.token_ids, embed_tokens_, residual);
      run(batch, residual, kv, logits, hidden_out, /*hidden_before_norm=*/false);
      return;
    }
    // Vocabulary-parallel embedding (model/tp_shard.h): the sum over ranks
    // of their lookups.
    const int64_t T = host_batch.num_tokens();
    BASALT_CHECK(T > 0, "forward: empty batch");
    ForwardBatch local = host_batch;
    local.token_ids = tp::local_vocab_ids(host_batch.token_ids, vocab_begin_, vocab_local_, config_.vocab_size);
    const ForwardBatch batch = on_backend(local, backend_);
    Tensor residual = backend_.empty({T, config_.hidden_size}, DType::kF32);
    backend_.embedding(batch.token_ids, embed_tokens_, residual);
    tp_->all_reduce(residual);
    run(batch, residual, kv, logits, hidden_out, /*hidden_before_norm=*/false);
  }

  // The EAGLE head's step (eagle_head.h): the layers start from
  // fc([embedding(token), hidden]) and the hidden states handed back are
  // the last layer's output before the final norm.
  void forward_eagle(const ForwardBatch& host_batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                     Tensor* hidden_out) {
    BASALT_CHECK(config_.eagle_head, "forward_eagle: not an EAGLE head");
    const ForwardBatch batch = on_backend(host_batch, backend_);
    const int64_t T = batch.num_tokens(), H = config_.hidden_size;
    BASALT_CHECK(T > 0, "forward_eagle: empty batch");
    BASALT_CHECK(hidden.dtype() == DType::kF32 && hidden.rank() == 2 && hidden.dim(0) == T && hidden.dim(1) == H,
                 "forward_eagle: hidden must be f32 [{}, {}], got {}", T, H, hidden.describe());
    Backend& b = backend_;
    Tensor emb = b.empty({T, H}, DType::kF32), cat = b.empty({T, 2 * H}, DType::kF32);
    b.embedding(batch.token_ids, embed_tokens_, emb);
    b.concat_columns(emb, hidden, cat);
    Tensor residual = b.empty({T, H}, DType::kF32);
    b.linear(cat, eagle_fc_, &eagle_fc_bias_, residual);
    run(batch, residual, kv, logits, hidden_out, /*hidden_before_norm=*/true);
  }

 private:
  // The decoder layers over `residual` (f32 [T, H], the first layer's
  // input), the final norm, and lm_head for batch.logit_rows; hidden_out
  // (optional, f32 [T, H]) gets the final hidden states after the final
  // norm, or before it when hidden_before_norm.
  void run(const ForwardBatch& batch, Tensor& residual, KvBuffers& kv, Tensor& logits, Tensor* hidden_out,
           bool hidden_before_norm) {
    const ModelConfig& c = config_;
    const int64_t T = batch.num_tokens();
    const int64_t H = c.hidden_size, D = c.head_dim;
    BASALT_CHECK(static_cast<int64_t>(kv.k.size()) == c.num_layers, "forward: KV buffers have {} layers, model has {}", kv.k.size(), c.num_layers);
    Backend& b = backend_;

    // Activations that only feed linear layers take the backend's activation
    // dtype (bf16 on the GPU); the residual stream, projections and logits are f32.
    const DType act_dtype = b.activation_dtype(layers_[0].gate_up_proj.weight.dtype());
    Tensor hidden = b.empty({T, H}, act_dtype);
    Tensor qkv = b.empty({T, (heads_ + 2 * kv_heads_) * D}, DType::kF32);
    Tensor q = b.empty({T, heads_ * D}, DType::kF32);
    Tensor attn = b.empty({T, heads_ * D}, DType::kF32);
    Tensor gate_up = b.empty({T, 2 * intermediate_}, DType::kF32);
    Tensor act = b.empty({T, intermediate_}, act_dtype);
    Tensor block_out = b.empty({T, H}, DType::kF32);

    const RopeParams rope{static_cast<int>(heads_), static_cast<int>(D), static_cast<int>(c.rotary_dim),
                          RopeStyle::kRotateHalf, &inv_freq_, rope_scaling_};
    AttentionParams attn_params{static_cast<int>(heads_), static_cast<int>(kv_heads_),
                                static_cast<int>(D), static_cast<int>(D),
                                static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), 0};
    const float eps = static_cast<float>(c.rms_norm_eps);

    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& w = layers_[static_cast<size_t>(l)];
      Tensor& k_cache = kv.k[static_cast<size_t>(l)];
      Tensor& v_cache = kv.v[static_cast<size_t>(l)];
      if (l == 0) {
        b.rms_norm(residual, w.input_norm, eps, hidden);
      } else {
        b.add_rms_norm(residual, block_out, w.input_norm, eps, hidden);
      }
      lin(hidden, w.qkv_proj, opt(w.qkv_bias), qkv);
      b.qkv_rope_store(qkv, c.qk_norm ? &w.q_norm : nullptr, c.qk_norm ? &w.k_norm : nullptr, eps,
                       batch.positions, rope, static_cast<int>(heads_), static_cast<int>(kv_heads_),
                       batch.out_slots, k_cache, v_cache, q);
      attn_params.sliding_window = c.sliding_window_per_layer[static_cast<size_t>(l)];
      b.attention(q, k_cache, v_cache, batch.attention, attn_params, attn);
      lin(attn, w.o_proj, opt(w.o_bias), block_out);
      if (tp_ != nullptr) tp_->all_reduce(block_out);
      b.add_rms_norm(residual, block_out, w.post_attention_norm, eps, hidden);
      lin(hidden, w.gate_up_proj, opt(w.gate_up_bias), gate_up);
      b.silu_and_mul(gate_up, act);
      lin(act, w.down_proj, opt(w.down_bias), block_out);
      if (tp_ != nullptr) tp_->all_reduce(block_out);
    }
    const int64_t L = batch.logit_rows.numel();
    BASALT_CHECK(logits.rank() == 2 && logits.dim(0) == L && logits.dim(1) == c.vocab_size,
                 "forward: logits must be f32 [{}, {}], got {}", L, c.vocab_size, logits.describe());
    if (hidden_out != nullptr) {
      BASALT_CHECK(hidden_out->dtype() == DType::kF32 && hidden_out->rank() == 2 && hidden_out->dim(0) == T &&
                       hidden_out->dim(1) == H,
                   "forward: hidden must be f32 [{}, {}], got {}", T, H, hidden_out->describe());
    }
    if (hidden_out != nullptr && !hidden_before_norm) {
      // The final hidden states go out in f32; lm_head reads the same rows.
      b.add_rms_norm(residual, block_out, final_norm_, eps, *hidden_out);
      Tensor selected = b.empty({L, H}, DType::kF32);
      b.embedding(batch.logit_rows, *hidden_out, selected);
      lm_head(selected, logits);
      return;
    }
    b.add_rms_norm(residual, block_out, final_norm_, eps, hidden);  // residual now holds the last layer's output
    if (hidden_out != nullptr) b.copy(residual, *hidden_out);
    Tensor selected = b.empty({L, H}, act_dtype);
    b.embedding(batch.logit_rows, hidden, selected);  // gathers the wanted rows
    lm_head(selected, logits);
  }

  // logits [L, vocab] = selected [L, H] times lm_head; with several ranks
  // each computes its vocabulary columns and the all-gather puts them side
  // by side (on the host: the ranks run on the CPU backend for now).
  void lm_head(const Tensor& selected, Tensor& logits) {
    if (world_ == 1) {
      lin(selected, lm_head_, nullptr, logits);
      return;
    }
    Tensor part = backend_.empty({selected.dim(0), vocab_local_}, DType::kF32);
    lin(selected, lm_head_, nullptr, part);
    tp::gather_vocab_columns(*tp_, backend_, part, logits);
  }

  // What this rank holds of the model: heads, key/value heads, MLP columns
  // and vocabulary rows; everything when there is one rank. The checks name
  // the config field that does not divide.
  void plan_shards() {
    const ModelConfig& c = config_;
    world_ = tp_ != nullptr ? tp_->world_size() : 1;
    const int64_t rank = tp_ != nullptr ? tp_->rank() : 0;
    heads_ = c.num_heads;
    kv_heads_ = c.num_kv_heads;
    intermediate_ = c.intermediate_size;
    vocab_local_ = c.vocab_size;
    if (world_ == 1) return;
    const int64_t n = world_;
    BASALT_CHECK(!c.eagle_head, "an EAGLE head runs on one rank, not {}", n);
    tp::check_divides(n, c.num_heads, "num_attention_heads");
    BASALT_CHECK(c.num_kv_heads % n == 0 || n % c.num_kv_heads == 0,
                 "tensor parallelism over {} ranks: num_key_value_heads ({}) must divide by it or divide it", n,
                 c.num_kv_heads);
    tp::check_divides(n, c.intermediate_size, "intermediate_size");
    tp::check_divides(n, c.vocab_size, "vocab_size");
    heads_ = c.num_heads / n;
    // Fewer key/value heads than ranks: each rank keeps the one its query
    // heads read, so a head is held by n / num_kv_heads ranks (as vLLM does).
    kv_heads_ = c.num_kv_heads >= n ? c.num_kv_heads / n : 1;
    kv_head_begin_ = c.num_kv_heads >= n ? rank * kv_heads_ : rank / (n / c.num_kv_heads);
    intermediate_ = c.intermediate_size / n;
    vocab_local_ = c.vocab_size / n;
    vocab_begin_ = rank * vocab_local_;
  }

  Tensor sharded_rows(const Checkpoint& ckpt, const std::string& name, Shape shape, int64_t begin, int64_t count) {
    const Tensor t = ckpt.get(name, shape);
    check_dense_dtype(ckpt, name, t);
    return to_backend(t.rows(begin, count));
  }
  Tensor sharded_columns(const Checkpoint& ckpt, const std::string& name, Shape shape, int64_t begin,
                         int64_t count) {
    const Tensor t = ckpt.get(name, shape);
    check_dense_dtype(ckpt, name, t);
    return to_backend(world_ == 1 ? t : tp::columns(t, begin, count));
  }

  static const Tensor* opt(const Tensor& t) { return t.raw() ? &t : nullptr; }

  // out = x · wᵀ (+ bias) for a weight of any format.
  void lin(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) {
    if (w.int_quantized()) {
      backend_.linear_int(x, w, bias, out);
    } else {
      backend_.linear(x, w.weight, bias, out);
    }
  }

  // An integer-format weight for this backend, refused by one without the kernels.
  LinearWeight int_on_backend(LinearWeight host) {
    BASALT_CHECK(backend_.supports(BackendOp::kLinearInt),
                 "int{} weights run on the CPU backend only; the {} backend has no integer kernels (use --device cpu)",
                 host.int_layout.bits, backend_.name());
    host.weight = to_backend(host.weight);
    host.scales = to_backend(host.scales);
    backend_.prepare_int_weight(host);
    return host;
  }
  // Integer-format weights of one layout stacked by rows (fused q/k/v, gate/up).
  static LinearWeight concat_int_rows(const std::vector<LinearWeight>& parts) {
    LinearWeight out;
    out.int_layout = parts.at(0).int_layout;
    std::vector<Tensor> codes, scales;
    for (const LinearWeight& p : parts) {
      codes.push_back(p.weight);
      scales.push_back(p.scales);
    }
    out.weight = concat_rows(codes);
    out.scales = concat_rows(scales);
    return out;
  }

  Tensor to_backend(const Tensor& host) {
    if (backend_.device() == Device::kCpu) return host;
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.copy(host, t);
    return t;
  }
  // The parts stacked along dimension 0 on the backend. A device's tensor is
  // filled part by part from the checkpoint's pages, with no host copy of the
  // whole (on the 8B shape, 65% of the weights are fused q/k/v and gate/up).
  Tensor rows_to_backend(const std::vector<Tensor>& parts) {
    if (backend_.device() == Device::kCpu) return concat_rows(parts);
    BASALT_ASSERT(!parts.empty());
    Shape shape = parts[0].shape();
    shape[0] = 0;
    for (const Tensor& p : parts) {
      BASALT_ASSERT(p.dtype() == parts[0].dtype() && p.rank() == parts[0].rank());
      shape[0] += p.dim(0);
    }
    Tensor t = backend_.empty(shape, parts[0].dtype());
    int64_t row = 0;
    for (const Tensor& p : parts) {
      Tensor rows = t.rows(row, p.dim(0));
      backend_.copy(p, rows);
      row += p.dim(0);
    }
    return t;
  }
  static void check_dense_dtype(const Checkpoint& ckpt, const std::string& name, const Tensor& t) {
    BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
                 "{}: tensor '{}' has dtype {}; dense weights must be f32, bf16 or f16",
                 ckpt.info(name).file, name, dtype_name(t.dtype()));
  }
  Tensor weight(const Checkpoint& ckpt, const std::string& name, Shape shape) {
    Tensor t = ckpt.get(name, shape);
    check_dense_dtype(ckpt, name, t);
    return to_backend(t);
  }
  Tensor bias(const Checkpoint& ckpt, const std::string& name, int64_t n) {
    return to_backend(ckpt.get(name, {n}).to_f32());
  }

  ModelConfig config_;
  Backend& backend_;
  Communicator* tp_ = nullptr;  // null: one rank
  int64_t world_ = 1;
  int64_t heads_ = 0, kv_heads_ = 0, kv_head_begin_ = 0, intermediate_ = 0;  // this rank's
  int64_t vocab_begin_ = 0, vocab_local_ = 0;                                // this rank's vocabulary rows
  Tensor embed_tokens_, final_norm_, inv_freq_;
  LinearWeight lm_head_;
  Tensor eagle_fc_, eagle_fc_bias_;  // EAGLE heads only: [H, 2H] and f32 [H]
  float rope_scaling_ = 1.0f;
  std::vector<LayerWeights> layers_;
};

// The EAGLE head as a DraftHead (eagle_head.h): a one-layer DenseModel
// whose layers start from the fc projection.
class EagleHead final : public DraftHead {
 public:
  EagleHead(std::unique_ptr<DenseModel> model) : model_(std::move(model)) {}
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override { return model_->allocate_kv(num_slots, dtype); }
  size_t kv_bytes_per_slot(DType dtype) const override { return model_->kv_bytes_per_slot(dtype); }
  void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
               Tensor* hidden_out) override {
    model_->forward_eagle(batch, hidden, kv, logits, hidden_out);
  }

 private:
  std::unique_ptr<DenseModel> model_;
};

// A Model whose draft_head() is a head loaded beside it.
class ModelWithHead final : public Model {
 public:
  ModelWithHead(std::unique_ptr<Model> model, std::unique_ptr<DraftHead> head)
      : model_(std::move(model)), head_(std::move(head)) {}
  const ModelConfig& config() const override { return model_->config(); }
  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override { return model_->allocate_kv(num_slots, dtype); }
  size_t kv_bytes_per_slot(DType dtype) const override { return model_->kv_bytes_per_slot(dtype); }
  using Model::forward;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    model_->forward(batch, kv, logits, hidden);
  }
  DraftHead* draft_head() override { return head_.get(); }
  void prepare(KvBuffers& kv) override { model_->prepare(kv); }
  std::string summary() const override { return model_->summary(); }
  bool takes_device_token_ids() const override { return model_->takes_device_token_ids(); }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<DraftHead> head_;
};

}  // namespace

std::unique_ptr<DraftHead> load_eagle_head(const std::string& dir, Backend& backend, const std::string& target_dir) {
  const ModelConfig config = ModelConfig::load(dir);
  const ModelConfig target = ModelConfig::load(target_dir);
  BASALT_CHECK(config.eagle_head, "{}: not an EAGLE draft head (config.json has no \"basalt_eagle_head\": true)",
               dir);
  BASALT_CHECK(config.architecture == Architecture::kLlama, "{}: an EAGLE head has the llama layout, not '{}'", dir,
               config.model_type);
  BASALT_CHECK(config.num_layers >= 1, "{}: an EAGLE head needs at least one layer", dir);
  BASALT_CHECK(config.hidden_size == target.hidden_size,
               "{}: the head's hidden_size ({}) differs from the model's ({})", dir, config.hidden_size,
               target.hidden_size);
  BASALT_CHECK(config.vocab_size == target.vocab_size,
               "{}: the head's vocab_size ({}) differs from the model's ({})", dir, config.vocab_size,
               target.vocab_size);
  Checkpoint checkpoint = Checkpoint::open(dir);
  const Checkpoint target_checkpoint = Checkpoint::open(target_dir);
  auto model = std::make_unique<DenseModel>(config, checkpoint, backend, &target_checkpoint);
  const std::vector<std::string> unused = checkpoint.unused();
  BASALT_CHECK(unused.empty(), "{}: {} tensor(s) of the head are not used (first: '{}')", dir, unused.size(),
               unused.empty() ? std::string() : unused[0]);
  return std::make_unique<EagleHead>(std::move(model));
}

std::unique_ptr<Model> with_draft_head(std::unique_ptr<Model> model, std::unique_ptr<DraftHead> head) {
  return std::make_unique<ModelWithHead>(std::move(model), std::move(head));
}

std::unique_ptr<Model> load_dense_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                        Backend& backend, Communicator* tp) {
  return std::make_unique<DenseModel>(config, checkpoint, backend, nullptr, tp);
}

}  // namespace basalt
