#include "core/bf16_product.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"

namespace basalt {
namespace {

TEST(Bf16Product, RowsArePaddedTo32Columns) {
  EXPECT_EQ(bf16_padded_columns(0), 0);
  EXPECT_EQ(bf16_padded_columns(1), 32);
  EXPECT_EQ(bf16_padded_columns(32), 32);
  EXPECT_EQ(bf16_padded_columns(1025), 1056);
}

TEST(Bf16Product, RoundingIsNearestEvenWithTinyValuesFlushed) {
  EXPECT_EQ(round_activation_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 to 1 + 2^-6.
  EXPECT_EQ(round_activation_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(round_activation_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(round_activation_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(round_activation_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(round_activation_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(round_activation_bf16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(round_activation_bf16(std::numeric_limits<float>::min()), 0x0080);
  std::vector<uint16_t> row(64, 0xffff);
  const float x[3] = {1.0f, 2.0f, 3.0f};
  round_activations_bf16(x, 3, row.data());
  EXPECT_EQ(row[2], 0x4040);
  for (int i = 3; i < 32; ++i) EXPECT_EQ(row[i], 0) << i;  // padded to 32, nothing past
  EXPECT_EQ(row[32], 0xffff);
}

TEST(Bf16Product, TheOrderIsOddThenEvenPerLaneThenTheFixedTree) {
  // Lane 0 holds 2^25 after the first chunk; the second chunk's odd column
  // brings -2^25 and its even column 1. Odd first: 0, then 1. Even first
  // would lose the 1 against 2^25 (half its ulp is 2) and end at 0.
  std::vector<uint16_t> x(64, f32_to_bf16(1.0f)), w(64, 0);
  w[1] = f32_to_bf16(std::ldexp(1.0f, 25));
  w[33] = f32_to_bf16(-std::ldexp(1.0f, 25));
  w[32] = f32_to_bf16(1.0f);
  EXPECT_EQ(bf16_dot_reference(x.data(), w.data(), 64), 1.0f);
  // The tree: lanes 0 and 8 meet first. 2^25 in lane 0, 1 in lane 1, -2^25 in lane 8.
  std::fill(w.begin(), w.end(), 0);
  w[1] = f32_to_bf16(std::ldexp(1.0f, 25));
  w[3] = f32_to_bf16(1.0f);
  w[17] = f32_to_bf16(-std::ldexp(1.0f, 25));
  EXPECT_EQ(bf16_dot_reference(x.data(), w.data(), 32), 1.0f);  // (2^25 - 2^25) + 1, not (2^25 + 1) - 2^25
}

}  // namespace
}  // namespace basalt
