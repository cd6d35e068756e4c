// The device sampler and its companions against the CPU backend: sample()
// on random logits of several vocabulary sizes (ties, -inf, +inf, NaN rows,
// every filter, many seeds) must pick the CPU backend's token except in rows
// where the host shows a decision within 1e-6 relative of its boundary
// (each such mismatch is justified by that computation); greedy rows never
// differ. adjust_logits, top_k_rows and gather_rows must match exactly.
// Skips where no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/reference_ops.h"
#include "backend/sampling_rng.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kNear = 1e-6;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// How close (relative to the mass involved) the reference's decisions for
// this row come to flipping: the top-p comparisons, the min-p comparisons and
// the draw's u * Z' against every running sum. Follows reference::sample.
double closest_decision(const float* logits, int64_t n, const SamplingRow& c) {
  std::vector<float> s(static_cast<size_t>(n)), w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[i] = std::isnan(logits[i]) ? -kInf : logits[i] / c.temperature;
  const float m = *std::max_element(s.begin(), s.end());
  for (int64_t i = 0; i < n; ++i) w[i] = s[i] == m ? 1.0f : std::exp(s[i] - m);
  std::vector<int64_t> rank(static_cast<size_t>(n));
  std::iota(rank.begin(), rank.end(), 0);
  std::sort(rank.begin(), rank.end(), [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  std::vector<bool> kept(static_cast<size_t>(n), true);
  double closest = std::numeric_limits<double>::infinity();
  if (c.top_k > 0 && c.top_k < n)
    for (int64_t r = c.top_k; r < n; ++r) kept[rank[r]] = false;
  if (c.top_p < 1.0f) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i)
      if (kept[i]) total += w[i];
    double before = 0.0;
    bool first = true;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = rank[r];
      if (!kept[i]) continue;
      if (!first) closest = std::min(closest, std::abs(before - c.top_p * total) / total);
      if (!first && !(before < c.top_p * total)) kept[i] = false;
      before += w[i];
      first = false;
    }
  }
  if (c.min_p > 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      if (!kept[i]) continue;
      closest = std::min(closest, std::abs(static_cast<double>(w[i]) - c.min_p) / c.min_p);
      if (w[i] < c.min_p) kept[i] = false;
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i)
    if (kept[i]) total += w[i];
  const double target = static_cast<double>(sampling_uniform(c.seed, c.step)) * total;
  double running = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!kept[i]) continue;
    running += w[i];
    closest = std::min(closest, std::abs(running - target) / total);
  }
  return closest;
}

// Random rows: normal logits of varied spread; every fourth row rounded to
// quarters (many exact ties); some masked with -inf; one all -inf, one
// with NaN, one with +inf, one all NaN.
Tensor random_logits(TestRng& rng, int64_t rows, int64_t vocab) {
  Tensor x = Tensor::empty({rows, vocab}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data<float>() + r * vocab;
    const float spread = rng.uniform(0.5f, 6.0f);
    for (int64_t i = 0; i < vocab; ++i) row[i] = rng.normal(spread);
    switch (r % 8) {
      case 1:
        for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 4.0f) / 4.0f;
        break;
      case 2:
        for (int64_t i = 0; i < vocab; ++i)
          if (rng.integer(0, 2) == 0) row[i] = -kInf;
        break;
      case 3:
        row[rng.integer(0, vocab - 1)] = std::numeric_limits<float>::quiet_NaN();
        row[rng.integer(0, vocab - 1)] = -kInf;
        break;
      case 5:
        if (r % 16 == 5) std::fill(row, row + vocab, -kInf);
        else row[rng.integer(0, vocab - 1)] = kInf;
        break;
      case 7:
        if (r % 32 == 7) std::fill(row, row + vocab, std::numeric_limits<float>::quiet_NaN());
        else std::fill(row, row + vocab, std::round(spread));  // every token tied
        break;
      default: break;
    }
  }
  return x;
}

SamplingRow random_controls(TestRng& rng, int64_t vocab) {
  const float temperatures[] = {0.0f, 0.01f, 0.7f, 1.0f, 1.0f, 10.0f};
  const int top_ks[] = {0, 0, 1, 50, static_cast<int>(vocab), static_cast<int>(vocab) + 5, 2};
  const float top_ps[] = {1.0f, 1.0f, 1e-6f, 0.5f, 0.95f};
  const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.5f, 1.0f};
  SamplingRow c;
  c.temperature = temperatures[rng.integer(0, 5)];
  c.top_k = top_ks[rng.integer(0, 6)];
  c.top_p = top_ps[rng.integer(0, 4)];
  c.min_p = min_ps[rng.integer(0, 4)];
  c.seed = rng.engine()();
  c.step = static_cast<uint64_t>(rng.integer(0, 100000));
  return c;
}

TEST(CudaSampling, MatchesCpuBackendButAtBoundaries) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  int64_t compared = 0, excused = 0;
  for (auto [vocab, rows] : {std::pair<int64_t, int64_t>{1, 8}, {5, 64}, {1000, 256}, {1024, 64}, {1025, 64},
                             {32000, 64}, {128256, 48}, {151936, 32}}) {
    const Tensor logits = random_logits(rng, rows, vocab);
    const Tensor device_logits = cuda_to_device(logits);
    std::vector<SamplingRow> controls(static_cast<size_t>(rows));
    for (SamplingRow& c : controls) c = random_controls(rng, vocab);
    for (int round = 0; round < 6; ++round) {
      for (SamplingRow& c : controls) c.step += 1;
      Tensor want = Tensor::empty({rows}, DType::kI32);
      cpu.sample(logits, controls, want);
      Tensor out = cuda_empty({rows}, DType::kI32);
      cuda_fill_bytes(out, 0xFF);
      gpu.sample(device_logits, controls, out);
      const Tensor got = cuda_to_host(out);
      for (int64_t r = 0; r < rows; ++r) {
        const SamplingRow& c = controls[static_cast<size_t>(r)];
        const int32_t g = got.data<int32_t>()[r], w = want.data<int32_t>()[r];
        ++compared;
        ASSERT_TRUE(g >= 0 && g < vocab) << "vocab " << vocab << " row " << r << " token " << g;
        if (g == w) continue;
        const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " temperature " +
                                 std::to_string(c.temperature) + " top_k " + std::to_string(c.top_k) + " top_p " +
                                 std::to_string(c.top_p) + " min_p " + std::to_string(c.min_p) + " seed " +
                                 std::to_string(c.seed) + " step " + std::to_string(c.step) + ": device " +
                                 std::to_string(g) + ", cpu " + std::to_string(w);
        ASSERT_NE(c.temperature, 0.0f) << "greedy rows never differ; " << what;
        const double closest = closest_decision(logits.data<float>() + r * vocab, vocab, c);
        EXPECT_LT(closest, kNear) << what << " (closest decision " << closest << ")";
        ++excused;
      }
    }
  }
  // Boundary cases are rare: a handful at most among thousands of rows.
  EXPECT_LT(excused * 100, compared) << excused << " of " << compared;
}

TEST(CudaSampling, GreedyIsTheArgmaxAlways) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  for (int64_t vocab : {1, 5, 1000, 128256, 151936}) {
    const int64_t rows = 64;
    Tensor logits = random_logits(rng, rows, vocab);
    // Ties at the top: the lowest index wins; -0 and +0 tie.
    float* l = logits.data<float>();
    l[0] = l[vocab - 1] = 1e30f;
    if (vocab > 2) {
      l[vocab + 1] = -0.0f;
      for (int64_t i = 2; i < vocab; ++i) l[vocab + i] = i % 3 == 0 ? 0.0f : -1.0f;
      l[vocab] = -kInf;
    }
    std::vector<SamplingRow> controls(static_cast<size_t>(rows));
    for (SamplingRow& c : controls) c = {.temperature = 0.0f, .seed = rng.engine()()};
    Tensor want = Tensor::empty({rows}, DType::kI32);
    cpu.sample(logits, controls, want);
    Tensor out = cuda_empty({rows}, DType::kI32);
    gpu.sample(cuda_to_device(logits), controls, out);
    const Tensor got = cuda_to_host(out);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got.data<int32_t>()[r], want.data<int32_t>()[r]) << "vocab " << vocab << " row " << r;
  }
}

TEST(CudaSampling, DeterministicAndSingleTokenCutsExact) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  const int64_t vocab = 128256, rows = 16;
  const Tensor logits = random_logits(rng, rows, vocab);
  const Tensor device_logits = cuda_to_device(logits);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<SamplingRow> controls(static_cast<size_t>(rows));
    for (SamplingRow& c : controls) c = random_controls(rng, vocab);
    Tensor a = cuda_empty({rows}, DType::kI32), b = cuda_empty({rows}, DType::kI32);
    gpu.sample(device_logits, controls, a);
    gpu.sample(device_logits, controls, b);
    Tensor want = Tensor::empty({rows}, DType::kI32);
    cpu.sample(logits, controls, want);
    const Tensor ha = cuda_to_host(a), hb = cuda_to_host(b);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(ha.data<int32_t>()[r], hb.data<int32_t>()[r]) << "run to run, row " << r;
      // top_k 1 and top_p 1e-6 keep one token: no draw, no boundary.
      const SamplingRow& c = controls[static_cast<size_t>(r)];
      if (c.temperature == 0.0f || c.top_k == 1 || c.top_p == 1e-6f) {
        EXPECT_EQ(ha.data<int32_t>()[r], want.data<int32_t>()[r])
            << "row " << r << " temperature " << c.temperature << " top_k " << c.top_k << " top_p " << c.top_p;
      }
    }
  }
}

TEST(CudaLogitOps, AdjustLogitsMatchesCpu) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 5}, {7, 1000}, {33, 128256}}) {
    Tensor x = random_logits(rng, rows, cols);
    std::vector<LogitEdit> edits;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; c += rng.integer(1, 40)) {
        LogitEdit e{.row = static_cast<int32_t>(r), .token = static_cast<int32_t>(c)};
        if (rng.integer(0, 1)) e.bias = rng.uniform(-100.0f, 100.0f);
        if (rng.integer(0, 1)) e.repetition = rng.uniform(0.3f, 3.0f);
        if (rng.integer(0, 1)) e.subtract = rng.uniform(-4.0f, 4.0f);
        e.suppress = rng.integer(0, 9) == 0;
        edits.push_back(e);
      }
    Tensor device_x = cuda_to_device(x);
    gpu.adjust_logits(device_x, edits);
    cpu.adjust_logits(x, edits);
    const Tensor got = cuda_to_host(device_x);
    for (int64_t i = 0; i < x.numel(); ++i)
      // NaN rows stay NaN; the payload bits are the hardware's (the GPU
      // makes a canonical NaN where the CPU carries the input's).
      ASSERT_TRUE(same_bits(got.data<float>()[i], x.data<float>()[i]) ||
                  (std::isnan(got.data<float>()[i]) && std::isnan(x.data<float>()[i])))
          << rows << "x" << cols << " at " << i;
    // Bad edits throw before anything is enqueued.
    edits.push_back(edits.front());
    EXPECT_THROW(gpu.adjust_logits(device_x, edits), Error);
    gpu.adjust_logits(device_x, std::vector<LogitEdit>{});
  }
}

TEST(CudaLogitOps, TokenBitmaskMatchesCpu) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 5}, {7, 1000}, {33, 128256}}) {
    Tensor x = random_logits(rng, rows, cols);
    const int64_t words = (cols + 31) / 32;
    Tensor mask = Tensor::empty({rows, words}, DType::kI32);
    for (int64_t i = 0; i < mask.numel(); ++i)
      mask.data<int32_t>()[i] = rng.integer(0, 3) == 0 ? -1 : static_cast<int32_t>(rng.integer(0, 1 << 30) * 3);
    Tensor device_x = cuda_to_device(x);
    gpu.apply_token_bitmask(device_x, cuda_to_device(mask));
    cpu.apply_token_bitmask(x, mask);
    const Tensor got = cuda_to_host(device_x);
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_TRUE(same_bits(got.data<float>()[i], x.data<float>()[i]) ||
                  (std::isnan(got.data<float>()[i]) && std::isnan(x.data<float>()[i])))
          << rows << "x" << cols << " at " << i;
  }
}

TEST(CudaLogitOps, TopKRowsAndGatherRowsMatchCpu) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  CudaBackend gpu;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 1}, {5, 5}, {64, 1000}, {9, 128256}, {4, 151936}}) {
    Tensor x = random_logits(rng, rows, cols);
    // log_softmax-like rows of ties too: whole rows of a few values.
    for (int64_t i = 0; i < cols; ++i) x.data<float>()[i] = static_cast<float>(-(i % 3));
    const Tensor device_x = cuda_to_device(x);
    for (int k : {1, 2, 5, 20, 64}) {
      if (k > cols) continue;
      Tensor values = Tensor::empty({rows, k}, DType::kF32), ids = Tensor::empty({rows, k}, DType::kI32);
      cpu.top_k_rows(x, k, values, ids);
      Tensor dv = cuda_empty({rows, k}, DType::kF32), di = cuda_empty({rows, k}, DType::kI32);
      cuda_fill_bytes(dv, 0xFF);
      cuda_fill_bytes(di, 0xFF);
      gpu.top_k_rows(device_x, k, dv, di);
      const Tensor hv = cuda_to_host(dv), hi = cuda_to_host(di);
      for (int64_t i = 0; i < rows * k; ++i) {
        ASSERT_EQ(hi.data<int32_t>()[i], ids.data<int32_t>()[i]) << rows << "x" << cols << " k " << k << " at " << i;
        ASSERT_TRUE(same_bits(hv.data<float>()[i], values.data<float>()[i]));
      }
    }
    std::vector<int32_t> picks;
    for (int64_t r = 0; r < rows; ++r) picks.push_back(static_cast<int32_t>(rng.integer(0, cols - 1)));
    const Tensor host_cols = testing::i32_tensor(picks);
    Tensor want = Tensor::empty({rows}, DType::kF32);
    cpu.gather_rows(x, host_cols, want);
    Tensor out = cuda_empty({rows}, DType::kF32);
    gpu.gather_rows(device_x, cuda_to_device(host_cols), out);
    const Tensor got = cuda_to_host(out);
    for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(same_bits(got.data<float>()[r], want.data<float>()[r]));
  }
}

}  // namespace
}  // namespace basalt
