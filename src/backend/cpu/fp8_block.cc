#include "backend/cpu/fp8_block.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt::cpu {
namespace {

constexpr int64_t kBlock = kFp8BlockSize;

// e4m3fn bits -> f32, exactly, for the scalar tails: move exponent and
// mantissa into f32 positions and rebias the exponent (7 -> 127) with one
// multiply by 2^120, which also turns e4m3 subnormals into the right values.
inline float fp8_scalar(uint8_t b) {
  const uint32_t bits = (static_cast<uint32_t>(b & 0x7f) << 20);
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p120f;
  return (b & 0x80) ? -f : f;
}

// The vector paths read e4m3 codes as f16 bit patterns: sign-extending the
// byte to 16 bits and shifting left by 7 puts the sign at bit 15, the 4-bit
// exponent and 3-bit mantissa at bits 14..7 (bit 14, a copy of the sign, is
// then cleared), which is the f16 of value / 2^8 (exponent bias 15 instead of
// 7; e4m3 subnormals become f16 subnormals, converted exactly). Callers fold
// the 2^8 into the block scale. kFp8Unit is that factor.
constexpr float kFp8Unit = 256.0f;

#if defined(__AVX512F__)
inline Vec vload_fp8_unit(const uint8_t* p) {
  const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(int16_t(0xBFFF))));
}
#elif defined(__AVX2__) && defined(__F16C__)
inline Vec vload_fp8_unit(const uint8_t* p) {
  const __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(int16_t(0xBFFF))));
}
#else
inline Vec vload_fp8_unit(const uint8_t* p) {
  alignas(64) float f[kLanes];
  for (int i = 0; i < kLanes; ++i) f[i] = fp8_scalar(p[i]) / kFp8Unit;
  return vload(f);
}
#endif

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
    for (; k < k1; ++k) dst[k] = fp8_scalar(row[k]) * s;
  }
}

// Few tokens: each row is converted in registers and fed to up to four token
// rows at once; products of a block are summed unscaled and the block's
// scale is applied once per block and token.
void decode_rows(const float* x, int64_t tokens, int64_t K, const uint8_t* w,
                 const float* scale_inv, int64_t N, float* out, int64_t n0, int64_t n1) {
  const int64_t kb = (K + kBlock - 1) / kBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * K;
    const float* scales = scale_inv + (n / kBlock) * kb;
    for (int64_t t0 = 0; t0 < tokens; t0 += 4) {
      const int64_t nt = std::min<int64_t>(4, tokens - t0);
      const float* xs[4];
      for (int64_t i = 0; i < 4; ++i) xs[i] = x + (t0 + std::min(i, nt - 1)) * K;
      Vec acc0 = vzero(), acc1 = vzero(), acc2 = vzero(), acc3 = vzero();
      float tail[4] = {0, 0, 0, 0};
      for (int64_t b = 0; b < kb; ++b) {
        const int64_t k0 = b * kBlock, k1 = std::min(K, k0 + kBlock);
        const float s = scales[b];
        Vec b0 = vzero(), b1 = vzero(), b2 = vzero(), b3 = vzero();
        int64_t k = k0;
        if (nt == 1) {
          for (; k + kLanes <= k1; k += kLanes) b0 = vfma(vload(xs[0] + k), vload_fp8_unit(row + k), b0);
        } else {
          for (; k + kLanes <= k1; k += kLanes) {
            const Vec wv = vload_fp8_unit(row + k);
            b0 = vfma(vload(xs[0] + k), wv, b0);
            b1 = vfma(vload(xs[1] + k), wv, b1);
            b2 = vfma(vload(xs[2] + k), wv, b2);
            b3 = vfma(vload(xs[3] + k), wv, b3);
          }
        }
        const Vec sv = vset(s * kFp8Unit);
        acc0 = vfma(b0, sv, acc0);
        acc1 = vfma(b1, sv, acc1);
        acc2 = vfma(b2, sv, acc2);
        acc3 = vfma(b3, sv, acc3);
        for (; k < k1; ++k) {
          const float wk = fp8_scalar(row[k]) * s;
          for (int64_t i = 0; i < 4; ++i) tail[i] += xs[i][k] * wk;
        }
      }
      float sums[4];
      vsum4(acc0, acc1, acc2, acc3, sums);
      for (int64_t i = 0; i < nt; ++i) out[(t0 + i) * N + n] = sums[i] + tail[i];
    }
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
  const int64_t min_rows = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, in * tokens));
  pool.parallel_for(
      outs,
      [&](int64_t n0, int64_t n1) { decode_rows(x, tokens, in, w, scale_inv, outs, out, n0, n1); },
      min_rows);
}

void linear_weight_f32(ThreadPool& pool, const float* x, int64_t tokens, const LinearWeight& w,
                       float* out) {
  const int64_t N = w.weight.dim(0), K = w.weight.dim(1);
  if (w.block_fp8()) {
    linear_fp8_block_f32(pool, x, tokens, K, w.weight.data<const uint8_t>(),
                         w.scale_inv.data<const float>(), N, out);
  } else {
    linear_f32(pool, x, tokens, K, w.weight.raw(), w.weight.dtype(), N, nullptr, DType::kF32, out);
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
