// What the attention kernels share (attention_kernels.cu: the store, the
// split-KV decode kernels, the mma.sync prefill, the plan and the launcher;
// attention_prefill_wgmma.cu: the prefill on Hopper's warpgroup MMA): the
// kernel arguments, a sequence's bounds as the layout gives them, q loads
// and output stores. Device code and launch declarations only: include from
// .cu files.
//
// Contract: attention_kernels.h states the semantics (it is the launchers'
// interface); every kernel reads an AttentionArgs filled by attention() there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/element_types.cuh"

namespace basalt::cuda_kernels {

// Everything both attention paths read. Row r of q is [num_heads, head_dim],
// of out [num_heads, v_head_dim]; a cache row is [num_kv_heads, dim].
struct AttentionArgs {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  void* out;
  float* part_o;   // decode with splits > 1: [splits][q_tokens][num_heads][v_head_dim]
  float* part_ml;  // [splits][q_tokens][num_heads][2]: running max (log2 domain), sum
  const int32_t* q_start;
  const int32_t* kv_start;
  const int32_t* kv_slots;
  int num_seqs;
  int64_t q_tokens;
  int64_t kv_slots_len;
  int64_t num_slots;
  int num_heads, num_kv_heads, group, head_dim, v_head_dim;
  float scale_log2;  // softmax scale * log2(e): scores live in the log2 domain
  int sliding_window;
  int splits;
  int row_splits;  // decode: the passes of RT rows are dealt round-robin over this many blocks
  bool q_bf16, out_bf16;
  // Decode: a pass's keys start at 0 even under a sliding window (the
  // window is then only a mask), so tiles sit at fixed key offsets whatever
  // rows share the pass (the batch-invariant launch).
  bool keys_from_zero;
  // Sequences with q_len <= decode_max_q belong to the decode kernel (and the
  // combine), the others to the prefill kernel; each kernel skips the other's.
  int64_t decode_max_q;
  // Prefill: tile_start[s] = the first prefill tile of sequence s (exclusive
  // prefix of its tile count), tile_start[num_seqs] = the total; written by
  // plan_kernel on the device. A tile is prefill_rows query rows (64 for the
  // mma.sync kernel, 128 for the wgmma one).
  int32_t* tile_start;
  int prefill_rows;
};

__device__ __forceinline__ float load_q(const AttentionArgs& a, int64_t i) {
  return a.q_bf16 ? __bfloat162float(static_cast<const bf16*>(a.q)[i]) : static_cast<const float*>(a.q)[i];
}

__device__ __forceinline__ void store_out(const AttentionArgs& a, int64_t i, float v) {
  if (a.out_bf16) static_cast<bf16*>(a.out)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(a.out)[i] = v;
}

// The sequence's bounds as read from the layout, and whether they make sense
// (a bad layout gives NaN rows; the engine never builds one).
struct SeqBounds {
  int64_t q_begin, q_len, kv_begin, kv_len;
  bool bad;
};

__device__ __forceinline__ SeqBounds seq_bounds(const AttentionArgs& a, int s) {
  SeqBounds b;
  b.q_begin = a.q_start[s];
  const int64_t q_end = a.q_start[s + 1];
  b.kv_begin = a.kv_start[s];
  const int64_t kv_end = a.kv_start[s + 1];
  b.q_len = q_end > b.q_begin ? q_end - b.q_begin : 0;
  b.kv_len = kv_end - b.kv_begin;
  b.bad = b.q_begin < 0 || q_end > a.q_tokens || b.kv_begin < 0 || kv_end < b.kv_begin || kv_end > a.kv_slots_len;
  return b;
}

// A prefill block's tile: the sequence and query rows the plan gives block
// `target` for tiles of `rows` rows (a.prefill_rows, passed as the kernel's
// constant; tile_start's binary search; a sequence's tiles are taken last
// first, so the longest causal rows start first). False for a surplus block
// (the grid bounds the tile count from shapes).
struct PrefillTileRows {
  SeqBounds b;
  int64_t q0;    // the tile's first query row within the sequence
  int rows;      // its rows (at most prefill_rows)
  int64_t pos0;  // the position of its first row
};

__device__ __forceinline__ bool find_prefill_tile(const AttentionArgs& a, int64_t target, int rows,
                                                  PrefillTileRows& t) {
  if (target >= a.tile_start[a.num_seqs]) return false;
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.tile_start[mid] <= target) lo = mid;
    else hi = mid - 1;
  }
  // lo is the last s with tile_start[s] <= target: its count is > 0.
  const int found = static_cast<int>(target - a.tile_start[lo]);
  t.b = seq_bounds(a, lo);
  const int64_t tiles = (t.b.q_len + rows - 1) / rows;
  t.q0 = (tiles - 1 - found) * rows;
  t.rows = static_cast<int>(min(int64_t{rows}, t.b.q_len - t.q0));
  t.pos0 = t.b.kv_len - t.b.q_len + t.q0;
  return true;
}

// A tile of a sequence whose layout is bad: its rows of `head` become NaN
// (thread `tid` of `threads` writes its share).
__device__ __forceinline__ void poison_prefill_tile(const AttentionArgs& a, const PrefillTileRows& t, int head,
                                                    int tid, int threads) {
  const int Dv = a.v_head_dim;
  for (int idx = tid; idx < t.rows * Dv; idx += threads) {
    const int64_t token = t.b.q_begin + t.q0 + idx / Dv;
    if (token >= 0 && token < a.q_tokens) store_out(a, (token * a.num_heads + head) * Dv + idx % Dv, quiet_nan());
  }
}

inline constexpr int kWgmmaPrefillRows = 128;  // the wgmma prefill's tile: two warpgroups of 64 rows

// The prefill kernel on wgmma (attention_prefill_wgmma.cu) for a grid of
// (tiles of kWgmmaPrefillRows query rows, num_heads) blocks, a.prefill_rows
// == kWgmmaPrefillRows and the plan written. Applies where attention_prefill_wgmma_fits() says so;
// returns cudaErrorInvalidDeviceFunction where the build or the device has
// no wgmma.
bool attention_prefill_wgmma_fits(int head_dim, int v_head_dim);
cudaError_t launch_attention_prefill_wgmma(const AttentionArgs& a, dim3 grid, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
