#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>

namespace basalt {
namespace {

TEST(RopeFrequencies, DefaultIsGeometric) {
  RopeScaling s;
  const RopeFrequencies f = rope_frequencies(s, 10000.0, 8, 2048);
  ASSERT_EQ(f.inv_freq.size(), 4u);
  EXPECT_FLOAT_EQ(f.inv_freq[0], 1.0f);
  EXPECT_NEAR(f.inv_freq[1], 1.0 / std::pow(10000.0, 0.25), 1e-7);
  EXPECT_NEAR(f.inv_freq[3], 1.0 / std::pow(10000.0, 0.75), 1e-9);
  EXPECT_EQ(f.attention_scaling, 1.0f);
}

TEST(RopeFrequencies, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  RopeScaling s;
  s.type = "llama3";
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  const RopeFrequencies base = rope_frequencies(RopeScaling{}, 500000.0, 128, 131072);
  const RopeFrequencies f = rope_frequencies(s, 500000.0, 128, 131072);
  const double pi = 3.14159265358979323846;
  for (size_t i = 0; i < f.inv_freq.size(); ++i) {
    const double wavelen = 2 * pi / base.inv_freq[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_FLOAT_EQ(f.inv_freq[i], base.inv_freq[i]) << i;
    }
    if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(f.inv_freq[i], base.inv_freq[i] / 8.0f) << i;
    }
    EXPECT_LE(f.inv_freq[i], base.inv_freq[i] * 1.000001f);
    EXPECT_GE(f.inv_freq[i], base.inv_freq[i] / 8.0f * 0.999999f);
  }
}

TEST(RopeFrequencies, YarnAttentionFactor) {
  RopeScaling s;
  s.type = "yarn";
  s.factor = 40.0;
  s.original_max_position_embeddings = 4096;
  s.mscale = 1.0;
  s.mscale_all_dim = 1.0;
  // DeepSeek-V3: mscale == mscale_all_dim, so the cos/sin factor is exactly 1.
  EXPECT_FLOAT_EQ(rope_frequencies(s, 10000.0, 64, 163840).attention_scaling, 1.0f);
  s.mscale = s.mscale_all_dim = 0.0;
  EXPECT_NEAR(rope_frequencies(s, 10000.0, 64, 163840).attention_scaling,
              0.1 * std::log(40.0) + 1.0, 1e-6);
  // The fastest-rotating dimensions extrapolate (unchanged); the slowest interpolate.
  const RopeFrequencies base = rope_frequencies(RopeScaling{}, 10000.0, 64, 163840);
  const RopeFrequencies f = rope_frequencies(s, 10000.0, 64, 163840);
  EXPECT_FLOAT_EQ(f.inv_freq.front(), base.inv_freq.front());
  EXPECT_NEAR(f.inv_freq.back(), base.inv_freq.back() / 40.0f, 1e-12);
}

}  // namespace
}  // namespace basalt
