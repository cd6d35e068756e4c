// Backend: the op set that model code is written against.
//
// Contract: an architecture describes its forward pass only as calls on this
// interface, so the same model code runs on every backend. Each op takes
// tensors that live on the backend's device and writes into caller-allocated
// outputs of the documented shape; ops never allocate their outputs. Each op
// is a public non-virtual function that checks its arguments against this
// contract once (backend.cc: placement, shapes, dtypes, parameters, and on a
// host backend the indices it would follow), a mismatch throwing
// basalt::Error, and then calls the backend's protected virtual *_impl,
// which checks only what is its own. Every op of every backend is tested
// against a plain scalar reference on random inputs by one table-driven test
// (backend/backend_ops_test.cc).
//
// Activations ("x", "out") are row-major [tokens, features]. On the CPU backend
// activations are f32; weights may be f32, bf16 or f16, or f8_e4m3 with
// block-wise scales (LinearWeight). Linear weights use the Hugging Face layout
// [out_features, in_features].
//
// Batch invariance: a backend is batch-invariant when every op computes each
// output row (token) by the same floating-point operations whatever else the
// call holds: row r of an op's result has the same bits alone or among any
// other rows, for any token count, thread count or split of the work, and an
// attention query (standard or MLA, either form) gives the same bits over
// the same cached keys at the same position whether its prompt was prefilled
// in one call or in chunks. A serving engine that batches requests together
// (continuous batching, chunked prefill) then produces, for greedy and
// seeded sampling, the same tokens for a request alone as in a crowd. Each
// backend states in its header whether it meets this requirement (the CPU
// backend does); one that does not still meets every op's tolerance against
// the references.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "core/int_weights.h"
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
  // Features [rotary_offset, rotary_offset + rotary_dim) of each head rotate
  // (DeepSeek's rope dims follow the nope dims); 0 for every other family.
  int rotary_offset = 0;
};

// Edge of the square blocks of block-wise FP8 weights (DeepSeek-V3's
// weight_block_size [128, 128]).
inline constexpr int64_t kFp8BlockSize = 128;

// A linear layer's weight as a checkpoint stores it: weight [N, K] in f32,
// bf16 or f16; or f8_e4m3 with scale_inv f32 [ceil(N/128), ceil(K/128)], where
// element (n, k) means weight[n, k] * scale_inv[n / 128, k / 128] (the last
// blocks of a dimension may be partial). scale_inv is empty (no memory) for
// unscaled weights. Or an integer format (int_layout.bits 8 or 4,
// core/int_weights.h): weight holds the codes (i8 [N, blocks * 32] or
// packed u8 [N, blocks * 16]) and scales the f16 group scales [N, groups];
// such a weight goes through Backend::linear_int.
struct LinearWeight {
  LinearWeight() = default;
  // A float weight, or block FP8 with its scale_inv.
  LinearWeight(Tensor w, Tensor block_scale_inv = Tensor())
      : weight(std::move(w)), scale_inv(std::move(block_scale_inv)) {}

  Tensor weight;
  Tensor scale_inv;
  Tensor scales;
  IntWeightLayout int_layout;
  bool block_fp8() const { return scale_inv.raw() != nullptr; }
  bool int_quantized() const { return int_layout.bits != 0; }
  // K: the in_features the weight multiplies.
  int64_t in_features() const { return int_quantized() ? int_layout.in_features : weight.dim(1); }
};

// Backend::fp8_compute: activations quantized to FP8 (w8a8) or kept (w8a16).
enum class Fp8Compute : uint8_t { kW8A8, kW8A16 };
const char* fp8_compute_name(Fp8Compute mode);

// Mixture-of-experts routing (DeepSeek V2/V3).
enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };
struct MoeRouteParams {
  MoeScoring scoring = MoeScoring::kSoftmax;
  int top_k = 0;         // experts per token
  int num_groups = 1;    // experts split into num_groups equal groups
  int topk_groups = 1;   // groups a token may choose from
  bool normalize = false;  // divide the chosen weights by their sum
  float scaling = 1.0f;    // routed_scaling_factor, applied last
};

// One expert: silu(x · gateᵀ) * (x · upᵀ), then · downᵀ.
// gate, up [I, H]; down [H, I].
struct MoeExpert {
  LinearWeight gate, up, down;
};

// Multi-head latent attention (DeepSeek V2/V3) dimensions.
struct MlaParams {
  int num_heads = 0;
  int kv_lora_rank = 0;      // L: latent width
  int qk_nope_head_dim = 0;  // Dn
  int qk_rope_head_dim = 0;  // R
  int v_head_dim = 0;        // Dv
  float scale = 0.0f;        // softmax scale
};

// Which KV slots each sequence of a batch reads. Sequence s owns query rows
// [q_start[s], q_start[s+1]) and reads the KV slots
// kv_slots[kv_start[s] .. kv_start[s+1]) in position order. Its query rows are
// the last rows of that sequence, so query row i of a sequence with q_len
// queries and kv_len keys sits at position kv_len - q_len + i and attends to
// keys 0 ..= that position (causal), and no further back than sliding_window
// keys when sliding_window > 0. All three are i32 tensors on the backend's device.
//
// Edge cases every backend handles the same way (an engine that replays
// captured CUDA graphs pads its batches with them, so a layout's tensors keep
// fixed shapes from step to step):
//  * kv_slots may hold more entries than kv_start[num_seqs]; the entries past
//    it are never read (their values may be anything).
//  * A sequence may have fewer keys than queries (q_len > kv_len, e.g. q_len 1
//    over kv_len 0, a padding sequence): its query rows at negative positions
//    see no key and their output rows are zero (never NaN); its rows at
//    positions >= 0, if any, attend as usual.
struct AttentionLayout {
  Tensor q_start;   // i32 [num_seqs + 1]
  Tensor kv_start;  // i32 [num_seqs + 1]
  Tensor kv_slots;  // i32 [>= kv_start[num_seqs]]
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

// A sequence of a backend's ops recorded once (a CUDA graph) and enqueued
// again by replay(), reading and writing the same memory each time.
class RecordedOps {
 public:
  virtual ~RecordedOps() = default;
  virtual void replay() = 0;
};

// One adjustment of one logit (the per-request logits processors' work,
// merged per token so that one pass applies it): with x = logits[row, token],
//   x = suppress ? -inf : apply_rep(x + bias, repetition) - subtract,
//   apply_rep(x, r) = x > 0 ? x / r : x * r   (r = 1: no repetition penalty),
// each step one f32 operation rounded to nearest (no fused multiply-add).
// This is vLLM's order (min_tokens suppression, logit_bias, repetition
// penalty, then frequency/presence as one subtraction) folded into one edit:
// applying the steps one after the other gives the same value, except that
// x + 0 turns a -0 into +0 (no sampler or logprob tells the two apart).
struct LogitEdit {
  int32_t row = 0;
  int32_t token = 0;
  float bias = 0.0f;        // finite
  float repetition = 1.0f;  // > 0 and finite
  float subtract = 0.0f;    // finite
  bool suppress = false;
};

// The one definition of a LogitEdit's arithmetic (host side; the CUDA kernel
// spells out the same operations).
inline float apply_logit_edit(float x, const LogitEdit& e) {
  if (e.suppress) return -std::numeric_limits<float>::infinity();
  x = x + e.bias;
  // volatile: the product must be rounded before the subtraction; GCC's
  // default -ffp-contract=fast would otherwise fuse the two into one FMA,
  // and the device (which rounds each step) would disagree in the last bit.
  const volatile float scaled = x > 0.0f ? x / e.repetition : x * e.repetition;
  return scaled - e.subtract;
}

// The largest k that Backend::top_k_rows supports.
inline constexpr int kMaxTopKRows = 64;

// The ops of the Backend interface, for Backend::supports and for tests that
// run every op of every backend.
// clang-format off
enum class BackendOp : uint8_t {
  kEmbedding, kLinear, kRmsNorm, kAddRmsNorm, kRope, kStoreKv, kQkvRopeStore, kAttention, kSiluAndMul, kAdd,
  kSoftmax, kLogSoftmax, kArgmax, kSample, kAdjustLogits, kApplyTokenBitmask, kTopKRows, kGatherRows,
  kLinearFp8Block, kMoeRoute, kMoeExperts, kMlaStoreKv, kMlaAttention, kMlaExpandKv, kConcatColumns, kLinearInt,
  kMoeCombine, kCopyIndexed, kRankRows,
  kCount  // not an op
};
// clang-format on
const char* to_string(BackendOp op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  // Which device of its kind (the GPU's index; 0 for the CPU).
  virtual int ordinal() const { return 0; }
  // Makes this backend's device current on the calling thread (a GPU
  // backend's ops run on the thread's current device). Cheap; a thread that
  // drives a backend calls it before its ops.
  virtual void make_current() {}
  // Whether the backend implements the op (calling one it does not throws
  // basalt::Error). The CPU backend implements every op; the CUDA backend
  // all but linear_int.
  virtual bool supports(BackendOp op) const {
    (void)op;
    return true;
  }

  // Memory on this backend's device.
  virtual Tensor empty(Shape shape, DType dtype) = 0;
  // Copies between host and this device, or within it; same dtype and numel.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Host memory `src` into this device's `dst`, ordered after the ops
  // already enqueued, without waiting for them: `src` may be reused or freed
  // as soon as it returns (a GPU backend stages it in pinned memory). For
  // small per-step inputs (token masks) that are ready before the device
  // has finished the work they follow. The default is copy().
  virtual void upload(const Tensor& src, Tensor& dst) { copy(src, dst); }
  // A device-to-host copy that download() started: `dst` holds the data
  // once wait() has returned (wait() again returns at once). Destroying it
  // unwaited waits for the copy and leaves `dst` as it was.
  class PendingDownload {
   public:
    virtual ~PendingDownload() = default;
    virtual void wait() = 0;
  };
  // This device's `src` into host memory `dst`, ordered after the ops
  // already enqueued, without waiting for them: the host goes on (with the
  // next step's planning, say) while the device computes. `dst` must
  // outlive the returned object. The default is copy(), done at once.
  virtual std::unique_ptr<PendingDownload> download(const Tensor& src, Tensor& dst);

  // The dtype model code gives the activations that only feed linear layers
  // (normalised hidden states, attention outputs, the MLP's gated product)
  // of a model whose linear weights have dtype `weights`: f32 on the CPU; a
  // GPU backend may ask for bf16 under bf16 weights, which halves their
  // traffic and is the precision the tensor cores multiply in anyway.
  // Residual streams, projections' outputs and logits stay f32.
  virtual DType activation_dtype(DType weights) const {
    (void)weights;
    return DType::kF32;
  }

  // Records the ops that `ops` enqueues, without running them, for replay.
  // Returns null on a backend that cannot record (the CPU's). While
  // recording, no op may wait for the device (no copy() to or from host
  // memory) and memory the ops allocate comes from a pool kept for recorded
  // ops. A replay reads its inputs from the same addresses again: callers
  // update them in place between replays and keep every tensor the ops use
  // alive as long as the recording.
  virtual std::unique_ptr<RecordedOps> record(const std::function<void()>& ops) {
    (void)ops;
    return nullptr;
  }
  // Whether record() records (false: it returns null).
  virtual bool can_record() const { return false; }

  // How block-FP8 weights (linear_fp8_block, FP8 experts) are multiplied:
  // kW8A8 quantizes the activations per token in 1x128 groups and
  // multiplies in FP8 (DeepSeek-V3's own inference; the GPU's fast path),
  // kW8A16 keeps the activations and multiplies by the dequantized weights
  // (weight-only: only the weights' own rounding). The CPU backend computes
  // kW8A16 only; the CUDA backend both, kW8A8 by default. set_fp8_compute
  // throws basalt::Error for a mode the backend does not compute; call it
  // before the first op.
  virtual Fp8Compute fp8_compute() const { return Fp8Compute::kW8A16; }
  virtual void set_fp8_compute(Fp8Compute mode);

  // Batch invariance: each row of every op's result depends only on that
  // row's inputs (for attention: its own query, position and keys), never on
  // the other rows of the call or on its size, so a token gets the same bits
  // alone, in a batch, in a prefill chunk or in a speculative verification
  // (vLLM's and SGLang's batch-invariant / deterministic modes). The CPU and
  // reference backends always are; the CUDA backend is not by default (it
  // picks kernels by shape) and becomes so, slower, under
  // set_batch_invariant(true) (cuda_backend.h). set_batch_invariant(true)
  // throws basalt::Error on a backend that cannot be; call it before the
  // first op.
  virtual bool batch_invariant() const { return false; }
  virtual void set_batch_invariant(bool on);

  // out[t, :] = table[ids[t], :] as f32. ids i32 [T]; table [V, H].
  void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
  // out[t, n] = sum_k x[t, k] * w[n, k] + bias[n]. x [T, K]; w [N, K]; bias [N] or null.
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out);
  // out = x / sqrt(mean(x^2) + eps) * weight, per row. x, out [T, H]; weight [H].
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
  // residual += x, then out = rms_norm(residual): the pre-norm residual step.
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                    Tensor& out);
  // Rotates x [T, num_heads * head_dim] in place at positions (i32 [T]).
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params);
  // k_cache[slots[t], :] = k[t, :], v_cache[slots[t], :] = v[t, :].
  // k [T, kv_heads * head_dim], v [T, kv_heads * v_head_dim]; slots i32 [T].
  // A token whose slot is negative (a padding token) is skipped: nothing is
  // stored for it on any backend.
  void store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                Tensor& v_cache);
  // The attention block's input stage on a fused projection: qkv [T,
  // (num_heads + 2 * num_kv_heads) * head_dim], each row q | k | v. Per
  // token, every q and k head is RMS-normalised over head_dim with q_norm /
  // k_norm ([head_dim]) when they are given (Qwen3), then rotated at
  // positions[t] (rope.head_dim is the head size; rope.num_heads is ignored);
  // q goes to q_out [T, num_heads * head_dim] and k, v go to
  // k_cache[slots[t]], v_cache[slots[t]] (nothing stored for a negative
  // slot). Equal to rms_norm, rope and store_kv applied to the split columns.
  void qkv_rope_store(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                      const Tensor& positions, const RopeParams& rope, int num_heads,
                      int num_kv_heads, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                      Tensor& q_out);
  // Causal attention of q [T, num_heads * head_dim] over the cached keys and
  // values that `layout` names. out [T, num_heads * v_head_dim].
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionLayout& layout, const AttentionParams& params, Tensor& out);
  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up [T, 2I]; out [T, I].
  void silu_and_mul(const Tensor& gate_up, Tensor& out);
  // out = a + b, elementwise, same shapes (out may alias a or b).
  void add(const Tensor& a, const Tensor& b, Tensor& out);
  // Row-wise softmax of x [R, C] into out (may alias x).
  void softmax(const Tensor& x, Tensor& out);
  // Row-wise log-softmax of x [R, C] into out (may alias x).
  void log_softmax(const Tensor& x, Tensor& out);
  // out i32 [R] = argmax of each row of logits [R, V] (lowest index on ties).
  void argmax(const Tensor& logits, Tensor& out);
  // Draws one token per row of logits [R, V] under rows[r]; out i32 [R].
  // Order of filters: temperature, then top-k, top-p, min-p on the softmax.
  void sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out);
  // Applies `edits` (host memory) to logits f32 [R, V] in place. Every edit
  // names a row in [0, R) and a token in [0, V), and no (row, token) appears
  // twice; otherwise the call throws before changing anything.
  void adjust_logits(Tensor& logits, std::span<const LogitEdit> edits);
  // Masks logits f32 [R, V] in place with a whole-vocabulary bitmask i32
  // [R, ceil(V / 32)] on this device: logits[r, t] becomes -inf where bit
  // t % 32 of bitmask[r, t / 32] is clear (the tokens a constraint forbids).
  void apply_token_bitmask(Tensor& logits, const Tensor& bitmask);
  // Per row of x f32 [R, C], the k largest values in descending order, ties
  // (equal values, -0 == +0) to the lower column; NaN ranks below -inf.
  // 1 <= k <= min(C, kMaxTopKRows). values f32 [R, k]; ids i32 [R, k].
  void top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids);
  // out[r] = x[r, cols[r]]. x f32 [R, C]; cols i32 [R]; out f32 [R]. A column
  // outside [0, C) throws on host backends (the CUDA backend, which does not
  // read cols back, writes NaN there).
  void gather_rows(const Tensor& x, const Tensor& cols, Tensor& out);
  // out[r] = 1 + the number of entries of row r greater than x[r, cols[r]]:
  // that entry's rank in the row, as vLLM reports a prompt token's logprob
  // (ties share the better rank; NaN entries count as not greater). x f32
  // [R, C]; cols i32 [R]; out i32 [R]. A column outside [0, C) throws on
  // host backends (the CUDA backend writes 0 there).
  void rank_rows(const Tensor& x, const Tensor& cols, Tensor& out);
  // dst[dst_index[k]] = src[src_index[k]] for every k, in place: tokens that
  // live on this device (a draft head's drafts) written into another
  // step's input ids without a trip through the host. src i32 [N]; dst i32
  // [M]; src_index and dst_index i32 [K], K >= 0. An index outside its
  // tensor, or a dst index named twice, throws on host backends (the CUDA
  // backend, which does not read the indices back, skips such a pair).
  void copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index);

  // --- DeepSeek V2/V3 ------------------------------------------------------
  // out[t, n] = sum_k x[t, k] * w[n, k] * scale_inv[n / 128, k / 128].
  // x f32 [T, K]; w f8_e4m3 [N, K]; scale_inv f32 [ceil(N/128), ceil(K/128)].
  void linear_fp8_block(const Tensor& x, const Tensor& w, const Tensor& scale_inv, Tensor& out);
  // out = x · wᵀ (+ bias) for an integer-format weight (w.int_quantized()),
  // summed as core/int_weights.h defines (activations quantized per block
  // of 32 columns). x f32 [T, K]; out f32 [T, N]; bias f32/bf16/f16 [N] or
  // null. Host backends only (supports(kLinearInt)).
  void linear_int(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out);
  // Lets the backend keep an integer-format weight in a layout its kernels
  // read faster (the CPU backend interleaves the rows of the codes and
  // scales where its vector kernel takes them so, core/int_weights.h): w's
  // tensors may be replaced by new ones, never written, and its products
  // keep their bits. Model loaders call it once per weight, after the weight is on this
  // backend. Other weights, and backends without such a layout, are left as
  // they are.
  void prepare_int_weight(LinearWeight& w);
  // Chooses experts per token from router logits f32 [T, E]. Scores are
  // softmax(logits) or sigmoid(logits); selection uses scores + bias (bias f32
  // [E], sigmoid only, may be null). With num_groups > 1 each group is ranked
  // by the sum of its two best biased scores (with a bias) or its best score
  // (without), the best topk_groups groups are kept and the other groups'
  // experts are excluded; then the top_k experts by biased score are taken.
  // weights are the unbiased scores of the chosen experts, divided by their
  // sum when normalize, times scaling. ids i32 [T, top_k], weights f32
  // [T, top_k], in order of decreasing biased score (lower id on ties).
  void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                 Tensor& ids, Tensor& weights);
  // out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]). x [T, H] (f32,
  // or bf16 on a backend that computes in bf16); out f32 [T, H]; ids i32
  // [T, k] indexing experts; weights f32 [T, k]. Each expert runs only on the
  // tokens routed to it. out must not overlap x. With first_expert >= 0
  // (expert parallelism) `experts` are the model's experts [first_expert,
  // first_expert + experts.size()), ids name the model's experts (any i32),
  // and a pair routed outside that slice adds nothing (a token with none
  // gets a row of zeros).
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                   std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert = -1);
  // out[t] = sum over j, in order, of weights[t, j] * rows[positions[t, j]]:
  // the combine of routed experts whose results came back as rows, one per
  // (token, choice) (DP attention's all-to-all, model/deepseek_v3.h). rows
  // f32 [P, H]; positions i32 [T, k], each in [0, P) or negative (the pair
  // adds nothing); weights f32 [T, k]; out f32 [T, H], not overlapping rows.
  // Host backends check the positions; the CUDA backend, which does not read
  // them back, trusts them (a position past P reads outside rows there).
  void moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out);
  // The MLA cache write: for each token t, row = kv_a[t] = [latent (L) | k_pe (R)];
  // cache[slots[t]] = [rms_norm(latent) * norm_weight | rope(k_pe at positions[t])].
  // kv_a f32 [T, L + R]; norm_weight [L]; cache f32 or bf16 [S, L + R]. rope
  // uses num_heads 1, head_dim = rotary_dim = R and rotary_offset 0. A token
  // whose slot is negative (padding) is skipped, as in store_kv.
  void mla_store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                    const Tensor& positions, const RopeParams& rope, const Tensor& slots,
                    Tensor& cache);
  // The weight-absorbed MLA attention (decode form). q [T, heads * (Dn + R)]
  // with rope applied to each head's last R features; kv_b [heads * (Dn + Dv), L]
  // (per head Dn key rows then Dv value rows). Per head h, the query
  // [q_nope · W_uk(h) | q_pe] attends (causally, as in `attention`) over the
  // cached rows as one shared key head; the values are the rows' latent part;
  // the result goes out through W_uv(h). out [T, heads * Dv]; q and out are
  // f32, or bf16 on a backend that computes in bf16. The layout
  // is read as `attention` reads it: query rows at negative positions
  // (padding sequences) give zero rows, and kv_slots entries past
  // kv_start[num_seqs] are ignored.
  void mla_attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                     const AttentionLayout& layout, const MlaParams& params, Tensor& out);
  // The expanded MLA form (prefill): for each i, latent row c = cache[slots[i]],
  // k[i, h] = [c[:L] · W_uk(h)ᵀ | c[L:]] and v[i, h] = c[:L] · W_uv(h)ᵀ.
  // slots i32 [S]; k [S, heads * (Dn + R)] and v [S, heads * Dv], both f32 or
  // both bf16 (values rounded once from f32; a model passes its latent
  // cache's dtype, so that a bf16 cache's expansion feeds the tensor-core
  // attention path). With these, `attention` (num_kv_heads == num_heads)
  // gives mla_attention's result.
  void mla_expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                     const MlaParams& params, Tensor& k, Tensor& v);
  // out[t] = [a[t] | b[t]]. a [T, A]; b [T, B]; out [T, A + B], all of one
  // activation dtype (the MTP layer's concatenation of embedding and hidden
  // state).
  void concat_columns(const Tensor& a, const Tensor& b, Tensor& out);

 protected:
  // The backend's work for each op, called after the arguments passed the
  // contract checks (backend.cc); an implementation checks only what is its
  // own (a dtype or size its kernels do not take).
  virtual void embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  virtual void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) = 0;
  virtual void rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  virtual void add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                 Tensor& out) = 0;
  virtual void rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) = 0;
  virtual void store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                             Tensor& v_cache) = 0;
  virtual void qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm,
                                   float eps, const Tensor& positions, const RopeParams& rope,
                                   int num_heads, int num_kv_heads, const Tensor& slots,
                                   Tensor& k_cache, Tensor& v_cache, Tensor& q_out) = 0;
  virtual void attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const AttentionLayout& layout, const AttentionParams& params,
                              Tensor& out) = 0;
  virtual void silu_and_mul_impl(const Tensor& gate_up, Tensor& out) = 0;
  virtual void add_impl(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void softmax_impl(const Tensor& x, Tensor& out) = 0;
  virtual void log_softmax_impl(const Tensor& x, Tensor& out) = 0;
  virtual void argmax_impl(const Tensor& logits, Tensor& out) = 0;
  virtual void sample_impl(const Tensor& logits, std::span<const SamplingRow> rows,
                           Tensor& out) = 0;
  virtual void adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) = 0;
  virtual void apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) = 0;
  virtual void top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) = 0;
  virtual void gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) = 0;
  virtual void rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) = 0;
  virtual void copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst,
                                 const Tensor& dst_index) = 0;
  virtual void linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                                     Tensor& out) = 0;
  // Not pure: backends without integer kernels leave it (supports says so).
  virtual void linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out);
  virtual void prepare_int_weight_impl(LinearWeight& w) { (void)w; }
  virtual void moe_route_impl(const Tensor& logits, const Tensor* bias,
                              const MoeRouteParams& params, Tensor& ids, Tensor& weights) = 0;
  virtual void moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) = 0;
  virtual void mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                                 const Tensor& positions, const RopeParams& rope,
                                 const Tensor& slots, Tensor& cache) = 0;
  virtual void mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                                  const AttentionLayout& layout, const MlaParams& params,
                                  Tensor& out) = 0;
  virtual void mla_expand_kv_impl(const Tensor& cache, const Tensor& slots,
                                  const LinearWeight& kv_b, const MlaParams& params, Tensor& k,
                                  Tensor& v) = 0;
  virtual void concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights,
                                Tensor& out) = 0;
};

}  // namespace basalt
