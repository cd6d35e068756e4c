// Helpers for testing a Backend against backend/reference_ops.h.
//
// Contract: test-only. Every test draws a fresh seed (printed with each
// failure, and fixed by setting BASALT_TEST_SEED to reproduce it), builds host
// tensors of random values that are exact in their dtype, poisons outputs
// with NaN (or a sentinel for integers) before a call so that unwritten
// elements are caught, and compares with relative error norms
// ||out - ref|| / ||ref||. Written for host tensors; a device backend's tests
// copy to the device before the call and back after it.
#pragma once

#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace basalt::testing {

inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("BASALT_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// A seeded generator whose seed is reported by every failing assertion in
// the scope that created it.
class TestRng {
 public:
  TestRng() : seed_(fresh_seed()), engine_(seed_), trace_(__FILE__, __LINE__, description()) {}

  uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return engine_; }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(engine_); }
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(engine_); }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }

 private:
  std::string description() const { return "BASALT_TEST_SEED=" + std::to_string(seed_); }

  uint64_t seed_;
  std::mt19937_64 engine_;
  ::testing::ScopedTrace trace_;
};

inline void store_value(Tensor& t, int64_t i, float v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = v; break;
    case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(v); break;
    case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(v); break;
    case DType::kF8E4M3: t.data<uint8_t>()[i] = f32_to_fp8e4m3(v); break;
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::kI8: t.data<int8_t>()[i] = static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f)); break;
    case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f)); break;
  }
}

// Normally distributed values of the given spread, rounded into dtype.
inline Tensor random_tensor(TestRng& rng, Shape shape, DType dtype, float stddev = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  for (int64_t i = 0; i < t.numel(); ++i) store_value(t, i, rng.normal(stddev));
  return t;
}

inline Tensor i32_tensor(const std::vector<int32_t>& values) {
  return Tensor::from_i32({static_cast<int64_t>(values.size())}, values);
}

// Fills t with NaN (floating) or a large negative sentinel (integers).
inline void poison(Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (is_floating(t.dtype())) {
      store_value(t, i, std::numeric_limits<float>::quiet_NaN());
    } else if (t.dtype() == DType::kI32) {
      t.data<int32_t>()[i] = -1234567;
    } else {
      t.data<int64_t>()[i] = -1234567;
    }
  }
}

inline Tensor poisoned(Shape shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  poison(t);
  return t;
}

inline Tensor clone(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes()) std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

// Number of elements that are NaN (a poisoned output element never written).
inline int64_t count_nan(const Tensor& t) {
  const Tensor f = t.to_f32();
  int64_t n = 0;
  for (int64_t i = 0; i < f.numel(); ++i) n += std::isnan(f.data<float>()[i]) ? 1 : 0;
  return n;
}

// ||out - ref|| / ||ref|| over all elements (infinity if shapes differ or out
// has a NaN; the absolute norm when ref is all zeros).
inline double relative_error(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) return std::numeric_limits<double>::infinity();
  const Tensor a = out.to_f32(), b = ref.to_f32();
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ||t|| (Euclidean, over all elements, as f64).
inline double norm(const Tensor& t) {
  const Tensor f = t.to_f32();
  double sum = 0.0;
  for (int64_t i = 0; i < f.numel(); ++i) sum += double{f.data<float>()[i]} * f.data<float>()[i];
  return std::sqrt(sum);
}

// ||out - ref|| (infinity if shapes differ or out has a NaN).
inline double error_norm(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) return std::numeric_limits<double>::infinity();
  const Tensor a = out.to_f32(), b = ref.to_f32();
  double diff = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    diff += (x - y) * (x - y);
  }
  return std::sqrt(diff);
}

inline bool bytes_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace basalt::testing
