// CpuBackend's block-FP8 and integer-format linears and mixture-of-experts ops
// (routing, experts, and the combine of results that come back as rows).
//
// moe_experts groups the (token, slot) pairs by expert, gathers each expert's
// tokens into a contiguous block and runs the expert's three linears on that
// block only, so the cost follows the routed tokens, not tokens x experts.
// How many tokens an expert gets depends on the rest of the batch, but the
// linear kernels give each row the same bits for any token count, and each
// token's expert outputs are added in expert order, so a token's result does
// not depend on the batch (batch invariance).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/deepseek_checks.h"
#include "backend/cpu/fp8_block.h"
#include "backend/cpu/int_linear.h"
#include "core/error.h"

namespace basalt {

void CpuBackend::linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                                       Tensor& out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  cpu::linear_fp8_block_f32(*pool_, x.data<const float>(), T, K, w.data<const uint8_t>(),
                            scale_inv.data<const float>(), N, out.data<float>());
}

void CpuBackend::linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) {
  std::vector<float> b;
  if (bias != nullptr) {
    const Tensor f = bias->dtype() == DType::kF32 ? *bias : bias->to_f32();
    b.assign(f.data<const float>(), f.data<const float>() + f.numel());
  }
  cpu::linear_int_f32(*pool_, x.data<const float>(), x.dim(0), w.int_layout, w.weight.raw(),
                      w.scales.data<const uint16_t>(), w.weight.dim(0), bias ? b.data() : nullptr, out.data<float>());
}

// Interleaved where this machine's kernel reads rows faster so; the codes
// from the checkpoint's pages are read once here and not kept.
void CpuBackend::prepare_int_weight_impl(LinearWeight& w) {
  if (w.int_layout.rows_interleaved || !cpu::linear_int_interleave_pays()) return;
  Tensor codes = Tensor::empty(w.weight.shape(), w.weight.dtype());
  Tensor scales = Tensor::empty(w.scales.shape(), w.scales.dtype());
  cpu::interleave_int_weight(*pool_, w.int_layout, w.weight.dim(0), w.weight.raw(), w.scales.data<const uint16_t>(),
                             codes.raw(), scales.data<uint16_t>());
  w.weight = std::move(codes);
  w.scales = std::move(scales);
  w.int_layout.rows_interleaved = true;
}

void CpuBackend::moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& p,
                                Tensor& ids, Tensor& weights) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t per_group = E / p.num_groups;
  const float* b = bias ? bias->data<const float>() : nullptr;
  pool_->parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
        std::vector<float> group(static_cast<size_t>(p.num_groups));
        std::vector<int32_t> order(static_cast<size_t>(std::max<int64_t>(E, p.num_groups)));
        for (int64_t t = t0; t < t1; ++t) {
          const float* row = logits.data<const float>() + t * E;
          if (p.scoring == MoeScoring::kSoftmax) {
            float max = -std::numeric_limits<float>::infinity();
            for (int64_t e = 0; e < E; ++e) max = std::max(max, row[e]);
            double z = 0.0;
            for (int64_t e = 0; e < E; ++e) {
              score[e] = std::exp(row[e] - max);
              z += score[e];
            }
            for (int64_t e = 0; e < E; ++e) score[e] = static_cast<float>(score[e] / z);
          } else {
            for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-row[e]));
          }
          for (int64_t e = 0; e < E; ++e) choice[e] = score[e] + (b ? b[e] : 0.0f);
          auto ranks_before = [](const std::vector<float>& v) {
            return [&v](int32_t a, int32_t c) { return v[a] > v[c] || (v[a] == v[c] && a < c); };
          };
          if (p.num_groups > 1) {
            for (int64_t g = 0; g < p.num_groups; ++g) {
              float first = -std::numeric_limits<float>::infinity(), second = first;
              for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
                if (choice[e] > first) {
                  second = first;
                  first = choice[e];
                } else if (choice[e] > second) {
                  second = choice[e];
                }
              }
              group[g] = b ? first + (per_group > 1 ? second : 0.0f) : first;
            }
            std::iota(order.begin(), order.begin() + p.num_groups, 0);
            std::partial_sort(order.begin(), order.begin() + p.topk_groups,
                              order.begin() + p.num_groups, ranks_before(group));
            std::vector<bool> keep(static_cast<size_t>(p.num_groups), false);
            for (int g = 0; g < p.topk_groups; ++g) keep[order[g]] = true;
            for (int64_t e = 0; e < E; ++e)
              if (!keep[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
          }
          std::iota(order.begin(), order.begin() + E, 0);
          std::partial_sort(order.begin(), order.begin() + p.top_k, order.begin() + E,
                            ranks_before(choice));
          float sum = 0.0f;
          for (int j = 0; j < p.top_k; ++j) sum += score[order[j]];
          for (int j = 0; j < p.top_k; ++j) {
            float w = score[order[j]];
            if (p.normalize) w /= sum;
            ids.data<int32_t>()[t * p.top_k + j] = order[j];
            weights.data<float>()[t * p.top_k + j] = w * p.scaling;
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(1, E)));
}

void CpuBackend::moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                  std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) {
  const int64_t T = x.dim(0), H = x.dim(1), K = ids.dim(1);
  const int64_t I = experts[0].gate.weight.rank() == 2 ? experts[0].gate.weight.dim(0) : 0;
  const int64_t E = static_cast<int64_t>(experts.size());

  // Group the (token, slot) pairs by expert; with a slice of the model's
  // experts (first_expert >= 0), the pairs routed outside it are left out.
  const int64_t first = std::max<int64_t>(first_expert, 0);
  std::vector<int64_t> local(static_cast<size_t>(T * K));
  const int32_t* id = ids.data<const int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = static_cast<int64_t>(id[i]) - first;  // ids were checked by Backend when first_expert < 0
    local[static_cast<size_t>(i)] = e >= 0 && e < E ? e : -1;
  }
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int64_t e : local)
    if (e >= 0) ++count[static_cast<size_t>(e + 1)];
  std::partial_sum(count.begin(), count.end(), count.begin());
  std::vector<int64_t> order(static_cast<size_t>(count[static_cast<size_t>(E)]));
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) {
      const int64_t e = local[static_cast<size_t>(i)];
      if (e >= 0) order[static_cast<size_t>(fill[static_cast<size_t>(e)]++)] = i;
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    if (count[e + 1] == count[e]) continue;
    const MoeExpert& ex = experts[static_cast<size_t>(e)];
    cpu::check_linear_weight(ex.gate, I, H, "moe_experts", "gate");
    cpu::check_linear_weight(ex.up, I, H, "moe_experts", "up");
    cpu::check_linear_weight(ex.down, H, I, "moe_experts", "down");
  }

  std::fill(out.data<float>(), out.data<float>() + T * H, 0.0f);
  std::vector<float> xs, gate, up, y;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = count[e + 1] - count[e];
    if (n == 0) continue;
    const MoeExpert& ex = experts[static_cast<size_t>(e)];
    const int64_t* pairs = order.data() + count[e];
    xs.resize(static_cast<size_t>(n * H));
    gate.resize(static_cast<size_t>(n * I));
    up.resize(static_cast<size_t>(n * I));
    y.resize(static_cast<size_t>(n * H));
    const float* xd = x.data<const float>();
    // A token routed to every expert (shared experts, dense MLPs) is used in place.
    const bool identity = n == T && K == 1;
    const float* xin = xd;
    if (!identity) {
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(xd + (pairs[i] / K) * H, H, xs.data() + i * H);
      xin = xs.data();
    }
    cpu::linear_weight_f32(*pool_, xin, n, ex.gate, gate.data(), bf16_activations_);
    cpu::linear_weight_f32(*pool_, xin, n, ex.up, up.data(), bf16_activations_);
    for (int64_t i = 0; i < n * I; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    cpu::linear_weight_f32(*pool_, gate.data(), n, ex.down, y.data(), bf16_activations_);
    const float* w = weights.data<const float>();
    float* o = out.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = pairs[i] / K;
      const float wi = w[pairs[i]];
      const float* yi = y.data() + i * H;
      float* ot = o + t * H;
      for (int64_t h = 0; h < H; ++h) ot[h] += wi * yi[h];
    }
  }
}

void CpuBackend::moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) {
  const int64_t H = rows.dim(1), T = positions.dim(0), K = positions.dim(1);
  pool_->parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = out.data<float>() + t * H;
      std::fill_n(dst, H, 0.0f);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = positions.data<const int32_t>()[t * K + j];
        if (r < 0) continue;
        const float w = weights.data<const float>()[t * K + j];
        const float* src = rows.data<const float>() + static_cast<int64_t>(r) * H;
        for (int64_t h = 0; h < H; ++h) dst[h] += w * src[h];
      }
    }
  });
}

}  // namespace basalt
