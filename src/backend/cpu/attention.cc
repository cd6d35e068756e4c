#include "backend/cpu/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"

namespace basalt::cpu {
namespace {

// Keys per block: the block's keys and values, 64 × head_dim floats each,
// stay in L1/L2 while every query of the item visits them.
constexpr int64_t kKeyBlock = 64;
static_assert(kKeyBlock % 4 == 0 && kKeyBlock % kLanes == 0, "block_scores works in fours");
constexpr int kKeyChunks = static_cast<int>(kKeyBlock / kLanes);
// Query rows per item: enough to amortise converting the keys, few enough
// that a long prompt still yields many items to balance across threads.
constexpr int64_t kQueryBlock = 16;
// How many keys ahead gather prefetches.
constexpr int64_t kPrefetchKeys = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int64_t seq;
  int64_t kv_head;
  int64_t row_begin;  // query rows within the sequence
  int64_t row_end;
  int64_t cost;
};

class ItemRunner {
 public:
  explicit ItemRunner(const AttentionArgs& args) : a_(args), p_(args.params) {
    group_ = p_.num_heads / p_.num_kv_heads;
  }

  void run(const Item& item) const {
    const int64_t d = p_.head_dim, dv = p_.v_head_dim;
    const int64_t q_begin = a_.q_start[item.seq];
    const int64_t q_len = a_.q_start[item.seq + 1] - q_begin;
    const int64_t kv_begin = a_.kv_start[item.seq];
    const int64_t kv_len = a_.kv_start[item.seq + 1] - kv_begin;
    const int64_t rows = item.row_end - item.row_begin;
    const int64_t queries = rows * group_;

    // Per query vector r (row item.row_begin + r / group_, head
    // kv_head * group_ + r % group_): its scaled query, running max, running
    // sum and unnormalised output.
    float* state = scratch_floats(ScratchSlot::kAttentionScores,
                                  static_cast<size_t>(queries * (d + dv + 2) + kKeyBlock));
    float* scaled_q = state;
    float* acc = scaled_q + queries * d;
    float* running_max = acc + queries * dv;
    float* running_sum = running_max + queries;
    float* scores = running_sum + queries;
    float* keys = scratch_floats(ScratchSlot::kAttentionKeys, static_cast<size_t>(d * kKeyBlock));
    float* values = scratch_floats(ScratchSlot::kAttentionValues, static_cast<size_t>(dv * kKeyBlock));

    for (int64_t r = 0; r < queries; ++r) {
      const float* qv = query(q_begin, item, r);
      for (int64_t i = 0; i < d; ++i) scaled_q[r * d + i] = qv[i] * p_.scale;
      std::fill(acc + r * dv, acc + (r + 1) * dv, 0.0f);
      running_max[r] = kNegInf;
      running_sum[r] = 0.0f;
    }

    // Key blocks start at multiples of kKeyBlock in the sequence, whatever
    // rows this item holds: a query's softmax then visits the same blocks in
    // the same order however its prompt was split into calls and items.
    const int64_t first_key =
        first_visible(kv_len - q_len + item.row_begin) / kKeyBlock * kKeyBlock;
    const int64_t last_key = kv_len - q_len + item.row_end - 1;
    for (int64_t j0 = first_key; j0 <= last_key; j0 += kKeyBlock) {
      const int64_t count = std::min(kKeyBlock, last_key + 1 - j0);
      gather(kv_begin + j0, count, item.kv_head, keys, values);
      for (int64_t r = 0; r < queries; ++r) {
        const int64_t position = kv_len - q_len + item.row_begin + r / group_;
        const int64_t lo = std::max(j0, first_visible(position)) - j0;
        const int64_t hi = std::min(j0 + count - 1, position) - j0;
        if (lo > hi) continue;
        block_scores(scaled_q + r * d, keys, count, scores);
        for (int64_t j = 0; j < kKeyBlock; ++j) {
          if (j < lo || j > hi) scores[j] = kNegInf;
        }
        float block_max = kNegInf;
        for (int64_t j = lo; j <= hi; ++j) block_max = std::max(block_max, scores[j]);
        const float new_max = std::max(running_max[r], block_max);
        const float correction = std::exp(running_max[r] - new_max);
        const Vec shift = vset(new_max);
        Vec sum = vzero();
        for (int c = 0; c < kKeyChunks; ++c) {
          const Vec e = vexp(vsub(vload(scores + c * kLanes), shift));
          vstore(scores + c * kLanes, e);
          sum = vadd(sum, e);
        }
        running_sum[r] = running_sum[r] * correction + vsum(sum);
        running_max[r] = new_max;
        accumulate_values(scores, lo, hi, values, correction, acc + r * dv);
      }
    }

    for (int64_t r = 0; r < queries; ++r) {
      float* o = a_.out + (q_begin + item.row_begin + r / group_) * p_.num_heads * dv +
                 (item.kv_head * group_ + r % group_) * dv;
      // A query before the sequence's first key (position < 0: a padding
      // sequence with more queries than keys) saw no key: zeros, not 0 / 0.
      const float inv = running_sum[r] > 0.0f ? 1.0f / running_sum[r] : 0.0f;
      for (int64_t i = 0; i < dv; ++i) o[i] = acc[r * dv + i] * inv;
    }
  }

 private:
  const float* query(int64_t q_begin, const Item& item, int64_t r) const {
    const int64_t row = q_begin + item.row_begin + r / group_;
    const int64_t head = item.kv_head * group_ + r % group_;
    return a_.q + row * p_.num_heads * p_.head_dim + head * p_.head_dim;
  }

  int64_t first_visible(int64_t position) const {
    return p_.sliding_window > 0 ? std::max<int64_t>(0, position - p_.sliding_window + 1) : 0;
  }

  // Converts `count` keys and values of one kv head to f32 rows
  // (keys[j * head_dim + dim], values[j * v_head_dim + dim]), and zero-fills
  // the keys up to the next multiple of 4 for block_scores.
  void gather(int64_t slot_index, int64_t count, int64_t kv_head, float* keys,
              float* values) const {
    const int64_t d = p_.head_dim, dv = p_.v_head_dim, kv_heads = p_.num_kv_heads;
    const size_t k_bytes = dtype_size(a_.k_dtype), v_bytes = dtype_size(a_.v_dtype);
    for (int64_t j = 0; j < count; ++j) {
      // Slots may be scattered over the cache (paged KV), which defeats the
      // hardware prefetcher: fetch a few keys ahead by hand.
      if (j + kPrefetchKeys < count) {
        const int64_t ahead = a_.kv_slots[slot_index + j + kPrefetchKeys] * kv_heads + kv_head;
        prefetch_row(static_cast<const char*>(a_.k_cache) + ahead * d * k_bytes, d * k_bytes);
        prefetch_row(static_cast<const char*>(a_.v_cache) + ahead * dv * v_bytes, dv * v_bytes);
      }
      const int64_t slot = a_.kv_slots[slot_index + j];
      convert_row(a_.k_cache, a_.k_dtype, (slot * kv_heads + kv_head) * d, d, keys + j * d);
      convert_row(a_.v_cache, a_.v_dtype, (slot * kv_heads + kv_head) * dv, dv, values + j * dv);
    }
    std::fill(keys + count * d, keys + (count + 3) / 4 * 4 * d, 0.0f);
  }

  static void prefetch_row(const char* p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
  }

  static void convert_row(const void* cache, DType dtype, int64_t offset, int64_t n, float* dst) {
    if (dtype == DType::kF32) {
      std::copy_n(static_cast<const float*>(cache) + offset, n, dst);
      return;
    }
    const uint16_t* src = static_cast<const uint16_t*>(cache) + offset;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  }

  // scores[j] = q · key j for the block's keys, four keys at a time so that
  // one set of shuffles finishes four dot products.
  void block_scores(const float* q, const float* keys, int64_t count, float* scores) const {
    const int64_t d = p_.head_dim;
    for (int64_t j = 0; j < count; j += 4) {
      const float* k = keys + j * d;
      Vec s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
      int64_t i = 0;
      for (; i + kLanes <= d; i += kLanes) {
        const Vec qv = vload(q + i);
        s0 = vfma(qv, vload(k + i), s0);
        s1 = vfma(qv, vload(k + d + i), s1);
        s2 = vfma(qv, vload(k + 2 * d + i), s2);
        s3 = vfma(qv, vload(k + 3 * d + i), s3);
      }
      if (i < d) {
        // Partial loads: the lanes past d would read the next key's row.
        const int rest = static_cast<int>(d - i);
        const Vec qv = vload_partial(q + i, rest);
        s0 = vfma(qv, vload_partial(k + i, rest), s0);
        s1 = vfma(qv, vload_partial(k + d + i, rest), s1);
        s2 = vfma(qv, vload_partial(k + 2 * d + i, rest), s2);
        s3 = vfma(qv, vload_partial(k + 3 * d + i, rest), s3);
      }
      vsum4(s0, s1, s2, s3, scores + j);
    }
  }

  // acc = acc * correction + sum_{j in [lo, hi]} weights[j] * values[j].
  void accumulate_values(const float* weights, int64_t lo, int64_t hi, const float* values,
                         float correction, float* acc) const {
    const int64_t dv = p_.v_head_dim;
    const Vec scale = vset(correction);
    constexpr int kUnroll = 4;
    int64_t i = 0;
    for (; i + kUnroll * kLanes <= dv; i += kUnroll * kLanes) {
      Vec a[kUnroll];
      for (int u = 0; u < kUnroll; ++u) a[u] = vmul(vload(acc + i + u * kLanes), scale);
      for (int64_t j = lo; j <= hi; ++j) {
        const Vec w = vset(weights[j]);
        const float* v = values + j * dv + i;
        for (int u = 0; u < kUnroll; ++u) a[u] = vfma(w, vload(v + u * kLanes), a[u]);
      }
      for (int u = 0; u < kUnroll; ++u) vstore(acc + i + u * kLanes, a[u]);
    }
    for (; i < dv; i += kLanes) {
      const int width = static_cast<int>(std::min<int64_t>(kLanes, dv - i));
      Vec a = vmul(vload_partial(acc + i, width), scale);
      for (int64_t j = lo; j <= hi; ++j) {
        a = vfma(vset(weights[j]), vload_partial(values + j * dv + i, width), a);
      }
      vstore_partial(acc + i, a, width);
    }
  }

  const AttentionArgs& a_;
  const AttentionParams& p_;
  int64_t group_ = 1;
};

}  // namespace

void attention_f32(ThreadPool& pool, const AttentionArgs& args) {
  const AttentionParams& p = args.params;
  const int64_t group = p.num_heads / p.num_kv_heads;
  std::vector<Item> items;
  for (int64_t s = 0; s < args.num_seqs; ++s) {
    const int64_t q_len = args.q_start[s + 1] - args.q_start[s];
    const int64_t kv_len = args.kv_start[s + 1] - args.kv_start[s];
    for (int64_t r0 = 0; r0 < q_len; r0 += kQueryBlock) {
      const int64_t r1 = std::min(q_len, r0 + kQueryBlock);
      const int64_t last = kv_len - q_len + r1 - 1;
      const int64_t first =
          p.sliding_window > 0 ? std::max<int64_t>(0, kv_len - q_len + r0 - p.sliding_window + 1) : 0;
      const int64_t cost = (r1 - r0) * group * (std::max<int64_t>(0, last - first + 1) + kKeyBlock);
      for (int64_t h = 0; h < p.num_kv_heads; ++h) items.push_back({s, h, r0, r1, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  int64_t total_cost = 0;
  for (const Item& item : items) total_cost += item.cost;

  const ItemRunner runner(args);
  // Items are claimed one at a time, largest first. Small calls (a few
  // thousand multiply-adds) stay on the calling thread.
  dynamic_for(
      pool, static_cast<int64_t>(items.size()), 1,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) runner.run(items[i]);
      },
      total_cost * p.head_dim >= (1 << 16));
}

}  // namespace basalt::cpu
