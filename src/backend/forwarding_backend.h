// ForwardingBackend: a Backend that hands every call to another backend,
// unchanged. It exists to be subclassed by decorators that watch or alter a
// few ops of a model's forward pass and leave the rest alone (tests that
// record the routing the GPU chose and replay it on the CPU; op counters).
// The inner backend must outlive the decorator; tensors the decorator
// returns from empty() belong to the inner backend's device, so a model
// loaded on the decorator runs exactly as it would on the inner backend.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "backend/backend.h"

namespace basalt {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  Backend& inner() { return inner_; }

  std::string_view name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  Tensor empty(Shape shape, DType dtype) override { return inner_.empty(std::move(shape), dtype); }
  void copy(const Tensor& src, Tensor& dst) override { inner_.copy(src, dst); }
  void upload(const Tensor& src, Tensor& dst) override { inner_.upload(src, dst); }
  std::unique_ptr<PendingDownload> download(const Tensor& src, Tensor& dst) override {
    return inner_.download(src, dst);
  }
  DType activation_dtype(DType weights) const override { return inner_.activation_dtype(weights); }
  std::unique_ptr<RecordedOps> record(const std::function<void()>& ops) override { return inner_.record(ops); }
  bool can_record() const override { return inner_.can_record(); }
  bool supports(BackendOp op) const override { return inner_.supports(op); }
  bool batch_invariant() const override { return inner_.batch_invariant(); }
  void set_batch_invariant(bool on) override { inner_.set_batch_invariant(on); }

 protected:
  void embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) override {
    inner_.embedding(ids, table, out);
  }
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    inner_.linear(x, w, bias, out);
  }
  void rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    inner_.rms_norm(x, weight, eps, out);
  }
  void add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                         Tensor& out) override {
    inner_.add_rms_norm(residual, x, weight, eps, out);
  }
  void rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    inner_.rope(x, positions, params);
  }
  void store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                     Tensor& v_cache) override {
    inner_.store_kv(k, v, slots, k_cache, v_cache);
  }
  void qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                           const Tensor& positions, const RopeParams& rope, int num_heads,
                           int num_kv_heads, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                           Tensor& q_out) override {
    inner_.qkv_rope_store(qkv, q_norm, k_norm, eps, positions, rope, num_heads, num_kv_heads, slots, k_cache,
                          v_cache, q_out);
  }
  void attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const AttentionLayout& layout, const AttentionParams& params,
                      Tensor& out) override {
    inner_.attention(q, k_cache, v_cache, layout, params, out);
  }
  void silu_and_mul_impl(const Tensor& gate_up, Tensor& out) override {
    inner_.silu_and_mul(gate_up, out);
  }
  void add_impl(const Tensor& a, const Tensor& b, Tensor& out) override { inner_.add(a, b, out); }
  void softmax_impl(const Tensor& x, Tensor& out) override { inner_.softmax(x, out); }
  void log_softmax_impl(const Tensor& x, Tensor& out) override { inner_.log_softmax(x, out); }
  void argmax_impl(const Tensor& logits, Tensor& out) override { inner_.argmax(logits, out); }
  void sample_impl(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) override {
    inner_.sample(logits, rows, out);
  }
  void apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) override {
    inner_.apply_token_bitmask(logits, bitmask);
  }
  void adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) override {
    inner_.adjust_logits(logits, edits);
  }
  void top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) override {
    inner_.top_k_rows(x, k, values, ids);
  }
  void gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override {
    inner_.gather_rows(x, cols, out);
  }
  void rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override {
    inner_.rank_rows(x, cols, out);
  }
  void copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) override {
    inner_.copy_indexed(src, src_index, dst, dst_index);
  }

  void linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                             Tensor& out) override {
    inner_.linear_fp8_block(x, w, scale_inv, out);
  }
  void linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) override {
    inner_.linear_int(x, w, bias, out);
  }
  void prepare_int_weight_impl(LinearWeight& w) override { inner_.prepare_int_weight(w); }
  void moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                      Tensor& ids, Tensor& weights) override {
    inner_.moe_route(logits, bias, params, ids, weights);
  }
  void moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                        std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) override {
    inner_.moe_experts(x, ids, weights, experts, out, first_expert);
  }
  void mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                         const Tensor& positions, const RopeParams& rope, const Tensor& slots,
                         Tensor& cache) override {
    inner_.mla_store_kv(kv_a, norm_weight, eps, positions, rope, slots, cache);
  }
  void mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                          const AttentionLayout& layout, const MlaParams& params,
                          Tensor& out) override {
    inner_.mla_attention(q, cache, kv_b, layout, params, out);
  }
  void mla_expand_kv_impl(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                          const MlaParams& params, Tensor& k, Tensor& v) override {
    inner_.mla_expand_kv(cache, slots, kv_b, params, k, v);
  }
  void concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) override {
    inner_.concat_columns(a, b, out);
  }
  void moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) override {
    inner_.moe_combine(rows, positions, weights, out);
  }

 private:
  Backend& inner_;
};

}  // namespace basalt
