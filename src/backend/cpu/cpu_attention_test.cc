// CpuBackend::attention against the reference: batches of sequences with
// different query and key counts in one call (decode and prefill mixed),
// GQA ratios 1, 2 and 4, keys scattered over shuffled cache slots, sliding
// windows, f32 and bf16 caches, and the layout checks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::count_nan;
using testing::i32_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::relative_error;
using testing::TestRng;

struct Seq {
  int q_len;
  int kv_len;
};

struct Batch {
  Tensor q, k_cache, v_cache;
  AttentionLayout layout;
  int64_t tokens = 0;
};

// Builds a batch whose sequences' keys sit in a random permutation of the
// cache's slots (more slots than keys, so some are never read).
Batch make_batch(TestRng& rng, const std::vector<Seq>& seqs, const AttentionParams& p,
                 DType cache_dtype) {
  std::vector<int32_t> q_start = {0}, kv_start = {0};
  for (const Seq& s : seqs) {
    q_start.push_back(q_start.back() + s.q_len);
    kv_start.push_back(kv_start.back() + s.kv_len);
  }
  const int64_t total_keys = kv_start.back();
  const int64_t slots = total_keys + 7;
  std::vector<int32_t> permutation(static_cast<size_t>(slots));
  std::iota(permutation.begin(), permutation.end(), 0);
  std::shuffle(permutation.begin(), permutation.end(), rng.engine());
  permutation.resize(static_cast<size_t>(total_keys));
  Batch b;
  b.tokens = q_start.back();
  b.q = random_tensor(rng, {b.tokens, int64_t{p.num_heads} * p.head_dim}, DType::kF32);
  // A spread of 2 makes softmaxes neither flat nor one-hot.
  b.k_cache = random_tensor(rng, {slots, p.num_kv_heads, p.head_dim}, cache_dtype, 2.0f);
  b.v_cache = random_tensor(rng, {slots, int64_t{p.num_kv_heads} * p.v_head_dim}, cache_dtype);
  b.layout = {i32_tensor(q_start), i32_tensor(kv_start), i32_tensor(permutation)};
  return b;
}

void expect_attention_matches(TestRng& rng, const std::vector<Seq>& seqs, const AttentionParams& p,
                              DType cache_dtype) {
  CpuBackend backend;
  const Batch b = make_batch(rng, seqs, p, cache_dtype);
  const Shape out_shape = {b.tokens, int64_t{p.num_heads} * p.v_head_dim};
  Tensor out = poisoned(out_shape), ref = poisoned(out_shape);
  backend.attention(b.q, b.k_cache, b.v_cache, b.layout, p, out);
  reference::attention(b.q, b.k_cache, b.v_cache, b.layout, p, ref);
  std::string desc = fmt::format("heads {}/{} dims {}/{} window {} {} seqs", p.num_heads,
                                 p.num_kv_heads, p.head_dim, p.v_head_dim, p.sliding_window,
                                 dtype_name(cache_dtype));
  for (const Seq& s : seqs) desc += fmt::format(" {}:{}", s.q_len, s.kv_len);
  EXPECT_EQ(count_nan(out), 0) << desc;
  EXPECT_LT(relative_error(out, ref), 1e-5) << desc;
}

AttentionParams params(int heads, int kv_heads, int head_dim, int v_head_dim, int window = 0) {
  return {heads, kv_heads, head_dim, v_head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim)),
          window};
}

TEST(CpuAttention, MixedBatchesAcrossGqaRatios) {
  TestRng rng;
  // Decode rows (q_len 1), chunked prefill (q_len < kv_len), full prefill,
  // lengths around the 64-key and 16-query blocks, and an empty sequence.
  const std::vector<Seq> seqs = {{1, 1}, {1, 70}, {17, 17}, {5, 130}, {0, 3}, {33, 64}, {1, 129}};
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int, int>>{{4, 4}, {4, 2}, {8, 2}}) {
    for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
      expect_attention_matches(rng, seqs, params(heads, kv_heads, 64, 64), cache_dtype);
    }
  }
}

TEST(CpuAttention, OddHeadDimsAndValueDims) {
  TestRng rng;
  const std::vector<Seq> seqs = {{3, 3}, {1, 40}, {20, 25}};
  for (const auto& [head_dim, v_head_dim] :
       std::vector<std::pair<int, int>>{{1, 1}, {17, 17}, {128, 128}, {48, 80}, {192, 128}}) {
    expect_attention_matches(rng, seqs, params(4, 2, head_dim, v_head_dim), DType::kBF16);
  }
}

TEST(CpuAttention, SlidingWindows) {
  TestRng rng;
  const std::vector<Seq> seqs = {{1, 200}, {70, 70}, {9, 150}, {2, 3}};
  for (int window : {1, 2, 16, 63, 64, 65, 500}) {
    expect_attention_matches(rng, seqs, params(4, 1, 32, 32, window), DType::kF32);
  }
}

TEST(CpuAttention, LongPromptSpreadsOverThreads) {
  TestRng rng;
  expect_attention_matches(rng, {{300, 300}}, params(2, 1, 64, 64), DType::kBF16);
}

TEST(CpuAttention, SameResultOnEveryPoolSize) {
  TestRng rng;
  const AttentionParams p = params(4, 2, 32, 32);
  const Batch b = make_batch(rng, {{20, 40}, {1, 90}, {64, 64}}, p, DType::kBF16);
  Tensor first;
  for (int threads : {1, 2, 7}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool);
    Tensor out = poisoned({b.tokens, 4 * 32});
    backend.attention(b.q, b.k_cache, b.v_cache, b.layout, p, out);
    EXPECT_EQ(count_nan(out), 0);
    // Each query's arithmetic does not depend on the split: results are identical.
    if (first.defined() && first.numel() > 0) {
      EXPECT_TRUE(testing::bytes_equal(out, first)) << threads << " threads";
    }
    first = out;
  }
}

// The graph-padding cases of backend.h: a sequence with more query rows
// than keys (q_len 1 over kv_len 0, or 3 over 1) gets zero rows for the
// queries at negative positions and normal rows for the others; kv_slots may
// run past kv_start[num_seqs] (its tail, even out of range, is ignored).
TEST(CpuAttention, PaddedSequencesGiveZeroRowsAndExtraSlotsAreIgnored) {
  TestRng rng;
  for (DType cache : {DType::kF32, DType::kBF16}) {
    const AttentionParams p = params(8, 2, 16, 16);
    Batch b = make_batch(rng, {{1, 5}, {1, 0}, {3, 1}, {2, 9}, {1, 0}}, p, cache);
    std::vector<int32_t> slots(b.layout.kv_slots.data<const int32_t>(),
                               b.layout.kv_slots.data<const int32_t>() + b.layout.kv_slots.numel());
    for (int32_t extra : {0, -1, 1 << 30}) slots.push_back(extra);
    b.layout.kv_slots = i32_tensor(slots);
    CpuBackend backend;
    const Shape out_shape = {b.tokens, int64_t{p.num_heads} * p.v_head_dim};
    Tensor out = poisoned(out_shape), ref = poisoned(out_shape);
    backend.attention(b.q, b.k_cache, b.v_cache, b.layout, p, out);
    reference::attention(b.q, b.k_cache, b.v_cache, b.layout, p, ref);
    EXPECT_EQ(count_nan(out), 0);
    EXPECT_EQ(count_nan(ref), 0);
    EXPECT_LT(relative_error(out, ref), 1e-5);
    // Rows 1 (q 1 / kv 0), 2 and 3 (positions -2, -1 of q 3 / kv 1) and 7 are zero.
    const int64_t width = out_shape[1];
    for (int64_t row : {1, 2, 3, 7})
      for (int64_t i = 0; i < width; ++i) {
        EXPECT_EQ(out.data<float>()[row * width + i], 0.0f) << row;
        EXPECT_EQ(ref.data<float>()[row * width + i], 0.0f) << row;
      }
    // Row 4 (position 0 of q 3 / kv 1) attends to its one key: the value row.
    EXPECT_NE(out.data<float>()[4 * width], 0.0f);
  }
}

TEST(CpuAttentionChecks, RejectsBadLayoutsAndShapes) {
  TestRng rng;
  CpuBackend backend;
  const AttentionParams p = params(4, 2, 8, 8);
  Batch b = make_batch(rng, {{2, 3}, {1, 4}}, p, DType::kF32);
  Tensor out = poisoned({3, 32});
  backend.attention(b.q, b.k_cache, b.v_cache, b.layout, p, out);  // valid baseline

  const auto expect_rejected = [&](AttentionLayout layout, const AttentionParams& params,
                                   const char* why) {
    EXPECT_THROW(backend.attention(b.q, b.k_cache, b.v_cache, layout, params, out), Error) << why;
  };
  AttentionLayout bad = b.layout;
  bad.kv_slots = i32_tensor({0, 1, 2, 3, 4, 5, 999});
  expect_rejected(bad, p, "slot out of range");
  bad = b.layout;
  bad.kv_slots = i32_tensor({0, 1, 2, 3, 4, 5, -1});
  expect_rejected(bad, p, "negative slot");
  bad = b.layout;
  bad.q_start = i32_tensor({0, 4, 3});
  expect_rejected(bad, p, "negative q_len");
  bad = b.layout;
  bad.q_start = i32_tensor({0, 2, 2});
  expect_rejected(bad, p, "q_start does not cover q");
  bad = b.layout;
  bad.kv_start = i32_tensor({0, 3, 8});
  expect_rejected(bad, p, "kv_start past the end of kv_slots");
  bad = b.layout;
  bad.kv_start = i32_tensor({1, 3, 7});
  expect_rejected(bad, p, "kv_start not from 0");
  bad = b.layout;
  bad.kv_start = i32_tensor({0, 7});
  expect_rejected(bad, p, "kv_start of the wrong length");
  bad = b.layout;
  bad.kv_slots = Tensor::zeros({7}, DType::kI64);
  expect_rejected(bad, p, "i64 slots");

  AttentionParams bad_params = p;
  bad_params.num_kv_heads = 3;
  expect_rejected(b.layout, bad_params, "heads not a multiple of kv heads");
  bad_params = p;
  bad_params.head_dim = 16;
  expect_rejected(b.layout, bad_params, "q width");
  bad_params = p;
  bad_params.sliding_window = -1;
  expect_rejected(b.layout, bad_params, "negative window");

  Tensor f16_cache = Tensor::zeros(b.k_cache.shape(), DType::kF16);
  EXPECT_THROW(backend.attention(b.q, f16_cache, b.v_cache, b.layout, p, out), Error);
  Tensor short_cache = Tensor::zeros({b.k_cache.dim(0) - 1, 16}, DType::kF32);
  EXPECT_THROW(backend.attention(b.q, b.k_cache, short_cache, b.layout, p, out), Error);
  Tensor out_wrong = poisoned({3, 31});
  EXPECT_THROW(backend.attention(b.q, b.k_cache, b.v_cache, b.layout, p, out_wrong), Error);
}

}  // namespace
}  // namespace basalt
