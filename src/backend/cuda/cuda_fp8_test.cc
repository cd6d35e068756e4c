// cuda_quantize_fp8_groups against a host reference that applies the same
// rule (fp8.h) with the project's own e4m3 conversion (core/dtype.h): q and
// scales must be equal bit for bit, and the dequantized values within half
// an e4m3 ulp of x. f32 and bf16 inputs, partial last groups, all-zero
// groups and rows of very large and very small magnitude. Skips where no
// device is present.
#include "backend/cuda/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/backend_test_util.h"
#include "backend/cuda/device.h"
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

}  // namespace
}  // namespace basalt
