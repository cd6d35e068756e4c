#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace basalt {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_safetensors("F64").has_value());
  EXPECT_FALSE(dtype_from_safetensors("bf16").has_value());
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is half-way too, and rounds up to the even mantissa.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, F16RoundingMatchesNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    const uint16_t h = f32_to_f16(f);
    const float back = f16_to_f32(h);
    if (std::isinf(back)) continue;
    // No other f16 is strictly closer.
    const float below = f16_to_f32(static_cast<uint16_t>(h - 1));
    const float above = f16_to_f32(static_cast<uint16_t>(h + 1));
    EXPECT_LE(std::fabs(back - f), std::fabs(below - f)) << f;
    EXPECT_LE(std::fabs(back - f), std::fabs(above - f)) << f;
  }
}

TEST(DType, Fp8E4M3) {
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1000.0f), 0xfe);
  for (int v = 0; v < 256; ++v) {
    const float f = fp8e4m3_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // +0 and -0 both valid
    EXPECT_EQ(f32_to_fp8e4m3(f), v) << v;
  }
  // Half-way between 1.0 (0x38) and 1.125 (0x39): ties to the even code.
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);
}

}  // namespace
}  // namespace basalt
