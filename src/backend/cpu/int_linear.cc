#include "backend/cpu/int_linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/simd.h"  // immintrin.h where the target has AVX2
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

constexpr int64_t kTokenTile = 4;  // token rows that share one read of a weight row
constexpr int64_t kRowGrain = 16;  // the fewest weight rows per claimed chunk

// The quantized activations of a call: codes [tokens, blocks * 32], block
// scales [tokens, blocks] and, where the kernel multiplies offset codes (see
// kOffsetCodes), each block's eight lane corrections [tokens, blocks, 8]
// (16 bits: at most 8 * 4 * 127 in magnitude).
struct QuantizedRows {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int16_t> corrections;
};

QuantizedRows& quantized_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

// int4's activations in the pair layout of Intel's 512-bit path (below).
struct PairRows;

#if defined(__AVX2__)

// int4 multiplies the weight codes as unsigned bytes, code + 8 (the stored
// nibbles), by the signed activation codes, and starts each lane's integer
// sum at -8 * (the lane's four activation codes summed), so the lane ends
// at the exact p_j of the definition with no per-block sign work (products
// of at most 15 * 127 keep AVX2's 16-bit pair sums from saturating). int8
// multiplies the weights' magnitudes by activations carrying their signs:
// its offset form (code ^ 0x80, corrections of -128 * the lane sums) was
// measured slower on the 8192-wide rows, whose 32-bit corrections pushed
// the activations out of L1.
template <int kBits>
constexpr bool kOffsetCodes = kBits == 4;
constexpr int kCodeOffset = 8;

// The lane corrections -8 * sum(x[4 j .. 4 j + 3]) of one block, as 16 bits.
inline __m128i lane_correction(__m256i x) {
  const __m256i pair_sums = _mm256_maddubs_epi16(_mm256_set1_epi8(1), x);
  const __m256i lane_sums = _mm256_madd_epi16(pair_sums, _mm256_set1_epi16(1));
  const __m256i c = _mm256_mullo_epi32(lane_sums, _mm256_set1_epi32(-kCodeOffset));
  // Pack the eight 32-bit lanes to 16 bits, in order.
  const __m256i packed = _mm256_packs_epi32(c, c);  // per 128-bit half: c0..c3 c0..c3
  return _mm_unpacklo_epi64(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
}

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

// out[b] = x_scales[b] * w_scales[b]: the definition's per-block f32 product
// (vector and scalar multiplies round alike).
void scale_products(const float* x_scales, const float* w_scales, int64_t blocks, float* out) {
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8)
    _mm256_storeu_ps(out + b, _mm256_mul_ps(_mm256_loadu_ps(x_scales + b), _mm256_loadu_ps(w_scales + b)));
  for (; b < blocks; ++b) out[b] = x_scales[b] * w_scales[b];
}

// The 32 codes of block b of a weight row as bytes: code + offset
// (unsigned) under kOffsetCodes, else the signed codes.
template <int kBits>
inline __m256i load_codes(const uint8_t* row, int64_t b) {
  if constexpr (kBits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kIntBlock));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * (kIntBlock / 2)));
    const __m128i low = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, low);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
    return _mm256_set_m128i(hi, lo);
  }
}

// Software prefetch of a weight row's codes kPrefetchBytes ahead, called
// once per pair of blocks (b even), on Intel's cores (intel_cores()). A
// decode step reads each weight byte once, and there one core's own loads
// leave too few misses in flight to stream at the memory's rate: with the
// prefetch two threads of an Emerald Rapids VM went from ~13 to ~20 GB/s in
// the int8 loop (bench/README.md). 4 KB ahead decoded faster than 1, 2 or 8
// KB there (int8 and int4 alike, alternated). Addresses past the rows are
// only prefetched, never read.
constexpr int64_t kPrefetchBytes = 4096;
template <int kBits>
inline void prefetch_codes(const uint8_t* row, int64_t b) {
  constexpr int64_t kBlockBytes = kBits == 8 ? kIntBlock : kIntBlock / 2;
  const char* ahead = reinterpret_cast<const char*>(row + b * kBlockBytes) + kPrefetchBytes;
  // int4: a pair is 32 bytes, so one line per two pairs.
  if (kBits == 8 || (b & 2) == 0) _mm_prefetch(ahead, _MM_HINT_T0);
}

// Per 32-bit lane j: the exact sum p_j of the four products x[4j + e] *
// code[4j + e] (w as load_codes gives it; c the block's lane corrections
// under kOffsetCodes).
template <int kBits>
inline __m256i lane_dots(__m256i w, __m256i x, const int16_t* c) {
  if constexpr (kOffsetCodes<kBits>) {
    const __m256i start = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(start, w, x);
#else
    return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
  } else {  // int8: magnitudes times activations carrying the weights' signs
    const __m256i magnitude = _mm256_sign_epi8(w, w), x_signed = _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, x_signed);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x_signed), _mm256_set1_epi16(1));
#endif
  }
}

// v_j = even_j + odd_j, then the fixed tree of core/int_weights.h.
inline float finish(__m256 even, __m256 odd) {
  const __m256 v = _mm256_add_ps(even, odd);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// The activation side of a tile: kTokens token rows' codes, block scales
// and lane corrections, `blocks` blocks apart.
struct TokenTile {
  const int8_t* codes;
  const float* scales;
  const int16_t* corrections;
  int64_t blocks;
};

// out[t, n] for the tile's kTokens token rows and one weight row; products
// holds each token row's per-block scale products, [kTokens][blocks]. A
// weight block is loaded and unpacked once for all kTokens rows.
template <int kBits, int kTokens, bool kPrefetch>
void tile_row(const TokenTile& x, const uint8_t* w_row, const float* products, float* out, int64_t out_stride) {
  const int64_t blocks = x.blocks;
  __m256 even[kTokens], odd[kTokens];
  for (int t = 0; t < kTokens; ++t) even[t] = odd[t] = _mm256_setzero_ps();
  // acc += the block's lane dots times its scale product.
  const auto add_block = [&](int64_t b, __m256(&acc)[kTokens]) {
    const __m256i w = load_codes<kBits>(w_row, b);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      const __m256i xc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + xb * kIntBlock));
      const __m256 dots = _mm256_cvtepi32_ps(lane_dots<kBits>(w, xc, x.corrections + xb * 8));
      acc[t] = _mm256_fmadd_ps(dots, _mm256_set1_ps(products[xb]), acc[t]);
    }
  };
  // Even blocks into one accumulator, odd ones into the other (the
  // definition's order), unrolled so both stay in registers.
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    if constexpr (kPrefetch) prefetch_codes<kBits>(w_row, b);
    add_block(b, even);
    add_block(b + 1, odd);
  }
  if (b < blocks) add_block(b, even);
  for (int t = 0; t < kTokens; ++t) out[t * out_stride] = finish(even[t], odd[t]);
}

// tile_row for a token count known only at run time (1 <= nt <= kTokenTile).
template <int kBits, bool kPrefetch>
void tile_row_any(int64_t nt, const TokenTile& x, const uint8_t* w_row, const float* products, float* out,
                  int64_t out_stride) {
  switch (nt) {
    case 1: tile_row<kBits, 1, kPrefetch>(x, w_row, products, out, out_stride); break;
    case 2: tile_row<kBits, 2, kPrefetch>(x, w_row, products, out, out_stride); break;
    case 3: tile_row<kBits, 3, kPrefetch>(x, w_row, products, out, out_stride); break;
    default: tile_row<kBits, 4, kPrefetch>(x, w_row, products, out, out_stride); break;
  }
}

#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define BASALT_INT_LINEAR_512 1

// The 512-bit form of tile_row for int8: a register holds an even block in
// lanes 0..7 and the odd block after it in lanes 8..15, so one accumulator
// per token row is the definition's acc[16] itself (acc[8 (b mod 2) + j])
// and each pair of blocks costs one multiply-add of bytes, one conversion
// and one FMA instead of two of each. Where 512-bit operations run at full
// width (Intel's AVX-512 cores) that halves the arithmetic per weight byte;
// AMD's Zen 4 runs them as two 256-bit halves, and there an earlier 512-bit
// form measured slower than the 256-bit one (bench/README.md), so only
// Intel's cores (intel_cores()) take the 512-bit kernels, and they always
// prefetch.
template <int kTokens>
void tile_row_512_int8(const TokenTile& x, const uint8_t* w_row, const float* products, float* out,
                       int64_t out_stride) {
  const int64_t blocks = x.blocks;
  __m512 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
  // Magnitudes times activations carrying the weights' signs: the exact p_j.
  const auto lane_dots = [](__m512i w, __m512i xc) {
    const __m512i magnitude = _mm512_abs_epi8(w);
    const __m512i x_signed = _mm512_mask_sub_epi8(xc, _mm512_movepi8_mask(w), _mm512_setzero_si512(), xc);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitude, x_signed);
  };
  // Lanes 0..7 take the first of two scale products, lanes 8..15 the second.
  const __m512i pair_index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    prefetch_codes<8>(w_row, b);
    const __m512i w = _mm512_loadu_si512(w_row + b * kIntBlock);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      const __m512 dots = _mm512_cvtepi32_ps(lane_dots(w, _mm512_loadu_si512(x.codes + xb * kIntBlock)));
      uint64_t two_bits;  // the two products (4-byte aligned only)
      std::memcpy(&two_bits, products + xb, sizeof two_bits);
      const __m128 two = _mm_castsi128_ps(_mm_cvtsi64_si128(static_cast<int64_t>(two_bits)));
      acc[t] = _mm512_fmadd_ps(dots, _mm512_permutexvar_ps(pair_index, _mm512_castps128_ps512(two)), acc[t]);
    }
  }
  if (b < blocks) {  // a last, even block: lanes 0..7 only
    const __m512i w = _mm512_zextsi256_si512(load_codes<8>(w_row, b));
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      const __m512i xc =
          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + xb * kIntBlock)));
      acc[t] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(lane_dots(w, xc)), _mm512_set1_ps(products[xb]), acc[t],
                                     0x00ff);
    }
  }
  for (int t = 0; t < kTokens; ++t)
    out[t * out_stride] = finish(_mm512_castps512_ps256(acc[t]), _mm512_extractf32x8_ps(acc[t], 1));
}

// int4 on the 512-bit path reads its activations in a pair layout, so that
// a pair of packed weight blocks unpacks with one broadcast load, one shift
// and one mask (against an insert and a shuffle more in the block order).
// The 32 packed bytes of blocks b and b + 1 are [P_b, P_b+1] (16 bytes each:
// a block's low nibbles are its columns 0..15, its high nibbles 16..31);
// broadcast to both 256-bit halves and shifted right by 4 in the upper one,
// they unpack to [b 0..15, b+1 0..15, b 16..31, b+1 16..31]. Pair i of a
// token row holds its activation codes in that order (64 bytes; block 2i+1
// zero where it does not exist) and the 32-bit lane corrections (-8 * the
// lane's four codes summed) in the lane order that gives: lanes 0..3 are
// block 2i's lanes j = 0..3, lanes 4..7 block 2i+1's 0..3, lanes 8..11
// block 2i's 4..7, lanes 12..15 block 2i+1's 4..7. The accumulator keeps
// that order and is put back into the definition's acc[16] once per row.
struct PairRows {
  std::vector<int8_t> codes;          // [tokens, pairs * 64]
  std::vector<int32_t> corrections;   // [tokens, pairs * 16]
};

PairRows& pair_rows() {
  thread_local PairRows rows;
  return rows;
}

inline int64_t block_pairs(int64_t blocks) { return (blocks + 1) / 2; }

// The pair layout of token rows t0 .. t1 from their codes in block order.
void fill_pair_rows(const QuantizedRows& q, int64_t t0, int64_t t1, int64_t blocks, PairRows& p) {
  const int64_t pairs = block_pairs(blocks);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t t = t0; t < t1; ++t) {
    const int8_t* codes = q.codes.data() + t * blocks * kIntBlock;
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t b = 2 * i;
      const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * kIntBlock));
      const __m256i second = b + 1 < blocks
                                 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (b + 1) * kIntBlock))
                                 : _mm256_setzero_si256();
      // [b 0..15, b 16..31, b+1 0..15, b+1 16..31] -> [b 0..15, b+1 0..15, b 16..31, b+1 16..31]
      const __m512i halves = _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
      const __m512i x = _mm512_shuffle_i64x2(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
      const int64_t at = t * pairs + i;
      _mm512_storeu_si512(p.codes.data() + at * 64, x);
      // Each lane's four codes summed (times the unsigned 1s), times -8.
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x);
      _mm512_storeu_si512(p.corrections.data() + at * 16,
                          _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 3)));
    }
  }
}

// The activation side of an int4 tile in the pair layout.
struct PairTile {
  const int8_t* codes;
  const int32_t* corrections;
  int64_t blocks;
};

template <int kTokens>
void tile_row_512_int4(const PairTile& x, const uint8_t* w_row, const float* products, float* out,
                       int64_t out_stride) {
  const int64_t blocks = x.blocks, pairs = block_pairs(blocks);
  __m512 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);  // the upper half takes the high nibbles
  const __m512i low = _mm512_set1_epi8(0x0f);
  // Lanes 0..3 and 8..11 take block b's scale product, 4..7 and 12..15 b+1's.
  const __m512i pair_index = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  const auto dots = [&](__m512i w, int t, int64_t i) {
    const int64_t at = t * pairs + i;
    const __m512i start = _mm512_loadu_si512(x.corrections + at * 16);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w, _mm512_loadu_si512(x.codes + at * 64)));
  };
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    prefetch_codes<4>(w_row, b);
    const __m512i packed =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_row + b * (kIntBlock / 2))));
    const __m512i w = _mm512_and_si512(_mm512_srlv_epi64(packed, shift), low);
    for (int t = 0; t < kTokens; ++t) {
      uint64_t two_bits;  // the two products (4-byte aligned only)
      std::memcpy(&two_bits, products + t * blocks + b, sizeof two_bits);
      const __m128 two = _mm_castsi128_ps(_mm_cvtsi64_si128(static_cast<int64_t>(two_bits)));
      acc[t] = _mm512_fmadd_ps(dots(w, t, b / 2), _mm512_permutexvar_ps(pair_index, _mm512_castps128_ps512(two)),
                               acc[t]);
    }
  }
  if (b < blocks) {  // a last, even block: its lanes are 0..3 and 8..11
    const __m512i packed =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w_row + b * (kIntBlock / 2))));
    const __m512i w = _mm512_and_si512(_mm512_srlv_epi64(packed, shift), low);
    for (int t = 0; t < kTokens; ++t)
      acc[t] = _mm512_mask3_fmadd_ps(dots(w, t, b / 2), _mm512_set1_ps(products[t * blocks + b]), acc[t], 0x0f0f);
  }
  // Back to the definition's order: lanes 4..7 and 8..11 trade places.
  const __m512i order = _mm512_set_epi32(15, 14, 13, 12, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);
  for (int t = 0; t < kTokens; ++t) {
    const __m512 a = _mm512_permutexvar_ps(order, acc[t]);
    out[t * out_stride] = finish(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  }
}

#endif

// Weight rows n0 .. n1 for every token, in tiles of up to kTokenTile token
// rows.
template <int kBits>
void rows_int(const IntWeightLayout& l, const QuantizedRows& q, const PairRows* pair_layout, int64_t tokens,
              const uint8_t* codes, const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, float* out) {
  const int64_t blocks = l.blocks(), code_cols = l.code_columns(), scale_cols = l.scale_columns();
  thread_local std::vector<float> row_scales, products;
  row_scales.resize(static_cast<size_t>(blocks));
  products.resize(static_cast<size_t>(kTokenTile * blocks));
  const bool intel = intel_cores();
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenTile) {
    const int64_t nt = std::min(kTokenTile, tokens - t0);
    const TokenTile x{q.codes.data() + t0 * blocks * kIntBlock, q.scales.data() + t0 * blocks,
                      q.corrections.data() + (kOffsetCodes<kBits> ? t0 * blocks * 8 : 0), blocks};
    for (int64_t n = n0; n < n1; ++n) {
      block_scales_f32(l, scales + n * scale_cols, row_scales.data());
      for (int64_t t = 0; t < nt; ++t)
        scale_products(x.scales + t * blocks, row_scales.data(), blocks, products.data() + t * blocks);
      const uint8_t* w_row = codes + n * code_cols;
      float* o = out + t0 * outs + n;
#if defined(BASALT_INT_LINEAR_512)
      // int8 takes the 512-bit kernel on Intel's cores, int4 wherever the
      // caller built its pair layout (the same condition).
      if (kBits == 8 ? intel : pair_layout != nullptr) {
        const float* pr = products.data();
        if constexpr (kBits == 8) {
          switch (nt) {
            case 1: tile_row_512_int8<1>(x, w_row, pr, o, outs); break;
            case 2: tile_row_512_int8<2>(x, w_row, pr, o, outs); break;
            case 3: tile_row_512_int8<3>(x, w_row, pr, o, outs); break;
            default: tile_row_512_int8<4>(x, w_row, pr, o, outs); break;
          }
        } else {
          const PairRows& p = *pair_layout;
          const int64_t pairs = block_pairs(blocks);
          const PairTile px{p.codes.data() + t0 * pairs * 64, p.corrections.data() + t0 * pairs * 16, blocks};
          switch (nt) {
            case 1: tile_row_512_int4<1>(px, w_row, pr, o, outs); break;
            case 2: tile_row_512_int4<2>(px, w_row, pr, o, outs); break;
            case 3: tile_row_512_int4<3>(px, w_row, pr, o, outs); break;
            default: tile_row_512_int4<4>(px, w_row, pr, o, outs); break;
          }
        }
        continue;
      }
#endif
      if (intel) {
        tile_row_any<kBits, true>(nt, x, w_row, products.data(), o, outs);
      } else {
        tile_row_any<kBits, false>(nt, x, w_row, products.data(), o, outs);
      }
    }
  }
}

// The lane corrections of every block of `tokens` quantized rows (where
// the kernel uses them).
template <int kBits>
void fill_corrections(QuantizedRows& q, int64_t t0, int64_t t1, int64_t blocks) {
  if constexpr (kOffsetCodes<kBits>) {
    for (int64_t i = t0 * blocks; i < t1 * blocks; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.codes.data() + i * kIntBlock));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q.corrections.data() + i * 8), lane_correction(x));
    }
  }
}

#else  // no AVX2: the scalar definition

template <int kBits>
void rows_int(const IntWeightLayout& l, const QuantizedRows& q, const PairRows*, int64_t tokens,
              const uint8_t* codes, const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, float* out) {
  const int64_t blocks = l.blocks();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t n = n0; n < n1; ++n)
      out[t * outs + n] = int_dot_reference(l, q.codes.data() + t * blocks * kIntBlock, q.scales.data() + t * blocks,
                                            codes + n * l.code_columns(), scales + n * l.scale_columns());
}

template <int kBits>
void fill_corrections(QuantizedRows&, int64_t, int64_t, int64_t) {}  // the definition needs none

#endif

}  // namespace

void linear_int_f32(ThreadPool& pool, const float* x, int64_t tokens, const IntWeightLayout& l, const void* codes,
                    const uint16_t* scales, int64_t outs, const float* bias, float* out) {
  if (tokens == 0 || outs == 0) return;
  const int64_t K = l.in_features, blocks = l.blocks();
  QuantizedRows& q = quantized_rows();
  // int4 on Intel's 512-bit path reads the pair layout instead of the lane
  // corrections.
  PairRows* pair_layout = nullptr;
#if defined(BASALT_INT_LINEAR_512)
  if (l.bits == 4 && intel_cores()) {
    pair_layout = &pair_rows();
    pair_layout->codes.resize(static_cast<size_t>(tokens * block_pairs(blocks) * 64));
    pair_layout->corrections.resize(static_cast<size_t>(tokens * block_pairs(blocks) * 16));
  }
#endif
  q.codes.resize(static_cast<size_t>(tokens * blocks * kIntBlock));
  q.scales.resize(static_cast<size_t>(tokens * blocks));
  q.corrections.resize(static_cast<size_t>(l.bits == 4 && pair_layout == nullptr ? tokens * blocks * 8 : 0));
  pool.parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          quantize_int_activations(x + t * K, K, q.codes.data() + t * blocks * kIntBlock,
                                   q.scales.data() + t * blocks);
#if defined(BASALT_INT_LINEAR_512)
        if (pair_layout != nullptr) {
          fill_pair_rows(q, t0, t1, blocks, *pair_layout);
          return;
        }
#endif
        if (l.bits == 8) {
          fill_corrections<8>(q, t0, t1, blocks);
        } else {
          fill_corrections<4>(q, t0, t1, blocks);
        }
      },
      std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1)));
  const auto* w = static_cast<const uint8_t*>(codes);
  // Chunks of about an eighth of a thread's share: a thread streams one run
  // of rows at a time, so its hardware prefetcher is not restarted every few
  // kilobytes (16-row chunks left int4 decode waiting on its loads).
  dynamic_for(pool, outs, std::max(kRowGrain, balanced_grain(pool, outs)), [&](int64_t n0, int64_t n1) {
    if (l.bits == 8) {
      rows_int<8>(l, q, pair_layout, tokens, w, scales, n0, n1, outs, out);
    } else {
      rows_int<4>(l, q, pair_layout, tokens, w, scales, n0, n1, outs, out);
    }
    if (bias != nullptr)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t n = n0; n < n1; ++n) out[t * outs + n] += bias[n];
  });
}

}  // namespace basalt::cpu
