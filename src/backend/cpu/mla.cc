// CpuBackend's multi-head latent attention ops (DeepSeek V2/V3).
//
// mla_attention is the weight-absorbed form: per (token, head) the nope query
// is projected into the latent space through that head's key rows of kv_b,
// scored against the cached [latent | rope key] rows as one shared key head,
// and the softmax-weighted latent is projected back through the head's value
// rows. Work items are (tile of up to 16 consecutive query rows of one
// sequence, group of heads): each cached row is converted and read once per
// item for all its (row, head) pairs, and items are claimed longest first
// (a prompt's last rows see the most keys), so that a causal prompt's work
// spreads evenly over the threads. Every (token, head) is still computed
// alone, over all its keys in position order, by the same arithmetic
// (mla_scores4's per-pair sums, the row's softmax, the value sums key by key),
// so the tile it sits in, the group size (set by the thread count), the other
// rows of the call and the split of a prompt into prefill chunks do not
// change its bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fp8_block.h"
#include "backend/cpu/parallel.h"
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

// Scores of four (query, key) pairs against one key row k of n floats:
// out[i] = scale * (the lane sums of fma(q[i], k) over k's kLanes chunks,
// the tail's missing lanes zero). vsum4 reduces its four operands by one
// tree whichever slot they take, so a score's bits depend on its query and
// key alone (a caller with fewer pairs points the rest at a zero row).
void mla_scores4(const float* const* q, const float* k, int64_t n, float scale, float* out) {
  cpu::Vec a0 = cpu::vzero(), a1 = cpu::vzero(), a2 = cpu::vzero(), a3 = cpu::vzero();
  int64_t c = 0;
  for (; c + cpu::kLanes <= n; c += cpu::kLanes) {
    const cpu::Vec kv = cpu::vload(k + c);
    a0 = cpu::vfma(cpu::vload(q[0] + c), kv, a0);
    a1 = cpu::vfma(cpu::vload(q[1] + c), kv, a1);
    a2 = cpu::vfma(cpu::vload(q[2] + c), kv, a2);
    a3 = cpu::vfma(cpu::vload(q[3] + c), kv, a3);
  }
  if (c < n) {
    const int rest = static_cast<int>(n - c);
    const cpu::Vec kv = cpu::vload_partial(k + c, rest);
    a0 = cpu::vfma(cpu::vload_partial(q[0] + c, rest), kv, a0);
    a1 = cpu::vfma(cpu::vload_partial(q[1] + c, rest), kv, a1);
    a2 = cpu::vfma(cpu::vload_partial(q[2] + c, rest), kv, a2);
    a3 = cpu::vfma(cpu::vload_partial(q[3] + c, rest), kv, a3);
  }
  cpu::vsum4(a0, a1, a2, a3, out);
  for (int i = 0; i < 4; ++i) out[i] *= scale;
}

// s[0 .. n) = softmax(s): the max (exact in any order), then exp(s - max)
// by vexp in kLanes chunks (the tail through a partial chunk), summed
// lane-wise and the lanes by vsum, the tail's terms after in order; then each
// times 1 / sum. A fixed function of the row's n values.
void softmax_row(float* s, int64_t n) {
  const cpu::Vec mv = cpu::vset(cpu::row_max(s, n));
  cpu::Vec zv = cpu::vzero();
  int64_t j = 0;
  for (; j + cpu::kLanes <= n; j += cpu::kLanes) {
    const cpu::Vec e = cpu::vexp(cpu::vsub(cpu::vload(s + j), mv));
    cpu::vstore(s + j, e);
    zv = cpu::vadd(zv, e);
  }
  float z = cpu::vsum(zv);
  if (j < n) {
    const int rest = static_cast<int>(n - j);
    cpu::vstore_partial(s + j, cpu::vexp(cpu::vsub(cpu::vload_partial(s + j, rest), mv)), rest);
    for (int64_t t = j; t < n; ++t) z += s[t];
  }
  const cpu::Vec inv = cpu::vset(1.0f / z);
  for (j = 0; j + cpu::kLanes <= n; j += cpu::kLanes) cpu::vstore(s + j, cpu::vmul(cpu::vload(s + j), inv));
  if (j < n) {
    const int rest = static_cast<int>(n - j);
    cpu::vstore_partial(s + j, cpu::vmul(cpu::vload_partial(s + j, rest), inv), rest);
  }
}

// y[0 .. n) += sum over j < count of p[j] * rows[j * stride ..][0 .. n), as
// one fma per key and element in key order (the accumulators held in
// registers over the keys, 4 x kLanes columns at a time; a partial chunk's
// missing lanes are zero): an element's bits depend on its p, rows and the
// order of the keys, not on how they are blocked.
void accumulate_rows(const float* p, const float* rows, int64_t count, int64_t stride, float* y, int64_t n) {
  constexpr int64_t kChunk = 4 * cpu::kLanes;
  for (int64_t c = 0; c < n; c += kChunk) {
    int lanes[4];
    cpu::Vec acc[4];
    for (int q = 0; q < 4; ++q) {
      const int64_t at = c + q * cpu::kLanes;
      lanes[q] = static_cast<int>(std::clamp<int64_t>(n - at, 0, cpu::kLanes));
      acc[q] = lanes[q] == cpu::kLanes ? cpu::vload(y + at) : cpu::vload_partial(y + at, lanes[q]);
    }
    if (lanes[3] == cpu::kLanes) {
      for (int64_t j = 0; j < count; ++j) {
        const cpu::Vec a = cpu::vset(p[j]);
        const float* r = rows + j * stride + c;
        for (int q = 0; q < 4; ++q) acc[q] = cpu::vfma(a, cpu::vload(r + q * cpu::kLanes), acc[q]);
      }
    } else {
      for (int64_t j = 0; j < count; ++j) {
        const cpu::Vec a = cpu::vset(p[j]);
        const float* r = rows + j * stride + c;
        for (int q = 0; q < 4 && lanes[q] > 0; ++q)
          acc[q] = cpu::vfma(a, cpu::vload_partial(r + q * cpu::kLanes, lanes[q]), acc[q]);
      }
    }
    for (int q = 0; q < 4 && lanes[q] > 0; ++q) {
      const int64_t at = c + q * cpu::kLanes;
      if (lanes[q] == cpu::kLanes) cpu::vstore(y + at, acc[q]);
      else cpu::vstore_partial(y + at, acc[q], lanes[q]);
    }
  }
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
  const int64_t seqs = layout.q_start.dim(0) - 1;
  const int32_t* q_start = layout.q_start.data<const int32_t>();
  const int32_t* kv_start = layout.kv_start.data<const int32_t>();
  const int32_t* kv_slots = layout.kv_slots.data<const int32_t>();
  // Groups of heads: with few rows (decode) the groups are what spreads the
  // work over the threads.
  const int64_t group = std::clamp<int64_t>(heads / std::max(1, pool_->size()), 1, 16);
  const int64_t groups = (heads + group - 1) / group;
  // Tiles of up to 16 consecutive query rows of a sequence, fewer where a
  // tile's scores (rows x heads x keys) would pass 64K floats.
  struct Tile {
    int64_t seq, row0, rows, pos0;  // rows [row0, row0 + rows) at positions pos0, pos0 + 1, ...
    int64_t keys() const { return std::max<int64_t>(pos0 + rows, 0); }  // the last row's keys
  };
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t q_len = q_start[s + 1] - q_start[s], kv_len = kv_start[s + 1] - kv_start[s];
    const int64_t per_tile = std::clamp<int64_t>(65536 / (group * std::max<int64_t>(kv_len, 1)), 1, 16);
    for (int64_t i = 0; i < q_len; i += per_tile)
      tiles.push_back({s, q_start[s] + i, std::min(per_tile, q_len - i), kv_len - q_len + i});
  }
  // Longest first: the items that see the most keys start before the short ones.
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.rows * a.keys() > b.rows * b.keys(); });
  const int64_t items = static_cast<int64_t>(tiles.size()) * groups;
  // Keys whose f32 rows fit 32 KB: a block is converted into L1 and read
  // there by every pair of the item.
  const int64_t key_block = std::max<int64_t>(1, 8192 / (L + R));
  cpu::dynamic_for(*pool_, items, 1, [&](int64_t w0, int64_t w1) {
    thread_local std::vector<float> kbuf;  // at most 32 KB (or one key row) a thread, kept
    if (kbuf.size() < static_cast<size_t>(key_block * (L + R))) kbuf.resize(static_cast<size_t>(key_block * (L + R)));
    std::vector<float> qlat, olat, scores;
    for (int64_t w = w0; w < w1; ++w) {
      const Tile& tile = tiles[static_cast<size_t>(w / groups)];
      const int64_t h0 = (w % groups) * group, hn = std::min(group, heads - h0);
      const int64_t n_max = tile.keys(), pairs = tile.rows * hn;  // pair (i, hh): index i * hn + hh
      const int32_t* slots = kv_slots + kv_start[tile.seq];
      // Row i sees keys [0, pos0 + i + 1); rows before `first` see none
      // (more queries than keys: padding) and get zero rows.
      const int64_t first = std::clamp<int64_t>(-tile.pos0, 0, tile.rows);
      for (int64_t i = 0; i < first; ++i)
        std::fill_n(out.data<float>() + ((tile.row0 + i) * heads + h0) * Dv, hn * Dv, 0.0f);
      if (first == tile.rows) continue;
      qlat.assign(static_cast<size_t>((pairs + 1) * (L + R)), 0.0f);  // the last row stays zero
      olat.assign(static_cast<size_t>(pairs * L), 0.0f);
      scores.resize(static_cast<size_t>(pairs * n_max));
      // Queries in the latent space: [q_nope · W_uk(h) | q_pe] per head.
      for (int64_t i = first; i < tile.rows; ++i)
        for (int64_t hh = 0; hh < hn; ++hh) {
          const int64_t h = h0 + hh;
          const float* qh = q.data<const float>() + ((tile.row0 + i) * heads + h) * (Dn + R);
          float* ql = qlat.data() + (i * hn + hh) * (L + R);
          for (int64_t d = 0; d < Dn; ++d) cpu::weight_row_axpy(kv_b, h * (Dn + Dv) + d, qh[d], ql);
          std::copy_n(qh + Dn, R, ql + L);
        }
      // The rows that see key j: from row max(first, j - pos0) on. Keys go
      // in blocks whose f32 rows fit kbuf, converted once per pass.
      const auto first_seeing = [&](int64_t j) { return std::max(first, j - tile.pos0); };
      const auto convert_keys = [&](int64_t jb, int64_t je) {
        for (int64_t j = jb; j < je; ++j) {
          float* dst = kbuf.data() + (j - jb) * (L + R);
          const float* row = cache_row(cache, slots[j], dst);
          if (row != dst) std::copy_n(row, L + R, dst);
        }
      };
      for (int64_t jb = 0; jb < n_max; jb += key_block) {
        const int64_t je = std::min(n_max, jb + key_block);
        convert_keys(jb, je);
        for (int64_t j = jb; j < je; ++j) {
          const float* row = kbuf.data() + (j - jb) * (L + R);
          for (int64_t pr = first_seeing(j) * hn; pr < pairs; pr += 4) {
            const int count = static_cast<int>(std::min<int64_t>(4, pairs - pr));
            const float* qs[4];
            float sc[4];
            for (int c = 0; c < 4; ++c) qs[c] = qlat.data() + (c < count ? pr + c : pairs) * (L + R);
            mla_scores4(qs, row, L + R, p.scale, sc);
            for (int c = 0; c < count; ++c) scores[static_cast<size_t>((pr + c) * n_max + j)] = sc[c];
          }
        }
      }
      for (int64_t pr = first * hn; pr < pairs; ++pr)
        softmax_row(scores.data() + pr * n_max, tile.pos0 + pr / hn + 1);
      // The latent sums, key by key in position order for every pair.
      for (int64_t jb = 0; jb < n_max; jb += key_block) {
        const int64_t je = std::min(n_max, jb + key_block);
        convert_keys(jb, je);
        for (int64_t pr = first_seeing(jb) * hn; pr < pairs; ++pr) {
          const int64_t keys = std::min(je, tile.pos0 + pr / hn + 1) - jb;
          accumulate_rows(scores.data() + pr * n_max + jb, kbuf.data(), keys, L + R, olat.data() + pr * L, L);
        }
      }
      for (int64_t pr = first * hn; pr < pairs; ++pr) {
        const int64_t i = pr / hn, h = h0 + pr % hn;
        float* o = out.data<float>() + ((tile.row0 + i) * heads + h) * Dv;
        for (int64_t d = 0; d < Dv; ++d)
          o[d] = cpu::weight_row_dot(kv_b, h * (Dn + Dv) + Dn + d, olat.data() + pr * L);
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
