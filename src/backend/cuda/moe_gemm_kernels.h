// Launchers of the MoE expert kernels (moe_gemm_kernels.cu), with a plain
// interface (raw device pointers and sizes) so that the .cu file needs no
// host-library headers. moe.h is the checked API on top; call that instead.
//
// The pipeline of one moe_experts call (moe.h says what each stage computes):
//   moe_permute      ids -> the rows of each expert made contiguous, the
//                    row <-> pair maps and the list of M tiles (one block);
//   moe_gemm         grouped GEMM over those tiles: gate and up with
//                    silu(gate) * up in the epilogue (gated), or down;
//                    bf16 operands (mma m16n8k16) or block-FP8 operands
//                    (mma m16n8k32 e4m3, a 1x128-scaled activation times a
//                    128x128-scaled weight, promoted per 128-K block);
//   moe_generic_gemm the same two GEMMs for any weight dtype or alignment
//                    (one warp per output element, f32 throughout);
//   moe_unpermute    out[t] = sum_j weights[t, j] * y[row of (t, j)].
// dense_fp8_gemm_tma is the TMA-fed grouped GEMM's kernel run as one dense
// block-FP8 product (fp8_linear.h's prefill path).
//
// Contract: each launcher enqueues its kernels on `stream` and returns
// cudaGetLastError(). Sizes are trusted: the caller has checked shapes,
// dtypes, placement, alignment (moe_gemm: K bytes a multiple of 16, every
// operand 16-byte aligned) and limits (experts <= kMoeExpertsMax).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/tensor_map.h"

namespace basalt::cuda_kernels {

inline constexpr int kMoeExpertsMax = 4096;  // counts and cursors of the permutation in shared memory
inline constexpr int kMoeGemmN = 128;        // weight rows a GEMM block reads per stage (gated: 64 + 64)

// Storage of one expert weight matrix.
enum MoeWeightKind : int32_t { kMoeF32 = 0, kMoeBF16 = 1, kMoeF16 = 2, kMoeFp8 = 3 };

// One expert in the device table: matrices 0 gate [I, H], 1 up [I, H],
// 2 down [H, I]; scale[m] is the f32 [ceil(N/128), ceil(K/128)] scale_inv of
// an FP8 matrix, null otherwise.
struct MoeExpertPtrs {
  const void* w[3];
  const float* scale[3];
  int32_t kind[3];
  int32_t pad;
};

// Table entries written by one launch (they travel as kernel parameters, so
// that a table built while a CUDA graph is recorded is part of the graph).
inline constexpr int kMoeTableChunk = 32;
struct MoeTableChunk {
  MoeExpertPtrs e[kMoeTableChunk];
  int first, count;
};
cudaError_t moe_fill_table(MoeExpertPtrs* table, const MoeTableChunk& chunk, cudaStream_t stream);

// ids [pairs] (pair p = token p / top_k, slot p % top_k). Writes
//  * row_pair [pairs]: the pair of each row; rows are grouped by expert in
//    expert order (the order within an expert is unspecified); rows past the
//    last valid pair hold -1;
//  * pair_row [pairs]: the row of each pair, -1 for an id outside [0, experts);
//  * tiles [max_tiles]: {expert, row_begin, row_end, 0} for each tile of at
//    most tile_m rows of one expert, experts in order; num_tiles [1] the count.
// max_tiles must be >= min(pairs, (pairs + min(experts, pairs) * (tile_m - 1)) / tile_m).
struct MoePermuteArgs {
  const int32_t* ids;
  int32_t first_expert;  // ids name experts [first_expert, first_expert + experts); others are skipped
  int32_t pairs, experts, tile_m;
  int32_t* row_pair;
  int32_t* pair_row;
  int4* tiles;
  int32_t* num_tiles;
};
cudaError_t moe_permute(const MoePermuteArgs& args, cudaStream_t stream);

// One grouped GEMM over the tiles of moe_permute:
//   gated:  act[row, n] = silu(g) * u, g = A[row] . gate_e[n], u = A[row] . up_e[n]
//   !gated: y[row, n] = A[row] . down_e[n]
// A[row] is a[row_pair[row] / top_k] when gather, else a[row]; rows of
// k_bytes bytes (bf16 or e4m3). FP8: a_scale [rows of a, ceil(K/128)] f32;
// each 128-K block's partial sum p adds p * (a_scale * w_scale) to the f32
// accumulator. out: f32, or bf16 when out_bf16, [rows, n] dense.
struct MoeGemmArgs {
  const uint8_t* a;
  const float* a_scale;
  const int32_t* row_pair;
  int32_t top_k;
  bool gather;
  const MoeExpertPtrs* table;
  const int4* tiles;
  const int32_t* num_tiles;
  void* out;
  bool out_bf16;
  int32_t n, k;  // output columns, reduction length in elements
};
// How moe_gemm multiplies: bf16 operands (mma m16n8k16 bf16), or e4m3
// operands through PTX's mma m16n8k32 e4m3 (native on sm_89; on sm_90 the
// compiler emulates it: it converts the fragments and issues f16 mma), or
// e4m3 operands reread in registers as f16 by moving bits (value * 2^-8,
// exact) into f16 mma m16n8k16, the 2^16 folded into the promotion scale.
// or e4m3 operands on Hopper's warpgroup MMA (wgmma m64n128k32 e4m3 from
// shared memory, sm_90a only: wgmma_available() in kernel_caps.h; tile_m kWgmmaTileM),
// or the same MMA fed by TMA in a persistent warp-specialized kernel
// (kMoeMmaWgmmaTma: moe_gemm_tma below, tile_m kWgmmaTmaTileM), alone or in
// clusters of two CTAs that share each activation tile (kMoeMmaWgmmaTmaPair).
// Every FP8 mode computes the same products. The mma.sync modes sum them in
// f32; wgmma's FP8 path adds inside the tensor core with fewer mantissa bits
// (DeepSeek-V3's report, section 3.3.2: about 14), so kMoeMmaWgmma, which
// promotes to f32 once per 128-K block as DeepGEMM does, is measurably less
// exact (bench/README.md, basalt_bench_cuda_moe), and kMoeMmaWgmmaPrecise
// promotes after every k32 MMA, at a cost in speed.
enum MoeMmaMode : int {
  kMoeMmaBf16 = 0,
  kMoeMmaE4m3 = 1,
  kMoeMmaE4m3AsF16 = 2,
  kMoeMmaWgmma = 3,
  kMoeMmaWgmmaPrecise = 4,
  kMoeMmaWgmmaTma = 5,
  kMoeMmaWgmmaTmaPair = 6
};
// tile_m is 16, 64 or 128 (the tile_m of moe_permute); the wgmma modes take
// kWgmmaTileM and FP8 operands only (cudaErrorInvalidValue otherwise).
inline constexpr int kWgmmaTileM = 64;
cudaError_t moe_gemm(const MoeGemmArgs& args, int mode, bool gated, int tile_m, int max_tiles, cudaStream_t stream);

// The FP8 grouped GEMM fed by TMA (sm_90a; kMoeMmaWgmmaTma), what moe_gemm
// computes with the wgmma multiply, for tiles of up to kWgmmaTmaTileM rows:
// one warpgroup per 64 of them, each skipping its MMAs when the tile's rows
// end before its own, so an expert of up to 192 rows reads its weights once
// per column block. Persistent: one block per SM walks (tile, column block)
// pairs, a tile's column blocks on neighbouring blocks.
//   * args.gather must be false: A is [R, K] in row order (for gate/up,
//     moe_gather_fp8_rows writes it), a_scale [R, ceil(K/128)];
//   * map_a describes A (encode_rows_u8: R rows of K bytes, box
//     kMoeTmaActBoxRows x kMoeTmaBoxBytes); weight_maps [experts][3] every
//     expert's gate, up and down matrices (moe_fill_tmaps; box kMoeTmaBoxRows
//     x kMoeTmaBoxBytes), in global memory, 128-byte aligned;
//   * out is f32 (out_bf16 false);
//   * cluster 1: each block loads its own tiles; cluster 2: blocks run in
//     clusters of two on neighbouring column blocks of the same tile, and
//     each activation tile is read from L2 once for both (TMA multicast).
//     The same bits either way.
inline constexpr int kWgmmaTmaTileM = 192;
inline constexpr int kMoeTmaBoxRows = 64, kMoeTmaActBoxRows = 32, kMoeTmaBoxBytes = 128;
cudaError_t moe_gemm_tma(const MoeGemmArgs& args, const TmaDescriptor& map_a, const TmaDescriptor* weight_maps,
                         bool gated, int max_tiles, int cluster, cudaStream_t stream);

// The same kernel as a dense block-FP8 GEMM (fp8_linear.h's prefill path):
//   out[m, n] = sum over 128-K blocks b of (q[m] . w[n])_b * a_scale[m, b] * w_scale[n / 128, b]
// q e4m3 [M, K] with a_scale f32 [M, ceil(K/128)] (fp8.h's row-major
// quantizer), w e4m3 [N, K] with w_scale f32 [ceil(N/128), ceil(K/128)], out
// f32 [M, N]; map_a and map_w describe q and w (encode_rows_u8, boxes as
// moe_gemm_tma's: kMoeTmaActBoxRows rows for q, kMoeTmaBoxRows for w), so K
// is a multiple of 16 and both are 16-byte aligned. M rows go in tiles of
// kWgmmaTmaTileM, walked in groups of column blocks (moe_gemm_kernels.cu
// says why); cluster as moe_gemm_tma's.
struct DenseFp8Args {
  const float* a_scale;
  const float* w_scale;
  float* out;
  int32_t m, n, k;
};
cudaError_t dense_fp8_gemm_tma(const DenseFp8Args& args, const TmaDescriptor& map_a, const TmaDescriptor& map_w,
                               int cluster, cudaStream_t stream);

// How many clusters of `cluster` (1 or 2) CTAs of the TMA-fed kernel the
// current device holds at once (what a launch's persistent grid takes).
int tma_resident_clusters(int cluster);

// Descriptors written to device memory by a kernel whose parameters carry
// them (as moe_fill_table, so that a capture records them).
inline constexpr int kMoeTmaChunk = 16;
struct MoeTmaChunk {
  TmaDescriptor d[kMoeTmaChunk];
  int first, count;
};
cudaError_t moe_fill_tmaps(TmaDescriptor* maps, const MoeTmaChunk& chunk, cudaStream_t stream);

// dst_q[r] = q[row_pair[r] / top_k] (k_bytes bytes) and dst_scale[r] =
// scale[row_pair[r] / top_k] (k_blocks floats) for r < rows; rows whose
// row_pair is -1 are left as they are. Every pointer 16-byte aligned,
// k_bytes a multiple of 16.
cudaError_t moe_gather_fp8_rows(const uint8_t* q, const float* scale, const int32_t* row_pair, int32_t top_k,
                                int32_t rows, int32_t k_bytes, int32_t k_blocks, uint8_t* dst_q, float* dst_scale,
                                cudaStream_t stream);

// The generic GEMMs: A rows of f32 (or bf16 when a_bf16) of k elements
// (gathered as above); weights of any MoeWeightKind, dequantized to f32; f32
// sums; out f32 [rows, n]. Rows whose row_pair is -1 are skipped.
struct MoeGenericArgs {
  const void* a;
  bool a_bf16;
  const int32_t* ids;
  int32_t first_expert;  // as MoePermuteArgs'
  const int32_t* row_pair;
  int32_t top_k;
  bool gather;
  const MoeExpertPtrs* table;
  float* out;
  int32_t rows, n, k;
};
cudaError_t moe_generic_gemm(const MoeGenericArgs& args, bool gated, cudaStream_t stream);

// out[t, h] = sum over j in order of weights[t, j] * y[pair_row[t * top_k + j], h]
// (pairs with row -1 skipped), f32 [tokens, hidden].
cudaError_t moe_unpermute(const float* y, const int32_t* pair_row, const float* weights, float* out, int32_t tokens,
                          int32_t top_k, int32_t hidden, cudaStream_t stream);

// dst[i] = bf16(src[i]) (round to nearest even).
cudaError_t moe_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
