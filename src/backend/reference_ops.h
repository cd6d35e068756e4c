// Scalar reference implementations of the Backend op set.
//
// Contract: each function in basalt::reference computes the Backend op of the
// same name (backend/backend.h) on host tensors, with plain loops written to be
// read and checked by eye, not to be fast. Sums run in double, so the
// reference is more accurate than any f32 kernel it is compared against, and
// every backend's tests compare their outputs with these functions on random
// inputs. Inputs are validated (a mismatch throws basalt::Error), but less
// thoroughly than a production backend does. ReferenceBackend wraps the
// functions as a Backend, so model code can be run on it to debug a faster
// backend end to end.
//
// Precise semantics that the terse comments of backend.h leave open, and that
// every backend must follow:
//
//  * embedding: out[t, :] = f32(table[ids[t], :]); ids outside [0, V) throw.
//    The table may be f32, bf16, f16 or f8_e4m3 (raw values, no scales).
//  * linear: weights f32, bf16, f16 or f8_e4m3; bias f32, bf16 or f16.
//  * rms_norm: out = (x * (1 / sqrt(mean(x^2) + eps))) * weight, the order of
//    Hugging Face's LlamaRMSNorm for f32 activations.
//  * rope: for pair (a, b) of frequency i (see RopeStyle) and position p,
//    angle = float(p) * inv_freq[i] (one f32 multiply, as HF computes
//    inv_freq @ positions in f32), c = cos(angle) * attention_scaling,
//    s = sin(angle) * attention_scaling (f32), and
//    a' = a * c - b * s,  b' = b * c + a * s.
//    Features at or past rotary_dim within a head are left unchanged.
//  * store_kv: caches are [num_slots, row] with row = kv_heads * head_dim (or
//    any shape whose first dimension is num_slots and whose other dimensions
//    multiply to row), f32 or bf16 (rounded to nearest even on store). A
//    negative slot is skipped (nothing stored); slots >= num_slots throw. If
//    a slot repeats, which row lands there is unspecified.
//  * attention: query row i of a sequence with q_len queries and kv_len keys
//    sits at position p = kv_len - q_len + i; a row with p < 0 (a padding
//    sequence with q_len > kv_len) is all zeros. kv_slots entries past
//    kv_start[num_seqs] are ignored. Otherwise the row attends to
//    the keys j with j <= p and, if sliding_window > 0, p - j < sliding_window
//    (the window counts the query's own key, as HF's sliding-window mask
//    does). Query head h reads kv head h / (num_heads / num_kv_heads).
//  * argmax: NaN entries are skipped; a row of nothing but NaN gives 0.
//  * sample (per row, with the controls c of that row):
//     1. c.temperature == 0: the argmax of the row; no random draw is used.
//     2. s_i = logits[i] / temperature (NaN counts as -inf); m = max_i s_i;
//        w_i = exp(s_i - m) in f32. The rank order is s descending, ties
//        broken by the lower token index.
//     3. top-k (0 < top_k < V): keep the first top_k tokens in rank order.
//     4. top-p (top_p < 1): Z = sum of the kept w_i (double, index order).
//        Walk the kept tokens in rank order with c = the sum (double) of the
//        w of the kept tokens before it; keep the first token always and
//        every later one while c < top_p * Z.
//     5. min-p (min_p > 0): keep only the kept tokens with w_i >= min_p, that
//        is p_i >= min_p * p_max, as the top token has w = 1.
//     6. Draw: u = sampling_uniform(seed, step) (backend/sampling_rng.h);
//        Z' = sum of the kept w_i (double, index order); the token is the
//        first kept i in index order whose running sum (double, index order)
//        exceeds u * Z'. Should rounding leave no such token, the last kept
//        token with w_i > 0 is taken.
//    The filters are applied in this order on the unnormalised weights w,
//    which rank and cut exactly as the softmax probabilities would. Every
//    sum order is fixed, so two backends that compute the same s_i and w_i
//    bits pick the same token; a backend whose exp differs in the last bit
//    can disagree only where u * Z' falls within rounding of a boundary.
//    Valid controls: temperature >= 0 and finite, top_k >= 0,
//    0 < top_p <= 1, 0 <= min_p <= 1; anything else throws.
//  * adjust_logits: apply_logit_edit (backend.h) on each named logit. Edits
//    are checked first (check_logit_edits): rows and tokens in range, bias
//    and subtract finite, repetition > 0 and finite, no (row, token) twice.
//  * top_k_rows: the order is value descending, then column ascending, with
//    -0 equal to +0 and every NaN below -inf (NaNs among themselves by column).
//  * gather_rows, rank_rows: columns outside [0, C) throw.
//  * copy_indexed: indices outside their tensors throw.
#pragma once

#include <span>
#include <string_view>

#include "backend/backend.h"
#include "backend/host_qkv.h"

namespace basalt::reference {

void copy(const Tensor& src, Tensor& dst);
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const RopeParams& params);
void store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache);
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const AttentionLayout& layout, const AttentionParams& params, Tensor& out);
void silu_and_mul(const Tensor& gate_up, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void softmax(const Tensor& x, Tensor& out);
void log_softmax(const Tensor& x, Tensor& out);
void argmax(const Tensor& logits, Tensor& out);
void sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out);
void adjust_logits(Tensor& logits, std::span<const LogitEdit> edits);
void apply_token_bitmask(Tensor& logits, const Tensor& bitmask);
void top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids);
void gather_rows(const Tensor& x, const Tensor& cols, Tensor& out);
void rank_rows(const Tensor& x, const Tensor& cols, Tensor& out);
void copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index);

// Throws basalt::Error, naming `op`, unless every edit is valid for logits
// [rows, vocab] (see adjust_logits above). Every backend calls it.
void check_logit_edits(std::span<const LogitEdit> edits, int64_t rows, int64_t vocab,
                       const char* op);
// Checks top_k_rows' shapes and k (dtypes and ranks; not placement).
void check_top_k_rows(const Tensor& x, int k, const Tensor& values, const Tensor& ids,
                      const char* op);
// Checks apply_token_bitmask's shapes and dtypes (not placement).
void check_token_bitmask(const Tensor& logits, const Tensor& bitmask, const char* op);
// Checks gather_rows' shapes and dtypes (not placement).
void check_gather_rows(const Tensor& x, const Tensor& cols, const Tensor& out, const char* op);
// Checks rank_rows' shapes and dtypes (not placement).
void check_rank_rows(const Tensor& x, const Tensor& cols, const Tensor& out, const char* op);
// Checks copy_indexed's shapes and dtypes (not placement, not the indices).
void check_copy_indexed(const Tensor& src, const Tensor& src_index, const Tensor& dst, const Tensor& dst_index,
                        const char* op);
// The top_k_rows order: whether value a at column ia ranks before value b at
// column ib.
bool ranks_before(float a, int64_t ia, float b, int64_t ib);

// DeepSeek V2/V3 ops (reference_deepseek_ops.cc). moe_route ranks with
// doubles and breaks ties by the lower expert id; mla_attention computes the
// expanded form (per-head keys and values from kv_b), which the absorbed form
// of a fast backend must match.
void linear_fp8_block(const Tensor& x, const Tensor& w, const Tensor& scale_inv, Tensor& out);
// The product of core/int_weights.h (activations quantized per block of 32).
void linear_int(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out);
void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params, Tensor& ids,
               Tensor& weights);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                 std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert = -1);
void mla_store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps, const Tensor& positions,
                  const RopeParams& rope, const Tensor& slots, Tensor& cache);
void mla_attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                   const AttentionLayout& layout, const MlaParams& params, Tensor& out);
void mla_expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                   const MlaParams& params, Tensor& k, Tensor& v);
void concat_columns(const Tensor& a, const Tensor& b, Tensor& out);
void moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out);

// Reads element i of a floating host tensor of any floating dtype as f32.
float load_f32(const Tensor& t, int64_t i);
// Writes value, rounded to t's floating dtype, into element i of a host tensor.
void store_f32(const Tensor& t, int64_t i, float value);
// Element (n, k) of a linear weight as f32, block scale applied.
float load_weight(const LinearWeight& w, int64_t n, int64_t k);

}  // namespace basalt::reference

namespace basalt {

// The reference ops as a host Backend.
class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  Device device() const override { return Device::kCpu; }
  bool batch_invariant() const override { return true; }  // one row at a time, in double
  Tensor empty(Shape shape, DType dtype) override { return Tensor::empty(std::move(shape), dtype); }
  void copy(const Tensor& src, Tensor& dst) override { reference::copy(src, dst); }

 protected:
  void embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) override {
    reference::embedding(ids, table, out);
  }
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    reference::linear(x, w, bias, out);
  }
  void rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    reference::rms_norm(x, weight, eps, out);
  }
  void add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                         Tensor& out) override {
    reference::add_rms_norm(residual, x, weight, eps, out);
  }
  void rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    reference::rope(x, positions, params);
  }
  void store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                     Tensor& v_cache) override {
    reference::store_kv(k, v, slots, k_cache, v_cache);
  }
  void qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                           const Tensor& positions, const RopeParams& rope, int num_heads,
                           int num_kv_heads, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                           Tensor& q_out) override {
    host_qkv_rope_store(*this, qkv, q_norm, k_norm, eps, positions, rope, num_heads, num_kv_heads,
                        slots, k_cache, v_cache, q_out);
  }
  void attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const AttentionLayout& layout, const AttentionParams& params,
                      Tensor& out) override {
    reference::attention(q, k_cache, v_cache, layout, params, out);
  }
  void silu_and_mul_impl(const Tensor& gate_up, Tensor& out) override {
    reference::silu_and_mul(gate_up, out);
  }
  void add_impl(const Tensor& a, const Tensor& b, Tensor& out) override {
    reference::add(a, b, out);
  }
  void softmax_impl(const Tensor& x, Tensor& out) override { reference::softmax(x, out); }
  void log_softmax_impl(const Tensor& x, Tensor& out) override { reference::log_softmax(x, out); }
  void argmax_impl(const Tensor& logits, Tensor& out) override { reference::argmax(logits, out); }
  void sample_impl(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) override {
    reference::sample(logits, rows, out);
  }
  void adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) override {
    reference::adjust_logits(logits, edits);
  }
  void apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) override {
    reference::apply_token_bitmask(logits, bitmask);
  }
  void top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) override {
    reference::top_k_rows(x, k, values, ids);
  }
  void gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override {
    reference::gather_rows(x, cols, out);
  }
  void rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override {
    reference::rank_rows(x, cols, out);
  }
  void copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) override {
    reference::copy_indexed(src, src_index, dst, dst_index);
  }
  void linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                             Tensor& out) override {
    reference::linear_fp8_block(x, w, scale_inv, out);
  }
  void linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) override {
    reference::linear_int(x, w, bias, out);
  }
  void moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                      Tensor& ids, Tensor& weights) override {
    reference::moe_route(logits, bias, params, ids, weights);
  }
  void moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                        std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) override {
    reference::moe_experts(x, ids, weights, experts, out, first_expert);
  }
  void mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                         const Tensor& positions, const RopeParams& rope, const Tensor& slots,
                         Tensor& cache) override {
    reference::mla_store_kv(kv_a, norm_weight, eps, positions, rope, slots, cache);
  }
  void mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                          const AttentionLayout& layout, const MlaParams& params,
                          Tensor& out) override {
    reference::mla_attention(q, cache, kv_b, layout, params, out);
  }
  void mla_expand_kv_impl(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                          const MlaParams& params, Tensor& k, Tensor& v) override {
    reference::mla_expand_kv(cache, slots, kv_b, params, k, v);
  }
  void concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) override {
    reference::concat_columns(a, b, out);
  }
  void moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) override {
    reference::moe_combine(rows, positions, weights, out);
  }
};

}  // namespace basalt
