// The f32-accumulating linear kernel (linear.cc) built for one instruction
// set at a time, as int_linear_isa_test.cc does for the integer kernel: AVX2
// without AVX-512 and scalar, whatever the machine's own -march (the native
// build is tested by cpu_linear_test.cc and cpu_batch_invariance_test.cc).
// Each build must give every token row the same bits whether it is computed
// alone (the direct regime) or among 40 rows (the panel regime, with its
// own register tile), and values near a double-precision product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear.h"
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

struct Shape {
  int64_t outs, in;
};

std::vector<uint16_t> to_half(const std::vector<float>& w, DType dtype) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = dtype == DType::kF16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
  return out;
}

TEST(LinearIsa, PanelRowsAreDirectRowsBitForBit) {
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "no AVX2/FMA here";
#endif
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t tokens = 40;
  ASSERT_GE(tokens, linear_panel_min_tokens());
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    // 11 x 4500: one token's row outgrows what the direct kernel reads row by
    // row (kRowByRowMaxXBytes), so it takes the 8-row blocks.
    for (const Shape s : {Shape{13, 300}, Shape{29, 1030}, Shape{7, 64}, Shape{11, 4500}}) {
      std::vector<float> w(static_cast<size_t>(s.outs * s.in)), x(static_cast<size_t>(tokens * s.in));
      for (float& v : w) v = normal(rng) * 0.1f;
      for (float& v : x) v = normal(rng);
      const std::vector<uint16_t> half = to_half(w, dtype);
      if (dtype != DType::kF32)  // the f32 copy holds what the kernel multiplies
        for (size_t i = 0; i < w.size(); ++i) w[i] = dtype == DType::kF16 ? f16_to_f32(half[i]) : bf16_to_f32(half[i]);
      const void* weights = dtype == DType::kF32 ? static_cast<const void*>(w.data()) : half.data();
      std::vector<float> all(static_cast<size_t>(tokens * s.outs)), one(static_cast<size_t>(s.outs));
      linear_f32(pool, x.data(), tokens, s.in, weights, dtype, s.outs, nullptr, DType::kF32, all.data(),
                 Bf16Activations::kF32);
      for (int64_t t = 0; t < tokens; ++t) {
        linear_f32(pool, x.data() + t * s.in, 1, s.in, weights, dtype, s.outs, nullptr, DType::kF32, one.data(),
                   Bf16Activations::kF32);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + t * s.outs, sizeof(float) * s.outs), 0)
            << dtype_name(dtype) << " " << s.outs << "x" << s.in << " token " << t;
        for (int64_t n = 0; n < s.outs; ++n) {
          double want = 0.0, scale = 0.0;
          for (int64_t k = 0; k < s.in; ++k) {
            want += static_cast<double>(x[t * s.in + k]) * w[n * s.in + k];
            scale += std::fabs(static_cast<double>(x[t * s.in + k]) * w[n * s.in + k]);
          }
          ASSERT_NEAR(one[n], want, 1e-5 * scale + 1e-6) << dtype_name(dtype) << " token " << t << " row " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace basalt::cpu
