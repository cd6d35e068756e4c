// cuBLASLt linear against the reference op: f32 and bf16, with and without a
// fused bias, on odd and model-like shapes; outputs poisoned with NaN first.
#include "backend/cuda/gemm.h"

#include <gtest/gtest.h>

#include <utility>

#include "backend/cpu/backend_test_util.h"
#include "backend/cuda/device.h"
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

}  // namespace
}  // namespace basalt
