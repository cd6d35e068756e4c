// Backend: the op set that model code is written against.
//
// Contract: an architecture describes its forward pass only as calls on this
// interface, so the same model code runs on every backend. Each op takes
// tensors that live on the backend's device and writes into caller-allocated
// outputs of the documented shape; ops never allocate their outputs. Shapes and
// dtypes are checked and a mismatch throws basalt::Error. Every op of every
// backend is tested against a plain scalar reference on random inputs
// (backend/cpu/*_test.cc holds the pattern that the CUDA backend reuses).
//
// Activations ("x", "out") are row-major [tokens, features]. On the CPU backend
// activations are f32; weights may be f32, bf16 or f16 (fp8 block-scaled
// weights arrive with the DeepSeek-V3 work). Linear weights use the Hugging
// Face layout [out_features, in_features].
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/tensor.h"

namespace basalt {

enum class RopeStyle : uint8_t {
  kRotateHalf,   // GPT-NeoX / Llama in HF: pairs (i, i + rotary_dim / 2)
  kInterleaved,  // GPT-J / DeepSeek: pairs (2i, 2i + 1)
};

struct RopeParams {
  int num_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // the first rotary_dim features of each head rotate
  RopeStyle style = RopeStyle::kRotateHalf;
  // f32 [rotary_dim / 2] inverse frequencies, already scaled (llama3, YaRN ...).
  const Tensor* inv_freq = nullptr;
  // Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
  float attention_scaling = 1.0f;
};

// Which KV slots each sequence of a batch reads. Sequence s owns query rows
// [q_start[s], q_start[s+1]) and reads the KV slots
// kv_slots[kv_start[s] .. kv_start[s+1]) in position order. Its query rows are
// the last rows of that sequence, so query row i of a sequence with q_len
// queries and kv_len keys sits at position kv_len - q_len + i and attends to
// keys 0 ..= that position (causal), and no further back than sliding_window
// keys when sliding_window > 0. All three are i32 tensors on the backend's device.
struct AttentionLayout {
  Tensor q_start;   // i32 [num_seqs + 1]
  Tensor kv_start;  // i32 [num_seqs + 1]
  Tensor kv_slots;  // i32 [kv_start[num_seqs]]
};

struct AttentionParams {
  int num_heads = 0;
  int num_kv_heads = 0;  // num_heads % num_kv_heads == 0 (GQA)
  int head_dim = 0;      // of queries and keys
  int v_head_dim = 0;    // of values
  float scale = 0.0f;    // softmax scale, usually 1/sqrt(head_dim)
  int sliding_window = 0;
};

// One row's sampling controls. Sampling is deterministic in (seed, step): the
// same seed and step give the same draw on every backend.
struct SamplingRow {
  float temperature = 1.0f;  // 0 means greedy (argmax)
  int top_k = 0;             // 0 means off
  float top_p = 1.0f;        // 1 means off
  float min_p = 0.0f;        // 0 means off
  uint64_t seed = 0;
  uint64_t step = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // Memory on this backend's device.
  virtual Tensor empty(Shape shape, DType dtype) = 0;
  // Copies between host and this device, or within it; same dtype and numel.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;

  // out[t, :] = table[ids[t], :] as f32. ids i32 [T]; table [V, H].
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // out[t, n] = sum_k x[t, k] * w[n, k] + bias[n]. x [T, K]; w [N, K]; bias [N] or null.
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * weight, per row. x, out [T, H]; weight [H].
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // residual += x, then out = rms_norm(residual): the pre-norm residual step.
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                            Tensor& out) = 0;
  // Rotates x [T, num_heads * head_dim] in place at positions (i32 [T]).
  virtual void rope(Tensor& x, const Tensor& positions, const RopeParams& params) = 0;
  // k_cache[slots[t], :] = k[t, :], v_cache[slots[t], :] = v[t, :].
  // k [T, kv_heads * head_dim], v [T, kv_heads * v_head_dim]; slots i32 [T].
  virtual void store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                        Tensor& v_cache) = 0;
  // Causal attention of q [T, num_heads * head_dim] over the cached keys and
  // values that `layout` names. out [T, num_heads * v_head_dim].
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionLayout& layout, const AttentionParams& params,
                         Tensor& out) = 0;
  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up [T, 2I]; out [T, I].
  virtual void silu_and_mul(const Tensor& gate_up, Tensor& out) = 0;
  // out = a + b, elementwise, same shapes (out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // Row-wise softmax of x [R, C] into out (may alias x).
  virtual void softmax(const Tensor& x, Tensor& out) = 0;
  // Row-wise log-softmax of x [R, C] into out (may alias x).
  virtual void log_softmax(const Tensor& x, Tensor& out) = 0;
  // out i32 [R] = argmax of each row of logits [R, V] (lowest index on ties).
  virtual void argmax(const Tensor& logits, Tensor& out) = 0;
  // Draws one token per row of logits [R, V] under rows[r]; out i32 [R].
  // Order of filters: temperature, then top-k, top-p, min-p on the softmax.
  virtual void sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) = 0;
};

}  // namespace basalt
