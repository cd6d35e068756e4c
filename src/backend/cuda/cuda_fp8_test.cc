// cuda_quantize_fp8_groups against a host reference that applies the same
// rule (fp8.h) with the project's own e4m3 conversion (core/dtype.h): q and
// scales must be equal bit for bit, and the dequantized values within half
// an e4m3 ulp of x. f32 and bf16 inputs, partial last groups, all-zero
// groups and rows of very large and very small magnitude.
//
// The block-FP8 linear (fp8_linear.h), each path forced (the streaming
// kernel at both pipeline depths, cuBLASLt where it takes the shape, the
// TMA-fed wgmma kernel where the device has it) and
// automatic through CudaBackend, against (1) a host reference that quantizes
// the activations by the same rule, to f32 rounding, and (2) the CPU
// backend's linear_fp8_block (unquantized activations), within the bound
// the activation quantization gives. Odd token counts, partial weight
// blocks in N and K, N not a multiple of 4, K not a multiple of 16, f32 and
// bf16 in and out, and a record + replay. Skips where no device is present.
#include "backend/cuda/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/fp8_linear.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

struct HostQuantized {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};

// The rule of fp8.h, element by element: scale = amax / 448, or 1 where that
// is not > 0; q = f32_to_fp8e4m3(x / scale).
HostQuantized quantize_reference(const Tensor& x_f32) {
  const int64_t rows = x_f32.dim(0), cols = x_f32.dim(1);
  const int64_t groups = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  const float* x = x_f32.data<const float>();
  HostQuantized out;
  out.q.resize(static_cast<size_t>(rows * cols));
  out.scales.resize(static_cast<size_t>(rows * groups));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kFp8BlockSize, end = std::min(cols, begin + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      float scale = amax / 448.0f;
      if (!(scale > 0.0f)) scale = 1.0f;
      out.scales[static_cast<size_t>(r * groups + g)] = scale;
      for (int64_t c = begin; c < end; ++c)
        out.q[static_cast<size_t>(r * cols + c)] = f32_to_fp8e4m3(x[r * cols + c] / scale);
    }
  return out;
}

// Random rows whose magnitudes vary by row: ordinary, huge, tiny (the
// quotients reach e4m3's subnormals), zero in places, and all-zero groups.
Tensor test_input(TestRng& rng, int64_t rows, int64_t cols, DType dtype) {
  Tensor x = Tensor::empty({rows, cols}, dtype);
  const float magnitude[] = {1.0f, 3e4f, 2e-6f, 1.0f, 0.05f};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = rng.normal(magnitude[r % 5]);
      if (r % 7 == 3 && c < kFp8BlockSize) v = 0.0f;  // an all-zero first group
      if (rng.integer(0, 15) == 0) v = 0.0f;
      // One element in 32 far below the group's largest: e4m3 subnormals.
      if (rng.integer(0, 31) == 0) v *= 1e-3f;
      testing::store_value(x, r * cols + c, v);
    }
  return x;
}

TEST(CudaFp8, QuantizeGroupsMatchesHostReference) {
  REQUIRE_DEVICE();
  TestRng rng;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 7}, {5, 128}, {3, 129}, {9, 300}, {17, 7168}, {64, 2048},
                                                {2, 1536}, {33, 576}};
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (auto [rows, cols] : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
      const Tensor x = test_input(rng, rows, cols, dtype);
      const Tensor x_f32 = x.to_f32();
      const HostQuantized want = quantize_reference(x_f32);
      const int64_t groups = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
      Tensor q = cuda_empty({rows, cols}, DType::kF8E4M3);
      Tensor scales = cuda_empty({rows, groups}, DType::kF32);
      cuda_fill_bytes(q, 0xFF);  // e4m3 NaN
      cuda_fill_bytes(scales, 0xFF);
      cuda_quantize_fp8_groups(cuda_to_device(x), q, scales);
      const Tensor got_q = cuda_to_host(q), got_scales = cuda_to_host(scales);
      const uint8_t* gq = static_cast<const uint8_t*>(got_q.raw());
      const float* gs = got_scales.data<const float>();
      const float* xs = x_f32.data<const float>();
      int64_t q_mismatches = 0, scale_mismatches = 0, far = 0;
      for (int64_t i = 0; i < rows * groups; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &gs[i], 4);
        std::memcpy(&b, &want.scales[static_cast<size_t>(i)], 4);
        if (a != b && ++scale_mismatches <= 5)
          ADD_FAILURE() << "scale " << i << ": got " << gs[i] << ", want " << want.scales[static_cast<size_t>(i)];
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          if (gq[i] != want.q[static_cast<size_t>(i)] && ++q_mismatches <= 5)
            ADD_FAILURE() << "q [" << r << ", " << c << "] of x " << xs[i] << ": got 0x" << std::hex << int{gq[i]}
                          << ", want 0x" << int{want.q[static_cast<size_t>(i)]} << std::dec;
          // Half an e4m3 ulp: 2^-4 relative among normals, a fixed
          // scale * 2^-10 among subnormals, plus the division's rounding.
          const float scale = gs[r * groups + c / kFp8BlockSize];
          const double back = static_cast<double>(fp8e4m3_to_f32(gq[i])) * scale;
          const double bound = std::max(std::fabs(xs[i]) * 0.0625, scale * 0x1p-10) * (1 + 1e-6);
          if (!(std::fabs(back - xs[i]) <= bound) && ++far <= 5)
            ADD_FAILURE() << "[" << r << ", " << c << "]: x " << xs[i] << " dequantizes to " << back;
        }
      EXPECT_EQ(scale_mismatches, 0);
      EXPECT_EQ(q_mismatches, 0);
      EXPECT_EQ(far, 0);
      // The largest element of each non-zero group maps to +-448.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < groups; ++g) {
          uint8_t top = 0;
          for (int64_t c = g * kFp8BlockSize; c < std::min(cols, (g + 1) * kFp8BlockSize); ++c)
            top = std::max<uint8_t>(top, gq[r * cols + c] & 0x7f);
          if (gs[r * groups + g] != 1.0f || top != 0) {
            EXPECT_EQ(top, 0x7e) << "row " << r << " group " << g;
          }
        }
    }
}

TEST(CudaFp8, QuantizeGroupsRejectsBadShapesAndPlacement) {
  REQUIRE_DEVICE();
  const Tensor x = cuda_to_device(Tensor::zeros({2, 200}, DType::kF32));
  Tensor q = cuda_empty({2, 200}, DType::kF8E4M3), scales = cuda_empty({2, 2}, DType::kF32);
  Tensor short_scales = cuda_empty({2, 1}, DType::kF32), bf16_q = cuda_empty({2, 200}, DType::kBF16);
  Tensor host_scales = Tensor::zeros({2, 2}, DType::kF32);
  EXPECT_THROW(cuda_quantize_fp8_groups(x, q, short_scales), Error);
  EXPECT_THROW(cuda_quantize_fp8_groups(x, bf16_q, scales), Error);
  EXPECT_THROW(cuda_quantize_fp8_groups(x, q, host_scales), Error);
  const Tensor f16 = cuda_to_device(Tensor::zeros({2, 200}, DType::kF16));
  EXPECT_THROW(cuda_quantize_fp8_groups(f16, q, scales), Error);
  // All zeros: scale 1 and q +0 everywhere.
  cuda_quantize_fp8_groups(x, q, scales);
  const Tensor got_q = cuda_to_host(q), got_scales = cuda_to_host(scales);
  for (int64_t i = 0; i < 400; ++i) EXPECT_EQ(static_cast<const uint8_t*>(got_q.raw())[i], 0);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got_scales.data<const float>()[i], 1.0f);
}


// --- Block-FP8 linear --------------------------------------------------------

struct Fp8Weight {
  Tensor w;          // host f8_e4m3 [N, K]
  Tensor scale_inv;  // host f32 [ceil(N/128), ceil(K/128)]
};

// Random e4m3 weights (normal, spread 1, rounded to e4m3) and block scales
// between 2^-9 and 2^-6, as checkpoints have them.
Fp8Weight random_fp8_weight(TestRng& rng, int64_t n, int64_t k) {
  const int64_t nb = (n + kFp8BlockSize - 1) / kFp8BlockSize, kb = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  Fp8Weight out{testing::random_tensor(rng, {n, k}, DType::kF8E4M3), Tensor::empty({nb, kb}, DType::kF32)};
  for (int64_t i = 0; i < nb * kb; ++i) out.scale_inv.data<float>()[i] = std::ldexp(rng.uniform(1.0f, 2.0f), -9 + static_cast<int>(rng.integer(0, 2)));
  return out;
}

// Per output element: the value the GPU must reproduce with quantized
// activations (`quantized`), the CPU backend's operand scale sum_k |x| |w|
// (`magnitude`), and the bound on what quantizing x may change (`bound`).
struct LinearReference {
  std::vector<double> quantized, magnitude, bound;
};

LinearReference linear_reference(const Tensor& x_f32, const Fp8Weight& w) {
  const int64_t T = x_f32.dim(0), K = x_f32.dim(1), N = w.w.dim(0);
  const int64_t kb = (K + kFp8BlockSize - 1) / kFp8BlockSize;
  const HostQuantized q = quantize_reference(x_f32);
  const float* x = x_f32.data<const float>();
  const uint8_t* wq = w.w.data<const uint8_t>();
  const float* ws = w.scale_inv.data<const float>();
  std::vector<float> wf(static_cast<size_t>(N * K)), qf(static_cast<size_t>(T * K));
  for (int64_t i = 0; i < N * K; ++i) wf[static_cast<size_t>(i)] = fp8e4m3_to_f32(wq[i]);
  for (int64_t i = 0; i < T * K; ++i) qf[static_cast<size_t>(i)] = fp8e4m3_to_f32(q.q[static_cast<size_t>(i)]);
  LinearReference ref;
  ref.quantized.assign(static_cast<size_t>(T * N), 0.0);
  ref.magnitude.assign(static_cast<size_t>(T * N), 0.0);
  ref.bound.assign(static_cast<size_t>(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double total = 0, magnitude = 0, bound = 0;
      for (int64_t b = 0; b < kb; ++b) {
        const double act_scale = q.scales[static_cast<size_t>(t * kb + b)];
        const double w_scale = ws[(n / kFp8BlockSize) * kb + b];
        double block = 0, block_magnitude = 0, block_bound = 0;
        for (int64_t k = b * kFp8BlockSize; k < std::min(K, (b + 1) * kFp8BlockSize); ++k) {
          const double wv = wf[static_cast<size_t>(n * K + k)], xv = x[t * K + k];
          block += static_cast<double>(qf[static_cast<size_t>(t * K + k)]) * wv;
          block_magnitude += std::fabs(xv * wv);
          // Half an e4m3 ulp of x / scale, back in x's units (fp8.h).
          block_bound += std::max(std::fabs(xv) * 0x1p-4, act_scale * 0x1p-10) * std::fabs(wv);
        }
        total += block * act_scale * w_scale;
        magnitude += block_magnitude * w_scale;
        bound += block_bound * w_scale;
      }
      ref.quantized[static_cast<size_t>(t * N + n)] = total;
      ref.magnitude[static_cast<size_t>(t * N + n)] = magnitude;
      ref.bound[static_cast<size_t>(t * N + n)] = bound;
    }
  return ref;
}

// Counts (and reports the first few) elements of `got` farther than
// tolerance(i) from want(i); keeps in *worst the largest |got - want| /
// norm(i) seen.
int64_t count_far(const Tensor& got_host, const std::function<double(int64_t)>& want,
                  const std::function<double(int64_t)>& tolerance, const std::function<double(int64_t)>& norm,
                  double* worst, const std::string& what) {
  const Tensor got = got_host.to_f32();
  int64_t far = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<const float>()[i], w = want(i), tol = tolerance(i);
    if (norm(i) > 0) *worst = std::max(*worst, std::fabs(g - w) / norm(i));
    if (!(std::fabs(g - w) <= tol) && ++far <= 5)
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w << " (tolerance " << tol << ")";
  }
  return far;
}

// The FP8 tensor cores of Hopper keep about 14 bits while they accumulate
// (DeepSeek-V3 report, 3.3.2; hence the f32 promotion every 128 columns that
// both paths do): a block's sum may be off by a few 2^-14 of its operand
// scale sum |q| |w|. 3e-4 (~2^-11.7) of the row's sum_k |x| |w| covers that
// with room; a wrong scale, layout or column pairing is off by O(1).
constexpr double kAccumulation = 3e-4;

TEST(CudaFp8, LinearMatchesReferencesOnEveryPath) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaFp8Linear fp8;
  CudaBackend backend;
  CpuBackend cpu;
  // N x K: partial blocks in both with K not a multiple of 16 (no vector
  // loads; cuBLASLt declines); N not a multiple of 4; K blocks not a multiple
  // of 4 (cuBLASLt gets padded weight scales); a partial K block that is a
  // multiple of 16; whole blocks.
  const std::pair<int64_t, int64_t> shapes[] = {{300, 520}, {258, 384}, {256, 640}, {200, 336}, {512, 1024}};
  const int64_t token_counts[] = {1, 2, 3, 7, 16, 17, 64, 129};
  int64_t cublas_runs = 0;
  std::map<std::string, std::pair<double, double>> worst;  // path -> (vs quantized, vs CPU) / magnitude
  for (auto [N, K] : shapes) {
    const Fp8Weight w = random_fp8_weight(rng, N, K);
    const Tensor w_dev = cuda_to_device(w.w), s_dev = cuda_to_device(w.scale_inv);
    std::string cublas_took;
    for (int64_t T : token_counts)
      for (DType x_dtype : {DType::kF32, DType::kBF16}) {
        const Tensor x = testing::random_tensor(rng, {T, K}, x_dtype, 2.0f);
        const Tensor x_f32 = x.to_f32();
        const LinearReference ref = linear_reference(x_f32, w);
        Tensor cpu_out = Tensor::empty({T, N}, DType::kF32);
        cpu.linear_fp8_block(x_f32, w.w, w.scale_inv, cpu_out);
        const float* cpu_values = cpu_out.data<const float>();
        const Tensor x_dev = cuda_to_device(x);
        for (DType out_dtype : {DType::kF32, DType::kBF16}) {
          // A bf16 result is the f32 sum rounded once: half a bf16 ulp more.
          const double rounding = out_dtype == DType::kBF16 ? 0x1p-8 : 0.0;
          struct Run {
            const char* name;
            Fp8LinearPath path;
            int variant;
          };
          const Run runs[] = {{"streaming depth 2", Fp8LinearPath::kStreaming, 1},
                              {"streaming depth 4", Fp8LinearPath::kStreaming, 2},
                              {"cublas", Fp8LinearPath::kCublas, 0},
                              {"wgmma", Fp8LinearPath::kWgmma, 1},
                              {"wgmma pair", Fp8LinearPath::kWgmma, 2},
                              {"auto (backend)", Fp8LinearPath::kAuto, 0}};
          for (const Run& run : runs) {
            Tensor out = cuda_empty({T, N}, out_dtype);
            cuda_fill_bytes(out, 0xFF);
            if (run.path == Fp8LinearPath::kCublas) {
              if (!fp8.cublas_takes(T, N, K, out_dtype, w_dev.raw(), out.raw())) continue;
              ++cublas_runs;
              if (out_dtype == DType::kF32 && x_dtype == DType::kF32) cublas_took += " " + std::to_string(T);
            }
            if (run.path == Fp8LinearPath::kWgmma && !CudaFp8Linear::wgmma_takes(T, N, K, out_dtype, w_dev.raw()))
              continue;
            if (run.path == Fp8LinearPath::kAuto)
              backend.linear_fp8_block(x_dev, w_dev, s_dev, out);
            else
              fp8.linear(x_dev, w_dev, s_dev, out, nullptr, run.path, run.variant);
            const Tensor got = cuda_to_host(out);
            const std::string what = std::string(run.name) + " " + std::string(dtype_name(x_dtype)) + "->" +
                                     std::string(dtype_name(out_dtype)) + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
                                     " K=" + std::to_string(K);
            const auto magnitude = [&](int64_t i) { return ref.magnitude[static_cast<size_t>(i)]; };
            auto& [worst_quantized, worst_cpu] = worst[run.name];
            // (1) Same quantization: only the accumulation differs (above).
            EXPECT_EQ(count_far(
                          got, [&](int64_t i) { return ref.quantized[static_cast<size_t>(i)]; },
                          [&](int64_t i) {
                            const size_t j = static_cast<size_t>(i);
                            return kAccumulation * ref.magnitude[j] + rounding * std::fabs(ref.quantized[j]) + 1e-30;
                          },
                          magnitude, &worst_quantized, what + " vs quantized reference"),
                      0);
            // (2) The CPU backend multiplies unquantized x: the difference is
            // the quantization error of x, at most half an e4m3 ulp per
            // element, max(|x| 2^-4, act_scale 2^-10), times |w| summed
            // (ref.bound: rigorous), plus the accumulation error of (1).
            EXPECT_EQ(count_far(
                          got, [&](int64_t i) { return static_cast<double>(cpu_values[i]); },
                          [&](int64_t i) {
                            const size_t j = static_cast<size_t>(i);
                            return ref.bound[j] + kAccumulation * ref.magnitude[j] +
                                   rounding * std::fabs(cpu_values[i]) + 1e-30;
                          },
                          magnitude, &worst_cpu, what + " vs CPU backend"),
                      0);
          }
        }
      }
    std::printf("[ fp8 linear ] N=%lld K=%lld: cuBLASLt took T =%s\n", static_cast<long long>(N),
                static_cast<long long>(K), cublas_took.empty() ? " (none)" : cublas_took.c_str());
  }
  std::printf("[ fp8 linear ] %lld cuBLASLt runs\n", static_cast<long long>(cublas_runs));
  // sm_90 is the backend's target: cuBLASLt's block-scaled FP8 must take at
  // least the whole-block shapes (512 x 1024 at T = 16, 64).
  EXPECT_GT(cublas_runs, 0) << "cuBLASLt declined every shape: the prefill path never ran";
  for (const auto& [name, w] : worst)
    std::printf("[ fp8 linear ] %-18s max |err| / sum|x||w|: %.2e vs quantized reference, %.2e vs CPU backend\n",
                name.c_str(), w.first, w.second);
}

// The wgmma kernel past one tile: several 192-row tiles (the last partial),
// more column blocks than one group of the walk (the last group narrower),
// an odd count of column blocks (a cluster's second CTA past N), a K long
// enough that the ring of stages wraps within a tile; the same bits from
// clusters of one CTA and from a CUDA graph's replays.
TEST(CudaFp8, WgmmaLinearWalksTilesAndColumnGroups) {
  REQUIRE_DEVICE();
  if (!CudaFp8Linear::wgmma_takes(1, 128, 128, DType::kF32, nullptr))
    GTEST_SKIP() << "no sm_90a wgmma on this device";
  TestRng rng;
  CudaFp8Linear fp8;
  CudaBackend backend;
  struct Case {
    int64_t T, N, K;
  };
  // N 2200: 18 column blocks (groups of 16 and 2), the last 24 columns wide.
  const Case cases[] = {{400, 2200, 256}, {193, 136, 2304}, {385, 264, 1040}};
  for (const Case& c : cases) {
    const std::string what =
        "T=" + std::to_string(c.T) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
    SCOPED_TRACE(what);
    const Fp8Weight w = random_fp8_weight(rng, c.N, c.K);
    const Tensor w_dev = cuda_to_device(w.w), s_dev = cuda_to_device(w.scale_inv);
    const Tensor x = testing::random_tensor(rng, {c.T, c.K}, DType::kF32, 2.0f);
    const LinearReference ref = linear_reference(x, w);
    const Tensor x_dev = cuda_to_device(x);
    Tensor out = cuda_empty({c.T, c.N}, DType::kF32);
    cuda_fill_bytes(out, 0xFF);
    fp8.linear(x_dev, w_dev, s_dev, out, nullptr, Fp8LinearPath::kWgmma, 2);
    const Tensor got = cuda_to_host(out);
    double worst = 0;
    EXPECT_EQ(count_far(
                  got, [&](int64_t i) { return ref.quantized[static_cast<size_t>(i)]; },
                  [&](int64_t i) { return kAccumulation * ref.magnitude[static_cast<size_t>(i)] + 1e-30; },
                  [&](int64_t i) { return ref.magnitude[static_cast<size_t>(i)]; }, &worst, what),
              0);
    std::printf("[ fp8 wgmma ] %s: max |err| / sum|x||w| %.2e\n", what.c_str(), worst);
    // One CTA per column block: the same products in the same order.
    Tensor single = cuda_empty({c.T, c.N}, DType::kF32);
    cuda_fill_bytes(single, 0xFF);
    fp8.linear(x_dev, w_dev, s_dev, single, nullptr, Fp8LinearPath::kWgmma, 1);
    EXPECT_TRUE(testing::bytes_equal(got, cuda_to_host(single))) << "clusters of one and two CTAs differ";

    Tensor replayed = cuda_empty({c.T, c.N}, DType::kF32);
    cuda_fill_bytes(replayed, 0xFF);
    auto graph = backend.record(
        [&] { fp8.linear(x_dev, w_dev, s_dev, replayed, backend.stream(), Fp8LinearPath::kWgmma, 2); });
    ASSERT_TRUE(graph);
    graph->replay();
    graph->replay();
    backend.synchronize();
    EXPECT_TRUE(testing::bytes_equal(got, cuda_to_host(replayed))) << "the replay differs from the eager call";
  }
  // What it does not take is refused before any launch.
  const Tensor x = cuda_empty({4, 136}, DType::kF32), w = cuda_empty({64, 136}, DType::kF8E4M3);
  const Tensor s = cuda_empty({1, 2}, DType::kF32);
  Tensor out = cuda_empty({4, 64}, DType::kF32);
  EXPECT_THROW(fp8.linear(x, w, s, out, nullptr, Fp8LinearPath::kWgmma), Error);  // K % 16 != 0
  Tensor out16 = cuda_empty({4, 64}, DType::kBF16);
  const Tensor x2 = cuda_empty({4, 128}, DType::kF32), w2 = cuda_empty({64, 128}, DType::kF8E4M3);
  const Tensor s2 = cuda_empty({1, 1}, DType::kF32);
  EXPECT_THROW(fp8.linear(x2, w2, s2, out16, nullptr, Fp8LinearPath::kWgmma), Error);  // bf16 out
}

TEST(CudaFp8, LinearRecordsAndReplays) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend backend;
  const int64_t N = 512, K = 1024;
  const Fp8Weight w = random_fp8_weight(rng, N, K);
  const Tensor w_dev = cuda_to_device(w.w), s_dev = cuda_to_device(w.scale_inv);
  for (int64_t T : {2, 64}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const Tensor x = cuda_to_device(testing::random_tensor(rng, {T, K}, DType::kF32));
    Tensor eager = cuda_empty({T, N}, DType::kF32), replayed = cuda_empty({T, N}, DType::kF32);
    backend.linear_fp8_block(x, w_dev, s_dev, eager);
    cuda_fill_bytes(replayed, 0xFF);
    auto graph = backend.record([&] { backend.linear_fp8_block(x, w_dev, s_dev, replayed); });
    graph->replay();
    graph->replay();
    const Tensor a = cuda_to_host(eager), b = cuda_to_host(replayed);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "the replay differs from the eager call";
  }
}

// Fp8Compute::kW8A16 (weight-only): the product of the unquantized
// activations and the dequantized weights, as the CPU backend computes it,
// up to bf16 rounding of both operands (each 2^-9 relative: 2^-7 of the
// row's sum_k |x| |w| leaves room); the default w8a8 is farther (its e4m3
// activations lose up to 2^-4 each). The first call runs inside a graph
// capture (the bf16 copy is made on a private stream, not recorded).
TEST(CudaFp8, WeightOnlyIsTheCpuProductToBf16Rounding) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{200, 300}, {512, 1024}}) {
    const Fp8Weight w = random_fp8_weight(rng, N, K);
    const Tensor w_dev = cuda_to_device(w.w), s_dev = cuda_to_device(w.scale_inv);
    CudaBackend weight_only, w8a8;
    weight_only.set_fp8_compute(Fp8Compute::kW8A16);
    EXPECT_EQ(weight_only.fp8_compute(), Fp8Compute::kW8A16);
    EXPECT_EQ(w8a8.fp8_compute(), Fp8Compute::kW8A8);
    bool first = true;
    for (int64_t T : {1, 3, 37, 300}) {
      SCOPED_TRACE("N " + std::to_string(N) + ", K " + std::to_string(K) + ", T " + std::to_string(T));
      const Tensor x = testing::random_tensor(rng, {T, K}, DType::kF32);
      Tensor want = Tensor::empty({T, N}, DType::kF32);
      cpu.linear_fp8_block(x, w.w, w.scale_inv, want);
      const LinearReference ref = linear_reference(x, w);
      const Tensor x_dev = cuda_to_device(x);
      Tensor got = cuda_empty({T, N}, DType::kF32), quantized = cuda_empty({T, N}, DType::kF32);
      cuda_fill_bytes(got, 0xFF);
      if (first) {
        auto graph = weight_only.record([&] { weight_only.linear_fp8_block(x_dev, w_dev, s_dev, got); });
        ASSERT_TRUE(graph);
        graph->replay();
        first = false;
      } else {
        weight_only.linear_fp8_block(x_dev, w_dev, s_dev, got);
      }
      w8a8.linear_fp8_block(x_dev, w_dev, s_dev, quantized);
      weight_only.synchronize();
      w8a8.synchronize();
      const float* cpu_out = want.data<const float>();
      double worst = 0, worst_w8a8 = 0;
      auto magnitude = [&](int64_t i) { return ref.magnitude[static_cast<size_t>(i)]; };
      EXPECT_EQ(count_far(
                    cuda_to_host(got), [&](int64_t i) { return cpu_out[i]; },
                    [&](int64_t i) { return 0x1p-7 * magnitude(i); }, magnitude, &worst, "w8a16"),
                0);
      count_far(
          cuda_to_host(quantized), [&](int64_t i) { return cpu_out[i]; },
          [&](int64_t i) { return ref.bound[static_cast<size_t>(i)] + kAccumulation * magnitude(i); }, magnitude,
          &worst_w8a8, "w8a8");
      EXPECT_LT(worst * 4, worst_w8a8) << "weight-only " << worst << ", w8a8 " << worst_w8a8;
    }
  }
  // The CPU backend computes w8a16 only.
  EXPECT_THROW(cpu.set_fp8_compute(Fp8Compute::kW8A8), Error);
  cpu.set_fp8_compute(Fp8Compute::kW8A16);
}

TEST(CudaFp8, LinearRejectsBadShapes) {
  REQUIRE_DEVICE();
  CudaFp8Linear fp8;
  const Tensor x = cuda_to_device(Tensor::zeros({4, 256}, DType::kF32));
  const Tensor w = cuda_to_device(Tensor::zeros({128, 256}, DType::kF8E4M3));
  const Tensor s = cuda_to_device(Tensor::zeros({1, 2}, DType::kF32));
  Tensor out = cuda_empty({4, 128}, DType::kF32);
  const Tensor short_s = cuda_to_device(Tensor::zeros({1, 1}, DType::kF32));
  const Tensor bf16_w = cuda_to_device(Tensor::zeros({128, 256}, DType::kBF16));
  Tensor f16_out = cuda_empty({4, 128}, DType::kF16), wide_out = cuda_empty({4, 129}, DType::kF32);
  EXPECT_THROW(fp8.linear(x, w, short_s, out), Error);
  EXPECT_THROW(fp8.linear(x, bf16_w, s, out), Error);
  EXPECT_THROW(fp8.linear(x, w, s, f16_out), Error);
  EXPECT_THROW(fp8.linear(x, w, s, wide_out), Error);
  EXPECT_THROW(fp8.linear(Tensor::zeros({4, 256}, DType::kF32), w, s, out), Error);  // x on the host
  // cuBLASLt forced on a shape it does not take (T not a multiple of 4).
  const Tensor x3 = cuda_to_device(Tensor::zeros({3, 256}, DType::kF32));
  Tensor out3 = cuda_empty({3, 128}, DType::kF32);
  EXPECT_THROW(fp8.linear(x3, w, s, out3, nullptr, Fp8LinearPath::kCublas), Error);
  // All zeros in, zeros out.
  fp8.linear(x, w, s, out);
  const Tensor got = cuda_to_host(out);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data<const float>()[i], 0.0f);
}

}  // namespace
}  // namespace basalt
