// The CPU attention kernel over a paged KV cache.
//
// Contract: attention_f32 computes Backend::attention (backend/backend.h,
// semantics in backend/reference_ops.h) for f32 queries and f32 or bf16
// caches laid out [slot, kv_head, dim]. Arguments are trusted: CpuBackend has
// validated shapes, the layout and every slot. Scores, softmax and the value
// sum run in f32 with an online (streaming) softmax over blocks of keys, so
// memory use does not grow with the context. The key blocks start at
// multiples of their size in the sequence, and each query's state is updated
// alone, block by block in key order, so a query's result has the same bits
// whichever other rows and sequences share the call, however the work is
// split over threads, and whether its prompt was prefilled in one call or in
// chunks (batch invariance).
//
// Work is split into items of (sequence, kv head, block of query rows); one
// item serves all query heads of its GQA group so that each key and value
// row is converted once per group, not once per head. Items are handed out
// to the pool's threads dynamically, largest first, because causal rows near
// the end of a long prompt cost far more than those at its start.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace basalt::cpu {

struct AttentionArgs {
  const float* q = nullptr;  // [tokens, num_heads * head_dim]
  const void* k_cache = nullptr;
  DType k_dtype = DType::kF32;
  const void* v_cache = nullptr;
  DType v_dtype = DType::kF32;
  const int32_t* q_start = nullptr;   // [num_seqs + 1]
  const int32_t* kv_start = nullptr;  // [num_seqs + 1]
  const int32_t* kv_slots = nullptr;
  int64_t num_seqs = 0;
  AttentionParams params;
  float* out = nullptr;  // [tokens, num_heads * v_head_dim]
};

void attention_f32(ThreadPool& pool, const AttentionArgs& args);

}  // namespace basalt::cpu
