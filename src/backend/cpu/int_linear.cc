#include "backend/cpu/int_linear.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/simd.h"  // immintrin.h where the target has AVX2
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

constexpr int64_t kTokenTile = 4;  // token rows that share one read of a weight row
constexpr int64_t kRowGrain = 16;  // weight rows per claimed chunk

// The quantized activations of a call: codes [tokens, blocks * 32] and block
// scales [tokens, blocks].
struct QuantizedRows {
  std::vector<int8_t> codes;
  std::vector<float> scales;
};

QuantizedRows& quantized_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

#if defined(__AVX2__)

// One weight row's f16 scales as f32, one per block of 32 columns (the
// hardware conversion where there is one: exact, as f16_to_f32 is).
void block_scales_f32(const IntWeightLayout& l, const uint16_t* scales, float* out) {
  const int64_t blocks = l.blocks();
#if defined(__F16C__)
  if (l.group == kIntBlock) {
    int64_t b = 0;
    for (; b + 8 <= blocks; b += 8)
      _mm256_storeu_ps(out + b, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + b))));
    for (; b < blocks; ++b) out[b] = _cvtsh_ss(scales[b]);
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) out[b] = _cvtsh_ss(scales[(b * kIntBlock) / l.group]);
#else
  for (int64_t b = 0; b < blocks; ++b) out[b] = f16_to_f32(scales[(b * kIntBlock) / l.group]);
#endif
}

// The 32 codes of block b of a weight row as signed bytes.
template <int kBits>
inline __m256i load_codes(const uint8_t* row, int64_t b) {
  if constexpr (kBits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kIntBlock));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * (kIntBlock / 2)));
    const __m128i low = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, low);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
  }
}

// Per 32-bit lane j: the exact sum of the four products x[4j + e] * w[4j + e].
inline __m256i lane_dots(__m256i w_magnitude, __m256i x_signed) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_magnitude, x_signed);
#else
  const __m256i pairs = _mm256_maddubs_epi16(w_magnitude, x_signed);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// v_j = even_j + odd_j, then the fixed tree of core/int_weights.h.
inline float finish(__m256 even, __m256 odd) {
  const __m256 v = _mm256_add_ps(even, odd);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// out[t, n] for the tile's token rows t0 .. t0 + nt (nt <= kTokenTile) and
// one weight row.
template <int kBits, int kTokens>
void tile_row(const IntWeightLayout& l, const int8_t* x_codes, const float* x_scales, int64_t x_stride_blocks,
              const uint8_t* w_row, const float* w_scales, float* out, int64_t out_stride) {
  __m256 even[kTokens], odd[kTokens];
  for (int t = 0; t < kTokens; ++t) even[t] = odd[t] = _mm256_setzero_ps();
  // acc += the block's lane dots times its scale product (activation block scale x weight scale).
  const auto add_block = [&](int64_t b, __m256(&acc)[kTokens]) {
    const __m256i w = load_codes<kBits>(w_row, b);
    const __m256i magnitude = _mm256_sign_epi8(w, w);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * x_stride_blocks + b;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_codes + xb * kIntBlock));
      const __m256 dots = _mm256_cvtepi32_ps(lane_dots(magnitude, _mm256_sign_epi8(x, w)));
      acc[t] = _mm256_fmadd_ps(dots, _mm256_set1_ps(x_scales[xb] * w_scales[b]), acc[t]);
    }
  };
  // Even blocks into one accumulator, odd ones into the other (the
  // definition's order), unrolled so both stay in registers.
  const int64_t blocks = l.blocks();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    add_block(b, even);
    add_block(b + 1, odd);
  }
  if (b < blocks) add_block(b, even);
  for (int t = 0; t < kTokens; ++t) out[t * out_stride] = finish(even[t], odd[t]);
}

template <int kBits>
void rows_int(const IntWeightLayout& l, const QuantizedRows& q, int64_t tokens, const uint8_t* codes,
              const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, float* out) {
  const int64_t blocks = l.blocks(), code_cols = l.code_columns(), scale_cols = l.scale_columns();
  thread_local std::vector<float> row_scales;
  row_scales.resize(static_cast<size_t>(blocks));
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenTile) {
    const int64_t nt = std::min(kTokenTile, tokens - t0);
    const int8_t* xc = q.codes.data() + t0 * blocks * kIntBlock;
    const float* xs = q.scales.data() + t0 * blocks;
    for (int64_t n = n0; n < n1; ++n) {
      block_scales_f32(l, scales + n * scale_cols, row_scales.data());
      const uint8_t* w_row = codes + n * code_cols;
      float* o = out + t0 * outs + n;
      switch (nt) {
        case 1: tile_row<kBits, 1>(l, xc, xs, blocks, w_row, row_scales.data(), o, outs); break;
        case 2: tile_row<kBits, 2>(l, xc, xs, blocks, w_row, row_scales.data(), o, outs); break;
        case 3: tile_row<kBits, 3>(l, xc, xs, blocks, w_row, row_scales.data(), o, outs); break;
        default: tile_row<kBits, 4>(l, xc, xs, blocks, w_row, row_scales.data(), o, outs); break;
      }
    }
  }
}

#else  // no AVX2: the scalar definition

template <int kBits>
void rows_int(const IntWeightLayout& l, const QuantizedRows& q, int64_t tokens, const uint8_t* codes,
              const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, float* out) {
  const int64_t blocks = l.blocks();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t n = n0; n < n1; ++n)
      out[t * outs + n] = int_dot_reference(l, q.codes.data() + t * blocks * kIntBlock, q.scales.data() + t * blocks,
                                            codes + n * l.code_columns(), scales + n * l.scale_columns());
}

#endif

}  // namespace

void linear_int_f32(ThreadPool& pool, const float* x, int64_t tokens, const IntWeightLayout& l, const void* codes,
                    const uint16_t* scales, int64_t outs, const float* bias, float* out) {
  if (tokens == 0 || outs == 0) return;
  const int64_t K = l.in_features, blocks = l.blocks();
  QuantizedRows& q = quantized_rows();
  q.codes.resize(static_cast<size_t>(tokens * blocks * kIntBlock));
  q.scales.resize(static_cast<size_t>(tokens * blocks));
  pool.parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          quantize_int_activations(x + t * K, K, q.codes.data() + t * blocks * kIntBlock,
                                   q.scales.data() + t * blocks);
      },
      std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1)));
  const auto* w = static_cast<const uint8_t*>(codes);
  dynamic_for(pool, outs, kRowGrain, [&](int64_t n0, int64_t n1) {
    if (l.bits == 8) {
      rows_int<8>(l, q, tokens, w, scales, n0, n1, outs, out);
    } else {
      rows_int<4>(l, q, tokens, w, scales, n0, n1, outs, out);
    }
    if (bias != nullptr)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t n = n0; n < n1; ++n) out[t * outs + n] += bias[n];
  });
}

}  // namespace basalt::cpu
