// What the MLA attention core's kernels share (mla_kernels.cu: the mma.sync
// and CUDA-core kernels, the launcher and the split merge;
// mla_wgmma_kernels.cu: the wgmma kernel): the kernel arguments, a
// sequence's bounds as the layout gives them, and the output stores. Device
// code and launch declarations only: include from .cu files.
//
// Contract: every core kernel takes an MlaArgs and a grid of (splits x
// row_splits, num_seqs) blocks; block (x, s) serves sequence s, key split x %
// splits and the row passes p with p % row_splits == x / splits. With
// its pass's split count (mla_split_keys) 1 it writes the normalised o_lat
// rows; otherwise, per split, the unnormalised output rows (part_o), each
// row's max (log2 domain) and sum (part_ml), which mla_combine_kernel merges;
// with a.splits > 1 split 0 also writes each row's count (part_n), which the
// merge reads (1: the row is written already). Blocks whose split is past a
// pass's count skip that pass. A bad layout or slot makes the rows NaN
// (mla.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/mla_kernels.h"

namespace basalt::cuda_kernels {


struct MlaArgs {
  const void* q;  // q_full [T, heads, L + R]
  const void* cache;
  void* o;        // o_lat [T, heads, L] (splits == 1)
  float* part_o;  // [splits, T * heads, L] (splits > 1)
  float* part_ml;  // [splits, T * heads, 2]
  int32_t* part_n;  // [T * heads] (splits > 1): the row's pass's split count
  const int32_t* q_start;
  const int32_t* kv_start;
  const int32_t* kv_slots;
  int64_t q_tokens, kv_slots_len, num_slots;
  int heads, L, R, splits, row_splits;
  // splits_by_pass: a pass over hi keys takes mla_pass_splits(split_table,
  // hi, splits); otherwise splits.
  bool splits_by_pass;
  MlaSplitTable split_table;
  float scale_log2;
};

// A sequence's bounds as the layout gives them; a layout that runs outside
// q or kv_slots is "bad": its rows (clamped into q) are written as NaN.
struct MlaBounds {
  int64_t q_begin, q_len, kv_begin, kv_len;
  bool bad;
};

__device__ __forceinline__ MlaBounds mla_seq_bounds(const MlaArgs& a, int s) {
  const int64_t q0 = a.q_start[s], q1 = a.q_start[s + 1], k0 = a.kv_start[s], k1 = a.kv_start[s + 1];
  MlaBounds b{q0, q1 - q0, k0, k1 - k0, false};
  if (q0 < 0 || q1 < q0 || q1 > a.q_tokens || k0 < 0 || k1 < k0 || k1 > a.kv_slots_len) {
    const int64_t lo = min(max(q0, int64_t{0}), a.q_tokens), hi = min(max(q1, lo), a.q_tokens);
    b = MlaBounds{lo, hi - lo, 0, hi - lo, true};
  }
  return b;
}

// The keys [begin, end) of a sequence that key split `split` reads for the
// row pass starting at row r0 (rows r0 .. r0 + rows - 1, the last clamped to
// the sequence's rows; row r is query token r / heads), and the pass's split
// count: every key up to the pass's last position, cut into `splits` equal
// parts. Empty for a bad layout, and where a split starts past the last key
// (begin >= end).
struct MlaKeyRange {
  int64_t begin, end;
  int splits;
};

__device__ __forceinline__ MlaKeyRange mla_split_keys(const MlaArgs& a, const MlaBounds& b, int split, int64_t r0,
                                                      int rows) {
  const int64_t total_rows = b.q_len * a.heads;
  const int64_t pos_last = b.kv_len - b.q_len + min(r0 + rows - 1, total_rows - 1) / a.heads;
  const int64_t hi = b.bad ? 0 : max(pos_last + 1, int64_t{0});
  const int splits = a.splits_by_pass ? mla_pass_splits(a.split_table, hi, a.splits) : a.splits;
  const int64_t per_split = (hi + splits - 1) / splits;
  const int64_t begin = split * per_split;
  return MlaKeyRange{begin, min(hi, begin + per_split), splits};
}

template <typename O>
__device__ __forceinline__ void mla_store_pair(O* p, float x, float y) {
  if constexpr (sizeof(O) == 4) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
  }
}

// The wgmma kernel (mla_wgmma_kernels.cu; bf16 q_full and cache, L = 512, R
// = 64; o f32 or bf16): cudaErrorInvalidDeviceFunction where it does not run
// (kernel_caps.h: wgmma_available()).
cudaError_t launch_mla_wgmma(const MlaArgs& a, dim3 grid, bool f32_out, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
