// Scalar references of the DeepSeek V2/V3 ops: block-FP8 linear, MoE routing
// and experts, and multi-head latent attention. Plain loops, sums in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt::reference {
namespace {

void need(const Tensor& t, const char* op, const char* name, DType dtype, int rank) {
  BASALT_CHECK(t.device() == Device::kCpu && t.dtype() == dtype && t.rank() == rank,
               "reference {}: {} must be a host {} tensor of rank {}, got {}", op, name,
               dtype_name(dtype), rank, t.describe());
}

void need_shape(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  BASALT_CHECK(t.shape() == shape, "reference {}: {} must have shape {}, got {}", op, name,
               shape_string(shape), t.describe());
}

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

void check_weight(const LinearWeight& w, int64_t n, int64_t k, const char* op, const char* name) {
  if (w.int_quantized()) {
    const IntWeightLayout& l = w.int_layout;
    const std::string error = int_layout_error(l);
    BASALT_CHECK(error.empty() && l.in_features == k, "reference {}: {}: {} (in_features {}, expected {})", op, name,
                 error, l.in_features, k);
    need(w.weight, op, name, l.bits == 8 ? DType::kI8 : DType::kU8, 2);
    need_shape(w.weight, {n, l.code_columns()}, op, name);
    need(w.scales, op, "scales", DType::kF16, 2);
    need_shape(w.scales, {n, l.scale_columns()}, op, "scales");
    return;
  }
  BASALT_CHECK(w.weight.device() == Device::kCpu && w.weight.rank() == 2 &&
                   w.weight.dim(0) == n && w.weight.dim(1) == k,
               "reference {}: {} must be [{}, {}], got {}", op, name, n, k, w.weight.describe());
  if (w.block_fp8()) {
    BASALT_CHECK(w.weight.dtype() == DType::kF8E4M3, "reference {}: {} with scales must be f8_e4m3",
                 op, name);
    need(w.scale_inv, op, "scale_inv", DType::kF32, 2);
    need_shape(w.scale_inv, {blocks(n), blocks(k)}, op, "scale_inv");
  } else {
    BASALT_CHECK(is_floating(w.weight.dtype()), "reference {}: {} must be floating", op, name);
  }
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

void check_layout(const AttentionLayout& layout, int64_t tokens, const char* op) {
  need(layout.q_start, op, "q_start", DType::kI32, 1);
  need(layout.kv_start, op, "kv_start", DType::kI32, 1);
  need(layout.kv_slots, op, "kv_slots", DType::kI32, 1);
  const int64_t seqs = layout.q_start.dim(0) - 1;
  BASALT_CHECK(seqs >= 0 && layout.kv_start.dim(0) == seqs + 1,
               "reference {}: q_start and kv_start must both have num_seqs + 1 entries", op);
  const int32_t* q_start = layout.q_start.data<const int32_t>();
  const int32_t* kv_start = layout.kv_start.data<const int32_t>();
  BASALT_CHECK(q_start[0] == 0 && q_start[seqs] == tokens && kv_start[0] == 0 &&
                   kv_start[seqs] <= layout.kv_slots.dim(0),
               "reference {}: layout does not cover q and kv_slots", op);
}

// Row t of x [T, K] through an integer-format weight: out[n] for every n,
// as core/int_weights.h defines the product.
std::vector<float> int_row(const float* x, const LinearWeight& w) {
  const IntWeightLayout& l = w.int_layout;
  const int64_t N = w.weight.dim(0);
  std::vector<int8_t> codes(static_cast<size_t>(l.blocks() * kIntBlock));
  std::vector<float> scales(static_cast<size_t>(l.blocks()));
  quantize_int_activations(x, l.in_features, codes.data(), scales.data());
  std::vector<float> out(static_cast<size_t>(N));
  std::vector<uint8_t> row(static_cast<size_t>(l.code_columns()));
  std::vector<uint16_t> row_scales(static_cast<size_t>(l.scale_columns()));
  for (int64_t n = 0; n < N; ++n) {
    int_row(l, N, w.weight.raw(), w.scales.data<const uint16_t>(), n, row.data(), row_scales.data());
    out[n] = int_dot_reference(l, codes.data(), scales.data(), row.data(), row_scales.data());
  }
  return out;
}

}  // namespace

void linear_int(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) {
  need(x, "linear_int", "x", DType::kF32, 2);
  need(out, "linear_int", "out", DType::kF32, 2);
  BASALT_CHECK(w.int_quantized(), "reference linear_int: w is not in an integer format");
  const int64_t T = x.dim(0), K = x.dim(1), N = w.weight.rank() == 2 ? w.weight.dim(0) : 0;
  check_weight(w, N, K, "linear_int", "w");
  need_shape(out, {T, N}, "linear_int", "out");
  if (bias) need_shape(*bias, {N}, "linear_int", "bias");
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row = int_row(x.data<const float>() + t * K, w);
    for (int64_t n = 0; n < N; ++n) out.data<float>()[t * N + n] = row[n] + (bias ? load_f32(*bias, n) : 0.0f);
  }
}

float load_weight(const LinearWeight& w, int64_t n, int64_t k) {
  if (w.int_quantized()) {
    const IntWeightLayout& l = w.int_layout;
    if (!l.rows_interleaved)
      return dequantize_int(l, w.weight.data<const uint8_t>() + n * l.code_columns(),
                            w.scales.data<const uint16_t>() + n * l.scale_columns(), k);
    std::vector<uint8_t> row(static_cast<size_t>(l.code_columns()));
    std::vector<uint16_t> row_scales(static_cast<size_t>(l.scale_columns()));
    int_row(l, w.weight.dim(0), w.weight.raw(), w.scales.data<const uint16_t>(), n, row.data(), row_scales.data());
    return dequantize_int(l, row.data(), row_scales.data(), k);
  }
  const int64_t K = w.weight.dim(1);
  const float v = load_f32(w.weight, n * K + k);
  if (!w.block_fp8()) return v;
  const int64_t kb = blocks(K);
  return v * w.scale_inv.data<const float>()[(n / kFp8BlockSize) * kb + k / kFp8BlockSize];
}

void linear_fp8_block(const Tensor& x, const Tensor& w, const Tensor& scale_inv, Tensor& out) {
  need(x, "linear_fp8_block", "x", DType::kF32, 2);
  need(out, "linear_fp8_block", "out", DType::kF32, 2);
  need(w, "linear_fp8_block", "w", DType::kF8E4M3, 2);
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  need_shape(w, {N, K}, "linear_fp8_block", "w");
  need_shape(out, {T, N}, "linear_fp8_block", "out");
  const LinearWeight lw{w, scale_inv};
  check_weight(lw, N, K, "linear_fp8_block", "w");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k)
        sum += static_cast<double>(x.data<const float>()[t * K + k]) * load_weight(lw, n, k);
      out.data<float>()[t * N + n] = static_cast<float>(sum);
    }
  }
}

void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& p, Tensor& ids,
               Tensor& weights) {
  need(logits, "moe_route", "logits", DType::kF32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  BASALT_CHECK(p.top_k > 0 && p.num_groups > 0 && E % p.num_groups == 0 && p.topk_groups > 0 &&
                   p.topk_groups <= p.num_groups &&
                   p.top_k <= p.topk_groups * (E / p.num_groups),
               "reference moe_route: bad params for {} experts", E);
  need(ids, "moe_route", "ids", DType::kI32, 2);
  need(weights, "moe_route", "weights", DType::kF32, 2);
  need_shape(ids, {T, p.top_k}, "moe_route", "ids");
  need_shape(weights, {T, p.top_k}, "moe_route", "weights");
  if (bias) {
    need(*bias, "moe_route", "bias", DType::kF32, 1);
    need_shape(*bias, {E}, "moe_route", "bias");
  }
  const int64_t per_group = E / p.num_groups;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data<const float>() + t * E;
    std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    if (p.scoring == MoeScoring::kSoftmax) {
      double max = -std::numeric_limits<double>::infinity(), z = 0.0;
      for (int64_t e = 0; e < E; ++e) max = std::max(max, static_cast<double>(row[e]));
      for (int64_t e = 0; e < E; ++e) z += std::exp(row[e] - max);
      for (int64_t e = 0; e < E; ++e) score[e] = std::exp(row[e] - max) / z;
    } else {
      for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
    }
    for (int64_t e = 0; e < E; ++e)
      choice[e] = score[e] + (bias ? bias->data<const float>()[e] : 0.0);
    auto by_value = [](const std::vector<double>& v) {
      return [&v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
    };
    if (p.num_groups > 1) {
      std::vector<double> group(static_cast<size_t>(p.num_groups));
      for (int64_t g = 0; g < p.num_groups; ++g) {
        std::vector<double> members(choice.begin() + g * per_group,
                                    choice.begin() + (g + 1) * per_group);
        std::sort(members.begin(), members.end(), std::greater<>());
        group[g] = bias ? members[0] + (per_group > 1 ? members[1] : 0.0) : members[0];
      }
      std::vector<int64_t> order(static_cast<size_t>(p.num_groups));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), by_value(group));
      std::vector<bool> keep(static_cast<size_t>(p.num_groups), false);
      for (int g = 0; g < p.topk_groups; ++g) keep[order[g]] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[e / per_group]) choice[e] = -std::numeric_limits<double>::infinity();
    }
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), by_value(choice));
    double sum = 0.0;
    for (int j = 0; j < p.top_k; ++j) sum += score[order[j]];
    for (int j = 0; j < p.top_k; ++j) {
      double w = score[order[j]];
      if (p.normalize) w /= sum;
      ids.data<int32_t>()[t * p.top_k + j] = static_cast<int32_t>(order[j]);
      weights.data<float>()[t * p.top_k + j] = static_cast<float>(w * p.scaling);
    }
  }
}

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                 std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) {
  need(x, "moe_experts", "x", DType::kF32, 2);
  need(out, "moe_experts", "out", DType::kF32, 2);
  need(ids, "moe_experts", "ids", DType::kI32, 2);
  need(weights, "moe_experts", "weights", DType::kF32, 2);
  const int64_t T = x.dim(0), H = x.dim(1), K = ids.dim(1);
  need_shape(out, {T, H}, "moe_experts", "out");
  need_shape(ids, {T, K}, "moe_experts", "ids");
  need_shape(weights, {T, K}, "moe_experts", "weights");
  BASALT_CHECK(!experts.empty(), "reference moe_experts: no experts");
  const int64_t I = experts[0].gate.weight.dim(0);
  const bool int_experts = experts[0].gate.int_quantized();
  for (const MoeExpert& e : experts) {
    BASALT_CHECK(e.gate.int_quantized() == int_experts && e.up.int_quantized() == int_experts &&
                     e.down.int_quantized() == int_experts,
                 "reference moe_experts: experts mix integer and other weight formats");
    check_weight(e.gate, I, H, "moe_experts", "gate");
    check_weight(e.up, I, H, "moe_experts", "up");
    check_weight(e.down, H, I, "moe_experts", "down");
  }
  std::vector<double> act(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> acc(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t id =
          static_cast<int64_t>(ids.data<const int32_t>()[t * K + j]) - std::max<int64_t>(first_expert, 0);
      const bool mine = id >= 0 && id < static_cast<int64_t>(experts.size());
      BASALT_CHECK(mine || first_expert >= 0, "reference moe_experts: expert id {} out of range", id);
      if (!mine) continue;  // another rank's expert
      const MoeExpert& e = experts[static_cast<size_t>(id)];
      const float* xr = x.data<const float>() + t * H;
      const double w = weights.data<const float>()[t * K + j];
      if (int_experts) {  // the product of core/int_weights.h, as the CPU backend runs it
        const std::vector<float> g = int_row(xr, e.gate), u = int_row(xr, e.up);
        std::vector<float> a(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) a[i] = static_cast<float>(silu(g[i])) * u[i];
        const std::vector<float> y = int_row(a.data(), e.down);
        for (int64_t h = 0; h < H; ++h) acc[h] += w * y[h];
        continue;
      }
      for (int64_t i = 0; i < I; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          g += static_cast<double>(xr[h]) * load_weight(e.gate, i, h);
          u += static_cast<double>(xr[h]) * load_weight(e.up, i, h);
        }
        act[i] = static_cast<double>(static_cast<float>(silu(g)) * static_cast<float>(u));
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i) y += act[i] * load_weight(e.down, h, i);
        acc[h] += w * y;
      }
    }
    for (int64_t h = 0; h < H; ++h) out.data<float>()[t * H + h] = static_cast<float>(acc[h]);
  }
}

void mla_store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps, const Tensor& positions,
                  const RopeParams& rope_params, const Tensor& slots, Tensor& cache) {
  need(kv_a, "mla_store_kv", "kv_a", DType::kF32, 2);
  need(positions, "mla_store_kv", "positions", DType::kI32, 1);
  need(slots, "mla_store_kv", "slots", DType::kI32, 1);
  const int64_t T = kv_a.dim(0), R = rope_params.rotary_dim, L = kv_a.dim(1) - R;
  BASALT_CHECK(L > 0 && rope_params.num_heads == 1 && rope_params.head_dim == R &&
                   rope_params.rotary_offset == 0,
               "reference mla_store_kv: rope must be one head of R rotary dims");
  BASALT_CHECK(norm_weight.rank() == 1 && norm_weight.dim(0) == L,
               "reference mla_store_kv: norm_weight must be [{}]", L);
  BASALT_CHECK(cache.rank() == 2 && cache.dim(1) == L + R &&
                   (cache.dtype() == DType::kF32 || cache.dtype() == DType::kBF16),
               "reference mla_store_kv: cache must be f32 or bf16 [S, {}], got {}", L + R,
               cache.describe());
  need_shape(positions, {T}, "mla_store_kv", "positions");
  need_shape(slots, {T}, "mla_store_kv", "slots");
  Tensor pe = Tensor::empty({T, R}, DType::kF32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < R; ++r) pe.data<float>()[t * R + r] = kv_a.data<const float>()[t * (L + R) + L + r];
  rope(pe, positions, rope_params);
  Tensor row = Tensor::empty({1, L + R}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t slot = slots.data<const int32_t>()[t];
    if (slot < 0) continue;  // padding
    BASALT_CHECK(slot < cache.dim(0), "reference mla_store_kv: slot {} outside [0, {})", slot, cache.dim(0));
    const float* a = kv_a.data<const float>() + t * (L + R);
    double ss = 0.0;
    for (int64_t i = 0; i < L; ++i) ss += static_cast<double>(a[i]) * a[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(L) + eps));
    for (int64_t i = 0; i < L; ++i)
      row.data<float>()[i] = (a[i] * inv) * load_f32(norm_weight, i);
    for (int64_t r = 0; r < R; ++r) row.data<float>()[L + r] = pe.data<float>()[t * R + r];
    Tensor dst = cache.rows(slot, 1);
    copy(row, dst);
  }
}

void mla_expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                   const MlaParams& p, Tensor& k, Tensor& v) {
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  BASALT_CHECK(heads > 0 && L > 0 && Dn > 0 && R > 0 && Dv > 0, "reference mla: bad params");
  need(slots, "mla_expand_kv", "slots", DType::kI32, 1);
  const int64_t S = slots.dim(0);
  BASALT_CHECK(cache.rank() == 2 && cache.dim(1) == L + R, "reference mla_expand_kv: bad cache {}",
               cache.describe());
  check_weight(kv_b, heads * (Dn + Dv), L, "mla_expand_kv", "kv_b");
  BASALT_CHECK(k.dtype() == v.dtype() && (k.dtype() == DType::kF32 || k.dtype() == DType::kBF16),
               "reference mla_expand_kv: k and v must both be f32 or both bf16, got {} and {}", k.describe(),
               v.describe());
  need(k, "mla_expand_kv", "k", k.dtype(), 2);
  need(v, "mla_expand_kv", "v", v.dtype(), 2);
  need_shape(k, {S, heads * (Dn + R)}, "mla_expand_kv", "k");
  need_shape(v, {S, heads * Dv}, "mla_expand_kv", "v");
  for (int64_t i = 0; i < S; ++i) {
    const int32_t slot = slots.data<const int32_t>()[i];
    BASALT_CHECK(slot >= 0 && slot < cache.dim(0), "reference mla_expand_kv: slot {} out of range", slot);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < Dn + Dv; ++d) {
        double sum = 0.0;
        for (int64_t c = 0; c < L; ++c)
          sum += static_cast<double>(load_f32(cache, slot * (L + R) + c)) *
                 load_weight(kv_b, h * (Dn + Dv) + d, c);
        if (d < Dn) {
          store_f32(k, (i * heads + h) * (Dn + R) + d, static_cast<float>(sum));
        } else {
          store_f32(v, (i * heads + h) * Dv + d - Dn, static_cast<float>(sum));
        }
      }
      for (int64_t r = 0; r < R; ++r)
        store_f32(k, (i * heads + h) * (Dn + R) + Dn + r, load_f32(cache, slot * (L + R) + L + r));
    }
  }
}

void mla_attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                   const AttentionLayout& layout, const MlaParams& p, Tensor& out) {
  need(q, "mla_attention", "q", DType::kF32, 2);
  need(out, "mla_attention", "out", DType::kF32, 2);
  const int64_t T = q.dim(0), heads = p.num_heads, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  need_shape(q, {T, heads * (Dn + R)}, "mla_attention", "q");
  need_shape(out, {T, heads * Dv}, "mla_attention", "out");
  check_layout(layout, T, "mla_attention");
  // The expanded form over every slot the layout names, then plain attention.
  const int64_t S = layout.kv_start.data<const int32_t>()[layout.kv_start.dim(0) - 1];
  Tensor k = Tensor::empty({S, heads * (Dn + R)}, DType::kF32);
  Tensor v = Tensor::empty({S, heads * Dv}, DType::kF32);
  mla_expand_kv(cache, layout.kv_slots.rows(0, S), kv_b, p, k, v);
  std::vector<int32_t> iota(static_cast<size_t>(S));
  std::iota(iota.begin(), iota.end(), 0);
  AttentionLayout dense{layout.q_start, layout.kv_start, Tensor::from_i32({S}, iota)};
  AttentionParams ap{static_cast<int>(heads), static_cast<int>(heads), static_cast<int>(Dn + R),
                     static_cast<int>(Dv), p.scale, 0};
  attention(q, k, v, dense, ap, out);
}

void concat_columns(const Tensor& a, const Tensor& b, Tensor& out) {
  need(a, "concat_columns", "a", DType::kF32, 2);
  need(b, "concat_columns", "b", DType::kF32, 2);
  need(out, "concat_columns", "out", DType::kF32, 2);
  const int64_t T = a.dim(0), A = a.dim(1), B = b.dim(1);
  need_shape(b, {T, B}, "concat_columns", "b");
  need_shape(out, {T, A + B}, "concat_columns", "out");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < A; ++i) out.data<float>()[t * (A + B) + i] = a.data<const float>()[t * A + i];
    for (int64_t i = 0; i < B; ++i) out.data<float>()[t * (A + B) + A + i] = b.data<const float>()[t * B + i];
  }
}

void moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) {
  need(rows, "moe_combine", "rows", DType::kF32, 2);
  need(positions, "moe_combine", "positions", DType::kI32, 2);
  need(weights, "moe_combine", "weights", DType::kF32, 2);
  need(out, "moe_combine", "out", DType::kF32, 2);
  const int64_t P = rows.dim(0), H = rows.dim(1), T = positions.dim(0), K = positions.dim(1);
  need_shape(weights, {T, K}, "moe_combine", "weights");
  need_shape(out, {T, H}, "moe_combine", "out");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = positions.data<const int32_t>()[t * K + j];
        BASALT_CHECK(r < P, "reference moe_combine: positions[{}] = {} is past the {} rows", t * K + j, r, P);
        if (r >= 0)
          sum += static_cast<double>(weights.data<const float>()[t * K + j]) * rows.data<const float>()[r * H + h];
      }
      out.data<float>()[t * H + h] = static_cast<float>(sum);
    }
  }
}

}  // namespace basalt::reference
