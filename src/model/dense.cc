#include "model/dense.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/rope.h"

namespace basalt {
namespace {

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  Tensor q_proj, k_proj, v_proj, o_proj;
  Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when absent
  Tensor q_norm, k_norm;                  // Qwen3
  Tensor gate_up_proj, down_proj;
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
  DenseModel(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend)
      : config_(config), backend_(backend) {
    const ModelConfig& c = config_;
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    const int64_t q_out = c.num_heads * D, kv_out = c.num_kv_heads * D;

    embed_tokens_ = weight(ckpt, "model.embed_tokens.weight", {c.vocab_size, H});
    final_norm_ = weight(ckpt, "model.norm.weight", {H});
    if (c.tie_word_embeddings) {
      lm_head_ = embed_tokens_;
    } else {
      lm_head_ = weight(ckpt, "lm_head.weight", {c.vocab_size, H});
    }

    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights& w = layers_[static_cast<size_t>(l)];
      w.input_norm = weight(ckpt, p + "input_layernorm.weight", {H});
      w.post_attention_norm = weight(ckpt, p + "post_attention_layernorm.weight", {H});
      w.q_proj = weight(ckpt, p + "self_attn.q_proj.weight", {q_out, H});
      w.k_proj = weight(ckpt, p + "self_attn.k_proj.weight", {kv_out, H});
      w.v_proj = weight(ckpt, p + "self_attn.v_proj.weight", {kv_out, H});
      w.o_proj = weight(ckpt, p + "self_attn.o_proj.weight", {H, q_out});
      if (c.qkv_bias) {
        w.q_bias = bias(ckpt, p + "self_attn.q_proj.bias", q_out);
        w.k_bias = bias(ckpt, p + "self_attn.k_proj.bias", kv_out);
        w.v_bias = bias(ckpt, p + "self_attn.v_proj.bias", kv_out);
      }
      if (c.o_bias) w.o_bias = bias(ckpt, p + "self_attn.o_proj.bias", H);
      if (c.qk_norm) {
        w.q_norm = weight(ckpt, p + "self_attn.q_norm.weight", {D});
        w.k_norm = weight(ckpt, p + "self_attn.k_norm.weight", {D});
      }
      const Tensor gate = ckpt.get(p + "mlp.gate_proj.weight", {I, H});
      const Tensor up = ckpt.get(p + "mlp.up_proj.weight", {I, H});
      BASALT_CHECK(gate.dtype() == up.dtype(), "{}: gate_proj and up_proj dtypes differ", p);
      w.gate_up_proj = to_backend(concat_rows({gate, up}));
      w.down_proj = weight(ckpt, p + "mlp.down_proj.weight", {H, I});
      if (c.mlp_bias) {
        const Tensor gate_b = ckpt.get(p + "mlp.gate_proj.bias", {I}).to_f32();
        const Tensor up_b = ckpt.get(p + "mlp.up_proj.bias", {I}).to_f32();
        w.gate_up_bias = to_backend(concat_rows({gate_b, up_b}));
        w.down_bias = bias(ckpt, p + "mlp.down_proj.bias", H);
      }
    }

    const RopeFrequencies rope = rope_frequencies(c.rope_scaling, c.rope_theta, c.rotary_dim,
                                                  c.max_position_embeddings);
    inv_freq_ = to_backend(Tensor::from_f32({static_cast<int64_t>(rope.inv_freq.size())}, rope.inv_freq));
    rope_scaling_ = rope.attention_scaling;
  }

  const ModelConfig& config() const override { return config_; }

  size_t kv_bytes_per_slot(DType dtype) const override {
    return static_cast<size_t>(2 * config_.num_layers * config_.num_kv_heads * config_.head_dim) *
           dtype_size(dtype);
  }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    KvBuffers kv;
    kv.num_slots = num_slots;
    const int64_t width = config_.num_kv_heads * config_.head_dim;
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      kv.k.push_back(backend_.empty({num_slots, width}, dtype));
      kv.v.push_back(backend_.empty({num_slots, width}, dtype));
    }
    return kv;
  }

  void forward(const ForwardBatch& host_batch, KvBuffers& kv, Tensor& logits) override {
    const ForwardBatch batch = on_backend(host_batch, backend_);
    const ModelConfig& c = config_;
    const int64_t T = batch.num_tokens();
    const int64_t H = c.hidden_size, D = c.head_dim;
    BASALT_CHECK(T > 0, "forward: empty batch");
    BASALT_CHECK(static_cast<int64_t>(kv.k.size()) == c.num_layers, "forward: KV buffers have {} layers, model has {}", kv.k.size(), c.num_layers);
    Backend& b = backend_;

    Tensor residual = b.empty({T, H}, DType::kF32);
    Tensor hidden = b.empty({T, H}, DType::kF32);
    Tensor q = b.empty({T, c.num_heads * D}, DType::kF32);
    Tensor k = b.empty({T, c.num_kv_heads * D}, DType::kF32);
    Tensor v = b.empty({T, c.num_kv_heads * D}, DType::kF32);
    Tensor attn = b.empty({T, c.num_heads * D}, DType::kF32);
    Tensor gate_up = b.empty({T, 2 * c.intermediate_size}, DType::kF32);
    Tensor act = b.empty({T, c.intermediate_size}, DType::kF32);
    Tensor block_out = b.empty({T, H}, DType::kF32);

    RopeParams q_rope{static_cast<int>(c.num_heads), static_cast<int>(D),
                      static_cast<int>(c.rotary_dim), RopeStyle::kRotateHalf, &inv_freq_,
                      rope_scaling_};
    RopeParams k_rope = q_rope;
    k_rope.num_heads = static_cast<int>(c.num_kv_heads);
    AttentionParams attn_params{static_cast<int>(c.num_heads), static_cast<int>(c.num_kv_heads),
                                static_cast<int>(D), static_cast<int>(D),
                                static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), 0};
    const float eps = static_cast<float>(c.rms_norm_eps);

    b.embedding(batch.token_ids, embed_tokens_, residual);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& w = layers_[static_cast<size_t>(l)];
      if (l == 0) {
        b.rms_norm(residual, w.input_norm, eps, hidden);
      } else {
        b.add_rms_norm(residual, block_out, w.input_norm, eps, hidden);
      }
      b.linear(hidden, w.q_proj, opt(w.q_bias), q);
      b.linear(hidden, w.k_proj, opt(w.k_bias), k);
      b.linear(hidden, w.v_proj, opt(w.v_bias), v);
      if (c.qk_norm) {
        Tensor q_heads = q.reshape({T * c.num_heads, D});
        Tensor k_heads = k.reshape({T * c.num_kv_heads, D});
        b.rms_norm(q_heads, w.q_norm, eps, q_heads);
        b.rms_norm(k_heads, w.k_norm, eps, k_heads);
      }
      b.rope(q, batch.positions, q_rope);
      b.rope(k, batch.positions, k_rope);
      b.store_kv(k, v, batch.out_slots, kv.k[static_cast<size_t>(l)], kv.v[static_cast<size_t>(l)]);
      attn_params.sliding_window = c.sliding_window_per_layer[static_cast<size_t>(l)];
      b.attention(q, kv.k[static_cast<size_t>(l)], kv.v[static_cast<size_t>(l)], batch.attention,
                  attn_params, attn);
      b.linear(attn, w.o_proj, opt(w.o_bias), block_out);
      b.add_rms_norm(residual, block_out, w.post_attention_norm, eps, hidden);
      b.linear(hidden, w.gate_up_proj, opt(w.gate_up_bias), gate_up);
      b.silu_and_mul(gate_up, act);
      b.linear(act, w.down_proj, opt(w.down_bias), block_out);
    }
    b.add_rms_norm(residual, block_out, final_norm_, eps, hidden);

    const int64_t L = batch.logit_rows.numel();
    BASALT_CHECK(logits.rank() == 2 && logits.dim(0) == L && logits.dim(1) == c.vocab_size,
                 "forward: logits must be f32 [{}, {}], got {}", L, c.vocab_size, logits.describe());
    Tensor selected = b.empty({L, H}, DType::kF32);
    b.embedding(batch.logit_rows, hidden, selected);  // gathers the wanted rows
    b.linear(selected, lm_head_, nullptr, logits);
  }

 private:
  static const Tensor* opt(const Tensor& t) { return t.raw() ? &t : nullptr; }

  Tensor to_backend(const Tensor& host) {
    if (backend_.device() == Device::kCpu) return host;
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.copy(host, t);
    return t;
  }
  Tensor weight(const Checkpoint& ckpt, const std::string& name, Shape shape) {
    Tensor t = ckpt.get(name, shape);
    BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
                 "{}: tensor '{}' has dtype {}; dense weights must be f32, bf16 or f16",
                 ckpt.info(name).file, name, dtype_name(t.dtype()));
    return to_backend(t);
  }
  Tensor bias(const Checkpoint& ckpt, const std::string& name, int64_t n) {
    return to_backend(ckpt.get(name, {n}).to_f32());
  }

  ModelConfig config_;
  Backend& backend_;
  Tensor embed_tokens_, final_norm_, lm_head_, inv_freq_;
  float rope_scaling_ = 1.0f;
  std::vector<LayerWeights> layers_;
};

}  // namespace

std::unique_ptr<Model> load_dense_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                        Backend& backend) {
  return std::make_unique<DenseModel>(config, checkpoint, backend);
}

}  // namespace basalt
