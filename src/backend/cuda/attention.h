// The KV-cache write and causal attention of the CUDA backend, with the
// semantics of the Backend ops store_kv and attention (backend/backend.h,
// backend/reference_ops.h).
//
// Contract:
//  * Every tensor is on the device (Device::kCuda) and contiguous.
//    Activations (k, v, q, out) are f32 or bf16, one dtype per call; both
//    caches are f32 or bf16, one dtype for the two. slots and the layout's
//    tensors are i32 [n]. Caches are [num_slots, row] (or any shape whose
//    first dimension is num_slots and whose other dimensions multiply to
//    row), row = num_kv_heads * head_dim for keys and num_kv_heads *
//    v_head_dim for values. Shapes, dtypes, placement and params are checked
//    on the host and a mismatch throws basalt::Error before anything is
//    launched.
//  * store_kv: k_cache[slots[t]] = k[t], v_cache[slots[t]] = v[t], converted
//    to the cache dtype (rounded to nearest even into bf16). The slots are not
//    read back to the host (that would cost a synchronisation, and the engine
//    captures these calls in CUDA graphs): a token whose slot lies outside
//    [0, num_slots) writes nothing. The engine never passes such a slot. If a
//    slot repeats, which row lands there is unspecified.
//  * attention: exactly the reference's semantics. Sequence s owns query rows
//    [q_start[s], q_start[s+1]) and reads slots kv_slots[kv_start[s] ..
//    kv_start[s+1]) in position order; query i of a sequence with q_len
//    queries and kv_len keys sits at position kv_len - q_len + i and attends
//    to keys j <= position (and position - j < sliding_window when
//    sliding_window > 0); query head h reads kv head h / (num_heads /
//    num_kv_heads). One launch serves any mix of prefill, extend (queries over
//    a cached prefix) and decode sequences. The number of sequences is
//    q_start.numel() - 1; the layout's contents are never copied to the host,
//    so they are not validated: a query row whose sequence has more queries
//    than keys, whose layout runs past kv_slots, or that reads a slot outside
//    [0, num_slots), is written as NaN (the engine builds only valid layouts).
//    Sequences with no queries are allowed.
//  * Limits: head_dim and v_head_dim in [1, 256] (any value, not only powers
//    of two), q tokens, kv_slots entries and cache rows below 2^31.
//  * Arithmetic: scores, softmax and the weighted sum of values in f32, with a
//    streaming (online) softmax; a bf16 output is the f32 result rounded once.
//  * Batch invariance: each output row is computed by one thread block whose
//    operations depend only on that row's own keys (the split of the keys over
//    warps is fixed by the key index, and the merge order is fixed), so a row
//    gets the same bits alone or in any batch, and whether its prompt was
//    prefilled in one call or in chunks.
//  * Launches go to `stream` (the default stream when null) and return at
//    once; nothing here synchronises, so both ops can be captured in a graph.
//
// Kernel design (attention_kernels.cu): one thread block of 8 warps per
// (query row, kv head, up to 8 query heads of that kv head's GQA group), so a
// key row read once serves the whole group. The warps split the row's keys
// round-robin; a warp reads one key and value row at a time straight from the
// cache (coalesced: lane l holds features l, l + 32, ...), reduces the dot
// products with warp shuffles, and keeps its own online-softmax state in
// registers; the eight states are merged through shared memory at the end.
// What would make it faster, in order of payoff:
//  * Split-K (FlashDecoding) for decode: with few sequences and long contexts
//    the grid has only batch * kv_heads blocks; split each row's keys over
//    several blocks and merge the partial (max, sum, output) in a second
//    kernel (deterministically, to stay batch-invariant).
//  * Prefill/extend: one block per tile of query rows (e.g. 64 rows x group
//    heads) sharing key/value tiles staged in shared memory (cp.async / TMA),
//    with the QK^T and PV products on tensor cores (mma.sync / wgmma on
//    sm_90a), FlashAttention-2/3 style, and causal tiles skipped. Today each
//    query row re-reads its keys from L2.
//  * Vectorised 16-byte loads of key/value rows and several keys in flight
//    per warp (fewer shuffles per key), and paged (page-table) slots once the
//    engine's pool is paged on the device.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

void cuda_store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                   cudaStream_t stream = nullptr);
void cuda_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
                    const AttentionParams& params, Tensor& out, cudaStream_t stream = nullptr);

}  // namespace basalt
