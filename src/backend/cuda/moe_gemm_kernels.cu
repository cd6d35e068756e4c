// MoE expert kernels (see moe_gemm_kernels.h; moe.h for what the op computes).
//
// Layout: the T * top_k (token, slot) pairs are sorted by expert into rows
// 0 .. R-1 (compact: no padding rows), and each expert's rows are cut into
// tiles of tile_m rows, so a GEMM block never mixes experts. A GEMM grid is
// (N / BN column blocks) x (a worst-case count of tiles); blocks whose tile
// index is past the count the permutation wrote leave at once, so nothing
// is read back to the host and the whole op can be recorded in a CUDA graph.
//
// The grouped GEMM (moe_gemm_kernel): 8 warps; per stage a block loads
// 128 bytes of K of its tile_m activation rows (gathered through row_pair)
// and of 128 weight rows (gated: 64 gate rows and the same 64 up rows), with
// cp.async into a STAGES-deep ring of shared memory, rows of 128 bytes with
// the 16-byte chunks XOR-swizzled by row (conflict-free ldmatrix). Operands
// come out of shared memory with ldmatrix, whose 8x8 b16 matrices are the
// fragments of both mma.m16n8k16 (bf16) and mma.m16n8k32 (e4m3): a thread's
// 32-bit word holds 2 bf16 or 4 e4m3 of one row, as both shapes want. With
// FP8, one stage is exactly one 128-K scale block: its mma results collect
// in a temporary accumulator that is then scaled by act_scale[row] *
// weight_scale[n block] and added to the f32 accumulator (DeepGEMM's
// promotion), so the tensor cores' limited internal accumulation precision
// spans at most 128 products.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe_gemm_kernels.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace basalt::cuda_kernels {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------------------
// The expert table.

__global__ void moe_fill_table_kernel(MoeExpertPtrs* table, MoeTableChunk chunk) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < chunk.count) table[chunk.first + i] = chunk.e[i];
}

// ---------------------------------------------------------------------------
// The permutation: one block of 1024 threads.

constexpr int kPermuteThreads = 1024;

// Exclusive prefix sum over the block of one value per thread; `total` gets
// the sum. Every thread of the block must call it.
__device__ long long block_exclusive_scan(long long v, long long* total) {
  __shared__ long long warp_sums[kPermuteThreads / 32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const long long other = __shfl_up_sync(kFull, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long s = warp_sums[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const long long other = __shfl_up_sync(kFull, s, offset);
      if (lane >= offset) s += other;
    }
    warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const long long before = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - v;
  *total = warp_sums[kPermuteThreads / 32 - 1];
  __syncthreads();  // warp_sums may be reused by a later call
  return before;
}

__global__ void __launch_bounds__(kPermuteThreads) moe_permute_kernel(MoePermuteArgs a) {
  extern __shared__ int32_t shared[];
  int32_t* count = shared;              // [experts]
  int32_t* cursor = shared + a.experts;  // [experts]: next free row of each expert
  const int tid = static_cast<int>(threadIdx.x);
  const int E = a.experts;
  for (int e = tid; e < E; e += kPermuteThreads) count[e] = 0;
  __syncthreads();
  for (int p = tid; p < a.pairs; p += kPermuteThreads) {
    const int e = a.ids[p] - a.first_expert;
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // Thread tid owns experts [e0, e1): rows and tiles of its experts, packed
  // in one 64-bit value for one scan (each part stays below 2^31).
  const int per = (E + kPermuteThreads - 1) / kPermuteThreads;
  const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
  long long rows = 0, tiles = 0;
  for (int e = e0; e < e1; ++e) {
    rows += count[e];
    tiles += (count[e] + a.tile_m - 1) / a.tile_m;
  }
  long long total;
  const long long before = block_exclusive_scan((rows << 32) | tiles, &total);
  int row = static_cast<int>(before >> 32), tile = static_cast<int>(before & 0xffffffffll);
  const int total_rows = static_cast<int>(total >> 32);
  for (int e = e0; e < e1; ++e) {
    const int c = count[e];
    cursor[e] = row;
    for (int begin = 0; begin < c; begin += a.tile_m)
      a.tiles[tile++] = make_int4(e, row + begin, row + min(c, begin + a.tile_m), 0);
    row += c;
  }
  if (tid == 0) *a.num_tiles = static_cast<int32_t>(total & 0xffffffffll);
  __syncthreads();
  for (int p = tid; p < a.pairs; p += kPermuteThreads) {
    const int e = a.ids[p] - a.first_expert;
    if (e >= 0 && e < E) {
      const int r = atomicAdd(&cursor[e], 1);
      a.row_pair[r] = p;
      a.pair_row[p] = r;
    } else {
      a.pair_row[p] = -1;
    }
  }
  for (int r = total_rows + tid; r < a.pairs; r += kPermuteThreads) a.row_pair[r] = -1;
}

// ---------------------------------------------------------------------------
// The grouped GEMM.

constexpr int kGemmThreads = 256;
constexpr int kBK = 128;  // bytes of K per stage (one FP8 scale block)


// e4m3 bytes reread as f16 by moving bits: f16 bits = sign << 15 | (e4m3 &
// 0x7f) << 7, which is the e4m3 value times 2^-8 exactly (subnormals
// included; f16's exponent bias is 15, e4m3's 7). From the word q = bytes
// [b3 b2 b1 b0]: odd() gives f16x2 {b1, b3} (low, high), even() {b0, b2}.
__device__ __forceinline__ uint32_t e4m3_odd_as_f16(uint32_t q) {
  return (q & 0x80008000u) | ((q & 0x7f007f00u) >> 1);
}
__device__ __forceinline__ uint32_t e4m3_even_as_f16(uint32_t q) { return e4m3_odd_as_f16(q << 8); }

// The two m16n8k16 f16 products that make one m16n8k32 e4m3 product. A
// thread's e4m3 fragments hold k 4t..4t+3 (half 0) and 16+4t.. (half 1) of
// its rows and columns; even() and odd() of the same word in A and in B
// pair the same k, so the sum runs over the 32 k in another order, which
// changes nothing (every product is exact, and the sum's order within an
// mma is the hardware's anyway).
__device__ __forceinline__ void mma_e4m3_as_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t lo = a[2 * h], hi = a[2 * h + 1], b = h == 0 ? b0 : b1;
    const uint32_t af[4] = {e4m3_even_as_f16(lo), e4m3_even_as_f16(hi), e4m3_odd_as_f16(lo), e4m3_odd_as_f16(hi)};
    mma_f16(d, af, e4m3_even_as_f16(b), e4m3_odd_as_f16(b));
  }
}

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows.
__device__ __forceinline__ uint32_t swizzle(int r, int c) {
  return static_cast<uint32_t>(r * kBK + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Stores v0, v1 at out[row, n] and out[row, n + 1] (n + 1 only when < N).
template <typename T>
__device__ __forceinline__ void store_pair(T* out, int64_t row, int n, int N, float v0, float v1) {
  T* p = out + row * N + n;
  if (n + 1 < N) {
    if constexpr (sizeof(T) == 4) {
      if ((N & 1) == 0) {
        *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
        return;
      }
    } else {
      if ((N & 1) == 0) {
        *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
        return;
      }
    }
    p[0] = from_f32<T>(v0);
    p[1] = from_f32<T>(v1);
  } else if (n < N) {
    p[0] = from_f32<T>(v0);
  }
}

template <int BM>
struct TileConfig;
// Decode: a few rows per expert. One m16 row block, the 8 warps side by side
// over the weight rows; deep pipeline (weights stream from HBM).
template <>
struct TileConfig<16> {
  static constexpr int WM = 1, STAGES = 6, MIN_BLOCKS = 2;
};
template <>
struct TileConfig<64> {
  static constexpr int WM = 2, STAGES = 4, MIN_BLOCKS = 2;
};
template <>
struct TileConfig<128> {
  static constexpr int WM = 2, STAGES = 4, MIN_BLOCKS = 1;
};

template <int BM>
constexpr int gemm_smem_bytes(bool fp8) {
  return TileConfig<BM>::STAGES * (BM * kBK + kMoeGemmN * kBK + (fp8 ? BM * 4 : 0)) + BM * 4;
}

// The loads of one stage of a tile into shared memory, for THREADS threads:
// 128 bytes of K of the tile's BM activation rows (gathered through
// row_pair; zeros past the tile's rows and past K), of kMoeGemmN weight rows
// (gated: rows 0-63 gate, 64-127 up, weight rows n0 .. n0 + 63 of each;
// zeros past N and K), and with FP8 the activation rows' scales of that K
// block. Rows are 128 bytes with swizzled chunks (swizzle()). The caller
// commits and waits for the cp.async groups.
template <int BM, int THREADS, bool FP8, bool GATED>
struct StageLoader {
  static constexpr int BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;
  static constexpr int A_BYTES = BM * kBK, B_BYTES = kMoeGemmN * kBK;
  static constexpr int A_CHUNKS = BM * kBK / 16, B_CHUNKS = B_BYTES / 16;
  static constexpr int A_ITERS = (A_CHUNKS + THREADS - 1) / THREADS;
  static constexpr int B_ITERS = B_CHUNKS / THREADS;
  static_assert(B_CHUNKS % THREADS == 0, "weight chunks per thread");
  static_assert(THREADS >= BM, "a thread per activation row for the scales");

  const MoeGemmArgs& a;
  const int32_t* smem_src;  // [BM] activation row of each tile row, -1 past the tile
  uint32_t base_a, base_b, base_scale;
  int tid, k_bytes, KT, n0;
  const uint8_t* w_main;
  const uint8_t* b_main;  // this thread's chunk column in weight row n0 (gate, or the only matrix)
  const uint8_t* b_up;
  int b_rows;  // weight rows left from n0

  __device__ StageLoader(const MoeGemmArgs& args, const int32_t* src, uint32_t sa, uint32_t sb, uint32_t ss, int t,
                         int kbytes, int kt_count, int n_begin, const MoeExpertPtrs& ex)
      : a(args), smem_src(src), base_a(sa), base_b(sb), base_scale(ss), tid(t), k_bytes(kbytes), KT(kt_count),
        n0(n_begin) {
    const int m0 = GATED ? 0 : 2;  // the first weight matrix
    w_main = static_cast<const uint8_t*>(ex.w[m0]);
    b_main = w_main + static_cast<int64_t>(n0) * k_bytes + (tid % 8) * 16;
    b_up = static_cast<const uint8_t*>(ex.w[1]) + static_cast<int64_t>(n0) * k_bytes + (tid % 8) * 16;
    b_rows = a.n - n0;
  }

  __device__ __forceinline__ void load(int stage, int kt) const {
    const int kb = kt * kBK;
    const bool chunk_ok = kb + (tid % 8) * 16 < k_bytes;
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      const int i = tid + it * THREADS;
      if (A_CHUNKS % THREADS != 0 && i >= A_CHUNKS) continue;
      const int r = i / 8, c = i % 8;
      const int32_t src = smem_src[r];
      const bool ok = src >= 0 && kb + c * 16 < k_bytes;
      cp_async_16_or_zero(base_a + stage * A_BYTES + swizzle(r, c),
                          ok ? a.a + static_cast<int64_t>(src) * k_bytes + kb + c * 16 : a.a, ok);
    }
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      // Row r = tid / 8 + (THREADS / 8) it of the stage: gated, rows 0-63
      // gate and 64-127 up (weight row n0 + r % 64); else weight row n0 + r.
      constexpr int kRowsPerIter = THREADS / 8;
      const int r = tid / 8 + kRowsPerIter * it;
      const int rel = GATED ? r % BN : r;
      const uint8_t* w = (GATED && r >= BN) ? b_up : b_main;
      const bool ok = rel < b_rows && chunk_ok;
      cp_async_16_or_zero(base_b + stage * B_BYTES + swizzle(r, tid % 8),
                          ok ? w + static_cast<int64_t>(rel) * k_bytes + kb : w_main, ok);
    }
    if (FP8 && tid < BM) {
      const int32_t src = smem_src[tid];
      const bool ok = src >= 0;
      cp_async_4_or_zero(base_scale + (stage * BM + tid) * 4,
                         ok ? a.a_scale + static_cast<int64_t>(src) * KT + kt : a.a_scale, ok);
    }
  }
};

template <int BM, int MODE, bool GATED>
__global__ void __launch_bounds__(kGemmThreads, TileConfig<BM>::MIN_BLOCKS) moe_gemm_kernel(MoeGemmArgs a) {
  constexpr bool FP8 = MODE != kMoeMmaBf16;
  constexpr int WM = TileConfig<BM>::WM, WN = 8 / WM, STAGES = TileConfig<BM>::STAGES;
  constexpr int BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;  // output columns per block
  constexpr int MS = BM / WM / 16;                       // m16 blocks per warp
  constexpr int NS = kMoeGemmN / WN / 8;                 // n8 blocks per warp (gated: gate half, up half)
  constexpr int HALF = NS / 2;
  constexpr int A_BYTES = BM * kBK, B_BYTES = kMoeGemmN * kBK;
  static_assert(MS >= 1 && NS >= 2 && NS % 2 == 0, "warp tile");
  // An FP8 weight block of 128 rows holds each block's columns (one scale).
  static_assert(128 % BN == 0, "column blocks inside one scale block");

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const smem_a = smem;
  uint8_t* const smem_b = smem + STAGES * A_BYTES;
  float* const smem_scale = reinterpret_cast<float*>(smem + STAGES * (A_BYTES + B_BYTES));
  int32_t* const smem_src = reinterpret_cast<int32_t*>(smem + STAGES * (A_BYTES + B_BYTES) + (FP8 ? STAGES * BM * 4 : 0));
  const uint32_t base_a = smem_addr(smem_a), base_b = smem_addr(smem_b), base_scale = smem_addr(smem_scale);

  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane / 4, t4 = lane % 4;
  const int N = a.n;
  const int k_bytes = FP8 ? a.k : a.k * 2;
  const int KT = (k_bytes + kBK - 1) / kBK;  // stages of K (FP8: scale blocks)
  const int n0 = static_cast<int>(blockIdx.x) * BN;
  const int num_tiles = *a.num_tiles;

  for (int tile = static_cast<int>(blockIdx.y); tile < num_tiles; tile += static_cast<int>(gridDim.y)) {
    const int4 info = a.tiles[tile];
    const int expert = info.x, row_begin = info.y, rows = info.z - info.y;
    const MoeExpertPtrs& ex = a.table[expert];
    const int m0 = GATED ? 0 : 2;  // the first weight matrix
    const float* const ws_main = ex.scale[m0] + (n0 / 128) * KT;
    const float* const ws_up = ex.scale[1] + (n0 / 128) * KT;

    // The activation row of each tile row (-1: past the tile), in shared
    // memory rather than registers (the FP8 accumulators need them).
    if (tid < BM) {
      int32_t src = -1;
      if (tid < rows) src = a.gather ? a.row_pair[row_begin + tid] / a.top_k : row_begin + tid;
      smem_src[tid] = src;
    }
    __syncthreads();
    const StageLoader<BM, kGemmThreads, FP8, GATED> loader(a, smem_src, base_a, base_b, base_scale, tid, k_bytes, KT,
                                                            n0, ex);
    auto load_stage = [&](int stage, int kt) { loader.load(stage, kt); };

    float acc[MS][NS][4];
    float part[FP8 ? MS : 1][FP8 ? NS : 1][4];
#pragma unroll
    for (int m = 0; m < MS; ++m)
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][s][i] = 0.0f;

    // Weight row (within the stage) of this warp's n8 block s.
    auto b_row = [&](int s) {
      if (GATED) return (s < HALF ? 0 : BN) + wn * 8 * HALF + 8 * (s < HALF ? s : s - HALF);
      return wn * 8 * NS + 8 * s;
    };

    // Offsets of this lane's ldmatrix rows in a stage, at k step 0.
    const uint32_t a_frag = swizzle(wm * (BM / WM) + (lane & 15), lane >> 4);
    uint32_t b_frag[NS / 2];
#pragma unroll
    for (int p = 0; p < NS / 2; ++p) b_frag[p] = swizzle(b_row(2 * p + (lane >> 4)) + (lane & 7), (lane >> 3) & 1);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
#pragma unroll 1
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      {
        const int next = kt + STAGES - 1;
        if (next < KT) load_stage(next % STAGES, next);
        cp_async_commit();
      }
      const int stage = kt % STAGES;
      float w_scale_main = 0.0f, w_scale_up = 0.0f;
      if constexpr (FP8) {
        w_scale_main = ws_main[kt];
        if (GATED) w_scale_up = ws_up[kt];
#pragma unroll
        for (int m = 0; m < MS; ++m)
#pragma unroll
          for (int s = 0; s < NS; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[m][s][i] = 0.0f;
      }
      const uint32_t sa = base_a + stage * A_BYTES, sb = base_b + stage * B_BYTES;
#pragma unroll
      for (int ks = 0; ks < kBK / 32; ++ks) {
        // swizzle(r, 2 ks + h) = swizzle(r, h) ^ (ks << 5) (2 ks and h
        // are different bits of the chunk index).
        uint32_t af[MS][4];
#pragma unroll
        for (int m = 0; m < MS; ++m) ldmatrix_x4(af[m], sa + m * 16 * kBK + (a_frag ^ (ks << 5)));
        uint32_t bf[NS][2];
#pragma unroll
        for (int p = 0; p < NS / 2; ++p) {
          uint32_t q[4];
          ldmatrix_x4(q, sb + (b_frag[p] ^ (ks << 5)));
          bf[2 * p][0] = q[0];
          bf[2 * p][1] = q[1];
          bf[2 * p + 1][0] = q[2];
          bf[2 * p + 1][1] = q[3];
        }
#pragma unroll
        for (int m = 0; m < MS; ++m)
#pragma unroll
          for (int s = 0; s < NS; ++s) {
            if constexpr (MODE == kMoeMmaE4m3)
              mma_e4m3(part[m][s], af[m], bf[s][0], bf[s][1]);
            else if constexpr (MODE == kMoeMmaE4m3AsF16)
              mma_e4m3_as_f16(part[m][s], af[m], bf[s][0], bf[s][1]);
            else
              mma_bf16(acc[m][s], af[m], bf[s][0], bf[s][1]);
          }
      }
      if constexpr (FP8) {
        const float* sc = smem_scale + stage * BM;
#pragma unroll
        for (int m = 0; m < MS; ++m) {
          const int r = wm * (BM / WM) + m * 16 + g;
          const float s_lo = sc[r], s_hi = sc[r + 8];
#pragma unroll
          for (int s = 0; s < NS; ++s) {
            // The f16 rereading scaled both operands by 2^-8.
            const float ws = ((GATED && s >= HALF) ? w_scale_up : w_scale_main) *
                             (MODE == kMoeMmaE4m3AsF16 ? 65536.0f : 1.0f);
            const float lo = s_lo * ws, hi = s_hi * ws;
            acc[m][s][0] += part[m][s][0] * lo;
            acc[m][s][1] += part[m][s][1] * lo;
            acc[m][s][2] += part[m][s][2] * hi;
            acc[m][s][3] += part[m][s][3] * hi;
          }
        }
      }
    }
    cp_async_wait<0>();

    // Epilogue: straight from the registers.
#pragma unroll
    for (int m = 0; m < MS; ++m) {
      const int r_lo = wm * (BM / WM) + m * 16 + g;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r_lo + 8 * half;
        if (r >= rows) continue;
        const int64_t row = row_begin + r;
        if constexpr (GATED) {
#pragma unroll
          for (int s = 0; s < HALF; ++s) {
            const int n = n0 + wn * 8 * HALF + 8 * s + 2 * t4;
            const float v0 = silu_mul(acc[m][s][2 * half], acc[m][s + HALF][2 * half]);
            const float v1 = silu_mul(acc[m][s][2 * half + 1], acc[m][s + HALF][2 * half + 1]);
            if (a.out_bf16)
              store_pair(static_cast<bf16*>(a.out), row, n, N, v0, v1);
            else
              store_pair(static_cast<float*>(a.out), row, n, N, v0, v1);
          }
        } else {
#pragma unroll
          for (int s = 0; s < NS; ++s) {
            const int n = n0 + wn * 8 * NS + 8 * s + 2 * t4;
            store_pair(static_cast<float*>(a.out), row, n, N, acc[m][s][2 * half], acc[m][s][2 * half + 1]);
          }
        }
      }
    }
    __syncthreads();  // the next tile's loads overwrite the stages
  }
}

template <int BM, int MODE, bool GATED>
cudaError_t launch_gemm(const MoeGemmArgs& args, int max_tiles, cudaStream_t stream) {
  constexpr int kSmem = gemm_smem_bytes<BM>(MODE != kMoeMmaBf16);
  static const cudaError_t configured = cudaFuncSetAttribute(
      moe_gemm_kernel<BM, MODE, GATED>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (configured != cudaSuccess) return configured;
  constexpr int BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;
  const dim3 grid(static_cast<unsigned>((args.n + BN - 1) / BN),
                  static_cast<unsigned>(max_tiles < 65535 ? max_tiles : 65535));
  moe_gemm_kernel<BM, MODE, GATED><<<grid, kGemmThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int BM, int MODE>
cudaError_t launch_gemm_mode(const MoeGemmArgs& args, bool gated, int max_tiles, cudaStream_t stream) {
  return gated ? launch_gemm<BM, MODE, true>(args, max_tiles, stream)
               : launch_gemm<BM, MODE, false>(args, max_tiles, stream);
}

template <int BM>
cudaError_t launch_gemm_m(const MoeGemmArgs& args, int mode, bool gated, int max_tiles, cudaStream_t stream) {
  switch (mode) {
    case kMoeMmaBf16: return launch_gemm_mode<BM, kMoeMmaBf16>(args, gated, max_tiles, stream);
    case kMoeMmaE4m3: return launch_gemm_mode<BM, kMoeMmaE4m3>(args, gated, max_tiles, stream);
    case kMoeMmaE4m3AsF16: return launch_gemm_mode<BM, kMoeMmaE4m3AsF16>(args, gated, max_tiles, stream);
    default: return cudaErrorInvalidValue;
  }
}

// ---------------------------------------------------------------------------
// The FP8 grouped GEMM on wgmma (sm_90a; wgmma.cuh).
//
// A block is one warpgroup and a tile of 64 rows against all 128 weight
// rows of a stage (gated: 64 gate and 64 up columns; else 128 columns): one
// m64n128k32 MMA per 32 bytes of K, four per stage. Every thread loads
// (StageLoader: the cp.async ring and swizzle of the mma.sync kernel, which
// is wgmma's 128-byte swizzle once the ring is 1024-byte aligned) and the
// warpgroup computes; three blocks per SM, so that one block's promotion,
// barrier and loads overlap another's MMAs. Per stage (one 128-K scale
// block) the MMAs write a fresh partial sum, which is then scaled by
// act_scale[row] * weight_scale and added to the f32 accumulator (DeepGEMM's
// promotion; PRECISE promotes after each k32 MMA instead).
//
// Measured (bench/README.md, basalt_bench_cuda_moe): at DeepSeek-V3's
// shapes this beats 128-row tiles, whether one block of two computing
// warpgroups with a block-wide barrier per stage, or warp-specialized (a
// loading warpgroup and two computing ones handing the ring over with
// mbarriers; commit 694167c): 451 against 382 and 348 TFLOP/s at T = 4096.
// Part of that is the tiles themselves: experts' rows are not multiples of
// the tile, and a 128-row tile wastes more of its last tile per expert.

// acc += part * (act_scale * weight scale) for this thread's rows (scales
// s_lo, s_hi) and columns (gated: the first 8 n8 blocks gate, the rest up).
template <bool GATED>
__device__ __forceinline__ void wgmma_promote(float (&acc)[64], const float (&part)[64], float s_lo, float s_hi,
                                              float w_main, float w_up) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float ws = (GATED && j >= 8) ? w_up : w_main;
    const float lo = s_lo * ws, hi = s_hi * ws;
    acc[4 * j + 0] += part[4 * j + 0] * lo;
    acc[4 * j + 1] += part[4 * j + 1] * lo;
    acc[4 * j + 2] += part[4 * j + 2] * hi;
    acc[4 * j + 3] += part[4 * j + 3] * hi;
  }
}

// One stage's four k32 MMAs (A at desc_a, B at desc_b) into a fresh partial
// sum, waited for: the stage's shared memory may be refilled once this
// returns.
__device__ __forceinline__ void wgmma_stage_partial(float (&part)[64], uint64_t desc_a, uint64_t desc_b) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBK / 32; ++ks) wgmma_m64n128k32_e4m3(part, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(part);
}

// One stage's MMAs (A at desc_a, B at desc_b) and their promotion; the
// stage's shared memory may be refilled once this returns.
template <bool GATED, bool PRECISE>
__device__ __forceinline__ void wgmma_stage(float (&acc)[64], float (&part)[64], uint64_t desc_a, uint64_t desc_b,
                                            float s_lo, float s_hi, float w_main, float w_up) {
  if constexpr (PRECISE) {
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      wgmma_fence();
      wgmma_m64n128k32_e4m3(part, desc_a + 2 * ks, desc_b + 2 * ks, false);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(part);
      wgmma_promote<GATED>(acc, part, s_lo, s_hi, w_main, w_up);
    }
  } else {
    wgmma_stage_partial(part, desc_a, desc_b);
    wgmma_promote<GATED>(acc, part, s_lo, s_hi, w_main, w_up);
  }
}

// The epilogue of one warpgroup: rows row_lo and row_lo + 8 of the tile
// (those below `rows`), columns from n0.
template <bool GATED>
__device__ __forceinline__ void wgmma_store(const MoeGemmArgs& a, const float (&acc)[64], int rows, int row_begin,
                                            int row_lo, int t4, int n0) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_lo + 8 * half;
    if (r >= rows) continue;
    const int64_t row = row_begin + r;
    if constexpr (GATED) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int n = n0 + 8 * j + 2 * t4;
        const float v0 = silu_mul(acc[4 * j + 2 * half], acc[4 * (j + 8) + 2 * half]);
        const float v1 = silu_mul(acc[4 * j + 2 * half + 1], acc[4 * (j + 8) + 2 * half + 1]);
        if (a.out_bf16)
          store_pair(static_cast<bf16*>(a.out), row, n, a.n, v0, v1);
        else
          store_pair(static_cast<float*>(a.out), row, n, a.n, v0, v1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        store_pair(static_cast<float*>(a.out), row, n0 + 8 * j + 2 * t4, a.n, acc[4 * j + 2 * half],
                   acc[4 * j + 2 * half + 1]);
    }
  }
}

// The activation row of tile row r (-1 past the tile's rows).
__device__ __forceinline__ int32_t tile_source_row(const MoeGemmArgs& a, int row_begin, int rows, int r) {
  if (r >= rows) return -1;
  return a.gather ? a.row_pair[row_begin + r] / a.top_k : row_begin + r;
}

// The shared memory of the wgmma kernel: the ring (A and B stages, the
// activation scales of each stage) and the tile's source rows, from a
// 1024-byte-aligned base.
template <int BM, int STAGES>
struct WgmmaSmem {
  static constexpr int A_BYTES = BM * kBK, B_BYTES = kMoeGemmN * kBK;
  static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "stages keep the 1024-byte alignment");
  static constexpr int BYTES = STAGES * (A_BYTES + B_BYTES + BM * 4) + BM * 4 + 1024;
  uint32_t a, b, scale;  // shared addresses of the A stages, B stages, scales [STAGES][BM]
  const float* scales;
  int32_t* src;
  __device__ explicit WgmmaSmem(uint8_t* raw) {
    uint8_t* const base = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    a = smem_addr(base);
    b = a + STAGES * A_BYTES;
    scale = b + STAGES * B_BYTES;
    scales = reinterpret_cast<const float*>(base + STAGES * (A_BYTES + B_BYTES));
    src = reinterpret_cast<int32_t*>(base + STAGES * (A_BYTES + B_BYTES + BM * 4));
  }
};

// Three blocks of 128 threads per SM: 161-168 registers a thread, 74 KB of
// shared memory a block.
constexpr int kWgmmaStages = 3;

template <bool GATED, bool PRECISE>
__global__ void __launch_bounds__(128, 3) moe_wgmma_kernel(MoeGemmArgs a) {
  constexpr int BM = kWgmmaTileM, STAGES = kWgmmaStages;
  using Loader = StageLoader<BM, 128, true, GATED>;
  using Smem = WgmmaSmem<BM, STAGES>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const Smem sm(smem_raw);

  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int row_lo = warp * 16 + lane / 4;  // this thread's rows: row_lo, row_lo + 8
  const int KT = (a.k + kBK - 1) / kBK;
  const int n0 = static_cast<int>(blockIdx.x) * Loader::BN;
  const int num_tiles = *a.num_tiles;

  for (int tile = static_cast<int>(blockIdx.y); tile < num_tiles; tile += static_cast<int>(gridDim.y)) {
    const int4 info = a.tiles[tile];
    const int row_begin = info.y, rows = info.z - info.y;
    const MoeExpertPtrs& ex = a.table[info.x];
    const float* const ws_main = ex.scale[GATED ? 0 : 2] + (n0 / 128) * KT;
    const float* const ws_up = ex.scale[1] + (n0 / 128) * KT;
    if (tid < BM) sm.src[tid] = tile_source_row(a, row_begin, rows, tid);
    __syncthreads();
    const Loader loader(a, sm.src, sm.a, sm.b, sm.scale, tid, a.k, KT, n0, ex);

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) loader.load(s, s);
      cp_async_commit();
    }
#pragma unroll 1
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();
      fence_proxy_async_shared();
      __syncthreads();
      const int next = kt + STAGES - 1;
      if (next < KT) loader.load(next % STAGES, next);
      cp_async_commit();
      const int slot = kt % STAGES;
      wgmma_stage<GATED, PRECISE>(acc, part, wgmma_desc_sw128(sm.a + slot * Smem::A_BYTES),
                                  wgmma_desc_sw128(sm.b + slot * Smem::B_BYTES), sm.scales[slot * BM + row_lo],
                                  sm.scales[slot * BM + row_lo + 8], ws_main[kt], GATED ? ws_up[kt] : 0.0f);
    }
    cp_async_wait<0>();
    wgmma_store<GATED>(a, acc, rows, row_begin, row_lo, lane % 4, n0);
    __syncthreads();  // the next tile's loads overwrite the stages and the source rows
  }
}

template <bool GATED, bool PRECISE>
cudaError_t launch_wgmma(const MoeGemmArgs& args, int max_tiles, cudaStream_t stream) {
  constexpr int SMEM = WgmmaSmem<kWgmmaTileM, kWgmmaStages>::BYTES;
  static const cudaError_t configured =
      cudaFuncSetAttribute(moe_wgmma_kernel<GATED, PRECISE>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (configured != cudaSuccess) return configured;
  constexpr int BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;
  const dim3 grid(static_cast<unsigned>((args.n + BN - 1) / BN),
                  static_cast<unsigned>(max_tiles < 65535 ? max_tiles : 65535));
  moe_wgmma_kernel<GATED, PRECISE><<<grid, 128, SMEM, stream>>>(args);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// The FP8 grouped GEMM fed by TMA (sm_90a).
//
// A block is three computing warpgroups and one loading warpgroup, of which
// one thread walks the block's (tile, column block) pairs and, per
// 128-K stage, waits for the stage's "empty" barrier, announces its bytes on
// "full" and issues the TMA copies: 128 weight rows (gated: 64 gate and the
// same 64 up rows; else 128 rows of down) and 64 activation rows for each
// warpgroup whose rows the tile reaches. Warpgroup g computes tile rows
// 64 g .. 64 g + 63 against all 128 weight rows (m64n128k32, four a stage),
// promotes as moe_wgmma_kernel does, and each of its warps arrives on
// "empty" once its MMAs have read the stage; a warpgroup past the tile's
// rows only waits and arrives. The ring's stages and phases run on across
// tiles, so the loads of a block's next tile overlap its last MMAs.
//
// Why 192 rows: an expert's rows all fit one tile up to 192 (DeepSeek-V3's
// prefill at 4K tokens routes 128 +- 11 rows to each expert), so the weights
// cross from L2 once per column block instead of once per 64-row tile, while
// the MMAs skipped past the rows keep the tensor work that of 64-row tiles.
//
// The same kernel serves a dense block-FP8 GEMM (DENSE: one matrix, its
// tiles implicit) and runs in clusters of two CTAs that share each
// activation tile by TMA multicast (CLUSTER 2). Measured on an H100
// (bench/README.md): pairs gain 0-7% on the dense shapes and 3% at 8
// experts x 4K rows, and lose 3-6% at DeepSeek-V3's routed shapes, so the
// MoE default stays one CTA; the consumers' remote arrivals must be
// CTA-scope (tma.cuh), or every stage pays about 1 us.

constexpr int kTmaGroups = kWgmmaTmaTileM / 64;  // computing warpgroups
constexpr int kTmaThreads = 128 * (kTmaGroups + 1);  // + the loading warpgroup
// Registers a thread: 128 at launch (512 threads); the loading warpgroup
// gives most of its share to the computing ones (per scheduler, three
// computing warps and a loading one: 3 * 160 + 24 <= 512).
constexpr int kTmaLoadRegs = 24, kTmaMathRegs = 160;
constexpr int kTmaStages = 5;

struct TmaSmem {
  static constexpr int A_BYTES = kWgmmaTmaTileM * kBK, B_BYTES = kMoeGemmN * kBK;
  static constexpr int BOX_BYTES = kMoeTmaBoxRows * kMoeTmaBoxBytes;  // a weight box; a warpgroup's A rows
  static constexpr int HALF_BYTES = kMoeTmaActBoxRows * kMoeTmaBoxBytes;  // an activation box: half of those
  static_assert(kMoeTmaBoxBytes == kBK && A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0 && BOX_BYTES % 1024 == 0 &&
                    HALF_BYTES % 1024 == 0 && 2 * kMoeTmaActBoxRows == kMoeTmaBoxRows,
                "boxes keep the swizzle's 1024-byte alignment");
  static constexpr int BYTES = kTmaStages * (A_BYTES + B_BYTES) + 2 * kTmaStages * 8 + 1024;
  uint32_t a, b, full, empty;  // shared addresses: A stages, B stages, mbarriers [kTmaStages] each
  __device__ explicit TmaSmem(uint8_t* raw) {
    const uint32_t base = smem_addr(raw) + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    a = base;
    b = a + kTmaStages * A_BYTES;
    full = b + kTmaStages * B_BYTES;
    empty = full + kTmaStages * 8;
  }
};

// One unit of the persistent walk: the expert (the dense GEMM's one matrix
// is expert 0), the tile's rows and the cluster's column unit (CLUSTER
// neighbouring column blocks, one a CTA).
struct TmaUnit {
  int expert, row_begin, rows, unit;
};

// The dense GEMM walks its units in groups of kDenseGroupBlocks column
// blocks, the tiles of a group one after another, so that a wave of 132
// blocks covers about 8 tiles x 16 column blocks (1.5K activation rows and
// 2K weight rows), which L2 holds, where tile-major order would sweep the
// whole weight matrix for every tile. (The grouping's own gain has not been
// measured against tile-major order.)
constexpr int kDenseGroupBlocks = 16;

template <bool DENSE, int CLUSTER>
__device__ __forceinline__ TmaUnit tma_unit(const MoeGemmArgs& a, int dense_m, int t, int units) {
  if constexpr (DENSE) {
    constexpr int kGroupUnits = kDenseGroupBlocks / CLUSTER;
    const int tiles = (dense_m + kWgmmaTmaTileM - 1) / kWgmmaTmaTileM;
    const int group = t / (kGroupUnits * tiles), in = t % (kGroupUnits * tiles);
    const int first = group * kGroupUnits, width = min(kGroupUnits, units - first);
    const int tile = in / width, row_begin = tile * kWgmmaTmaTileM;
    return {0, row_begin, min(kWgmmaTmaTileM, dense_m - row_begin), first + in % width};
  } else {
    const int4 info = a.tiles[t / units];
    return {info.x, info.y, info.z - info.y, t % units};
  }
}

// DENSE: one weight matrix (map_w, dense_scale) and dense_m rows of A in
// order; a.tiles, a.table and weight_maps are not read.
// CLUSTER 2: clusters of two CTAs walk the same tiles, CTA r taking column
// block 2 u + r of unit u; each loads its own weight rows and half of every
// warpgroup's activation rows (rows 32 r .. 32 r + 31 of each 64), which TMA
// delivers to both, so the activation tile is read from L2 once for two
// column blocks. A stage is free for the next load only when the consumers
// of both CTAs have read it: every consumer warp arrives on the "empty"
// barrier of both. Before the loading thread exits it waits for the last
// round of arrivals, so no CTA exits while the other may still arrive on it.
// A CTA whose column block is past N computes on zeros and stores nothing.
template <bool GATED, bool DENSE, int CLUSTER>
__global__ void __launch_bounds__(kTmaThreads, 1)
    moe_wgmma_tma_kernel(const __grid_constant__ TmaDescriptor map_a, const __grid_constant__ TmaDescriptor map_w,
                         const TmaDescriptor* __restrict__ weight_maps, MoeGemmArgs a, const float* dense_scale,
                         int dense_m, int n_blocks) {
  static_assert(!(GATED && DENSE), "the dense GEMM has no gated form");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two CTAs");
  constexpr int STAGES = kTmaStages, BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const TmaSmem sm(smem_raw);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int rank = CLUSTER > 1 ? static_cast<int>(cluster_cta_rank()) : 0;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(sm.full + 8 * s, 1);
      mbarrier_init(sm.empty + 8 * s, 4 * kTmaGroups * CLUSTER);
    }
    mbarrier_init_fence();
  }
  if constexpr (CLUSTER > 1)
    cluster_sync();  // the other CTA's barriers exist before anything lands on them
  else
    __syncthreads();
  const int KT = (a.k + kBK - 1) / kBK;
  const int tiles = DENSE ? (dense_m + kWgmmaTmaTileM - 1) / kWgmmaTmaTileM : *a.num_tiles;
  const int units = (n_blocks + CLUSTER - 1) / CLUSTER;
  const int total = tiles * units;
  const int first = static_cast<int>(blockIdx.x) / CLUSTER, step = static_cast<int>(gridDim.x) / CLUSTER;

  if (warp >= 4 * kTmaGroups) {  // the loading warpgroup: one thread issues
    setmaxnreg_dec<kTmaLoadRegs>();
    if (tid != 128 * kTmaGroups) return;
    uint32_t it = 0;
    for (int t = first; t < total; t += step) {
      const TmaUnit p = tma_unit<DENSE, CLUSTER>(a, dense_m, t, units);
      const int nb = p.unit * CLUSTER + rank;
      const int groups = min(kTmaGroups, (p.rows + 63) / 64);
      const TmaDescriptor* main = DENSE ? &map_w : weight_maps + 3 * p.expert + (GATED ? 0 : 2);
      const TmaDescriptor* second = GATED ? weight_maps + 3 * p.expert + 1 : main;
      if (!DENSE) tensormap_acquire(main);  // written by moe_fill_tmaps, not a parameter
      if (GATED) tensormap_acquire(second);
      // Weight rows of the stage's two boxes: gated, gate and up rows n0 ..
      // n0 + 63; else rows n0 .. n0 + 127.
      const int w0 = nb * BN, w1 = GATED ? w0 : w0 + kMoeTmaBoxRows;
      const uint32_t bytes = static_cast<uint32_t>(TmaSmem::B_BYTES + groups * TmaSmem::BOX_BYTES);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const uint32_t s = it % STAGES, phase = (it / STAGES) & 1;
        mbarrier_wait(sm.empty + 8 * s, phase ^ 1);
        const uint32_t full = sm.full + 8 * s;
        mbarrier_arrive_expect_tx(full, bytes);
        const uint32_t b = sm.b + s * TmaSmem::B_BYTES, a_stage = sm.a + s * TmaSmem::A_BYTES;
        tma_load_2d(b, main, kt * kBK, w0, full);
        tma_load_2d(b + TmaSmem::BOX_BYTES, second, kt * kBK, w1, full);
        for (int g = 0; g < groups; ++g) {
          const uint32_t dst = a_stage + g * TmaSmem::BOX_BYTES;
          const int row = p.row_begin + 64 * g;
          if constexpr (CLUSTER > 1) {
            tma_load_2d_multicast(dst + rank * TmaSmem::HALF_BYTES, &map_a, kt * kBK, row + 32 * rank, full, 0x3);
          } else {
            tma_load_2d(dst, &map_a, kt * kBK, row, full);
            tma_load_2d(dst + TmaSmem::HALF_BYTES, &map_a, kt * kBK, row + 32, full);
          }
        }
      }
    }
    if constexpr (CLUSTER > 1) {
      // The last round of both CTAs' arrivals on this CTA's "empty" barriers.
      for (uint32_t j = it > STAGES ? it - STAGES : 0; j < it; ++j)
        mbarrier_wait(sm.empty + 8 * (j % STAGES), (j / STAGES) & 1);
    }
    return;
  }

  setmaxnreg_inc<kTmaMathRegs>();
  const int group = warp / 4;
  const int row_lo = 64 * group + (warp % 4) * 16 + lane / 4;  // this thread's tile rows: row_lo, row_lo + 8
  // Frees a stage: this warp's arrival on the "empty" barrier of every CTA
  // of the cluster.
  const auto release = [&](uint32_t empty) {
    if (lane != 0) return;
    if constexpr (CLUSTER > 1) {
      for (int c = 0; c < CLUSTER; ++c) mbarrier_arrive_cluster(empty, static_cast<uint32_t>(c));
    } else {
      mbarrier_arrive(empty);
    }
  };
  uint32_t it = 0;
  for (int t = first; t < total; t += step) {
    const TmaUnit p = tma_unit<DENSE, CLUSTER>(a, dense_m, t, units);
    const int nb = p.unit * CLUSTER + rank;
    const int row_begin = p.row_begin, rows = p.rows;
    const bool active = 64 * group < rows, stored = nb < n_blocks;
    // A column block past N reads the first block's scales (its sums are zeros and never stored).
    const int n0 = stored ? nb * BN : 0;
    const float* ws_main;
    const float* ws_up = nullptr;
    if constexpr (DENSE) {
      ws_main = dense_scale + (n0 / 128) * KT;
    } else {
      const MoeExpertPtrs& ex = a.table[p.expert];
      ws_main = ex.scale[GATED ? 0 : 2] + (n0 / 128) * KT;
      ws_up = ex.scale[1] + (n0 / 128) * KT;
    }
    // Rows past the tile are never stored; their scales are read as zeros.
    const float* const as_lo = row_lo < rows ? a.a_scale + static_cast<int64_t>(row_begin + row_lo) * KT : nullptr;
    const float* const as_hi =
        row_lo + 8 < rows ? a.a_scale + static_cast<int64_t>(row_begin + row_lo + 8) * KT : nullptr;
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const uint32_t s = it % STAGES, phase = (it / STAGES) & 1;
      const uint32_t empty = sm.empty + 8 * s;
      if (!active) {
        mbarrier_wait(sm.full + 8 * s, phase);
        release(empty);
        continue;
      }
      const float s_lo = as_lo ? __ldg(as_lo + kt) : 0.0f, s_hi = as_hi ? __ldg(as_hi + kt) : 0.0f;
      const float w_main = __ldg(ws_main + kt), w_up = GATED ? __ldg(ws_up + kt) : 0.0f;
      mbarrier_wait(sm.full + 8 * s, phase);
      wgmma_stage_partial(part, wgmma_desc_sw128(sm.a + s * TmaSmem::A_BYTES + group * TmaSmem::BOX_BYTES),
                          wgmma_desc_sw128(sm.b + s * TmaSmem::B_BYTES));
      release(empty);
      wgmma_promote<GATED>(acc, part, s_lo, s_hi, w_main, w_up);
    }
    if (active && stored) wgmma_store<GATED>(a, acc, rows, row_begin, row_lo, lane % 4, n0);
  }
}

// A launch of kTmaThreads-thread blocks in clusters of `cluster` CTAs along
// x (config points at attribute: not copyable).
struct ClusterLaunch {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(int cluster, int blocks, int smem, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(kTmaThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Clusters of CLUSTER CTAs of `kernel` that the current device holds at
// once (SMs / CLUSTER where the runtime cannot say); asked once per device
// and kernel.
template <int CLUSTER, typename Kernel>
int resident_clusters(Kernel kernel, int smem) {
  if (CLUSTER == 1) return sm_count();
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) device = -1;
  if (device >= 0 && known[device].load(std::memory_order_relaxed) > 0) return known[device].load();
  const ClusterLaunch launch(CLUSTER, CLUSTER * sm_count(), smem, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess || clusters <= 0) {
    (void)cudaGetLastError();
    return sm_count() / CLUSTER;
  }
  if (device >= 0) known[device].store(clusters);
  return clusters;
}

// Launches the kernel on as many clusters as are resident at once, at most
// one per unit (max_tiles tiles x column units).
template <bool GATED, bool DENSE, int CLUSTER>
cudaError_t launch_wgmma_tma(const MoeGemmArgs& args, const TmaDescriptor& map_a, const TmaDescriptor& map_w,
                             const TmaDescriptor* weight_maps, const float* dense_scale, int dense_m, int max_tiles,
                             cudaStream_t stream) {
  constexpr int SMEM = TmaSmem::BYTES;
  const auto kernel = moe_wgmma_tma_kernel<GATED, DENSE, CLUSTER>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (configured != cudaSuccess) return configured;
  constexpr int BN = GATED ? kMoeGemmN / 2 : kMoeGemmN;
  const int n_blocks = (args.n + BN - 1) / BN;
  const int64_t units = static_cast<int64_t>(max_tiles) * ((n_blocks + CLUSTER - 1) / CLUSTER);
  const int resident = resident_clusters<CLUSTER>(kernel, SMEM);
  const int clusters = static_cast<int>(units < resident ? units : resident);
  if (clusters == 0) return cudaSuccess;
  const ClusterLaunch launch(CLUSTER, CLUSTER * clusters, SMEM, stream);
  return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_w, weight_maps, args, dense_scale, dense_m, n_blocks);
}

__global__ void moe_fill_tmaps_kernel(TmaDescriptor* maps, MoeTmaChunk chunk) {
  const int i = static_cast<int>(threadIdx.x) / 16, word = static_cast<int>(threadIdx.x) % 16;
  if (i < chunk.count) maps[chunk.first + i].opaque[word] = chunk.d[i].opaque[word];
}

__global__ void __launch_bounds__(128)
    moe_gather_fp8_rows_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scale,
                               const int32_t* __restrict__ row_pair, int32_t top_k, int32_t k_bytes,
                               int32_t k_blocks, uint8_t* __restrict__ dst_q, float* __restrict__ dst_scale) {
  const int64_t r = blockIdx.x;
  const int32_t pair = row_pair[r];
  if (pair < 0) return;
  const int64_t src = pair / top_k;
  const uint4* from = reinterpret_cast<const uint4*>(q + src * k_bytes);
  uint4* to = reinterpret_cast<uint4*>(dst_q + r * k_bytes);
  for (int c = static_cast<int>(threadIdx.x); c < k_bytes / 16; c += 128) to[c] = from[c];
  for (int c = static_cast<int>(threadIdx.x); c < k_blocks; c += 128)
    dst_scale[r * k_blocks + c] = scale[src * k_blocks + c];
}

// ---------------------------------------------------------------------------
// The generic GEMMs: one warp per output element.

constexpr int kGenericWarps = 8;

__device__ __forceinline__ float load_weight(const MoeExpertPtrs& ex, int m, int64_t n, int64_t k, int64_t K) {
  const int64_t i = n * K + k;
  switch (ex.kind[m]) {
    case kMoeF32: return static_cast<const float*>(ex.w[m])[i];
    case kMoeBF16: return to_f32(static_cast<const bf16*>(ex.w[m])[i]);
    case kMoeF16: return to_f32(static_cast<const __half*>(ex.w[m])[i]);
    default: {
      const uint8_t code = static_cast<const uint8_t*>(ex.w[m])[i];
      const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
      const int64_t kb = (K + 127) / 128;
      return __half2float(__half(h)) * ex.scale[m][(n / 128) * kb + k / 128];
    }
  }
}

template <bool GATED>
__global__ void __launch_bounds__(32 * kGenericWarps) moe_generic_kernel(MoeGenericArgs a) {
  const int row = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int n = static_cast<int>(blockIdx.y) * kGenericWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= a.n) return;
  const int pair = a.row_pair[row];
  if (pair < 0) return;
  const MoeExpertPtrs& ex = a.table[a.ids[pair] - a.first_expert];
  const int64_t src = a.gather ? pair / a.top_k : row;
  const int64_t K = a.k;
  float s0 = 0.0f, s1 = 0.0f;
  for (int64_t k = lane; k < K; k += 32) {
    const float x = a.a_bf16 ? to_f32(static_cast<const bf16*>(a.a)[src * K + k])
                             : static_cast<const float*>(a.a)[src * K + k];
    s0 += x * load_weight(ex, GATED ? 0 : 2, n, k, K);
    if (GATED) s1 += x * load_weight(ex, 1, n, k, K);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    s0 += __shfl_xor_sync(kFull, s0, offset);
    s1 += __shfl_xor_sync(kFull, s1, offset);
  }
  if (lane == 0) a.out[static_cast<int64_t>(row) * a.n + n] = GATED ? silu_mul(s0, s1) : s0;
}

// ---------------------------------------------------------------------------
// Un-permutation and conversion.

constexpr int kUnpermuteThreads = 256;

// One block per (token, span of kUnpermuteThreads columns, x4 with float4
// rows): a decode step's few tokens still spread over several SMs.
__global__ void __launch_bounds__(kUnpermuteThreads)
    moe_unpermute_kernel(const float* __restrict__ y, const int32_t* __restrict__ pair_row,
                         const float* __restrict__ weights, float* __restrict__ out, int top_k, int hidden,
                         bool vec4) {
  const int64_t t = blockIdx.x;
  const int32_t* rows = pair_row + t * top_k;
  const float* w = weights + t * top_k;
  float* o = out + t * hidden;
  if (vec4) {
    const int h = (static_cast<int>(blockIdx.y) * kUnpermuteThreads + static_cast<int>(threadIdx.x)) * 4;
    if (h >= hidden) return;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const int32_t r = rows[j];
      if (r < 0) continue;
      const float wj = w[j];
      const float4 v = *reinterpret_cast<const float4*>(y + static_cast<int64_t>(r) * hidden + h);
      sum.x += wj * v.x;
      sum.y += wj * v.y;
      sum.z += wj * v.z;
      sum.w += wj * v.w;
    }
    *reinterpret_cast<float4*>(o + h) = sum;
  } else {
    const int h = static_cast<int>(blockIdx.y) * kUnpermuteThreads + static_cast<int>(threadIdx.x);
    if (h >= hidden) return;
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int32_t r = rows[j];
      if (r >= 0) sum += w[j] * y[static_cast<int64_t>(r) * hidden + h];
    }
    o[h] = sum;
  }
}

__global__ void moe_to_bf16_kernel(const float* __restrict__ src, bf16* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

cudaError_t moe_fill_table(MoeExpertPtrs* table, const MoeTableChunk& chunk, cudaStream_t stream) {
  moe_fill_table_kernel<<<1, kMoeTableChunk, 0, stream>>>(table, chunk);
  return cudaGetLastError();
}

cudaError_t moe_permute(const MoePermuteArgs& args, cudaStream_t stream) {
  const size_t smem = 2 * static_cast<size_t>(args.experts) * sizeof(int32_t);
  moe_permute_kernel<<<1, kPermuteThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t moe_gemm(const MoeGemmArgs& args, int mode, bool gated, int tile_m, int max_tiles, cudaStream_t stream) {
  if (mode == kMoeMmaWgmma || mode == kMoeMmaWgmmaPrecise) {
    if (tile_m != kWgmmaTileM) return cudaErrorInvalidValue;
    if (mode == kMoeMmaWgmmaPrecise)
      return gated ? launch_wgmma<true, true>(args, max_tiles, stream) : launch_wgmma<false, true>(args, max_tiles, stream);
    return gated ? launch_wgmma<true, false>(args, max_tiles, stream) : launch_wgmma<false, false>(args, max_tiles, stream);
  }
  switch (tile_m) {
    case 16: return launch_gemm_m<16>(args, mode, gated, max_tiles, stream);
    case 64: return launch_gemm_m<64>(args, mode, gated, max_tiles, stream);
    case 128: return launch_gemm_m<128>(args, mode, gated, max_tiles, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t moe_gemm_tma(const MoeGemmArgs& args, const TmaDescriptor& map_a, const TmaDescriptor* weight_maps,
                         bool gated, int max_tiles, int cluster, cudaStream_t stream) {
  if (args.gather || args.out_bf16 || (cluster != 1 && cluster != 2)) return cudaErrorInvalidValue;
  // map_a stands in for the dense matrix's map, which the grouped kernel does not read.
  const auto launch = [&](auto kernel_launch) {
    return kernel_launch(args, map_a, map_a, weight_maps, nullptr, 0, max_tiles, stream);
  };
  if (cluster == 2)
    return gated ? launch(launch_wgmma_tma<true, false, 2>) : launch(launch_wgmma_tma<false, false, 2>);
  return gated ? launch(launch_wgmma_tma<true, false, 1>) : launch(launch_wgmma_tma<false, false, 1>);
}

cudaError_t dense_fp8_gemm_tma(const DenseFp8Args& args, const TmaDescriptor& map_a, const TmaDescriptor& map_w,
                               int cluster, cudaStream_t stream) {
  if (cluster != 1 && cluster != 2) return cudaErrorInvalidValue;
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) return cudaSuccess;
  MoeGemmArgs a{};
  a.a_scale = args.a_scale;
  a.out = args.out;
  a.n = args.n;
  a.k = args.k;
  const int tiles = (args.m + kWgmmaTmaTileM - 1) / kWgmmaTmaTileM;
  return cluster == 2 ? launch_wgmma_tma<false, true, 2>(a, map_a, map_w, nullptr, args.w_scale, args.m, tiles, stream)
                      : launch_wgmma_tma<false, true, 1>(a, map_a, map_w, nullptr, args.w_scale, args.m, tiles, stream);
}

int tma_resident_clusters(int cluster) {
  constexpr int SMEM = TmaSmem::BYTES;
  if (cluster != 2) return sm_count();
  const auto kernel = moe_wgmma_tma_kernel<false, true, 2>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) != cudaSuccess) return 0;
  return resident_clusters<2>(kernel, SMEM);
}

cudaError_t moe_fill_tmaps(TmaDescriptor* maps, const MoeTmaChunk& chunk, cudaStream_t stream) {
  moe_fill_tmaps_kernel<<<1, 16 * kMoeTmaChunk, 0, stream>>>(maps, chunk);
  return cudaGetLastError();
}

cudaError_t moe_gather_fp8_rows(const uint8_t* q, const float* scale, const int32_t* row_pair, int32_t top_k,
                                int32_t rows, int32_t k_bytes, int32_t k_blocks, uint8_t* dst_q, float* dst_scale,
                                cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  moe_gather_fp8_rows_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(q, scale, row_pair, top_k, k_bytes,
                                                                              k_blocks, dst_q, dst_scale);
  return cudaGetLastError();
}

cudaError_t moe_generic_gemm(const MoeGenericArgs& args, bool gated, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.rows), static_cast<unsigned>((args.n + kGenericWarps - 1) / kGenericWarps));
  if (gated)
    moe_generic_kernel<true><<<grid, 32 * kGenericWarps, 0, stream>>>(args);
  else
    moe_generic_kernel<false><<<grid, 32 * kGenericWarps, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t moe_unpermute(const float* y, const int32_t* pair_row, const float* weights, float* out, int32_t tokens,
                          int32_t top_k, int32_t hidden, cudaStream_t stream) {
  // float4 rows when every row starts 16-byte aligned.
  const bool vec4 = hidden % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  const int span = kUnpermuteThreads * (vec4 ? 4 : 1);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((hidden + span - 1) / span));
  moe_unpermute_kernel<<<grid, kUnpermuteThreads, 0, stream>>>(y, pair_row, weights, out, top_k, hidden, vec4);
  return cudaGetLastError();
}

cudaError_t moe_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream) {
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  moe_to_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<bf16*>(dst), n);
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
