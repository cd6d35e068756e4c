// CpuBackend's multi-head latent attention ops (DeepSeek V2/V3).
//
// mla_attention is the weight-absorbed form: per (token, head) the nope query
// is projected into the latent space through that head's key rows of kv_b,
// scored against the cached [latent | rope key] rows as one shared key head,
// and the softmax-weighted latent is projected back through the head's value
// rows. Work is spread over (token, group of heads) pairs, so that each
// cached row is read once per group rather than once per head; every (token,
// head) is computed alone over all its keys in position order, so the group
// size (set by the thread count), the other rows of the call and the split of
// a prompt into prefill chunks do not change its bits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fp8_block.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace basalt {
namespace {

// Row `slot` of the cache as f32: a pointer into an f32 cache, or converted into buf.
const float* cache_row(const Tensor& cache, int64_t slot, float* buf) {
  const int64_t width = cache.dim(1);
  if (cache.dtype() == DType::kF32) return cache.data<const float>() + slot * width;
  const uint16_t* src = cache.data<const uint16_t>() + slot * width;
  int64_t i = 0;
  for (; i + cpu::kLanes <= width; i += cpu::kLanes) cpu::vstore(buf + i, cpu::vload_bf16(src + i));
  for (; i < width; ++i) buf[i] = bf16_to_f32(src[i]);
  return buf;
}

float dot(const float* a, const float* b, int64_t n) {
  cpu::Vec acc = cpu::vzero();
  int64_t k = 0;
  for (; k + cpu::kLanes <= n; k += cpu::kLanes) acc = cpu::vfma(cpu::vload(a + k), cpu::vload(b + k), acc);
  float s = cpu::vsum(acc);
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const cpu::Vec av = cpu::vset(a);
  int64_t k = 0;
  for (; k + cpu::kLanes <= n; k += cpu::kLanes)
    cpu::vstore(y + k, cpu::vfma(av, cpu::vload(x + k), cpu::vload(y + k)));
  for (; k < n; ++k) y[k] += a * x[k];
}

}  // namespace

void CpuBackend::mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                                   const Tensor& positions, const RopeParams& rope,
                                   const Tensor& slots, Tensor& cache) {
  const int64_t T = kv_a.dim(0), R = rope.rotary_dim, L = kv_a.dim(1) - R;
  const int32_t* slot = slots.data<const int32_t>();
  LinearWeight norm{norm_weight.reshape({1, L}), Tensor()};
  pool_->parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(static_cast<size_t>(L + R)), w(static_cast<size_t>(L));
    cpu::weight_row_f32(norm, 0, w.data());
    for (int64_t t = t0; t < t1; ++t) {
      if (slot[t] < 0) continue;  // padding: nothing stored
      const float* a = kv_a.data<const float>() + t * (L + R);
      double ss = 0.0;
      for (int64_t i = 0; i < L; ++i) ss += static_cast<double>(a[i]) * a[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(L)) + eps);
      for (int64_t i = 0; i < L; ++i) row[i] = (a[i] * inv) * w[i];
      const float position = static_cast<float>(positions.data<const int32_t>()[t]);
      const int64_t half = R / 2;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = position * rope.inv_freq->data<const float>()[i];
        const float c = std::cos(angle) * rope.attention_scaling;
        const float s = std::sin(angle) * rope.attention_scaling;
        const int64_t ia = rope.style == RopeStyle::kRotateHalf ? i : 2 * i;
        const int64_t ib = rope.style == RopeStyle::kRotateHalf ? i + half : 2 * i + 1;
        const float x = a[L + ia], y = a[L + ib];
        row[L + ia] = x * c - y * s;
        row[L + ib] = y * c + x * s;
      }
      if (cache.dtype() == DType::kF32) {
        std::copy(row.begin(), row.end(), cache.data<float>() + slot[t] * (L + R));
      } else {
        uint16_t* dst = cache.data<uint16_t>() + slot[t] * (L + R);
        for (int64_t i = 0; i < L + R; ++i) dst[i] = f32_to_bf16(row[i]);
      }
    }
  });
}

void CpuBackend::mla_expand_kv_impl(const Tensor& cache, const Tensor& slots,
                                    const LinearWeight& kv_b, const MlaParams& p, Tensor& k,
                                    Tensor& v) {
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  const int64_t S = slots.dim(0);
  const int32_t* slot = slots.data<const int32_t>();
  std::vector<float> latent(static_cast<size_t>(S * L)), buf(static_cast<size_t>(L + R));
  std::vector<float> kv(static_cast<size_t>(S * heads * (Dn + Dv)));
  for (int64_t i = 0; i < S; ++i) {
    const float* row = cache_row(cache, slot[i], buf.data());
    std::copy_n(row, L, latent.data() + i * L);
  }
  // f32 latents, as the absorbed attention multiplies them, so both forms agree.
  cpu::linear_weight_f32(*pool_, latent.data(), S, kv_b, kv.data(), cpu::Bf16Activations::kF32);
  // Copies n floats to element `at` of dst, rounded to dst's dtype.
  const auto put = [](const float* src, int64_t n, Tensor& dst, int64_t at) {
    if (dst.dtype() == DType::kF32) {
      std::copy_n(src, n, dst.data<float>() + at);
    } else {
      uint16_t* d = dst.data<uint16_t>() + at;
      for (int64_t j = 0; j < n; ++j) d[j] = f32_to_bf16(src[j]);
    }
  };
  for (int64_t i = 0; i < S; ++i) {
    const float* row = cache_row(cache, slot[i], buf.data());
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = kv.data() + (i * heads + h) * (Dn + Dv);
      const int64_t kd = (i * heads + h) * (Dn + R);
      put(src, Dn, k, kd);
      put(row + L, R, k, kd + Dn);
      put(src + Dn, Dv, v, (i * heads + h) * Dv);
    }
  }
}

void CpuBackend::mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                                    const AttentionLayout& layout, const MlaParams& p,
                                    Tensor& out) {
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim,
                R = p.qk_rope_head_dim, Dv = p.v_head_dim;
  const int64_t T = q.dim(0);
  const int64_t seqs = layout.q_start.dim(0) - 1;
  const int32_t* q_start = layout.q_start.data<const int32_t>();
  const int32_t* kv_start = layout.kv_start.data<const int32_t>();
  const int32_t* kv_slots = layout.kv_slots.data<const int32_t>();
  // Row -> (sequence, position) and slot checks up front. A query row at a
  // negative position (more queries than keys: padding) gets a zero row.
  std::vector<int64_t> row_seq(static_cast<size_t>(T)), row_pos(static_cast<size_t>(T));
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t q_len = q_start[s + 1] - q_start[s], kv_len = kv_start[s + 1] - kv_start[s];
    for (int64_t i = 0; i < q_len; ++i) {
      row_seq[q_start[s] + i] = s;
      row_pos[q_start[s] + i] = kv_len - q_len + i;
    }
  }
  // Work items are (token, group of heads): every cached row is read once per
  // group, and the group's scores and latent sums stay in cache.
  const int64_t group = std::clamp<int64_t>(heads / std::max(1, pool_->size()), 1, 16);
  const int64_t groups = (heads + group - 1) / group;
  pool_->parallel_for(T * groups, [&](int64_t w0, int64_t w1) {
    std::vector<float> qlat(static_cast<size_t>(group * (L + R)));
    std::vector<float> olat(static_cast<size_t>(group * L));
    std::vector<float> buf(static_cast<size_t>(L + R)), scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / groups, h0 = (w % groups) * group;
      const int64_t hn = std::min(group, heads - h0);
      const int64_t s = row_seq[t], n = row_pos[t] + 1;
      if (n <= 0) {  // before the sequence's first key: nothing to attend to
        std::fill_n(out.data<float>() + (t * heads + h0) * Dv, hn * Dv, 0.0f);
        continue;
      }
      const int32_t* slots = kv_slots + kv_start[s];
      // Queries in the latent space: [q_nope · W_uk(h) | q_pe] per head.
      std::fill(qlat.begin(), qlat.end(), 0.0f);
      for (int64_t i = 0; i < hn; ++i) {
        const int64_t h = h0 + i;
        const float* qh = q.data<const float>() + (t * heads + h) * (Dn + R);
        float* ql = qlat.data() + i * (L + R);
        for (int64_t d = 0; d < Dn; ++d) cpu::weight_row_axpy(kv_b, h * (Dn + Dv) + d, qh[d], ql);
        std::copy_n(qh + Dn, R, ql + L);
      }
      scores.resize(static_cast<size_t>(hn * n));
      for (int64_t j = 0; j < n; ++j) {
        const float* row = cache_row(cache, slots[j], buf.data());
        for (int64_t i = 0; i < hn; ++i)
          scores[i * n + j] = dot(qlat.data() + i * (L + R), row, L + R) * p.scale;
      }
      for (int64_t i = 0; i < hn; ++i) {
        float* sc = scores.data() + i * n;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) max = std::max(max, sc[j]);
        float z = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          sc[j] = std::exp(sc[j] - max);
          z += sc[j];
        }
        const float inv = 1.0f / z;
        for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
      }
      std::fill(olat.begin(), olat.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* row = cache_row(cache, slots[j], buf.data());
        for (int64_t i = 0; i < hn; ++i) axpy(scores[i * n + j], row, olat.data() + i * L, L);
      }
      for (int64_t i = 0; i < hn; ++i) {
        const int64_t h = h0 + i;
        float* o = out.data<float>() + (t * heads + h) * Dv;
        for (int64_t d = 0; d < Dv; ++d)
          o[d] = cpu::weight_row_dot(kv_b, h * (Dn + Dv) + Dn + d, olat.data() + i * L);
      }
    }
  });
}

void CpuBackend::concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t T = a.dim(0), A = a.dim(1), B = b.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(a.data<const float>() + t * A, A, out.data<float>() + t * (A + B));
    std::copy_n(b.data<const float>() + t * B, B, out.data<float>() + t * (A + B) + A);
  }
}

}  // namespace basalt
