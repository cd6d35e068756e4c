// Launchers of the KV-cache store and attention kernels
// (attention_kernels.cu), with a plain interface: raw device pointers,
// element-type codes and sizes, so that the .cu file needs no host-library
// headers. attention.h is the checked API on top; call that instead.
//
// Contract: each launcher enqueues its kernels on `stream` and returns
// cudaGetLastError() (cudaSuccess when the launches were accepted). Sizes are
// trusted: the caller has checked shapes, dtypes, placement and the limits
// that attention.h states (head dims up to kAttentionMaxHeadDim, counts that
// fit in i32). The contents of slots and of the layout are not trusted: see
// attention.h for what a bad slot or layout does. Grids and split counts
// depend only on the sizes given here (never on device data), so every launch
// can be captured in a CUDA graph and replayed with other layout contents.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

inline constexpr int kAttentionMaxHeadDim = 256;
// The split-KV decode path splits each sequence's keys over at most this
// many blocks (the combine kernel's shared memory is sized for it).
inline constexpr int kAttentionMaxSplits = 64;

// k_cache[slots[t], :] = k[t, :] (k_width wide), v_cache[slots[t], :] = v[t, :]
// (v_width wide); act is k's and v's type, cache the caches' type (f32 or bf16).
cudaError_t store_kv(Elem act, Elem cache, const void* k, const void* v, const int32_t* slots, void* k_cache,
                     void* v_cache, int64_t tokens, int64_t k_width, int64_t v_width, int64_t num_slots,
                     cudaStream_t stream);

struct AttentionShape {
  int64_t q_tokens = 0;
  int num_seqs = 0;        // q_start and kv_start hold num_seqs + 1 entries
  int64_t kv_slots_len = 0;
  int64_t num_slots = 0;   // rows of each cache
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;
  float scale = 0.0f;
  int sliding_window = 0;
};

// The number of key splits the decode kernel uses for `shape` on the current
// device (1 .. kAttentionMaxSplits), from sizes only. When it is above 1 the
// decode kernel needs scratch: attention_decode_scratch_floats(shape, splits)
// f32 values.
int attention_decode_splits(Elem cache, Elem q, const AttentionShape& shape);
// How many blocks share a sequence's passes of query rows (1 for decode
// batches; up to 1024 when sequences average many rows), from sizes and the
// cache type only (the tensor-core decode kernel's passes are 16 rows).
int attention_decode_row_splits(Elem cache, const AttentionShape& shape);
int64_t attention_decode_scratch_floats(const AttentionShape& shape, int splits);
// The prefill grid's tile count for tiles of rows_per_tile query rows (a
// bound from sizes; surplus blocks exit).
int64_t attention_prefill_tiles(const AttentionShape& shape, int64_t decode_max_q, int rows_per_tile);
// Whether the prefill runs on the wgmma kernel for these operands (unless
// AttentionLaunch::prefill_mma_sync): bf16 caches, head dims multiples of 8,
// q and the caches 16-byte aligned, out 8-byte aligned, an sm_90a build on a
// Hopper GPU. Otherwise the mma.sync kernel runs.
bool attention_prefill_on_wgmma(Elem cache, const void* q, const void* k_cache, const void* v_cache, const void* out,
                                const AttentionShape& shape);

// What one attention call launches (attention.h explains the paths).
struct AttentionLaunch {
  bool decode = true;   // the split-KV decode kernel (and its combine when splits > 1)
  bool prefill = false;  // the plan and tensor-core prefill kernels
  // With both: sequences with q_len <= decode_max_q go to the decode kernel,
  // the others to prefill. With prefill alone, 0 (every sequence). Ignored
  // when only the decode kernel runs (it takes every sequence).
  int64_t decode_max_q = 0;
  int splits = 1;                   // attention_decode_splits(...) or a forced count
  // Decode on the CUDA-core kernels even where the tensor-core one applies
  // (bf16 caches, head dims multiples of 8 up to 128): benchmarks compare.
  bool decode_cuda_cores = false;
  // The prefill on the mma.sync kernel even where the wgmma one applies
  // (attention_prefill_on_wgmma): tests and benchmarks compare.
  bool prefill_mma_sync = false;
  // The decode kernels start every pass's keys at 0 (a sliding window only
  // masks): with splits 1, each row's sums then run over the same tiles
  // whatever the call holds.
  bool keys_from_zero = false;
  float* decode_scratch = nullptr;  // attention_decode_scratch_floats(...) f32 (null when splits is 1)
  int32_t* tile_starts = nullptr;   // prefill: num_seqs + 1 i32 of scratch
};

// q: q's type, out: out's type, cache: both caches' type (each f32 or bf16).
cudaError_t attention(Elem q_type, Elem out_type, Elem cache, const void* q, const void* k_cache, const void* v_cache,
                      const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                      const AttentionShape& shape, const AttentionLaunch& launch, void* out, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
