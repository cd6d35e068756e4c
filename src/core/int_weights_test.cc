// core/int_weights.h: the layouts that are valid, what quantizing a row
// writes (codes, packing order, scales, padding) and how close its values
// come back, the activation quantization's edge cases, and the fixed
// summation order of the product.
#include "core/int_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

struct Row {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;
};

Row quantize(const IntWeightLayout& l, const std::vector<float>& w) {
  Row r{std::vector<uint8_t>(static_cast<size_t>(l.code_columns()), 0xab),
        std::vector<uint16_t>(static_cast<size_t>(l.scale_columns()), 0xabcd)};
  quantize_int_row(l, w.data(), r.codes.data(), r.scales.data());
  return r;
}

std::vector<float> random_row(int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(k));
  for (float& v : w) v = normal(rng);
  return w;
}

TEST(IntWeights, LayoutsAreValidatedAndSized) {
  EXPECT_EQ(int_layout_error({8, 32, 100}), "");
  EXPECT_EQ(int_layout_error({4, 100, 100}), "");  // per channel
  EXPECT_EQ(int_layout_error({4, 128, 100}), "");  // one partial group
  EXPECT_NE(int_layout_error({6, 32, 100}), "");
  EXPECT_NE(int_layout_error({8, 48, 100}), "");
  EXPECT_NE(int_layout_error({8, 0, 100}), "");
  EXPECT_NE(int_layout_error({8, 32, 0}), "");
  const IntWeightLayout int8{8, 64, 300}, int4{4, 32, 300};
  EXPECT_EQ(int8.blocks(), 10);
  EXPECT_EQ(int8.code_columns(), 320);
  EXPECT_EQ(int8.scale_columns(), 5);
  EXPECT_EQ(int4.code_columns(), 160);
  EXPECT_EQ(int4.scale_columns(), 10);
}

TEST(IntWeights, Int8CodesScalesAndPaddingFollowTheFormat) {
  const IntWeightLayout l{8, 32, 40};
  std::vector<float> w(40, 0.0f);
  for (int k = 0; k < 32; ++k) w[k] = 0.01f * static_cast<float>(k - 16);
  w[33] = -2.0f;
  const Row r = quantize(l, w);
  const float s0 = f16_to_f32(r.scales[0]), s1 = f16_to_f32(r.scales[1]);
  EXPECT_EQ(r.scales[0], f32_to_f16(0.16f / 127.0f));
  EXPECT_EQ(r.scales[1], f32_to_f16(2.0f / 127.0f));
  EXPECT_EQ(int_code(l, r.codes.data(), 0), -127);  // the group's extreme maps to the end of the range
  EXPECT_EQ(int_code(l, r.codes.data(), 33), -127);
  for (int k = 0; k < 40; ++k) {
    const float scale = k < 32 ? s0 : s1;
    EXPECT_LE(std::fabs(dequantize_int(l, r.codes.data(), r.scales.data(), k) - w[k]), 0.5f * scale + 1e-7f) << k;
  }
  for (int k = 40; k < 64; ++k) EXPECT_EQ(r.codes[k], 0) << "padding column " << k;
}

TEST(IntWeights, Int4PacksEachBlockLowHalfThenHighHalf) {
  const IntWeightLayout l{4, 36, 36};  // one scale for the row
  std::vector<float> w(36);
  for (int k = 0; k < 36; ++k) w[k] = static_cast<float>((k % 15) - 7);  // codes -7..7 at scale 1
  w[5] = 8.0f;  // the largest magnitude: scale 8 / -8 = -1, so codes are -w
  const Row r = quantize(l, w);
  EXPECT_EQ(f16_to_f32(r.scales[0]), -1.0f);
  // Byte i of a block: column i in the low nibble, column 16 + i in the high one, as code + 8.
  for (int i = 0; i < 16; ++i) {
    const int lo = static_cast<int>(-w[i]) + 8, hi = static_cast<int>(-w[16 + i]) + 8;
    EXPECT_EQ(r.codes[i], static_cast<uint8_t>(lo | (hi << 4))) << i;
  }
  EXPECT_EQ(int_code(l, r.codes.data(), 5), -8);
  // The second block holds 4 columns; its padding codes are 0 (nibble 8).
  for (int k = 32; k < 36; ++k) EXPECT_EQ(dequantize_int(l, r.codes.data(), r.scales.data(), k), w[k]) << k;
  EXPECT_EQ(r.codes[16 + 4] & 0x0f, 8);
  EXPECT_EQ(r.codes[16 + 4] >> 4, 8);
  EXPECT_EQ(r.codes[16 + 2] >> 4, 8);  // column 32 + 16 + 2: padding
}

TEST(IntWeights, RoundTripErrorIsHalfAStepUpToInt4sClamp) {
  for (const IntWeightLayout l : {IntWeightLayout{8, 64, 300}, IntWeightLayout{4, 32, 300},
                                  IntWeightLayout{8, 300, 300}, IntWeightLayout{4, 300, 300}}) {
    const std::vector<float> w = random_row(l.in_features, 7);
    const Row r = quantize(l, w);
    for (int64_t k = 0; k < l.in_features; ++k) {
      const float step = std::fabs(f16_to_f32(r.scales[k / l.group]));
      // int4's 16 levels are -8..7 steps with the extreme at -8: a value on
      // the other side beyond 7.5 steps is clamped to 7.
      const float bound = std::max(0.5f * step, std::fabs(w[k]) - 7.0f * step);
      EXPECT_LE(std::fabs(dequantize_int(l, r.codes.data(), r.scales.data(), k) - w[k]), bound * 1.001f)
          << "bits " << l.bits << " group " << l.group << " column " << k;
    }
  }
}

TEST(IntWeights, ZeroGroupsAndNonFiniteWeights) {
  const IntWeightLayout l{8, 32, 64};
  std::vector<float> w(64, 0.0f);
  w[40] = 1.0f;
  const Row r = quantize(l, w);
  EXPECT_EQ(r.scales[0], 0);
  for (int k = 0; k < 32; ++k) EXPECT_EQ(int_code(l, r.codes.data(), k), 0);
  w[3] = std::nanf("");
  EXPECT_THROW(quantize(l, w), Error);
  w[3] = INFINITY;
  EXPECT_THROW(quantize(l, w), Error);
  w[3] = 1e9f;  // 1e9 / 127 is beyond f16
  EXPECT_THROW(quantize(l, w), Error);
}

TEST(IntWeights, ActivationsQuantizePerBlockWithDefinedEdges) {
  std::vector<float> x(40, 0.0f);
  x[0] = 127.0f;  // amax 127: a step of exactly 1
  x[1] = -63.5f;  // ties go to even
  x[2] = 0.5f;
  x[3] = 1.5f;
  x[35] = std::nanf("");  // never the block's amax; its code is -127
  x[36] = 3.0f;
  std::vector<int8_t> codes(64, 99);
  std::vector<float> scales(2);
  quantize_int_activations(x.data(), 40, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(codes[0], 127);
  EXPECT_EQ(codes[1], -64);  // -63.5 ties to even
  EXPECT_EQ(codes[2], 0);
  EXPECT_EQ(codes[3], 2);
  EXPECT_EQ(scales[1], 3.0f / 127.0f);
  EXPECT_EQ(codes[35], -127);
  EXPECT_EQ(codes[36], 127);
  for (int k = 40; k < 64; ++k) EXPECT_EQ(codes[k], 0) << "padding " << k;
  std::vector<float> zeros(32, 0.0f);
  quantize_int_activations(zeros.data(), 32, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 0.0f);
}

TEST(IntWeights, TheProductSumsWholeBlocksInOrder) {
  // Two blocks, codes chosen so that each block's integer sum is known.
  const IntWeightLayout l{8, 32, 64};
  std::vector<float> w(64, 0.0f);
  for (int k = 0; k < 64; ++k) w[k] = static_cast<float>((k * 37) % 255 - 127) / 127.0f;
  w[0] = 1.0f;
  w[32] = -1.0f;
  const Row r = quantize(l, w);
  std::vector<float> x(64);
  for (int k = 0; k < 64; ++k) x[k] = static_cast<float>((k * 91) % 255 - 127) / 64.0f;
  std::vector<int8_t> xc(64);
  std::vector<float> xs(2);
  quantize_int_activations(x.data(), 64, xc.data(), xs.data());
  float want = 0;
  for (int b = 0; b < 2; ++b) {
    int p = 0;
    for (int k = 32 * b; k < 32 * b + 32; ++k) p += xc[k] * int_code(l, r.codes.data(), k);
    want = std::fma(static_cast<float>(p), xs[b] * f16_to_f32(r.scales[b]), want);
  }
  const float got = int_dot_reference(l, xc.data(), xs.data(), r.codes.data(), r.scales.data());
  EXPECT_EQ(got, want);
  double exact = 0;
  for (int k = 0; k < 64; ++k) exact += static_cast<double>(x[k]) * w[k];
  EXPECT_NEAR(got, exact, 0.02 * std::fabs(exact) + 0.05);
}

// Interleaving keeps every row's codes and scales: whole groups of 8 rows
// block by block, word by word (scales column by column), the rest row by
// row after them (the order is spelled out in core/int_weights.h and
// checked here at one place each).
TEST(IntWeights, InterleavedRowsKeepEveryRowsCodesAndScales) {
  std::mt19937 rng(7);
  for (const int bits : {8, 4}) {
    for (const int64_t rows : {int64_t{3}, int64_t{8}, int64_t{13}, int64_t{24}}) {
      IntWeightLayout l{bits, 64, 100};  // 4 blocks, the last partial; 2 scale columns
      const int64_t cols = l.code_columns(), scale_cols = l.scale_columns(), block_bytes = cols / l.blocks();
      std::vector<uint8_t> codes(static_cast<size_t>(rows * cols)), out(codes.size(), 0xee);
      std::vector<uint16_t> scales(static_cast<size_t>(rows * scale_cols)), scales_out(scales.size(), 0xeeee);
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
      for (uint16_t& c : scales) c = static_cast<uint16_t>(rng());
      interleave_int_rows(l, rows, codes.data(), scales.data(), out.data(), scales_out.data());
      if (rows >= 8) {
        // Row 5's word 1 of block 2: word 1 of group 0's block 2, fifth place.
        EXPECT_EQ(0, std::memcmp(out.data() + 2 * 8 * block_bytes + 32 + 5 * 4,
                                 codes.data() + 5 * cols + 2 * block_bytes + 4, 4));
        // Row 5's scale column 1: column 1 of group 0, fifth place.
        EXPECT_EQ(scales_out[8 + 5], scales[5 * scale_cols + 1]);
      }
      // The rows past the last whole group are where they were.
      const int64_t full = rows / 8 * 8;
      EXPECT_EQ(0, std::memcmp(out.data() + full * cols, codes.data() + full * cols,
                               static_cast<size_t>((rows - full) * cols)));
      l.rows_interleaved = true;
      std::vector<uint8_t> row(static_cast<size_t>(cols));
      std::vector<uint16_t> row_scales(static_cast<size_t>(scale_cols));
      for (int64_t n = 0; n < rows; ++n) {
        int_row(l, rows, out.data(), scales_out.data(), n, row.data(), row_scales.data());
        EXPECT_EQ(0, std::memcmp(row.data(), codes.data() + n * cols, static_cast<size_t>(cols)))
            << "int" << bits << " row " << n << " of " << rows;
        EXPECT_EQ(0, std::memcmp(row_scales.data(), scales.data() + n * scale_cols,
                                 static_cast<size_t>(scale_cols) * sizeof(uint16_t)))
            << "int" << bits << " row " << n << " of " << rows;
      }
      l.rows_interleaved = false;
      int_row(l, rows, codes.data(), scales.data(), rows - 1, row.data(), row_scales.data());
      EXPECT_EQ(0, std::memcmp(row.data(), codes.data() + (rows - 1) * cols, static_cast<size_t>(cols)));
      EXPECT_EQ(row_scales[1], scales[(rows - 1) * scale_cols + 1]);
    }
  }
}

}  // namespace
}  // namespace basalt
