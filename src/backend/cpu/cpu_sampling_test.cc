// CpuBackend::sample: bit-exact agreement with the reference over random
// logits and controls, determinism in (seed, step), the greedy cases, the
// filters never letting a filtered token through, and draw frequencies that
// follow the softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::poisoned;
using testing::random_tensor;
using testing::TestRng;

int32_t draw(Backend& backend, const Tensor& logits_row, const SamplingRow& row) {
  Tensor out = poisoned({1}, DType::kI32);
  backend.sample(logits_row, std::span(&row, 1), out);
  return out.data<int32_t>()[0];
}

// softmax(logits / temperature) in double.
std::vector<double> probabilities(const float* logits, int64_t n, float temperature) {
  std::vector<double> p(static_cast<size_t>(n));
  const double m = *std::max_element(logits, logits + n) / temperature;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += p[i] = std::exp(logits[i] / temperature - m);
  for (double& v : p) v /= total;
  return p;
}

TEST(CpuSampling, MatchesReferenceExactly) {
  TestRng rng;
  CpuBackend backend;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t vocab : {1, 2, 7, 100, 1000, 32000}) {
    const int64_t rows = 24;
    Tensor logits = random_tensor(rng, {rows, vocab}, DType::kF32, rng.uniform(0.5f, 6.0f));
    float* l = logits.data<float>();
    // Awkward rows: ties at the top, masked tokens, a NaN, a peaked row.
    for (int64_t c = 0; c < vocab; ++c) {
      l[c] = std::round(l[c]);  // many exact ties
      if (c % 2 == 0) l[vocab + c] = -inf;
      if (c % 5 == 0) l[2 * vocab + c] = l[2 * vocab];
    }
    l[3 * vocab + vocab / 2] = std::numeric_limits<float>::quiet_NaN();
    l[4 * vocab] = 30.0f;
    std::vector<SamplingRow> controls(rows);
    for (SamplingRow& c : controls) {
      const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.6f};
      const int top_ks[] = {0, 0, 1, 5, 50, static_cast<int>(vocab) + 3};
      const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.3f, 0.01f};
      const float min_ps[] = {0.0f, 0.0f, 0.02f, 0.2f, 1.0f};
      c.temperature = temperatures[rng.integer(0, 4)];
      c.top_k = top_ks[rng.integer(0, 5)];
      c.top_p = top_ps[rng.integer(0, 5)];
      c.min_p = min_ps[rng.integer(0, 4)];
      c.seed = rng.engine()();
      c.step = static_cast<uint64_t>(rng.integer(0, 1000));
    }
    for (int round = 0; round < 4; ++round) {
      for (SamplingRow& c : controls) c.step += 1;
      Tensor out = poisoned({rows}, DType::kI32), ref = poisoned({rows}, DType::kI32);
      backend.sample(logits, controls, out);
      reference::sample(logits, controls, ref);
      for (int64_t r = 0; r < rows; ++r) {
        const SamplingRow& c = controls[r];
        EXPECT_EQ(out.data<int32_t>()[r], ref.data<int32_t>()[r])
            << "vocab " << vocab << " row " << r << " temperature " << c.temperature << " top_k "
            << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p << " seed " << c.seed
            << " step " << c.step;
      }
    }
  }
}

TEST(CpuSampling, DeterministicInSeedAndStep) {
  TestRng rng;
  CpuBackend backend;
  const Tensor logits = random_tensor(rng, {1, 5000}, DType::kF32, 2.0f);
  std::vector<int32_t> first, second;
  for (uint64_t step = 0; step < 50; ++step) {
    first.push_back(draw(backend, logits, {.top_p = 0.9f, .seed = 42, .step = step}));
  }
  for (uint64_t step = 0; step < 50; ++step) {
    second.push_back(draw(backend, logits, {.top_p = 0.9f, .seed = 42, .step = step}));
  }
  EXPECT_EQ(first, second);
  // Different steps do not all give the same token (the draws move on).
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 5u);
}

TEST(CpuSampling, GreedyCasesAreTheArgmax) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t vocab : {1, 3, 1000}) {
    Tensor logits = random_tensor(rng, {1, vocab}, DType::kF32);
    logits.data<float>()[vocab - 1] = logits.data<float>()[0] = 9.0f;  // a tie: lowest index wins
    for (uint64_t seed = 0; seed < 20; ++seed) {
      EXPECT_EQ(draw(backend, logits, {.temperature = 0.0f, .seed = seed}), 0);
      EXPECT_EQ(draw(backend, logits, {.temperature = 1.3f, .top_k = 1, .seed = seed}), 0);
      // min-p 1 keeps exactly the tokens tied at the maximum.
      const int32_t tied = draw(backend, logits, {.temperature = 0.8f, .min_p = 1.0f, .seed = seed});
      EXPECT_TRUE(tied == 0 || tied == vocab - 1) << tied;
    }
  }
}

TEST(CpuSampling, FiltersNeverLetFilteredTokensThrough) {
  TestRng rng;
  CpuBackend backend;
  const int64_t vocab = 300;
  for (int trial = 0; trial < 20; ++trial) {
    const Tensor logits = random_tensor(rng, {1, vocab}, DType::kF32, 3.0f);
    const float temperature = rng.uniform(0.3f, 1.5f);
    const std::vector<double> p = probabilities(logits.data<float>(), vocab, temperature);
    std::vector<int64_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    std::vector<double> mass_before(vocab);
    std::vector<int64_t> rank(vocab);
    double mass = 0.0;
    for (int64_t r = 0; r < vocab; ++r) {
      rank[order[r]] = r;
      mass_before[order[r]] = mass;
      mass += p[order[r]];
    }
    const float top_p = rng.uniform(0.2f, 0.95f), min_p = rng.uniform(0.01f, 0.5f);
    const int top_k = static_cast<int>(rng.integer(1, 40));
    for (uint64_t step = 0; step < 200; ++step) {
      const int32_t by_p = draw(backend, logits, {temperature, 0, top_p, 0.0f, 7, step});
      EXPECT_LT(mass_before[by_p], top_p + 1e-6) << "top_p " << top_p;
      const int32_t by_min_p = draw(backend, logits, {temperature, 0, 1.0f, min_p, 7, step});
      EXPECT_GE(p[by_min_p], min_p * p[order[0]] * (1 - 1e-5)) << "min_p " << min_p;
      const int32_t by_k = draw(backend, logits, {temperature, top_k, 1.0f, 0.0f, 7, step});
      EXPECT_LT(rank[by_k], top_k) << "top_k " << top_k;
    }
  }
}

// Draw frequencies over a fixed set of seeds follow the softmax. Fixed
// logits and seeds make this deterministic; the bound (chi-square with 7
// degrees of freedom beyond p = 1e-4 would be 29.9) is loose on purpose.
TEST(CpuSampling, FrequenciesFollowSoftmax) {
  CpuBackend backend;
  const std::vector<float> values = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f, 0.25f, -3.0f};
  const Tensor logits = Tensor::from_f32({1, 8}, values);
  for (float temperature : {1.0f, 0.7f}) {
    const std::vector<double> p = probabilities(values.data(), 8, temperature);
    constexpr int kDraws = 40000;
    std::vector<int> counts(8, 0);
    for (int i = 0; i < kDraws; ++i) {
      counts[draw(backend, logits, {.temperature = temperature, .seed = 1234, .step = uint64_t(i)})]++;
    }
    double chi2 = 0.0;
    for (int i = 0; i < 8; ++i) {
      const double expected = p[i] * kDraws;
      chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    EXPECT_LT(chi2, 30.0) << "temperature " << temperature;
  }
  // With top-k 3 the draws follow the renormalised top three.
  std::vector<int> counts(8, 0);
  for (int i = 0; i < 30000; ++i) {
    counts[draw(backend, logits, {.top_k = 3, .seed = 99, .step = uint64_t(i)})]++;
  }
  const double z = std::exp(2.0) + std::exp(1.0) + std::exp(0.5);
  EXPECT_NEAR(counts[5] / 30000.0, std::exp(2.0) / z, 0.015);
  EXPECT_NEAR(counts[0] / 30000.0, std::exp(1.0) / z, 0.015);
  EXPECT_NEAR(counts[1] / 30000.0, std::exp(0.5) / z, 0.015);
}

TEST(CpuSamplingChecks, RejectsBadControlsAndShapes) {
  CpuBackend backend;
  const Tensor logits = Tensor::zeros({2, 10}, DType::kF32);
  Tensor out = poisoned({2}, DType::kI32);
  std::vector<SamplingRow> rows(2);
  backend.sample(logits, rows, out);  // valid baseline
  EXPECT_THROW(backend.sample(logits, std::span(rows.data(), 1), out), Error);
  Tensor out_wrong = poisoned({3}, DType::kI32);
  EXPECT_THROW(backend.sample(logits, rows, out_wrong), Error);
  Tensor out_f32 = poisoned({2});
  EXPECT_THROW(backend.sample(logits, rows, out_f32), Error);
  for (const SamplingRow bad :
       {SamplingRow{.temperature = -0.5f}, SamplingRow{.temperature = INFINITY},
        SamplingRow{.top_k = -2}, SamplingRow{.top_p = 0.0f}, SamplingRow{.top_p = 1.5f},
        SamplingRow{.min_p = -0.1f}, SamplingRow{.min_p = std::nanf("")}}) {
    rows[1] = bad;
    EXPECT_THROW(backend.sample(logits, rows, out), Error);
  }
  EXPECT_THROW(backend.sample(Tensor::zeros({2, 0}, DType::kF32), std::vector<SamplingRow>(2), out),
               Error);
}

}  // namespace
}  // namespace basalt
