// cuBLASLt linear against the reference op: f32 and bf16, with and without a
// fused bias, on odd and model-like shapes; outputs poisoned with NaN first.
#include "backend/cuda/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "testing/backend_test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemv_kernels.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

TEST(CudaGemm, LinearMatchesTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TestRng rng;
  CublasLt blas;
  struct Shape3 {
    int64_t m, n, k;
  };
  const Shape3 shapes[] = {{1, 1, 1}, {1, 4096, 4096}, {7, 33, 129}, {64, 1000, 512}, {300, 257, 96}};
  const std::pair<DType, DType> types[] = {{DType::kF32, DType::kF32},
                                           {DType::kBF16, DType::kBF16},
                                           {DType::kBF16, DType::kF32},
                                           {DType::kF16, DType::kF16},
                                           {DType::kF16, DType::kF32}};
  for (auto [in, out_type] : types)
    for (const Shape3& s : shapes)
      for (bool with_bias : {false, true}) {
        const Tensor x = testing::random_tensor(rng, {s.m, s.k}, in);
        const Tensor w = testing::random_tensor(rng, {s.n, s.k}, in, 0.05f);
        const Tensor b = testing::random_tensor(rng, {s.n}, out_type);
        Tensor want = Tensor::empty({s.m, s.n}, DType::kF32);
        const Tensor bias_f32 = b.to_f32();
        reference::linear(x.to_f32(), w.to_f32(), with_bias ? &bias_f32 : nullptr, want);
        Tensor out = cuda_empty({s.m, s.n}, out_type);
        cuda_fill_bytes(out, 0xFF);
        const Tensor bias_dev = cuda_to_device(b);
        blas.linear(cuda_to_device(x), cuda_to_device(w), with_bias ? &bias_dev : nullptr, out);
        const double err = testing::relative_error(cuda_to_host(out), want);
        EXPECT_LT(err, out_type == DType::kF32 ? 1e-5 : 8e-3)
            << dtype_name(in) << "->" << dtype_name(out_type) << " " << s.m << "x" << s.n << "x" << s.k
            << " bias " << with_bias;
      }
}

// Decode-sized calls time the heuristic's candidates at their first call
// (gemm.h): the timed plan's output (the caller's run after the timing runs
// overwrote it) matches the reference, with and without a fused bias, and
// each new shape is timed once. A shape first met inside a stream capture
// takes the heuristic's first algorithm untimed, and its replay is right.
TEST(CudaGemm, TimedPlansMatchTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TestRng rng;
  CublasLt blas;
  int tuned = 0;
  for (int64_t m : {8, 64, 256})
    for (bool with_bias : {false, true}) {
      const int64_t n = 1536, k = 1024;
      const Tensor x = testing::random_tensor(rng, {m, k}, DType::kBF16);
      const Tensor w = testing::random_tensor(rng, {n, k}, DType::kBF16, 0.05f);
      const Tensor b = testing::random_tensor(rng, {n}, DType::kF32);
      Tensor want = Tensor::empty({m, n}, DType::kF32);
      reference::linear(x.to_f32(), w.to_f32(), with_bias ? &b : nullptr, want);
      const Tensor xd = cuda_to_device(x), wd = cuda_to_device(w), bd = cuda_to_device(b);
      for (int call = 0; call < 2; ++call) {
        Tensor out = cuda_empty({m, n}, DType::kF32);
        cuda_fill_bytes(out, 0xFF);
        blas.linear(xd, wd, with_bias ? &bd : nullptr, out);
        EXPECT_LT(testing::relative_error(cuda_to_host(out), want), 1e-5)
            << m << " rows, bias " << with_bias << ", call " << call;
      }
      ++tuned;
      EXPECT_EQ(blas.tuning_stats().tuned, tuned) << "each new shape is timed once";
    }
  EXPECT_GT(blas.tuning_stats().seconds, 0.0);

  const int64_t m = 48, n = 1000, k = 512;
  const Tensor x = testing::random_tensor(rng, {m, k}, DType::kBF16);
  const Tensor w = testing::random_tensor(rng, {n, k}, DType::kBF16, 0.05f);
  Tensor want = Tensor::empty({m, n}, DType::kF32);
  reference::linear(x.to_f32(), w.to_f32(), nullptr, want);
  const Tensor xd = cuda_to_device(x), wd = cuda_to_device(w);
  Tensor out = cuda_empty({m, n}, DType::kF32);
  cuda_fill_bytes(out, 0xFF);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  blas.linear(xd, wd, nullptr, out, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(blas.tuning_stats().tuned, tuned) << "no timing inside a capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LT(testing::relative_error(cuda_to_host(out), want), 1e-5);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

TEST(CudaGemm, SkinnyLinearMatchesTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TestRng rng;
  for (DType wt : {DType::kBF16, DType::kF16})
    for (int64_t m : {1, 2, 3, 5, 8, 9, 12, 16})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {33, 544}, {1000, 4096}, {7, 14336}, {17, 96}})
        for (int variant = 0; variant < 4; ++variant) {
          // x as w's dtype or as f32 holding values of that dtype (the kernel
          // rounds f32 rows to w's dtype); out f32 or w's dtype; bias or not.
          const bool x_f32 = variant & 1, out_f32 = variant < 2, with_bias = variant == 1 || variant == 2;
          const Tensor x16 = testing::random_tensor(rng, {m, k}, wt);
          const Tensor x = x_f32 ? x16.to_f32() : x16;
          const Tensor w = testing::random_tensor(rng, {n, k}, wt, 0.05f);
          const Tensor b = testing::random_tensor(rng, {n}, DType::kF32);
          Tensor want = Tensor::empty({m, n}, DType::kF32);
          reference::linear(x16.to_f32(), w.to_f32(), with_bias ? &b : nullptr, want);
          // A dot product's rounding error is proportional to the sum of
          // |x_i w_i| (and |b|), however much its terms cancel: the error is
          // measured against that, so that a short row summing to about zero
          // (1 x 1 x 32) does not fail on f32's last bit.
          const auto absolute = [](const Tensor& t) {
            Tensor a = t.to_f32();
            for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
            return a;
          };
          Tensor magnitude = Tensor::empty({m, n}, DType::kF32);
          const Tensor abs_b = absolute(b);
          reference::linear(absolute(x16), absolute(w), with_bias ? &abs_b : nullptr, magnitude);
          const auto error = [&](const Tensor& out) {
            const Tensor got = cuda_to_host(out).to_f32();
            double diff = 0.0;
            for (int64_t i = 0; i < got.numel(); ++i) {
              const double d = double{got.data<float>()[i]} - want.data<float>()[i];
              if (std::isnan(d)) return std::numeric_limits<double>::infinity();
              diff += d * d;
            }
            return std::sqrt(diff) / testing::norm(magnitude);
          };
          const Tensor xd = cuda_to_device(x), wd = cuda_to_device(w), bd = cuda_to_device(b);
          ASSERT_TRUE(skinny_linear_fits(xd, wd));
          // Every kernel configuration (0: the default choice for m).
          for (const int config : {cuda_kernels::kGemvDefault, 1, 2, 3, cuda_kernels::kGemvRowKernel,
                                   cuda_kernels::kGemvRowKernel1, cuda_kernels::kGemvRowKernel2,
                                   cuda_kernels::kGemvRowKernel4}) {
            Tensor out = cuda_empty({m, n}, out_f32 ? DType::kF32 : wt);
            cuda_fill_bytes(out, 0xFF);
            skinny_linear(xd, wd, with_bias ? &bd : nullptr, out, nullptr, config);
            EXPECT_LT(error(out), out_f32 ? 1e-5 : 8e-3)
                << dtype_name(wt) << " " << m << "x" << n << "x" << k << " variant " << variant << " config "
                << config;
          }
        }
  // What does not qualify: 17 rows, k not a multiple of 32, f32 weights, x
  // of another 16-bit type than w.
  EXPECT_FALSE(skinny_linear_fits(cuda_empty({17, 32}, DType::kF32), cuda_empty({4, 32}, DType::kBF16)));
  EXPECT_FALSE(skinny_linear_fits(cuda_empty({2, 48}, DType::kF32), cuda_empty({4, 48}, DType::kBF16)));
  EXPECT_FALSE(skinny_linear_fits(cuda_empty({2, 32}, DType::kF32), cuda_empty({4, 32}, DType::kF32)));
  EXPECT_FALSE(skinny_linear_fits(cuda_empty({2, 32}, DType::kF16), cuda_empty({4, 32}, DType::kBF16)));
  Tensor out = cuda_empty({17, 4}, DType::kF32);
  EXPECT_THROW(skinny_linear(cuda_empty({17, 32}, DType::kF32), cuda_empty({4, 32}, DType::kBF16), nullptr, out),
               Error);
}

// Speculative verification computes a request's last token and its drafts as
// rows of one call where plain decoding computes one row; where a row of a
// call is not bit for bit what a one-row call on it gives, greedy decoding
// with drafts can part from greedy decoding without them at a near tie. The
// warp-per-row kernel has that property up to kRowKernelMaxRows rows with
// any rows per warp, and the default choice has it up to
// kGemvDefaultRowExactRows rows. n = 33 and 1000 leave the last warp short of
// rows when it owns 2 or 4.
TEST(CudaGemm, SkinnyLinearRowsAreWhatOneRowCallsGive) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TestRng rng;
  for (const bool x_f32 : {false, true})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1000, 4096}, {33, 544}, {8192, 256}})
      for (int64_t m = 2; m <= cuda_kernels::kRowKernelMaxRows; ++m) {
        const Tensor x16 = testing::random_tensor(rng, {m, k}, DType::kBF16);
        const Tensor x = x_f32 ? x16.to_f32() : x16;
        const Tensor w = cuda_to_device(testing::random_tensor(rng, {n, k}, DType::kBF16, 0.05f));
        for (const int config : {cuda_kernels::kGemvDefault, cuda_kernels::kGemvRowKernel,
                                 cuda_kernels::kGemvRowKernel1, cuda_kernels::kGemvRowKernel2,
                                 cuda_kernels::kGemvRowKernel4}) {
          if (config == cuda_kernels::kGemvDefault && m > cuda_kernels::kGemvDefaultRowExactRows) continue;
          Tensor out = cuda_empty({m, n}, DType::kF32);
          skinny_linear(cuda_to_device(x), w, nullptr, out, nullptr, config);
          const Tensor all = cuda_to_host(out);
          for (int64_t r = 0; r < m; ++r) {
            Tensor one = cuda_empty({1, n}, DType::kF32);
            skinny_linear(cuda_to_device(x.rows(r, 1)), w, nullptr, one, nullptr);  // the default one-row call
            const Tensor got = cuda_to_host(one);
            EXPECT_EQ(
                std::memcmp(got.raw(), all.data<const float>() + r * n, static_cast<size_t>(n) * sizeof(float)), 0)
                << "row " << r << " of " << m << ", " << n << "x" << k << (x_f32 ? ", f32 x" : ", bf16 x")
                << ", config " << config;
          }
        }
      }
}

// The batch-invariant linear: any row count, each row the bits a one-row
// call gives (so also what any other call holding that row gives), and the
// product itself right (bf16 operands, f32 sums) against the reference.
TEST(CudaGemm, RowInvariantLinearRowsAreWhatOneRowCallsGive) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TestRng rng;
  for (const bool x_f32 : {false, true})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1000, 4096}, {33, 544}, {8192, 256}})
      for (const int64_t m : {1, 2, 3, 5, 16, 17, 33, 96, 97, 130}) {  // the tiled kernel from 97
        const Tensor x16 = testing::random_tensor(rng, {m, k}, DType::kBF16);
        const Tensor x = x_f32 ? x16.to_f32() : x16;
        const Tensor w16 = testing::random_tensor(rng, {n, k}, DType::kBF16, 0.05f);
        const Tensor w = cuda_to_device(w16);
        const Tensor bias = testing::random_tensor(rng, {n}, DType::kF32);
        const Tensor bias_d = cuda_to_device(bias);
        ASSERT_TRUE(row_invariant_linear_fits(cuda_to_device(x), w));
        Tensor out = cuda_empty({m, n}, DType::kF32);
        row_invariant_linear(cuda_to_device(x), w, &bias_d, out);
        const Tensor all = cuda_to_host(out);
        Tensor want = Tensor::empty({m, n}, DType::kF32);
        reference::linear(x16.to_f32(), w16.to_f32(), &bias, want);
        double worst = 0;
        for (int64_t i = 0; i < m * n; ++i)
          worst = std::max(worst, std::abs(double{all.data<const float>()[i]} - want.data<const float>()[i]));
        EXPECT_LT(worst, 1e-3) << m << "x" << n << "x" << k;
        for (const int64_t r : {int64_t{0}, m / 2, m - 1}) {
          Tensor one = cuda_empty({1, n}, DType::kF32);
          row_invariant_linear(cuda_to_device(x.rows(r, 1)), w, &bias_d, one);
          const Tensor got = cuda_to_host(one);
          EXPECT_EQ(std::memcmp(got.raw(), all.data<const float>() + r * n, static_cast<size_t>(n) * sizeof(float)),
                    0)
              << "row " << r << " of " << m << ", " << n << "x" << k << (x_f32 ? ", f32 x" : ", bf16 x");
        }
      }
  // Not for f32 weights or K off the 32-column grid.
  EXPECT_FALSE(row_invariant_linear_fits(cuda_empty({40, 32}, DType::kF32), cuda_empty({4, 32}, DType::kF32)));
  EXPECT_FALSE(row_invariant_linear_fits(cuda_empty({40, 48}, DType::kF32), cuda_empty({4, 48}, DType::kBF16)));
}

// The backend's batch-invariant mode routes linear through it (and refuses
// weights it cannot serve that way).
TEST(CudaGemm, BatchInvariantBackendLinearIsRowInvariant) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CudaBackend gpu;
  EXPECT_FALSE(gpu.batch_invariant());
  gpu.set_batch_invariant(true);
  EXPECT_TRUE(gpu.batch_invariant());
  TestRng rng;
  const int64_t m = 40, n = 300, k = 256;
  const Tensor x = cuda_to_device(testing::random_tensor(rng, {m, k}, DType::kF32));
  const Tensor w = cuda_to_device(testing::random_tensor(rng, {n, k}, DType::kBF16, 0.05f));
  Tensor all = cuda_empty({m, n}, DType::kF32);
  gpu.linear(x, w, nullptr, all);
  const Tensor all_h = cuda_to_host(all);
  for (const int64_t rows : {1, 3, 17}) {
    Tensor part = cuda_empty({rows, n}, DType::kF32);
    gpu.linear(x.rows(m - rows, rows), w, nullptr, part);
    const Tensor got = cuda_to_host(part);
    EXPECT_EQ(std::memcmp(got.raw(), all_h.data<const float>() + (m - rows) * n,
                          static_cast<size_t>(rows * n) * sizeof(float)),
              0)
        << rows << " rows";
  }
  Tensor out = cuda_empty({m, 4}, DType::kF32);
  EXPECT_THROW(gpu.linear(x, cuda_empty({4, k}, DType::kF32), nullptr, out), Error);
}

TEST(CudaGemm, MismatchesThrow) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CublasLt blas;
  const Tensor x = cuda_empty({2, 8}, DType::kBF16), w = cuda_empty({4, 8}, DType::kBF16);
  Tensor out = cuda_empty({2, 4}, DType::kBF16), wrong = cuda_empty({2, 5}, DType::kBF16);
  const Tensor w32 = cuda_empty({4, 8}, DType::kF32), host = Tensor::empty({2, 8}, DType::kBF16);
  EXPECT_THROW(blas.linear(x, w, nullptr, wrong), Error);
  EXPECT_THROW(blas.linear(x, w32, nullptr, out), Error);
  EXPECT_THROW(blas.linear(host, w, nullptr, out), Error);
  const Tensor bad_bias = cuda_empty({5}, DType::kBF16);
  EXPECT_THROW(blas.linear(x, w, &bad_bias, out), Error);
}

// The op profiler: names (linear with its shape), call counts, GPU time and
// the byte and FLOP counts it derives; profile() hands the totals over once.
TEST(CudaProfiler, CountsOpsAndClears) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CudaBackend gpu;
  TestRng rng;
  const Tensor x = cuda_to_device(testing::random_tensor(rng, {3, 64}, DType::kBF16));
  const Tensor w = cuda_to_device(testing::random_tensor(rng, {32, 64}, DType::kBF16));
  const Tensor norm_w = cuda_to_device(testing::random_tensor(rng, {64}, DType::kBF16));
  Tensor out = cuda_empty({3, 32}, DType::kF32), normed = cuda_empty({3, 64}, DType::kBF16);
  gpu.linear(x, w, nullptr, out);  // not profiled
  gpu.set_profiling(true);
  for (int i = 0; i < 2; ++i) gpu.linear(x, w, nullptr, out);
  gpu.rms_norm(x, norm_w, 1e-5f, normed);
  const std::vector<OpTime> ops = gpu.profile();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].op, "linear 32x64");
  EXPECT_EQ(ops[0].calls, 2);
  EXPECT_GT(ops[0].ms, 0.0);
  EXPECT_DOUBLE_EQ(ops[0].flops, 2 * 2.0 * 3 * 32 * 64);
  EXPECT_DOUBLE_EQ(ops[0].bytes, 2 * (3 * 64 * 2.0 + 32 * 64 * 2.0 + 3 * 32 * 4.0));
  EXPECT_EQ(ops[1].op, "rms_norm");
  EXPECT_EQ(ops[1].calls, 1);
  EXPECT_TRUE(gpu.profile().empty());  // handed over
  gpu.set_profiling(false);
  gpu.linear(x, w, nullptr, out);
  EXPECT_TRUE(gpu.profile().empty());
}

}  // namespace
}  // namespace basalt
