// The CUDA store_kv and attention ops against the scalar reference ops, on
// random inputs with outputs poisoned (NaN) before each call, every case run
// through both attention paths (split-KV decode, on tensor cores and on CUDA
// cores, and tensor-core prefill, forced: on wgmma where it applies and on
// mma.sync) and the automatic choice: batches
// of decode, prefill and mixed extend/decode sequences of different lengths
// in one call, with slots scattered over the pool; GQA ratios 1, 4 and 8;
// head dims 64, 128, 256 and odd ones (80; 96 keys with 64-wide values; 64
// keys with 128-wide values; DeepSeek's expanded 192/128; 36 and 17/9, which
// take the scalar fallbacks); prompts of several 128-row tiles;
// kv lengths 1..5000 mixed in one batch; sliding window on and off; f32 and
// bf16 queries, outputs and caches (q and out of different dtypes too); the
// graph-padding cases (queries at negative positions give zero rows,
// kv_slots longer than used, negative store slots skipped); bad slots giving
// NaN rows; determinism; and the host-side errors. Tolerances (relative L2
// error vs the f64 reference): 1e-5 for the decode path with f32 everywhere
// (f32 arithmetic; the tensor-core decode takes bf16 caches only), 1e-2 when
// a bf16 value is involved (inputs rounded, or a bf16 output), 2e-2 for the
// prefill path (q, K, V and the probabilities rounded to bf16 for the tensor
// cores). Skips where no device is present.
#include "backend/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cuda/device.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

Tensor device_poisoned(Shape shape, DType dtype) {
  Tensor t = cuda_empty(std::move(shape), dtype);
  cuda_fill_bytes(t, 0xFF);
  return t;
}

using Path = CudaAttentionPath;
// Every case runs: the decode path with its own split count, the decode path
// with 5 splits (so the combine kernel runs whatever the shapes), the decode
// path on its CUDA-core kernels with 3 splits (bf16 caches up to head dim 128
// otherwise take the tensor-core decode kernel), the prefill path (on wgmma
// where it applies), the prefill path on its mma.sync kernel, the automatic
// choice and the batch-invariant path.
struct Variant {
  Path path;
  int splits;
};
const Variant kPaths[] = {{Path::kDecode, 0},  {Path::kDecode, 5}, {Path::kDecodeCudaCores, 3},
                          {Path::kPrefill, 0}, {Path::kAuto, 0},  {Path::kRowInvariant, 0},
                          {Path::kPrefillMmaSync, 0}};

std::string path_name(Variant v) {
  const char* name = v.path == Path::kDecode            ? "decode"
                     : v.path == Path::kDecodeCudaCores ? "decode on CUDA cores"
                     : v.path == Path::kPrefill         ? "prefill"
                     : v.path == Path::kPrefillMmaSync  ? "prefill on mma.sync"
                     : v.path == Path::kRowInvariant    ? "row-invariant"
                                                        : "auto";
  return v.splits > 0 ? std::string(name) + " (" + std::to_string(v.splits) + " splits)" : std::string(name);
}

struct Seq {
  int q_len, kv_len;
};

// A host layout for `seqs`, whose keys sit in slots drawn at random (without
// repeats) from a pool with `spare` unused slots.
struct HostBatch {
  std::vector<int32_t> q_start, kv_start, kv_slots;
  int64_t tokens = 0, num_slots = 0;
};

HostBatch make_batch(TestRng& rng, const std::vector<Seq>& seqs, int64_t spare = 37, int extra_slots = 0) {
  HostBatch b;
  b.q_start.push_back(0);
  b.kv_start.push_back(0);
  for (const Seq& s : seqs) {
    b.q_start.push_back(b.q_start.back() + s.q_len);
    b.kv_start.push_back(b.kv_start.back() + s.kv_len);
  }
  b.tokens = b.q_start.back();
  b.num_slots = b.kv_start.back() + spare;
  std::vector<int32_t> pool(static_cast<size_t>(b.num_slots));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.engine());
  b.kv_slots.assign(pool.begin(), pool.begin() + b.kv_start.back());
  // Entries past kv_start[num_seqs] are never read: make them hostile.
  for (int i = 0; i < extra_slots; ++i) b.kv_slots.push_back(i % 2 == 0 ? -1 : 1 << 30);
  return b;
}

AttentionLayout host_layout(const HostBatch& b) {
  return {testing::i32_tensor(b.q_start), testing::i32_tensor(b.kv_start), testing::i32_tensor(b.kv_slots)};
}

AttentionLayout to_device(const AttentionLayout& l) {
  return {cuda_to_device(l.q_start), cuda_to_device(l.kv_start), cuda_to_device(l.kv_slots)};
}

struct Config {
  int heads, kv_heads, head_dim, v_head_dim, window;
  DType act, cache;
  DType out = DType::kF32;  // kF32 or kBF16; the tests use act's dtype unless set
  bool out_set = false;
  DType out_dtype() const { return out_set ? out : act; }
  std::string describe() const {
    return "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " dims " +
           std::to_string(head_dim) + "/" + std::to_string(v_head_dim) + " window " + std::to_string(window) +
           " q " + std::string(dtype_name(act)) + " cache " + std::string(dtype_name(cache)) + " out " +
           std::string(dtype_name(out_dtype()));
  }
};

AttentionParams params_of(const Config& c) {
  AttentionParams p;
  p.num_heads = c.heads;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.v_head_dim = c.v_head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.sliding_window = c.window;
  return p;
}

double tolerance(const Config& c, Variant v) {
  if (v.path == Path::kPrefill || v.path == Path::kPrefillMmaSync || v.path == Path::kAuto) return 2e-2;
  return c.act == DType::kF32 && c.cache == DType::kF32 && c.out_dtype() == DType::kF32 ? 1e-5 : 1e-2;
}

// Runs every path on one batch; returns the host outputs (one per path).
std::vector<Tensor> check_attention(TestRng& rng, const std::vector<Seq>& seqs, const Config& c,
                                    int extra_slots = 0) {
  const HostBatch b = make_batch(rng, seqs, 37, extra_slots);
  const AttentionParams p = params_of(c);
  const Tensor q = testing::random_tensor(rng, {b.tokens, int64_t{c.heads} * c.head_dim}, c.act);
  // A spread of 2 on the keys makes softmaxes neither flat nor one-hot.
  const Tensor k_cache =
      testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.head_dim}, c.cache, 2.0f);
  const Tensor v_cache = testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.v_head_dim}, c.cache);
  const AttentionLayout layout = host_layout(b);
  Tensor want = Tensor::empty({b.tokens, int64_t{c.heads} * c.v_head_dim}, DType::kF32);
  reference::attention(q.to_f32(), k_cache, v_cache, layout, p, want);
  const Tensor q_dev = cuda_to_device(q), k_dev = cuda_to_device(k_cache), v_dev = cuda_to_device(v_cache);
  const AttentionLayout layout_dev = to_device(layout);
  std::vector<Tensor> outs;
  for (Variant path : kPaths) {
    Tensor out = device_poisoned({b.tokens, int64_t{c.heads} * c.v_head_dim}, c.out_dtype());
    cuda_attention(q_dev, k_dev, v_dev, layout_dev, p, out, nullptr, path.path, path.splits);
    outs.push_back(cuda_to_host(out));
    EXPECT_LT(testing::relative_error(outs.back(), want), tolerance(c, path))
        << c.describe() << " path " << path_name(path) << " seqs " << seqs.size();
  }
  return outs;
}

const DType kTypes[] = {DType::kF32, DType::kBF16};
const std::pair<int, int> kGqa[] = {{4, 4}, {8, 2}, {16, 2}};  // ratios 1, 4, 8
// {72, 40}: multiples of 8 that are not of 16 (the tensor-core decode
// kernel's zero columns up to the MMA width).
const std::pair<int, int> kDims[] = {{64, 64},  {128, 128}, {256, 256}, {80, 80}, {96, 64}, {72, 40},
                                     {64, 128}, {192, 128}, {36, 36},   {17, 9}};

void check_all_configs(const std::vector<Seq>& seqs, const std::vector<int>& windows) {
  TestRng rng;
  for (auto [heads, kv_heads] : kGqa)
    for (auto [d, dv] : kDims)
      for (int window : windows)
        for (DType act : kTypes)
          for (DType cache : kTypes) check_attention(rng, seqs, {heads, kv_heads, d, dv, window, act, cache});
}

TEST(CudaAttention, DecodeBatches) {
  REQUIRE_DEVICE();
  check_all_configs({{1, 1}, {1, 7}, {1, 100}, {1, 513}, {1, 33}, {1, 64}}, {0, 37, 1});
}

TEST(CudaAttention, PrefillBatches) {
  REQUIRE_DEVICE();
  check_all_configs({{1, 1}, {17, 17}, {90, 90}, {64, 64}, {130, 130}}, {0, 37});
}

TEST(CudaAttention, LongPromptsAndExtends) {
  REQUIRE_DEVICE();
  // Prompts of several 128-row tiles (the wgmma prefill's), ragged last
  // tiles, an extend whose rows start mid-tile over a long prefix, and one
  // that ends a row short of a tile; windows shorter and longer than a tile.
  TestRng rng;
  const std::vector<Seq> seqs = {{300, 300}, {129, 129}, {257, 1000}, {127, 127}, {1, 40}};
  for (int window : {0, 100})
    for (auto [d, dv] : {std::pair{128, 128}, std::pair{192, 128}, std::pair{64, 64}, std::pair{256, 256}})
      check_attention(rng, seqs, {4, 2, d, dv, window, window == 0 ? DType::kBF16 : DType::kF32, DType::kBF16});
  check_attention(rng, {{300, 800}}, {4, 2, 128, 128, 700, DType::kBF16, DType::kBF16});
}

TEST(CudaAttention, MixedExtendAndDecodeBatches) {
  REQUIRE_DEVICE();
  // Extends over a cached prefix (prefix-cache hits), decodes, a fresh
  // prompt, and sequences with no queries (one in the middle, one at the end).
  check_all_configs({{5, 40}, {1, 300}, {0, 10}, {64, 64}, {3, 200}, {1, 1}, {70, 150}, {0, 0}}, {0, 37});
}

TEST(CudaAttention, LongAndMixedKvLengths) {
  REQUIRE_DEVICE();
  TestRng rng;
  // kv lengths from 1 to 5000 in one batch, Llama-3.1-8B heads; decode rows
  // plus two short extends, so both the split-KV chunking and the prefill
  // key tiles see long, short and ragged sequences.
  std::vector<Seq> seqs;
  for (int kv : {1, 5000, 2, 4097, 17, 3001, 128, 129, 1000, 4096, 63, 2500}) seqs.push_back({1, kv});
  seqs.push_back({4, 4500});
  seqs.push_back({3, 700});
  for (int window : {0, 1024})
    for (DType t : kTypes) check_attention(rng, seqs, {32, 8, 128, 128, window, t, t});
  // A continuous batch: 100 decodes and one 200-row prefill chunk over a
  // 1000-key prefix (the automatic choice runs both kernels, per sequence).
  std::vector<Seq> crowd;
  for (int i = 0; i < 100; ++i) crowd.push_back({1, 1 + (i * 37) % 900});
  crowd.push_back({200, 1200});
  crowd.push_back({5, 60});
  for (DType t : kTypes) check_attention(rng, crowd, {32, 8, 128, 128, 0, t, t});
  // Few sequences (many splits) with a wide head.
  check_attention(rng, {{1, 4000}, {2, 3000}}, {16, 2, 256, 256, 0, DType::kBF16, DType::kBF16});
}

TEST(CudaAttention, OutputDtypeIndependentOfQ) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType act : kTypes)
    for (DType out : kTypes) {
      Config c{32, 8, 128, 128, 0, act, DType::kBF16};
      c.out = out;
      c.out_set = true;
      check_attention(rng, {{1, 300}, {1, 1}, {1, 77}}, c);
      check_attention(rng, {{100, 100}, {30, 200}}, c);
    }
}

// The graph-padding cases of backend.h: sequences with more queries than
// keys (q 1 over kv 0; q 3 over kv 1) give zero rows for the queries at
// negative positions, normal rows for the others; kv_slots holds extra
// (hostile) entries past kv_start[num_seqs].
TEST(CudaAttention, PaddedSequencesGiveZeroRows) {
  REQUIRE_DEVICE();
  TestRng rng;
  const std::vector<Seq> seqs = {{1, 5}, {1, 0}, {3, 1}, {1, 700}, {1, 0}, {1, 0}};
  for (DType t : kTypes)
    for (int window : {0, 3}) {
      const Config c{8, 2, 128, 128, window, t, t};
      const std::vector<Tensor> outs = check_attention(rng, seqs, c, /*extra_slots=*/9);
      const int64_t width = int64_t{c.heads} * c.v_head_dim;
      for (const Tensor& out : outs) {
        EXPECT_EQ(testing::count_nan(out), 0);
        const Tensor f = out.to_f32();
        for (int64_t row : {1, 2, 3, 6, 7})
          for (int64_t i = 0; i < width; ++i) ASSERT_EQ(f.data<float>()[row * width + i], 0.0f) << row << " " << i;
      }
    }
  // A whole batch of padding (what a captured graph replays when fewer
  // requests run than it was captured for), and kv_slots far longer than used.
  for (DType t : kTypes) {
    const Config c{32, 8, 128, 128, 0, t, t};
    const std::vector<Tensor> outs = check_attention(rng, {{1, 0}, {1, 0}, {1, 0}}, c, 1000);
    for (const Tensor& out : outs) {
      const Tensor f = out.to_f32();
      for (int64_t i = 0; i < f.numel(); ++i) ASSERT_EQ(f.data<float>()[i], 0.0f) << i;
    }
  }
}

// The batch-invariant path: each row of a call gives the bits a one-row
// call on it gives (its query, its position, its keys), whatever else the
// call holds -- decodes of other lengths, a speculative verification's rows,
// a prefill. Tensor-core (bf16, dims 128) and CUDA-core decode kernels, GQA,
// a sliding window.
TEST(CudaAttention, RowInvariantPathGivesEachRowWhatAOneRowCallGives) {
  REQUIRE_DEVICE();
  TestRng rng;
  const Config configs[] = {{32, 8, 128, 128, 0, DType::kBF16, DType::kBF16},
                            {8, 8, 64, 64, 100, DType::kF32, DType::kF32},
                            {8, 2, 80, 80, 0, DType::kF32, DType::kBF16},
                            {16, 2, 128, 128, 300, DType::kBF16, DType::kBF16}};
  for (const Config& c : configs) {
    // A decode, a 5-row verification, a 70-row prompt, a 3-row extend.
    const std::vector<Seq> seqs = {{1, 300}, {5, 700}, {70, 70}, {3, 1500}};
    const HostBatch b = make_batch(rng, seqs);
    const AttentionParams p = params_of(c);
    const int64_t width = int64_t{c.heads} * c.v_head_dim;
    const Tensor q = testing::random_tensor(rng, {b.tokens, int64_t{c.heads} * c.head_dim}, c.act);
    const Tensor k_dev = cuda_to_device(
        testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.head_dim}, c.cache, 2.0f));
    const Tensor v_dev =
        cuda_to_device(testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.v_head_dim}, c.cache));
    Tensor out = device_poisoned({b.tokens, width}, c.out_dtype());
    cuda_attention(cuda_to_device(q), k_dev, v_dev, to_device(host_layout(b)), p, out, nullptr,
                   Path::kRowInvariant);
    const Tensor all = cuda_to_host(out);
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(c.out_dtype());
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int i = 0; i < seqs[s].q_len; ++i) {
        if (s == 2 && i % 17 != 0 && i != seqs[s].q_len - 1) continue;  // some of the prompt's rows
        // Row i of sequence s alone: its keys are the sequence's first
        // kv_len - q_len + i + 1.
        const int keys = seqs[s].kv_len - seqs[s].q_len + i + 1;
        HostBatch one;
        one.q_start = {0, 1};
        one.kv_start = {0, keys};
        one.kv_slots.assign(b.kv_slots.begin() + b.kv_start[s], b.kv_slots.begin() + b.kv_start[s] + keys);
        const int64_t token = b.q_start[s] + i;
        Tensor single = device_poisoned({1, width}, c.out_dtype());
        cuda_attention(cuda_to_device(q.rows(token, 1)), k_dev, v_dev, to_device(host_layout(one)), p, single,
                       nullptr, Path::kRowInvariant);
        const Tensor got = cuda_to_host(single);
        EXPECT_EQ(std::memcmp(got.raw(), static_cast<const char*>(all.raw()) + token * row_bytes, row_bytes), 0)
            << c.describe() << ": sequence " << s << " row " << i;
      }
  }
}

TEST(CudaAttention, SameCallGivesSameBits) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType t : kTypes) {
    const Config c{32, 8, 128, 128, 0, t, t};
    const HostBatch b = make_batch(rng, {{1, 3000}, {5, 40}, {100, 100}, {1, 9}});
    const AttentionLayout layout = to_device(host_layout(b));
    const Tensor q = cuda_to_device(testing::random_tensor(rng, {b.tokens, int64_t{c.heads} * c.head_dim}, t));
    const Tensor k = cuda_to_device(testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.head_dim}, t));
    const Tensor v = cuda_to_device(testing::random_tensor(rng, {b.num_slots, int64_t{c.kv_heads} * c.v_head_dim}, t));
    for (Variant path : kPaths) {
      Tensor first = device_poisoned({b.tokens, int64_t{c.heads} * c.v_head_dim}, t);
      Tensor second = device_poisoned({b.tokens, int64_t{c.heads} * c.v_head_dim}, t);
      cuda_attention(q, k, v, layout, params_of(c), first, nullptr, path.path, path.splits);
      cuda_attention(q, k, v, layout, params_of(c), second, nullptr, path.path, path.splits);
      EXPECT_TRUE(testing::bytes_equal(cuda_to_host(first), cuda_to_host(second))) << path_name(path);
    }
  }
}

TEST(CudaStoreKv, MatchesReferenceBitForBit) {
  REQUIRE_DEVICE();
  TestRng rng;
  struct Shape3 {
    int kv_heads, head_dim, v_head_dim;
  };
  for (DType act : kTypes)
    for (DType cache : kTypes)
      for (Shape3 s : {Shape3{2, 128, 128}, Shape3{3, 80, 64}, Shape3{1, 256, 256}}) {
        const int64_t tokens = 37, num_slots = 100;
        const int64_t kw = int64_t{s.kv_heads} * s.head_dim, vw = int64_t{s.kv_heads} * s.v_head_dim;
        std::vector<int32_t> pool(num_slots);
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng.engine());
        const Tensor slots = testing::i32_tensor(std::vector<int32_t>(pool.begin(), pool.begin() + tokens));
        const Tensor k = testing::random_tensor(rng, {tokens, kw}, act, 3.0f);
        const Tensor v = testing::random_tensor(rng, {tokens, vw}, act, 3.0f);
        // The key cache as [slots, kv_heads, head_dim], the value cache 2-D.
        const Tensor k0 = testing::random_tensor(rng, {num_slots, s.kv_heads, s.head_dim}, cache);
        const Tensor v0 = testing::random_tensor(rng, {num_slots, vw}, cache);
        Tensor k_want = testing::clone(k0), v_want = testing::clone(v0);
        reference::store_kv(k.to_f32(), v.to_f32(), slots, k_want, v_want);
        Tensor k_dev = cuda_to_device(k0), v_dev = cuda_to_device(v0);
        cuda_store_kv(cuda_to_device(k), cuda_to_device(v), cuda_to_device(slots), k_dev, v_dev);
        EXPECT_TRUE(testing::bytes_equal(cuda_to_host(k_dev), k_want)) << dtype_name(act) << " " << dtype_name(cache);
        EXPECT_TRUE(testing::bytes_equal(cuda_to_host(v_dev), v_want)) << dtype_name(act) << " " << dtype_name(cache);
      }
}

TEST(CudaStoreKv, OutOfRangeSlotsWriteNothing) {
  REQUIRE_DEVICE();
  const Tensor k = Tensor::from_f32({4, 2}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor v = Tensor::from_f32({4, 1}, std::vector<float>{9, 10, 11, 12});
  Tensor k_cache = cuda_to_device(Tensor::zeros({4, 2}, DType::kF32));
  Tensor v_cache = cuda_to_device(Tensor::zeros({4, 1}, DType::kF32));
  cuda_store_kv(cuda_to_device(k), cuda_to_device(v), cuda_to_device(testing::i32_tensor({-1, 2, 4, 1000})), k_cache,
                v_cache);
  const Tensor kh = cuda_to_host(k_cache), vh = cuda_to_host(v_cache);
  const std::vector<float> k_want = {0, 0, 0, 0, 3, 4, 0, 0}, v_want = {0, 0, 10, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(kh.data<float>()[i], k_want[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(vh.data<float>()[i], v_want[i]) << i;
}

TEST(CudaAttention, BadSlotsInTheLayoutGiveNaNRows) {
  REQUIRE_DEVICE();
  const Config c{2, 1, 64, 64, 0, DType::kF32, DType::kF32};
  const Tensor q = cuda_to_device(Tensor::zeros({2, 128}, DType::kF32));
  // Sequence 0 reads slot 9 of 8; sequence 1 is fine. f32 and bf16 caches
  // (the latter reach the wgmma prefill kernel).
  const AttentionLayout layout{testing::i32_tensor({0, 1, 2}), testing::i32_tensor({0, 2, 3}),
                               testing::i32_tensor({1, 9, 3})};
  for (DType cache : kTypes) {
    const Tensor k_cache = cuda_to_device(Tensor::zeros({8, 64}, cache));
    const Tensor v_cache = cuda_to_device(Tensor::zeros({8, 64}, cache));
    for (Variant path : kPaths) {
      Tensor out = device_poisoned({2, 128}, DType::kF32);
      cuda_attention(q, k_cache, v_cache, to_device(layout), params_of(c), out, nullptr, path.path, path.splits);
      const Tensor host = cuda_to_host(out);
      for (int i = 0; i < 128; ++i)
        EXPECT_TRUE(std::isnan(host.data<float>()[i])) << dtype_name(cache) << " " << path_name(path) << " " << i;
      for (int i = 128; i < 256; ++i)
        EXPECT_EQ(host.data<float>()[i], 0.0f) << dtype_name(cache) << " " << path_name(path) << " " << i;
    }
  }
}

TEST(CudaAttention, ShapeDtypeAndPlacementErrorsThrowBeforeLaunching) {
  REQUIRE_DEVICE();
  const Config c{4, 2, 64, 64, 0, DType::kF32, DType::kF32};
  const AttentionParams p = params_of(c);
  const Tensor q = cuda_empty({3, 256}, DType::kF32);
  const Tensor k_cache = cuda_empty({10, 128}, DType::kF32), v_cache = cuda_empty({10, 128}, DType::kF32);
  const AttentionLayout host = {testing::i32_tensor({0, 3}), testing::i32_tensor({0, 3}),
                                testing::i32_tensor({0, 1, 2})};
  const AttentionLayout layout = to_device(host);
  Tensor out = cuda_empty({3, 256}, DType::kF32);
  EXPECT_NO_THROW(cuda_attention(q, k_cache, v_cache, layout, p, out));

  EXPECT_THROW(cuda_attention(Tensor::zeros({3, 256}, DType::kF32), k_cache, v_cache, layout, p, out), Error);  // host q
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, host, p, out), Error);               // host layout
  Tensor out_bf16 = cuda_empty({3, 256}, DType::kBF16);
  EXPECT_NO_THROW(cuda_attention(q, k_cache, v_cache, layout, p, out_bf16));            // q f32, out bf16
  Tensor out_short = cuda_empty({3, 128}, DType::kF32);
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, layout, p, out_short), Error);       // out width
  const Tensor q_f16 = cuda_empty({3, 256}, DType::kF16);
  Tensor out_f16 = cuda_empty({3, 256}, DType::kF16);
  EXPECT_THROW(cuda_attention(q_f16, k_cache, v_cache, layout, p, out_f16), Error);     // f16 activations
  const Tensor k_bf16 = cuda_empty({10, 128}, DType::kBF16);
  EXPECT_THROW(cuda_attention(q, k_bf16, v_cache, layout, p, out), Error);              // mixed caches
  const Tensor k_wide = cuda_empty({10, 256}, DType::kF32);
  EXPECT_THROW(cuda_attention(q, k_wide, v_cache, layout, p, out), Error);              // cache row
  const Tensor v_fewer = cuda_empty({9, 128}, DType::kF32);
  EXPECT_THROW(cuda_attention(q, k_cache, v_fewer, layout, p, out), Error);             // slot counts
  AttentionParams bad = p;
  bad.num_kv_heads = 3;
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, layout, bad, out), Error);           // heads % kv_heads
  bad = p;
  bad.sliding_window = -1;
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, layout, bad, out), Error);
  // head_dim 300 is over the limit of 256.
  AttentionParams wide = p;
  wide.head_dim = wide.v_head_dim = 300;
  const Tensor q300 = cuda_empty({3, 1200}, DType::kF32), c300 = cuda_empty({10, 600}, DType::kF32);
  Tensor out300 = cuda_empty({3, 1200}, DType::kF32);
  EXPECT_THROW(cuda_attention(q300, c300, c300, layout, wide, out300), Error);
  // Layout tensors: wrong dtype, mismatched lengths, no sequences for tokens.
  const AttentionLayout f32_starts{cuda_empty({2}, DType::kF32), layout.kv_start, layout.kv_slots};
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, f32_starts, p, out), Error);
  const AttentionLayout uneven{layout.q_start, cuda_to_device(testing::i32_tensor({0, 1, 3})), layout.kv_slots};
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, uneven, p, out), Error);
  const AttentionLayout none{cuda_to_device(testing::i32_tensor({0})), cuda_to_device(testing::i32_tensor({0})),
                             layout.kv_slots};
  EXPECT_THROW(cuda_attention(q, k_cache, v_cache, none, p, out), Error);

  // store_kv.
  const Tensor k = cuda_empty({3, 128}, DType::kF32), v = cuda_empty({3, 128}, DType::kF32);
  Tensor kc = cuda_empty({10, 128}, DType::kF32), vc = cuda_empty({10, 128}, DType::kF32);
  const Tensor slots = cuda_to_device(testing::i32_tensor({0, 1, 2}));
  EXPECT_NO_THROW(cuda_store_kv(k, v, slots, kc, vc));
  EXPECT_THROW(cuda_store_kv(k, v, testing::i32_tensor({0, 1, 2}), kc, vc), Error);        // host slots
  EXPECT_THROW(cuda_store_kv(k, v, cuda_to_device(testing::i32_tensor({0, 1})), kc, vc), Error);  // length
  Tensor kc_wide = cuda_empty({10, 256}, DType::kF32);
  EXPECT_THROW(cuda_store_kv(k, v, slots, kc_wide, vc), Error);                            // row width
  Tensor kc_f16 = cuda_empty({10, 128}, DType::kF16), vc_f16 = cuda_empty({10, 128}, DType::kF16);
  EXPECT_THROW(cuda_store_kv(k, v, slots, kc_f16, vc_f16), Error);                         // f16 cache
  const Tensor v_bf16 = cuda_empty({3, 128}, DType::kBF16);
  EXPECT_THROW(cuda_store_kv(k, v_bf16, slots, kc, vc), Error);                            // k/v dtypes
  cuda_synchronize();
}

}  // namespace
}  // namespace basalt
