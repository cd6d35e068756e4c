// Launchers of the KV-cache store and attention kernels
// (attention_kernels.cu), with a plain interface: raw device pointers,
// element-type codes and sizes, so that the .cu file needs no host-library
// headers. attention.h is the checked API on top; call that instead.
//
// Contract: each launcher enqueues one kernel on `stream` and returns
// cudaGetLastError() (cudaSuccess when the launch was accepted). Sizes are
// trusted: the caller has checked shapes, dtypes, placement and the limits
// that attention.h states (head dims up to kAttentionMaxHeadDim, counts that
// fit in i32). The contents of slots and of the layout are not trusted: see
// attention.h for what a bad slot or layout does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

inline constexpr int kAttentionMaxHeadDim = 256;

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

// act: q's and out's type; cache: both caches' type (f32 or bf16).
cudaError_t attention(Elem act, Elem cache, const void* q, const void* k_cache, const void* v_cache,
                      const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                      const AttentionShape& shape, void* out, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
