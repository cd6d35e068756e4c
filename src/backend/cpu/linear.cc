#include "backend/cpu/linear.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/bf16_linear.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace basalt::cpu {
namespace {

// Register blocking. The panel microkernel keeps kPanelX × kPanelRows vector
// accumulators live: 24 of AVX-512's 32 registers, 12 of AVX2's 16.
#if defined(__AVX512F__)
constexpr int kPanelX = 4;
constexpr int kPanelRows = 6;
#elif defined(__AVX2__)
constexpr int kPanelX = 3;
constexpr int kPanelRows = 4;
#else
constexpr int kPanelX = 4;
constexpr int kPanelRows = 4;
#endif
// Whether the microkernel holds a k-step's kPanelRows weight vectors (and
// streams the token rows past them) or holds the kPanelX token vectors (and
// streams the weights). AVX2's 12 accumulators leave room for 4 more
// vectors, not 5: holding the weights, GCC kept one accumulator in memory,
// and its store-to-load round trip each step left the tile at ~40% of the
// FMA rate (f16 prefill on Zen 4 built for x86-64-v3). Either order gives
// every accumulator the same multiply-adds in the same order.
#if defined(__AVX512F__)
constexpr bool kPanelHoldsWeights = true;
#else
constexpr bool kPanelHoldsWeights = false;
#endif
// The direct kernel's weight rows per pass and token rows per pass. Eight
// concurrent row streams keep more misses in flight than four (decode: +20%
// on one Zen 5 core). On AVX2 too, though 4 token rows x 8 weight rows of
// accumulators outgrow its 16 registers: built for x86-64-v3 on two Zen 4
// threads, 8 rows against 4 streamed bf16 and f16 weights 1.1-1.5x faster
// at 1 token on the 1B shape's projections and 1.1-1.4x at 2 to 4 tokens
// (2 rows was the slowest choice, 1 row mixed). The rows per pass do not
// change a result's bits: each (token, row) sum runs over k in order.
// No software prefetch: on two Zen 4 threads, f16 rows stream at 28-31 GB/s
// without it and 22-30 GB/s with it 1 KiB ahead (gate_up, down and q shapes,
// alternated in one run).
constexpr int kDirectRows = 8;
constexpr int kDirectX = 4;
// Except at one token, where a block's rows are read one after another
// (one stream a thread, as the bf16 decode kernel reads), while the token's
// f32 row stays in L1 beside them: up to kRowByRowMaxXBytes of it (half of
// a 32 KiB L1). On two Zen 4 threads, in turns with the 8 streams, f16
// weights went from 98-101 % of the streaming probe's rate to 108-128 % on
// the 1B shape's gate_up, q/o and lm_head (AVX2 build: 110-116 % to
// 118-133 %), f32 weights from 102-112 % to 108-136 %; with an 8192-wide
// row (32 KiB of x, the down shape) from 109-111 % to 75 %, so wider rows
// keep the 8 streams. Block-FP8 rows keep them too (not measured). Bits do
// not change: each (token, row) sum runs over k in order either way.
constexpr int64_t kRowByRowMaxXBytes = 16 << 10;
// On Intel's cores, though, the direct kernel prefetches each weight row
// kWeightPrefetchBytes ahead (simd.h): there one core's own loads keep too
// few misses in flight to stream at the memory's rate (bench/README.md, an
// Emerald Rapids VM).
// From this many tokens on, converting a weight panel once and reusing it
// beats converting in registers for every group of kDirectX tokens (measured
// on Zen 5: even at 8 tokens, 16 break even, from 32 on panels win by 10-80%
// as the direct kernel's weight rows outgrow L1).
constexpr int64_t kPanelMinTokens = 16;
// K-block of a panel: kPanelRows × kPanelK floats (24 KiB) stay in L1 while
// the token rows stream past them from L2.
constexpr int64_t kPanelK = 1024;
// Token rows per outer block, so that those rows' K-block (kPanelTokens ×
// kPanelK floats, 512 KiB) stays in L2 across all panels of a thread.
constexpr int64_t kPanelTokens = 128;
// Multiply-adds below which handing work to another thread costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 15;

// How a weight dtype is read: one vector of kLanes weights, or one weight.
template <DType D>
struct WeightType;

template <>
struct WeightType<DType::kF32> {
  using Storage = float;
  static Vec load(const float* p) { return vload(p); }
  static float scalar(float v) { return v; }
};

template <>
struct WeightType<DType::kBF16> {
  using Storage = uint16_t;
  static Vec load(const uint16_t* p) { return vload_bf16(p); }
  static float scalar(uint16_t v) { return bf16_to_f32(v); }
};

template <>
struct WeightType<DType::kF16> {
  using Storage = uint16_t;
  static Vec load(const uint16_t* p) { return vload_f16(p); }
  static float scalar(uint16_t v) { return f16_to_f32(v); }
};

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

template <>
struct WeightType<DType::kF8E4M3> {
  using Storage = uint8_t;
  static Vec load(const uint8_t* p) {
    alignas(64) float f[kLanes];
    for (int i = 0; i < kLanes; ++i) f[i] = fp8_table()[p[i]];
    return vload(f);
  }
  static float scalar(uint8_t v) { return fp8_table()[v]; }
};

// The K-blocking that both regimes share: equal blocks of at most kPanelK
// columns, each a multiple of kLanes except possibly the last. It depends on
// `in` only, so every output element is summed block by block in the same
// order whatever the token count: within a block, one vector accumulator per
// (token, weight row) takes the block's vectors in column order (the tail
// through zero-padded lanes), then vsum; the block sums are added left to
// right. This is what makes linear batch-invariant.
int64_t k_block_step(int64_t in) {
  const int64_t k_blocks = std::max<int64_t>(1, (in + kPanelK - 1) / kPanelK);
  return ((in + k_blocks - 1) / k_blocks + kLanes - 1) / kLanes * kLanes;
}

// How the direct kernel reads weights: one vector of kLanes weights at column
// k, or one weight, as f32. `scales` is the weight rows' block-scale row
// (block-FP8 weights) and unused otherwise.
template <DType D>
struct PlainRows {
  using Storage = typename WeightType<D>::Storage;
  static Vec load(const Storage* p, const float*, int64_t) { return WeightType<D>::load(p); }
  static float scalar(Storage v, const float*, int64_t) { return WeightType<D>::scalar(v); }
};

// Block-FP8 weights dequantized in registers: code / 2^8 times (scale · 2^8),
// the same single rounding as fp8_block.cc's dequantized rows, so the direct
// kernel on these rows gives the bits of the f32 kernels on dequantized rows.
struct Fp8BlockRows {
  using Storage = uint8_t;
  static Vec load(const uint8_t* p, const float* scales, int64_t k) {
    return vmul(vload_fp8_unit(p), vset(scales[k / kFp8BlockSize] * kFp8Unit));
  }
  static float scalar(uint8_t v, const float* scales, int64_t k) {
    return fp8_unit_scalar(v) * (scales[k / kFp8BlockSize] * kFp8Unit);
  }
};
static_assert(kFp8BlockSize % kLanes == 0, "a weight vector lies in one scale block");
static_assert(kFp8BlockSize % kDirectRows == 0, "a direct block's rows share one scale row");

// out[i * out_stride + r] = dot(x row i, w row r) for RX token rows and RW
// weight rows of length `in` (rows of x and w are `in` apart), K-block by
// K-block as k_block_step describes.
template <class W, int RX, int RW>
void direct_block(const float* x, const typename W::Storage* w, const float* scales, int64_t in,
                  int64_t k_step, float* out, int64_t out_stride, int64_t prefetch) {
  // Elements per 64-byte line of a weight row: one prefetch per line.
  constexpr int64_t kLine = 64 / sizeof(typename W::Storage);
  for (int64_t k0 = 0; k0 < in; k0 += k_step) {
    const int64_t k1 = std::min(in, k0 + k_step);
    Vec acc[RX][RW];
    for (int i = 0; i < RX; ++i) {
      for (int r = 0; r < RW; ++r) acc[i][r] = vzero();
    }
    int64_t k = k0;
    for (; k + kLanes <= k1; k += kLanes) {
      if (prefetch != 0 && k % kLine == 0)
        for (int r = 0; r < RW; ++r) __builtin_prefetch(w + r * in + k + prefetch);
      Vec wv[RW];
      for (int r = 0; r < RW; ++r) {
        wv[r] = W::load(w + r * in + k, scales, k);
      }
      for (int i = 0; i < RX; ++i) {
        Vec xv = vload(x + i * in + k);
        vpin(xv);
        for (int r = 0; r < RW; ++r) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
      }
    }
    if (k < k1) {
      // The tail goes through zero-padded copies so no load reads past a row.
      const int rest = static_cast<int>(k1 - k);
      Vec wv[RW];
      for (int r = 0; r < RW; ++r) {
        alignas(64) float tail[kLanes] = {};
        for (int j = 0; j < rest; ++j) tail[j] = W::scalar(w[r * in + k + j], scales, k + j);
        wv[r] = vload(tail);
      }
      for (int i = 0; i < RX; ++i) {
        const Vec xv = vload_partial(x + i * in + k, rest);
        for (int r = 0; r < RW; ++r) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
      }
    }
    for (int i = 0; i < RX; ++i) {
      for (int r = 0; r < RW; ++r) {
        const float v = vsum(acc[i][r]);
        float& o = out[i * out_stride + r];
        o = k0 > 0 ? o + v : v;
      }
    }
  }
}

template <class W, int RW>
void direct_block_rows(int rx, const float* x, const typename W::Storage* w, const float* scales,
                       int64_t in, int64_t k_step, float* out, int64_t out_stride, int64_t prefetch) {
  switch (rx) {
    case 1: direct_block<W, 1, RW>(x, w, scales, in, k_step, out, out_stride, prefetch); break;
    case 2: direct_block<W, 2, RW>(x, w, scales, in, k_step, out, out_stride, prefetch); break;
    case 3: direct_block<W, 3, RW>(x, w, scales, in, k_step, out, out_stride, prefetch); break;
    default: direct_block<W, 4, RW>(x, w, scales, in, k_step, out, out_stride, prefetch); break;
  }
}

// Few tokens: threads claim runs of blocks of kDirectRows weight rows; each
// block is read from memory once and reused from L1/L2 for every group of
// tokens. scale_inv (block-FP8 weights only) is [ceil(outs/128), kb].
template <class W>
void linear_direct(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                   const typename W::Storage* w, const float* scale_inv, int64_t kb, int64_t outs,
                   float* out) {
  static_assert(kDirectX == 4, "direct_block_rows dispatches 1..4 token rows");
  const int64_t blocks = (outs + kDirectRows - 1) / kDirectRows;
  const int64_t macs_per_block = std::max<int64_t>(1, tokens * in * kDirectRows);
  const int64_t k_step = k_block_step(in);
  constexpr int64_t kElementBytes = sizeof(typename W::Storage);
  const int64_t prefetch = intel_cores() ? kWeightPrefetchBytes / kElementBytes : 0;
  const bool row_by_row = tokens == 1 && scale_inv == nullptr && in * static_cast<int64_t>(sizeof(float)) <=
                                                                        kRowByRowMaxXBytes;
  dynamic_for(
      pool, blocks,
      std::max(balanced_grain(pool, blocks), kMinParallelMacs / macs_per_block),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t n0 = b * kDirectRows;
          const int64_t rows = std::min<int64_t>(kDirectRows, outs - n0);
          const float* scales = scale_inv ? scale_inv + (n0 / kFp8BlockSize) * kb : nullptr;
          for (int64_t t = 0; t < tokens; t += kDirectX) {
            const int rx = static_cast<int>(std::min<int64_t>(kDirectX, tokens - t));
            if (rows == kDirectRows && !row_by_row) {
              direct_block_rows<W, kDirectRows>(rx, x + t * in, w + n0 * in, scales, in, k_step,
                                                out + t * outs + n0, outs, prefetch);
            } else {
              for (int64_t r = 0; r < rows; ++r) {
                direct_block_rows<W, 1>(rx, x + t * in, w + (n0 + r) * in, scales, in, k_step,
                                        out + t * outs + n0 + r, outs, prefetch);
              }
            }
          }
        }
      },
      blocks * macs_per_block >= 2 * kMinParallelMacs);
}

// What a panel holds for weight dtype D. f16 weights stay 16-bit and are
// converted to f32 in registers as the microkernel loads them (F16C, an
// exact conversion, so the products keep their bits): half the bytes in L1
// beside the streamed token rows, and no f32 copy to write. Built for
// x86-64-v3 on two Zen 4 threads, a standalone 3-token × 4-row f16 tile ran
// at 89-109 GFLOP/s a thread that way, against 69-106 from an f32 panel (of
// a 116 GFLOP/s FMA peak); in the whole model (1B shape, f16 prefill, six
// rounds in turns with the prefetch below on both sides) pp128 gained
// 0.97-1.11x, median 1.04, and pp512 nothing. bf16 weights were slower that
// way (a widening and a shift per load: pp128/pp512 0.86-0.96x), so they,
// like f32 and fp8 (no in-register conversion here), are panelled as f32.
template <DType D>
struct PanelType {
  using Storage = float;
  static Vec load(const float* p) { return vload(p); }
  static float from(typename WeightType<D>::Storage v) { return WeightType<D>::scalar(v); }
};
#if defined(__F16C__)
template <>
struct PanelType<DType::kF16> {
  using Storage = uint16_t;
  static Vec load(const uint16_t* p) { return vload_f16(p); }
  static uint16_t from(uint16_t v) { return v; }
};
#endif

// Copies weight rows [n0, n0 + rows) × columns [k0, k0 + k_len) into panel
// (kPanelRows rows, `stride` elements apart) as PanelType<D> holds them,
// zero-filling the padding rows and the columns past k_len up to the next
// multiple of kLanes (a zero f16 is the bits 0).
template <DType D>
void pack_panel(const typename WeightType<D>::Storage* w, int64_t in, int64_t n0, int64_t rows,
                int64_t k0, int64_t k_len, typename PanelType<D>::Storage* panel, int64_t stride) {
  using W = WeightType<D>;
  using P = PanelType<D>;
  using Out = typename P::Storage;
  const int64_t padded = (k_len + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < kPanelRows; ++r) {
    Out* dst = panel + r * stride;
    if (r >= rows) {
      std::fill(dst, dst + padded, Out{0});
      continue;
    }
    const typename W::Storage* src = w + (n0 + r) * in + k0;
    int64_t k = 0;
    if constexpr (std::is_same_v<Out, typename W::Storage>) {
      std::copy(src, src + k_len, dst);
      k = k_len;
    } else if constexpr (D != DType::kF8E4M3) {
      for (; k + kLanes <= k_len; k += kLanes) vstore(dst + k, W::load(src + k));
    }
    for (; k < k_len; ++k) dst[k] = P::from(src[k]);
    for (; k < padded; ++k) dst[k] = Out{0};
  }
}

// The panel microkernel: RX token rows against the kPanelRows rows of a
// panel (read through P, a PanelType) over k_len columns. Stores (or adds,
// for later K-blocks) the first `valid` columns of the RX × kPanelRows result.
template <class P, int RX>
void panel_block(const float* x, int64_t x_stride, const typename P::Storage* panel,
                 int64_t panel_stride, int64_t k_len, float* out, int64_t out_stride,
                 int64_t valid, bool accumulate) {
  Vec acc[RX][kPanelRows];
  for (int i = 0; i < RX; ++i) {
    for (int r = 0; r < kPanelRows; ++r) acc[i][r] = vzero();
  }
  int64_t k = 0;
  for (; k + kLanes <= k_len; k += kLanes) {
    if constexpr (kPanelHoldsWeights) {
      Vec wv[kPanelRows];
      for (int r = 0; r < kPanelRows; ++r) {
        wv[r] = P::load(panel + r * panel_stride + k);
        vpin(wv[r]);
      }
      for (int i = 0; i < RX; ++i) {
        const Vec xv = vload(x + i * x_stride + k);
        for (int r = 0; r < kPanelRows; ++r) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
      }
    } else {
      Vec xv[RX];
      for (int i = 0; i < RX; ++i) xv[i] = vload(x + i * x_stride + k);
      for (int r = 0; r < kPanelRows; ++r) {
        Vec wv = P::load(panel + r * panel_stride + k);
        vpin(wv);
        for (int i = 0; i < RX; ++i) acc[i][r] = vfma(xv[i], wv, acc[i][r]);
      }
    }
  }
  if (k < k_len) {
    const int rest = static_cast<int>(k_len - k);
    Vec wv[kPanelRows];
    for (int r = 0; r < kPanelRows; ++r) wv[r] = P::load(panel + r * panel_stride + k);
    for (int i = 0; i < RX; ++i) {
      const Vec xv = vload_partial(x + i * x_stride + k, rest);
      for (int r = 0; r < kPanelRows; ++r) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < RX; ++i) {
    float* o = out + i * out_stride;
    for (int r = 0; r < valid; ++r) {
      const float v = vsum(acc[i][r]);
      o[r] = accumulate ? o[r] + v : v;
    }
  }
}

template <class P>
void panel_block_rows(int rx, const float* x, int64_t x_stride, const typename P::Storage* panel,
                      int64_t panel_stride, int64_t k_len, float* out, int64_t out_stride,
                      int64_t valid, bool accumulate) {
  static_assert(kPanelX <= 4, "panel_block_rows dispatches 1..4 token rows");
  switch (rx) {
    case 1: panel_block<P, 1>(x, x_stride, panel, panel_stride, k_len, out, out_stride, valid, accumulate); break;
    case 2: panel_block<P, 2>(x, x_stride, panel, panel_stride, k_len, out, out_stride, valid, accumulate); break;
    case 3: panel_block<P, 3>(x, x_stride, panel, panel_stride, k_len, out, out_stride, valid, accumulate); break;
    default: panel_block<P, kPanelX>(x, x_stride, panel, panel_stride, k_len, out, out_stride, valid, accumulate); break;
  }
}

// Fetches the weights of the panel packed next into L2 a slice at a time,
// while the token groups of the current one compute: panels are visited
// K-block by K-block, short strided runs the hardware prefetcher misses,
// and the pack would otherwise wait on memory with the FMA units idle. (It
// replaced a burst of prefetches for the whole next panel inside the pack.)
// On two Zen 4 threads, 1B shape, whole-model prefill in turns with the
// burst: f16 pp512 1.01-1.15x, bf16 (f32 activations) 1.03-1.15x, AVX2
// builds; f16 with AVX-512 pp128 0.95-1.12x, pp512 1.02-1.10x (the f16
// figures include the f16 panel above).
class NextPanelPrefetch {
 public:
  NextPanelPrefetch(const void* first_row, int64_t row_stride_bytes, int64_t rows,
                    int64_t row_bytes, int64_t slices)
      : first_(static_cast<const char*>(first_row)),
        row_stride_(row_stride_bytes),
        // A row's first and last line, wherever it starts within a line.
        lines_per_row_(row_bytes == 0 ? 0 : (row_bytes + 63) / 64 + 1),
        total_(rows * lines_per_row_),
        per_slice_((total_ + slices - 1) / std::max<int64_t>(1, slices)) {}

  void next_slice() {
    for (int64_t end = std::min(total_, done_ + per_slice_); done_ < end; ++done_) {
      // Counted, not divided: two divisions a line showed in the profile.
      __builtin_prefetch(first_ + row_offset_ + line_ * 64, 0, 2);
      if (++line_ == lines_per_row_) {
        line_ = 0;
        row_offset_ += row_stride_;
      }
    }
  }

 private:
  const char* first_;
  int64_t row_stride_, lines_per_row_, total_, per_slice_;
  int64_t done_ = 0, row_offset_ = 0, line_ = 0;
};

// Many tokens: the work is (token block, panel of weight rows) pairs, which
// threads claim in runs of consecutive panels.
template <DType D>
void linear_paneled(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                    const typename WeightType<D>::Storage* w, int64_t outs, float* out) {
  const int64_t panels = (outs + kPanelRows - 1) / kPanelRows;
  const int64_t token_blocks = (tokens + kPanelTokens - 1) / kPanelTokens;
  const int64_t k_step = k_block_step(in);
  const int64_t stride = k_step + 16;  // a little skew so panel rows map to different sets
  const int64_t macs_per_item = std::max<int64_t>(1, std::min(tokens, kPanelTokens) * in * kPanelRows);
  const int64_t items = token_blocks * panels;
  dynamic_for(
      pool, items, std::max(balanced_grain(pool, items), kMinParallelMacs / macs_per_item),
      [&](int64_t begin, int64_t end) {
        using P = PanelType<D>;
        auto* panel = static_cast<typename P::Storage*>(scratch_bytes(
            ScratchSlot::kLinearPanel, kPanelRows * stride * sizeof(typename P::Storage)));
        while (begin < end) {
          const int64_t tb = begin / panels;
          const int64_t p0 = begin % panels;
          const int64_t p1 = std::min(panels, p0 + (end - begin));
          begin += p1 - p0;
          const int64_t t0 = tb * kPanelTokens, t1 = std::min(tokens, t0 + kPanelTokens);
          const int64_t groups = (t1 - t0 + kPanelX - 1) / kPanelX;
          for (int64_t k0 = 0; k0 < in; k0 += k_step) {
            const int64_t k_len = std::min(k_step, in - k0);
            for (int64_t p = p0; p < p1; ++p) {
              const int64_t n0 = p * kPanelRows;
              const int64_t rows = std::min<int64_t>(kPanelRows, outs - n0);
              pack_panel<D>(w, in, n0, rows, k0, k_len, panel, stride);
              // The next panel: p + 1 in this K-block, or the run's first in the next.
              const bool wraps = p + 1 == p1;
              const int64_t next_n0 = wraps ? p0 * kPanelRows : n0 + kPanelRows;
              const int64_t next_k0 = wraps ? k0 + k_step : k0;
              const int64_t next_rows =
                  next_k0 < in ? std::min<int64_t>(kPanelRows, outs - next_n0) : 0;
              NextPanelPrefetch prefetch(w + next_n0 * in + next_k0, in * sizeof(*w), next_rows,
                                         std::min(k_step, in - next_k0) * sizeof(*w), groups);
              for (int64_t t = t0; t < t1; t += kPanelX) {
                const int rx = static_cast<int>(std::min<int64_t>(kPanelX, t1 - t));
                panel_block_rows<P>(rx, x + t * in + k0, in, panel, stride, k_len,
                                    out + t * outs + n0, outs, rows, k0 > 0);
                prefetch.next_slice();
              }
            }
          }
        }
      },
      items * macs_per_item >= 2 * kMinParallelMacs);
}

template <DType D>
void linear_typed(ThreadPool& pool, const float* x, int64_t tokens, int64_t in, const void* w,
                  int64_t outs, float* out) {
  const auto* weights = static_cast<const typename WeightType<D>::Storage*>(w);
  // fp8 has no in-register conversion, so it always goes through f32 panels.
  if (tokens >= kPanelMinTokens || D == DType::kF8E4M3) {
    linear_paneled<D>(pool, x, tokens, in, weights, outs, out);
  } else {
    linear_direct<PlainRows<D>>(pool, x, tokens, in, weights, nullptr, 0, outs, out);
  }
}

float load_bias(const void* bias, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(bias)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(bias)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(bias)[i]);
    default: fail("linear: bias dtype {} is not supported", dtype_name(dtype));
  }
}

}  // namespace

Bf16Activations auto_bf16_activations() {
#if defined(__AVX512BF16__)
  return Bf16Activations::kRounded;
#else
  return Bf16Activations::kF32;
#endif
}

int64_t linear_panel_min_tokens() { return kPanelMinTokens; }

void linear_fp8_block_direct(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                             const uint8_t* w, const float* scale_inv, int64_t outs, float* out) {
  if (tokens == 0 || outs == 0) return;
  if (in == 0) {
    std::fill(out, out + tokens * outs, 0.0f);
    return;
  }
  const int64_t kb = (in + kFp8BlockSize - 1) / kFp8BlockSize;
  linear_direct<Fp8BlockRows>(pool, x, tokens, in, w, scale_inv, kb, outs, out);
}

void linear_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in, const void* w,
                DType w_dtype, int64_t outs, const void* bias, DType bias_dtype, float* out,
                Bf16Activations bf16_activations) {
  if (tokens == 0 || outs == 0) return;
  if (in == 0) {
    std::fill(out, out + tokens * outs, 0.0f);
  } else {
    switch (w_dtype) {
      case DType::kF32: linear_typed<DType::kF32>(pool, x, tokens, in, w, outs, out); break;
      case DType::kBF16:
        if (bf16_activations == Bf16Activations::kRounded) {
          linear_bf16_f32(pool, x, tokens, in, static_cast<const uint16_t*>(w), outs, out);
        } else {
          linear_typed<DType::kBF16>(pool, x, tokens, in, w, outs, out);
        }
        break;
      case DType::kF16: linear_typed<DType::kF16>(pool, x, tokens, in, w, outs, out); break;
      case DType::kF8E4M3: linear_typed<DType::kF8E4M3>(pool, x, tokens, in, w, outs, out); break;
      default: fail("linear: weight dtype {} is not supported", dtype_name(w_dtype));
    }
  }
  if (bias != nullptr) {
    std::vector<float> b(static_cast<size_t>(outs));
    for (int64_t n = 0; n < outs; ++n) b[n] = load_bias(bias, bias_dtype, n);
    pool.parallel_for(
        tokens,
        [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            float* row = out + t * outs;
            for (int64_t n = 0; n < outs; ++n) row[n] += b[n];
          }
        },
        std::max<int64_t>(1, 16384 / outs));
  }
}

}  // namespace basalt::cpu
