// CpuBackend's DeepSeek ops beyond the table of backend/backend_ops_test.cc:
// block-FP8 linear over many partial-block shapes, MoE routing's group
// invariants and masking by hand, the absorbed MLA attention against the
// expanded reference over uneven head groups and padding, the checks, and
// rope with a rotary offset.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/reference_ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace basalt {
namespace {

using testing::count_nan;
using testing::i32_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::relative_error;
using testing::TestRng;

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// A block-FP8 weight: e4m3 values of spread 1 and scales of different sizes.
LinearWeight fp8_weight(TestRng& rng, int64_t n, int64_t k) {
  LinearWeight w;
  w.weight = random_tensor(rng, {n, k}, DType::kF8E4M3, 2.0f);
  w.scale_inv = Tensor::empty({blocks(n), blocks(k)}, DType::kF32);
  for (int64_t i = 0; i < w.scale_inv.numel(); ++i)
    w.scale_inv.data<float>()[i] = rng.uniform(0.002f, 0.05f);
  return w;
}

LinearWeight dense_weight(TestRng& rng, int64_t n, int64_t k, DType dtype) {
  return LinearWeight{random_tensor(rng, {n, k}, dtype, 0.3f / std::sqrt(static_cast<float>(k))),
                      Tensor()};
}

TEST(CpuDeepseekOps, LinearFp8BlockWithPartialBlocks) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t tokens : {1, 3, 5, 9, 20}) {
    for (int64_t in : {1, 100, 128, 136, 300}) {
      for (int64_t outs : {5, 128, 130, 257}) {
        const Tensor x = random_tensor(rng, {tokens, in}, DType::kF32);
        const LinearWeight w = fp8_weight(rng, outs, in);
        Tensor out = poisoned({tokens, outs}), ref = poisoned({tokens, outs});
        backend.linear_fp8_block(x, w.weight, w.scale_inv, out);
        reference::linear_fp8_block(x, w.weight, w.scale_inv, ref);
        EXPECT_EQ(count_nan(out), 0);
        EXPECT_LT(relative_error(out, ref), 1e-5) << tokens << "x" << in << " -> " << outs;
      }
    }
  }
}

TEST(CpuDeepseekOps, LinearFp8BlockRejectsBadScales) {
  TestRng rng;
  CpuBackend backend;
  const Tensor x = random_tensor(rng, {2, 200}, DType::kF32);
  const LinearWeight w = fp8_weight(rng, 130, 200);
  Tensor out = poisoned({2, 130});
  const Tensor wrong = Tensor::zeros({1, 2}, DType::kF32);
  EXPECT_THROW(backend.linear_fp8_block(x, w.weight, wrong, out), Error);
  const Tensor bf16 = Tensor::zeros({2, 200}, DType::kBF16);
  EXPECT_THROW(backend.linear_fp8_block(x, bf16, w.scale_inv, out), Error);
}

void expect_route_matches(TestRng& rng, int64_t tokens, int64_t experts, const MoeRouteParams& p,
                          bool with_bias) {
  CpuBackend backend;
  const Tensor logits = random_tensor(rng, {tokens, experts}, DType::kF32, 2.0f);
  Tensor bias = random_tensor(rng, {experts}, DType::kF32, 0.05f);
  Tensor ids = Tensor::empty({tokens, p.top_k}, DType::kI32);
  Tensor ref_ids = Tensor::empty({tokens, p.top_k}, DType::kI32);
  Tensor w = poisoned({tokens, p.top_k}), ref_w = poisoned({tokens, p.top_k});
  backend.moe_route(logits, with_bias ? &bias : nullptr, p, ids, w);
  reference::moe_route(logits, with_bias ? &bias : nullptr, p, ref_ids, ref_w);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ASSERT_EQ(ids.data<int32_t>()[i], ref_ids.data<int32_t>()[i]) << "entry " << i;
  EXPECT_LT(relative_error(w, ref_w), 1e-6);
  // Every chosen expert lies in one of topk_groups groups.
  const int64_t per_group = experts / p.num_groups;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int> groups;
    for (int j = 0; j < p.top_k; ++j) {
      const int g = ids.data<int32_t>()[t * p.top_k + j] / static_cast<int>(per_group);
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
    EXPECT_LE(static_cast<int>(groups.size()), p.topk_groups);
    if (p.normalize) {
      double sum = 0;
      for (int j = 0; j < p.top_k; ++j) sum += w.data<float>()[t * p.top_k + j];
      EXPECT_NEAR(sum, p.scaling, 1e-5);
    }
  }
}

TEST(CpuDeepseekOps, MoeRouteMatchesReference) {
  TestRng rng;
  MoeRouteParams v3{MoeScoring::kSigmoid, 4, 4, 2, true, 2.5f};
  expect_route_matches(rng, 37, 16, v3, true);
  MoeRouteParams v3_big{MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f};
  expect_route_matches(rng, 5, 256, v3_big, true);
  MoeRouteParams v2_lite{MoeScoring::kSoftmax, 6, 1, 1, false, 1.0f};
  expect_route_matches(rng, 9, 64, v2_lite, false);
  MoeRouteParams v2{MoeScoring::kSoftmax, 6, 8, 3, false, 16.0f};
  expect_route_matches(rng, 9, 160, v2, false);
}

TEST(CpuDeepseekOps, MoeRouteGroupMaskingByHand) {
  // Four groups of two. Group 0 holds the single best expert, but group 1's
  // two experts sum higher; with topk_groups 1 only group 1 may be chosen.
  CpuBackend backend;
  const std::vector<float> logit = {3.0f, -6.0f, 2.0f, 2.0f, -1.0f, -1.0f, -2.0f, -2.0f};
  const Tensor logits = Tensor::from_f32({1, 8}, logit);
  const Tensor bias = Tensor::zeros({8}, DType::kF32);
  MoeRouteParams p{MoeScoring::kSigmoid, 2, 4, 1, true, 1.0f};
  Tensor ids = Tensor::empty({1, 2}, DType::kI32), w = poisoned({1, 2});
  backend.moe_route(logits, &bias, p, ids, w);
  EXPECT_EQ(ids.data<int32_t>()[0], 2);
  EXPECT_EQ(ids.data<int32_t>()[1], 3);
  EXPECT_NEAR(w.data<float>()[0], 0.5f, 1e-6);
  // The bias moves selection but not the weights.
  std::vector<float> b(8, 0.0f);
  b[0] = 0.9f;
  b[1] = 0.9f;
  const Tensor biased = Tensor::from_f32({8}, b);
  backend.moe_route(logits, &biased, p, ids, w);
  EXPECT_EQ(ids.data<int32_t>()[0], 0);
  EXPECT_EQ(ids.data<int32_t>()[1], 1);
  const double s0 = 1 / (1 + std::exp(-3.0)), s1 = 1 / (1 + std::exp(6.0));
  EXPECT_NEAR(w.data<float>()[0], s0 / (s0 + s1), 1e-6);
  MoeRouteParams bad = p;
  bad.num_groups = 3;
  EXPECT_THROW(backend.moe_route(logits, &bias, bad, ids, w), Error);
}

struct MlaCase {
  MlaParams p;
  Tensor cache;
  LinearWeight kv_b;
  Tensor q;
  AttentionLayout layout;
};

// Two sequences (3 new of 9, 1 new of 5) over permuted slots of a cache
// filled through mla_store_kv.
MlaCase make_mla_case(TestRng& rng, Backend& backend, DType cache_dtype, bool fp8, int64_t L,
                      int64_t heads = 4) {
  MlaCase c;
  c.p = MlaParams{static_cast<int>(heads), static_cast<int>(L), 16, 8, 12, 0.2f};
  const int64_t R = 8, slots = 16;
  c.cache = Tensor::zeros({slots, L + R}, cache_dtype);
  const int64_t rows = 14;
  const Tensor kv_a = random_tensor(rng, {rows, L + R}, DType::kF32);
  const Tensor norm = random_tensor(rng, {L}, DType::kBF16, 0.2f);
  std::vector<int32_t> positions, slot_ids(static_cast<size_t>(slots));
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  std::shuffle(slot_ids.begin(), slot_ids.end(), rng.engine());
  for (int i = 0; i < 9; ++i) positions.push_back(i);
  for (int i = 0; i < 5; ++i) positions.push_back(i);
  std::vector<float> inv(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / R);
  static Tensor inv_freq;
  inv_freq = Tensor::from_f32({R / 2}, inv);
  RopeParams rope{1, static_cast<int>(R), static_cast<int>(R), RopeStyle::kInterleaved, &inv_freq, 1.1f};
  const std::vector<int32_t> used(slot_ids.begin(), slot_ids.begin() + rows);
  backend.mla_store_kv(kv_a, Tensor(norm), 1e-6f, i32_tensor(positions), rope, i32_tensor(used),
                       c.cache);
  const int64_t out_rows = heads * (16 + 12);
  c.kv_b = fp8 ? fp8_weight(rng, out_rows, L) : dense_weight(rng, out_rows, L, DType::kBF16);
  c.q = random_tensor(rng, {4, heads * (16 + R)}, DType::kF32);
  c.layout = {i32_tensor({0, 3, 4}), i32_tensor({0, 9, 14}), i32_tensor(used)};
  return c;
}

TEST(CpuDeepseekOps, MlaAbsorbedAttentionMatchesExpandedReference) {
  TestRng rng;
  CpuBackend backend;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool fp8 : {false, true}) {
      for (int64_t L : {32, 160}) {
        MlaCase c = make_mla_case(rng, backend, dtype, fp8, L);
        Tensor out = poisoned({4, 4 * 12}), ref = poisoned({4, 4 * 12});
        backend.mla_attention(c.q, c.cache, c.kv_b, c.layout, c.p, out);
        reference::mla_attention(c.q, c.cache, c.kv_b, c.layout, c.p, ref);
        EXPECT_EQ(count_nan(out), 0);
        EXPECT_LT(relative_error(out, ref), 2e-5) << dtype_name(dtype) << " fp8 " << fp8 << " L " << L;

        // The expanded form through the CPU backend gives the same result.
        const int64_t S = c.layout.kv_slots.dim(0);
        Tensor k = poisoned({S, 4 * 24}), v = poisoned({S, 4 * 12});
        Tensor k_ref = poisoned({S, 4 * 24}), v_ref = poisoned({S, 4 * 12});
        backend.mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k, v);
        reference::mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k_ref, v_ref);
        EXPECT_LT(relative_error(k, k_ref), 1e-5);
        EXPECT_LT(relative_error(v, v_ref), 1e-5);
        std::vector<int32_t> iota(static_cast<size_t>(S));
        std::iota(iota.begin(), iota.end(), 0);
        AttentionLayout dense{c.layout.q_start, c.layout.kv_start, i32_tensor(iota)};
        Tensor expanded = poisoned({4, 4 * 12});
        backend.attention(c.q, k, v, dense, AttentionParams{4, 4, 24, 12, c.p.scale, 0}, expanded);
        EXPECT_LT(relative_error(expanded, out), 2e-5);

        // bf16 keys and values: the same values, rounded once.
        Tensor k16 = poisoned({S, 4 * 24}, DType::kBF16), v16 = poisoned({S, 4 * 12}, DType::kBF16);
        Tensor k16_ref = poisoned({S, 4 * 24}, DType::kBF16), v16_ref = poisoned({S, 4 * 12}, DType::kBF16);
        backend.mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k16, v16);
        reference::mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k16_ref, v16_ref);
        EXPECT_LT(relative_error(k16, k_ref), 4e-3);
        EXPECT_LT(relative_error(v16, v_ref), 4e-3);
        EXPECT_LT(relative_error(k16, k16_ref), 4e-3);
        EXPECT_LT(relative_error(v16, v16_ref), 4e-3);
        Tensor v_mixed = poisoned({S, 4 * 12});
        EXPECT_THROW(backend.mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k16, v_mixed), Error);
        EXPECT_THROW(reference::mla_expand_kv(c.cache, c.layout.kv_slots, c.kv_b, c.p, k16, v_mixed), Error);
      }
    }
  }
}

TEST(CpuDeepseekOps, MlaAbsorbedAttentionWithUnevenHeadGroups) {
  // Head counts that do not divide into the kernel's head groups.
  TestRng rng;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    CpuBackend backend(&pool);
    for (int64_t heads : {1, 5, 7}) {
      MlaCase c = make_mla_case(rng, backend, DType::kF32, true, 32, heads);
      Tensor out = poisoned({4, heads * 12}), ref = poisoned({4, heads * 12});
      backend.mla_attention(c.q, c.cache, c.kv_b, c.layout, c.p, out);
      reference::mla_attention(c.q, c.cache, c.kv_b, c.layout, c.p, ref);
      EXPECT_LT(relative_error(out, ref), 2e-5) << heads << " heads, " << threads << " threads";
    }
  }
}

// The padding a recorded (CUDA graph) batch carries: sequences of one query
// and no keys, whose rows come out zero, more kv_slots than the layout uses,
// and tokens with slot -1, which store nothing. The real rows are unchanged
// (bit for bit on the CPU, which is batch invariant).
TEST(CpuDeepseekOps, MlaPaddingRowsAreZeroAndChangeNothingElse) {
  TestRng rng;
  CpuBackend backend;
  ReferenceBackend ref_backend;
  MlaCase c = make_mla_case(rng, backend, DType::kBF16, true, 32);
  const int64_t width = c.q.dim(1), heads = 4, Dv = 12;
  Tensor plain = poisoned({4, heads * Dv});
  backend.mla_attention(c.q, c.cache, c.kv_b, c.layout, c.p, plain);

  // Two padding sequences after the real ones, and junk slots at the end.
  Tensor q = Tensor::empty({6, width}, DType::kF32);
  std::copy_n(c.q.data<const float>(), 4 * width, q.data<float>());
  const Tensor extra = random_tensor(rng, {2, width}, DType::kF32);
  std::copy_n(extra.data<const float>(), 2 * width, q.data<float>() + 4 * width);
  std::vector<int32_t> slots(c.layout.kv_slots.data<const int32_t>(),
                             c.layout.kv_slots.data<const int32_t>() + c.layout.kv_slots.numel());
  slots.push_back(123456);  // past kv_start[num_seqs]: never read
  const AttentionLayout padded{i32_tensor({0, 3, 4, 5, 6}), i32_tensor({0, 9, 14, 14, 14}), i32_tensor(slots)};
  for (Backend* b : {static_cast<Backend*>(&backend), static_cast<Backend*>(&ref_backend)}) {
    Tensor out = poisoned({6, heads * Dv});
    b->mla_attention(q, c.cache, c.kv_b, padded, c.p, out);
    EXPECT_EQ(count_nan(out), 0) << b->name();
    for (int64_t i = 4 * heads * Dv; i < 6 * heads * Dv; ++i) ASSERT_EQ(out.data<float>()[i], 0.0f) << b->name();
    const Tensor real = out.rows(0, 4);
    if (b == &backend) {
      EXPECT_TRUE(testing::bytes_equal(testing::clone(real), plain));
    } else {
      EXPECT_LT(relative_error(testing::clone(real), plain), 2e-5);
    }
  }

  // mla_store_kv with slot -1 writes nothing; the other token lands as usual.
  const int64_t L = 32, R = 8;
  const Tensor kv_a = random_tensor(rng, {2, L + R}, DType::kF32);
  const Tensor norm = random_tensor(rng, {L}, DType::kBF16, 0.2f);
  std::vector<float> inv(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / R);
  const Tensor inv_freq = Tensor::from_f32({R / 2}, inv);
  const RopeParams rope{1, static_cast<int>(R), static_cast<int>(R), RopeStyle::kInterleaved, &inv_freq, 1.0f};
  for (Backend* b : {static_cast<Backend*>(&backend), static_cast<Backend*>(&ref_backend)}) {
    Tensor cache = testing::clone(c.cache), alone = testing::clone(c.cache);
    b->mla_store_kv(kv_a, norm, 1e-6f, i32_tensor({3, 4}), rope, i32_tensor({-1, 7}), cache);
    b->mla_store_kv(kv_a.rows(1, 1), norm, 1e-6f, i32_tensor({4}), rope, i32_tensor({7}), alone);
    EXPECT_TRUE(testing::bytes_equal(cache, alone)) << b->name();
  }
}

TEST(CpuDeepseekOps, MlaRejectsBadArguments) {
  TestRng rng;
  CpuBackend backend;
  MlaCase c = make_mla_case(rng, backend, DType::kF32, true, 32);
  Tensor out = poisoned({4, 4 * 12});
  LinearWeight no_scale{c.kv_b.weight, Tensor::zeros({2, 2}, DType::kF32)};
  EXPECT_THROW(backend.mla_attention(c.q, c.cache, no_scale, c.layout, c.p, out), Error);
  AttentionLayout bad = c.layout;
  bad.kv_slots = i32_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 99});
  EXPECT_THROW(backend.mla_attention(c.q, c.cache, c.kv_b, bad, c.p, out), Error);
}

TEST(CpuDeepseekOps, ConcatColumnsMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  const Tensor a = random_tensor(rng, {3, 5}, DType::kF32), b = random_tensor(rng, {3, 7}, DType::kF32);
  Tensor out = poisoned({3, 12}), ref = poisoned({3, 12});
  backend.concat_columns(a, b, out);
  reference::concat_columns(a, b, ref);
  EXPECT_TRUE(testing::bytes_equal(out, ref));
  Tensor wrong = poisoned({3, 11});
  EXPECT_THROW(backend.concat_columns(a, b, wrong), Error);
}

TEST(CpuDeepseekOps, RopeWithRotaryOffset) {
  TestRng rng;
  CpuBackend backend;
  const int64_t tokens = 5, heads = 3, head_dim = 24;
  std::vector<float> inv(4);
  for (int i = 0; i < 4; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / 8);
  const Tensor inv_freq = Tensor::from_f32({4}, inv);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
    Tensor x = random_tensor(rng, {tokens, heads * head_dim}, DType::kF32);
    Tensor ref = testing::clone(x);
    const Tensor positions = i32_tensor({0, 3, 7, 100, 2});
    RopeParams p{static_cast<int>(heads), static_cast<int>(head_dim), 8, style, &inv_freq, 1.0f, 16};
    backend.rope(x, positions, p);
    reference::rope(ref, positions, p);
    EXPECT_LT(relative_error(x, ref), 1e-6);
    p.rotary_offset = 17;
    EXPECT_THROW(backend.rope(x, positions, p), Error);
  }
}

}  // namespace
}  // namespace basalt
