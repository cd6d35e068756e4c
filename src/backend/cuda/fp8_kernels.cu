// The block-FP8 kernels (see fp8_kernels.h): the per-token activation
// quantizer (fp8.h states its rule) and the weight-streaming linear.
//
// Quantizer: one warp per (row, group of 128 columns): lane l holds columns l, l + 32,
// l + 64 and l + 96 of the group (coalesced loads, 32 consecutive bytes per
// store), the warp's amax is a shuffle reduction (max is exact, so the order
// does not matter), and every lane converts its elements with the hardware
// e4m3 conversion (round to nearest even, saturated to +-448).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/fp8_kernels.h"

namespace basalt::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kPerLane = kFp8Group / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kE4m3Max = 448.0f;  // largest finite e4m3 (e4m3fn) value

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_groups_kernel(const T* x, uint8_t* __restrict__ q, float* __restrict__ scales,
                               int64_t rows, int64_t cols, int64_t groups, int64_t scale_row_stride,
                               int64_t scale_group_stride) {
  wait_for_producer();  // x is the kernels' before this one
  let_consumer_start();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t items = rows * groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // The loop bound is the same for every lane of a warp, so the full-mask
  // shuffles below always have all 32 lanes present.
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += stride) {
    const int64_t row = item / groups, group = item % groups;
    const int64_t begin = row * cols + group * kFp8Group;
    const int64_t width = cols - group * kFp8Group < kFp8Group ? cols - group * kFp8Group : kFp8Group;
    float v[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      v[i] = c < width ? to_f32(x[begin + c]) : 0.0f;
      amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, offset));
    // amax / 448 is never 0 here unless amax is 0 or so small that the
    // quotient underflows; 1 then (every element quantizes to +-0 or a tiny
    // value), so nothing ever divides by zero.
    float scale = amax / kE4m3Max;
    if (!(scale > 0.0f)) scale = 1.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < width) q[begin + c] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) scales[row * scale_row_stride + group * scale_group_stride] = scale;
  }
}


// ---------------------------------------------------------------------------
// Weight-streaming block-FP8 linear (DeepGEMM's scheme on mma.sync).
//
// The product is computed transposed, outᵀ = w · qᵀ, so that the many
// weight rows are the MMA's 16-row A operand and the few tokens its 8-column
// B operand (mma.sync m16n8k32 with e4m3 inputs and f32 accumulators). A
// block owns TILES tiles of 16 weight rows and one slab of 8 * MT tokens;
// SPLIT warps share each tile, every warp summing a contiguous run of
// 128-column blocks. Per 128-column block a warp runs 4 MMAs (2 per
// 64 columns) per 8 tokens into fresh accumulators and adds them, times the
// block's two scales, into its running sums: the tile's 16 rows lie in one
// 128-row weight block (16 divides 128), so the weight scale is one number
// per (tile, column block), and the token scale is per accumulator column.
// The SPLIT partial sums meet in shared memory in a fixed order.
//
// Fragment layouts (PTX ISA, mma.m16n8k32 with 8-bit operands; g = lane / 4,
// t = lane % 4): A registers a0 = (row g, k 4t..4t+3), a1 = (row g+8, k
// 4t..4t+3), a2 = (row g, k 16+4t..16+4t+3), a3 = (row g+8, k 16+4t..);
// B registers b0 = (k 4t..4t+3, col g), b1 = (k 16+4t.., col g); C c0, c1 =
// (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
//
// A dot product does not care in which order it visits k, so each lane
// loads 16 contiguous bytes -- columns 64j + 16t .. 64j + 16t + 15 of the
// 128-column block, j = 0, 1, of weight rows g and g+8 and of token g -- and
// the two MMAs of those 64 columns take them as their "logical" k: MMA s
// uses bytes 8s..8s+7 of each load, its first word as the k 4t..4t+3
// register and its second as 16+4t..16+4t+3, for the weights and the tokens
// alike, so every physical column meets the token element it multiplies in
// a plain dot product. Columns past the end load as zeros (both operands).
//
// The weights are read with streaming loads, DEPTH column blocks ahead of
// the MMAs (register double buffering); the first batch is requested before
// the kernel waits for the quantizer that writes q and the token scales.
constexpr int kTileRows = 16;

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load_streaming16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Bytes [k, k + 16) of a row of `cols` bytes as four little-endian words;
// zeros where !ok and past the row's end. kVec: cols is a multiple of 16 and
// the row 16-byte aligned, so a chunk lies wholly inside or outside the row.
template <bool kVec, bool kStreaming>
__device__ __forceinline__ uint4 load_chunk(const uint8_t* row, int64_t k, int64_t cols, bool ok) {
  if constexpr (kVec) {
    if (!ok || k >= cols) return make_uint4(0, 0, 0, 0);
    if constexpr (kStreaming) return load_streaming16(row + k);
    return *reinterpret_cast<const uint4*>(row + k);
  } else {
    uint32_t words[4] = {0, 0, 0, 0};
    if (ok) {
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (k + b < cols) words[b / 4] |= static_cast<uint32_t>(row[k + b]) << (8 * (b % 4));
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

template <typename O, int MT, int SPLIT, int TILES, int DEPTH, bool kVec>
__global__ void __launch_bounds__(SPLIT* TILES * 32)
    linear_fp8_stream_kernel(const uint8_t* q, const float* act_scales,
                             const uint8_t* __restrict__ w, const float* __restrict__ w_scales, O* __restrict__ out,
                             int64_t rows, int64_t n_out, int64_t cols, int64_t slabs) {
  constexpr int kWarps = SPLIT * TILES;
  constexpr int kTokens = 8 * MT;
  __shared__ float partial[TILES][SPLIT][kTokens][kTileRows];
  let_consumer_start();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int tile = warp / SPLIT, part = warp % SPLIT;
  const int64_t slab = blockIdx.x % slabs;  // consecutive blocks share weight rows (L2) when T > 8 MT
  const int64_t first_row = static_cast<int64_t>(blockIdx.x / slabs) * TILES * kTileRows;
  const int64_t n0 = first_row + tile * kTileRows;
  const int64_t t0 = slab * kTokens;
  const int64_t col_blocks = (cols + kFp8Group - 1) / kFp8Group;
  const int64_t per_warp = (col_blocks + SPLIT - 1) / SPLIT;
  const int64_t b_begin = part * per_warp;
  const int64_t b_end = b_begin + per_warp < col_blocks ? b_begin + per_warp : col_blocks;
  const bool tile_ok = n0 < n_out, lo_ok = n0 + g < n_out, hi_ok = n0 + g + 8 < n_out;
  const uint8_t* w_lo = w + (lo_ok ? (n0 + g) * cols : 0);
  const uint8_t* w_hi = w + (hi_ok ? (n0 + g + 8) * cols : 0);
  const float* w_scale_row = w_scales + (tile_ok ? (n0 / kFp8Group) * col_blocks : 0);

  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

  const auto load_weights = [&](int64_t b0, uint4(&lo)[DEPTH][2], uint4(&hi)[DEPTH][2], float(&scale)[DEPTH]) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      const int64_t b = b0 + u;
      const bool ok = b < b_end;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t k = b * kFp8Group + 64 * j + 16 * t;
        lo[u][j] = load_chunk<kVec, true>(w_lo, k, cols, ok && lo_ok);
        hi[u][j] = load_chunk<kVec, true>(w_hi, k, cols, ok && hi_ok);
      }
      scale[u] = ok && tile_ok ? w_scale_row[b] : 0.0f;
    }
  };
  const auto multiply = [&](int64_t b0, const uint4(&lo)[DEPTH][2], const uint4(&hi)[DEPTH][2],
                            const float(&scale)[DEPTH]) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      const int64_t b = b0 + u;
      if (b >= b_end) break;  // the same for every lane of the warp
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int64_t token = t0 + 8 * i + g;
        const bool token_ok = token < rows;
        const uint8_t* x_row = q + (token_ok ? token * cols : 0);
        uint4 xs[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) xs[j] = load_chunk<kVec, false>(x_row, b * kFp8Group + 64 * j + 16 * t, cols, token_ok);
        float block[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          mma_e4m3(block, lo[u][j].x, hi[u][j].x, lo[u][j].y, hi[u][j].y, xs[j].x, xs[j].y);
          mma_e4m3(block, lo[u][j].z, hi[u][j].z, lo[u][j].w, hi[u][j].w, xs[j].z, xs[j].w);
        }
        const int64_t c0 = t0 + 8 * i + 2 * t, c1 = c0 + 1;
        const float s0 = c0 < rows ? scale[u] * act_scales[b * rows + c0] : 0.0f;
        const float s1 = c1 < rows ? scale[u] * act_scales[b * rows + c1] : 0.0f;
        acc[i][0] = fmaf(block[0], s0, acc[i][0]);
        acc[i][1] = fmaf(block[1], s1, acc[i][1]);
        acc[i][2] = fmaf(block[2], s0, acc[i][2]);
        acc[i][3] = fmaf(block[3], s1, acc[i][3]);
      }
    }
  };

  uint4 lo[DEPTH][2], hi[DEPTH][2];
  float scale[DEPTH];
  if (b_begin < b_end) load_weights(b_begin, lo, hi, scale);
  wait_for_producer();  // q and the token scales are the quantizer's
  for (int64_t b0 = b_begin; b0 < b_end; b0 += DEPTH) {
    uint4 next_lo[DEPTH][2], next_hi[DEPTH][2];
    float next_scale[DEPTH];
    const bool more = b0 + DEPTH < b_end;
    if (more) load_weights(b0 + DEPTH, next_lo, next_hi, next_scale);
    multiply(b0, lo, hi, scale);
    if (more) {
#pragma unroll
      for (int u = 0; u < DEPTH; ++u) {
        scale[u] = next_scale[u];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          lo[u][j] = next_lo[u][j];
          hi[u][j] = next_hi[u][j];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < MT; ++i) {
    partial[tile][part][8 * i + 2 * t][g] = acc[i][0];
    partial[tile][part][8 * i + 2 * t + 1][g] = acc[i][1];
    partial[tile][part][8 * i + 2 * t][g + 8] = acc[i][2];
    partial[tile][part][8 * i + 2 * t + 1][g + 8] = acc[i][3];
  }
  __syncthreads();
  // Thread -> (tile, token, row), rows fastest: a token's 16 outputs of a
  // tile are one contiguous store.
  for (int e = static_cast<int>(threadIdx.x); e < TILES * kTokens * kTileRows; e += kWarps * 32) {
    const int row = e % kTileRows, token = (e / kTileRows) % kTokens, tl = e / (kTileRows * kTokens);
    const int64_t n = first_row + tl * kTileRows + row, tok = t0 + token;
    if (n >= n_out || tok >= rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < SPLIT; ++v) sum += partial[tl][v][token][row];
    out[tok * n_out + n] = from_f32<O>(sum);
  }
}

template <typename O, int MT, int SPLIT, int TILES, int DEPTH, bool kVec>
cudaError_t launch_stream(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales, O* out,
                          int64_t rows, int64_t n_out, int64_t cols, cudaStream_t stream) {
  const int64_t slabs = (rows + 8 * MT - 1) / (8 * MT);
  const int64_t groups = (n_out + TILES * kTileRows - 1) / (TILES * kTileRows);
  const int64_t blocks = groups * slabs;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_dependent(linear_fp8_stream_kernel<O, MT, SPLIT, TILES, DEPTH, kVec>,
                          dim3(static_cast<unsigned>(blocks)), dim3(SPLIT * TILES * 32), stream, q, act_scales, w,
                          w_scales, out, rows, n_out, cols, slabs);
}

// The warps of a block split K while it has at least 16 column blocks (2
// per warp); below that they take more weight rows instead, so that every
// warp keeps a couple of column blocks in flight.
//
// Pipeline depth (variant 0), from the H200 measurements of
// bench/cuda_fp8_gemm_bench.cc (both depths at DeepGEMM's six shapes, M = 1
// to 128): with one token tile (<= 8 tokens) 2 blocks in flight win wherever
// the grid fills the GPU more than once (4096x7168 M=1: 12.7 against 16.7 us;
// 7168x16384: 40.9 against 53.2), 4 where it does not (2112x7168, 132
// blocks: 8.9 against 10.4 us); with two tiles 4 win wherever a warp owns
// 3 or more column blocks (7168x16384 M=16: 74 against 88 us; M=128: 416
// against 523) and 2 where it owns 2 (32768x512 M=128: 94 against 102).
constexpr int64_t kShallowGridBlocks = 160;

template <typename O, int MT, int SPLIT, int TILES>
cudaError_t launch_stream_depth(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales,
                                O* out, int64_t rows, int64_t n_out, int64_t cols, int variant, cudaStream_t stream) {
  if (variant == 0) {
    const int64_t col_blocks = (cols + kFp8Group - 1) / kFp8Group;
    const int64_t per_warp = (col_blocks + SPLIT - 1) / SPLIT;
    const int64_t blocks =
        (n_out + TILES * kTileRows - 1) / (TILES * kTileRows) * ((rows + 8 * MT - 1) / (8 * MT));
    variant = (MT == 1 ? blocks <= kShallowGridBlocks : per_warp >= 3) ? 2 : 1;
  }
  if (variant == 2)
    return launch_stream<O, MT, SPLIT, TILES, 4, true>(q, act_scales, w, w_scales, out, rows, n_out, cols, stream);
  return launch_stream<O, MT, SPLIT, TILES, 2, true>(q, act_scales, w, w_scales, out, rows, n_out, cols, stream);
}

template <typename O, int MT>
cudaError_t launch_stream_mt(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales,
                             O* out, int64_t rows, int64_t n_out, int64_t cols, bool vec, int variant,
                             cudaStream_t stream) {
  if (!vec) return launch_stream<O, MT, 4, 2, 1, false>(q, act_scales, w, w_scales, out, rows, n_out, cols, stream);
  const int64_t col_blocks = (cols + kFp8Group - 1) / kFp8Group;
  if (col_blocks >= 16)
    return launch_stream_depth<O, MT, 8, 1>(q, act_scales, w, w_scales, out, rows, n_out, cols, variant, stream);
  if (col_blocks >= 8)
    return launch_stream_depth<O, MT, 4, 2>(q, act_scales, w, w_scales, out, rows, n_out, cols, variant, stream);
  return launch_stream_depth<O, MT, 2, 4>(q, act_scales, w, w_scales, out, rows, n_out, cols, variant, stream);
}

template <typename O>
cudaError_t launch_stream_out(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales,
                              void* out, int64_t rows, int64_t n_out, int64_t cols, bool vec, int variant,
                              cudaStream_t stream) {
  O* o = static_cast<O*>(out);
  // One MMA column tile of 8 tokens up to 8 rows; 16 per slab above.
  if (rows <= 8) return launch_stream_mt<O, 1>(q, act_scales, w, w_scales, o, rows, n_out, cols, vec, variant, stream);
  return launch_stream_mt<O, 2>(q, act_scales, w, w_scales, o, rows, n_out, cols, vec, variant, stream);
}

}  // namespace

cudaError_t quantize_fp8_groups(const void* x, bool x_bf16, uint8_t* q, float* scales, int64_t rows, int64_t cols,
                                cudaStream_t stream, bool groups_outer) {
  const int64_t groups = (cols + kFp8Group - 1) / kFp8Group;
  const int64_t items = rows * groups;
  int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;  // the kernel strides over the rest
  const dim3 grid(static_cast<unsigned>(blocks));
  const int64_t row_stride = groups_outer ? 1 : groups, group_stride = groups_outer ? rows : 1;
  if (x_bf16)
    return launch_dependent(quantize_fp8_groups_kernel<bf16>, grid, kThreads, stream, static_cast<const bf16*>(x), q,
                            scales, rows, cols, groups, row_stride, group_stride);
  return launch_dependent(quantize_fp8_groups_kernel<float>, grid, kThreads, stream, static_cast<const float*>(x), q,
                          scales, rows, cols, groups, row_stride, group_stride);
}

cudaError_t linear_fp8_stream(const uint8_t* q, const float* act_scales, const uint8_t* w, const float* w_scales,
                              void* out, bool out_bf16, int64_t rows, int64_t n_out, int64_t cols, cudaStream_t stream,
                              int variant) {
  if (rows < 1 || n_out < 1 || cols < 1 || variant < 0 || variant > kFp8StreamVariants) return cudaErrorInvalidValue;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = cols % 16 == 0 && aligned(q) && aligned(w);
  if (out_bf16)
    return launch_stream_out<bf16>(q, act_scales, w, w_scales, out, rows, n_out, cols, vec, variant, stream);
  return launch_stream_out<float>(q, act_scales, w, w_scales, out, rows, n_out, cols, vec, variant, stream);
}


}  // namespace basalt::cuda_kernels
