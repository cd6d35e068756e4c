#include "model/deepseek_v3.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/quantize.h"
#include "model/rope.h"
#include "model/tp_shard.h"

namespace basalt {
namespace {

struct Layer {
  Tensor input_norm, post_attention_norm;
  // Attention: q_proj, or q_a_proj + q_a_norm + q_b_proj.
  LinearWeight q_proj, q_a_proj, q_b_proj;
  Tensor q_a_norm;
  LinearWeight kv_a_proj, kv_b_proj, o_proj;
  Tensor kv_a_norm;
  // Feed-forward: a dense MLP, or routed experts (+ shared experts).
  bool moe = false;
  MoeExpert dense;
  Tensor router, router_bias;
  std::vector<MoeExpert> experts;
  bool has_shared = false;
  MoeExpert shared;
};

struct Mtp {
  Tensor enorm, hnorm, head_norm, embed, head;
  LinearWeight eh_proj;
  Layer layer;
};

std::string human_count(double n) {
  std::ostringstream out;
  out.precision(3);
  if (n >= 1e9) out << n / 1e9 << " B";
  else if (n >= 1e6) out << n / 1e6 << " M";
  else if (n >= 1e3) out << n / 1e3 << " K";
  else out << n;
  return out.str();
}

std::string human_bytes(double n) {
  std::ostringstream out;
  out.precision(3);
  if (n >= 1e9) out << n / 1e9 << " GB";
  else if (n >= 1e6) out << n / 1e6 << " MB";
  else if (n >= 1e3) out << n / 1e3 << " KB";
  else out << n << " bytes";
  return out.str();
}

class DeepseekModelImpl final : public DeepseekModel {
 public:
  DeepseekModelImpl(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend, const RankRole& role)
      : config_(config),
        dir_(ckpt.dir()),
        backend_(backend),
        tp_(role.dp_attention ? role.attention : role.group),
        ep_(role.group),
        dp_attention_(role.dp_attention && role.group != nullptr),
        dp_gather_(dp_attention_ && role.dp_moe == DpMoe::kGather),
        dense_tp_(dp_gather_ && role.dense_tp) {
    const ModelConfig& c = config_;
    const DeepseekConfig& d = c.deepseek;
    const int64_t H = c.hidden_size;
    BASALT_CHECK(!role.dense_tp || dp_gather_,
                 "{}: dense layers split over the ranks under DP attention need the experts reached by gathering "
                 "(DpMoe::kGather; --dp-moe gather)", dir_);
    BASALT_CHECK(role.attention == nullptr || dp_attention_,
                 "{}: an attention group is DP attention's (RankRole::attention)", dir_);
    plan_shards();
    if (world_ == 1) {
      embed_tokens_ = plain(ckpt, "model.embed_tokens.weight", {c.vocab_size, H});
      lm_head_ = c.tie_word_embeddings ? embed_tokens_ : plain(ckpt, "lm_head.weight", {c.vocab_size, H});
    } else {
      // Vocabulary-parallel (model/tp_shard.h).
      embed_tokens_ = to_backend(tp::vocab_shard(plain_host(ckpt, "model.embed_tokens.weight", {c.vocab_size, H}),
                                                 vocab_begin_, vocab_local_));
      lm_head_ = c.tie_word_embeddings
                     ? embed_tokens_.rows(0, vocab_local_)
                     : plain(ckpt, "lm_head.weight", {c.vocab_size, H}).rows(vocab_begin_, vocab_local_);
    }
    final_norm_ = plain(ckpt, "model.norm.weight", {H});
    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l)
      layers_[static_cast<size_t>(l)] = load_layer(ckpt, l);

    // The MTP layer, when the config announces one and the checkpoint has it.
    const std::string mtp = "model.layers." + std::to_string(c.num_layers) + ".";
    if (d.num_nextn_predict_layers > 0 && ckpt.has(mtp + "enorm.weight")) {
      Mtp m;
      m.enorm = plain(ckpt, mtp + "enorm.weight", {H});
      m.hnorm = plain(ckpt, mtp + "hnorm.weight", {H});
      m.eh_proj = linear(ckpt, mtp + "eh_proj.weight", H, 2 * H);
      m.head_norm = plain(ckpt, mtp + "shared_head.norm.weight", {H});
      // Its own embedding and head where the checkpoint has them (DeepSeek-V3
      // does), vocabulary-parallel over ranks as the model's are.
      if (!ckpt.has(mtp + "embed_tokens.weight"))
        m.embed = embed_tokens_;
      else if (world_ == 1)
        m.embed = plain(ckpt, mtp + "embed_tokens.weight", {c.vocab_size, H});
      else
        m.embed = to_backend(tp::vocab_shard(plain_host(ckpt, mtp + "embed_tokens.weight", {c.vocab_size, H}),
                                             vocab_begin_, vocab_local_));
      if (!ckpt.has(mtp + "shared_head.head.weight"))
        m.head = lm_head_;
      else if (world_ == 1)
        m.head = plain(ckpt, mtp + "shared_head.head.weight", {c.vocab_size, H});
      else
        m.head = plain(ckpt, mtp + "shared_head.head.weight", {c.vocab_size, H}).rows(vocab_begin_, vocab_local_);
      m.layer = load_layer(ckpt, c.num_layers);
      mtp_ = std::make_unique<Mtp>(std::move(m));
    }

    const RopeFrequencies rope = rope_frequencies(c.rope_scaling, c.rope_theta,
                                                  d.qk_rope_head_dim, c.max_position_embeddings);
    inv_freq_ = to_backend(
        Tensor::from_f32({static_cast<int64_t>(rope.inv_freq.size())}, rope.inv_freq));
    reserve_step_constants(kStepConstantRows, kStepConstantRows);
    const int R = static_cast<int>(d.qk_rope_head_dim), Dn = static_cast<int>(d.qk_nope_head_dim);
    rope_q_ = RopeParams{static_cast<int>(heads_), Dn + R, R, RopeStyle::kInterleaved,
                         &inv_freq_, rope.attention_scaling, Dn};
    rope_k_ = RopeParams{1, R, R, RopeStyle::kInterleaved, &inv_freq_, rope.attention_scaling, 0};
    double scale = 1.0 / std::sqrt(static_cast<double>(Dn + R));
    if (c.rope_scaling.type != "default" && c.rope_scaling.mscale_all_dim != 0.0) {
      const double m = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
      scale *= m * m;
    }
    mla_ = MlaParams{static_cast<int>(heads_), static_cast<int>(d.kv_lora_rank), Dn, R,
                     static_cast<int>(d.v_head_dim), static_cast<float>(scale)};
    const bool greedy = d.topk_method == "greedy";
    route_ = MoeRouteParams{d.scoring_func == "sigmoid" ? MoeScoring::kSigmoid : MoeScoring::kSoftmax,
                            static_cast<int>(d.num_experts_per_tok),
                            greedy ? 1 : static_cast<int>(d.n_group),
                            greedy ? 1 : static_cast<int>(d.topk_group), d.norm_topk_prob,
                            static_cast<float>(d.routed_scaling_factor)};
  }

  const ModelConfig& config() const override { return config_; }
  void set_mla_form(MlaForm form) override { form_ = form; }

  size_t kv_bytes_per_slot(DType dtype) const override {
    return static_cast<size_t>(config_.num_layers * latent_width()) * dtype_size(dtype);
  }

  KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
    return allocate(num_slots, dtype, config_.num_layers);
  }
  // Each forward first puts the batch on the backend's device (a no-op when
  // it is there already, as in a replayed CUDA graph's static inputs).
  using Model::forward;
  bool takes_device_token_ids() const override { return world_ == 1 && !dp_attention_; }
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) override {
    if (dp_attention_) {
      // A failure part-way through would leave the other ranks waiting in
      // this step's next exchange: the rank finishes them without tokens.
      exchanges_done_ = 0;
      rows_agreed_ = false;
      try {
        if (dp_gather_) agree_gather_rows(share_size(batch.num_tokens()));
        run(on_backend(vocab_local(batch), backend_), kv, logits, hidden);
      } catch (...) {
        if (dp_gather_ && !rows_agreed_) agree_gather_rows(0);
        exchange_idle(exchanges_done_);
        throw;
      }
      return;
    }
    if (world_ == 1) {
      run(on_backend(batch, backend_), kv, logits, hidden);
      return;
    }
    BASALT_CHECK(batch.num_tokens() > 0, "forward: empty batch");
    run(on_backend(vocab_local(batch), backend_), kv, logits, hidden);
  }

  // The batch with its token ids mapped to this rank's rows of the
  // vocabulary where the embedding is split (tp::local_vocab_ids, on the
  // host: a chained draft's ids come from the device); the batch itself
  // with one rank.
  ForwardBatch vocab_local(const ForwardBatch& batch) {
    if (world_ == 1) return batch;
    ForwardBatch local = batch;
    Tensor ids = batch.token_ids;
    if (ids.device() != Device::kCpu) {
      Tensor host = Tensor::empty(ids.shape(), ids.dtype());
      backend_.copy(ids, host);
      ids = host;
    }
    local.token_ids = tp::local_vocab_ids(ids, vocab_begin_, vocab_local_, config_.vocab_size);
    return local;
  }

  // DP attention with its heads split over the DP group (RankRole::attention,
  // world_ > 1): the group's ranks hold the same T rows, and each sends only
  // its share to the experts, rows [rank_ * S, rank_ * S + count) with S =
  // share_size(T) = ceil(T / world_) (count may be less at the end, or 0).
  bool shares_rows() const { return dp_attention_ && world_ > 1; }
  int64_t share_size(int64_t T) const { return shares_rows() ? (T + world_ - 1) / world_ : T; }
  std::pair<int64_t, int64_t> share(int64_t T) const {
    if (!shares_rows()) return {0, T};
    const int64_t S = share_size(T), begin = std::min(T, rank_ * S);
    return {begin, std::min(S, T - begin)};
  }

  void forward_idle() override {
    BASALT_CHECK(dp_attention_, "forward_idle: the model does not run DP attention");
    if (dp_gather_) agree_gather_rows(0);
    exchange_idle(0);
  }

  // Over tensor-parallel ranks each rank's head is its shard of the MTP
  // layer (model/tensor_parallel.h runs them together); under DP attention
  // each rank's head runs its own batch, and its MoE meets the other ranks'
  // (model/data_parallel.h steps the heads together, as it does the models).
  DraftHead* draft_head() override { return mtp_ ? &mtp_head_ : nullptr; }

  void reserve_step_rows(int64_t rows) override {
    reserve_step_constants(dense_tp_ ? ep_world_ * rows : rows, 0);
    if (dp_attention_) zero_rows(rows);
  }

  void set_step_rows(int64_t rows) override {
    BASALT_CHECK(rows >= -1 || rows == kStepRowsOwnTokens, "set_step_rows: {} rows", rows);
    if (dp_gather_) preset_rows_ = rows;
  }

  void forward_mtp_idle() override {
    BASALT_CHECK(dp_attention_ && mtp_ != nullptr, "forward_mtp_idle: no MTP layer over DP-attention ranks");
    if (dp_gather_) agree_gather_rows(0);
    if (exchanges(mtp_->layer)) exchange_idle_layer(mtp_->layer);
  }

  // The MTP layer as a DraftHead (see deepseek_v3.h).
  class MtpHead : public DraftHead {
   public:
    explicit MtpHead(DeepseekModelImpl& model) : model_(model) {}
    KvBuffers allocate_kv(int64_t num_slots, DType dtype) const override {
      return model_.allocate(num_slots, dtype, 1);
    }
    size_t kv_bytes_per_slot(DType dtype) const override {
      return static_cast<size_t>(model_.latent_width()) * dtype_size(dtype);
    }
    void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                 Tensor* hidden_out) override {
      model_.forward_mtp(batch, hidden, kv, logits, hidden_out);
    }

   private:
    DeepseekModelImpl& model_;
  };

  void forward_mtp(const ForwardBatch& host_batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                   Tensor* hidden_out) {
    BASALT_CHECK(mtp_ != nullptr, "{}: the checkpoint has no MTP layer", ckpt_dir());
    if (dp_attention_) {
      // As in forward(): a failure before the layer's exchange still takes
      // part in it, so the other ranks do not wait.
      exchanges_done_ = 0;
      rows_agreed_ = false;
      try {
        if (dp_gather_) agree_gather_rows(share_size(host_batch.num_tokens()));
        run_mtp(on_backend(vocab_local(host_batch), backend_), hidden, kv, logits, hidden_out);
      } catch (...) {
        if (dp_gather_ && !rows_agreed_) agree_gather_rows(0);
        if (exchanges_done_ == 0 && exchanges(mtp_->layer)) exchange_idle_layer(mtp_->layer);
        throw;
      }
      return;
    }
    run_mtp(on_backend(vocab_local(host_batch), backend_), hidden, kv, logits, hidden_out);
  }

  // The MTP layer on a batch on this backend (token ids this rank's rows of
  // the vocabulary where it is split).
  void run_mtp(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits, Tensor* hidden_out) {
    const int64_t T = batch.num_tokens(), H = config_.hidden_size;
    BASALT_CHECK(T > 0, "forward_mtp: empty batch");
    BASALT_CHECK(hidden.rank() == 2 && hidden.dim(0) == T && hidden.dim(1) == H,
                 "forward_mtp: hidden must be f32 [{}, {}], got {}", T, H, hidden.describe());
    BASALT_CHECK(kv.k.size() == 1, "forward_mtp: MTP KV buffers must have one layer, got {}",
                 kv.k.size());
    Backend& b = backend_;
    const float eps = static_cast<float>(config_.rms_norm_eps);
    Tensor emb = b.empty({T, H}, DType::kF32), normed_emb = b.empty({T, H}, DType::kF32);
    Tensor normed_hidden = b.empty({T, H}, DType::kF32), cat = b.empty({T, 2 * H}, DType::kF32);
    b.embedding(batch.token_ids, mtp_->embed, emb);
    if (tp_ != nullptr) tp_->all_reduce(emb);
    b.rms_norm(emb, mtp_->enorm, eps, normed_emb);
    b.rms_norm(hidden, mtp_->hnorm, eps, normed_hidden);
    b.concat_columns(normed_emb, normed_hidden, cat);
    Tensor residual = b.empty({T, H}, DType::kF32), x = b.empty({T, H}, DType::kF32);
    Tensor block_out = b.empty({T, H}, DType::kF32);
    lin(cat, mtp_->eh_proj, residual);
    Steps steps(*this, batch);
    run_layer(mtp_->layer, residual, x, block_out, batch, kv.k[0], /*first=*/true, steps);
    b.add_rms_norm(residual, block_out, mtp_->head_norm, eps, x);
    if (hidden_out != nullptr) {
      BASALT_CHECK(hidden_out->rank() == 2 && hidden_out->dim(0) == T && hidden_out->dim(1) == H,
                   "forward_mtp: hidden_out must be f32 [{}, {}], got {}", T, H, hidden_out->describe());
      b.copy(residual, *hidden_out);  // the block's output before shared_head.norm
    }
    project(batch, x, mtp_->head, logits);
  }

  std::string summary() const override {
    const ModelConfig& c = config_;
    const DeepseekConfig& d = c.deepseek;
    int64_t dense_layers = 0;
    for (const Layer& l : layers_) dense_layers += l.moe ? 0 : 1;
    std::ostringstream out;
    out << c.model_type << ": " << c.num_layers << " layers (" << dense_layers << " dense, "
        << c.num_layers - dense_layers << " MoE)" << (mtp_ ? " + 1 MTP layer" : ", no MTP layer")
        << "; MLA " << c.num_heads << " heads, q_lora_rank "
        << (d.q_lora_rank ? std::to_string(d.q_lora_rank) : std::string("none"))
        << ", kv_lora_rank " << d.kv_lora_rank << " (KV cache " << latent_width()
        << " values per token and layer)";
    if (d.n_routed_experts > 0) {
      out << "; " << d.n_routed_experts << " routed experts, top-" << d.num_experts_per_tok;
      if (route_.num_groups > 1) out << " in " << route_.topk_groups << " of " << route_.num_groups << " groups";
      out << " (" << d.scoring_func << "), " << d.n_shared_experts << " shared";
    }
    out << "\n" << c.model_type << ": " << human_count(static_cast<double>(total_params_))
        << " parameters, " << human_bytes(static_cast<double>(total_bytes_)) << " memory-mapped";
    if (total_params_ > 0)
      out << ", experts " << (100 * expert_params_ / total_params_) << "%";
    out << "; dtypes:";
    for (const auto& [dtype, n] : params_by_dtype_)
      out << " " << dtype_name(dtype) << " " << human_count(static_cast<double>(n));
    if (d.fp8_block_weights) out << " (fp8 e4m3 with 128x128 block scales)";
    if (c.int_weights.bits != 0) {
      out << " (int" << c.int_weights.bits << " codes, f16 scales per ";
      if (c.int_weights.group_size < 0)
        out << "row)";
      else
        out << c.int_weights.group_size << " columns)";
    }
    return out.str();
  }

 private:
  // Per-step constants shared by the layers of one forward call.
  struct Steps {
    Steps(DeepseekModelImpl& m, const ForwardBatch& batch) {
      const int64_t T = batch.num_tokens();
      m.reserve_step_constants(T, 0);
      first_expert = m.step_zeros_.rows(0, T);
      unit_weight = m.step_ones_.rows(0, T);
      const int64_t seqs = batch.attention.q_start.numel() - 1;
      // Per key, the expanded form pays kv_b_proj once (L * heads * (Dn + Dv)
      // multiply-adds) and the absorbed form pays a latent dot product and
      // update per query token and head (2 * (L + R) * heads * tokens per
      // sequence): the expanded form wins for prefill-sized steps, the
      // absorbed one for decode and short verification steps.
      const DeepseekConfig& d = m.config_.deepseek;
      const bool prefill_sized =
          T > seqs && T * 2 * (d.kv_lora_rank + d.qk_rope_head_dim) >=
                          seqs * d.kv_lora_rank * (d.qk_nope_head_dim + d.v_head_dim);
      // On a batch-invariant backend (the CPU; the GPU in its batch-invariant
      // mode), kAuto is always the absorbed form: a token's attention is
      // then computed one way whatever the step holds (cached prefix or not,
      // chunked or not, a verification or not), so outputs are
      // batch-invariant. The expanded form sums in another order, and
      // bf16-rounded activations (the CPU's default, core/bf16_product.h)
      // turn that f32 noise into whole bf16 steps now and then, enough to
      // change sampled tokens.
      expanded = m.form_ == MlaForm::kExpanded ||
                 (m.form_ == MlaForm::kAuto && prefill_sized && !m.backend_.batch_invariant());
      if (expanded) {
        const int64_t S = batch.attention.kv_slots.numel();
        m.reserve_step_constants(0, S);
        dense_layout = AttentionLayout{batch.attention.q_start, batch.attention.kv_start,
                                       m.step_iota_.rows(0, S)};
      }
    }
    Tensor first_expert, unit_weight;  // [T, 1]: every token to expert 0 with weight 1
    bool expanded = false;
    AttentionLayout dense_layout;  // the expanded keys are rows 0..S-1
  };

  // The per-step constants (Steps) are cut from buffers kept across steps:
  // step_zeros_ i32 [n, 1] and step_ones_ f32 [n, 1] (the dense and shared
  // MLPs run as one expert of weight 1), step_iota_ i32 [n] (the expanded
  // form's key rows). They grow on the host's copy when a step needs more
  // rows; the load reserves kStepConstantRows, more than any decode step that
  // a CUDA graph records (a graph cannot record that host copy). A replaced
  // buffer is kept (retired_step_constants_): graphs recorded earlier still
  // read it.
  static constexpr int64_t kStepConstantRows = 4096;
  void reserve_step_constants(int64_t tokens, int64_t keys) {
    if (tokens > (step_zeros_.raw() ? step_zeros_.dim(0) : 0)) {
      const int64_t n = std::max(tokens, kStepConstantRows);
      retired_step_constants_.push_back(step_zeros_);
      retired_step_constants_.push_back(step_ones_);
      step_zeros_ = to_backend(Tensor::from_i32({n, 1}, std::vector<int32_t>(static_cast<size_t>(n), 0)));
      step_ones_ = to_backend(Tensor::from_f32({n, 1}, std::vector<float>(static_cast<size_t>(n), 1.0f)));
    }
    if (keys > (step_iota_.raw() ? step_iota_.dim(0) : 0)) {
      const int64_t n = std::max(keys, kStepConstantRows);
      std::vector<int32_t> iota(static_cast<size_t>(n));
      std::iota(iota.begin(), iota.end(), 0);
      retired_step_constants_.push_back(step_iota_);
      step_iota_ = to_backend(Tensor::from_i32({n}, iota));
    }
  }

  const std::string& ckpt_dir() const { return dir_; }
  int64_t latent_width() const {
    return config_.deepseek.kv_lora_rank + config_.deepseek.qk_rope_head_dim;
  }

  KvBuffers allocate(int64_t num_slots, DType dtype, int64_t layers) const {
    KvBuffers kv;
    kv.num_slots = num_slots;
    for (int64_t l = 0; l < layers; ++l) {
      kv.k.push_back(backend_.empty({num_slots, latent_width()}, dtype));
      kv.v.push_back(Tensor());
    }
    return kv;
  }

  void run(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden_out) {
    const ModelConfig& c = config_;
    const int64_t T = batch.num_tokens(), H = c.hidden_size;
    BASALT_CHECK(T > 0, "forward: empty batch");
    BASALT_CHECK(static_cast<int64_t>(kv.k.size()) == c.num_layers,
                 "forward: KV buffers have {} layers, model has {}", kv.k.size(), c.num_layers);
    Backend& b = backend_;
    const float eps = static_cast<float>(c.rms_norm_eps);
    Tensor residual = b.empty({T, H}, DType::kF32), hidden = b.empty({T, H}, DType::kF32);
    Tensor block_out = b.empty({T, H}, DType::kF32);
    Steps steps(*this, batch);
    b.embedding(batch.token_ids, embed_tokens_, residual);
    if (tp_ != nullptr) tp_->all_reduce(residual);
    for (int64_t l = 0; l < c.num_layers; ++l)
      run_layer(layers_[static_cast<size_t>(l)], residual, hidden, block_out, batch,
                kv.k[static_cast<size_t>(l)], l == 0, steps);
    b.add_rms_norm(residual, block_out, final_norm_, eps, hidden);
    if (hidden_out) {
      BASALT_CHECK(hidden_out->rank() == 2 && hidden_out->dim(0) == T && hidden_out->dim(1) == H,
                   "forward: hidden must be f32 [{}, {}], got {}", T, H, hidden_out->describe());
      b.copy(hidden, *hidden_out);
    }
    project(batch, hidden, lm_head_, logits);
  }

  // The logits of batch.logit_rows from the final hidden states.
  void project(const ForwardBatch& batch, const Tensor& hidden, const Tensor& head, Tensor& logits) {
    const int64_t L = batch.logit_rows.numel(), H = config_.hidden_size;
    BASALT_CHECK(logits.rank() == 2 && logits.dim(0) == L && logits.dim(1) == config_.vocab_size,
                 "forward: logits must be f32 [{}, {}], got {}", L, config_.vocab_size,
                 logits.describe());
    Tensor selected = backend_.empty({L, H}, DType::kF32);
    backend_.embedding(batch.logit_rows, hidden, selected);  // gathers the wanted rows
    if (world_ == 1) {
      backend_.linear(selected, head, nullptr, logits);
      return;
    }
    Tensor part = backend_.empty({L, vocab_local_}, DType::kF32);
    backend_.linear(selected, head, nullptr, part);
    tp::gather_vocab_columns(*tp_, backend_, part, logits);
  }

  // One decoder block. On entry block_out holds the previous block's output
  // (unless first); on return it holds this block's feed-forward output, not
  // yet added to residual.
  void run_layer(const Layer& w, Tensor& residual, Tensor& hidden, Tensor& block_out,
                 const ForwardBatch& batch, Tensor& cache, bool first, const Steps& steps) {
    Backend& b = backend_;
    const float eps = static_cast<float>(config_.rms_norm_eps);
    if (first) {
      b.rms_norm(residual, w.input_norm, eps, hidden);
    } else {
      b.add_rms_norm(residual, block_out, w.input_norm, eps, hidden);
    }
    attention(w, hidden, batch, cache, steps, block_out);
    b.add_rms_norm(residual, block_out, w.post_attention_norm, eps, hidden);
    feed_forward(w, hidden, steps, block_out);
  }

  void attention(const Layer& w, const Tensor& hidden, const ForwardBatch& batch, Tensor& cache,
                 const Steps& steps, Tensor& out) {
    const ModelConfig& c = config_;
    const DeepseekConfig& d = c.deepseek;
    Backend& b = backend_;
    const int64_t T = batch.num_tokens(), heads = heads_;  // this rank's
    const int64_t Dn = d.qk_nope_head_dim, R = d.qk_rope_head_dim, Dv = d.v_head_dim;
    const float eps = static_cast<float>(c.rms_norm_eps);
    Tensor q = b.empty({T, heads * (Dn + R)}, DType::kF32);
    if (d.q_lora_rank > 0) {
      Tensor qa = b.empty({T, d.q_lora_rank}, DType::kF32);
      lin(hidden, w.q_a_proj, qa);
      b.rms_norm(qa, w.q_a_norm, eps, qa);
      lin(qa, w.q_b_proj, q);
    } else {
      lin(hidden, w.q_proj, q);
    }
    Tensor kv_a = b.empty({T, latent_width()}, DType::kF32);
    lin(hidden, w.kv_a_proj, kv_a);
    b.mla_store_kv(kv_a, w.kv_a_norm, eps, batch.positions, rope_k_, batch.out_slots, cache);
    b.rope(q, batch.positions, rope_q_);
    Tensor attn = b.empty({T, heads * Dv}, DType::kF32);
    if (steps.expanded) {
      // Expanded keys and values in the cache's precision: over a bf16
      // cache, the GPU's attention then takes its tensor-core path.
      const int64_t S = batch.attention.kv_slots.numel();
      Tensor k = b.empty({S, heads * (Dn + R)}, cache.dtype());
      Tensor v = b.empty({S, heads * Dv}, cache.dtype());
      b.mla_expand_kv(cache, batch.attention.kv_slots, w.kv_b_proj, mla_, k, v);
      const AttentionParams params{static_cast<int>(heads), static_cast<int>(heads),
                                   static_cast<int>(Dn + R), static_cast<int>(Dv), mla_.scale, 0};
      b.attention(q, k, v, steps.dense_layout, params, attn);
    } else {
      b.mla_attention(q, cache, w.kv_b_proj, batch.attention, mla_, attn);
    }
    lin(attn, w.o_proj, out);
    if (tp_ != nullptr) tp_->all_reduce(out);  // the heads' partial sums
  }

  void feed_forward(const Layer& w, const Tensor& hidden, const Steps& steps, Tensor& out) {
    Backend& b = backend_;
    if (!w.moe && !dense_tp_) {
      b.moe_experts(hidden, steps.first_expert, steps.unit_weight, std::span(&w.dense, 1), out);
      if (tp_ != nullptr) tp_->all_reduce(out);
      return;
    }
    const int64_t T = hidden.dim(0);
    if (dp_attention_) {
      // This rank's rows, or its share of its DP group's (shares_rows), to
      // the experts or (dense_tp_) the gathered dense MLP; the rows of the
      // other shares are zero here, and the all-reduce over the DP group
      // below adds the shares together.
      const auto [begin, count] = share(T);
      if (begin > 0) {
        Tensor before = out.rows(0, begin);
        b.copy(zero_rows(begin), before);
      }
      if (begin + count < T) {
        Tensor after = out.rows(begin + count, T - begin - count);
        b.copy(zero_rows(T - begin - count), after);
      }
      if (count == 0) {
        exchange_idle_layer(w);
      } else {
        const Tensor x = hidden.rows(begin, count);
        Tensor part = out.rows(begin, count);
        if (!w.moe) {
          gather_to_dense(x, w, &part);
        } else if (dp_gather_) {
          gather_to_experts(x, w, &part);
        } else {
          Tensor ids, weights;
          route(x, w, ids, weights);
          exchange_with_experts(x, ids, weights, w.experts, &part);
        }
      }
    } else {
      Tensor ids, weights;
      route(hidden, w, ids, weights);
      if (ep_world_ == 1) {
        b.moe_experts(hidden, ids, weights, w.experts, out);
      } else {
        // Expert parallelism over tokens every rank has (after the
        // attention's all-reduce): this rank's experts on the pairs routed
        // to them; the all-reduce below completes each token's sum.
        b.moe_experts(hidden, ids, weights, w.experts, out, expert_begin_);
      }
    }
    if (w.moe && w.has_shared && !dense_tp_) {  // with dense_tp_ the gathering ran this rank's slice
      Tensor shared = b.empty({T, config_.hidden_size}, DType::kF32);
      b.moe_experts(hidden, steps.first_expert, steps.unit_weight, std::span(&w.shared, 1), shared);
      b.add(out, shared, out);
    }
    if (tp_ != nullptr) tp_->all_reduce(out);  // every rank's experts and shared slice, or shares
  }

  // `rows` zero rows f32 [rows, hidden] on the backend, from a buffer kept
  // across steps (grown when short; a replaced one is kept, as the step
  // constants are, since graphs recorded earlier still read it).
  Tensor zero_rows(int64_t rows) {
    if (!gather_zeros_.raw() || gather_zeros_.dim(0) < rows) {
      retired_step_constants_.push_back(gather_zeros_);
      gather_zeros_ = to_backend(Tensor::zeros({std::max<int64_t>(rows, 64), config_.hidden_size}, DType::kF32));
    }
    return gather_zeros_.rows(0, rows);
  }

  // The router's choices for x's rows: ids i32 and weights f32 [rows, top_k].
  void route(const Tensor& x, const Layer& w, Tensor& ids, Tensor& weights) {
    Backend& b = backend_;
    const int64_t rows = x.dim(0), E = config_.deepseek.n_routed_experts;
    Tensor router_logits = b.empty({rows, E}, DType::kF32);
    b.linear(x, w.router, nullptr, router_logits);
    ids = b.empty({rows, route_.top_k}, DType::kI32);
    weights = b.empty({rows, route_.top_k}, DType::kF32);
    b.moe_route(router_logits, w.router_bias.raw() ? &w.router_bias : nullptr, route_, ids, weights);
  }

  // DP attention, DpMoe::kGather: the rows every rank pads its batch to for
  // this forward (the largest batch of the step), agreed by one all-gather
  // of the ranks' counts before the first layer. A rank with no tokens
  // agrees with 0.
  void agree_gather_rows(int64_t tokens) {
    if (preset_rows_ != -1) {  // set_step_rows: agreed by the caller
      gather_rows_ = preset_rows_ == kStepRowsOwnTokens ? tokens : share_size(preset_rows_);
      rows_agreed_ = true;
      BASALT_CHECK(tokens <= gather_rows_, "DP attention: {} rows against the step's agreed {}", tokens,
                   gather_rows_);
      return;
    }
    const int64_t n = ep_world_;
    Tensor counts = backend_.empty({n, 1}, DType::kI32);
    ep_->all_gather(uploaded(Tensor::from_i32({1, 1}, std::vector<int32_t>{static_cast<int32_t>(tokens)})), counts);
    const Tensor host = on_host(counts);
    gather_rows_ = 0;
    for (int64_t r = 0; r < n; ++r) gather_rows_ = std::max<int64_t>(gather_rows_, host.data<const int32_t>()[r]);
    rows_agreed_ = true;
  }

  // DP attention by gathering (DpMoe::kGather; model/model.h): this rank's
  // rows, padded with zero rows to gather_rows_, are all-gathered;
  // part(all, parts) writes this rank's part of every gathered row's result
  // (f32 [n * R, H]), and a reduce-scatter sums the ranks' parts, each rank
  // receiving its own block, of which out (f32 [T, H]) takes the first T
  // rows. x f32 [T, H]; with out null the rank has no tokens (x has no
  // rows) and only serves its part. Each row's sum is the ranks' parts
  // summed in rank order.
  void through_gathered_rows(const Tensor& x, Tensor* out,
                             const std::function<void(const Tensor& all, Tensor& parts)>& part) {
    Backend& b = backend_;
    const int64_t T = x.dim(0), H = config_.hidden_size, R = gather_rows_, n = ep_world_;
    if (R == 0) {  // no rank has tokens (every rank agreed on 0)
      ++exchanges_done_;
      return;
    }
    BASALT_CHECK(T <= R, "DP attention: {} rows against the step's agreed {}", T, R);
    Tensor mine = b.empty({R, H}, DType::kF32);
    if (T > 0) {
      Tensor head = mine.rows(0, T);
      b.copy(x, head);
    }
    if (T < R) {
      Tensor tail = mine.rows(T, R - T);
      b.copy(zero_rows(R - T), tail);
    }
    Tensor all = b.empty({n * R, H}, DType::kF32);
    ep_->all_gather(mine, all);
    Tensor parts = b.empty({n * R, H}, DType::kF32);
    part(all, parts);
    Tensor sums = b.empty({R, H}, DType::kF32);
    ep_->reduce_scatter(parts, sums);
    ++exchanges_done_;
    if (out != nullptr && T > 0) b.copy(sums.rows(0, T), *out);
  }

  // An MoE layer by gathering: every rank routes all the gathered rows (the
  // router is every rank's) and runs its own experts on the pairs routed to
  // them; with dense_tp_ its slice of the shared experts joins the same sum.
  // Each token's sum is its own experts' parts in choice order, summed over
  // the ranks in rank order (the exchange sums all its choices in choice
  // order: the two round differently).
  void gather_to_experts(const Tensor& x, const Layer& w, Tensor* out) {
    through_gathered_rows(x, out, [&](const Tensor& all, Tensor& parts) {
      Tensor ids, weights;
      route(all, w, ids, weights);
      backend_.moe_experts(all, ids, weights, w.experts, parts, expert_begin_);
      if (dense_tp_ && w.has_shared) {
        Tensor shared = backend_.empty(parts.shape(), DType::kF32);
        run_mlp(all, w.shared, shared);
        backend_.add(parts, shared, parts);
      }
    });
  }

  // A dense layer's MLP with dense_tp_: this rank's slice on the gathered rows.
  void gather_to_dense(const Tensor& x, const Layer& w, Tensor* out) {
    through_gathered_rows(x, out, [&](const Tensor& all, Tensor& parts) { run_mlp(all, w.dense, parts); });
  }

  // One MLP (or this rank's slice of one) on x's rows: the experts' path
  // with every row sent to it at weight 1.
  void run_mlp(const Tensor& x, const MoeExpert& mlp, Tensor& out) {
    const int64_t rows = x.dim(0);
    reserve_step_constants(rows, 0);
    backend_.moe_experts(x, step_zeros_.rows(0, rows), step_ones_.rows(0, rows), std::span(&mlp, 1), out);
  }

  // DP attention's MoE exchange (deepseek_v3.h). The (token, choice) pairs
  // of this rank's batch go to the ranks that hold their experts, in rank
  // order, each rank's in (token, choice) order; the counts, the pairs'
  // expert numbers on their rank, and their hidden rows go in three
  // collectives, and the experts' unweighted results come back in a fourth.
  // out (f32 [T, H]) gets, per token, its choices' results times their
  // weights, summed in choice order (Backend::moe_combine). x f32 [T, H];
  // ids i32 and weights f32 [T, top_k]; with out null the rank has no tokens
  // (x, ids and weights have no rows) and only serves its experts. On a GPU
  // the ids come to the host once per layer to order the pairs and size the
  // exchange, as DeepEP's normal mode reads its counts: the step cannot be
  // recorded in a graph, and every tensor a collective takes is the rank's
  // device's.
  void exchange_with_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                             std::span<const MoeExpert> experts, Tensor* out) {
    Backend& b = backend_;
    const int64_t T = x.dim(0), H = config_.hidden_size, K = ids.dim(1), n = ep_world_;
    const int64_t P = T * K;
    const Tensor host_ids = on_host(ids);
    const int32_t* id = host_ids.data<const int32_t>();
    // position[t * K + j]: where pair (t, j) sits in what this rank sends.
    std::vector<int64_t> send_rows(static_cast<size_t>(n), 0);
    for (int64_t p = 0; p < P; ++p) ++send_rows[static_cast<size_t>(id[p] / experts_local_)];
    std::vector<int64_t> next(static_cast<size_t>(n), 0);
    for (size_t r = 1; r < next.size(); ++r) next[r] = next[r - 1] + send_rows[r - 1];
    std::vector<int32_t> send_token(static_cast<size_t>(P)), send_expert(static_cast<size_t>(P));
    std::vector<int32_t> position(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; ++p) {
      const int64_t owner = id[p] / experts_local_, at = next[static_cast<size_t>(owner)]++;
      position[static_cast<size_t>(p)] = static_cast<int32_t>(at);
      send_token[static_cast<size_t>(at)] = static_cast<int32_t>(p / K);
      send_expert[static_cast<size_t>(at)] = static_cast<int32_t>(id[p] - owner * experts_local_);
    }
    // Counts: row r of `counts` is what rank r sends to each rank.
    const std::vector<int32_t> mine(send_rows.begin(), send_rows.end());
    Tensor counts = b.empty({n, n}, DType::kI32);
    ep_->all_gather(uploaded(Tensor::from_i32({1, n}, mine)), counts);
    const Tensor host_counts = on_host(counts);
    std::vector<int64_t> recv_rows(static_cast<size_t>(n));
    int64_t R = 0;
    for (int64_t r = 0; r < n; ++r)
      R += recv_rows[static_cast<size_t>(r)] = host_counts.data<const int32_t>()[r * n + ep_rank_];
    // Dispatch: the pairs' expert numbers, then their hidden rows.
    Tensor expert_in = b.empty({R, 1}, DType::kI32);
    ep_->all_to_all(uploaded(Tensor::from_i32({P, 1}, send_expert)), send_rows, expert_in, recv_rows);
    Tensor rows_out = b.empty({P, H}, DType::kF32), rows_in = b.empty({R, H}, DType::kF32);
    if (P > 0) b.embedding(uploaded(Tensor::from_i32({P}, send_token)), x, rows_out);  // gathers the pairs' tokens
    ep_->all_to_all(rows_out, send_rows, rows_in, recv_rows);
    // This rank's experts on what it received, unweighted; then combine.
    Tensor results = b.empty({R, H}, DType::kF32), back = b.empty({P, H}, DType::kF32);
    if (R > 0) {
      reserve_step_constants(R, 0);
      b.moe_experts(rows_in, expert_in, step_ones_.rows(0, R), experts, results);
    }
    ep_->all_to_all(results, recv_rows, back, send_rows);
    ++exchanges_done_;
    if (out == nullptr) return;
    b.moe_combine(back, uploaded(Tensor::from_i32({T, K}, position)), weights, *out);
  }

  // The exchanges of a step's MoE layers from the `from`-th on, with no
  // tokens of this rank's own.
  // One layer's exchange with no tokens of this rank's own.
  void exchange_idle_layer(const Layer& w) {
    const int64_t H = config_.hidden_size, K = route_.top_k;
    if (dp_gather_) {
      const Tensor none = Tensor::empty({0, H}, DType::kF32);
      if (w.moe)
        gather_to_experts(none, w, nullptr);
      else
        gather_to_dense(none, w, nullptr);
      return;
    }
    const Tensor x = Tensor::empty({0, H}, DType::kF32), ids = Tensor::empty({0, K}, DType::kI32);
    const Tensor weights = Tensor::empty({0, K}, DType::kF32);
    exchange_with_experts(x, ids, weights, w.experts, nullptr);
  }

  void exchange_idle(int64_t from) {
    int64_t seen = 0;
    for (const Layer& w : layers_) {
      if (!exchanges(w)) continue;
      if (seen++ >= from) exchange_idle_layer(w);
    }
  }
  // Whether layer w meets the other DP-attention ranks in a step: every MoE
  // layer, and with dense_tp_ the dense ones too.
  bool exchanges(const Layer& w) const { return w.moe || dense_tp_; }

  void lin(const Tensor& x, const LinearWeight& w, Tensor& out) {
    if (w.int_quantized()) {
      backend_.linear_int(x, w, nullptr, out);
    } else if (w.block_fp8()) {
      backend_.linear_fp8_block(x, w.weight, w.scale_inv, out);
    } else {
      backend_.linear(x, w.weight, nullptr, out);
    }
  }

  // --- Loading ---------------------------------------------------------------

  Layer load_layer(const Checkpoint& ckpt, int64_t l) {
    const ModelConfig& c = config_;
    const DeepseekConfig& d = c.deepseek;
    const int64_t H = c.hidden_size, heads = c.num_heads, mine = heads_, first = rank_ * heads_;
    const int64_t Dn = d.qk_nope_head_dim, R = d.qk_rope_head_dim, Dv = d.v_head_dim;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer w;
    w.input_norm = plain(ckpt, p + "input_layernorm.weight", {H});
    w.post_attention_norm = plain(ckpt, p + "post_attention_layernorm.weight", {H});
    const std::string a = p + "self_attn.";
    if (d.q_lora_rank > 0) {
      w.q_a_proj = linear(ckpt, a + "q_a_proj.weight", d.q_lora_rank, H);
      w.q_a_norm = plain(ckpt, a + "q_a_layernorm.weight", {d.q_lora_rank});
      w.q_b_proj = shard_rows(world_, host_linear(ckpt, a + "q_b_proj.weight", heads * (Dn + R), d.q_lora_rank),
                              first * (Dn + R), mine * (Dn + R), a + "q_b_proj.weight");
    } else {
      w.q_proj = shard_rows(world_, host_linear(ckpt, a + "q_proj.weight", heads * (Dn + R), H), first * (Dn + R),
                            mine * (Dn + R), a + "q_proj.weight");
    }
    // The latent (kv_a) is every head's: each rank computes and caches it.
    w.kv_a_proj = linear(ckpt, a + "kv_a_proj_with_mqa.weight", d.kv_lora_rank + R, H);
    w.kv_a_norm = plain(ckpt, a + "kv_a_layernorm.weight", {d.kv_lora_rank});
    w.kv_b_proj = shard_rows(world_, host_linear(ckpt, a + "kv_b_proj.weight", heads * (Dn + Dv), d.kv_lora_rank),
                             first * (Dn + Dv), mine * (Dn + Dv), a + "kv_b_proj.weight");
    BASALT_CHECK(!w.kv_b_proj.int_quantized(), "{}: '{}kv_b_proj.weight' is in an integer format; MLA attention reads "
                 "it in f32, bf16, f16 or block FP8", dir_, a);
    w.o_proj = shard_columns(world_, host_linear(ckpt, a + "o_proj.weight", H, heads * Dv), first * Dv, mine * Dv,
                             a + "o_proj.weight");

    const std::string m = p + "mlp.";
    w.moe = d.is_moe_layer(l);
    if (!w.moe) {
      w.dense = shard_mlp(expert(ckpt, m, c.intermediate_size, false), c.intermediate_size, m);
      return w;
    }
    const int64_t E = d.n_routed_experts, I = d.moe_intermediate_size;
    w.router = plain(ckpt, m + "gate.weight", {E, H});
    if (d.topk_method == "noaux_tc" || ckpt.has(m + "gate.e_score_correction_bias")) {
      Tensor bias = ckpt.get(m + "gate.e_score_correction_bias", {E});
      count(bias, false);
      w.router_bias = to_backend(bias.dtype() == DType::kF32 ? bias : bias.to_f32());
    }
    if (ckpt.has(m + "experts.gate_up_proj")) {
      // transformers 5's fused layout: views of one tensor per projection.
      const Tensor gate_up = host_weight(ckpt, m + "experts.gate_up_proj", {E, 2 * I, H}, true);
      const Tensor down = host_weight(ckpt, m + "experts.down_proj", {E, H, I}, true);
      BASALT_CHECK(gate_up.dtype() != DType::kF8E4M3 && down.dtype() != DType::kF8E4M3,
                   "{}: fused expert tensors '{}experts.*' must not be float8 (block scales are "
                   "per expert)", ckpt.info(m + "experts.down_proj").file, m);
      for (int64_t e = expert_begin_; e < expert_begin_ + experts_local_; ++e) {
        const Tensor gu = gate_up.rows(e, 1).reshape({2 * I, H});
        w.experts.push_back(on_device(MoeExpert{{gu.rows(0, I), Tensor()}, {gu.rows(I, I), Tensor()},
                                                {down.rows(e, 1).reshape({H, I}), Tensor()}}));
      }
    } else {
      // Every expert's tensors are checked; this rank keeps (and uploads)
      // its own.
      for (int64_t e = 0; e < E; ++e) {
        MoeExpert ex = expert(ckpt, m + "experts." + std::to_string(e) + ".", I, true);
        if (e >= expert_begin_ && e < expert_begin_ + experts_local_) w.experts.push_back(on_device(ex));
      }
    }
    if (d.n_shared_experts > 0) {
      w.has_shared = true;
      w.shared = shard_mlp(expert(ckpt, m + "shared_experts.", I * d.n_shared_experts, false),
                           I * d.n_shared_experts, m + "shared_experts.");
    }
    return w;
  }

  // --- Tensor parallelism (world_ > 1) ------------------------------------
  //
  // Rank r of N holds query heads [r*h, (r+1)*h), h = num_heads / N: their
  // rows of q_proj / q_b_proj and kv_b_proj and their columns of o_proj
  // (all-reduced after); the latent projection, its norm and cache on every
  // rank (replicated: DP attention would keep one copy); 1/N of the dense
  // and shared MLPs (gate/up rows, down columns); routed experts [r*E/N,
  // (r+1)*E/N) run on the tokens routed to them (expert parallelism over
  // tokens every rank has), one all-reduce for the whole feed-forward;
  // vocabulary rows of the embedding and lm_head (model/tp_shard.h). FP8
  // weights split only at whole 128x128 blocks. Under DP attention a rank
  // holds everything but the routed experts, which split as above over the
  // group; with an attention group (RankRole::attention) the heads, the
  // vocabulary and (without dense_tp_) the dense and shared MLPs split over
  // it as above.
  void plan_shards() {
    const ModelConfig& c = config_;
    const DeepseekConfig& d = c.deepseek;
    world_ = tp_ != nullptr ? tp_->world_size() : 1;
    rank_ = tp_ != nullptr ? tp_->rank() : 0;
    ep_world_ = ep_ != nullptr ? ep_->world_size() : 1;
    ep_rank_ = ep_ != nullptr ? ep_->rank() : 0;
    heads_ = c.num_heads;
    vocab_local_ = c.vocab_size;
    experts_local_ = d.n_routed_experts;
    if (ep_world_ > 1 && d.n_routed_experts > 0) {
      tp::check_divides(ep_world_, d.n_routed_experts, "n_routed_experts");
      experts_local_ = d.n_routed_experts / ep_world_;
      expert_begin_ = ep_rank_ * experts_local_;
    }
    mlp_world_ = dense_tp_ ? ep_world_ : world_;
    mlp_rank_ = dense_tp_ ? ep_rank_ : rank_;
    if (mlp_world_ > 1) {
      tp::check_divides(mlp_world_, c.intermediate_size, "intermediate_size");
      if (d.n_shared_experts > 0)
        tp::check_divides(mlp_world_, d.moe_intermediate_size * d.n_shared_experts, "the shared experts' width");
    }
    if (world_ == 1) return;
    const int64_t n = world_;
    tp::check_divides(n, c.num_heads, "num_attention_heads");
    tp::check_divides(n, c.vocab_size, "vocab_size");
    heads_ = c.num_heads / n;
    vocab_local_ = c.vocab_size / n;
    vocab_begin_ = rank_ * vocab_local_;
  }

  // Rows [begin, begin + count) of a host linear weight (and of its FP8
  // block scales, at whole blocks), on the backend, where `parts` ranks
  // split it; the whole weight with one.
  LinearWeight shard_rows(int64_t parts, const LinearWeight& w, int64_t begin, int64_t count, const std::string& name) {
    if (parts == 1) return on_device(w);
    check_not_int(w, name);
    LinearWeight out;
    out.weight = w.weight.rows(begin, count);
    if (w.block_fp8()) {
      check_block_aligned(parts, begin, count, w.weight.dim(0), name);
      out.scale_inv = w.scale_inv.rows(begin / kFp8BlockSize, fp8_blocks(count));
    }
    return on_device(out);
  }
  LinearWeight shard_columns(int64_t parts, const LinearWeight& w, int64_t begin, int64_t count,
                             const std::string& name) {
    if (parts == 1) return on_device(w);
    check_not_int(w, name);
    LinearWeight out;
    out.weight = tp::columns(w.weight, begin, count);
    if (w.block_fp8()) {
      check_block_aligned(parts, begin, count, w.weight.dim(1), name);
      out.scale_inv = tp::columns(w.scale_inv, begin / kFp8BlockSize, fp8_blocks(count));
    }
    return on_device(out);
  }
  void check_not_int(const LinearWeight& w, const std::string& name) const {
    BASALT_CHECK(!w.int_quantized(), "{}: '{}' is int{}: tensor parallelism over integer weights is not supported yet",
                 dir_, name, w.int_layout.bits);
  }
  // 128-wide FP8 scale blocks covering n values (the last one partial).
  static int64_t fp8_blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }
  void check_block_aligned(int64_t parts, int64_t begin, int64_t count, int64_t size, const std::string& name) const {
    BASALT_CHECK(begin % kFp8BlockSize == 0 && (count % kFp8BlockSize == 0 || begin + count == size),
                 "{}: splitting over {} ranks cuts '{}' inside a {}-wide FP8 block ([{}, {}) of {})", dir_, parts,
                 name, kFp8BlockSize, begin, begin + count, size);
  }
  // This rank's 1/N of a host MLP `inter` wide (gate and up rows, down
  // columns), on the backend: N ranks of tensor parallelism, or of DP
  // attention with dense_tp_.
  MoeExpert shard_mlp(const MoeExpert& e, int64_t inter, const std::string& prefix) {
    const int64_t mine = inter / mlp_world_, first = mlp_rank_ * mine;
    return MoeExpert{shard_rows(mlp_world_, e.gate, first, mine, prefix + "gate_proj.weight"),
                     shard_rows(mlp_world_, e.up, first, mine, prefix + "up_proj.weight"),
                     shard_columns(mlp_world_, e.down, first, mine, prefix + "down_proj.weight")};
  }

  // An MLP's three host weights, checked (expert parallelism uploads only
  // a rank's own experts).
  MoeExpert expert(const Checkpoint& ckpt, const std::string& p, int64_t inter, bool routed) {
    const int64_t H = config_.hidden_size;
    return MoeExpert{host_linear(ckpt, p + "gate_proj.weight", inter, H, routed),
                     host_linear(ckpt, p + "up_proj.weight", inter, H, routed),
                     host_linear(ckpt, p + "down_proj.weight", H, inter, routed)};
  }
  MoeExpert on_device(const MoeExpert& e) { return MoeExpert{on_device(e.gate), on_device(e.up), on_device(e.down)}; }
  LinearWeight on_device(const LinearWeight& w) {
    LinearWeight d{to_backend(w.weight), w.scale_inv.raw() ? to_backend(w.scale_inv) : Tensor()};
    if (w.int_quantized()) {
      BASALT_CHECK(backend_.supports(BackendOp::kLinearInt),
                   "{}: int{} weights run on the CPU backend only; the {} backend has no integer kernels "
                   "(use --device cpu)",
                   dir_, w.int_layout.bits, backend_.name());
      d.scales = to_backend(w.scales);
      d.int_layout = w.int_layout;
      backend_.prepare_int_weight(d);
    }
    return d;
  }

  LinearWeight linear(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k) {
    return on_device(host_linear(ckpt, name, n, k));
  }
  // A linear weight in host memory, checked: bf16/f16/f32, or f8_e4m3 with
  // its weight_scale_inv.
  LinearWeight host_linear(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k,
                           bool routed = false) {
    const DType stored = ckpt.info(name).dtype;
    if (stored == DType::kI8 || stored == DType::kU8) {
      LinearWeight w = read_int_linear(ckpt, name, n, k, config_);
      total_params_ += n * k;  // codes and scales: n * k parameters
      total_bytes_ += static_cast<int64_t>(w.weight.nbytes() + w.scales.nbytes());
      params_by_dtype_[w.weight.dtype()] += n * k;
      if (routed) expert_params_ += n * k;
      return w;
    }
    LinearWeight w;
    w.weight = host_weight(ckpt, name, {n, k}, routed);
    if (w.weight.dtype() != DType::kF8E4M3) return w;
    const std::string file = ckpt.info(name).file;
    BASALT_CHECK(config_.deepseek.fp8_block_weights,
                 "{}: tensor '{}' is float8_e4m3fn but config.json has no fp8 quantization_config",
                 file, name);
    const std::string scale_name = name.substr(0, name.size() - 7) + ".weight_scale_inv";
    BASALT_CHECK(name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
                     ckpt.has(scale_name),
                 "{}: tensor '{}' is float8_e4m3fn but its scale tensor '{}' is missing", file,
                 name, scale_name);
    const int64_t bn = fp8_blocks(n), bk = fp8_blocks(k);
    Tensor scale = ckpt.get(scale_name, {bn, bk});
    BASALT_CHECK(is_floating(scale.dtype()) && scale.dtype() != DType::kF8E4M3,
                 "{}: tensor '{}' must be float32, got {}", ckpt.info(scale_name).file, scale_name,
                 dtype_name(scale.dtype()));
    count(scale, routed);
    w.scale_inv = scale.dtype() == DType::kF32 ? scale : scale.to_f32();
    return w;
  }

  Tensor host_weight(const Checkpoint& ckpt, const std::string& name, const Shape& shape, bool routed) {
    Tensor t = ckpt.get(name, shape);
    BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 ||
                     t.dtype() == DType::kF16 || t.dtype() == DType::kF8E4M3,
                 "{}: tensor '{}' has dtype {}; weights must be f32, bf16, f16 or f8_e4m3",
                 ckpt.info(name).file, name, dtype_name(t.dtype()));
    count(t, routed);
    return t;
  }

  // Embeddings, norms, heads and the router: f32, bf16 or f16 as published.
  Tensor plain(const Checkpoint& ckpt, const std::string& name, const Shape& shape) {
    return to_backend(plain_host(ckpt, name, shape));
  }
  Tensor plain_host(const Checkpoint& ckpt, const std::string& name, const Shape& shape) {
    Tensor t = ckpt.get(name, shape);
    BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
                 "{}: tensor '{}' has dtype {}; it must be f32, bf16 or f16",
                 ckpt.info(name).file, name, dtype_name(t.dtype()));
    count(t, false);
    return t;
  }

  void count(const Tensor& t, bool routed) {
    total_params_ += t.numel();
    total_bytes_ += static_cast<int64_t>(t.nbytes());
    params_by_dtype_[t.dtype()] += t.numel();
    if (routed) expert_params_ += t.numel();
  }

  // A small host tensor of this step on the backend (Backend::upload: it
  // need not outlive the call).
  Tensor uploaded(const Tensor& host) {
    if (backend_.device() == Device::kCpu) return host;
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.upload(host, t);
    return t;
  }
  // A tensor of the backend's on the host (the device's work up to it done).
  Tensor on_host(const Tensor& t) {
    if (t.device() == Device::kCpu) return t;
    Tensor host = Tensor::empty(t.shape(), t.dtype());
    backend_.copy(t, host);
    return host;
  }

  Tensor to_backend(const Tensor& host) {
    if (backend_.device() == Device::kCpu) return host;
    Tensor t = backend_.empty(host.shape(), host.dtype());
    backend_.copy(host, t);
    return t;
  }

  ModelConfig config_;
  std::string dir_;
  Backend& backend_;
  Communicator* tp_ = nullptr;  // the tensor-parallel group (DP attention's: RankRole::attention); null: one rank
  Communicator* ep_ = nullptr;  // the group the routed experts are split over (tp_, or DP attention's)
  bool dp_attention_ = false;
  int64_t world_ = 1, rank_ = 0;        // tensor parallelism's
  int64_t ep_world_ = 1, ep_rank_ = 0;  // expert parallelism's
  int64_t mlp_world_ = 1, mlp_rank_ = 0;  // the dense and shared MLPs' split (TP's, or DP's with dense_tp_)
  int64_t exchanges_done_ = 0;          // DP attention: the step's exchanges so far (exchanges())
  bool dp_gather_ = false;              // DP attention by DpMoe::kGather
  bool dense_tp_ = false;               // kGather: dense MLPs and shared experts split over the ranks
  bool rows_agreed_ = false;            // kGather: agree_gather_rows ran in this forward
  int64_t gather_rows_ = 0;             // kGather: the rows each rank pads to in this forward
  int64_t preset_rows_ = -1;            // kGather: set_step_rows' value, or -1 (agree in each forward)
  Tensor gather_zeros_;                 // DP attention: zero rows (zero_rows)
  int64_t heads_ = 0;                         // this rank's query heads
  int64_t vocab_begin_ = 0, vocab_local_ = 0;  // this rank's vocabulary rows
  int64_t expert_begin_ = 0, experts_local_ = 0;  // this rank's routed experts
  Tensor embed_tokens_, final_norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
  std::unique_ptr<Mtp> mtp_;
  MtpHead mtp_head_{*this};
  RopeParams rope_q_, rope_k_;
  Tensor step_zeros_, step_ones_, step_iota_;  // reserve_step_constants
  std::vector<Tensor> retired_step_constants_;
  MlaParams mla_;
  MoeRouteParams route_;
  MlaForm form_ = MlaForm::kAuto;
  int64_t total_params_ = 0, total_bytes_ = 0, expert_params_ = 0;
  std::map<DType, int64_t> params_by_dtype_;
};

}  // namespace

std::unique_ptr<DeepseekModel> load_deepseek_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                                   Backend& backend, const RankRole& role) {
  return std::make_unique<DeepseekModelImpl>(config, checkpoint, backend, role);
}

}  // namespace basalt
