// The Backend ops' public entry points: each checks its arguments against the
// contract of backend.h, once, and then runs the backend's implementation.
//
// What is checked here, for every backend alike: every tensor lives on the
// backend's device and has memory; ranks, shapes and the relations between
// arguments; dtypes within the set the contract allows (activations are f32,
// or bf16 where the backend computes in bf16: activation_dtype(bf16) == bf16);
// the parameter structs; and, on a host backend (whose inputs the host can
// read), every index an op would follow (token ids, cache slots, layout
// offsets, expert ids, columns). A backend's *_impl checks only what is its
// own: a dtype it does not implement among those the contract allows, a size
// its kernels cannot take.
#include "backend/backend.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>

#include "backend/reference_ops.h"
#include "core/error.h"

// The message's arguments (descriptions of tensors, shapes) are built only
// when the condition fails: checks run on every op call.
#define REQUIRE(check, cond, ...)           \
  do {                                      \
    if (!(cond)) (check).fail(__VA_ARGS__); \
  } while (0)

namespace basalt {
namespace {

// A set of dtypes, one bit per DType.
using DTypes = uint32_t;
constexpr DTypes bit(DType d) { return DTypes{1} << static_cast<unsigned>(d); }
constexpr DTypes kF32 = bit(DType::kF32);
constexpr DTypes kI32 = bit(DType::kI32);
constexpr DTypes kCacheDTypes = bit(DType::kF32) | bit(DType::kBF16);
constexpr DTypes kBiasDTypes = bit(DType::kF32) | bit(DType::kBF16) | bit(DType::kF16);
constexpr DTypes kWeightDTypes = kBiasDTypes | bit(DType::kF8E4M3);

std::string dtype_names(DTypes set) {
  std::string names;
  for (DType d :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI32, DType::kI64}) {
    if ((set & bit(d)) == 0) continue;
    if (!names.empty()) names += " or ";
    names += dtype_name(d);
  }
  return names;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// The checks of one call of one op; every failure names the op.
class OpCheck {
 public:
  OpCheck(const Backend& backend, const char* op)
      : op_(op),
        device_(backend.device()),
        activations_(kF32 | bit(backend.activation_dtype(DType::kBF16))) {}

  const char* op() const { return op_; }
  // Whether the host can read the arguments' values.
  bool host() const { return device_ == Device::kCpu; }
  // f32, and bf16 on a backend that computes in it.
  DTypes activations() const { return activations_; }

  // Throws, naming the op. Called through REQUIRE, which formats nothing
  // unless the check fails.
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    basalt::fail("{}: {}", op_, fmt::format(format, std::forward<Args>(args)...));
  }

  // t is on the backend's device, has memory, a dtype in `dtypes` and (unless
  // rank < 0) the given rank.
  void tensor(const Tensor& t, const char* name, DTypes dtypes, int rank = -1) const {
    REQUIRE(*this, t.device() == device_, "{} must be on the {} device, got {}", name,
            device_name(device_), t.describe());
    REQUIRE(*this, t.numel() == 0 || t.raw() != nullptr, "{} {} has no memory", name, t.describe());
    REQUIRE(*this, (dtypes & bit(t.dtype())) != 0, "{} must be {}, got {}", name,
            dtype_names(dtypes), t.describe());
    REQUIRE(*this, rank < 0 || t.rank() == rank, "{} must have rank {}, got {}", name, rank,
            t.describe());
  }
  void shape(const Tensor& t, const char* name, const Shape& shape) const {
    REQUIRE(*this, t.shape() == shape, "{} must have shape {}, got {}", name, shape_string(shape),
            t.describe());
  }
  // A cache: rank >= 2, at least one slot, each slot a row of `width` elements.
  void cache(const Tensor& t, const char* name, int64_t width) const {
    tensor(t, name, kCacheDTypes);
    REQUIRE(*this, t.rank() >= 2 && t.dim(0) > 0 && t.numel() == t.dim(0) * width,
            "{} {} must be [num_slots, {}] (rows of {} elements)", name, t.describe(), width,
            width);
  }
  // A linear weight [n, k] as LinearWeight describes it.
  void linear_weight(const LinearWeight& w, const char* name, int64_t n, int64_t k) const {
    if (w.int_quantized()) {
      const IntWeightLayout& l = w.int_layout;
      const std::string error = int_layout_error(l);
      REQUIRE(*this, error.empty(), "{}: {}", name, error);
      REQUIRE(*this, l.in_features == k, "{} has in_features {}, expected {}", name, l.in_features, k);
      REQUIRE(*this, !w.block_fp8(), "{} has both integer and FP8 block scales", name);
      tensor(w.weight, name, bit(l.bits == 8 ? DType::kI8 : DType::kU8), 2);
      shape(w.weight, name, {n, l.code_columns()});
      tensor(w.scales, "scales", bit(DType::kF16), 2);
      shape(w.scales, "scales", {n, l.scale_columns()});
      return;
    }
    tensor(w.weight, name, kWeightDTypes, 2);
    shape(w.weight, name, {n, k});
    if (!w.block_fp8()) return;
    REQUIRE(*this, w.weight.dtype() == DType::kF8E4M3, "{} has block scales but is {}", name,
            w.weight.describe());
    tensor(w.scale_inv, "scale_inv", kF32, 2);
    shape(w.scale_inv, "scale_inv",
          {(n + kFp8BlockSize - 1) / kFp8BlockSize, (k + kFp8BlockSize - 1) / kFp8BlockSize});
  }
  // On a host backend: every entry of i32 t is below `limit`, and >= 0 unless
  // negative entries mean "skip".
  void indices(const Tensor& t, const char* name, int64_t limit, bool negative_skips,
               const char* what) const {
    if (!host()) return;
    const int32_t* v = t.data<const int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
      REQUIRE(*this, v[i] < limit && (negative_skips || v[i] >= 0),
              "{}[{}] = {} is outside the {} {}", name, i, v[i], limit, what);
  }
  void rope(const RopeParams& p) const {
    REQUIRE(*this,
            p.num_heads > 0 && p.head_dim > 0 && p.rotary_dim > 0 && p.rotary_dim % 2 == 0 &&
                p.rotary_offset >= 0 && p.rotary_offset + p.rotary_dim <= p.head_dim,
            "need num_heads > 0 and an even rotary_dim with rotary_offset + rotary_dim in (0, "
            "head_dim], got "
            "num_heads {}, head_dim {}, rotary_dim {}, rotary_offset {}",
            p.num_heads, p.head_dim, p.rotary_dim, p.rotary_offset);
    REQUIRE(*this, p.inv_freq != nullptr, "rope params lack inv_freq");
    tensor(*p.inv_freq, "inv_freq", kF32, 1);
    shape(*p.inv_freq, "inv_freq", {p.rotary_dim / 2});
    REQUIRE(*this, std::isfinite(p.attention_scaling), "attention_scaling {} is not finite",
            p.attention_scaling);
  }
  void eps(float eps) const {
    REQUIRE(*this, std::isfinite(eps) && eps >= 0, "eps {} must be finite and >= 0", eps);
  }
  // An attention layout over `tokens` query rows and a cache of `slots` rows.
  void layout(const AttentionLayout& l, int64_t tokens, int64_t slots) const {
    tensor(l.q_start, "q_start", kI32, 1);
    tensor(l.kv_start, "kv_start", kI32, 1);
    tensor(l.kv_slots, "kv_slots", kI32, 1);
    const int64_t seqs = l.q_start.dim(0) - 1;
    REQUIRE(*this, seqs >= 0 && l.kv_start.dim(0) == seqs + 1,
            "q_start {} and kv_start {} must both have num_seqs + 1 entries", l.q_start.describe(),
            l.kv_start.describe());
    REQUIRE(*this, tokens == 0 || seqs > 0, "{} query rows but no sequences", tokens);
    if (!host()) return;
    const int32_t* q_start = l.q_start.data<const int32_t>();
    const int32_t* kv_start = l.kv_start.data<const int32_t>();
    REQUIRE(*this, q_start[0] == 0 && q_start[seqs] == tokens,
            "q_start must run from 0 to the {} query rows, got {} .. {}", tokens, q_start[0],
            q_start[seqs]);
    REQUIRE(*this, kv_start[0] == 0 && kv_start[seqs] <= l.kv_slots.dim(0),
            "kv_start must run from 0 to at most the {} kv_slots, got {} .. {}", l.kv_slots.dim(0),
            kv_start[0], kv_start[seqs]);
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t q_len = int64_t{q_start[s + 1]} - q_start[s];
      const int64_t kv_len = int64_t{kv_start[s + 1]} - kv_start[s];
      REQUIRE(*this, q_len >= 0 && kv_len >= 0,
              "sequence {} has {} query rows and {} keys (need both >= 0)", s, q_len, kv_len);
    }
    const int32_t* kv_slots = l.kv_slots.data<const int32_t>();
    for (int64_t i = 0; i < kv_start[seqs]; ++i)  // entries past kv_start[num_seqs] are never read
      REQUIRE(*this, kv_slots[i] >= 0 && kv_slots[i] < slots,
              "kv_slots[{}] = {} is outside the cache's {} slots", i, kv_slots[i], slots);
  }
  void mla(const MlaParams& p) const {
    REQUIRE(
        *this,
        p.num_heads > 0 && p.kv_lora_rank > 0 && p.qk_nope_head_dim > 0 && p.qk_rope_head_dim > 0 &&
            p.qk_rope_head_dim % 2 == 0 && p.v_head_dim > 0 && std::isfinite(p.scale),
        "bad MLA params (heads {}, kv_lora_rank {}, nope {}, rope {}, v {}, scale {})", p.num_heads,
        p.kv_lora_rank, p.qk_nope_head_dim, p.qk_rope_head_dim, p.v_head_dim, p.scale);
  }

 private:
  static const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

  const char* op_;
  Device device_;
  DTypes activations_;
};

}  // namespace

void Backend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const OpCheck c(*this, "embedding");
  c.tensor(ids, "ids", kI32, 1);
  c.tensor(table, "table", kWeightDTypes, 2);
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", {ids.dim(0), table.dim(1)});
  c.indices(ids, "ids", table.dim(0), false, "rows of the table");
  embedding_impl(ids, table, out);
}

void Backend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const OpCheck c(*this, "linear");
  c.tensor(x, "x", c.activations(), 2);
  c.tensor(w, "w", kWeightDTypes, 2);
  c.tensor(out, "out", kF32, 2);
  REQUIRE(c, w.dim(1) == x.dim(1), "x {} and w {} disagree on in_features", x.describe(),
          w.describe());
  c.shape(out, "out", {x.dim(0), w.dim(0)});
  if (bias) {
    c.tensor(*bias, "bias", kBiasDTypes, 1);
    c.shape(*bias, "bias", {w.dim(0)});
  }
  REQUIRE(c, !overlaps(out, x) && !overlaps(out, w), "out {} overlaps its inputs", out.describe());
  linear_impl(x, w, bias, out);
}

void Backend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const OpCheck c(*this, "rms_norm");
  c.tensor(x, "x", c.activations(), 2);
  REQUIRE(c, x.dim(1) > 0, "x {} has no features", x.describe());
  c.tensor(weight, "weight", kWeightDTypes, 1);
  c.shape(weight, "weight", {x.dim(1)});
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", x.shape());
  c.eps(eps);
  rms_norm_impl(x, weight, eps, out);
}

void Backend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                           Tensor& out) {
  const OpCheck c(*this, "add_rms_norm");
  c.tensor(residual, "residual", c.activations(), 2);
  REQUIRE(c, residual.dim(1) > 0, "residual {} has no features", residual.describe());
  c.tensor(x, "x", c.activations(), 2);
  REQUIRE(c, x.shape() == residual.shape() && x.dtype() == residual.dtype(),
          "x {} must match residual {}", x.describe(), residual.describe());
  c.tensor(weight, "weight", kWeightDTypes, 1);
  c.shape(weight, "weight", {residual.dim(1)});
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", residual.shape());
  c.eps(eps);
  add_rms_norm_impl(residual, x, weight, eps, out);
}

void Backend::rope(Tensor& x, const Tensor& positions, const RopeParams& params) {
  const OpCheck c(*this, "rope");
  c.rope(params);
  c.tensor(x, "x", c.activations(), 2);
  REQUIRE(c, x.dim(1) == int64_t{params.num_heads} * params.head_dim,
          "x {} must be [tokens, {} heads × {}]", x.describe(), params.num_heads, params.head_dim);
  c.tensor(positions, "positions", kI32, 1);
  c.shape(positions, "positions", {x.dim(0)});
  rope_impl(x, positions, params);
}

void Backend::store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                       Tensor& v_cache) {
  const OpCheck c(*this, "store_kv");
  c.tensor(k, "k", c.activations(), 2);
  c.tensor(v, "v", c.activations(), 2);
  REQUIRE(c, k.dtype() == v.dtype() && k.dim(0) == v.dim(0),
          "k {} and v {} must be [tokens, width] of one dtype", k.describe(), v.describe());
  c.tensor(slots, "slots", kI32, 1);
  c.shape(slots, "slots", {k.dim(0)});
  c.cache(k_cache, "k_cache", k.dim(1));
  c.cache(v_cache, "v_cache", v.dim(1));
  REQUIRE(c, k_cache.dim(0) == v_cache.dim(0), "k_cache {} and v_cache {} differ in slots",
          k_cache.describe(), v_cache.describe());
  c.indices(slots, "slots", k_cache.dim(0), true, "cache slots");
  store_kv_impl(k, v, slots, k_cache, v_cache);
}

void Backend::qkv_rope_store(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm,
                             float eps, const Tensor& positions, const RopeParams& rope,
                             int num_heads, int num_kv_heads, const Tensor& slots, Tensor& k_cache,
                             Tensor& v_cache, Tensor& q_out) {
  const OpCheck c(*this, "qkv_rope_store");
  REQUIRE(c, num_heads > 0 && num_kv_heads > 0, "{} heads and {} kv heads", num_heads,
          num_kv_heads);
  RopeParams per_head = rope;
  per_head.num_heads = 1;  // rope.num_heads is ignored
  c.rope(per_head);
  const int64_t D = rope.head_dim, q_width = num_heads * D, kv_width = num_kv_heads * D;
  c.tensor(qkv, "qkv", c.activations(), 2);
  REQUIRE(c, qkv.dim(1) == q_width + 2 * kv_width, "qkv {} must be [tokens, {}]", qkv.describe(),
          q_width + 2 * kv_width);
  const int64_t T = qkv.dim(0);
  c.tensor(q_out, "q_out", c.activations(), 2);
  c.shape(q_out, "q_out", {T, q_width});
  c.tensor(positions, "positions", kI32, 1);
  c.shape(positions, "positions", {T});
  c.tensor(slots, "slots", kI32, 1);
  c.shape(slots, "slots", {T});
  c.cache(k_cache, "k_cache", kv_width);
  c.cache(v_cache, "v_cache", kv_width);
  REQUIRE(c, k_cache.dim(0) == v_cache.dim(0), "k_cache {} and v_cache {} differ in slots",
          k_cache.describe(), v_cache.describe());
  for (const Tensor* norm : {q_norm, k_norm}) {
    if (norm == nullptr) continue;
    c.tensor(*norm, "norm weight", kWeightDTypes, 1);
    c.shape(*norm, "norm weight", {D});
  }
  c.eps(eps);
  c.indices(slots, "slots", k_cache.dim(0), true, "cache slots");
  qkv_rope_store_impl(qkv, q_norm, k_norm, eps, positions, rope, num_heads, num_kv_heads, slots,
                      k_cache, v_cache, q_out);
}

void Backend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const AttentionLayout& layout, const AttentionParams& params, Tensor& out) {
  const OpCheck c(*this, "attention");
  const AttentionParams& p = params;
  REQUIRE(c,
          p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 &&
              p.head_dim > 0 && p.v_head_dim > 0 && p.sliding_window >= 0 && std::isfinite(p.scale),
          "bad params (num_heads {}, num_kv_heads {}, head_dim {}, v_head_dim {}, scale {}, "
          "sliding_window {})",
          p.num_heads, p.num_kv_heads, p.head_dim, p.v_head_dim, p.scale, p.sliding_window);
  c.tensor(q, "q", c.activations(), 2);
  const int64_t tokens = q.dim(0);
  c.shape(q, "q", {tokens, int64_t{p.num_heads} * p.head_dim});
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", {tokens, int64_t{p.num_heads} * p.v_head_dim});
  REQUIRE(c, !overlaps(out, q), "out {} overlaps q", out.describe());
  c.cache(k_cache, "k_cache", int64_t{p.num_kv_heads} * p.head_dim);
  c.cache(v_cache, "v_cache", int64_t{p.num_kv_heads} * p.v_head_dim);
  REQUIRE(c, k_cache.dim(0) == v_cache.dim(0), "k_cache {} and v_cache {} differ in slots",
          k_cache.describe(), v_cache.describe());
  c.layout(layout, tokens, k_cache.dim(0));
  attention_impl(q, k_cache, v_cache, layout, params, out);
}

void Backend::silu_and_mul(const Tensor& gate_up, Tensor& out) {
  const OpCheck c(*this, "silu_and_mul");
  c.tensor(gate_up, "gate_up", c.activations(), 2);
  REQUIRE(c, gate_up.dim(1) % 2 == 0, "gate_up {} must have an even width", gate_up.describe());
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", {gate_up.dim(0), gate_up.dim(1) / 2});
  REQUIRE(c, !overlaps(out, gate_up) || out.raw() == gate_up.raw(),
          "out {} partially overlaps gate_up", out.describe());
  silu_and_mul_impl(gate_up, out);
}

void Backend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const OpCheck c(*this, "add");
  c.tensor(a, "a", c.activations());
  c.tensor(b, "b", c.activations());
  c.tensor(out, "out", c.activations());
  REQUIRE(c,
          a.dtype() == b.dtype() && a.dtype() == out.dtype() && a.shape() == b.shape() &&
              a.shape() == out.shape(),
          "{} + {} into {}: shapes and dtypes must agree", a.describe(), b.describe(),
          out.describe());
  add_impl(a, b, out);
}

namespace {

void check_softmax(const OpCheck& c, const Tensor& x, const Tensor& out) {
  c.tensor(x, "x", kF32, 2);
  REQUIRE(c, x.dim(1) > 0, "x {} has empty rows", x.describe());
  c.tensor(out, "out", kF32, 2);
  c.shape(out, "out", x.shape());
}

void check_logits(const OpCheck& c, const Tensor& logits, const Tensor& out) {
  c.tensor(logits, "logits", kF32, 2);
  REQUIRE(c, logits.dim(1) > 0, "logits {} has empty rows", logits.describe());
  c.tensor(out, "out", kI32, 1);
  c.shape(out, "out", {logits.dim(0)});
}

}  // namespace

void Backend::softmax(const Tensor& x, Tensor& out) {
  check_softmax(OpCheck(*this, "softmax"), x, out);
  softmax_impl(x, out);
}

void Backend::log_softmax(const Tensor& x, Tensor& out) {
  check_softmax(OpCheck(*this, "log_softmax"), x, out);
  log_softmax_impl(x, out);
}

void Backend::argmax(const Tensor& logits, Tensor& out) {
  check_logits(OpCheck(*this, "argmax"), logits, out);
  argmax_impl(logits, out);
}

void Backend::sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) {
  const OpCheck c(*this, "sample");
  check_logits(c, logits, out);
  REQUIRE(c, static_cast<int64_t>(rows.size()) == logits.dim(0),
          "{} rows of controls for logits {}", rows.size(), logits.describe());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SamplingRow& s = rows[r];
    REQUIRE(c, std::isfinite(s.temperature) && s.temperature >= 0.0f,
            "rows[{}].temperature = {} must be finite and >= 0", r, s.temperature);
    REQUIRE(c, s.top_k >= 0, "rows[{}].top_k = {} must be >= 0", r, s.top_k);
    REQUIRE(c, s.top_p > 0.0f && s.top_p <= 1.0f, "rows[{}].top_p = {} must be in (0, 1]", r,
            s.top_p);
    REQUIRE(c, s.min_p >= 0.0f && s.min_p <= 1.0f, "rows[{}].min_p = {} must be in [0, 1]", r,
            s.min_p);
  }
  sample_impl(logits, rows, out);
}

void Backend::adjust_logits(Tensor& logits, std::span<const LogitEdit> edits) {
  const OpCheck c(*this, "adjust_logits");
  c.tensor(logits, "logits", kF32, 2);
  reference::check_logit_edits(edits, logits.dim(0), logits.dim(1), c.op());
  adjust_logits_impl(logits, edits);
}

void Backend::apply_token_bitmask(Tensor& logits, const Tensor& bitmask) {
  const OpCheck c(*this, "apply_token_bitmask");
  c.tensor(logits, "logits", kF32, 2);
  c.tensor(bitmask, "bitmask", kI32, 2);
  reference::check_token_bitmask(logits, bitmask, c.op());
  apply_token_bitmask_impl(logits, bitmask);
}

void Backend::top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids) {
  const OpCheck c(*this, "top_k_rows");
  c.tensor(x, "x", kF32, 2);
  c.tensor(values, "values", kF32, 2);
  c.tensor(ids, "ids", kI32, 2);
  reference::check_top_k_rows(x, k, values, ids, c.op());
  top_k_rows_impl(x, k, values, ids);
}

namespace {

// gather_rows and rank_rows: x [R, C] and one column per row, cols [R] (in
// [0, C) where the host can read them), into out [R] of out_dtypes, with
// the op's shape check.
void check_row_picks(const OpCheck& c, const Tensor& x, const Tensor& cols, const Tensor& out, DTypes out_dtypes,
                     void (*shapes)(const Tensor&, const Tensor&, const Tensor&, const char*)) {
  c.tensor(x, "x", kF32, 2);
  c.tensor(cols, "cols", kI32, 1);
  c.tensor(out, "out", out_dtypes, 1);
  shapes(x, cols, out, c.op());
  c.indices(cols, "cols", x.dim(1), false, "columns");
}

}  // namespace

void Backend::gather_rows(const Tensor& x, const Tensor& cols, Tensor& out) {
  check_row_picks(OpCheck(*this, "gather_rows"), x, cols, out, kF32, reference::check_gather_rows);
  gather_rows_impl(x, cols, out);
}

void Backend::rank_rows(const Tensor& x, const Tensor& cols, Tensor& out) {
  check_row_picks(OpCheck(*this, "rank_rows"), x, cols, out, kI32, reference::check_rank_rows);
  rank_rows_impl(x, cols, out);
}

void Backend::copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) {
  const OpCheck c(*this, "copy_indexed");
  c.tensor(src, "src", kI32, 1);
  c.tensor(src_index, "src_index", kI32, 1);
  c.tensor(dst, "dst", kI32, 1);
  c.tensor(dst_index, "dst_index", kI32, 1);
  reference::check_copy_indexed(src, src_index, dst, dst_index, c.op());
  c.indices(src_index, "src_index", src.dim(0), false, "elements of src");
  c.indices(dst_index, "dst_index", dst.dim(0), false, "elements of dst");
  if (c.host()) {
    std::vector<bool> named(static_cast<size_t>(dst.dim(0)), false);
    for (int64_t k = 0; k < dst_index.numel(); ++k) {
      const auto at = static_cast<size_t>(dst_index.data<const int32_t>()[k]);
      REQUIRE(c, !named[at], "dst_index[{}] = {} names an element already written", k, at);
      named[at] = true;
    }
  }
  if (src_index.numel() > 0) copy_indexed_impl(src, src_index, dst, dst_index);
}

const char* fp8_compute_name(Fp8Compute mode) { return mode == Fp8Compute::kW8A8 ? "w8a8" : "w8a16"; }

namespace {
class DoneDownload final : public Backend::PendingDownload {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<Backend::PendingDownload> Backend::download(const Tensor& src, Tensor& dst) {
  BASALT_CHECK(dst.device() == Device::kCpu, "download: {} into {} is not into host memory", src.describe(),
               dst.describe());
  copy(src, dst);
  return std::make_unique<DoneDownload>();
}

void Backend::set_fp8_compute(Fp8Compute mode) {
  BASALT_CHECK(mode == Fp8Compute::kW8A16,
               "the {} backend multiplies FP8 weights by unquantized activations (w8a16) only, not {}", name(),
               fp8_compute_name(mode));
}

void Backend::set_batch_invariant(bool on) {
  BASALT_CHECK(!on || batch_invariant(), "the {} backend has no batch-invariant mode", name());
}

void Backend::linear_fp8_block(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                               Tensor& out) {
  const OpCheck c(*this, "linear_fp8_block");
  c.tensor(x, "x", c.activations(), 2);
  c.tensor(w, "w", bit(DType::kF8E4M3), 2);
  REQUIRE(c, w.dim(1) == x.dim(1), "x {} and w {} disagree on in_features", x.describe(),
          w.describe());
  c.linear_weight(LinearWeight{w, scale_inv}, "w", w.dim(0), w.dim(1));
  REQUIRE(c, scale_inv.raw() != nullptr, "w {} needs its block scales", w.describe());
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", {x.dim(0), w.dim(0)});
  linear_fp8_block_impl(x, w, scale_inv, out);
}

void Backend::linear_int(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) {
  const OpCheck c(*this, "linear_int");
  REQUIRE(c, w.int_quantized(), "w {} is not in an integer format", w.weight.describe());
  c.tensor(x, "x", kF32, 2);
  c.tensor(w.weight, "w", bit(DType::kI8) | bit(DType::kU8), 2);
  c.linear_weight(w, "w", w.weight.dim(0), x.dim(1));
  c.tensor(out, "out", kF32, 2);
  c.shape(out, "out", {x.dim(0), w.weight.dim(0)});
  if (bias) {
    c.tensor(*bias, "bias", kBiasDTypes, 1);
    c.shape(*bias, "bias", {w.weight.dim(0)});
  }
  REQUIRE(c, !overlaps(out, x) && !overlaps(out, w.weight) && !overlaps(out, w.scales), "out {} overlaps its inputs",
          out.describe());
  linear_int_impl(x, w, bias, out);
}

void Backend::prepare_int_weight(LinearWeight& w) {
  if (!w.int_quantized()) return;
  const OpCheck c(*this, "prepare_int_weight");
  c.tensor(w.weight, "w", bit(DType::kI8) | bit(DType::kU8), 2);
  c.linear_weight(w, "w", w.weight.dim(0), w.int_layout.in_features);
  prepare_int_weight_impl(w);
}

void Backend::linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) {
  (void)x, (void)w, (void)bias, (void)out;
  fail("linear_int: the {} backend has no integer-weight kernels (int8/int4 checkpoints run on the CPU backend)",
       name());
}

void Backend::moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                        Tensor& ids, Tensor& weights) {
  const OpCheck c(*this, "moe_route");
  const MoeRouteParams& p = params;
  c.tensor(logits, "logits", kF32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  REQUIRE(c,
          p.top_k > 0 && p.num_groups > 0 && E % p.num_groups == 0 && p.topk_groups > 0 &&
              p.topk_groups <= p.num_groups && p.top_k <= p.topk_groups * (E / p.num_groups) &&
              std::isfinite(p.scaling),
          "top_k {}, num_groups {}, topk_groups {} do not fit {} experts (scaling {})", p.top_k,
          p.num_groups, p.topk_groups, E, p.scaling);
  c.tensor(ids, "ids", kI32, 2);
  c.shape(ids, "ids", {T, p.top_k});
  c.tensor(weights, "weights", kF32, 2);
  c.shape(weights, "weights", {T, p.top_k});
  if (bias) {
    c.tensor(*bias, "bias", kF32, 1);
    c.shape(*bias, "bias", {E});
  }
  moe_route_impl(logits, bias, params, ids, weights);
}

void Backend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                          std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) {
  const OpCheck c(*this, "moe_experts");
  c.tensor(x, "x", c.activations(), 2);
  const int64_t T = x.dim(0), H = x.dim(1);
  c.tensor(ids, "ids", kI32, 2);
  REQUIRE(c, ids.dim(0) == T, "ids {} must have a row per token of x {}", ids.describe(),
          x.describe());
  c.tensor(weights, "weights", kF32, 2);
  c.shape(weights, "weights", ids.shape());
  c.tensor(out, "out", kF32, 2);
  c.shape(out, "out", x.shape());
  REQUIRE(c, !overlaps(x, out), "out {} overlaps x", out.describe());
  REQUIRE(c, !experts.empty(), "no experts");
  // Expert 0 sets the shapes; the others are checked by the implementation
  // as it uses them (checking hundreds of experts on every call would cost
  // more than a small batch's work).
  const Tensor& g0 = experts[0].gate.weight;
  REQUIRE(c, g0.rank() == 2 && g0.dim(0) > 0 && experts[0].gate.in_features() == H,
          "expert 0's gate {} must be [I, {}] with I > 0", g0.describe(), H);
  c.linear_weight(experts[0].gate, "gate", g0.dim(0), H);
  c.linear_weight(experts[0].up, "up", g0.dim(0), H);
  c.linear_weight(experts[0].down, "down", H, g0.dim(0));
  if (first_expert < 0) {
    c.indices(ids, "ids", static_cast<int64_t>(experts.size()), false, "experts");
  } else {
    REQUIRE(c, first_expert + static_cast<int64_t>(experts.size()) <= std::numeric_limits<int32_t>::max(),
            "experts [{}, {}) lie past the ids' range", first_expert,
            first_expert + static_cast<int64_t>(experts.size()));
  }
  moe_experts_impl(x, ids, weights, experts, out, first_expert);
}

void Backend::moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) {
  const OpCheck c(*this, "moe_combine");
  c.tensor(rows, "rows", kF32, 2);
  c.tensor(positions, "positions", kI32, 2);
  c.tensor(weights, "weights", kF32, 2);
  c.shape(weights, "weights", positions.shape());
  c.tensor(out, "out", kF32, 2);
  c.shape(out, "out", {positions.dim(0), rows.dim(1)});
  REQUIRE(c, !overlaps(rows, out), "out {} overlaps rows", out.describe());
  c.indices(positions, "positions", rows.dim(0), true, "rows");
  moe_combine_impl(rows, positions, weights, out);
}

void Backend::mla_store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                           const Tensor& positions, const RopeParams& rope, const Tensor& slots,
                           Tensor& cache) {
  const OpCheck c(*this, "mla_store_kv");
  c.tensor(kv_a, "kv_a", kF32, 2);
  const int64_t T = kv_a.dim(0), R = rope.rotary_dim, L = kv_a.dim(1) - R;
  REQUIRE(c, L > 0 && rope.num_heads == 1 && rope.head_dim == R && rope.rotary_offset == 0,
          "rope must be one head of rotary_dim = head_dim < {} (the row of kv_a), got head_dim "
          "{}, rotary_dim {}",
          kv_a.dim(1), rope.head_dim, R);
  c.rope(rope);
  c.tensor(norm_weight, "norm_weight", kCacheDTypes, 1);
  c.shape(norm_weight, "norm_weight", {L});
  c.tensor(positions, "positions", kI32, 1);
  c.shape(positions, "positions", {T});
  c.tensor(slots, "slots", kI32, 1);
  c.shape(slots, "slots", {T});
  c.tensor(cache, "cache", kCacheDTypes, 2);
  c.cache(cache, "cache", L + R);
  c.eps(eps);
  c.indices(slots, "slots", cache.dim(0), true, "cache slots");
  mla_store_kv_impl(kv_a, norm_weight, eps, positions, rope, slots, cache);
}

void Backend::mla_attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                            const AttentionLayout& layout, const MlaParams& params, Tensor& out) {
  const OpCheck c(*this, "mla_attention");
  const MlaParams& p = params;
  c.mla(p);
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  c.tensor(q, "q", c.activations(), 2);
  const int64_t T = q.dim(0);
  c.shape(q, "q", {T, heads * (Dn + R)});
  c.tensor(out, "out", c.activations(), 2);
  c.shape(out, "out", {T, heads * Dv});
  c.tensor(cache, "cache", kCacheDTypes, 2);
  c.cache(cache, "cache", L + R);
  c.linear_weight(kv_b, "kv_b", heads * (Dn + Dv), L);
  REQUIRE(c, !kv_b.int_quantized(), "kv_b must be f32, bf16, f16 or block FP8, not an integer format");
  c.layout(layout, T, cache.dim(0));
  mla_attention_impl(q, cache, kv_b, layout, params, out);
}

void Backend::mla_expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                            const MlaParams& params, Tensor& k, Tensor& v) {
  const OpCheck c(*this, "mla_expand_kv");
  const MlaParams& p = params;
  c.mla(p);
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  c.tensor(cache, "cache", kCacheDTypes, 2);
  c.cache(cache, "cache", L + R);
  c.tensor(slots, "slots", kI32, 1);
  const int64_t S = slots.dim(0);
  c.linear_weight(kv_b, "kv_b", heads * (Dn + Dv), L);
  REQUIRE(c, !kv_b.int_quantized(), "kv_b must be f32, bf16, f16 or block FP8, not an integer format");
  c.tensor(k, "k", kCacheDTypes, 2);
  c.tensor(v, "v", kCacheDTypes, 2);
  REQUIRE(c, k.dtype() == v.dtype(), "k {} and v {} must both be f32 or both bf16", k.describe(),
          v.describe());
  c.shape(k, "k", {S, heads * (Dn + R)});
  c.shape(v, "v", {S, heads * Dv});
  c.indices(slots, "slots", cache.dim(0), false, "cache slots");
  mla_expand_kv_impl(cache, slots, kv_b, params, k, v);
}

void Backend::concat_columns(const Tensor& a, const Tensor& b, Tensor& out) {
  const OpCheck c(*this, "concat_columns");
  c.tensor(a, "a", c.activations(), 2);
  c.tensor(b, "b", c.activations(), 2);
  REQUIRE(c, b.dim(0) == a.dim(0) && a.dtype() == b.dtype(),
          "a {} and b {} differ in rows or dtype", a.describe(), b.describe());
  c.tensor(out, "out", c.activations(), 2);
  REQUIRE(c, out.dtype() == a.dtype(), "out {} must have a's dtype", out.describe());
  c.shape(out, "out", {a.dim(0), a.dim(1) + b.dim(1)});
  REQUIRE(c, !overlaps(a, out) && !overlaps(b, out), "out {} overlaps a or b", out.describe());
  concat_columns_impl(a, b, out);
}

}  // namespace basalt

#undef REQUIRE
