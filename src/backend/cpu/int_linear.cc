#include "backend/cpu/int_linear.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/simd.h"  // immintrin.h where the target has AVX2
#include "core/dtype.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define BASALT_INT_LINEAR_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace basalt::cpu {
namespace {

constexpr int64_t kTokenTile = 4;  // token rows that share one read of a weight row group

// Bytes of one block of 32 codes in a weight row: int8 32, packed int4 16.
constexpr int64_t block_bytes(int bits) { return bits == 8 ? kIntBlock : kIntBlock / 2; }

// The quantized activations of a call: codes [tokens, blocks * 32], block
// scales and the sums of each block's 32 codes [tokens, blocks] (kernels
// that multiply offset weight codes subtract offset * sum, which is exact).
struct QuantizedRows {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> sums;
};

QuantizedRows& quantized_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

std::atomic<bool> amx_allowed{true};

#if defined(__AVX2__)

// The vector kernels put weight rows in lanes: a group of rows (16 on
// Intel's 512-bit path, 8 on AVX2) is read a few blocks of 32 columns at a
// time, each row's 32 products of a block are summed to the block's exact
// integer P (a multiply-add of bytes into 32-bit lanes, then a transposing
// reduction across the rows' lanes), and lane i then takes the
// definition's one f32 multiply-add for row i: acc = fma(float(P), a_scale
// * w_scale, acc). That is what makes the definition's single chain per
// output a vector operation with one token row, as in decode.

// One weight row group's f16 scales as f32, [rows][blocks] (row i's block b
// at i * blocks + b; the hardware conversion where there is one: exact, as
// f16_to_f32 is).
void block_scales_f32(const IntWeightLayout& l, const uint16_t* scales, int64_t scale_stride, int rows,
                      float* out) {
  const int64_t blocks = l.blocks();
  for (int i = 0; i < rows; ++i) {
    const uint16_t* s = scales + i * scale_stride;
    float* o = out + i * blocks;
#if defined(__F16C__)
    if (l.group == kIntBlock) {
      int64_t b = 0;
      for (; b + 8 <= blocks; b += 8)
        _mm256_storeu_ps(o + b, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + b))));
      for (; b < blocks; ++b) o[b] = _cvtsh_ss(s[b]);
      continue;
    }
    for (int64_t b = 0; b < blocks; ++b) o[b] = _cvtsh_ss(s[(b * kIntBlock) / l.group]);
#else
    for (int64_t b = 0; b < blocks; ++b) o[b] = f16_to_f32(s[(b * kIntBlock) / l.group]);
#endif
  }
}

// Software prefetch ahead of a group's rows, on Intel's cores
// (intel_cores()). A decode step reads each weight byte once, and there one
// core's own loads leave too few misses in flight to stream at the memory's
// rate: with the prefetch two threads of an Emerald Rapids VM went from ~13
// to ~20 GB/s in the old one-row int8 loop (bench/README.md). The rows of a
// group are read side by side; each row's next line is fetched once per 64
// bytes of it, kRowPrefetchBytes ahead: 1024 for int8 (decoded faster than
// 256 or 4096 a row on the Llama-3.2-1B shape) and 512 for int4 (faster
// than 128, 256 or 1024), alternated runs on that VM. Addresses past the
// rows are only prefetched, never read.
template <int kBits>
constexpr int64_t kRowPrefetchBytes = kBits == 8 ? 1024 : 512;
template <int kBits, int kRows>
inline void prefetch_rows(const uint8_t* w, int64_t stride, int64_t b) {
  constexpr int64_t kBlockBytes = block_bytes(kBits);
  if ((b * kBlockBytes) % 64 != 0) return;
  for (int i = 0; i < kRows; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(w + i * stride + b * kBlockBytes) + kRowPrefetchBytes<kBits>,
                 _MM_HINT_T0);
}

// The next group's rows into L2, at the pace this group's are read: a step
// over kBlocks blocks of a 16-row group reads 16 * kBlocks blocks' bytes,
// and the same number of the next group's bytes (contiguous: rows follow
// each other) are fetched, in order, so the next group is in L2 when it
// starts. Short rows (2048 int4 columns: 1 KB) would otherwise start each
// group with sixteen fresh streams for the hardware to find.
template <int kBits, int kBlocks>
inline void prefetch_ahead(const uint8_t* ahead, int64_t b) {
  constexpr int64_t kBlockBytes = block_bytes(kBits);
  if (ahead == nullptr) return;
  const char* p = reinterpret_cast<const char*>(ahead) + b * 16 * kBlockBytes;
  for (int64_t k = 0; k < 16 * kBlocks * kBlockBytes; k += 64) _mm_prefetch(p + k, _MM_HINT_T1);
}

// The activation side of a tile: kTokens token rows' codes, scales and
// block sums, `blocks` blocks apart.
struct TokenTile {
  const int8_t* codes;
  const float* scales;
  const int32_t* sums;
  int64_t blocks;
};

// The exact P of block b for eight weight rows, lanes = rows: the eight
// rows' 32-bit lane sums (d[i]: row i's eight lanes) added across by hadd
// and a final exchange of 128-bit halves.
inline __m256i rows8_sum(const __m256i (&d)[8]) {
  const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
  const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// int8 without 32-bit byte multiply-adds multiplies the weights'
// magnitudes by activations carrying their signs (maddubs takes unsigned
// times signed bytes, and 127 * 127 * 2 fits its 16-bit pair sums); with
// them (VNNI) it multiplies code + 128 (code ^ 0x80) by the activations and
// subtracts 128 * the block's activation sum. int4 multiplies its stored
// nibbles (code + 8) by the activations and subtracts 8 * the sum.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define BASALT_INT_DPBUSD256(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define BASALT_INT_DPBUSD256(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#endif

template <int kBits>
constexpr int kSumShift =
#if defined(BASALT_INT_DPBUSD256)
    kBits == 8 ? 7 : 3;
#else
    kBits == 8 ? -1 : 3;  // -1: int8 needs no correction (the sign form)
#endif

// The definition's multiply-add for one block of one token row, lanes =
// rows: acc += float(P) * (a_scale * w_scale), P being the lanes' sums less
// the weight codes' offset times the activations' block sum (none for int8
// in the sign form).
template <int kBits>
inline __m256 add_block8(__m256 acc, __m256i p, int32_t x_sum, float x_scale, __m256 ws) {
  if constexpr (kSumShift<kBits> >= 0) p = _mm256_sub_epi32(p, _mm256_set1_epi32(x_sum << kSumShift<kBits>));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_set1_ps(x_scale), ws), acc);
}

// A group's block scales [8 rows][blocks] to [blocks][8] (lanes = rows),
// eight blocks at a time by the usual unpack, shuffle and half-exchange
// transpose, the last partial eight one by one. A gather per block
// instead costs more on Intel's cores (the 16-row form measured about 0.3
// ns more per 32 weight bytes with one).
void transpose_scales8(const float* rows, int64_t blocks, float* out) {
  int64_t b0 = 0;
  for (; b0 + 8 <= blocks; b0 += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + i * blocks + b0);
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {
      u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
      u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xee);
      u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
      u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(out + (b0 + j) * 8, _mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
      _mm256_storeu_ps(out + (b0 + 4 + j) * 8, _mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
    }
  }
  for (; b0 < blocks; ++b0)
    for (int i = 0; i < 8; ++i) out[b0 * 8 + i] = rows[i * blocks + b0];
}

// int4's step on AVX2: blocks b and b + 1 of eight rows, each row read 32
// bytes at a time (a read of rows in 16-byte steps streamed slower,
// bench/README.md). The packed pair unpacks to the two blocks' low nibbles
// (columns 0..15 of each) and high ones (16..31), against the activations
// in the same order; four lanes a row and block, summed across by two
// rounds of hadd, and the halves dealt out to block b (p0) and b + 1 (p1).
template <int kTokens>
inline void pair_block_sums8_int4(const uint8_t* w, int64_t stride, int64_t b, const TokenTile& x,
                                  __m256i (&p0)[kTokens], __m256i (&p1)[kTokens]) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i d[kTokens][8];
  for (int i = 0; i < 8; ++i) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * stride + b * (kIntBlock / 2)));
    const __m256i lo = _mm256_and_si256(z, low), hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), low);
    for (int t = 0; t < kTokens; ++t) {
      const int8_t* xb = x.codes + (t * x.blocks + b) * kIntBlock;
      const __m256i xl = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(xb + kIntBlock),
                                             reinterpret_cast<const __m128i*>(xb));
      const __m256i xh = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(xb + kIntBlock + 16),
                                             reinterpret_cast<const __m128i*>(xb + 16));
#if defined(BASALT_INT_DPBUSD256)
      d[t][i] = BASALT_INT_DPBUSD256(BASALT_INT_DPBUSD256(_mm256_setzero_si256(), lo, xl), hi, xh);
#else
      const __m256i ones = _mm256_set1_epi16(1);
      d[t][i] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones),
                                 _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones));
#endif
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    // Per 128-bit half (block b low, b + 1 high): rows 0..3, then 4..7.
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[t][0], d[t][1]), _mm256_hadd_epi32(d[t][2], d[t][3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[t][4], d[t][5]), _mm256_hadd_epi32(d[t][6], d[t][7]));
    p0[t] = _mm256_permute2x128_si256(q0, q1, 0x20);
    p1[t] = _mm256_permute2x128_si256(q0, q1, 0x31);
  }
}

// Blocks b0 .. b1 of eight weight rows for kTokens token rows: acc[t]
// (lanes = rows) carried in and out through memory; wscales as
// transpose_scales8 lays them out.
template <int kBits, int kTokens, bool kPrefetch>
void group8(const uint8_t* w, int64_t stride, const float* wscales, const TokenTile& x, int64_t b0, int64_t b1,
            float* acc_io) {
  const int64_t blocks = x.blocks;
  __m256 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_loadu_ps(acc_io + 8 * t);
#if !defined(BASALT_INT_DPBUSD256)
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  int64_t b = b0;
  if constexpr (kBits == 4) {
    for (; b + 2 <= b1; b += 2) {
      if constexpr (kPrefetch) prefetch_rows<kBits, 8>(w, stride, b);
      __m256i p0[kTokens], p1[kTokens];
      pair_block_sums8_int4<kTokens>(w, stride, b, x, p0, p1);
      const __m256 ws0 = _mm256_loadu_ps(wscales + b * 8), ws1 = _mm256_loadu_ps(wscales + (b + 1) * 8);
      for (int t = 0; t < kTokens; ++t) {
        const int64_t xb = t * blocks + b;
        acc[t] = add_block8<kBits>(acc[t], p0[t], x.sums[xb], x.scales[xb], ws0);
        acc[t] = add_block8<kBits>(acc[t], p1[t], x.sums[xb + 1], x.scales[xb + 1], ws1);
      }
    }
  }
  for (; b < b1; ++b) {
    if constexpr (kPrefetch) prefetch_rows<kBits, 8>(w, stride, b);
    __m256i d[kTokens][8];
    for (int i = 0; i < 8; ++i) {
      __m256i wv;
      if constexpr (kBits == 8) {
        wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * stride + b * kIntBlock));
      } else {
        const __m128i packed =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i * stride + b * (kIntBlock / 2)));
        const __m128i low = _mm_set1_epi8(0x0f);
        wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
      }
#if defined(BASALT_INT_DPBUSD256)
      if constexpr (kBits == 8) wv = _mm256_xor_si256(wv, _mm256_set1_epi8(static_cast<char>(0x80)));
      for (int t = 0; t < kTokens; ++t) {
        const __m256i xc =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + (t * blocks + b) * kIntBlock));
        d[t][i] = BASALT_INT_DPBUSD256(_mm256_setzero_si256(), wv, xc);
      }
#else
      if constexpr (kBits == 8) {
        const __m256i magnitude = _mm256_sign_epi8(wv, wv);
        for (int t = 0; t < kTokens; ++t) {
          const __m256i xc =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + (t * blocks + b) * kIntBlock));
          d[t][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xc, wv)), ones);
        }
      } else {
        for (int t = 0; t < kTokens; ++t) {
          const __m256i xc =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + (t * blocks + b) * kIntBlock));
          d[t][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xc), ones);
        }
      }
#endif
    }
    const __m256 ws = _mm256_loadu_ps(wscales + b * 8);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      acc[t] = add_block8<kBits>(acc[t], rows8_sum(d[t]), x.sums[xb], x.scales[xb], ws);
    }
  }
  for (int t = 0; t < kTokens; ++t) _mm256_storeu_ps(acc_io + 8 * t, acc[t]);
}

// Four activation codes as one 32-bit word (for a broadcast).
inline int32_t code_word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// group8 over interleaved rows (core/int_weights.h): a 32-byte load holds
// one 4-byte word of each of the eight rows, so byte products summed into
// 32-bit lanes against that word of a token's activations, broadcast, add
// to each row's own lane, and after a block's words the lanes are the rows'
// exact block sums, with no sum across lanes. int8 takes a block as eight
// loads; int4 as four, each unpacked to its low nibbles (columns 4q ..
// 4q + 3, against activation word q) and high ones (16 + 4q .., word 4 + q).
// The eight rows' scales of a block are one 16-byte load too. w and sc are
// the group's first code and scale; a scale column covers blocks_per_scale
// blocks; acc_io as in group8.
template <int kBits, int kTokens>
void interleaved_group8(const uint8_t* w, const uint16_t* sc, int64_t blocks_per_scale, const TokenTile& x,
                        int64_t b0, int64_t b1, float* acc_io) {
  constexpr int64_t kGroupBlockBytes = kIntInterleaveRows * block_bytes(kBits);
  const int64_t blocks = x.blocks;
  __m256 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_loadu_ps(acc_io + 8 * t);
#if !defined(BASALT_INT_DPBUSD256)
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = w + b * kGroupBlockBytes;
    const int8_t* xc[kTokens];
    __m256i p[kTokens];
    for (int t = 0; t < kTokens; ++t) {
      xc[t] = x.codes + (t * blocks + b) * kIntBlock;
      p[t] = _mm256_setzero_si256();
    }
    if constexpr (kBits == 8) {
      for (int q = 0; q < 8; ++q) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * q));
#if defined(BASALT_INT_DPBUSD256)
        const __m256i u = _mm256_xor_si256(wv, _mm256_set1_epi8(static_cast<char>(0x80)));
        for (int t = 0; t < kTokens; ++t)
          p[t] = BASALT_INT_DPBUSD256(p[t], u, _mm256_set1_epi32(code_word(xc[t] + 4 * q)));
#else
        const __m256i magnitude = _mm256_sign_epi8(wv, wv);
        for (int t = 0; t < kTokens; ++t) {
          const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(code_word(xc[t] + 4 * q)), wv);
          p[t] = _mm256_add_epi32(p[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
        }
#endif
      }
    } else {
      const __m256i low = _mm256_set1_epi8(0x0f);
      for (int q = 0; q < 4; ++q) {
        const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * q));
        const __m256i lo = _mm256_and_si256(z, low), hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), low);
        for (int t = 0; t < kTokens; ++t) {
          const __m256i xl = _mm256_set1_epi32(code_word(xc[t] + 4 * q));
          const __m256i xh = _mm256_set1_epi32(code_word(xc[t] + 16 + 4 * q));
#if defined(BASALT_INT_DPBUSD256)
          p[t] = BASALT_INT_DPBUSD256(BASALT_INT_DPBUSD256(p[t], lo, xl), hi, xh);
#else
          p[t] = _mm256_add_epi32(p[t], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones),
                                                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones)));
#endif
        }
      }
    }
    const uint16_t* bs = sc + (blocks_per_scale == 1 ? b : b / blocks_per_scale) * kIntInterleaveRows;
#if defined(__F16C__)
    const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs)));
#else
    const __m256 ws = _mm256_setr_ps(f16_to_f32(bs[0]), f16_to_f32(bs[1]), f16_to_f32(bs[2]), f16_to_f32(bs[3]),
                                     f16_to_f32(bs[4]), f16_to_f32(bs[5]), f16_to_f32(bs[6]), f16_to_f32(bs[7]));
#endif
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      acc[t] = add_block8<kBits>(acc[t], p[t], x.sums[xb], x.scales[xb], ws);
    }
  }
  for (int t = 0; t < kTokens; ++t) _mm256_storeu_ps(acc_io + 8 * t, acc[t]);
}

#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define BASALT_INT_LINEAR_512 1

// Two vectors of sixteen 32-bit lanes, each holding consecutive runs of
// lanes that belong to one row, to one vector with runs half as long:
// adjacent lanes of the 32 summed, in order.
inline __m512i pair_sum(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

// A group's block scales [16 rows][blocks] to [blocks][16] (lanes = rows),
// sixteen blocks at a time: four rounds of swapping the off-diagonal
// quarters of each square, halving the square each round. A gather per
// block instead measured about 0.3 ns more per 32 weight bytes.
// Round `level` (square side 16 >> level, half d): lane j of a row whose
// bit d is clear takes its partner row's lane j - d where j has bit d set;
// the partner takes the first row's lane j + d where j has it clear.
template <int kLevel>
inline void swap_quarters(__m512 (&r)[16]) {
  constexpr int d = 8 >> kLevel;
  alignas(64) static constexpr int32_t kTakeA[16] = {
      (0 & d) ? 16 + 0 - d : 0,     (1 & d) ? 16 + 1 - d : 1,     (2 & d) ? 16 + 2 - d : 2,
      (3 & d) ? 16 + 3 - d : 3,     (4 & d) ? 16 + 4 - d : 4,     (5 & d) ? 16 + 5 - d : 5,
      (6 & d) ? 16 + 6 - d : 6,     (7 & d) ? 16 + 7 - d : 7,     (8 & d) ? 16 + 8 - d : 8,
      (9 & d) ? 16 + 9 - d : 9,     (10 & d) ? 16 + 10 - d : 10, (11 & d) ? 16 + 11 - d : 11,
      (12 & d) ? 16 + 12 - d : 12, (13 & d) ? 16 + 13 - d : 13, (14 & d) ? 16 + 14 - d : 14,
      (15 & d) ? 16 + 15 - d : 15};
  alignas(64) static constexpr int32_t kTakeB[16] = {
      (0 & d) ? 16 + 0 : 0 + d,    (1 & d) ? 16 + 1 : 1 + d,    (2 & d) ? 16 + 2 : 2 + d,
      (3 & d) ? 16 + 3 : 3 + d,    (4 & d) ? 16 + 4 : 4 + d,    (5 & d) ? 16 + 5 : 5 + d,
      (6 & d) ? 16 + 6 : 6 + d,    (7 & d) ? 16 + 7 : 7 + d,    (8 & d) ? 16 + 8 : 8 + d,
      (9 & d) ? 16 + 9 : 9 + d,    (10 & d) ? 16 + 10 : 10 + d, (11 & d) ? 16 + 11 : 11 + d,
      (12 & d) ? 16 + 12 : 12 + d, (13 & d) ? 16 + 13 : 13 + d, (14 & d) ? 16 + 14 : 14 + d,
      (15 & d) ? 16 + 15 : 15 + d};
  const __m512i take_a = _mm512_load_si512(kTakeA), take_b = _mm512_load_si512(kTakeB);
  for (int i = 0; i < 16; ++i) {
    if ((i & d) != 0) continue;
    const __m512 first = r[i], second = r[i + d];
    r[i] = _mm512_permutex2var_ps(first, take_a, second);
    r[i + d] = _mm512_permutex2var_ps(first, take_b, second);
  }
}

void transpose_scales16(const float* rows, int64_t blocks, float* out) {
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int64_t n = std::min<int64_t>(16, blocks - b0);
    const auto valid = static_cast<__mmask16>((1u << n) - 1);
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(valid, rows + i * blocks + b0);
    swap_quarters<0>(r);
    swap_quarters<1>(r);
    swap_quarters<2>(r);
    swap_quarters<3>(r);
    for (int64_t j = 0; j < n; ++j) _mm512_storeu_ps(out + (b0 + j) * 16, r[j]);
  }
}

// The 512-bit form for Intel's cores (where 512-bit operations run at full
// width; AMD's Zen 4 runs them as two halves, and there an earlier 512-bit
// form measured slower than the 256-bit one, bench/README.md): sixteen rows
// a group, always prefetched, two blocks a step, so that every row is read
// 64 bytes (int8) or 32 bytes (int4) at a time: a 16-row read in 16-byte
// steps streamed at about 15 GB/s on two threads where 32-byte steps read
// 18-22 (bench/README.md). int8 holds one row's two blocks a register,
// offset by 128 for the unsigned side of dpbusd, against the two blocks'
// activations (eight lanes a row and block); int4 holds two rows' packed
// pairs of blocks a register, unpacked to low nibbles (columns 0..15 of
// both blocks) and high ones (16..31), each multiplied by that half of
// both blocks' activations (four lanes a row and block). The lanes are
// then summed across to one per row and block, and the two blocks are
// dealt out to a register each.

// acc += float(P) * (a_scale * w_scale) for one block of one token row.
inline __m512 add_block16(__m512 acc, __m512i p, int32_t offset_sum, float x_scale, __m512 ws) {
  const __m512i exact = _mm512_sub_epi32(p, _mm512_set1_epi32(offset_sum));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_set1_ps(x_scale), ws), acc);
}

// The rows' sums of blocks b and b + 1 (p0, p1; lanes = rows) for the
// activations of one token row at xb (block b's codes, block b + 1's after).
template <int kBits>
inline void pair_block_sums16(const uint8_t* w, int64_t stride, int64_t b, const int8_t* xb, __m512i& p0,
                              __m512i& p1) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512i f0, f1;  // rows 0..7 and 8..15, blocks b and b + 1 alternating
  if constexpr (kBits == 8) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i xc = _mm512_loadu_si512(xb);
    __m512i d[16];
    for (int i = 0; i < 16; ++i)
      d[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                 _mm512_xor_si512(_mm512_loadu_si512(w + i * stride + b * kIntBlock), flip), xc);
    __m512i e[4];
    for (int k = 0; k < 4; ++k)
      e[k] = pair_sum(pair_sum(d[4 * k], d[4 * k + 1]), pair_sum(d[4 * k + 2], d[4 * k + 3]));
    f0 = pair_sum(e[0], e[1]);
    f1 = pair_sum(e[2], e[3]);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m256i xlo = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + kIntBlock)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
    const __m256i xhi = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + kIntBlock + 16)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
    const __m512i xl = _mm512_broadcast_i64x4(xlo), xh = _mm512_broadcast_i64x4(xhi);
    __m512i d[8];
    for (int j = 0; j < 8; ++j) {
      const uint8_t* r = w + 2 * j * stride + b * (kIntBlock / 2);
      const __m512i z = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + stride)), 1);
      const __m512i lo = _mm512_and_si512(z, low), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low);
      d[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
    }
    f0 = pair_sum(pair_sum(d[0], d[1]), pair_sum(d[2], d[3]));
    f1 = pair_sum(pair_sum(d[4], d[5]), pair_sum(d[6], d[7]));
  }
  p0 = _mm512_permutex2var_epi32(f0, even, f1);
  p1 = _mm512_permutex2var_epi32(f0, odd, f1);
}

// int4's main step: the rows' sums of blocks b .. b + 3 (p[0..3]; lanes =
// rows). A register holds one row's four packed blocks (64 bytes, one line)
// and unpacks to their low and high nibbles, against the four blocks'
// activation halves side by side; four lanes a row and block are summed
// across, and a last exchange deals the blocks out to a register each.
inline void quad_block_sums16_int4(const uint8_t* w, int64_t stride, int64_t b, const int8_t* xb, __m512i (&p)[4]) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512i xl = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
  __m512i xh = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
  xl = _mm512_inserti32x4(xl, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + kIntBlock)), 1);
  xh = _mm512_inserti32x4(xh, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + kIntBlock + 16)), 1);
  xl = _mm512_inserti32x4(xl, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 2 * kIntBlock)), 2);
  xh = _mm512_inserti32x4(xh, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 2 * kIntBlock + 16)), 2);
  xl = _mm512_inserti32x4(xl, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 3 * kIntBlock)), 3);
  xh = _mm512_inserti32x4(xh, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 3 * kIntBlock + 16)), 3);
  __m512i g[4];  // rows 4k .. 4k + 3: lane 4 r + block
  for (int k = 0; k < 4; ++k) {
    __m512i d[4];
    for (int r = 0; r < 4; ++r) {
      const __m512i z = _mm512_loadu_si512(w + (4 * k + r) * stride + b * (kIntBlock / 2));
      const __m512i lo = _mm512_and_si512(z, low), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low);
      d[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
    }
    g[k] = pair_sum(pair_sum(d[0], d[1]), pair_sum(d[2], d[3]));
  }
  // Blocks 0, 1 (and 2, 3) of rows 0..7 from g[0], g[1]; of rows 8..15 from g[2], g[3].
  const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i second = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i a01 = _mm512_permutex2var_epi32(g[0], first, g[1]), a23 = _mm512_permutex2var_epi32(g[0], second, g[1]);
  const __m512i b01 = _mm512_permutex2var_epi32(g[2], first, g[3]), b23 = _mm512_permutex2var_epi32(g[2], second, g[3]);
  const __m512i lower = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i upper = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  p[0] = _mm512_permutex2var_epi32(a01, lower, b01);
  p[1] = _mm512_permutex2var_epi32(a01, upper, b01);
  p[2] = _mm512_permutex2var_epi32(a23, lower, b23);
  p[3] = _mm512_permutex2var_epi32(a23, upper, b23);
}

// The rows' sums of block b alone (a last, odd block).
template <int kBits>
inline __m512i block_sums16(const uint8_t* w, int64_t stride, int64_t b, const int8_t* xb) {
  __m512i d[8];
  if constexpr (kBits == 8) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i xc = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
    for (int j = 0; j < 8; ++j) {
      const uint8_t* r = w + 2 * j * stride + b * kIntBlock;
      const __m512i two = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + stride)), 1);
      d[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(two, flip), xc);
    }
    return pair_sum(pair_sum(pair_sum(d[0], d[1]), pair_sum(d[2], d[3])),
                    pair_sum(pair_sum(d[4], d[5]), pair_sum(d[6], d[7])));
  } else {  // four rows a register: 16 bytes each
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
    const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
    for (int q = 0; q < 4; ++q) {
      const uint8_t* r = w + 4 * q * stride + b * (kIntBlock / 2);
      __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + stride)), 1);
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * stride)), 2);
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 3 * stride)), 3);
      const __m512i lo = _mm512_and_si512(z, low), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low);
      d[q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
    }
    return pair_sum(pair_sum(d[0], d[1]), pair_sum(d[2], d[3]));
  }
}

// wscales: the group's block scales as transpose_scales16 lays them out;
// ahead: the next group's first row (prefetch_ahead). Kept out of line, so
// its register allocation is its own and not that of the caller's loops.
template <int kBits, int kTokens>
__attribute__((noinline)) void group16(const uint8_t* w, int64_t stride, const float* wscales, const TokenTile& x,
                                       int64_t b0, int64_t b1, float* acc_io, const uint8_t* ahead) {
  constexpr int kShift = kBits == 8 ? 7 : 3;  // the weight codes' offset, 128 or 8
  const int64_t blocks = x.blocks;
  __m512 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_loadu_ps(acc_io + 16 * t);
  int64_t b = b0;
  if constexpr (kBits == 4) {
    for (; b + 4 <= b1; b += 4) {
      prefetch_rows<kBits, 16>(w, stride, b);
      prefetch_ahead<kBits, 4>(ahead, b);
      for (int t = 0; t < kTokens; ++t) {
        const int64_t xb = t * blocks + b;
        __m512i p[4];
        quad_block_sums16_int4(w, stride, b, x.codes + xb * kIntBlock, p);
        for (int k = 0; k < 4; ++k)
          acc[t] = add_block16(acc[t], p[k], x.sums[xb + k] << kShift, x.scales[xb + k],
                               _mm512_loadu_ps(wscales + (b + k) * 16));
      }
    }
  }
  for (; b + 2 <= b1; b += 2) {
    prefetch_rows<kBits, 16>(w, stride, b);
    prefetch_ahead<kBits, 2>(ahead, b);
    const __m512 ws0 = _mm512_loadu_ps(wscales + b * 16), ws1 = _mm512_loadu_ps(wscales + (b + 1) * 16);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      __m512i p0, p1;
      pair_block_sums16<kBits>(w, stride, b, x.codes + xb * kIntBlock, p0, p1);
      acc[t] = add_block16(acc[t], p0, x.sums[xb] << kShift, x.scales[xb], ws0);
      acc[t] = add_block16(acc[t], p1, x.sums[xb + 1] << kShift, x.scales[xb + 1], ws1);
    }
  }
  for (; b < b1; ++b) {
    prefetch_rows<kBits, 16>(w, stride, b);
    const __m512 ws = _mm512_loadu_ps(wscales + b * 16);
    for (int t = 0; t < kTokens; ++t) {
      const int64_t xb = t * blocks + b;
      acc[t] = add_block16(acc[t], block_sums16<kBits>(w, stride, b, x.codes + xb * kIntBlock),
                           x.sums[xb] << kShift, x.scales[xb], ws);
    }
  }
  for (int t = 0; t < kTokens; ++t) _mm512_storeu_ps(acc_io + 16 * t, acc[t]);
}

#endif  // 512-bit

#if defined(BASALT_INT_LINEAR_AMX)

// Intel's AMX: a tile multiply of signed bytes gives whole-block sums
// directly. The weights are the A tile (16 rows x one block of 32 codes,
// read in place with the row stride; int4 unpacked to signed bytes once per
// row group), the activations the B tile (one block of 16 token rows in
// AMX's pairs-of-four layout, built once per call), so C[i][j] is the exact
// P of weight row i and token j, and the epilogue gives row i's sixteen
// token lanes the definition's multiply-add.

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int64_t kAmxTokens = 16;  // token rows a B tile holds
constexpr int64_t kAmxTileBytes = 512;

// CPUID says AMX-TILE and AMX-INT8, XCR0 has the tile state enabled, and
// Linux grants this process the tile data (arch_prctl, once).
bool amx_usable() {
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    if ((d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return false;  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return usable;
}

// The activations in tiles: for token group g (16 rows, missing rows zero)
// and block b, tiles[(g * blocks + b) * 512]: row r (of 8) holds, for each
// token j, its codes 4r .. 4r + 3; scales[(g * blocks + b) * 16 + j].
struct AmxTokens {
  std::vector<int8_t> tiles;
  std::vector<float> scales;
};

AmxTokens& amx_tokens() {
  thread_local AmxTokens t;
  return t;
}

void fill_amx_group(const QuantizedRows& q, int64_t tokens, int64_t blocks, int64_t g, AmxTokens& a) {
  for (int64_t b = 0; b < blocks; ++b) {
    int8_t* tile = a.tiles.data() + (g * blocks + b) * kAmxTileBytes;
    float* scales = a.scales.data() + (g * blocks + b) * kAmxTokens;
    for (int64_t j = 0; j < kAmxTokens; ++j) {
      const int64_t t = g * kAmxTokens + j;
      if (t >= tokens) {
        for (int r = 0; r < 8; ++r) std::memset(tile + r * 64 + j * 4, 0, 4);
        scales[j] = 0;
        continue;
      }
      const int8_t* codes = q.codes.data() + (t * blocks + b) * kIntBlock;
      for (int r = 0; r < 8; ++r) std::memcpy(tile + r * 64 + j * 4, codes + 4 * r, 4);
      scales[j] = q.scales[t * blocks + b];
    }
  }
}

// Every token group for one group of 16 weight rows: a [16 rows] x [blocks
// * 32] signed codes, `a_stride` bytes a row; wscales [16][blocks]; out
// gets rows `valid` of the group at columns n .. n + valid (plus bias).
void amx_rows16(const int8_t* a, int64_t a_stride, const float* wscales, const AmxTokens& x, int64_t tokens,
                int64_t blocks, int64_t valid, int64_t n, int64_t outs, const float* bias, float* out) {
  alignas(64) int32_t c[16 * 16];
  alignas(64) float res[16 * 16];
  const int64_t groups = (tokens + kAmxTokens - 1) / kAmxTokens;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[16];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      _tile_zero(0);
      _tile_loadd(1, a + b * kIntBlock, a_stride);
      _tile_loadd(2, x.tiles.data() + (g * blocks + b) * kAmxTileBytes, 64);
      _tile_dpbssd(0, 1, 2);
      _tile_stored(0, c, 64);
      const __m512 token_scales = _mm512_loadu_ps(x.scales.data() + (g * blocks + b) * kAmxTokens);
      for (int i = 0; i < 16; ++i)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * i)),
                                 _mm512_mul_ps(token_scales, _mm512_set1_ps(wscales[i * blocks + b])), acc[i]);
    }
    for (int i = 0; i < 16; ++i) _mm512_store_ps(res + 16 * i, acc[i]);
    const int64_t nt = std::min(kAmxTokens, tokens - g * kAmxTokens);
    for (int64_t j = 0; j < nt; ++j) {
      float* o = out + (g * kAmxTokens + j) * outs + n;
      for (int64_t i = 0; i < valid; ++i) o[i] = res[16 * i + j] + (bias != nullptr ? bias[n + i] : 0.0f);
    }
  }
}

#endif  // AMX

#endif  // AVX2

}  // namespace

void linear_int_allow_amx(bool allow) { amx_allowed.store(allow); }

bool linear_int_interleave_pays() {
#if !defined(__AVX2__)
  return false;
#else
#if defined(BASALT_INT_LINEAR_512)
  if (intel_cores()) return false;
#endif
  return !linear_int_amx_available();
#endif
}

void interleave_int_weight(ThreadPool& pool, const IntWeightLayout& l, int64_t rows, const void* codes,
                           const uint16_t* scales, void* codes_out, uint16_t* scales_out) {
  const int64_t cols = l.code_columns(), scale_cols = l.scale_columns(), groups = rows / kIntInterleaveRows;
  const auto* src = static_cast<const uint8_t*>(codes);
  auto* dst = static_cast<uint8_t*>(codes_out);
  // A run of whole groups is a weight of whole groups of its own; the rows
  // after the last group go with the last run.
  pool.parallel_for(groups, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * kIntInterleaveRows, n1 = g1 == groups ? rows : g1 * kIntInterleaveRows;
    interleave_int_rows(l, n1 - n0, src + n0 * cols, scales + n0 * scale_cols, dst + n0 * cols,
                        scales_out + n0 * scale_cols);
  });
  if (groups == 0) interleave_int_rows(l, rows, codes, scales, codes_out, scales_out);
}

bool linear_int_amx_available() {
#if defined(BASALT_INT_LINEAR_AMX)
  return amx_usable();
#else
  return false;
#endif
}

namespace {

#if defined(__AVX2__)

// The scratch of one thread's rows: a partial group's rows padded with
// zeros, the group's block scales, and the accumulators of every token.
struct GroupScratch {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;
  std::vector<float> block_scales;  // [rows][blocks]
  std::vector<float> lane_scales;   // [blocks][rows], lanes = rows
  std::vector<float> acc;
  std::vector<int8_t> unpacked;  // AMX: int4 codes as signed bytes
};

GroupScratch& group_scratch() {
  thread_local GroupScratch s;
  return s;
}

// A last, partial group of `valid` rows: its codes and scales copied into
// the scratch with zero rows after them, and w and sc pointed there.
void pad_group(int64_t rows, int64_t valid, int64_t code_cols, int64_t scale_cols, GroupScratch& s,
               const uint8_t*& w, const uint16_t*& sc) {
  s.codes.assign(static_cast<size_t>(rows * code_cols), 0);
  s.scales.assign(static_cast<size_t>(rows * scale_cols), 0);
  std::memcpy(s.codes.data(), w, static_cast<size_t>(valid * code_cols));
  std::memcpy(s.scales.data(), sc, static_cast<size_t>(valid * scale_cols) * sizeof(uint16_t));
  w = s.codes.data();
  sc = s.scales.data();
}

// Blocks per pass over a group for many token rows: a pass's slice of the
// group's codes (about 16 KB) stays in L1 while every token tile reads it.
int64_t blocks_per_pass(int bits, int rows, int64_t tokens, int64_t blocks) {
  if (tokens <= kTokenTile) return blocks;
  return std::max<int64_t>(1, std::min(blocks, 16384 / (rows * block_bytes(bits))));
}

template <int kBits, int kRows, int kTokens>
void run_group(bool prefetch, const uint8_t* w, int64_t stride, const float* ws, const TokenTile& x, int64_t b0,
               int64_t b1, float* acc) {
#if defined(BASALT_INT_LINEAR_512)
  if constexpr (kRows == 16) {
    group16<kBits, kTokens>(w, stride, ws, x, b0, b1, acc, w + 16 * stride);
    return;
  }
#endif
  if (prefetch) {
    group8<kBits, kTokens, true>(w, stride, ws, x, b0, b1, acc);
  } else {
    group8<kBits, kTokens, false>(w, stride, ws, x, b0, b1, acc);
  }
}

template <int kBits, int kRows>
void run_group_any(int64_t nt, bool prefetch, const uint8_t* w, int64_t stride, const float* ws, const TokenTile& x,
                   int64_t b0, int64_t b1, float* acc) {
  switch (nt) {
    case 1: run_group<kBits, kRows, 1>(prefetch, w, stride, ws, x, b0, b1, acc); break;
    case 2: run_group<kBits, kRows, 2>(prefetch, w, stride, ws, x, b0, b1, acc); break;
    case 3: run_group<kBits, kRows, 3>(prefetch, w, stride, ws, x, b0, b1, acc); break;
    default: run_group<kBits, kRows, 4>(prefetch, w, stride, ws, x, b0, b1, acc); break;
  }
}

template <int kBits>
void run_interleaved_any(int64_t nt, const uint8_t* w, const uint16_t* sc, int64_t blocks_per_scale,
                         const TokenTile& x, int64_t b0, int64_t b1, float* acc) {
  switch (nt) {
    case 1: interleaved_group8<kBits, 1>(w, sc, blocks_per_scale, x, b0, b1, acc); break;
    case 2: interleaved_group8<kBits, 2>(w, sc, blocks_per_scale, x, b0, b1, acc); break;
    case 3: interleaved_group8<kBits, 3>(w, sc, blocks_per_scale, x, b0, b1, acc); break;
    default: interleaved_group8<kBits, 4>(w, sc, blocks_per_scale, x, b0, b1, acc); break;
  }
}

// Weight rows n0 .. n1 for every token, a group of kRows rows at a time.
template <int kBits, int kRows>
void rows_vector(const IntWeightLayout& l, const QuantizedRows& q, int64_t tokens, const uint8_t* codes,
                 const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, const float* bias, float* out) {
  const int64_t blocks = l.blocks(), code_cols = l.code_columns(), scale_cols = l.scale_columns();
  GroupScratch& s = group_scratch();
  s.block_scales.resize(static_cast<size_t>(kRows * blocks));
  s.lane_scales.resize(static_cast<size_t>(kRows * blocks));
  s.acc.resize(static_cast<size_t>(tokens * kRows));
  const bool prefetch = intel_cores();
  const int64_t pass = blocks_per_pass(kBits, kRows, tokens, blocks);
  // Blocks a scale column covers (a group of whole blocks, or the whole row).
  const int64_t blocks_per_scale = l.group % kIntBlock == 0 ? l.group / kIntBlock : blocks;
  for (int64_t n = n0; n < n1; n += kRows) {
    const int64_t valid = std::min<int64_t>(kRows, n1 - n);
    const uint8_t* w = codes + n * code_cols;
    const uint16_t* sc = scales + n * scale_cols;
    // The next group's scales (contiguous, a tenth of its codes' bytes for
    // int4), so the table below does not wait on them: read as 16 short
    // runs at a group's start, they were not streamed ahead by the hardware.
    if (prefetch && n + 2 * kRows <= n1) {
      const char* next = reinterpret_cast<const char*>(sc + kRows * scale_cols);
      for (int64_t k = 0; k < kRows * scale_cols * 2; k += 64) _mm_prefetch(next + k, _MM_HINT_T0);
    }
    // Interleaved rows come in whole groups of 8 but for the last N mod 8,
    // which are row by row; their scales are in lane order already.
    const bool interleaved = kRows == kIntInterleaveRows && l.rows_interleaved && valid == kRows;
    if (valid < kRows) {  // a last, partial group: zero rows after the real ones
      pad_group(kRows, valid, code_cols, scale_cols, s, w, sc);
    }
    const float* ws = nullptr;
    if (!interleaved) {
      block_scales_f32(l, sc, scale_cols, kRows, s.block_scales.data());
      ws = s.block_scales.data();
#if defined(BASALT_INT_LINEAR_512)
      if constexpr (kRows == 16) transpose_scales16(ws, blocks, s.lane_scales.data());
#endif
      if constexpr (kRows == 8) transpose_scales8(ws, blocks, s.lane_scales.data());
      ws = s.lane_scales.data();
    }
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    for (int64_t b0 = 0; b0 < blocks; b0 += pass) {
      const int64_t b1 = std::min(blocks, b0 + pass);
      for (int64_t t0 = 0; t0 < tokens; t0 += kTokenTile) {
        const TokenTile x{q.codes.data() + t0 * blocks * kIntBlock, q.scales.data() + t0 * blocks,
                          q.sums.data() + t0 * blocks, blocks};
        const int64_t nt = std::min(kTokenTile, tokens - t0);
        if (interleaved) {
          run_interleaved_any<kBits>(nt, w, sc, blocks_per_scale, x, b0, b1, s.acc.data() + t0 * kRows);
        } else {
          run_group_any<kBits, kRows>(nt, prefetch, w, code_cols, ws, x, b0, b1, s.acc.data() + t0 * kRows);
        }
      }
    }
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < valid; ++i)
        out[t * outs + n + i] = s.acc[t * kRows + i] + (bias != nullptr ? bias[n + i] : 0.0f);
  }
}

#if defined(BASALT_INT_LINEAR_AMX)
template <int kBits>
void rows_amx(const IntWeightLayout& l, const AmxTokens& x, int64_t tokens, const uint8_t* codes,
              const uint16_t* scales, int64_t n0, int64_t n1, int64_t outs, const float* bias, float* out) {
  const int64_t blocks = l.blocks(), code_cols = l.code_columns(), scale_cols = l.scale_columns();
  GroupScratch& s = group_scratch();
  s.block_scales.resize(static_cast<size_t>(16 * blocks));
  if (kBits == 4) s.unpacked.resize(static_cast<size_t>(16 * blocks * kIntBlock));
  TileConfig config;
  config.rows[0] = 16, config.colsb[0] = 64;  // C: 16 weight rows x 16 tokens, int32
  config.rows[1] = 16, config.colsb[1] = 32;  // A: 16 weight rows x one block
  config.rows[2] = 8, config.colsb[2] = 64;   // B: one block of 16 tokens, four codes a pair
  _tile_loadconfig(&config);
  for (int64_t n = n0; n < n1; n += 16) {
    const int64_t valid = std::min<int64_t>(16, n1 - n);
    const uint8_t* w = codes + n * code_cols;
    const uint16_t* sc = scales + n * scale_cols;
    if (valid < 16) {
      pad_group(16, valid, code_cols, scale_cols, s, w, sc);
    }
    block_scales_f32(l, sc, scale_cols, 16, s.block_scales.data());
    const int8_t* a = reinterpret_cast<const int8_t*>(w);
    int64_t a_stride = code_cols;
    if constexpr (kBits == 4) {  // nibbles to signed codes, in column order
      const __m128i low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t b = 0; b < blocks; ++b) {
          const __m128i packed =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i * code_cols + b * (kIntBlock / 2)));
          int8_t* u = s.unpacked.data() + (i * blocks + b) * kIntBlock;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(u), _mm_sub_epi8(_mm_and_si128(packed, low), eight));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 16),
                           _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low), eight));
        }
      a = s.unpacked.data();
      a_stride = blocks * kIntBlock;
    }
    amx_rows16(a, a_stride, s.block_scales.data(), x, tokens, blocks, valid, n, outs, bias, out);
  }
  _tile_release();
}
#endif

#endif  // AVX2

// The activations' block sums.
void block_sums(const int8_t* codes, int64_t blocks, int32_t* sums) {
  for (int64_t b = 0; b < blocks; ++b) {
    int32_t s = 0;
    for (int64_t k = 0; k < kIntBlock; ++k) s += codes[b * kIntBlock + k];
    sums[b] = s;
  }
}

}  // namespace

void linear_int_f32(ThreadPool& pool, const float* x, int64_t tokens, const IntWeightLayout& l, const void* codes,
                    const uint16_t* scales, int64_t outs, const float* bias, float* out) {
  if (tokens == 0 || outs == 0) return;
  const int64_t K = l.in_features, blocks = l.blocks();
  const auto* w = static_cast<const uint8_t*>(codes);
  QuantizedRows& q = quantized_rows();
  q.codes.resize(static_cast<size_t>(tokens * blocks * kIntBlock));
  q.scales.resize(static_cast<size_t>(tokens * blocks));
  q.sums.resize(static_cast<size_t>(tokens * blocks));
  const auto quantize = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int8_t* c = q.codes.data() + t * blocks * kIntBlock;
      quantize_int_activations(x + t * K, K, c, q.scales.data() + t * blocks);
      block_sums(c, blocks, q.sums.data() + t * blocks);
    }
  };
  const int64_t token_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1));
  // Chunks of about an eighth of a thread's share, in whole groups of 16
  // rows: a thread streams one run of rows at a time, so its hardware
  // prefetcher is not restarted every few kilobytes.
  const int64_t row_grain = (std::max<int64_t>(16, balanced_grain(pool, outs)) + 15) / 16 * 16;

#if defined(BASALT_INT_LINEAR_AMX)
  if (!l.rows_interleaved && tokens > kTokenTile && amx_allowed.load(std::memory_order_relaxed) && amx_usable()) {
    AmxTokens& a = amx_tokens();
    const int64_t groups = (tokens + kAmxTokens - 1) / kAmxTokens;
    a.tiles.resize(static_cast<size_t>(groups * blocks * kAmxTileBytes));
    a.scales.resize(static_cast<size_t>(groups * blocks * kAmxTokens));
    pool.parallel_for(groups, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        quantize(g * kAmxTokens, std::min(tokens, (g + 1) * kAmxTokens));
        fill_amx_group(q, tokens, blocks, g, a);
      }
    });
    dynamic_for(pool, outs, row_grain, [&](int64_t n0, int64_t n1) {
      if (l.bits == 8) {
        rows_amx<8>(l, a, tokens, w, scales, n0, n1, outs, bias, out);
      } else {
        rows_amx<4>(l, a, tokens, w, scales, n0, n1, outs, bias, out);
      }
    });
    return;
  }
#endif

  pool.parallel_for(tokens, quantize, token_grain);
  dynamic_for(pool, outs, row_grain, [&](int64_t n0, int64_t n1) {
#if defined(__AVX2__)
#if defined(BASALT_INT_LINEAR_512)
    if (intel_cores() && !l.rows_interleaved) {
      if (l.bits == 8) {
        rows_vector<8, 16>(l, q, tokens, w, scales, n0, n1, outs, bias, out);
      } else {
        rows_vector<4, 16>(l, q, tokens, w, scales, n0, n1, outs, bias, out);
      }
      return;
    }
#endif
    if (l.bits == 8) {
      rows_vector<8, 8>(l, q, tokens, w, scales, n0, n1, outs, bias, out);
    } else {
      rows_vector<4, 8>(l, q, tokens, w, scales, n0, n1, outs, bias, out);
    }
#else  // no AVX2: the scalar definition
    std::vector<uint8_t> row(static_cast<size_t>(l.code_columns()));
    std::vector<uint16_t> row_scales(static_cast<size_t>(l.scale_columns()));
    for (int64_t n = n0; n < n1; ++n) {
      int_row(l, outs, w, scales, n, row.data(), row_scales.data());
      for (int64_t t = 0; t < tokens; ++t)
        out[t * outs + n] = int_dot_reference(l, q.codes.data() + t * blocks * kIntBlock,
                                              q.scales.data() + t * blocks, row.data(), row_scales.data()) +
                            (bias != nullptr ? bias[n] : 0.0f);
    }
#endif
  });
}

}  // namespace basalt::cpu
