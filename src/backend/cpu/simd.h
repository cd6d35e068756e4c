// A thin SIMD layer for the CPU kernels.
//
// Contract: one float vector type `Vec` of kLanes lanes and the few operations
// the kernels need, implemented with AVX-512F when the compiler targets it,
// with AVX2 + FMA otherwise, and as plain scalar code (kLanes == 1) on any
// other target, so every kernel is written once and compiles everywhere.
// Weight loads convert bf16/f16 to f32 exactly (the same bits as
// bf16_to_f32/f16_to_f32 of core/dtype.h). vexp is accurate to about 2 ulp
// (Cephes polynomial), propagates NaN and maps -inf to 0. With AVX-512 it
// covers the whole float range; the AVX2 version builds 2^n in the exponent
// field, so results below 2^-126 become 0 and x > 88.38 saturates near 2.4e38
// instead of +inf, which no softmax or sigmoid here can tell apart.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*(), which its
// own -Wmaybe-uninitialized then reports wherever the intrinsic is inlined
// (GCC bug 105593, fixed in 13). The pragma covers the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace basalt::cpu {

// Whether this machine's cores are Intel's, asked once at run time. Tuning
// that measured faster on Intel's cores and not on AMD's keys on it: the
// 512-bit integer kernel (Zen 4 splits 512-bit operations) and software
// prefetch of streamed weight rows (Zen 4's own prefetchers streamed as fast
// or faster without it).
// How far ahead the float-weight decode kernels prefetch a weight row on
// Intel's cores (bf16_linear.cc, linear.cc; the integer kernels measured
// best at 4 KB and keep their own).
inline constexpr int64_t kWeightPrefetchBytes = 2048;

inline bool intel_cores() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}

#if defined(__AVX512F__)

inline constexpr int kLanes = 16;
using Vec = __m512;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float v) { return _mm512_set1_ps(v); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
// Loads the first n (< kLanes) floats of p and zeroes the other lanes,
// without touching memory past p + n.
inline Vec vload_partial(const float* p, int n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
inline void vstore_partial(float* p, Vec v, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
}
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
inline float vmax_lanes(Vec v) { return _mm512_reduce_max_ps(v); }

// out[0..3] = the lane sums of a, b, c and d, sharing the shuffles.
inline void vsum4(Vec a, Vec b, Vec c, Vec d, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // Each 128-bit lane now holds partial sums [a, b, c, d].
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 halves = _mm512_add_ps(abcd, _mm512_shuffle_f32x4(abcd, abcd, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m128 quarters = _mm_add_ps(_mm512_castps512_ps128(halves),
                                     _mm512_castps512_ps128(_mm512_shuffle_f32x4(
                                         halves, halves, _MM_SHUFFLE(2, 3, 0, 1))));
  _mm_storeu_ps(out, quarters);
}

inline Vec vload_bf16(const uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline Vec vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline Vec vexp(Vec x) {
  // Clamp with x as the second operand so that a NaN x passes through.
  x = _mm512_min_ps(_mm512_set1_ps(88.7228394f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-103.972084f), x);
  const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  Vec y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  // scalef computes y * 2^n with correct overflow, subnormals and underflow.
  return _mm512_scalef_ps(y, n);
}

#elif defined(__AVX2__) && defined(__FMA__)

inline constexpr int kLanes = 8;
using Vec = __m256;

inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float v) { return _mm256_set1_ps(v); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline __m256i partial_mask(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}
inline Vec vload_partial(const float* p, int n) { return _mm256_maskload_ps(p, partial_mask(n)); }
inline void vstore_partial(float* p, Vec v, int n) { _mm256_maskstore_ps(p, partial_mask(n), v); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vmax_lanes(Vec v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline void vsum4(Vec a, Vec b, Vec c, Vec d, float* out) {
  const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256 abcd = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

inline Vec vload_bf16(const uint16_t* p) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline Vec vload_f16(const uint16_t* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int i = 0; i < 8; ++i) f[i] = f16_to_f32(p[i]);
  return _mm256_load_ps(f);
#endif
}

inline Vec vexp(Vec x) {
  // Without scalef, 2^n is built in the exponent field, which covers n in
  // [-126, 127]; inputs below the clamp (true result < 2^-126) become 0.
  const Vec low = _mm256_set1_ps(-87.3365402f);
  const Vec underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762589f), x);
  x = _mm256_max_ps(low, x);
  const Vec n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  Vec y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
  return _mm256_andnot_ps(underflow, y);
}

#else

inline constexpr int kLanes = 1;
using Vec = float;

inline Vec vzero() { return 0.0f; }
inline Vec vset(float v) { return v; }
inline Vec vload(const float* p) { return *p; }
inline void vstore(float* p, Vec v) { *p = v; }
inline Vec vload_partial(const float* p, int n) { return n > 0 ? *p : 0.0f; }
inline void vstore_partial(float* p, Vec v, int n) {
  if (n > 0) *p = v;
}
inline Vec vadd(Vec a, Vec b) { return a + b; }
inline Vec vsub(Vec a, Vec b) { return a - b; }
inline Vec vmul(Vec a, Vec b) { return a * b; }
inline Vec vdiv(Vec a, Vec b) { return a / b; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }
// Always fused: a * b + c would be contracted into an FMA in some inlined
// copies and not in others (GCC's default -ffp-contract=fast where the target
// has FMA), and two regimes of one op would then round differently.
inline Vec vfma(Vec a, Vec b, Vec c) { return std::fma(a, b, c); }
inline float vsum(Vec v) { return v; }
inline float vmax_lanes(Vec v) { return v; }
inline void vsum4(Vec a, Vec b, Vec c, Vec d, float* out) {
  out[0] = a;
  out[1] = b;
  out[2] = c;
  out[3] = d;
}
inline Vec vload_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
inline Vec vload_f16(const uint16_t* p) { return f16_to_f32(*p); }
inline Vec vexp(Vec x) { return std::exp(x); }

#endif

// Pins v to a register at this point. GCC likes to fold a reused load into
// every FMA that consumes it (one load per FMA); in a register-blocked
// microkernel that doubles the loads and makes L1 the bottleneck.
inline void vpin(Vec& v) {
#if defined(__AVX2__) || defined(__AVX512F__)
  __asm__("" : "+v"(v));
#else
  (void)v;
#endif
}

// --- e4m3 (fp8) weights -------------------------------------------------------

// e4m3fn bits -> f32, exactly: move exponent and mantissa into f32 positions
// and rebias the exponent (7 -> 127) with one multiply by 2^120, which also
// turns e4m3 subnormals into the right values. NaN encodings (0x7f, 0xff) are
// not produced by quantizers and read as 480.
inline float fp8_scalar(uint8_t b) {
  const uint32_t bits = (static_cast<uint32_t>(b & 0x7f) << 20);
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p120f;
  return (b & 0x80) ? -f : f;
}

// The vector loads read e4m3 codes as f16 bit patterns: sign-extending the
// byte to 16 bits and shifting left by 7 puts the sign at bit 15, the 4-bit
// exponent and 3-bit mantissa at bits 14..7 (bit 14, a copy of the sign, is
// then cleared), which is the f16 of value / 2^8 (exponent bias 15 instead of
// 7; e4m3 subnormals become f16 subnormals, converted exactly). kFp8Unit is
// that factor: callers fold it into the block scale. fp8_unit_scalar is the
// same value for one code, so scalar tails round exactly as vector bodies.
inline constexpr float kFp8Unit = 256.0f;
inline float fp8_unit_scalar(uint8_t b) { return fp8_scalar(b) / kFp8Unit; }

#if defined(__AVX512F__)
inline Vec vload_fp8_unit(const uint8_t* p) {
  const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(int16_t(0xBFFF))));
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline Vec vload_fp8_unit(const uint8_t* p) {
  const __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(int16_t(0xBFFF))));
}
#else
inline Vec vload_fp8_unit(const uint8_t* p) {
  alignas(64) float f[kLanes];
  for (int i = 0; i < kLanes; ++i) f[i] = fp8_unit_scalar(p[i]);
  return vload(f);
}
#endif

// The largest of x[0 .. n): kLanes-wide maxima, their lanes, then the tail
// (-inf for n = 0). Exact in any order, since max rounds nothing; whether a
// NaN among the values comes back depends on where it sits. The softmax op
// and the CPU MLA attention's softmax share it.
inline float row_max(const float* x, int64_t n) {
  Vec m = vset(-INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) m = vmax(m, vload(x + i));
  float result = vmax_lanes(m);
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

}  // namespace basalt::cpu
