// The bf16-weight kernel against core/bf16_product.h's definition, bit for
// bit. This file is built into the backend's test (the machine's own
// instruction set: AVX-512 BF16 where present) and, with bf16_linear.cc,
// into one test per other target (CMake gives each its flags: AVX2 without
// AVX-512, and scalar), so every path is held to the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/bf16_linear.h"
#include "core/bf16_product.h"
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

struct Case {
  int64_t tokens, outs, in;
};

// Weights of mixed magnitudes (so the order of the sums matters) and
// activations with a few values that rounding must handle: ties, infinities
// are left out (they make every order agree on inf or NaN).
void fill(std::mt19937& rng, std::vector<float>& x, std::vector<uint16_t>& w) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-12, 12);
  for (float& v : x) v = normal(rng) * std::ldexp(1.0f, scale(rng));
  for (uint16_t& v : w) v = f32_to_bf16(normal(rng) * std::ldexp(1.0f, scale(rng) / 2));
}

int64_t differing(ThreadPool& pool, const Case& c, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(c.tokens * c.in));
  std::vector<uint16_t> w(static_cast<size_t>(c.outs * c.in));
  fill(rng, x, w);
  std::vector<float> out(static_cast<size_t>(c.tokens * c.outs), std::numeric_limits<float>::quiet_NaN());
  linear_bf16_f32(pool, x.data(), c.tokens, c.in, w.data(), c.outs, out.data());
  std::vector<uint16_t> row(static_cast<size_t>(bf16_padded_columns(c.in)));
  int64_t count = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    round_activations_bf16(x.data() + t * c.in, c.in, row.data());
    for (int64_t n = 0; n < c.outs; ++n) {
      const float want = bf16_dot_reference(row.data(), w.data() + n * c.in, c.in);
      const float got = out[static_cast<size_t>(t * c.outs + n)];
      count += std::memcmp(&want, &got, sizeof(float)) != 0;
    }
  }
  return count;
}

TEST(Bf16Linear, GivesTheDefinitionsBits) {
#if defined(__AVX512BF16__)
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "this machine has no AVX-512 BF16";
#elif defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this machine has no AVX2";
#endif
  std::mt19937 rng(20261205);
  // Column counts around the 32-column chunk, one and many of them;
  // token counts on both sides of the panel regime (16) and its tiles.
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (const Case& c : {Case{1, 7, 1}, Case{1, 33, 31}, Case{2, 9, 32}, Case{3, 13, 33}, Case{4, 6, 100},
                          Case{1, 40, 1023}, Case{5, 17, 1024}, Case{1, 11, 1025}, Case{15, 12, 2049},
                          Case{16, 13, 64}, Case{17, 19, 300}, Case{37, 25, 3000}, Case{130, 7, 96}}) {
      EXPECT_EQ(differing(pool, c, rng), 0)
          << "tokens " << c.tokens << " outs " << c.outs << " in " << c.in << " threads " << threads;
    }
  }
}

TEST(Bf16Linear, EveryTokenRowIsTheSameAloneOrInABatch) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int64_t in = 1500, outs = 23;
  std::vector<float> x(static_cast<size_t>(40 * in));
  std::vector<uint16_t> w(static_cast<size_t>(outs * in));
  fill(rng, x, w);
  std::vector<float> batch(static_cast<size_t>(40 * outs)), alone(static_cast<size_t>(outs));
  linear_bf16_f32(pool, x.data(), 40, in, w.data(), outs, batch.data());
  for (int64_t t : {0, 17, 39}) {
    linear_bf16_f32(pool, x.data() + t * in, 1, in, w.data(), outs, alone.data());
    EXPECT_EQ(std::memcmp(alone.data(), batch.data() + t * outs, sizeof(float) * outs), 0) << "row " << t;
  }
}

}  // namespace
}  // namespace basalt::cpu
