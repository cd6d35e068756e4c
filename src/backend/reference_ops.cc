#include "backend/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/sampling_rng.h"
#include "core/error.h"

namespace basalt::reference {
namespace {

void require_host(const Tensor& t, const char* op, const char* name) {
  BASALT_CHECK(t.device() == Device::kCpu, "reference {}: {} must be a host tensor, got {}", op,
               name, t.describe());
}

void require(const Tensor& t, const char* op, const char* name, DType dtype, int rank) {
  require_host(t, op, name);
  BASALT_CHECK(t.dtype() == dtype && t.rank() == rank, "reference {}: {} must be {} of rank {}, got {}",
               op, name, dtype_name(dtype), rank, t.describe());
}

void require_floating(const Tensor& t, const char* op, const char* name, int rank) {
  require_host(t, op, name);
  BASALT_CHECK(is_floating(t.dtype()) && t.rank() == rank,
               "reference {}: {} must be a floating tensor of rank {}, got {}", op, name, rank,
               t.describe());
}

void require_shape(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  BASALT_CHECK(t.shape() == shape, "reference {}: {} must have shape {}, got {}", op, name,
               shape_string(shape), t.describe());
}

int32_t argmax_row(const float* row, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

void check_sampling_row(const SamplingRow& c, size_t row) {
  BASALT_CHECK(std::isfinite(c.temperature) && c.temperature >= 0.0f && c.top_k >= 0 &&
                   c.top_p > 0.0f && c.top_p <= 1.0f && c.min_p >= 0.0f && c.min_p <= 1.0f,
               "sample: row {} has invalid controls (temperature {}, top_k {}, top_p {}, min_p {})",
               row, c.temperature, c.top_k, c.top_p, c.min_p);
}

int32_t sample_row(const float* logits, int64_t n, const SamplingRow& c) {
  if (c.temperature == 0.0f) return argmax_row(logits, n);

  // Step 2: scaled logits and unnormalised probabilities.
  std::vector<float> s(n), w(n);
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity()
                                 : logits[i] / c.temperature;
  }
  const float m = *std::max_element(s.begin(), s.end());
  for (int64_t i = 0; i < n; ++i) w[i] = s[i] == m ? 1.0f : std::exp(s[i] - m);
  std::vector<int64_t> rank(n);
  std::iota(rank.begin(), rank.end(), 0);
  std::sort(rank.begin(), rank.end(),
            [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  std::vector<bool> kept(n, true);

  // Step 3: top-k.
  if (c.top_k > 0 && c.top_k < n) {
    for (int64_t r = c.top_k; r < n; ++r) kept[rank[r]] = false;
  }
  // Step 4: top-p.
  if (c.top_p < 1.0f) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (kept[i]) total += w[i];
    }
    double before = 0.0;
    bool first = true;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = rank[r];
      if (!kept[i]) continue;
      if (!first && !(before < c.top_p * total)) kept[i] = false;
      before += w[i];
      first = false;
    }
  }
  // Step 5: min-p.
  if (c.min_p > 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      if (kept[i] && w[i] < c.min_p) kept[i] = false;
    }
  }
  // Step 6: the draw.
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (kept[i]) total += w[i];
  }
  const double target = static_cast<double>(sampling_uniform(c.seed, c.step)) * total;
  double running = 0.0;
  int64_t last_positive = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!kept[i]) continue;
    running += w[i];
    if (running > target) return static_cast<int32_t>(i);
    if (w[i] > 0.0f) last_positive = i;
  }
  BASALT_ASSERT(last_positive >= 0);
  return static_cast<int32_t>(last_positive);
}

}  // namespace

void store_f32(const Tensor& t, int64_t i, float value) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = value; return;
    case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(value); return;
    case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(value); return;
    case DType::kF8E4M3: t.data<uint8_t>()[i] = f32_to_fp8e4m3(value); return;
    default: fail("reference: cannot store a float into {}", t.describe());
  }
}

float load_f32(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data<const float>()[i];
    case DType::kBF16: return bf16_to_f32(t.data<const uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(t.data<const uint16_t>()[i]);
    case DType::kF8E4M3: return fp8e4m3_to_f32(t.data<const uint8_t>()[i]);
    default: fail("reference: cannot read {} as float", t.describe());
  }
}

void copy(const Tensor& src, Tensor& dst) {
  require_host(src, "copy", "src");
  require_host(dst, "copy", "dst");
  BASALT_CHECK(src.numel() == dst.numel(), "reference copy: {} into {} differ in size",
               src.describe(), dst.describe());
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes()) std::memmove(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  BASALT_CHECK(is_floating(src.dtype()) && is_floating(dst.dtype()),
               "reference copy: cannot convert {} into {}", src.describe(), dst.describe());
  for (int64_t i = 0; i < src.numel(); ++i) store_f32(dst, i, load_f32(src, i));
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  require(ids, "embedding", "ids", DType::kI32, 1);
  require_floating(table, "embedding", "table", 2);
  require(out, "embedding", "out", DType::kF32, 2);
  const int64_t tokens = ids.dim(0), vocab = table.dim(0), hidden = table.dim(1);
  require_shape(out, {tokens, hidden}, "embedding", "out");
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t id = ids.data<const int32_t>()[t];
    BASALT_CHECK(id >= 0 && id < vocab, "reference embedding: id {} outside [0, {})", id, vocab);
    for (int64_t h = 0; h < hidden; ++h) {
      out.data<float>()[t * hidden + h] = load_f32(table, id * hidden + h);
    }
  }
}

void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  require(x, "linear", "x", DType::kF32, 2);
  require_floating(w, "linear", "w", 2);
  require(out, "linear", "out", DType::kF32, 2);
  const int64_t tokens = x.dim(0), in = x.dim(1), outs = w.dim(0);
  require_shape(w, {outs, in}, "linear", "w");
  require_shape(out, {tokens, outs}, "linear", "out");
  if (bias) {
    require_floating(*bias, "linear", "bias", 1);
    require_shape(*bias, {outs}, "linear", "bias");
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t n = 0; n < outs; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        sum += static_cast<double>(x.data<const float>()[t * in + k]) * load_f32(w, n * in + k);
      }
      if (bias) sum += load_f32(*bias, n);
      out.data<float>()[t * outs + n] = static_cast<float>(sum);
    }
  }
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  require(x, "rms_norm", "x", DType::kF32, 2);
  require_floating(weight, "rms_norm", "weight", 1);
  require(out, "rms_norm", "out", DType::kF32, 2);
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  require_shape(weight, {hidden}, "rms_norm", "weight");
  require_shape(out, {tokens, hidden}, "rms_norm", "out");
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x.data<const float>() + t * hidden;
    double squares = 0.0;
    for (int64_t h = 0; h < hidden; ++h) squares += static_cast<double>(row[h]) * row[h];
    const double inv_rms = 1.0 / std::sqrt(squares / static_cast<double>(hidden) + eps);
    for (int64_t h = 0; h < hidden; ++h) {
      out.data<float>()[t * hidden + h] = static_cast<float>(row[h] * inv_rms * load_f32(weight, h));
    }
  }
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  require(residual, "add_rms_norm", "residual", DType::kF32, 2);
  require(x, "add_rms_norm", "x", DType::kF32, 2);
  require_shape(x, residual.shape(), "add_rms_norm", "x");
  for (int64_t i = 0; i < residual.numel(); ++i) {
    residual.data<float>()[i] += x.data<const float>()[i];
  }
  rms_norm(residual, weight, eps, out);
}

void rope(Tensor& x, const Tensor& positions, const RopeParams& params) {
  require(x, "rope", "x", DType::kF32, 2);
  require(positions, "rope", "positions", DType::kI32, 1);
  const int64_t tokens = x.dim(0);
  const int64_t heads = params.num_heads, head_dim = params.head_dim, rotary = params.rotary_dim;
  BASALT_CHECK(heads > 0 && head_dim > 0 && rotary > 0 && rotary % 2 == 0 &&
                   params.rotary_offset >= 0 && params.rotary_offset + rotary <= head_dim,
               "reference rope: bad params (heads {}, head_dim {}, rotary_dim {}, rotary_offset {})",
               heads, head_dim, rotary, params.rotary_offset);
  require_shape(x, {tokens, heads * head_dim}, "rope", "x");
  require_shape(positions, {tokens}, "rope", "positions");
  BASALT_CHECK(params.inv_freq != nullptr, "reference rope: inv_freq is missing");
  require(*params.inv_freq, "rope", "inv_freq", DType::kF32, 1);
  require_shape(*params.inv_freq, {rotary / 2}, "rope", "inv_freq");
  const int64_t half = rotary / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float position = static_cast<float>(positions.data<const int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * params.inv_freq->data<const float>()[i];
      const double c = std::cos(angle) * params.attention_scaling;
      const double s = std::sin(angle) * params.attention_scaling;
      for (int64_t h = 0; h < heads; ++h) {
        float* head = x.data<float>() + t * heads * head_dim + h * head_dim + params.rotary_offset;
        const int64_t ia = params.style == RopeStyle::kRotateHalf ? i : 2 * i;
        const int64_t ib = params.style == RopeStyle::kRotateHalf ? i + half : 2 * i + 1;
        const double a = head[ia], b = head[ib];
        head[ia] = static_cast<float>(a * c - b * s);
        head[ib] = static_cast<float>(b * c + a * s);
      }
    }
  }
}

void store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache) {
  require(k, "store_kv", "k", DType::kF32, 2);
  require(v, "store_kv", "v", DType::kF32, 2);
  require(slots, "store_kv", "slots", DType::kI32, 1);
  const int64_t tokens = k.dim(0);
  require_shape(slots, {tokens}, "store_kv", "slots");
  BASALT_CHECK(v.dim(0) == tokens, "reference store_kv: k {} and v {} differ in tokens",
               k.describe(), v.describe());
  const Tensor* caches[2] = {&k_cache, &v_cache};
  const Tensor* sources[2] = {&k, &v};
  for (int which = 0; which < 2; ++which) {
    const Tensor& cache = *caches[which];
    const Tensor& src = *sources[which];
    require_host(cache, "store_kv", "cache");
    BASALT_CHECK((cache.dtype() == DType::kF32 || cache.dtype() == DType::kBF16) &&
                     cache.rank() >= 2 && cache.dim(0) > 0 &&
                     cache.numel() / cache.dim(0) == src.dim(1),
                 "reference store_kv: cache {} does not hold rows of {}", cache.describe(),
                 src.describe());
    const int64_t width = src.dim(1);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t slot = slots.data<const int32_t>()[t];
      if (slot < 0) continue;  // a padding token: nothing is stored
      BASALT_CHECK(slot < cache.dim(0), "reference store_kv: slot {} outside [0, {})", slot,
                   cache.dim(0));
      for (int64_t i = 0; i < width; ++i) {
        store_f32(cache, slot * width + i, src.data<const float>()[t * width + i]);
      }
    }
  }
}

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const AttentionLayout& layout, const AttentionParams& params, Tensor& out) {
  require(q, "attention", "q", DType::kF32, 2);
  require(out, "attention", "out", DType::kF32, 2);
  const int64_t heads = params.num_heads, kv_heads = params.num_kv_heads;
  const int64_t head_dim = params.head_dim, v_head_dim = params.v_head_dim;
  BASALT_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 &&
                   v_head_dim > 0 && params.sliding_window >= 0,
               "reference attention: bad params (heads {}, kv_heads {}, head_dim {}, v_head_dim {}, "
               "sliding_window {})",
               heads, kv_heads, head_dim, v_head_dim, params.sliding_window);
  const int64_t tokens = q.dim(0);
  require_shape(q, {tokens, heads * head_dim}, "attention", "q");
  require_shape(out, {tokens, heads * v_head_dim}, "attention", "out");
  require_floating(k_cache, "attention", "k_cache", k_cache.rank());
  require_floating(v_cache, "attention", "v_cache", v_cache.rank());
  BASALT_CHECK(k_cache.rank() >= 2 && v_cache.rank() >= 2 && k_cache.dim(0) == v_cache.dim(0) &&
                   k_cache.numel() == k_cache.dim(0) * kv_heads * head_dim &&
                   v_cache.numel() == v_cache.dim(0) * kv_heads * v_head_dim,
               "reference attention: caches {} and {} do not match the params", k_cache.describe(),
               v_cache.describe());
  require(layout.q_start, "attention", "q_start", DType::kI32, 1);
  require(layout.kv_start, "attention", "kv_start", DType::kI32, 1);
  require(layout.kv_slots, "attention", "kv_slots", DType::kI32, 1);
  const int64_t seqs = layout.q_start.dim(0) - 1;
  BASALT_CHECK(seqs >= 0 && layout.kv_start.dim(0) == seqs + 1,
               "reference attention: q_start and kv_start must both have num_seqs + 1 entries");
  const int32_t* q_start = layout.q_start.data<const int32_t>();
  const int32_t* kv_start = layout.kv_start.data<const int32_t>();
  const int32_t* kv_slots = layout.kv_slots.data<const int32_t>();
  BASALT_CHECK(q_start[0] == 0 && q_start[seqs] == tokens && kv_start[0] == 0 &&
                   kv_start[seqs] <= layout.kv_slots.dim(0),
               "reference attention: layout does not cover q and kv_slots");
  const int64_t slots = k_cache.dim(0), group = heads / kv_heads;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t q_len = q_start[s + 1] - q_start[s], kv_len = kv_start[s + 1] - kv_start[s];
    BASALT_CHECK(q_len >= 0 && kv_len >= 0, "reference attention: sequence {} has {} queries "
                 "and {} keys", s, q_len, kv_len);
    for (int64_t j = 0; j < kv_len; ++j) {
      BASALT_CHECK(kv_slots[kv_start[s] + j] >= 0 && kv_slots[kv_start[s] + j] < slots,
                   "reference attention: slot {} outside [0, {})", kv_slots[kv_start[s] + j], slots);
    }
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t row = q_start[s] + i, position = kv_len - q_len + i;
      const int64_t first = params.sliding_window > 0
                                ? std::max<int64_t>(0, position - params.sliding_window + 1)
                                : 0;
      if (position < 0) {  // a padding query before the sequence's first key: zeros
        std::fill(out.data<float>() + row * heads * v_head_dim,
                  out.data<float>() + (row + 1) * heads * v_head_dim, 0.0f);
        continue;
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group;
        const float* qv = q.data<const float>() + row * heads * head_dim + h * head_dim;
        std::vector<double> score(static_cast<size_t>(position - first + 1));
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= position; ++j) {
          const int64_t slot = kv_slots[kv_start[s] + j];
          double dot = 0.0;
          for (int64_t d = 0; d < head_dim; ++d) {
            dot += static_cast<double>(qv[d]) *
                   load_f32(k_cache, (slot * kv_heads + kvh) * head_dim + d);
          }
          score[j - first] = dot * params.scale;
          max_score = std::max(max_score, score[j - first]);
        }
        double total = 0.0;
        for (double& sc : score) {
          sc = std::exp(sc - max_score);
          total += sc;
        }
        for (int64_t d = 0; d < v_head_dim; ++d) {
          double acc = 0.0;
          for (int64_t j = first; j <= position; ++j) {
            const int64_t slot = kv_slots[kv_start[s] + j];
            acc += score[j - first] * load_f32(v_cache, (slot * kv_heads + kvh) * v_head_dim + d);
          }
          out.data<float>()[row * heads * v_head_dim + h * v_head_dim + d] =
              static_cast<float>(acc / total);
        }
      }
    }
  }
}

void silu_and_mul(const Tensor& gate_up, Tensor& out) {
  require(gate_up, "silu_and_mul", "gate_up", DType::kF32, 2);
  require(out, "silu_and_mul", "out", DType::kF32, 2);
  const int64_t tokens = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  BASALT_CHECK(gate_up.dim(1) % 2 == 0, "reference silu_and_mul: odd width {}", gate_up.describe());
  require_shape(out, {tokens, inter}, "silu_and_mul", "out");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gate_up.data<const float>()[t * 2 * inter + i];
      const double u = gate_up.data<const float>()[t * 2 * inter + inter + i];
      out.data<float>()[t * inter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  require_host(a, "add", "a");
  require_host(b, "add", "b");
  require_host(out, "add", "out");
  BASALT_CHECK(a.dtype() == DType::kF32 && b.dtype() == DType::kF32 && out.dtype() == DType::kF32 &&
                   a.shape() == b.shape() && a.shape() == out.shape(),
               "reference add: {} + {} into {}", a.describe(), b.describe(), out.describe());
  for (int64_t i = 0; i < a.numel(); ++i) {
    out.data<float>()[i] = a.data<const float>()[i] + b.data<const float>()[i];
  }
}

namespace {

void softmax_rows(const Tensor& x, Tensor& out, bool log, const char* op) {
  require(x, op, "x", DType::kF32, 2);
  require(out, op, "out", DType::kF32, 2);
  require_shape(out, x.shape(), op, "out");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.data<const float>() + r * cols;
    double max_value = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) max_value = std::max<double>(max_value, in[c]);
    double total = 0.0;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(in[c] - max_value);
    std::vector<double> values(in, in + cols);
    for (int64_t c = 0; c < cols; ++c) {
      out.data<float>()[r * cols + c] =
          static_cast<float>(log ? values[c] - max_value - std::log(total)
                                 : std::exp(values[c] - max_value) / total);
    }
  }
}

}  // namespace

void softmax(const Tensor& x, Tensor& out) { softmax_rows(x, out, false, "softmax"); }

void log_softmax(const Tensor& x, Tensor& out) { softmax_rows(x, out, true, "log_softmax"); }

void argmax(const Tensor& logits, Tensor& out) {
  require(logits, "argmax", "logits", DType::kF32, 2);
  require(out, "argmax", "out", DType::kI32, 1);
  require_shape(out, {logits.dim(0)}, "argmax", "out");
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    out.data<int32_t>()[r] = argmax_row(logits.data<const float>() + r * logits.dim(1), logits.dim(1));
  }
}

void sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) {
  require(logits, "sample", "logits", DType::kF32, 2);
  require(out, "sample", "out", DType::kI32, 1);
  require_shape(out, {logits.dim(0)}, "sample", "out");
  BASALT_CHECK(static_cast<int64_t>(rows.size()) == logits.dim(0) && logits.dim(1) > 0,
               "reference sample: {} controls for logits {}", rows.size(), logits.describe());
  for (size_t r = 0; r < rows.size(); ++r) check_sampling_row(rows[r], r);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    out.data<int32_t>()[r] =
        sample_row(logits.data<const float>() + r * logits.dim(1), logits.dim(1), rows[r]);
  }
}

void check_logit_edits(std::span<const LogitEdit> edits, int64_t rows, int64_t vocab,
                       const char* op) {
  std::vector<uint64_t> keys;
  keys.reserve(edits.size());
  for (size_t i = 0; i < edits.size(); ++i) {
    const LogitEdit& e = edits[i];
    BASALT_CHECK(e.row >= 0 && e.row < rows && e.token >= 0 && e.token < vocab,
                 "{}: edit {} names row {} token {}, outside logits [{}, {}]", op, i, e.row,
                 e.token, rows, vocab);
    BASALT_CHECK(std::isfinite(e.bias) && std::isfinite(e.subtract) &&
                     std::isfinite(e.repetition) && e.repetition > 0.0f,
                 "{}: edit {} has bias {}, repetition {}, subtract {} (finite, repetition > 0)",
                 op, i, e.bias, e.repetition, e.subtract);
    keys.push_back(static_cast<uint64_t>(e.row) << 32 | static_cast<uint32_t>(e.token));
  }
  std::sort(keys.begin(), keys.end());
  const auto twice = std::adjacent_find(keys.begin(), keys.end());
  BASALT_CHECK(twice == keys.end(), "{}: row {} token {} is edited twice", op, *twice >> 32,
               static_cast<uint32_t>(*twice));
}

void check_top_k_rows(const Tensor& x, int k, const Tensor& values, const Tensor& ids,
                      const char* op) {
  BASALT_CHECK(x.dtype() == DType::kF32 && x.rank() == 2, "{}: x must be f32 [R, C], got {}", op,
               x.describe());
  BASALT_CHECK(k >= 1 && k <= kMaxTopKRows && k <= x.dim(1), "{}: k = {} must be in 1..min({}, {})",
               op, k, x.dim(1), kMaxTopKRows);
  BASALT_CHECK(values.dtype() == DType::kF32 && values.shape() == Shape({x.dim(0), k}),
               "{}: values must be f32 [{}, {}], got {}", op, x.dim(0), k, values.describe());
  BASALT_CHECK(ids.dtype() == DType::kI32 && ids.shape() == Shape({x.dim(0), k}),
               "{}: ids must be i32 [{}, {}], got {}", op, x.dim(0), k, ids.describe());
}

namespace {

// gather_rows' and rank_rows' shapes: x f32 [R, C], one column of each row
// in cols i32 [R], out [R] of out_dtype.
void check_row_picks(const Tensor& x, const Tensor& cols, const Tensor& out, DType out_dtype, const char* op) {
  BASALT_CHECK(x.dtype() == DType::kF32 && x.rank() == 2, "{}: x must be f32 [R, C], got {}", op,
               x.describe());
  BASALT_CHECK(cols.dtype() == DType::kI32 && cols.shape() == Shape({x.dim(0)}),
               "{}: cols must be i32 [{}], got {}", op, x.dim(0), cols.describe());
  BASALT_CHECK(out.dtype() == out_dtype && out.shape() == Shape({x.dim(0)}), "{}: out must be {} [{}], got {}", op,
               dtype_name(out_dtype), x.dim(0), out.describe());
}

}  // namespace

void check_gather_rows(const Tensor& x, const Tensor& cols, const Tensor& out, const char* op) {
  check_row_picks(x, cols, out, DType::kF32, op);
}

void check_rank_rows(const Tensor& x, const Tensor& cols, const Tensor& out, const char* op) {
  check_row_picks(x, cols, out, DType::kI32, op);
}

void check_copy_indexed(const Tensor& src, const Tensor& src_index, const Tensor& dst, const Tensor& dst_index,
                        const char* op) {
  for (const Tensor* t : {&src, &src_index, &dst, &dst_index})
    BASALT_CHECK(t->dtype() == DType::kI32 && t->rank() == 1, "{}: every tensor must be i32 [n], got {}", op,
                 t->describe());
  BASALT_CHECK(src_index.numel() == dst_index.numel(), "{}: {} source indices against {} destination indices", op,
               src_index.numel(), dst_index.numel());
}

bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

void adjust_logits(Tensor& logits, std::span<const LogitEdit> edits) {
  require(logits, "adjust_logits", "logits", DType::kF32, 2);
  check_logit_edits(edits, logits.dim(0), logits.dim(1), "reference adjust_logits");
  for (const LogitEdit& e : edits) {
    float& x = logits.data<float>()[e.row * logits.dim(1) + e.token];
    x = apply_logit_edit(x, e);
  }
}

void check_token_bitmask(const Tensor& logits, const Tensor& bitmask, const char* op) {
  BASALT_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2, "{}: logits must be f32 [R, V], got {}", op,
               logits.describe());
  const int64_t words = (logits.dim(1) + 31) / 32;
  BASALT_CHECK(bitmask.dtype() == DType::kI32 && bitmask.shape() == Shape({logits.dim(0), words}),
               "{}: bitmask must be i32 [{}, {}], got {}", op, logits.dim(0), words, bitmask.describe());
}

void apply_token_bitmask(Tensor& logits, const Tensor& bitmask) {
  require_host(logits, "apply_token_bitmask", "logits");
  require_host(bitmask, "apply_token_bitmask", "bitmask");
  check_token_bitmask(logits, bitmask, "reference apply_token_bitmask");
  const int64_t vocab = logits.dim(1), words = bitmask.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r)
    for (int64_t t = 0; t < vocab; ++t) {
      const auto word = static_cast<uint32_t>(bitmask.data<const int32_t>()[r * words + t / 32]);
      if (((word >> (t % 32)) & 1u) == 0) logits.data<float>()[r * vocab + t] = -std::numeric_limits<float>::infinity();
    }
}

void top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids) {
  require_host(x, "top_k_rows", "x");
  require_host(values, "top_k_rows", "values");
  require_host(ids, "top_k_rows", "ids");
  check_top_k_rows(x, k, values, ids, "reference top_k_rows");
  const int64_t cols = x.dim(1);
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const float* row = x.data<const float>() + r * cols;
    std::vector<int64_t> order(static_cast<size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return ranks_before(row[a], a, row[b], b); });
    for (int j = 0; j < k; ++j) {
      values.data<float>()[r * k + j] = row[order[j]];
      ids.data<int32_t>()[r * k + j] = static_cast<int32_t>(order[j]);
    }
  }
}

void gather_rows(const Tensor& x, const Tensor& cols, Tensor& out) {
  require_host(x, "gather_rows", "x");
  require_host(cols, "gather_rows", "cols");
  require_host(out, "gather_rows", "out");
  check_gather_rows(x, cols, out, "reference gather_rows");
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const int32_t c = cols.data<const int32_t>()[r];
    BASALT_CHECK(c >= 0 && c < x.dim(1), "reference gather_rows: column {} of row {} is outside 0..{}",
                 c, r, x.dim(1) - 1);
    out.data<float>()[r] = x.data<const float>()[r * x.dim(1) + c];
  }
}

void rank_rows(const Tensor& x, const Tensor& cols, Tensor& out) {
  require_host(x, "rank_rows", "x");
  require_host(cols, "rank_rows", "cols");
  require_host(out, "rank_rows", "out");
  check_rank_rows(x, cols, out, "reference rank_rows");
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const int32_t c = cols.data<const int32_t>()[r];
    BASALT_CHECK(c >= 0 && c < x.dim(1),
                 "reference rank_rows: column {} of row {} is outside 0..{}", c, r, x.dim(1) - 1);
    const float* row = x.data<const float>() + r * x.dim(1);
    int32_t above = 0;
    for (int64_t j = 0; j < x.dim(1); ++j) above += row[j] > row[c] ? 1 : 0;
    out.data<int32_t>()[r] = 1 + above;
  }
}

void copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) {
  const Tensor* const tensors[] = {&src, &src_index, &dst, &dst_index};
  for (const Tensor* t : tensors) require_host(*t, "copy_indexed", "a tensor");
  check_copy_indexed(src, src_index, dst, dst_index, "reference copy_indexed");
  for (int64_t k = 0; k < src_index.numel(); ++k) {
    const int32_t from = src_index.data<const int32_t>()[k], to = dst_index.data<const int32_t>()[k];
    BASALT_CHECK(from >= 0 && from < src.numel() && to >= 0 && to < dst.numel(),
                 "reference copy_indexed: pair {} ({} -> {}) is outside {} -> {}", k, from, to, src.numel(),
                 dst.numel());
    dst.data<int32_t>()[to] = src.data<const int32_t>()[from];
  }
}

}  // namespace basalt::reference

namespace basalt {

const char* to_string(BackendOp op) {
  switch (op) {
    case BackendOp::kEmbedding: return "embedding";
    case BackendOp::kLinear: return "linear";
    case BackendOp::kRmsNorm: return "rms_norm";
    case BackendOp::kAddRmsNorm: return "add_rms_norm";
    case BackendOp::kRope: return "rope";
    case BackendOp::kStoreKv: return "store_kv";
    case BackendOp::kQkvRopeStore: return "qkv_rope_store";
    case BackendOp::kAttention: return "attention";
    case BackendOp::kSiluAndMul: return "silu_and_mul";
    case BackendOp::kAdd: return "add";
    case BackendOp::kSoftmax: return "softmax";
    case BackendOp::kLogSoftmax: return "log_softmax";
    case BackendOp::kArgmax: return "argmax";
    case BackendOp::kSample: return "sample";
    case BackendOp::kAdjustLogits: return "adjust_logits";
    case BackendOp::kApplyTokenBitmask: return "apply_token_bitmask";
    case BackendOp::kTopKRows: return "top_k_rows";
    case BackendOp::kGatherRows: return "gather_rows";
    case BackendOp::kCopyIndexed: return "copy_indexed";
    case BackendOp::kRankRows: return "rank_rows";
    case BackendOp::kLinearFp8Block: return "linear_fp8_block";
    case BackendOp::kMoeRoute: return "moe_route";
    case BackendOp::kMoeExperts: return "moe_experts";
    case BackendOp::kMlaStoreKv: return "mla_store_kv";
    case BackendOp::kMlaAttention: return "mla_attention";
    case BackendOp::kMlaExpandKv: return "mla_expand_kv";
    case BackendOp::kConcatColumns: return "concat_columns";
    case BackendOp::kMoeCombine: return "moe_combine";
    case BackendOp::kLinearInt: return "linear_int";
    case BackendOp::kCount: break;
  }
  return "?";
}

}  // namespace basalt
