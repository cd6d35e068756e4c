// CpuBackend::adjust_logits, apply_token_bitmask, top_k_rows and gather_rows against the
// reference, bit for bit, on random rows with ties, -inf, +inf and NaN; and
// the checks every backend shares (bad edits, k, columns).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows of small integers / 4 (many exact ties) with some -inf, +inf, NaN, -0.
Tensor awkward_rows(TestRng& rng, int64_t rows, int64_t cols) {
  Tensor x = Tensor::empty({rows, cols}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t kind = rng.integer(0, 40);
    x.data<float>()[i] = kind == 0   ? -kInf
                         : kind == 1 ? std::numeric_limits<float>::quiet_NaN()
                         : kind == 2 ? -0.0f
                         : kind == 3 ? kInf
                                     : static_cast<float>(rng.integer(-40, 40)) / 4.0f;
  }
  return x;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<LogitEdit> random_edits(TestRng& rng, int64_t rows, int64_t cols) {
  std::vector<LogitEdit> edits;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      if (rng.integer(0, 3) != 0) continue;
      LogitEdit e{.row = static_cast<int32_t>(r), .token = static_cast<int32_t>(c)};
      if (rng.integer(0, 1)) e.bias = rng.uniform(-100.0f, 100.0f);
      if (rng.integer(0, 1)) e.repetition = rng.uniform(0.5f, 2.0f);
      if (rng.integer(0, 1)) e.subtract = rng.uniform(-4.0f, 4.0f);
      e.suppress = rng.integer(0, 6) == 0;
      edits.push_back(e);
    }
  return edits;
}

TEST(CpuLogitOps, AdjustLogitsMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {8, 1000}}) {
    const Tensor x = awkward_rows(rng, rows, cols);
    const std::vector<LogitEdit> edits = random_edits(rng, rows, cols);
    Tensor got = testing::clone(x), want = testing::clone(x);
    backend.adjust_logits(got, edits);
    reference::adjust_logits(want, edits);
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_TRUE(same_bits(got.data<float>()[i], want.data<float>()[i])) << i;
    for (const LogitEdit& e : edits) {
      const float before = x.data<float>()[e.row * cols + e.token];
      EXPECT_TRUE(same_bits(got.data<float>()[e.row * cols + e.token], apply_logit_edit(before, e)));
    }
  }
}

TEST(CpuLogitOps, AdjustLogitsRejectsBadEdits) {
  CpuBackend backend;
  Tensor x = Tensor::zeros({2, 4}, DType::kF32);
  const auto rejects = [&](std::vector<LogitEdit> edits) {
    EXPECT_THROW(backend.adjust_logits(x, edits), Error);
    EXPECT_THROW(reference::adjust_logits(x, edits), Error);
  };
  rejects({{.row = 2, .token = 0}});
  rejects({{.row = 0, .token = 4}});
  rejects({{.row = -1, .token = 0}});
  rejects({{.row = 1, .token = 1, .bias = 1.0f}, {.row = 1, .token = 1, .subtract = 1.0f}});
  rejects({{.row = 0, .token = 0, .repetition = 0.0f}});
  rejects({{.row = 0, .token = 0, .bias = kInf}});
  rejects({{.row = 0, .token = 0, .subtract = std::numeric_limits<float>::quiet_NaN()}});
  // Nothing changed on the way.
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(x.data<float>()[i], 0.0f);
  backend.adjust_logits(x, std::vector<LogitEdit>{});
}

// Random masks (some all-allowed words, vocabularies that end mid-word):
// every forbidden logit becomes -inf, every allowed one keeps its bits.
TEST(CpuLogitOps, TokenBitmaskMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 31}, {4, 64}, {5, 1000}}) {
    const Tensor x = awkward_rows(rng, rows, cols);
    const int64_t words = (cols + 31) / 32;
    Tensor mask = Tensor::empty({rows, words}, DType::kI32);
    for (int64_t i = 0; i < mask.numel(); ++i)
      mask.data<int32_t>()[i] = rng.integer(0, 3) == 0 ? -1 : static_cast<int32_t>(rng.integer(0, 1 << 30) * 3);
    Tensor got = testing::clone(x), want = testing::clone(x);
    backend.apply_token_bitmask(got, mask);
    reference::apply_token_bitmask(want, mask);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < cols; ++t) {
        const int64_t i = r * cols + t;
        EXPECT_TRUE(same_bits(got.data<float>()[i], want.data<float>()[i])) << i;
        const bool allowed = (static_cast<uint32_t>(mask.data<int32_t>()[r * words + t / 32]) >> (t % 32)) & 1u;
        if (allowed) EXPECT_TRUE(same_bits(got.data<float>()[i], x.data<float>()[i])) << i;
        else EXPECT_EQ(got.data<float>()[i], -kInf) << i;
      }
  }
  Tensor x = Tensor::zeros({2, 40}, DType::kF32);
  EXPECT_THROW(backend.apply_token_bitmask(x, Tensor::zeros({2, 1}, DType::kI32)), Error);
  EXPECT_THROW(backend.apply_token_bitmask(x, Tensor::zeros({2, 2}, DType::kF32)), Error);
}

TEST(CpuLogitOps, TopKRowsMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t cols : {1, 2, 5, 64, 1000, 5000}) {
    const int64_t rows = 7;
    const Tensor x = awkward_rows(rng, rows, cols);
    for (int k : {1, 2, 5, 20, 64}) {
      if (k > cols) continue;
      Tensor values = testing::poisoned({rows, k}, DType::kF32), ids = testing::poisoned({rows, k}, DType::kI32);
      Tensor want_values = testing::poisoned({rows, k}, DType::kF32);
      Tensor want_ids = testing::poisoned({rows, k}, DType::kI32);
      backend.top_k_rows(x, k, values, ids);
      reference::top_k_rows(x, k, want_values, want_ids);
      for (int64_t i = 0; i < rows * k; ++i) {
        EXPECT_EQ(ids.data<int32_t>()[i], want_ids.data<int32_t>()[i]) << cols << " " << k << " " << i;
        EXPECT_TRUE(same_bits(values.data<float>()[i], want_values.data<float>()[i]));
      }
    }
  }
  Tensor x = Tensor::zeros({2, 10}, DType::kF32);
  Tensor v = Tensor::empty({2, 11}, DType::kF32), ids = Tensor::empty({2, 11}, DType::kI32);
  EXPECT_THROW(backend.top_k_rows(x, 11, v, ids), Error);
  Tensor v0 = Tensor::empty({2, 0}, DType::kF32), ids0 = Tensor::empty({2, 0}, DType::kI32);
  EXPECT_THROW(backend.top_k_rows(x, 0, v0, ids0), Error);
}

TEST(CpuLogitOps, TopKRowsOrderOnKnownRow) {
  CpuBackend backend;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> row = {nan, 1.0f, -kInf, 0.0f, 1.0f, -0.0f, kInf, nan};
  Tensor x = Tensor::from_f32({1, 8}, row);
  Tensor values = Tensor::empty({1, 8}, DType::kF32), ids = Tensor::empty({1, 8}, DType::kI32);
  backend.top_k_rows(x, 8, values, ids);
  const std::vector<int32_t> want = {6, 1, 4, 3, 5, 2, 0, 7};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(ids.data<int32_t>()[j], want[static_cast<size_t>(j)]) << j;
}

TEST(CpuLogitOps, GatherRowsMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  const Tensor x = awkward_rows(rng, 9, 33);
  std::vector<int32_t> cols;
  for (int r = 0; r < 9; ++r) cols.push_back(static_cast<int32_t>(rng.integer(0, 32)));
  const Tensor c = testing::i32_tensor(cols);
  Tensor got = testing::poisoned({9}, DType::kF32), want = testing::poisoned({9}, DType::kF32);
  backend.gather_rows(x, c, got);
  reference::gather_rows(x, c, want);
  for (int r = 0; r < 9; ++r) {
    EXPECT_TRUE(same_bits(got.data<float>()[r], want.data<float>()[r]));
    EXPECT_TRUE(same_bits(got.data<float>()[r], x.data<float>()[r * 33 + cols[static_cast<size_t>(r)]]));
  }
  cols[4] = 33;
  EXPECT_THROW(backend.gather_rows(x, testing::i32_tensor(cols), got), Error);
  EXPECT_THROW(reference::gather_rows(x, testing::i32_tensor(cols), want), Error);
}

}  // namespace
}  // namespace basalt
