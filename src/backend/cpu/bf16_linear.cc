#include "backend/cpu/bf16_linear.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/cpu/simd.h"  // immintrin.h where the target has AVX2
#include "core/bf16_product.h"
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

// The instruction-set layer: 16 f32 lanes accumulating one output's chunk
// dot products (Acc), one activation chunk of 32 bf16 columns as the lanes
// consume it (XChunk), and the block sum of core/bf16_product.h.
#if defined(__AVX512BF16__)

struct Acc {
  __m512 v;
};
struct XChunk {
  __m512bh v;
};
// A weight chunk, loaded once and pinned to a register: GCC otherwise folds
// the load into every vdpbf16ps that uses it, one load per multiply (28
// loads for a 4 x 6 tile's 24 instead of 10), and prefill runs a third slower.
struct WChunk {
  __m512bh v;
};
inline Acc acc_zero() { return {_mm512_setzero_ps()}; }
inline XChunk x_chunk(const uint16_t* x) { return {(__m512bh)_mm512_loadu_si512(x)}; }
inline WChunk w_chunk(const uint16_t* w) {
  WChunk c{(__m512bh)_mm512_loadu_si512(w)};
  __asm__("" : "+v"(c.v));
  return c;
}
// vdpbf16ps: per lane, the odd pair's product is added first, then the even one's.
inline Acc dot(Acc a, XChunk x, WChunk w) { return {_mm512_dpbf16_ps(a.v, x.v, w.v)}; }
inline float acc_sum(Acc a) {
  const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
// Direct regime: weight rows per pass and token rows per pass; panel tiles.
// One weight row at a time streams faster than two, four or eight side by
// side, with or without software prefetch (gate_up, down and q shapes, two
// Zen 4 threads: 35 GB/s against 25-34, alternated in one run).
constexpr int kDirectRows = 1, kDirectTokens = 4, kTileTokens = 4, kTileRows = 6;

#elif defined(__AVX2__)

// Lanes 0-7 and 8-15 of the definition, each lane's pair split into its odd
// (high half of the 32-bit word) and even (low half) bf16 values as f32.
struct Acc {
  __m256 lo, hi;
};
struct XChunk {
  __m256 odd_lo, even_lo, odd_hi, even_hi;
};
inline __m256 odd_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536))); }
inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256i load256(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// Weight chunks are split as each product consumes them (16 registers hold
// no more), so a chunk is its address.
struct WChunk {
  const uint16_t* p;
};
inline WChunk w_chunk(const uint16_t* w) { return {w}; }
inline Acc acc_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline XChunk x_chunk(const uint16_t* x) {
  const __m256i lo = load256(x), hi = load256(x + 16);
  return {odd_f32(lo), even_f32(lo), odd_f32(hi), even_f32(hi)};
}
// An exact product added with one rounding: the FMA gives the add's bits.
inline Acc dot(Acc a, const XChunk& x, WChunk w) {
  const __m256i lo = load256(w.p), hi = load256(w.p + 16);
  a.lo = _mm256_fmadd_ps(x.odd_lo, odd_f32(lo), a.lo);
  a.lo = _mm256_fmadd_ps(x.even_lo, even_f32(lo), a.lo);
  a.hi = _mm256_fmadd_ps(x.odd_hi, odd_f32(hi), a.hi);
  a.hi = _mm256_fmadd_ps(x.even_hi, even_f32(hi), a.hi);
  return a;
}
inline float acc_sum(Acc a) {
  const __m256 v = _mm256_add_ps(a.lo, a.hi);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
// 16 registers: a tile's accumulators take two each.
constexpr int kDirectRows = 1, kDirectTokens = 2, kTileTokens = 2, kTileRows = 2;

#else  // the scalar definition

struct Acc {
  float v[16];
};
struct XChunk {
  const uint16_t* x;
};
struct WChunk {
  const uint16_t* p;
};
inline WChunk w_chunk(const uint16_t* w) { return {w}; }
inline Acc acc_zero() { return {}; }
inline XChunk x_chunk(const uint16_t* x) { return {x}; }
inline Acc dot(Acc a, XChunk x, WChunk w) {
  for (int j = 0; j < 16; ++j) {
    a.v[j] = a.v[j] + bf16_to_f32(x.x[2 * j + 1]) * bf16_to_f32(w.p[2 * j + 1]);
    a.v[j] = a.v[j] + bf16_to_f32(x.x[2 * j]) * bf16_to_f32(w.p[2 * j]);
  }
  return a;
}
inline float acc_sum(const Acc& a) {
  float v[8], u[4];
  for (int j = 0; j < 8; ++j) v[j] = a.v[j] + a.v[j + 8];
  for (int j = 0; j < 4; ++j) u[j] = v[j] + v[j + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}
constexpr int kDirectRows = 1, kDirectTokens = 1, kTileTokens = 1, kTileRows = 1;

#endif

// From this many tokens on, the panel regime.
constexpr int64_t kPanelMinTokens = 16;
// Token rows per outer block of the panel regime: their rounded activations
// (128 × K × 2 bytes: 2 MiB at K = 8192) stay in L2/L3 across a thread's
// panels.
constexpr int64_t kPanelTokens = 128;
// Multiply-adds below which handing work to another thread costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 15;
// The direct regime prefetches its weight rows kWeightPrefetchBytes ahead on
// Intel's cores (simd.h). Decode reads each weight once, and there one
// core's own loads keep too few misses in flight to stream at the memory's
// rate: on an Emerald Rapids VM bf16 decode of the 1B shape went from 8.0 to
// 10.4 tokens/s with it (bench/README.md). AMD's cores do without: on Zen 4
// (kDirectRows) prefetching gained nothing.

// Rounds a row of x into `out` (bf16_padded_columns(in) values), as
// round_activations_bf16 does, sixteen columns at a time.
void round_row(const float* x, int64_t in, uint16_t* out) {
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), exponent = _mm512_set1_epi32(0x7f800000);
  for (; k + 16 <= in; k += 16) {
    const __m512i bits = _mm512_loadu_si512(x + k);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, magnitude), exponent);
    const __mmask16 tiny = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), _mm512_setzero_si512());
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(high, _mm512_set1_epi32(0x8000)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm512_cvtepi32_epi16(r));
  }
#elif defined(__AVX2__)
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), exponent = _mm256_set1_epi32(0x7f800000);
  const auto round8 = [&](const float* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), exponent);
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), _mm256_setzero_si256());
    r = _mm256_blendv_epi8(r, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
    return _mm256_blendv_epi8(r, _mm256_and_si256(high, _mm256_set1_epi32(0x8000)), tiny);
  };
  for (; k + 16 <= in; k += 16) {
    // packus interleaves 128-bit halves; the permute puts them back in order.
    const __m256i packed = _mm256_packus_epi32(round8(x + k), round8(x + k + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_permute4x64_epi64(packed, 0xd8));
  }
#endif
  // Fewer than 16 columns are left; then the padding.
  for (; k < in; ++k) out[k] = round_activation_bf16(x[k]);
  std::fill(out + in, out + bf16_padded_columns(in), uint16_t{0});
}

// Rows [0, RW) of w against token rows [0, RX) of the rounded x (rows
// `stride` = the padded width apart): out[i * out_stride + r]. The row's
// last chunk, when `in` is not a multiple of 32, goes through a zero-padded
// copy so nothing past a row is read. prefetch (in elements, 0 for none) is
// how far ahead of each chunk the weight rows are prefetched.
template <int RX, int RW>
void tile(const uint16_t* x, int64_t stride, const uint16_t* w, int64_t in, float* out, int64_t out_stride,
          int64_t prefetch) {
  Acc acc[RX][RW];
  for (int i = 0; i < RX; ++i)
    for (int r = 0; r < RW; ++r) acc[i][r] = acc_zero();
  const int64_t whole = in / kBf16Chunk * kBf16Chunk;
  int64_t k = 0;
  for (; k < whole; k += kBf16Chunk) {
    if (prefetch != 0)
      for (int r = 0; r < RW; ++r) __builtin_prefetch(w + r * in + k + prefetch);
    WChunk wc[RW];
    for (int r = 0; r < RW; ++r) wc[r] = w_chunk(w + r * in + k);
    for (int i = 0; i < RX; ++i) {
      const XChunk xc = x_chunk(x + i * stride + k);
      for (int r = 0; r < RW; ++r) acc[i][r] = dot(acc[i][r], xc, wc[r]);
    }
  }
  if (k < stride) {
    alignas(64) uint16_t tail[RW][kBf16Chunk] = {};
    for (int r = 0; r < RW; ++r) std::copy(w + r * in + k, w + r * in + in, tail[r]);
    for (int i = 0; i < RX; ++i) {
      const XChunk xc = x_chunk(x + i * stride + k);
      for (int r = 0; r < RW; ++r) acc[i][r] = dot(acc[i][r], xc, w_chunk(tail[r]));
    }
  }
  for (int i = 0; i < RX; ++i)
    for (int r = 0; r < RW; ++r) out[i * out_stride + r] = acc_sum(acc[i][r]);
}

// tile<rx, RW> for a token count known only at run time (1 ≤ rx ≤ 4).
template <int RW>
void tile_rows(int rx, const uint16_t* x, int64_t stride, const uint16_t* w, int64_t in, float* out,
               int64_t out_stride, int64_t prefetch) {
  switch (rx) {
    case 1: tile<1, RW>(x, stride, w, in, out, out_stride, prefetch); break;
    case 2: tile<2, RW>(x, stride, w, in, out, out_stride, prefetch); break;
    case 3: tile<3, RW>(x, stride, w, in, out, out_stride, prefetch); break;
    default: tile<4, RW>(x, stride, w, in, out, out_stride, prefetch); break;
  }
}

// RW rows of w from n0 (fewer at the end of the matrix: one at a time).
template <int RW>
void rows_tile(int rx, const uint16_t* x, int64_t stride, const uint16_t* w, int64_t in, int64_t n0, int64_t rows,
               float* out, int64_t out_stride, int64_t prefetch) {
  if (rows == RW) {
    tile_rows<RW>(rx, x, stride, w + n0 * in, in, out + n0, out_stride, prefetch);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      tile_rows<1>(rx, x, stride, w + (n0 + r) * in, in, out + n0 + r, out_stride, prefetch);
  }
}

// Few tokens: threads claim runs of kDirectRows-row blocks; each block is
// read from memory once and reused from L1/L2 by every group of tokens.
void direct(ThreadPool& pool, const uint16_t* xr, int64_t stride, int64_t tokens, int64_t in, const uint16_t* w,
            int64_t outs, float* out) {
  const int64_t blocks = (outs + kDirectRows - 1) / kDirectRows;
  const int64_t macs_per_block = std::max<int64_t>(1, tokens * in * kDirectRows);
  const int64_t prefetch = intel_cores() ? kWeightPrefetchBytes / 2 : 0;  // elements of 2 bytes
  dynamic_for(
      pool, blocks, std::max(balanced_grain(pool, blocks), kMinParallelMacs / macs_per_block),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t n0 = b * kDirectRows, rows = std::min<int64_t>(kDirectRows, outs - n0);
          for (int64_t t = 0; t < tokens; t += kDirectTokens) {
            const int rx = static_cast<int>(std::min<int64_t>(kDirectTokens, tokens - t));
            rows_tile<kDirectRows>(rx, xr + t * stride, stride, w, in, n0, rows, out + t * outs, outs, prefetch);
          }
        }
      },
      blocks * macs_per_block >= 2 * kMinParallelMacs);
}

// Many tokens: (token block, panel of kTileRows weight rows) items, claimed
// in runs of consecutive panels; each panel's rows stay in L1/L2 while the
// block's token rows pass, and the first pass prefetches the next panel's.
void paneled(ThreadPool& pool, const uint16_t* xr, int64_t stride, int64_t tokens, int64_t in, const uint16_t* w,
             int64_t outs, float* out) {
  const int64_t panels = (outs + kTileRows - 1) / kTileRows;
  const int64_t token_blocks = (tokens + kPanelTokens - 1) / kPanelTokens;
  const int64_t macs_per_item = std::max<int64_t>(1, std::min(tokens, kPanelTokens) * in * kTileRows);
  const int64_t items = token_blocks * panels;
  dynamic_for(
      pool, items, std::max(balanced_grain(pool, items), kMinParallelMacs / macs_per_item),
      [&](int64_t begin, int64_t end) {
        while (begin < end) {
          const int64_t tb = begin / panels, p0 = begin % panels, p1 = std::min(panels, p0 + (end - begin));
          begin += p1 - p0;
          const int64_t t0 = tb * kPanelTokens, t1 = std::min(tokens, t0 + kPanelTokens);
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t n0 = p * kTileRows, rows = std::min<int64_t>(kTileRows, outs - n0);
            const bool next_exists = n0 + 2 * kTileRows <= outs;
            for (int64_t t = t0; t < t1; t += kTileTokens) {
              const int rx = static_cast<int>(std::min<int64_t>(kTileTokens, t1 - t));
              const int64_t prefetch = t == t0 && next_exists ? kTileRows * in : 0;
              rows_tile<kTileRows>(rx, xr + t * stride, stride, w, in, n0, rows, out + t * outs, outs, prefetch);
            }
          }
        }
      },
      items * macs_per_item >= 2 * kMinParallelMacs);
}

}  // namespace

void linear_bf16_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in, const uint16_t* w,
                     int64_t outs, float* out) {
  if (tokens == 0 || outs == 0) return;
  if (in == 0) {
    std::fill(out, out + tokens * outs, 0.0f);
    return;
  }
  const int64_t stride = bf16_padded_columns(in);
  thread_local std::vector<uint16_t> rounded;
  rounded.resize(static_cast<size_t>(tokens * stride));
  uint16_t* xr = rounded.data();
  dynamic_for(
      pool, tokens, std::max<int64_t>(1, 16384 / stride),
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) round_row(x + t * in, in, xr + t * stride);
      },
      tokens * in >= 65536);
  if (tokens >= kPanelMinTokens) {
    paneled(pool, xr, stride, tokens, in, w, outs, out);
  } else {
    direct(pool, xr, stride, tokens, in, w, outs, out);
  }
}

}  // namespace basalt::cpu
