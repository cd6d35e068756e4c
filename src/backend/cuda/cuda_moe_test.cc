// CudaBackend::moe_route against the CPU backend: DeepSeek-V3's router
// (sigmoid, bias, 8 groups of 32, 4 groups kept, top 8, normalized, x2.5),
// DeepSeek-V2-lite's (softmax, no groups), V2's (softmax, groups ranked by
// their best score), small and odd shapes, and inputs full of exact ties;
// T = 1, 7 and 4096. ids must be equal, weights within 1e-6 relative each.
//
// CudaBackend::moe_experts against the CPU backend and, for block-FP8
// experts, against a host reference that quantizes the activations exactly
// as the device does: bf16 and FP8 experts, T in {1, 3, 17, 300}, E in
// {1, 8, 64}, top_k in {1, 2, 8}, experts with no tokens, H and I multiples
// of 128 and not (partial FP8 blocks), x f32 and bf16; every tile size and
// both FP8 multiplies; the generic path (f32, f16 and mixed experts, rows
// not a multiple of 16 bytes); reproducible bits; recording into a CUDA
// graph. Outputs are poisoned before each call. Skips where no device is
// present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/moe_gemm_kernels.h"
#include "backend/cuda/tensor_map.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

// The CPU backend these tests compare with multiplies f32 activations as
// they are (its float32 mode): the CUDA generic expert path does, and the
// default mode would round them to bf16 first (cpu/linear.h).
CpuBackend exact_cpu() { return CpuBackend(&ThreadPool::global(), cpu::Bf16Activations::kF32); }

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

struct RouteCase {
  std::string name;
  int64_t experts;
  MoeRouteParams params;
  bool with_bias;
};

const MoeRouteParams kV3{MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f};
const MoeRouteParams kV2Lite{MoeScoring::kSoftmax, 6, 1, 1, false, 1.0f};
const MoeRouteParams kV2{MoeScoring::kSoftmax, 6, 8, 3, false, 16.0f};

const RouteCase kCases[] = {
    {"deepseek-v3", 256, kV3, true},
    {"deepseek-v2-lite", 64, kV2Lite, false},
    {"deepseek-v2 groups", 160, kV2, false},
    {"sigmoid groups without bias", 256, {MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f}, false},
    {"sigmoid, 16 groups of 1", 16, {MoeScoring::kSigmoid, 4, 16, 8, true, 1.0f}, true},
    {"softmax with bias, unnormalized", 40, {MoeScoring::kSoftmax, 5, 4, 2, false, 1.5f}, true},
    {"32 groups, top 32", 256, {MoeScoring::kSigmoid, 32, 32, 16, true, 1.0f}, true},
    {"one expert", 1, {MoeScoring::kSoftmax, 1, 1, 1, true, 1.0f}, false},
    {"every expert", 24, {MoeScoring::kSigmoid, 24, 3, 3, true, 2.0f}, true},
};

// Runs both backends on the same inputs and compares.
void expect_same_route(CudaBackend& cuda, const Tensor& logits, const Tensor* bias, const MoeRouteParams& p) {
  CpuBackend cpu = exact_cpu();
  const int64_t T = logits.dim(0);
  Tensor want_ids = Tensor::empty({T, p.top_k}, DType::kI32);
  Tensor want_w = testing::poisoned({T, p.top_k});
  cpu.moe_route(logits, bias, p, want_ids, want_w);

  const Tensor d_logits = cuda_to_device(logits);
  const Tensor d_bias = bias ? cuda_to_device(*bias) : Tensor();
  Tensor ids = cuda_empty({T, p.top_k}, DType::kI32), w = cuda_empty({T, p.top_k}, DType::kF32);
  cuda_fill_bytes(ids, 0xFF);  // -1
  cuda_fill_bytes(w, 0xFF);    // NaN
  cuda.moe_route(d_logits, bias ? &d_bias : nullptr, p, ids, w);
  cuda.synchronize();
  const Tensor got_ids = cuda_to_host(ids), got_w = cuda_to_host(w);
  int reported = 0;
  for (int64_t i = 0; i < T * p.top_k && reported < 5; ++i) {
    const int32_t gi = got_ids.data<const int32_t>()[i], wi = want_ids.data<const int32_t>()[i];
    const float gw = got_w.data<const float>()[i], ww = want_w.data<const float>()[i];
    const bool id_ok = gi == wi;
    const bool w_ok = std::fabs(static_cast<double>(gw) - ww) <= 1e-6 * std::fabs(static_cast<double>(ww));
    if (!id_ok || !w_ok) {
      ++reported;
      ADD_FAILURE() << "token " << i / p.top_k << " slot " << i % p.top_k << ": id " << gi << " (cpu " << wi
                    << "), weight " << gw << " (cpu " << ww << ")";
    }
  }
}

TEST(CudaMoe, RouteMatchesCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (const RouteCase& c : kCases)
    for (int64_t T : {1, 7, 4096}) {
      SCOPED_TRACE(c.name + ", T = " + std::to_string(T));
      const Tensor logits = testing::random_tensor(rng, {T, c.experts}, DType::kF32, 2.0f);
      const Tensor bias = testing::random_tensor(rng, {c.experts}, DType::kF32, 0.05f);
      expect_same_route(cuda, logits, c.with_bias ? &bias : nullptr, c.params);
    }
}

// Logits and bias drawn from a handful of values: scores, biased scores and
// group values tie everywhere, so every choice rests on the lower-id rule.
TEST(CudaMoe, RouteTiesGoToTheLowerId) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (const RouteCase& c : kCases)
    for (int64_t T : {1, 7, 4096}) {
      SCOPED_TRACE(c.name + ", ties, T = " + std::to_string(T));
      Tensor logits = Tensor::empty({T, c.experts}, DType::kF32);
      for (int64_t i = 0; i < logits.numel(); ++i)
        logits.data<float>()[i] = static_cast<float>(rng.integer(-2, 2)) * 0.5f;
      Tensor bias = Tensor::empty({c.experts}, DType::kF32);
      for (int64_t e = 0; e < c.experts; ++e) bias.data<float>()[e] = static_cast<float>(rng.integer(0, 1)) * 0.25f;
      expect_same_route(cuda, logits, c.with_bias ? &bias : nullptr, c.params);
      // All-equal rows: the chosen ids are the lowest of the kept groups.
      const Tensor flat = Tensor::zeros({T, c.experts}, DType::kF32);
      expect_same_route(cuda, flat, nullptr, c.params);
    }
}

// The hand-made case of the CPU tests: group 1's two experts sum above group
// 0's single best one.
TEST(CudaMoe, RouteGroupMaskingByHand) {
  REQUIRE_DEVICE();
  CudaBackend cuda;
  const Tensor logits = cuda_to_device(Tensor::from_f32({1, 8}, std::vector<float>{3, -6, 2, 2, -1, -1, -2, -2}));
  const Tensor bias = cuda_to_device(Tensor::zeros({8}, DType::kF32));
  const MoeRouteParams p{MoeScoring::kSigmoid, 2, 4, 1, true, 1.0f};
  Tensor ids = cuda_empty({1, 2}, DType::kI32), w = cuda_empty({1, 2}, DType::kF32);
  cuda.moe_route(logits, &bias, p, ids, w);
  cuda.synchronize();
  const Tensor got_ids = cuda_to_host(ids), got_w = cuda_to_host(w);
  EXPECT_EQ(got_ids.data<const int32_t>()[0], 2);
  EXPECT_EQ(got_ids.data<const int32_t>()[1], 3);
  EXPECT_NEAR(got_w.data<const float>()[0], 0.5f, 1e-6);
  EXPECT_NEAR(got_w.data<const float>()[1], 0.5f, 1e-6);
}

TEST(CudaMoe, RouteRejectsWhatItCannotRun) {
  REQUIRE_DEVICE();
  CudaBackend cuda;
  const Tensor logits = cuda_empty({2, 512}, DType::kF32);
  Tensor ids = cuda_empty({2, 8}, DType::kI32), w = cuda_empty({2, 8}, DType::kF32);
  // 512 experts are more than the kernel holds.
  EXPECT_THROW(cuda.moe_route(logits, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 8, 4, true, 1.0f}, ids, w),
               Error);
  const Tensor small = cuda_empty({2, 256}, DType::kF32);
  // top_k above 32; groups that do not divide the experts; topk_groups 0.
  Tensor ids33 = cuda_empty({2, 33}, DType::kI32), w33 = cuda_empty({2, 33}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 33, 1, 1, true, 1.0f}, ids33, w33),
               Error);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 3, 1, true, 1.0f}, ids, w),
               Error);
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 8, 0, true, 1.0f}, ids, w),
               Error);
  // 64 groups, wrong output shapes, a host tensor, a bias of the wrong size.
  EXPECT_THROW(cuda.moe_route(small, nullptr, MoeRouteParams{MoeScoring::kSigmoid, 8, 64, 8, true, 1.0f}, ids, w),
               Error);
  const MoeRouteParams v3 = kV3;
  Tensor short_ids = cuda_empty({2, 7}, DType::kI32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, v3, short_ids, w), Error);
  Tensor host_w = Tensor::empty({2, 8}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, nullptr, v3, ids, host_w), Error);
  const Tensor bias = cuda_empty({255}, DType::kF32);
  EXPECT_THROW(cuda.moe_route(small, &bias, v3, ids, w), Error);
  // moe_experts with no experts.
  Tensor out = cuda_empty({2, 256}, DType::kF32);
  EXPECT_THROW(cuda.moe_experts(small, ids, w, {}, out), Error);
}


// --- moe_experts -------------------------------------------------------------
//
// Tolerances (||out - ref|| / ||ref|| over the whole output):
//  * bf16 experts against the CPU backend, 1e-2: the device rounds x (when
//    f32) and GEMM 1's result to bf16, each at most 2^-9 relative per
//    element; on these random-sign inputs the norm-wise error is about the
//    RMS of the per-element errors (~2^-9 / sqrt(3) per rounding, ~2e-3 for
//    both), so 1e-2 leaves a 5x margin.
//  * FP8 experts against the CPU backend, 0.1: the device quantizes x and
//    GEMM 1's result to e4m3 in 1x128 groups (the CPU backend keeps them in
//    f32). e4m3 has 3 mantissa bits: rounding is at most 2^-4 relative per
//    element, an error spread evenly over +-half an ulp, whose RMS is below
//    2^-4 / sqrt(3) = 0.036; two quantizations in a row give about
//    sqrt(2) * 0.036 = 0.051 norm-wise; 0.1 is 2x that.
//  * FP8 experts against fp8_reference (the same quantization on the host,
//    exact products, f32 promotion per 128-K block), 1e-3: what remains is
//    f32 summation order and the rare e4m3 rounding of GEMM 1's result that
//    flips where host and device differ in its last f32 bit (one e4m3 ulp
//    of one element), far below 1e-4 in practice.
//  * The wgmma multiplies against fp8_reference, 2.5e-2 (promoted per 128-K
//    block) and 2e-2 (per k32 MMA): Hopper's FP8 tensor cores add the
//    products of one MMA in fixed point, aligned to the largest and cut to
//    about 14 bits (DeepSeek-V3's report, 3.5.2), and the partial sums of
//    a stage the same way. That moves GEMM 1's results off the host's by a
//    little, and each element whose e4m3 rounding then flips moves the
//    result by one e4m3 ulp of it: at the smallest shape (T = 17, I = 80,
//    1,360 such elements) about 3e-3 of the norm per flip. Measured on the
//    H200: 1.7e-3 to 6.7e-3 per 128 and 1.5e-3 to 2.5e-3 per k32 on one
//    seed; over 40 seeds on an H100, up to 1.4e-2 per 128 and 1.1e-2 per
//    k32 (at 5e-3, 1 seed in ~20 failed). Both stay below the activations'
//    own e4m3 rounding (0.036 RMS, above); a wrong tile or scale is O(1).
//  * The generic path (f32 activations and sums, like the CPU backend), 1e-5.

constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp8VsCpuTolerance = 0.1;
constexpr double kFp8VsReferenceTolerance = 1e-3;
constexpr double kFp8WgmmaVsReferenceTolerance = 2.5e-2;
constexpr double kFp8WgmmaPreciseVsReferenceTolerance = 2e-2;
constexpr double kGenericTolerance = 1e-5;

// Against fp8_reference, for a multiply (MoeOptions::fp8_mma; -1, the
// default, may take wgmma where it runs).
double fp8_reference_tolerance(int fp8_mma) {
  if (fp8_mma == cuda_kernels::kMoeMmaWgmmaPrecise) return kFp8WgmmaPreciseVsReferenceTolerance;
  if (fp8_mma == cuda_kernels::kMoeMmaWgmma || fp8_mma == cuda_kernels::kMoeMmaWgmmaTma ||
      fp8_mma == cuda_kernels::kMoeMmaWgmmaTmaPair ||
      (fp8_mma < 0 && cuda_kernels::wgmma_available()))
    return kFp8WgmmaVsReferenceTolerance;
  return kFp8VsReferenceTolerance;
}

int64_t fp8_blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

LinearWeight host_weight(TestRng& rng, int64_t n, int64_t k, DType dtype) {
  LinearWeight w;
  if (dtype == DType::kF8E4M3) {
    // e4m3 values of spread 2 (up to the saturation at 448) and per-block
    // scales of different sizes.
    w.weight = testing::random_tensor(rng, {n, k}, DType::kF8E4M3, 2.0f);
    w.scale_inv = Tensor::empty({fp8_blocks(n), fp8_blocks(k)}, DType::kF32);
    for (int64_t i = 0; i < w.scale_inv.numel(); ++i)
      w.scale_inv.data<float>()[i] = rng.uniform(0.3f, 1.5f) / std::sqrt(static_cast<float>(k));
  } else {
    w.weight = testing::random_tensor(rng, {n, k}, dtype, 1.0f / std::sqrt(static_cast<float>(k)));
  }
  return w;
}

LinearWeight to_device(const LinearWeight& w) {
  return LinearWeight{cuda_to_device(w.weight), w.block_fp8() ? cuda_to_device(w.scale_inv) : Tensor()};
}

struct Experts {
  std::vector<MoeExpert> host, device;
  int64_t hidden = 0, inter = 0;
};

// E experts whose matrix m (0 gate, 1 up, 2 down) of expert e has dtype(e, m).
template <typename DTypeOf>
Experts make_experts(TestRng& rng, int64_t E, int64_t H, int64_t I, DTypeOf dtype) {
  Experts ex;
  ex.hidden = H;
  ex.inter = I;
  for (int64_t e = 0; e < E; ++e) {
    MoeExpert h{host_weight(rng, I, H, dtype(e, 0)), host_weight(rng, I, H, dtype(e, 1)),
                host_weight(rng, H, I, dtype(e, 2))};
    ex.device.push_back(MoeExpert{to_device(h.gate), to_device(h.up), to_device(h.down)});
    ex.host.push_back(std::move(h));
  }
  return ex;
}

struct Routing {
  Tensor ids, weights;  // host i32 [T, k], f32 [T, k]
};

// k distinct experts per token, drawn from all E (or, skewed, from the first
// max(k, E / 4): a few experts get many rows and the rest none), weights in
// [0.1, 1).
Routing random_routing(TestRng& rng, int64_t T, int64_t E, int64_t k, bool skewed = false) {
  Routing r{Tensor::empty({T, k}, DType::kI32), Tensor::empty({T, k}, DType::kF32)};
  const int64_t span = skewed ? std::max(k, E / 4) : E;
  std::vector<int32_t> pool(static_cast<size_t>(span));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      std::swap(pool[static_cast<size_t>(j)], pool[static_cast<size_t>(rng.integer(j, span - 1))]);
      r.ids.data<int32_t>()[t * k + j] = pool[static_cast<size_t>(j)];
      r.weights.data<float>()[t * k + j] = rng.uniform(0.1f, 1.0f);
    }
  }
  return r;
}

// fp8.h's rule on the host: per row and 128-column group, scale = amax / 448
// (1 where that is not > 0), q = e4m3(x / scale).
void quantize_rows(const float* x, int64_t rows, int64_t cols, std::vector<uint8_t>& q, std::vector<float>& s) {
  const int64_t groups = fp8_blocks(cols);
  q.assign(static_cast<size_t>(rows * cols), 0);
  s.assign(static_cast<size_t>(rows * groups), 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kFp8BlockSize, end = std::min(cols, begin + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      float scale = amax / 448.0f;
      if (!(scale > 0.0f)) scale = 1.0f;
      s[static_cast<size_t>(r * groups + g)] = scale;
      for (int64_t c = begin; c < end; ++c) q[static_cast<size_t>(r * cols + c)] = f32_to_fp8e4m3(x[r * cols + c] / scale);
    }
}

const float* e4m3_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

// Row n of an FP8 weight times a quantized activation row, as the grouped
// GEMM computes it: per 128-K block b, p = the exact sum of the e4m3
// products, then acc += f32(p) * (act_scale[b] * weight_scale[n / 128, b]).
float fp8_dot(const uint8_t* qa, const float* sa, const LinearWeight& w, int64_t n) {
  const float* lut = e4m3_table();
  const int64_t K = w.weight.dim(1), kb = fp8_blocks(K);
  const uint8_t* qw = w.weight.data<const uint8_t>() + n * K;
  const float* sw = w.scale_inv.data<const float>() + (n / kFp8BlockSize) * kb;
  float acc = 0.0f;
  for (int64_t b = 0; b < kb; ++b) {
    double p = 0.0;
    for (int64_t k = b * kFp8BlockSize; k < std::min(K, (b + 1) * kFp8BlockSize); ++k)
      p += static_cast<double>(lut[qa[k]]) * lut[qw[k]];
    const float scale = sa[b] * sw[b];
    acc += static_cast<float>(p) * scale;
  }
  return acc;
}

// moe_experts of FP8 experts with the device's quantization of x and of
// GEMM 1's result. x f32 [T, H].
Tensor fp8_reference(const Tensor& x, const Routing& route, const std::vector<MoeExpert>& experts) {
  const int64_t T = x.dim(0), H = x.dim(1), k = route.ids.dim(1), I = experts[0].gate.weight.dim(0);
  std::vector<uint8_t> xq, aq;
  std::vector<float> xs, as, act(static_cast<size_t>(I));
  quantize_rows(x.data<const float>(), T, H, xq, xs);
  Tensor out = Tensor::zeros({T, H}, DType::kF32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = route.ids.data<const int32_t>()[t * k + j];
      if (e < 0) continue;
      const MoeExpert& ex = experts[static_cast<size_t>(e)];
      const uint8_t* qx = xq.data() + t * H;
      const float* sx = xs.data() + t * fp8_blocks(H);
      for (int64_t i = 0; i < I; ++i) {
        const float g = fp8_dot(qx, sx, ex.gate, i), u = fp8_dot(qx, sx, ex.up, i);
        act[static_cast<size_t>(i)] = g / (1.0f + std::exp(-g)) * u;
      }
      quantize_rows(act.data(), 1, I, aq, as);
      const float w = route.weights.data<const float>()[t * k + j];
      for (int64_t h = 0; h < H; ++h) out.data<float>()[t * H + h] += w * fp8_dot(aq.data(), as.data(), ex.down, h);
    }
  return out;
}

// Both backends' moe_experts and, for quantized FP8 experts, fp8_reference;
// the device output poisoned first. Returns the device output (host copy).
Tensor check_experts(CudaBackend& cuda, const Experts& ex, const Tensor& x, const Routing& route, bool quantized,
                     double tolerance_vs_cpu, const std::string& what) {
  SCOPED_TRACE(what);
  CpuBackend cpu = exact_cpu();
  const Tensor x_f32 = x.to_f32();
  const int64_t T = x.dim(0), H = ex.hidden;
  Tensor want = testing::poisoned({T, H});
  cpu.moe_experts(x_f32, route.ids, route.weights, ex.host, want);
  const Tensor d_x = cuda_to_device(x), d_ids = cuda_to_device(route.ids), d_w = cuda_to_device(route.weights);
  Tensor out = cuda_empty({T, H}, DType::kF32);
  cuda_fill_bytes(out, 0xFF);
  cuda.moe_experts(d_x, d_ids, d_w, ex.device, out);
  cuda.synchronize();
  const Tensor got = cuda_to_host(out);
  EXPECT_EQ(testing::count_nan(got), 0);
  EXPECT_LE(testing::relative_error(got, want), tolerance_vs_cpu) << "against the CPU backend";
  if (quantized) {
    const Tensor ref = fp8_reference(x_f32, route, ex.host);
    EXPECT_LE(testing::relative_error(got, ref), fp8_reference_tolerance(-1)) << "against fp8_reference";
  }
  return got;
}

// cuda_moe_experts with `options` into a poisoned output; its host copy,
// checked for NaN.
Tensor run_op(CudaBackend& cuda, const Tensor& d_x, const Tensor& d_ids, const Tensor& d_w,
              const MoeExpertTable& table, const MoeOptions& options) {
  Tensor out = cuda_empty({d_x.dim(0), table.hidden}, DType::kF32);
  cuda_fill_bytes(out, 0xFF);
  cuda_moe_experts(d_x, d_ids, d_w, table, out, cuda.stream(), options);
  cuda.synchronize();
  Tensor got = cuda_to_host(out);
  EXPECT_EQ(testing::count_nan(got), 0);
  return got;
}

// The op's inputs on the device, written in place (so that a recorded graph
// replays on new ones).
struct DeviceInputs {
  Tensor x, ids, weights;
  DeviceInputs(int64_t T, int64_t H, int64_t k)
      : x(cuda_empty({T, H}, DType::kF32)), ids(cuda_empty({T, k}, DType::kI32)),
        weights(cuda_empty({T, k}, DType::kF32)) {}
  void upload(CudaBackend& cuda, const Tensor& xs, const Routing& r) {
    cuda.copy(xs, x);
    cuda.copy(r.ids, ids);
    cuda.copy(r.weights, weights);
  }
};

std::string describe_case(DType w, int64_t E, int64_t k, int64_t H, int64_t I, int64_t T, DType x) {
  return std::string(dtype_name(w)) + " experts, E " + std::to_string(E) + ", top_k " + std::to_string(k) + ", H " +
         std::to_string(H) + ", I " + std::to_string(I) + ", T " + std::to_string(T) + ", x " + std::string(dtype_name(x));
}

TEST(CudaMoe, ExpertsMatchCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  const std::pair<int64_t, int64_t> experts_topk[] = {{1, 1}, {8, 1}, {8, 2}, {8, 8}, {64, 1}, {64, 2}, {64, 8}};
  // H, I: multiples of 128; partial FP8 blocks (176 = 128 + 48, 80); rows of
  // FP8 weights not a multiple of 16 bytes (200: the generic path; bf16
  // rows of 400 bytes still take the grouped GEMM, with a partial last stage).
  const std::pair<int64_t, int64_t> shapes[] = {{256, 128}, {176, 80}, {200, 72}};
  int index = 0;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3})
    for (auto [E, k] : experts_topk) {
      const auto [H, I] = shapes[index % 3];
      const Experts ex = make_experts(rng, E, H, I, [&](int64_t, int) { return wdt; });
      const bool fp8 = wdt == DType::kF8E4M3;
      const bool quantized = fp8 && H % 16 == 0 && I % 16 == 0;
      const double tolerance = !fp8 ? kBf16Tolerance : quantized ? kFp8VsCpuTolerance : kGenericTolerance;
      for (int64_t T : {1, 3, 17, 300}) {
        const DType xdt = index++ % 3 == 1 ? DType::kBF16 : DType::kF32;
        const Tensor x = testing::random_tensor(rng, {T, H}, xdt);
        const Routing route = random_routing(rng, T, E, k, T == 300 && E == 64);
        check_experts(cuda, ex, x, route, quantized, tolerance, describe_case(wdt, E, k, H, I, T, xdt));
      }
    }
}

// Fp8Compute::kW8A16: FP8 experts run as their bf16 copies (the bf16 path,
// within kBf16Tolerance of the CPU backend), closer to it than the default
// w8a8; the copy is made at the first call, here inside a graph capture.
TEST(CudaMoe, ExpertsWeightOnly) {
  REQUIRE_DEVICE();
  TestRng rng;
  CpuBackend cpu = exact_cpu();
  CudaBackend weight_only, w8a8;
  weight_only.set_fp8_compute(Fp8Compute::kW8A16);
  const int64_t E = 8, k = 2, H = 256, I = 128;
  const Experts ex = make_experts(rng, E, H, I, [](int64_t, int) { return DType::kF8E4M3; });
  bool first = true;
  for (int64_t T : {1, 17, 300}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const Tensor x = testing::random_tensor(rng, {T, H}, DType::kF32);
    const Routing route = random_routing(rng, T, E, k, T == 300);
    Tensor want = testing::poisoned({T, H});
    cpu.moe_experts(x, route.ids, route.weights, ex.host, want);
    const Tensor d_x = cuda_to_device(x), d_ids = cuda_to_device(route.ids), d_w = cuda_to_device(route.weights);
    Tensor got = cuda_empty({T, H}, DType::kF32), quantized = cuda_empty({T, H}, DType::kF32);
    cuda_fill_bytes(got, 0xFF);
    if (first) {
      auto graph = weight_only.record([&] { weight_only.moe_experts(d_x, d_ids, d_w, ex.device, got); });
      ASSERT_TRUE(graph);
      graph->replay();
      first = false;
    } else {
      weight_only.moe_experts(d_x, d_ids, d_w, ex.device, got);
    }
    w8a8.moe_experts(d_x, d_ids, d_w, ex.device, quantized);
    weight_only.synchronize();
    w8a8.synchronize();
    const double e = testing::relative_error(cuda_to_host(got), want);
    const double e8 = testing::relative_error(cuda_to_host(quantized), want);
    EXPECT_LE(e, kBf16Tolerance);
    EXPECT_LT(e * 4, e8) << "weight-only " << e << ", w8a8 " << e8;
  }
}

// The expert shapes of the DeepSeek fixtures and the bundled model (tiny I:
// 16 and 24 columns, H 64 and 136), at their prompts' token counts: the
// models on the GPU disagreed with the CPU backend on some prompts.
TEST(CudaMoe, ExpertsAtTheModelFixturesShapes) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  struct Shape {
    int64_t E, k, H, I;
    DType w;
  };
  const Shape shapes[] = {{16, 4, 64, 16, DType::kBF16},  {8, 3, 64, 24, DType::kBF16},
                          {16, 4, 136, 16, DType::kF8E4M3}, {16, 4, 256, 192, DType::kBF16},
                          {1, 1, 64, 96, DType::kBF16},   {1, 1, 136, 160, DType::kF8E4M3},
                          {1, 1, 256, 768, DType::kBF16}};
  for (const Shape& sh : shapes) {
    const Experts ex = make_experts(rng, sh.E, sh.H, sh.I, [&](int64_t, int) { return sh.w; });
    const bool fp8 = sh.w == DType::kF8E4M3;
    const bool quantized = fp8 && sh.H % 16 == 0 && sh.I % 16 == 0;
    const double tolerance = !fp8 ? kBf16Tolerance : quantized ? kFp8VsCpuTolerance : kGenericTolerance;
    for (int64_t T : {1, 5, 19, 40}) {
      const Tensor x = testing::random_tensor(rng, {T, sh.H}, DType::kF32);
      const Routing route = random_routing(rng, T, sh.E, sh.k, false);
      check_experts(cuda, ex, x, route, quantized, tolerance,
                    describe_case(sh.w, sh.E, sh.k, sh.H, sh.I, T, DType::kF32));
    }
  }
}

// The dense MLP and the shared expert: one expert, ids all 0, weights 1.
TEST(CudaMoe, ExpertsSingleExpertLikeDenseMlp) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3}) {
    const Experts ex = make_experts(rng, 1, 384, 320, [&](int64_t, int) { return wdt; });
    for (int64_t T : {1, 3, 17, 300}) {
      const Tensor x = testing::random_tensor(rng, {T, 384}, DType::kF32);
      Routing route{Tensor::zeros({T, 1}, DType::kI32), Tensor::empty({T, 1}, DType::kF32)};
      for (int64_t t = 0; t < T; ++t) route.weights.data<float>()[t] = 1.0f;
      const bool fp8 = wdt == DType::kF8E4M3;
      check_experts(cuda, ex, x, route, fp8, fp8 ? kFp8VsCpuTolerance : kBf16Tolerance,
                    describe_case(wdt, 1, 1, 384, 320, T, DType::kF32));
    }
  }
}

// Through the internal API: every tile size, both FP8 multiplies and the
// generic path forced, on the same inputs; skewed routing, so that experts
// span several tiles (and others none).
TEST(CudaMoe, ExpertsEveryTileSizeAndMultiply) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu = exact_cpu();
  MoeExpertTables tables;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3})
    for (auto [H, I] : {std::pair<int64_t, int64_t>{256, 128}, {176, 80}}) {
      const Experts ex = make_experts(rng, 8, H, I, [&](int64_t, int) { return wdt; });
      const MoeExpertTable& table = tables.get(ex.device, cuda.stream());
      const bool fp8 = wdt == DType::kF8E4M3;
      EXPECT_EQ(table.path, fp8 ? MoeExpertTable::Path::kFp8 : MoeExpertTable::Path::kBf16);
      for (int64_t T : {17, 300}) {
        const Tensor x = testing::random_tensor(rng, {T, H}, DType::kF32);
        const Routing route = random_routing(rng, T, 8, 2, T == 300);
        Tensor want = testing::poisoned({T, H});
        cpu.moe_experts(x, route.ids, route.weights, ex.host, want);
        const Tensor ref = fp8 ? fp8_reference(x, route, ex.host) : Tensor();
        const Tensor d_x = cuda_to_device(x), d_ids = cuda_to_device(route.ids), d_w = cuda_to_device(route.weights);
        std::vector<MoeOptions> variants;
        for (int tile : {16, 64, 128}) {
          if (fp8) {
            variants.push_back({cuda_kernels::kMoeMmaE4m3, tile, false});
            variants.push_back({cuda_kernels::kMoeMmaE4m3AsF16, tile, false});
            if (tile == cuda_kernels::kWgmmaTileM && cuda_kernels::wgmma_available()) {
              variants.push_back({cuda_kernels::kMoeMmaWgmma, tile, false});
              variants.push_back({cuda_kernels::kMoeMmaWgmmaPrecise, tile, false});
            }
          } else {
            variants.push_back({-1, tile, false});
          }
        }
        if (fp8 && cuda_kernels::wgmma_available()) {
          variants.push_back({cuda_kernels::kMoeMmaWgmmaTma, cuda_kernels::kWgmmaTmaTileM, false});
          variants.push_back({cuda_kernels::kMoeMmaWgmmaTmaPair, cuda_kernels::kWgmmaTmaTileM, false});
        }
        variants.push_back({-1, 0, true});
        for (const MoeOptions& o : variants) {
          SCOPED_TRACE(describe_case(wdt, 8, 2, H, I, T, DType::kF32) + ", tile_m " + std::to_string(o.tile_m) +
                       ", mma " + std::to_string(o.fp8_mma) + (o.generic ? ", generic" : ""));
          const Tensor got = run_op(cuda, d_x, d_ids, d_w, table, o);
          if (o.generic) {
            EXPECT_LE(testing::relative_error(got, want), kGenericTolerance);
          } else if (fp8) {
            EXPECT_LE(testing::relative_error(got, want), kFp8VsCpuTolerance);
            EXPECT_LE(testing::relative_error(got, ref), fp8_reference_tolerance(o.fp8_mma));
          } else {
            EXPECT_LE(testing::relative_error(got, want), kBf16Tolerance);
          }
        }
      }
    }
}

// The wgmma multiplies are what a Hopper build runs on a Hopper device (so
// the variants above cannot skip them there, and the default takes them),
// within their bounds of fp8_reference at DeepSeek-V3's K (56 scale
// blocks, many turns of the ring) with experts of several tiles.
TEST(CudaMoe, ExpertsWgmmaOnHopper) {
  REQUIRE_DEVICE();
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  if (major != 9 || minor != 0) GTEST_SKIP() << "not an sm_90 device";
  ASSERT_TRUE(cuda_kernels::wgmma_available());
  TestRng rng;
  CudaBackend cuda;
  MoeExpertTables tables;
  const int64_t H = 7168, I = 256, E = 4, T = 400;
  const Experts ex = make_experts(rng, E, H, I, [](int64_t, int) { return DType::kF8E4M3; });
  const MoeExpertTable& table = tables.get(ex.device, cuda.stream());
  const Tensor x = testing::random_tensor(rng, {T, H}, DType::kF32);
  const Routing route = random_routing(rng, T, E, 2, true);
  const Tensor ref = fp8_reference(x, route, ex.host);
  const Tensor d_x = cuda_to_device(x), d_ids = cuda_to_device(route.ids), d_w = cuda_to_device(route.weights);
  double error[2] = {};  // [precise]
  Tensor wgmma_result;
  for (const MoeOptions& o : {MoeOptions{cuda_kernels::kMoeMmaE4m3, 64, false},
                              MoeOptions{cuda_kernels::kMoeMmaE4m3, 128, false},
                              MoeOptions{cuda_kernels::kMoeMmaWgmma, cuda_kernels::kWgmmaTileM, false},
                              MoeOptions{cuda_kernels::kMoeMmaWgmmaPrecise, cuda_kernels::kWgmmaTileM, false},
                              MoeOptions{cuda_kernels::kMoeMmaWgmmaTma, cuda_kernels::kWgmmaTmaTileM, false},
                              MoeOptions{cuda_kernels::kMoeMmaWgmmaTmaPair, cuda_kernels::kWgmmaTmaTileM, false},
                              MoeOptions{}}) {
    SCOPED_TRACE("mma " + std::to_string(o.fp8_mma) + ", tile_m " + std::to_string(o.tile_m));
    const Tensor got = run_op(cuda, d_x, d_ids, d_w, table, o);
    const double e = testing::relative_error(got, ref);
    std::printf("mma %d tile %d: %.3g against fp8_reference\n", o.fp8_mma, o.tile_m, e);
    EXPECT_LE(e, fp8_reference_tolerance(o.fp8_mma));
    if (o.fp8_mma == cuda_kernels::kMoeMmaWgmma || o.fp8_mma == cuda_kernels::kMoeMmaWgmmaPrecise)
      error[o.fp8_mma == cuda_kernels::kMoeMmaWgmmaPrecise] = e;
    if (o.fp8_mma == cuda_kernels::kMoeMmaWgmma) wgmma_result = got;
    // The same MMAs and promotions in the same order, fed by TMA in tiles
    // of up to 192 rows: the same bits.
    // In clusters of two sharing the activation tiles: the same again.
    if (o.fp8_mma == cuda_kernels::kMoeMmaWgmmaTma || o.fp8_mma == cuda_kernels::kMoeMmaWgmmaTmaPair) {
      EXPECT_TRUE(testing::bytes_equal(got, wgmma_result)) << "the TMA-fed GEMM parts from the cp.async one";
    }
    if (o.fp8_mma < 0) {
      EXPECT_EQ(e, error[0]) << "the default is the wgmma multiply (here the TMA-fed kernel, the same bits)";
    }
  }
  // Promoting after every k32 MMA leaves less in the tensor cores' sums.
  EXPECT_LT(error[1], error[0]);
  // Forced where it cannot run: a clear error, nothing launched.
  Tensor out = cuda_empty({T, H}, DType::kF32);
  for (int tile : {16, 128, cuda_kernels::kWgmmaTmaTileM})
    EXPECT_THROW(cuda_moe_experts(d_x, d_ids, d_w, table, out, cuda.stream(),
                                  MoeOptions{cuda_kernels::kMoeMmaWgmma, tile, false}),
                 Error);
  for (int mode : {cuda_kernels::kMoeMmaWgmmaTma, cuda_kernels::kMoeMmaWgmmaTmaPair})
    for (int tile : {16, 64, 128})
      EXPECT_THROW(cuda_moe_experts(d_x, d_ids, d_w, table, out, cuda.stream(), MoeOptions{mode, tile, false}),
                   Error);
}

// The TMA-fed GEMM (alone and in clusters of two) recorded into a CUDA
// graph with a table first built
// inside the capture (its weight descriptors written by recorded kernels),
// an eager call, then replays over new inputs and routings written in
// place: each the same bits as an eager call. Experts of more rows than a
// tile, and of none.
TEST(CudaMoe, ExpertsTmaRecordAndReplay) {
  REQUIRE_DEVICE();
  if (!cuda_kernels::wgmma_available()) GTEST_SKIP() << "not an sm_90a build on an sm_90 device";
  TestRng rng;
  CudaBackend cuda;
  const int64_t E = 6, H = 384, I = 208, T = 260, k = 2;  // I: a partial K block of GEMM 2, a partial column block
  const Experts ex = make_experts(rng, E, H, I, [](int64_t, int) { return DType::kF8E4M3; });
  for (int mode : {cuda_kernels::kMoeMmaWgmmaTma, cuda_kernels::kMoeMmaWgmmaTmaPair}) {
    SCOPED_TRACE("mma " + std::to_string(mode));
    MoeExpertTables tables;
    const MoeOptions o{mode, cuda_kernels::kWgmmaTmaTileM, false};
    DeviceInputs in(T, H, k);
    const Tensor &d_x = in.x, &d_ids = in.ids, &d_w = in.weights;
    Tensor out = cuda_empty({T, H}, DType::kF32);
    const auto upload = [&](const Tensor& xs, const Routing& r) { in.upload(cuda, xs, r); };
    Tensor x = testing::random_tensor(rng, {T, H}, DType::kF32);
    Routing route = random_routing(rng, T, E, k, true);
    upload(x, route);
    std::unique_ptr<RecordedOps> graph = cuda.record([&] {
      cuda_moe_experts(d_x, d_ids, d_w, tables.get(ex.device, cuda.stream()), out, cuda.stream(), o);
    });
    ASSERT_TRUE(graph);
    const MoeExpertTable& table = tables.get(ex.device, cuda.stream());
    ASSERT_EQ(table.path, MoeExpertTable::Path::kFp8);
    const Tensor ref = fp8_reference(x, route, ex.host);
    EXPECT_LE(testing::relative_error(run_op(cuda, d_x, d_ids, d_w, table, o), ref), kFp8WgmmaVsReferenceTolerance)
        << "eager before any replay";
    for (int round = 0; round < 3; ++round) {
      x = testing::random_tensor(rng, {T, H}, DType::kF32);
      route = random_routing(rng, T, E, k, round != 1);
      upload(x, route);
      cuda_fill_bytes(out, 0xFF);
      graph->replay();
      cuda.synchronize();
      const Tensor replayed = cuda_to_host(out);
      EXPECT_LE(testing::relative_error(replayed, fp8_reference(x, route, ex.host)), kFp8WgmmaVsReferenceTolerance)
          << "replay " << round;
      EXPECT_TRUE(testing::bytes_equal(replayed, run_op(cuda, d_x, d_ids, d_w, table, o))) << "replay " << round;
    }
  }
}

// The TMA descriptors' encoder: what the driver refuses comes back as a
// message (a base or row stride off 16 bytes, a box of more than 256 rows),
// never a descriptor.
TEST(CudaMoe, TensorMapEncodingRefusesWhatTmaCannotRead) {
  REQUIRE_DEVICE();
  if (!cuda_kernels::wgmma_available()) GTEST_SKIP() << "not an sm_90a build on an sm_90 device";
  const Tensor rows = cuda_empty({64, 256}, DType::kF8E4M3);
  const auto* base = static_cast<const uint8_t*>(rows.raw());
  TmaDescriptor d{};
  EXPECT_EQ(encode_rows_u8(d, base, 64, 256, 64, 128), "");
  EXPECT_NE(encode_rows_u8(d, base + 8, 63, 256, 64, 128), "");
  EXPECT_NE(encode_rows_u8(d, base, 64, 200, 64, 128), "");
  EXPECT_NE(encode_rows_u8(d, base, 64, 256, 300, 128), "");
}

// Experts that take the generic path: f32, f16, and a mix of bf16, FP8 and
// f32 (the CPU backend's own test mix); computed as the CPU backend does.
TEST(CudaMoe, ExpertsGenericWeights) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  const auto mixed = [](int64_t e, int) {
    return e % 2 ? DType::kF8E4M3 : e % 3 == 1 ? DType::kF32 : DType::kBF16;
  };
  const Experts sets[] = {make_experts(rng, 6, 136, 200, [](int64_t, int) { return DType::kF32; }),
                          make_experts(rng, 6, 64, 24, [](int64_t, int) { return DType::kF16; }),
                          make_experts(rng, 6, 136, 200, mixed)};
  for (const Experts& ex : sets)
    for (int64_t T : {1, 7, 20}) {
      const Tensor x = testing::random_tensor(rng, {T, ex.hidden}, T == 7 ? DType::kBF16 : DType::kF32);
      const Routing route = random_routing(rng, T, 6, 2);
      check_experts(cuda, ex, x, route, false, kGenericTolerance,
                    "H " + std::to_string(ex.hidden) + ", T " + std::to_string(T));
    }
}

// Reproducible bits (no atomics on the output), and ids outside [0, E)
// contribute nothing.
TEST(CudaMoe, ExpertsAreReproducibleAndSkipInvalidIds) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3}) {
    const Experts ex = make_experts(rng, 16, 256, 128, [&](int64_t, int) { return wdt; });
    const int64_t T = 100, k = 4;
    const Tensor x = testing::random_tensor(rng, {T, 256}, DType::kF32);
    const Routing route = random_routing(rng, T, 16, k);
    const Tensor d_x = cuda_to_device(x), d_ids = cuda_to_device(route.ids), d_w = cuda_to_device(route.weights);
    Tensor a = cuda_empty({T, 256}, DType::kF32), b = cuda_empty({T, 256}, DType::kF32);
    cuda.moe_experts(d_x, d_ids, d_w, ex.device, a);
    cuda_fill_bytes(b, 0xFF);
    cuda.moe_experts(d_x, d_ids, d_w, ex.device, b);
    cuda.synchronize();
    EXPECT_TRUE(testing::bytes_equal(cuda_to_host(a), cuda_to_host(b))) << dtype_name(wdt);

    // Slot 1 of every third token names no expert: the same as expert 0 with weight 0.
    Routing bad{testing::clone(route.ids), testing::clone(route.weights)};
    Routing zeroed{testing::clone(route.ids), testing::clone(route.weights)};
    for (int64_t t = 0; t < T; t += 3) {
      bad.ids.data<int32_t>()[t * k + 1] = t % 2 ? -1 : 16;
      zeroed.ids.data<int32_t>()[t * k + 1] = 0;
      zeroed.weights.data<float>()[t * k + 1] = 0.0f;
    }
    CpuBackend cpu = exact_cpu();
    Tensor want = testing::poisoned({T, 256});
    cpu.moe_experts(x, zeroed.ids, zeroed.weights, ex.host, want);
    const Tensor d_bad = cuda_to_device(bad.ids);
    cuda_fill_bytes(a, 0xFF);
    cuda.moe_experts(d_x, d_bad, d_w, ex.device, a);
    cuda.synchronize();
    EXPECT_LE(testing::relative_error(cuda_to_host(a), want),
              wdt == DType::kBF16 ? kBf16Tolerance : kFp8VsCpuTolerance)
        << dtype_name(wdt);
  }
}

// moe_experts recorded into a CUDA graph by a fresh backend (its table is
// built inside the capture), an eager call before any replay, then replays
// over new inputs written in place: each equal bit for bit to an eager call
// on the same inputs, and close to the CPU backend.
TEST(CudaMoe, ExpertsRecordAndReplay) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(dtype_name(wdt));
    const double tolerance = wdt == DType::kBF16 ? kBf16Tolerance : kFp8VsCpuTolerance;
    CudaBackend cuda;
    CpuBackend cpu = exact_cpu();
    const int64_t E = 8, H = 256, I = 128, T = 5, k = 2;
    const Experts ex = make_experts(rng, E, H, I, [&](int64_t, int) { return wdt; });
    DeviceInputs in(T, H, k);
    const Tensor &d_x = in.x, &d_ids = in.ids, &d_w = in.weights;
    Tensor out = cuda_empty({T, H}, DType::kF32);
    const auto upload = [&](const Tensor& xs, const Routing& r) { in.upload(cuda, xs, r); };
    Tensor x = testing::random_tensor(rng, {T, H}, DType::kF32);
    Routing route = random_routing(rng, T, E, k);
    upload(x, route);
    std::unique_ptr<RecordedOps> graph = cuda.record([&] { cuda.moe_experts(d_x, d_ids, d_w, ex.device, out); });
    ASSERT_TRUE(graph);
    auto cpu_result = [&](const Tensor& xs, const Routing& r) {
      Tensor want = testing::poisoned({T, H});
      cpu.moe_experts(xs, r.ids, r.weights, ex.host, want);
      return want;
    };
    Tensor eager = cuda_empty({T, H}, DType::kF32);
    cuda_fill_bytes(eager, 0xFF);
    cuda.moe_experts(d_x, d_ids, d_w, ex.device, eager);
    cuda.synchronize();
    const Tensor first = cuda_to_host(eager);
    EXPECT_LE(testing::relative_error(first, cpu_result(x, route)), tolerance) << "eager before any replay";
    for (int round = 0; round < 3; ++round) {
      x = testing::random_tensor(rng, {T, H}, DType::kF32);
      route = random_routing(rng, T, E, k);
      upload(x, route);
      cuda_fill_bytes(out, 0xFF);
      graph->replay();
      cuda.synchronize();
      const Tensor replayed = cuda_to_host(out);
      EXPECT_LE(testing::relative_error(replayed, cpu_result(x, route)), tolerance) << "replay " << round;
      cuda.moe_experts(d_x, d_ids, d_w, ex.device, eager);
      cuda.synchronize();
      EXPECT_TRUE(testing::bytes_equal(replayed, cuda_to_host(eager))) << "replay " << round;
    }
  }
}

TEST(CudaMoe, ExpertsRejectBadArguments) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  const Experts ex = make_experts(rng, 4, 128, 64, [](int64_t, int) { return DType::kBF16; });
  const Tensor x = cuda_to_device(testing::random_tensor(rng, {3, 128}, DType::kF32));
  const Routing route = random_routing(rng, 3, 4, 2);
  const Tensor ids = cuda_to_device(route.ids), w = cuda_to_device(route.weights);
  Tensor out = cuda_empty({3, 128}, DType::kF32);
  cuda.moe_experts(x, ids, w, ex.device, out);  // fine
  const Tensor x_wide = cuda_empty({3, 130}, DType::kF32);
  Tensor out_wide = cuda_empty({3, 130}, DType::kF32);
  EXPECT_THROW(cuda.moe_experts(x_wide, ids, w, ex.device, out_wide), Error);
  EXPECT_THROW(cuda.moe_experts(x, ids, w, ex.host, out), Error);  // host weights
  Tensor host_out = Tensor::empty({3, 128}, DType::kF32);
  EXPECT_THROW(cuda.moe_experts(x, ids, w, ex.device, host_out), Error);
  Tensor bf16_out = cuda_empty({3, 128}, DType::kBF16);
  EXPECT_THROW(cuda.moe_experts(x, ids, w, ex.device, bf16_out), Error);
  const Tensor short_w = cuda_empty({3, 1}, DType::kF32);
  EXPECT_THROW(cuda.moe_experts(x, ids, short_w, ex.device, out), Error);
  const Tensor f16_x = cuda_empty({3, 128}, DType::kF16);
  EXPECT_THROW(cuda.moe_experts(f16_x, ids, w, ex.device, out), Error);
  Tensor same = cuda_to_device(testing::random_tensor(rng, {3, 128}, DType::kF32));
  EXPECT_THROW(cuda.moe_experts(same, ids, w, ex.device, same), Error);  // out overlaps x
  // An FP8 matrix without its scales; a down projection of the wrong shape.
  std::vector<MoeExpert> broken = ex.device;
  broken[2].up.weight = cuda_empty({64, 128}, DType::kF8E4M3);
  EXPECT_THROW(cuda.moe_experts(x, ids, w, broken, out), Error);
  broken = ex.device;
  broken[1].down.weight = cuda_empty({128, 32}, DType::kBF16);
  EXPECT_THROW(cuda.moe_experts(x, ids, w, broken, out), Error);
}

}  // namespace
}  // namespace basalt
