#include "backend/cuda/gemv_kernels.h"

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/mma.cuh"

#include <type_traits>

namespace basalt::cuda_kernels {
namespace {

// out[m, n] = sum_k x[m, k] * w[n, k] on the tensor cores with M <= 16.
//
// The product is computed transposed, outᵀ = w · xᵀ, so the many weight rows
// are the MMA's 16-row A operand and the few tokens its 8-column B operand
// (mma.sync m16n8k16, f32 accumulation). A block of kWarps warps owns 16
// weight rows; its warps split K, each summing whole 32-wide chunks, and the
// partial sums meet in shared memory in a fixed order.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16/.f16 operands; g = lane
// / 4, t = lane % 4): A registers a0 = (row g, k 2t..2t+1), a1 = (row g+8,
// k 2t..2t+1), a2 = (row g, k 2t+8..2t+9), a3 = (row g+8, k 2t+8..2t+9);
// B registers b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g); C
// c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
//
// A dot product does not care in which order it visits k, so each lane
// loads 16 contiguous bytes per row and chunk -- k0 + 8t .. k0 + 8t + 7 of
// weight rows g and g+8 and of token g -- and the two MMAs of a 32-wide chunk
// take them as their "logical" k: MMA s uses bytes 8s..8s+7 of each load,
// its first word as the k 2t..2t+1 register and its second as 2t+8..2t+9,
// for the weights and the tokens alike. Every physical k meets the same
// token element it multiplies in a plain dot product.
constexpr int kRows = 16;  // weight rows (output features) per block

__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename W>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void mma<bf16>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi, bf16) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Eight consecutive elements of token row `row` at column k as four packed
// pairs of W's type; zeros for rows past m.
template <typename X, typename W>
__device__ __forceinline__ uint4 load_x(const X* x, int row, int m, int64_t k_total, int64_t k) {
  if (row >= m) return make_uint4(0, 0, 0, 0);
  const X* p = x + static_cast<int64_t>(row) * k_total + k;
  if constexpr (sizeof(X) == 2) {
    return *reinterpret_cast<const uint4*>(p);  // X == W (checked by the launcher)
  } else {
    const float4 lo = *reinterpret_cast<const float4*>(p), hi = *reinterpret_cast<const float4*>(p + 4);
    return make_uint4(pack2(lo.x, lo.y, W{}), pack2(lo.z, lo.w, W{}), pack2(hi.x, hi.y, W{}), pack2(hi.z, hi.w, W{}));
  }
}

// MT token tiles of 8 (M <= 8 * MT); kWarps warps split K; each warp keeps
// the loads of the next kUnroll chunks in flight while it multiplies the
// current ones (register double buffering).
template <typename X, typename W, typename O, int MT, int kWarps, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) gemv_mma_kernel(const X* x, const W* __restrict__ w,
                                                               const float* __restrict__ bias, O* __restrict__ out,
                                                               int m, int64_t n, int64_t k) {
  __shared__ float partial[kWarps][MT][kRows][8];
  let_consumer_start();
  // Token block blockIdx.y: rows 8 * MT * blockIdx.y on (one block when m
  // <= 8 * MT; the row-invariant form tiles any m this way).
  const int64_t first_token = int64_t{8 * MT} * blockIdx.y;
  x += first_token * k;
  out += first_token * n;
  m = static_cast<int>(min(int64_t{m} - first_token, int64_t{8 * MT}));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const bool row_lo = n0 + g < n, row_hi = n0 + g + 8 < n;
  const W* w_lo = w + (n0 + g) * k + 8 * t;
  const W* w_hi = w + (n0 + g + 8) * k + 8 * t;

  const int64_t chunks = k / 32;
  const int64_t per_warp = (chunks + kWarps - 1) / kWarps;
  const int64_t c_begin = warp * per_warp;
  const int64_t c_end = c_begin + per_warp < chunks ? c_begin + per_warp : chunks;

  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  const auto step = [&](const uint4& lo, const uint4& hi, const uint4 (&xs)[MT]) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      mma<W>(acc[i], lo.x, hi.x, lo.y, hi.y, xs[i].x, xs[i].y);
      mma<W>(acc[i], lo.z, hi.z, lo.w, hi.w, xs[i].z, xs[i].w);
    }
  };
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t full_end = c_begin + (c_end > c_begin ? (c_end - c_begin) / kUnroll * kUnroll : 0);
  uint4 lo[kUnroll], hi[kUnroll];
  const auto load_batch = [&](int64_t c0, uint4 (&l)[kUnroll], uint4 (&h)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t off = (c0 + u) * 32;
      l[u] = row_lo ? load_streaming(w_lo + off) : zero;
      h[u] = row_hi ? load_streaming(w_hi + off) : zero;
    }
  };
  if (c_begin < full_end) load_batch(c_begin, lo, hi);
  wait_for_producer();  // x (and out) belong to the kernels before this one
  int64_t c = c_begin;
  for (; c < full_end; c += kUnroll) {
    uint4 next_lo[kUnroll], next_hi[kUnroll];
    if (c + kUnroll < full_end) load_batch(c + kUnroll, next_lo, next_hi);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint4 xs[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) xs[i] = load_x<X, W>(x, 8 * i + g, m, k, (c + u) * 32 + 8 * t);
      step(lo[u], hi[u], xs);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      lo[u] = next_lo[u];
      hi[u] = next_hi[u];
    }
  }
  for (; c < c_end; ++c) {
    const int64_t off = c * 32;
    const uint4 l = row_lo ? load_streaming(w_lo + off) : zero;
    const uint4 h = row_hi ? load_streaming(w_hi + off) : zero;
    uint4 xs[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) xs[i] = load_x<X, W>(x, 8 * i + g, m, k, off + 8 * t);
    step(l, h, xs);
  }

#pragma unroll
  for (int i = 0; i < MT; ++i) {
    partial[warp][i][g][2 * t] = acc[i][0];
    partial[warp][i][g][2 * t + 1] = acc[i][1];
    partial[warp][i][g + 8][2 * t] = acc[i][2];
    partial[warp][i][g + 8][2 * t + 1] = acc[i][3];
  }
  __syncthreads();
  // Thread -> (token, row): rows fastest so a token's 16 outputs are one
  // contiguous store.
  for (int e = threadIdx.x; e < MT * 8 * kRows; e += kWarps * 32) {
    const int row = e % kRows, token = e / kRows;
    if (token >= m || n0 + row >= n) continue;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][token / 8][row][token % 8];
    if (bias != nullptr) sum += bias[n0 + row];
    out[static_cast<int64_t>(token) * n + n0 + row] = from_f32<O>(sum);
  }
}

// One warp per weight row (M <= kRowKernelMaxRows): lanes read the row in
// 16-byte chunks, 512 contiguous bytes per warp load; each lane keeps M
// partial sums, reduced by shuffles at the end. A warp may own R rows: it
// then reads each chunk of x once for all R (x comes from L1, and at 3-8
// tokens its reads, not the weights', are what a one-row warp waits on),
// while every row's sums see the same fmaf sequence as with R = 1 -- lane l
// takes chunks l, l + 32, ... in order, eight fmaf each in element order,
// then the same shuffle tree -- so a row's bits depend neither on R nor on
// the other tokens. kDepth * R chunks are in flight per lane.
constexpr int kRowWarps = 8;

template <int R>
constexpr int row_kernel_depth() {
  return R == 1 ? 8 : R == 2 ? 4 : 2;
}

// Eight consecutive elements of a 16-bit row as floats.
template <typename T>
__device__ __forceinline__ void widen8(const uint4& raw, float (&f)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    } else {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

template <typename X, typename W, typename O, int M, int R>
__global__ void __launch_bounds__(kRowWarps * 32) gemv_row_kernel(const X* x, const W* __restrict__ w,
                                                                  const float* __restrict__ bias,
                                                                  O* __restrict__ out, int64_t n, int64_t k) {
  constexpr int kDepth = row_kernel_depth<R>();
  let_consumer_start();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * kRowWarps + warp) * R;
  if (first_row >= n) return;
  // Rows past n (the last warp's) read row n - 1 again and store nothing.
  const W* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + min(first_row + r, n - 1) * k;
  const int64_t chunks = k / 8;  // 8 elements = 16 bytes each
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < M; ++j) acc[r][j] = 0.0f;
  const auto consume = [&](const uint4 (&raw)[R], int64_t chunk) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) widen8<W>(raw[r], wf[r]);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      float xf[8];
      const X* xp = x + j * k + chunk * 8;
      if constexpr (sizeof(X) == 4) {
        const float4 a = *reinterpret_cast<const float4*>(xp), b = *reinterpret_cast<const float4*>(xp + 4);
        xf[0] = a.x, xf[1] = a.y, xf[2] = a.z, xf[3] = a.w, xf[4] = b.x, xf[5] = b.y, xf[6] = b.z, xf[7] = b.w;
      } else {
        widen8<X>(*reinterpret_cast<const uint4*>(xp), xf);
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[r][e], xf[e], acc[r][j]);
    }
  };
  int64_t c = lane;
  bool waited = false;
  for (; c + 32 * (kDepth - 1) < chunks; c += 32 * kDepth) {
    uint4 raw[kDepth][R];
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int r = 0; r < R; ++r) raw[d][r] = load_streaming(wr[r] + (c + 32 * d) * 8);
    if (!waited) {
      wait_for_producer();  // the first weights are on their way; x is the previous kernels'
      waited = true;
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) consume(raw[d], c + 32 * d);
  }
  if (!waited) wait_for_producer();
  for (; c < chunks; c += 32) {
    uint4 raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = load_streaming(wr[r] + c * 8);
    consume(raw, c);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < M; ++j) {
      float v = acc[r][j];
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      // Every lane holds the sum now; the R * M stores spread over lanes.
      const int64_t row = first_row + r;
      if (lane == (r * M + j) % 32 && row < n) out[j * n + row] = from_f32<O>(v + (bias != nullptr ? bias[row] : 0.0f));
    }
}

// Rows per warp for m tokens and n weight rows in the default choice
// (measured on an H100 with f32 x, bench/README "Exact verification rows"):
// one row a warp at 1 token; 2 at 2 tokens; from 3, 4 rows a warp where there
// are enough rows (n >= 6144) to keep every SM busy with blocks of 32 rows,
// else 2.
constexpr int row_kernel_rows_per_warp(int64_t m, int64_t n) { return m <= 1 ? 1 : m == 2 || n < 6144 ? 2 : 4; }

template <typename X, typename W, typename O, int R>
cudaError_t launch_rows(const X* x, const W* w, const float* bias, O* out, int64_t m, int64_t n, int64_t k,
                        cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + kRowWarps * R - 1) / (kRowWarps * R));
  const unsigned threads = kRowWarps * 32;
  switch (m) {
    case 1: return launch_dependent(gemv_row_kernel<X, W, O, 1, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 2: return launch_dependent(gemv_row_kernel<X, W, O, 2, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 3: return launch_dependent(gemv_row_kernel<X, W, O, 3, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 4: return launch_dependent(gemv_row_kernel<X, W, O, 4, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 5: return launch_dependent(gemv_row_kernel<X, W, O, 5, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 6: return launch_dependent(gemv_row_kernel<X, W, O, 6, R>, blocks, threads, stream, x, w, bias, out, n, k);
    case 7: return launch_dependent(gemv_row_kernel<X, W, O, 7, R>, blocks, threads, stream, x, w, bias, out, n, k);
    default: return launch_dependent(gemv_row_kernel<X, W, O, 8, R>, blocks, threads, stream, x, w, bias, out, n, k);
  }
}

template <typename X, typename W, typename O>
cudaError_t launch(const void* x, const void* w, const float* bias, void* out, int64_t m, int64_t n, int64_t k,
                   int variant, cudaStream_t stream) {
  const auto* xp = static_cast<const X*>(x);
  const auto* wp = static_cast<const W*>(w);
  auto* op = static_cast<O*>(out);
  const int mi = static_cast<int>(m);
  // Measured (bench/README, "Exact verification rows"): one warp per weight
  // row is fastest at 1 row, two rows a warp at 2; at 3-5 rows the
  // tensor-core kernel (8 warps, 4 chunks in flight) is up to 11 % faster
  // per GEMV on the Llama-8B shapes (3-6 % over a layer's four), but it
  // rounds f32 x to the weights' type and groups its sums otherwise, so its
  // rows are not what one-row calls give; the default keeps the warp-per-row
  // kernel up to kGemvDefaultRowExactRows rows for that (a verification of
  // up to 4 drafts then computes its decode steps' bits), and takes the
  // tensor cores above, where the warp-per-row kernel falls 20-60 % behind.
  if (variant == kGemvDefault) variant = m <= kGemvDefaultRowExactRows ? kGemvRowKernel : 1;
  const int rows_per_warp = variant == kGemvRowKernel    ? row_kernel_rows_per_warp(m, n)
                            : variant == kGemvRowKernel1 ? 1
                            : variant == kGemvRowKernel2 ? 2
                            : variant == kGemvRowKernel4 ? 4
                                                         : 0;
  if (rows_per_warp > 0 && m <= kRowKernelMaxRows) {
    if (rows_per_warp == 1) return launch_rows<X, W, O, 1>(xp, wp, bias, op, m, n, k, stream);
    if (rows_per_warp == 2) return launch_rows<X, W, O, 2>(xp, wp, bias, op, m, n, k, stream);
    return launch_rows<X, W, O, 4>(xp, wp, bias, op, m, n, k, stream);
  }
  const unsigned blocks = static_cast<unsigned>((n + kRows - 1) / kRows);
#define BASALT_GEMV_MMA(MT, WARPS, UNROLL) \
  launch_dependent(gemv_mma_kernel<X, W, O, MT, WARPS, UNROLL>, blocks, WARPS * 32, stream, xp, wp, bias, op, mi, n, k)
  const bool one_tile = m <= 8;
  cudaError_t status;
  switch (variant) {
    case 2:  // 4 warps, 8 chunks deep
      status = one_tile ? BASALT_GEMV_MMA(1, 4, 8) : BASALT_GEMV_MMA(2, 4, 8);
      break;
    case 3:  // 8 warps, 2 chunks deep
      status = one_tile ? BASALT_GEMV_MMA(1, 8, 2) : BASALT_GEMV_MMA(2, 8, 2);
      break;
    default:  // 1: 8 warps, 4 chunks deep
      status = one_tile ? BASALT_GEMV_MMA(1, 8, 4) : BASALT_GEMV_MMA(2, 8, 4);
      break;
  }
#undef BASALT_GEMV_MMA
  return status;
}

// The row-invariant form at prefill and large-batch sizes: configuration
// 1's arithmetic for every output element -- K's 32-wide chunks cut into the
// same 8 ranges of ceil(chunks / 8), each range summed from zero by the same
// two MMAs per chunk on the same register contents (lane (g, t) holds bytes
// 16t.. of rows g and g + 8 of the chunk, as gemv_mma_kernel loads them),
// the ranges' sums added in order, then the bias -- but on tiles of 64
// weight rows x 64 tokens staged through shared memory (three stages of 4
// chunks in flight, cp.async), so the weights are read once per 64 tokens
// instead of once per 32 from L2 by every warp. Four warps, each 32 weight
// rows x 32 tokens.
constexpr int kTileRows = 64, kTileTokens = 64, kStageChunks = 4, kTileThreads = 128, kTileStages = 3;
constexpr int kTileStride = kStageChunks * 32;  // elements per shared row (256 bytes)
constexpr size_t kTileSmem = size_t{kTileStages} * (kTileRows + kTileTokens) * kTileStride * 2;  // 2-byte elements
// Where 16-byte piece p of shared row r lives: odd rows swap the halves of
// each 128 bytes, so the 8 lanes of a quarter warp (rows g, g + 1 at pieces
// t) read 8 different bank groups.
__device__ __forceinline__ int tile_offset(int row, int piece) {
  return row * kTileStride + ((piece ^ ((row & 1) << 2)) << 3);
}

template <typename X, typename W, typename O>
__global__ void __launch_bounds__(kTileThreads) gemm_invariant_kernel(const X* x, const W* __restrict__ w,
                                                                      const float* __restrict__ bias,
                                                                      O* __restrict__ out, int64_t m, int64_t n,
                                                                      int64_t k) {
  extern __shared__ __align__(16) unsigned char tile_smem[];
  W* const sw = reinterpret_cast<W*>(tile_smem);              // [kTileStages][kTileRows][kTileStride]
  W* const sx = sw + kTileStages * kTileRows * kTileStride;   // [kTileStages][kTileTokens][kTileStride]
  let_consumer_start();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t t0 = int64_t{blockIdx.x} * kTileTokens, n0 = int64_t{blockIdx.y} * kTileRows;
  const int wr = (warp / 2) * 32, wt = (warp % 2) * 32;
  const int64_t chunks = k / 32, per_range = (chunks + 7) / 8;
  const int64_t stages = (chunks + kStageChunks - 1) / kStageChunks;
  constexpr int kPieces = kStageChunks * 4;  // 16-byte pieces per row and stage
  const auto load_stage = [&](int64_t stage, int buf) {
    const int64_t c0 = stage * kStageChunks;
    const int64_t valid = min(int64_t{kStageChunks}, chunks - c0);
    for (int p = tid; p < kTileRows * kPieces; p += kTileThreads) {
      const int row = p / kPieces, piece = p % kPieces;
      const bool ok = n0 + row < n && piece / 4 < valid;
      cp_async_16_or_zero(smem_addr(sw + buf * kTileRows * kTileStride + tile_offset(row, piece)),
                          ok ? w + (n0 + row) * k + c0 * 32 + piece * 8 : w, ok);
    }
    for (int p = tid; p < kTileTokens * kPieces; p += kTileThreads) {
      const int row = p / kPieces, piece = p % kPieces;
      const bool ok = t0 + row < m && piece / 4 < valid;
      W* const dst = sx + buf * kTileTokens * kTileStride + tile_offset(row, piece);
      if constexpr (sizeof(X) == 2) {
        cp_async_16_or_zero(smem_addr(dst), ok ? x + (t0 + row) * k + c0 * 32 + piece * 8 : x, ok);
      } else {
        *reinterpret_cast<uint4*>(dst) =
            ok ? load_x<X, W>(x, static_cast<int>(t0 + row), static_cast<int>(m), k, c0 * 32 + piece * 8)
               : make_uint4(0, 0, 0, 0);
      }
    }
  };

  // acc: the current range's sums; total: the finished ranges'. Per warp
  // 2 x 4 MMA tiles (weight rows 16i.., tokens 8j..) of 4 elements each.
  float acc[2][4][4], total[2][4][4];
  const auto each = [](auto&& f) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(i, j, e);
  };
  each([&](int i, int j, int e) { acc[i][j][e] = total[i][j][e] = 0.0f; });
  wait_for_producer();  // x (and out) belong to the kernels before this one
  for (int s = 0; s < kTileStages - 1; ++s) {
    if (s < stages) load_stage(s, s);
    cp_async_commit();
  }
  int64_t range_end = min(per_range, chunks);
  int ranges = 0;
  for (int64_t stage = 0; stage < stages; ++stage) {
    const int buf = static_cast<int>(stage % kTileStages);
    cp_async_wait<kTileStages - 2>();
    // This stage's pieces (everyone's copies and stores) are in, and every
    // warp is done with the buffer the next load overwrites (stage - 1's).
    __syncthreads();
    if (stage + kTileStages - 1 < stages)
      load_stage(stage + kTileStages - 1, static_cast<int>((stage + kTileStages - 1) % kTileStages));
    cp_async_commit();
    const W* const tw = sw + buf * kTileRows * kTileStride;
    const W* const tx = sx + buf * kTileTokens * kTileStride;
    for (int cc = 0; cc < kStageChunks; ++cc) {
      const int64_t c = stage * kStageChunks + cc;
      if (c >= chunks) break;
      uint4 lo[2], hi[2], xs[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = *reinterpret_cast<const uint4*>(tw + tile_offset(wr + 16 * i + g, cc * 4 + t));
        hi[i] = *reinterpret_cast<const uint4*>(tw + tile_offset(wr + 16 * i + g + 8, cc * 4 + t));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
        xs[j] = *reinterpret_cast<const uint4*>(tx + tile_offset(wt + 8 * j + g, cc * 4 + t));
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          mma<W>(acc[i][j], lo[i].x, hi[i].x, lo[i].y, hi[i].y, xs[j].x, xs[j].y);
          mma<W>(acc[i][j], lo[i].z, hi[i].z, lo[i].w, hi[i].w, xs[j].z, xs[j].w);
        }
      if (c + 1 == range_end) {  // a range's sum joins the total, as a warp's partial does
        each([&](int i, int j, int e) {
          total[i][j][e] += acc[i][j][e];
          acc[i][j][e] = 0.0f;
        });
        ++ranges;
        range_end = min(range_end + per_range, chunks);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain
  // The empty ranges past K's end add their zeros, as their warps do.
  for (; ranges < 8; ++ranges) each([&](int i, int j, int e) { total[i][j][e] += 0.0f; });
  each([&](int i, int j, int e) {
    const int64_t row = n0 + wr + 16 * i + g + 8 * (e / 2);
    const int64_t token = t0 + wt + 8 * j + 2 * t + (e & 1);
    if (row >= n || token >= m) return;
    float v = total[i][j][e];
    if (bias != nullptr) v += bias[row];
    out[token * n + row] = from_f32<O>(v);
  });
}

// Rows up to here take configuration 1 itself in token blocks of 32 (grid
// y), more the tiled kernel (measured on the 8B shape, bench/README).
constexpr int64_t kInvariantGemvMaxRows = 96;

// The row-invariant form: configuration 1's arithmetic (8 warps splitting K
// the same way, the same MMAs, the partial sums in warp order) for any m.
// Each output element depends only on its token's row of x, so a row gives
// the same bits in a call of any size, through either kernel.
template <typename X, typename W, typename O>
cudaError_t launch_invariant(const void* x, const void* w, const float* bias, void* out, int64_t m, int64_t n,
                             int64_t k, cudaStream_t stream) {
  const auto* xp = static_cast<const X*>(x);
  const auto* wp = static_cast<const W*>(w);
  auto* op = static_cast<O*>(out);
  if (m > kInvariantGemvMaxRows) {
    const int64_t row_tiles = (n + kTileRows - 1) / kTileRows;
    if (row_tiles > 65535 || m >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
    static const cudaError_t configured = cudaFuncSetAttribute(
        gemm_invariant_kernel<X, W, O>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTileSmem));
    if (configured != cudaSuccess) return configured;
    const dim3 grid(static_cast<unsigned>((m + kTileTokens - 1) / kTileTokens), static_cast<unsigned>(row_tiles));
    return launch_dependent_smem(gemm_invariant_kernel<X, W, O>, grid, kTileThreads, kTileSmem, stream, xp, wp, bias,
                                 op, m, n, k);
  }
  constexpr int kBlockTokens = 32;  // MT = 4
  const int64_t token_blocks = (m + kBlockTokens - 1) / kBlockTokens;
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows), static_cast<unsigned>(token_blocks));
  return launch_dependent(gemv_mma_kernel<X, W, O, kBlockTokens / 8, 8, 4>, grid, 8 * 32, stream, xp, wp, bias, op,
                          static_cast<int>(m), n, k);
}

template <typename W>
cudaError_t launch_w(Elem x_type, Elem out_type, const void* x, const void* w, const float* bias, void* out, int64_t m,
                     int64_t n, int64_t k, int variant, cudaStream_t stream) {
  const bool out_f32 = out_type == Elem::kF32;
  if (variant == kGemvRowInvariant) {
    if (x_type == Elem::kF32)
      return out_f32 ? launch_invariant<float, W, float>(x, w, bias, out, m, n, k, stream)
                     : launch_invariant<float, W, W>(x, w, bias, out, m, n, k, stream);
    return out_f32 ? launch_invariant<W, W, float>(x, w, bias, out, m, n, k, stream)
                   : launch_invariant<W, W, W>(x, w, bias, out, m, n, k, stream);
  }
  if (x_type == Elem::kF32)
    return out_f32 ? launch<float, W, float>(x, w, bias, out, m, n, k, variant, stream)
                   : launch<float, W, W>(x, w, bias, out, m, n, k, variant, stream);
  return out_f32 ? launch<W, W, float>(x, w, bias, out, m, n, k, variant, stream)
                 : launch<W, W, W>(x, w, bias, out, m, n, k, variant, stream);
}

}  // namespace

cudaError_t gemv(Elem x_type, Elem w_type, Elem out_type, const void* x, const void* w, const float* bias, void* out,
                 int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant) {
  if (m < 1 || (m > kGemvMaxRows && variant != kGemvRowInvariant) || k % 32 != 0) return cudaErrorInvalidValue;
  if (out_type != Elem::kF32 && out_type != w_type) return cudaErrorInvalidValue;
  if (x_type != Elem::kF32 && x_type != w_type) return cudaErrorInvalidValue;
  if (variant < kGemvDefault || variant > kGemvRowKernel4) return cudaErrorInvalidValue;
  if (w_type == Elem::kBF16) return launch_w<bf16>(x_type, out_type, x, w, bias, out, m, n, k, variant, stream);
  if (w_type == Elem::kF16) return launch_w<__half>(x_type, out_type, x, w, bias, out, m, n, k, variant, stream);
  return cudaErrorInvalidValue;
}

}  // namespace basalt::cuda_kernels
