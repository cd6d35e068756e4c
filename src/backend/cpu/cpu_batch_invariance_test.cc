// CpuBackend's batch invariance: a token's output row has the same bits
// (memcmp, not a tolerance) whether it is computed alone or inside a batch of
// 2, 3, 15, 16, 17, 64, 100 or 129 tokens of random other rows, on pools of 1, 2
// and 3 threads. Linear for every weight dtype (f32, bf16, f16, raw e4m3,
// block-scaled e4m3) with K below, at and above one K-block; MoE experts with
// the other tokens routed to the same or different experts; attention and
// both MLA forms alone vs with other sequences and for a prompt prefilled in
// one call vs in chunks that write the cache between calls (with and without
// a sliding window, f32 and bf16 caches); and the row-wise ops.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace basalt {
namespace {

using testing::i32_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::TestRng;

// 129 spans two of the panel kernel's 128-token blocks.
constexpr int64_t kBatchSizes[] = {2, 3, 15, 16, 17, 64, 100, 129};

std::vector<std::unique_ptr<ThreadPool>> make_pools() {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int threads : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(threads));
  return pools;
}

// Row ra of a has the bytes of row rb of b (rows are dim 0, the rest flattened).
::testing::AssertionResult same_row(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb) {
  const int64_t width = a.numel() / a.dim(0);
  if (a.dtype() != b.dtype() || b.numel() / b.dim(0) != width)
    return ::testing::AssertionFailure() << a.describe() << " vs " << b.describe();
  const size_t bytes = static_cast<size_t>(width) * dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw()) + static_cast<size_t>(ra) * bytes;
  const char* pb = static_cast<const char*>(b.raw()) + static_cast<size_t>(rb) * bytes;
  if (std::memcmp(pa, pb, bytes) == 0) return ::testing::AssertionSuccess();
  const size_t elem = dtype_size(a.dtype());
  for (int64_t i = 0; i < width; ++i) {
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) != 0) {
      const Tensor fa = a.rows(ra, 1).to_f32(), fb = b.rows(rb, 1).to_f32();
      return ::testing::AssertionFailure()
             << "row " << ra << " vs row " << rb << " first differ at column " << i << ": "
             << fmt::format("{:.9g} vs {:.9g}", fa.data<float>()[i], fb.data<float>()[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

void copy_row(const Tensor& src, int64_t rs, Tensor& dst, int64_t rd) {
  const size_t bytes = static_cast<size_t>(src.numel() / src.dim(0)) * dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.raw()) + static_cast<size_t>(rd) * bytes,
              static_cast<const char*>(src.raw()) + static_cast<size_t>(rs) * bytes, bytes);
}

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

LinearWeight make_weight(TestRng& rng, int64_t n, int64_t k, DType dtype, bool block_scaled) {
  LinearWeight w;
  if (block_scaled) {
    w.weight = random_tensor(rng, {n, k}, DType::kF8E4M3, 2.0f);
    w.scale_inv = Tensor::empty({blocks(n), blocks(k)}, DType::kF32);
    for (int64_t i = 0; i < w.scale_inv.numel(); ++i)
      w.scale_inv.data<float>()[i] = rng.uniform(0.002f, 0.05f);
  } else {
    const float spread = dtype == DType::kF8E4M3 ? 1.0f : 1.0f / std::sqrt(static_cast<float>(k));
    w.weight = random_tensor(rng, {n, k}, dtype, spread);
  }
  return w;
}

struct WeightKind {
  const char* name;
  DType dtype;
  bool block_scaled;
};
constexpr WeightKind kWeightKinds[] = {{"f32", DType::kF32, false},
                                       {"bf16", DType::kBF16, false},
                                       {"f16", DType::kF16, false},
                                       {"fp8", DType::kF8E4M3, false},
                                       {"fp8 block", DType::kF8E4M3, true}};

// --- Linear ---------------------------------------------------------------------

TEST(CpuBatchInvariance, LinearRowAloneEqualsRowInAnyBatch) {
  TestRng rng;
  auto pools = make_pools();
  for (const WeightKind& kind : kWeightKinds) {
    // K below one K-block, exactly one, and three uneven ones with a tail.
    for (int64_t in : {37, 1024, 2100}) {
      for (int64_t outs : {13, 130}) {
        SCOPED_TRACE(fmt::format("{} weights, {} -> {}", kind.name, in, outs));
        const LinearWeight w = make_weight(rng, outs, in, kind.dtype, kind.block_scaled);
        const Tensor bias = random_tensor(rng, {outs}, DType::kBF16);
        auto run = [&](ThreadPool& pool, const Tensor& x) {
          CpuBackend backend(&pool);
          Tensor out = poisoned({x.dim(0), outs});
          if (kind.block_scaled) {
            backend.linear_fp8_block(x, w.weight, w.scale_inv, out);
          } else {
            backend.linear(x, w.weight, kind.dtype == DType::kBF16 ? &bias : nullptr, out);
          }
          return out;
        };
        const Tensor x_row = random_tensor(rng, {1, in}, DType::kF32);
        const Tensor alone = run(*pools[0], x_row);
        for (auto& pool : pools) {
          SCOPED_TRACE(fmt::format("{} threads", pool->size()));
          EXPECT_TRUE(same_row(run(*pool, x_row), 0, alone, 0));
          for (int64_t tokens : kBatchSizes) {
            Tensor x = random_tensor(rng, {tokens, in}, DType::kF32);
            const int64_t at = rng.integer(0, tokens - 1);
            copy_row(x_row, 0, x, at);
            const Tensor out = run(*pool, x);
            EXPECT_TRUE(same_row(out, at, alone, 0)) << tokens << " tokens, row " << at;
            // Every other row against itself alone, for the smaller batches.
            if (tokens <= 17) {
              const int64_t other = (at + 1) % tokens;
              EXPECT_TRUE(same_row(out, other, run(*pools[0], x.rows(other, 1)), 0))
                  << tokens << " tokens, row " << other;
            }
          }
        }
      }
    }
  }
}

// --- MoE -------------------------------------------------------------------------

TEST(CpuBatchInvariance, MoeTokenAloneEqualsTokenInAnyBatch) {
  TestRng rng;
  auto pools = make_pools();
  // Hidden size above one K-block, so the gate and up projections sum two.
  const int64_t H = 1100, I = 40, E = 5, top_k = 2;
  std::vector<MoeExpert> experts;
  for (int64_t e = 0; e < E; ++e) {
    const WeightKind& kind = kWeightKinds[e % std::size(kWeightKinds)];
    experts.push_back({make_weight(rng, I, H, kind.dtype, kind.block_scaled),
                       make_weight(rng, I, H, kind.dtype, kind.block_scaled),
                       make_weight(rng, H, I, kind.dtype, kind.block_scaled)});
  }
  const Tensor x_row = random_tensor(rng, {1, H}, DType::kF32);
  const std::vector<int32_t> chosen = {4, 1};
  const std::vector<float> chosen_weights = {0.7f, 0.3f};
  auto run = [&](ThreadPool& pool, const Tensor& x, const std::vector<int32_t>& ids,
                 const std::vector<float>& weights) {
    CpuBackend backend(&pool);
    const int64_t tokens = x.dim(0);
    const Tensor id = Tensor::from_i32({tokens, top_k}, ids);
    const Tensor wt = Tensor::from_f32({tokens, top_k}, weights);
    Tensor out = poisoned({tokens, H});
    backend.moe_experts(x, id, wt, experts, out);
    return out;
  };
  const Tensor alone = run(*pools[0], x_row, chosen, chosen_weights);
  enum Others { kSame, kSwapped, kDisjoint, kRandom };
  for (auto& pool : pools) {
    SCOPED_TRACE(fmt::format("{} threads", pool->size()));
    EXPECT_TRUE(same_row(run(*pool, x_row, chosen, chosen_weights), 0, alone, 0));
    for (int64_t tokens : kBatchSizes) {
      for (Others others : {kSame, kSwapped, kDisjoint, kRandom}) {
        Tensor x = random_tensor(rng, {tokens, H}, DType::kF32);
        const int64_t at = rng.integer(0, tokens - 1);
        copy_row(x_row, 0, x, at);
        std::vector<int32_t> ids;
        std::vector<float> weights;
        for (int64_t t = 0; t < tokens; ++t) {
          int32_t a = chosen[0], b = chosen[1];
          if (t != at) {
            if (others == kSwapped) std::swap(a, b);
            if (others == kDisjoint) {
              a = 0;
              b = 2;
            }
            if (others == kRandom) {
              a = static_cast<int32_t>(rng.integer(0, E - 1));
              b = static_cast<int32_t>((a + rng.integer(1, E - 1)) % E);
            }
          }
          ids.insert(ids.end(), {a, b});
          if (t == at) {
            weights.insert(weights.end(), chosen_weights.begin(), chosen_weights.end());
          } else {
            const float u = rng.uniform(0.1f, 0.9f);
            weights.insert(weights.end(), {u, 1.0f - u});
          }
        }
        EXPECT_TRUE(same_row(run(*pool, x, ids, weights), at, alone, 0))
            << tokens << " tokens, others routed " << static_cast<int>(others);
      }
    }
  }
}

TEST(CpuBatchInvariance, DenseMlpThroughMoeIsInvariant) {
  // One expert and top_k 1: every token uses the expert in place.
  TestRng rng;
  auto pools = make_pools();
  const int64_t H = 1030, I = 24;
  const std::vector<MoeExpert> experts = {{make_weight(rng, I, H, DType::kBF16, false),
                                           make_weight(rng, I, H, DType::kBF16, false),
                                           make_weight(rng, H, I, DType::kBF16, false)}};
  auto run = [&](ThreadPool& pool, const Tensor& x) {
    CpuBackend backend(&pool);
    const int64_t tokens = x.dim(0);
    const Tensor id = Tensor::zeros({tokens, 1}, DType::kI32);
    const Tensor wt = Tensor::from_f32({tokens, 1}, std::vector<float>(tokens, 1.0f));
    Tensor out = poisoned({tokens, H});
    backend.moe_experts(x, id, wt, experts, out);
    return out;
  };
  const Tensor x_row = random_tensor(rng, {1, H}, DType::kF32);
  const Tensor alone = run(*pools[0], x_row);
  for (auto& pool : pools) {
    for (int64_t tokens : kBatchSizes) {
      Tensor x = random_tensor(rng, {tokens, H}, DType::kF32);
      const int64_t at = rng.integer(0, tokens - 1);
      copy_row(x_row, 0, x, at);
      EXPECT_TRUE(same_row(run(*pool, x), at, alone, 0))
          << tokens << " tokens, " << pool->size() << " threads";
    }
  }
}

// --- Attention -------------------------------------------------------------------

AttentionLayout layout_of(const std::vector<int32_t>& q_start, const std::vector<int32_t>& kv_start,
                          const std::vector<int32_t>& slots) {
  return {i32_tensor(q_start), i32_tensor(kv_start), i32_tensor(slots)};
}

// Query rows [begin, begin + count) of a prompt whose first begin + count
// keys sit in slots[0 ..).
AttentionLayout prompt_layout(const std::vector<int32_t>& slots, int64_t begin, int64_t count) {
  return layout_of({0, static_cast<int32_t>(count)}, {0, static_cast<int32_t>(begin + count)},
                   std::vector<int32_t>(slots.begin(), slots.begin() + begin + count));
}

std::vector<int32_t> shuffled_slots(TestRng& rng, int64_t slots, int64_t keep) {
  std::vector<int32_t> s(static_cast<size_t>(slots));
  std::iota(s.begin(), s.end(), 0);
  std::shuffle(s.begin(), s.end(), rng.engine());
  s.resize(static_cast<size_t>(keep));
  return s;
}

const std::vector<std::vector<int64_t>> kChunkings = {
    {150}, {7, 1, 12, 130}, {64, 64, 22}, {1, 1, 1, 63, 65, 19}, {100, 50}};

TEST(CpuBatchInvariance, AttentionChunkedPrefillEqualsOneCall) {
  TestRng rng;
  auto pools = make_pools();
  const int64_t P = 150;
  for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (int window : {0, 5, 70}) {
      AttentionParams p{4, 2, 40, 24, 1.0f / std::sqrt(40.0f), window};
      SCOPED_TRACE(fmt::format("{} cache, window {}", dtype_name(cache_dtype), window));
      const int64_t slots = P + 9;
      const std::vector<int32_t> slot = shuffled_slots(rng, slots, P);
      const Tensor q = random_tensor(rng, {P, int64_t{p.num_heads} * p.head_dim}, DType::kF32);
      const Tensor k = random_tensor(rng, {P, int64_t{p.num_kv_heads} * p.head_dim}, DType::kF32, 2.0f);
      const Tensor v = random_tensor(rng, {P, int64_t{p.num_kv_heads} * p.v_head_dim}, DType::kF32);
      const Tensor slot_ids = i32_tensor(slot);
      Tensor one_call;
      bool have_one_call = false;
      for (auto& pool : pools) {
        CpuBackend backend(pool.get());
        for (const std::vector<int64_t>& chunks : kChunkings) {
          SCOPED_TRACE(fmt::format("{} threads, chunks {}", pool->size(), fmt::join(chunks, "+")));
          Tensor k_cache = Tensor::zeros({slots, p.num_kv_heads, p.head_dim}, cache_dtype);
          Tensor v_cache = Tensor::zeros({slots, int64_t{p.num_kv_heads} * p.v_head_dim}, cache_dtype);
          Tensor out = poisoned({P, int64_t{p.num_heads} * p.v_head_dim});
          int64_t begin = 0;
          for (int64_t count : chunks) {
            // Each call first writes its own keys and values, as a forward step does.
            backend.store_kv(k.rows(begin, count), v.rows(begin, count),
                             slot_ids.rows(begin, count), k_cache, v_cache);
            Tensor chunk_out = out.rows(begin, count);
            backend.attention(q.rows(begin, count), k_cache, v_cache,
                              prompt_layout(slot, begin, count), p, chunk_out);
            begin += count;
          }
          ASSERT_EQ(begin, P);
          if (!have_one_call) {
            one_call = out;
            have_one_call = true;
            continue;
          }
          for (int64_t i = 0; i < P; ++i) EXPECT_TRUE(same_row(out, i, one_call, i)) << "position " << i;
        }
      }
    }
  }
}

struct SeqSpec {
  int32_t q_len, kv_len;
};

// A batch of sequences with keys in disjoint shuffled slots of one cache;
// sequence `target` is the given one. Returns the layout and the first query
// row of the target.
AttentionLayout batch_layout(TestRng& rng, const std::vector<SeqSpec>& seqs,
                             const std::vector<int32_t>& target_slots, size_t target,
                             int64_t cache_slots, int64_t first_free, int64_t* target_row) {
  std::vector<int32_t> q_start = {0}, kv_start = {0}, slots;
  std::vector<int32_t> free_slots(static_cast<size_t>(cache_slots - first_free));
  std::iota(free_slots.begin(), free_slots.end(), static_cast<int32_t>(first_free));
  std::shuffle(free_slots.begin(), free_slots.end(), rng.engine());
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (s == target) {
      *target_row = q_start.back();
      slots.insert(slots.end(), target_slots.begin(), target_slots.end());
    } else {
      for (int32_t j = 0; j < seqs[s].kv_len; ++j) slots.push_back(free_slots[next++]);
    }
    q_start.push_back(q_start.back() + seqs[s].q_len);
    kv_start.push_back(kv_start.back() + seqs[s].kv_len);
  }
  return layout_of(q_start, kv_start, slots);
}

// Other sequences around a target sequence: decodes and prefills of random
// lengths, the target at a random place among them.
std::vector<SeqSpec> crowd(TestRng& rng, SeqSpec target, size_t* at) {
  std::vector<SeqSpec> seqs;
  const int64_t others = rng.integer(1, 5);
  for (int64_t i = 0; i < others; ++i) {
    const int32_t q_len = static_cast<int32_t>(rng.integer(0, 3) == 0 ? rng.integer(2, 40) : 1);
    seqs.push_back({q_len, static_cast<int32_t>(q_len + rng.integer(0, 90))});
  }
  *at = static_cast<size_t>(rng.integer(0, others));
  seqs.insert(seqs.begin() + static_cast<std::ptrdiff_t>(*at), target);
  return seqs;
}

TEST(CpuBatchInvariance, AttentionSequenceAloneEqualsSequenceAmongOthers) {
  TestRng rng;
  auto pools = make_pools();
  const int64_t cache_slots = 1200, kv_len = 130;
  for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (int window : {0, 30}) {
      AttentionParams p{6, 2, 32, 16, 0.17f, window};
      const Tensor k_cache = random_tensor(rng, {cache_slots, p.num_kv_heads, p.head_dim}, cache_dtype, 2.0f);
      const Tensor v_cache =
          random_tensor(rng, {cache_slots, int64_t{p.num_kv_heads} * p.v_head_dim}, cache_dtype);
      // The target's keys live in slots [0, kv_len), the others' after them.
      const std::vector<int32_t> target_slots = shuffled_slots(rng, kv_len, kv_len);
      for (int32_t q_len : {1, 5, 20}) {
        SCOPED_TRACE(fmt::format("{} cache, window {}, {} queries", dtype_name(cache_dtype), window, q_len));
        const Tensor q_target = random_tensor(rng, {q_len, int64_t{p.num_heads} * p.head_dim}, DType::kF32);
        auto run = [&](ThreadPool& pool, const Tensor& q, const AttentionLayout& layout) {
          CpuBackend backend(&pool);
          Tensor out = poisoned({q.dim(0), int64_t{p.num_heads} * p.v_head_dim});
          backend.attention(q, k_cache, v_cache, layout, p, out);
          return out;
        };
        const Tensor alone =
            run(*pools[0], q_target, layout_of({0, q_len}, {0, static_cast<int32_t>(kv_len)}, target_slots));
        for (auto& pool : pools) {
          for (int trial = 0; trial < 6; ++trial) {
            size_t at = 0;
            const std::vector<SeqSpec> seqs = crowd(rng, {q_len, static_cast<int32_t>(kv_len)}, &at);
            int64_t row = 0;
            const AttentionLayout layout =
                batch_layout(rng, seqs, target_slots, at, cache_slots, kv_len, &row);
            const int64_t tokens = layout.q_start.data<const int32_t>()[seqs.size()];
            Tensor q = random_tensor(rng, {tokens, int64_t{p.num_heads} * p.head_dim}, DType::kF32);
            for (int32_t i = 0; i < q_len; ++i) copy_row(q_target, i, q, row + i);
            const Tensor out = run(*pool, q, layout);
            for (int32_t i = 0; i < q_len; ++i)
              EXPECT_TRUE(same_row(out, row + i, alone, i))
                  << pool->size() << " threads, " << seqs.size() << " sequences, query " << i;
          }
        }
      }
    }
  }
}

// --- MLA -------------------------------------------------------------------------

struct MlaSetup {
  MlaParams p;
  LinearWeight kv_b;
  Tensor cache;
  int64_t width() const { return int64_t{p.kv_lora_rank} + p.qk_rope_head_dim; }
  int64_t q_width() const { return int64_t{p.num_heads} * (p.qk_nope_head_dim + p.qk_rope_head_dim); }
};

MlaSetup mla_setup(TestRng& rng, const WeightKind& kind, DType cache_dtype, int64_t slots) {
  MlaSetup s;
  // A latent width above one K-block, so kv_b's projections sum two.
  s.p = MlaParams{3, 1040, 16, 8, 16, 0.12f};
  s.kv_b = make_weight(rng, int64_t{s.p.num_heads} * (s.p.qk_nope_head_dim + s.p.v_head_dim),
                       s.p.kv_lora_rank, kind.dtype, kind.block_scaled);
  s.cache = random_tensor(rng, {slots, s.width()}, cache_dtype, 0.5f);
  return s;
}

// Absorbed (mla_attention) or expanded (mla_expand_kv of the call's slots,
// then attention) MLA for one call.
Tensor run_mla(ThreadPool& pool, const MlaSetup& s, bool expanded, const Tensor& q,
               const AttentionLayout& layout) {
  CpuBackend backend(&pool);
  const MlaParams& p = s.p;
  Tensor out = poisoned({q.dim(0), int64_t{p.num_heads} * p.v_head_dim});
  if (!expanded) {
    backend.mla_attention(q, s.cache, s.kv_b, layout, p, out);
    return out;
  }
  const int64_t S = layout.kv_slots.dim(0);
  Tensor k = poisoned({S, s.q_width()});
  Tensor v = poisoned({S, int64_t{p.num_heads} * p.v_head_dim});
  backend.mla_expand_kv(s.cache, layout.kv_slots, s.kv_b, p, k, v);
  std::vector<int32_t> dense(static_cast<size_t>(S));
  std::iota(dense.begin(), dense.end(), 0);
  const AttentionLayout expanded_layout{layout.q_start, layout.kv_start, i32_tensor(dense)};
  const AttentionParams ap{p.num_heads, p.num_heads, p.qk_nope_head_dim + p.qk_rope_head_dim,
                           p.v_head_dim, p.scale, 0};
  backend.attention(q, k.reshape({S, p.num_heads, ap.head_dim}), v, expanded_layout, ap, out);
  return out;
}

TEST(CpuBatchInvariance, MlaChunkedPrefillEqualsOneCall) {
  TestRng rng;
  auto pools = make_pools();
  const int64_t P = 150;
  for (const WeightKind& kind : {kWeightKinds[1], kWeightKinds[4]}) {
    for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
      const MlaSetup s = mla_setup(rng, kind, cache_dtype, P + 5);
      const std::vector<int32_t> slot = shuffled_slots(rng, P + 5, P);
      const Tensor q = random_tensor(rng, {P, s.q_width()}, DType::kF32);
      for (bool expanded : {false, true}) {
        SCOPED_TRACE(fmt::format("{} kv_b, {} cache, {}", kind.name, dtype_name(cache_dtype),
                                 expanded ? "expanded" : "absorbed"));
        Tensor one_call;
        bool have_one_call = false;
        for (auto& pool : pools) {
          for (const std::vector<int64_t>& chunks : {kChunkings[0], kChunkings[1], kChunkings[3]}) {
            SCOPED_TRACE(fmt::format("{} threads, chunks {}", pool->size(), fmt::join(chunks, "+")));
            Tensor out = poisoned({P, int64_t{s.p.num_heads} * s.p.v_head_dim});
            int64_t begin = 0;
            for (int64_t count : chunks) {
              const Tensor chunk =
                  run_mla(*pool, s, expanded, q.rows(begin, count), prompt_layout(slot, begin, count));
              for (int64_t i = 0; i < count; ++i) copy_row(chunk, i, out, begin + i);
              begin += count;
            }
            if (!have_one_call) {
              one_call = out;
              have_one_call = true;
              continue;
            }
            for (int64_t i = 0; i < P; ++i) EXPECT_TRUE(same_row(out, i, one_call, i)) << "position " << i;
          }
        }
      }
    }
  }
}

TEST(CpuBatchInvariance, MlaSequenceAloneEqualsSequenceAmongOthers) {
  TestRng rng;
  auto pools = make_pools();
  const int64_t cache_slots = 800, kv_len = 70;
  for (const WeightKind& kind : {kWeightKinds[1], kWeightKinds[4]}) {
    const MlaSetup s = mla_setup(rng, kind, DType::kBF16, cache_slots);
    const std::vector<int32_t> target_slots = shuffled_slots(rng, kv_len, kv_len);
    for (bool expanded : {false, true}) {
      for (int32_t q_len : {1, 6}) {
        SCOPED_TRACE(fmt::format("{} kv_b, {}, {} queries", kind.name,
                                 expanded ? "expanded" : "absorbed", q_len));
        const Tensor q_target = random_tensor(rng, {q_len, s.q_width()}, DType::kF32);
        const Tensor alone = run_mla(*pools[0], s, expanded, q_target,
                                     layout_of({0, q_len}, {0, static_cast<int32_t>(kv_len)}, target_slots));
        for (auto& pool : pools) {
          for (int trial = 0; trial < 3; ++trial) {
            size_t at = 0;
            const std::vector<SeqSpec> seqs = crowd(rng, {q_len, static_cast<int32_t>(kv_len)}, &at);
            int64_t row = 0;
            const AttentionLayout layout =
                batch_layout(rng, seqs, target_slots, at, cache_slots, kv_len, &row);
            const int64_t tokens = layout.q_start.data<const int32_t>()[seqs.size()];
            Tensor q = random_tensor(rng, {tokens, s.q_width()}, DType::kF32);
            for (int32_t i = 0; i < q_len; ++i) copy_row(q_target, i, q, row + i);
            const Tensor out = run_mla(*pool, s, expanded, q, layout);
            for (int32_t i = 0; i < q_len; ++i)
              EXPECT_TRUE(same_row(out, row + i, alone, i))
                  << pool->size() << " threads, " << seqs.size() << " sequences, query " << i;
          }
        }
      }
    }
  }
}

TEST(CpuBatchInvariance, MlaCacheWriteInChunksEqualsOneCall) {
  TestRng rng;
  auto pools = make_pools();
  const int64_t P = 20, L = 1040, R = 8;
  const Tensor kv_a = random_tensor(rng, {P, L + R}, DType::kF32);
  const Tensor norm = random_tensor(rng, {L}, DType::kBF16);
  std::vector<float> inv(R / 2);
  for (int64_t i = 0; i < R / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / R);
  const Tensor inv_freq = Tensor::from_f32({R / 2}, inv);
  const RopeParams rope{1, static_cast<int>(R), static_cast<int>(R), RopeStyle::kInterleaved,
                        &inv_freq, 1.0f};
  std::vector<int32_t> pos(P);
  std::iota(pos.begin(), pos.end(), 0);
  const Tensor positions = i32_tensor(pos);
  const Tensor slots = i32_tensor(shuffled_slots(rng, P + 3, P));
  for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
    Tensor reference_cache;
    bool have_reference = false;
    for (auto& pool : pools) {
      CpuBackend backend(pool.get());
      for (const std::vector<int64_t>& chunks : std::vector<std::vector<int64_t>>{{20}, {7, 1, 12}}) {
        Tensor cache = Tensor::zeros({P + 3, L + R}, cache_dtype);
        int64_t begin = 0;
        for (int64_t count : chunks) {
          backend.mla_store_kv(kv_a.rows(begin, count), norm, 1e-6f, positions.rows(begin, count),
                               rope, slots.rows(begin, count), cache);
          begin += count;
        }
        if (!have_reference) {
          reference_cache = cache;
          have_reference = true;
          continue;
        }
        EXPECT_TRUE(testing::bytes_equal(cache, reference_cache)) << pool->size() << " threads";
      }
    }
  }
}

// --- Row-wise ops ----------------------------------------------------------------

// op(backend, rows) -> output of as many rows; row r of the output depends on
// row r of the input only. Checks a random row alone against it in batches.
template <typename Op>
void expect_rowwise_invariant(TestRng& rng, int64_t width, float spread, Op op) {
  auto pools = make_pools();
  const Tensor x_row = random_tensor(rng, {1, width}, DType::kF32, spread);
  CpuBackend first(pools[0].get());
  const Tensor alone = op(first, x_row, std::vector<int64_t>{0});
  for (auto& pool : pools) {
    CpuBackend backend(pool.get());
    for (int64_t tokens : kBatchSizes) {
      Tensor x = random_tensor(rng, {tokens, width}, DType::kF32, spread);
      const int64_t at = rng.integer(0, tokens - 1);
      copy_row(x_row, 0, x, at);
      std::vector<int64_t> ids(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) ids[t] = t == at ? 0 : t + 1;
      EXPECT_TRUE(same_row(op(backend, x, ids), at, alone, 0))
          << tokens << " tokens, " << pool->size() << " threads";
    }
  }
}

TEST(CpuBatchInvariance, RowWiseOpsAreInvariant) {
  TestRng rng;
  const int64_t H = 1000, heads = 4, head_dim = 64;
  const Tensor weight = random_tensor(rng, {H}, DType::kBF16);
  {
    SCOPED_TRACE("rms_norm");
    expect_rowwise_invariant(rng, H, 1.0f, [&](CpuBackend& b, const Tensor& x, const auto&) {
      Tensor out = poisoned(x.shape());
      b.rms_norm(x, weight, 1e-5f, out);
      return out;
    });
  }
  {
    SCOPED_TRACE("add_rms_norm");
    expect_rowwise_invariant(rng, H, 1.0f, [&](CpuBackend& b, const Tensor& x, const auto&) {
      Tensor residual = testing::clone(x), out = poisoned(x.shape());
      b.add_rms_norm(residual, x, weight, 1e-5f, out);
      return out;
    });
  }
  {
    SCOPED_TRACE("silu_and_mul");
    expect_rowwise_invariant(rng, 2 * 509, 2.0f, [&](CpuBackend& b, const Tensor& x, const auto&) {
      Tensor out = poisoned({x.dim(0), 509});
      b.silu_and_mul(x, out);
      return out;
    });
  }
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    expect_rowwise_invariant(rng, 3001, 3.0f, [&](CpuBackend& b, const Tensor& x, const auto&) {
      Tensor out = poisoned(x.shape());
      if (log) {
        b.log_softmax(x, out);
      } else {
        b.softmax(x, out);
      }
      return out;
    });
  }
  std::vector<float> inv(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) inv[i] = std::pow(500000.0f, -2.0f * i / head_dim);
  const Tensor inv_freq = Tensor::from_f32({head_dim / 2}, inv);
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
    SCOPED_TRACE("rope");
    const RopeParams rp{static_cast<int>(heads), static_cast<int>(head_dim),
                        static_cast<int>(head_dim), style, &inv_freq, 1.0f};
    expect_rowwise_invariant(rng, heads * head_dim, 1.0f,
                             [&](CpuBackend& b, const Tensor& x, const std::vector<int64_t>& ids) {
                               Tensor y = testing::clone(x);
                               std::vector<int32_t> pos;
                               for (int64_t id : ids) pos.push_back(static_cast<int32_t>(700 + 13 * id));
                               b.rope(y, i32_tensor(pos), rp);
                               return y;
                             });
  }
  {
    SCOPED_TRACE("argmax and sample");
    expect_rowwise_invariant(rng, 5000, 2.0f,
                             [&](CpuBackend& b, const Tensor& x, const std::vector<int64_t>& ids) {
                               std::vector<SamplingRow> rows;
                               for (int64_t id : ids) {
                                 rows.push_back({0.8f, 50, 0.9f, 0.01f, 1234 + static_cast<uint64_t>(id),
                                                 static_cast<uint64_t>(7 * id)});
                               }
                               Tensor tokens = Tensor::empty({x.dim(0), 2}, DType::kI32);
                               Tensor greedy = Tensor::empty({x.dim(0)}, DType::kI32);
                               Tensor drawn = Tensor::empty({x.dim(0)}, DType::kI32);
                               b.argmax(x, greedy);
                               b.sample(x, rows, drawn);
                               for (int64_t t = 0; t < x.dim(0); ++t) {
                                 tokens.data<int32_t>()[2 * t] = greedy.data<int32_t>()[t];
                                 tokens.data<int32_t>()[2 * t + 1] = drawn.data<int32_t>()[t];
                               }
                               return tokens;
                             });
  }
  {
    SCOPED_TRACE("moe_route");
  }
  const Tensor bias = random_tensor(rng, {64}, DType::kF32, 0.05f);
  const MoeRouteParams route{MoeScoring::kSigmoid, 6, 8, 3, true, 2.5f};
  expect_rowwise_invariant(rng, 64, 2.0f, [&](CpuBackend& b, const Tensor& x, const auto&) {
    Tensor ids = Tensor::empty({x.dim(0), 6}, DType::kI32);
    Tensor weights = Tensor::empty({x.dim(0), 6}, DType::kF32);
    b.moe_route(x, &bias, route, ids, weights);
    Tensor both = Tensor::empty({x.dim(0), 12}, DType::kI32);
    for (int64_t t = 0; t < x.dim(0); ++t) {
      std::memcpy(both.data<int32_t>() + 12 * t, ids.data<int32_t>() + 6 * t, 24);
      std::memcpy(both.data<int32_t>() + 12 * t + 6, weights.data<float>() + 6 * t, 24);
    }
    return both;
  });
}

}  // namespace
}  // namespace basalt
