// The logit ops' checks (bad edits, masks, k, columns), top_k_rows' order
// and rank_rows' ranks on known rows. Their results against the reference are in the table of
// backend/backend_ops_test.cc.
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

TEST(CpuLogitOps, TokenBitmaskRejectsBadMasks) {
  CpuBackend backend;
  Tensor x = Tensor::zeros({2, 40}, DType::kF32);
  EXPECT_THROW(backend.apply_token_bitmask(x, Tensor::zeros({2, 1}, DType::kI32)), Error);
  EXPECT_THROW(backend.apply_token_bitmask(x, Tensor::zeros({2, 2}, DType::kF32)), Error);
}

TEST(CpuLogitOps, TopKRowsRejectsBadK) {
  CpuBackend backend;
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

TEST(CpuLogitOps, GatherRowsRejectsColumnsOutsideTheRow) {
  CpuBackend backend;
  const Tensor x = Tensor::zeros({3, 33}, DType::kF32);
  Tensor got = testing::poisoned({3}, DType::kF32), want = testing::poisoned({3}, DType::kF32);
  const Tensor cols = testing::i32_tensor({0, 33, 1});
  EXPECT_THROW(backend.gather_rows(x, cols, got), Error);
  EXPECT_THROW(reference::gather_rows(x, cols, want), Error);
}

TEST(CpuLogitOps, RankRowsOnKnownRows) {
  CpuBackend backend;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Each row picks one entry: a tie shares the better rank, NaN is never
  // greater (a NaN entry ranks first), +inf ranks first, -inf behind all
  // finite entries.
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, nan, 2.0f, -kInf, kInf};
  std::vector<float> rows;
  for (int r = 0; r < 5; ++r) rows.insert(rows.end(), row.begin(), row.end());
  const Tensor x = Tensor::from_f32({5, 7}, rows);
  const Tensor cols = testing::i32_tensor({4, 2, 3, 6, 5});
  Tensor got = testing::poisoned({5}, DType::kI32), want = testing::poisoned({5}, DType::kI32);
  backend.rank_rows(x, cols, got);
  reference::rank_rows(x, cols, want);
  const std::vector<int32_t> ranks = {4, 2, 1, 1, 6};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(got.data<int32_t>()[r], ranks[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(want.data<int32_t>()[r], ranks[static_cast<size_t>(r)]) << r;
  }
  const Tensor outside = testing::i32_tensor({0, 7, 1, 0, 0});
  EXPECT_THROW(backend.rank_rows(x, outside, got), Error);
  EXPECT_THROW(reference::rank_rows(x, outside, want), Error);
}

TEST(CpuLogitOps, CopyIndexedRejectsBadIndicesAndLeavesDstAlone) {
  CpuBackend backend;
  const Tensor src = testing::i32_tensor({10, 11, 12});
  Tensor dst = testing::i32_tensor({0, 1, 2, 3});
  backend.copy_indexed(src, testing::i32_tensor({2, 0}), dst, testing::i32_tensor({3, 1}));
  EXPECT_EQ(std::vector<int32_t>(dst.data<int32_t>(), dst.data<int32_t>() + 4), (std::vector<int32_t>{0, 10, 2, 12}));
  const auto rejected = [&](std::vector<int32_t> from, std::vector<int32_t> to) {
    Tensor d = testing::i32_tensor({0, 1, 2, 3});
    EXPECT_THROW(backend.copy_indexed(src, testing::i32_tensor(from), d, testing::i32_tensor(to)), Error);
    EXPECT_EQ(std::vector<int32_t>(d.data<int32_t>(), d.data<int32_t>() + 4), (std::vector<int32_t>{0, 1, 2, 3}));
  };
  rejected({3}, {0});         // past src
  rejected({0}, {4});         // past dst
  rejected({-1}, {0});        // negative
  rejected({0, 1}, {2, 2});   // a dst element twice
  rejected({0, 1}, {2});      // counts differ
}

}  // namespace
}  // namespace basalt
