#include "backend/cpu/fp8_block.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/int_linear.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt::cpu {
namespace {

constexpr int64_t kBlock = kFp8BlockSize;

// dst[0, K) = dequantized row n.
void dequant_row(const uint8_t* w, const float* scale_inv, int64_t K, int64_t n, float* dst) {
  const int64_t kb = (K + kBlock - 1) / kBlock;
  const uint8_t* row = w + n * K;
  const float* scales = scale_inv + (n / kBlock) * kb;
  for (int64_t b = 0; b < kb; ++b) {
    const int64_t k0 = b * kBlock, k1 = std::min(K, k0 + kBlock);
    const float s = scales[b];
    const Vec sv = vset(s * kFp8Unit);
    int64_t k = k0;
    for (; k + kLanes <= k1; k += kLanes) vstore(dst + k, vmul(vload_fp8_unit(row + k), sv));
    for (; k < k1; ++k) dst[k] = fp8_unit_scalar(row[k]) * (s * kFp8Unit);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc = vzero();
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc = vfma(vload(a + k), vload(b + k), acc);
  float s = vsum(acc);
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

// Many tokens: a panel of rows is dequantized once into scratch and
// multiplied with every token row by the f32 linear kernel (which runs
// serially inside this thread's share, as nested pool calls do).
void panel_rows(ThreadPool& pool, const float* x, int64_t tokens, int64_t K, const uint8_t* w,
                const float* scale_inv, int64_t N, float* out, int64_t n0, int64_t n1) {
  constexpr int64_t kPanel = 64;
  thread_local std::vector<float> panel, result;
  panel.resize(static_cast<size_t>(kPanel * K));
  result.resize(static_cast<size_t>(kPanel * tokens));
  for (int64_t p0 = n0; p0 < n1; p0 += kPanel) {
    const int64_t np = std::min(kPanel, n1 - p0);
    for (int64_t i = 0; i < np; ++i) dequant_row(w, scale_inv, K, p0 + i, panel.data() + i * K);
    linear_f32(pool, x, tokens, K, panel.data(), DType::kF32, np, nullptr, DType::kF32, result.data());
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(result.data() + t * np, np, out + t * N + p0);
  }
}

float load_scale(const LinearWeight& w, int64_t n, int64_t k) {
  const int64_t kb = (w.weight.dim(1) + kBlock - 1) / kBlock;
  return w.scale_inv.data<const float>()[(n / kBlock) * kb + k / kBlock];
}

}  // namespace

void linear_fp8_block_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                          const uint8_t* w, const float* scale_inv, int64_t outs, float* out) {
  if (tokens > 8) {
    // Whole 64-row panels per task, so that each panel is dequantized once.
    const int64_t panels = (outs + 63) / 64;
    pool.parallel_for(panels, [&](int64_t p0, int64_t p1) {
      panel_rows(pool, x, tokens, in, w, scale_inv, outs, out, p0 * 64, std::min(outs, p1 * 64));
    });
    return;
  }
  linear_fp8_block_direct(pool, x, tokens, in, w, scale_inv, outs, out);
}

void linear_weight_f32(ThreadPool& pool, const float* x, int64_t tokens, const LinearWeight& w,
                       float* out, Bf16Activations bf16_activations) {
  const int64_t N = w.weight.dim(0), K = w.weight.dim(1);
  if (w.int_quantized()) {
    linear_int_f32(pool, x, tokens, w.int_layout, w.weight.raw(), w.scales.data<const uint16_t>(), N, nullptr, out);
  } else if (w.block_fp8()) {
    linear_fp8_block_f32(pool, x, tokens, K, w.weight.data<const uint8_t>(),
                         w.scale_inv.data<const float>(), N, out);
  } else {
    linear_f32(pool, x, tokens, K, w.weight.raw(), w.weight.dtype(), N, nullptr, DType::kF32, out,
               bf16_activations);
  }
}

void weight_row_f32(const LinearWeight& w, int64_t n, float* dst) {
  const int64_t K = w.weight.dim(1);
  if (w.block_fp8()) {
    dequant_row(w.weight.data<const uint8_t>(), w.scale_inv.data<const float>(), K, n, dst);
    return;
  }
  switch (w.weight.dtype()) {
    case DType::kF32: std::memcpy(dst, w.weight.data<const float>() + n * K, K * sizeof(float)); return;
    case DType::kBF16: {
      const uint16_t* row = w.weight.data<const uint16_t>() + n * K;
      int64_t k = 0;
      for (; k + kLanes <= K; k += kLanes) vstore(dst + k, vload_bf16(row + k));
      for (; k < K; ++k) dst[k] = bf16_to_f32(row[k]);
      return;
    }
    case DType::kF16: {
      const uint16_t* row = w.weight.data<const uint16_t>() + n * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = f16_to_f32(row[k]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* row = w.weight.data<const uint8_t>() + n * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = fp8e4m3_to_f32(row[k]);
      return;
    }
    default: fail("weight row: unsupported dtype {}", dtype_name(w.weight.dtype()));
  }
}

float weight_row_dot(const LinearWeight& w, int64_t n, const float* x) {
  const int64_t K = w.weight.dim(1);
  if (w.weight.dtype() == DType::kF32) return dot(x, w.weight.data<const float>() + n * K, K);
  if (w.weight.dtype() == DType::kBF16) {
    const uint16_t* row = w.weight.data<const uint16_t>() + n * K;
    Vec acc = vzero();
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) acc = vfma(vload(x + k), vload_bf16(row + k), acc);
    float s = vsum(acc);
    for (; k < K; ++k) s += x[k] * bf16_to_f32(row[k]);
    return s;
  }
  if (w.block_fp8()) {
    const uint8_t* row = w.weight.data<const uint8_t>() + n * K;
    float total = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
      const int64_t k1 = std::min(K, k0 + kBlock);
      Vec acc = vzero();
      int64_t k = k0;
      for (; k + kLanes <= k1; k += kLanes) acc = vfma(vload(x + k), vload_fp8_unit(row + k), acc);
      float s = vsum(acc) * kFp8Unit;
      for (; k < k1; ++k) s += x[k] * fp8_scalar(row[k]);
      total += s * load_scale(w, n, k0);
    }
    return total;
  }
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(K));
  weight_row_f32(w, n, buf.data());
  return dot(x, buf.data(), K);
}

void weight_row_axpy(const LinearWeight& w, int64_t n, float a, float* y) {
  const int64_t K = w.weight.dim(1);
  const Vec av = vset(a);
  if (w.weight.dtype() == DType::kBF16) {
    const uint16_t* row = w.weight.data<const uint16_t>() + n * K;
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) vstore(y + k, vfma(av, vload_bf16(row + k), vload(y + k)));
    for (; k < K; ++k) y[k] += a * bf16_to_f32(row[k]);
    return;
  }
  if (w.block_fp8()) {
    const uint8_t* row = w.weight.data<const uint8_t>() + n * K;
    for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
      const int64_t k1 = std::min(K, k0 + kBlock);
      const float as = a * load_scale(w, n, k0);
      const Vec asv = vset(as * kFp8Unit);
      int64_t k = k0;
      for (; k + kLanes <= k1; k += kLanes) vstore(y + k, vfma(asv, vload_fp8_unit(row + k), vload(y + k)));
      for (; k < k1; ++k) y[k] += as * fp8_scalar(row[k]);
    }
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(K));
  weight_row_f32(w, n, buf.data());
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) vstore(y + k, vfma(av, vload(buf.data() + k), vload(y + k)));
  for (; k < K; ++k) y[k] += a * buf[k];
}

}  // namespace basalt::cpu
