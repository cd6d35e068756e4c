// The KV-cache write and causal attention of the CUDA backend, with the
// semantics of the Backend ops store_kv and attention (backend/backend.h,
// backend/reference_ops.h).
//
// Contract:
//  * Every tensor is on the device (Device::kCuda) and contiguous.
//    Activations are f32 or bf16: k and v of one dtype, q and out each
//    either (independently); both
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
//    [0, num_slots) writes nothing (a negative slot marks a padding token,
//    as backend.h allows; the engine passes no slot >= num_slots). If a
//    slot repeats, which row lands there is unspecified.
//  * attention: exactly the reference's semantics, with backend.h's edge
//    cases: sequence s owns query rows [q_start[s], q_start[s+1]) and reads
//    slots kv_slots[kv_start[s] .. kv_start[s+1]) in position order; query i
//    of a sequence with q_len queries and kv_len keys sits at position
//    kv_len - q_len + i and attends to keys j <= position (and position - j <
//    sliding_window when sliding_window > 0); a query at a negative position
//    (a padding sequence, q_len > kv_len) gets a zero row; kv_slots entries
//    past kv_start[num_seqs] are never read; query head h reads kv head h /
//    (num_heads / num_kv_heads). One launch serves any mix of prefill,
//    extend (queries over a cached prefix) and decode sequences. q and out
//    are each f32 or bf16 (independently). The number of sequences is
//    q_start.numel() - 1; the layout's contents are never copied to the host,
//    so they are not validated: rows of a sequence whose layout runs past
//    q or kv_slots, or that reads a slot outside [0, num_slots), are written
//    as NaN (all of that sequence's rows that share the offending key range,
//    per kv head), and rows that no sequence covers are unspecified (the
//    engine builds only valid layouts). Sequences with no queries are allowed.
//  * Limits: head_dim and v_head_dim in [1, 256] (any value, not only powers
//    of two), q tokens, kv_slots entries and cache rows below 2^31.
//  * Graph safety: the kernels launched, grids, split counts and scratch
//    sizes depend only on tensor shapes (T, num_seqs, kv_slots.numel(), head
//    dims), the cache dtype and the SM count; scratch (decode partials, the
//    prefill plan) comes from cuda_empty (the caching
//    allocator, stream-ordered reuse). Launches go to `stream` (the default
//    stream when null) and return at once; nothing synchronises, so both ops
//    can be captured in a CUDA graph and replayed with new layout contents
//    of the same shapes.
//  * Not batch invariant by default (nor is the rest of this backend): the
//    decode path's split count and the choice of path depend on the call's
//    shapes, so a row may differ in the last bits alone and in a batch;
//    CudaAttentionPath::kRowInvariant is. Each launch is
//    deterministic (fixed merge orders, no atomics): the same call gives the
//    same bits.
//
// Two kernels (attention_kernels.cu has the details), chosen per call from
// shapes and the cache dtype:
//  * every sequence to the decode kernel when the caches are f32 (an f32
//    cache asks for f32 accuracy, which the tensor-core prefill does not give:
//    the model tests compare f32 fixtures with the CPU backend at 1e-4), or
//    when the call is decode-like: T <= kDecodeMaxAverageRows * num_seqs and
//    T < num_seqs + kPrefillMinExtraRows (decode steps, padded graph
//    batches, short extends);
//  * otherwise both, per sequence: sequences with at most
//    kDecodeMaxAverageRows query rows go to the decode kernel, the others to
//    the prefill kernel (a small plan kernel lists their 64-row tiles on the
//    device). A continuous batch of decodes plus a prefill chunk runs the
//    chunk on the tensor cores and the decodes through split-KV.
// `path` forces one kernel for every sequence (tests run every path on every
// case, kDecodeCudaCores too; all are correct for any layout, only speed and
// rounding differ). Long
// prompts over f32 caches are slow (the decode kernel re-reads the keys for
// every 8 query rows): serve with bf16 caches.
//  * Decode (split-KV, "flash-decoding"): one block per (split, kv head,
//    sequence) serves all query rows and all query heads of the GQA group, so
//    a key/value row is read once per step; the blocks of one sequence's kv
//    heads are adjacent in the grid (its slots are read from DRAM once).
//    Vector rows (head dims multiples of 16 bytes) are gathered by slot with
//    cp.async into shared-memory stages (several tiles in flight per block,
//    the slots loaded ahead).
//    - bf16 caches with head dims that are multiples of 8, up to 128 (Llama,
//      Qwen, Mistral): tensor cores (mma.sync m16n8k16), the group's query
//      rows as the MMA's 16 rows, 64-key tiles (16 keys per warp), two
//      stages and three blocks per SM with a bf16 q (three stages, two
//      blocks with an f32 q). Scores are q . k scaled afterwards, an f32 q
//      and the probabilities split into bf16 high and low parts (two MMAs
//      each), so with bf16 K/V the result keeps ~16 mantissa bits: errors
//      ~1e-5 relative, scores, softmax and sums f32.
//    - otherwise (f32 caches, head dims over 128 or not multiples of 8): CUDA
//      cores, f32 arithmetic (error vs the reference ~1e-6 relative with f32
//      data), staged through shared memory when rows are 16-byte vectors,
//      plain (scalar) loads otherwise.
//    Each sequence's visible keys are cut on the device into `splits` chunks,
//    splits chosen on the host from shapes to fill the chip (batch 1 x 4096
//    keys x 8 kv heads: 32 splits; none once the unsplit blocks cover every
//    SM; a split keeps at least ~64 keys); partials (max, sum, output) are
//    merged by a second kernel, skipped when splits is 1. The tensor-core
//    decode kernel and the combine are programmatic dependent launches: the
//    decode kernel reads the layout and its first slots before it waits for
//    the kernel that wrote q and the new keys, and lets the next kernel
//    launch only at its end (letting it in earlier measured slower at batch
//    8).
//  * Prefill (tensor cores), one block per tile of query rows of a sequence
//    and one query head; causal and window tiles skipped, fully visible
//    tiles unmasked. q, K, V and the probabilities are rounded to bf16 (an
//    f32 cache is converted while staged), so errors are ~1e-2 relative even
//    with f32 inputs; scores, softmax and sums are f32. Two kernels:
//    - bf16 caches with head dims that are multiples of 8 (up to 256) on an
//      sm_90a build on Hopper: warpgroup MMA (wgmma), 128-row tiles, two
//      warpgroups of 64 rows sharing K/V tiles of 128 keys (64 at head dim
//      256) gathered by slot with cp.async into two 128-byte-swizzled stages
//      (attention_prefill_wgmma.cu);
//    - otherwise (f32 caches, other dims or GPUs): FlashAttention-2 style
//      mma.sync m16n8k16, 64-row tiles, four warps, K/V tiles in four
//      shared-memory stages (converted from f32 caches while staged).
// Measured (bench/README.md, Llama-8B heads, bf16): decode reads 2.7-2.9
// TB/s at batch 32 / 256 x 4096 keys on an H100 (1.11-1.18x the kernel with
// three stages, the H200's 2.4-2.45 TB/s), 2.0-2.5 TB/s at 512 keys (on the
// H200 with an f32 q and the head dims compiled in: 2.7 TB/s at batch 64,
// 3.1 at 256 x 512 keys); a batch-1 call costs ~10-18 us of GPU time
// (512-4096 keys); prefill of a 4096-token prompt 345 TFLOP/s on wgmma (410
// at DeepSeek-V3's 192/128 dims; 92 and 63 on mma.sync), 0.71x PyTorch's
// FlashAttention at both shapes.
// What would make it faster: decode: it is bound by latency at two warps
// per scheduler with an f32 q (what the dense models pass), three with a
// bf16 one: more independent work per warp (the next tile's scores issued
// before this tile's softmax), a GQA group of 4 fills 4 of the MMA's 16
// rows (keys as the MMA's rows instead: fewer registers, so more warps), a
// swizzle instead of the padded rows for a fourth block per SM; and fewer
// fixed latencies per call at batch 1 (~11 us of GPU time for 512 keys,
// where the 2 MB read needs 0.5 us; folding the combine into the decode
// kernel as a last-block merge measured slower); prefill: a producer
// warpgroup (loads and stage hand-offs through mbarriers, no block barrier
// per tile) and the next tile's S issued before this tile's softmax, as
// FlashAttention-3 does; a per-sequence path choice in one launch (a long
// prompt in a decode-heavy batch goes through the decode kernel, correct
// but slow, unless the engine keeps chunked prefills in their own call); a
// paged page table.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

void cuda_store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                   cudaStream_t stream = nullptr);
// kAuto picks the path from shapes (above); the others force one (tests,
// benchmarks). decode_splits > 0 forces the decode path's split count
// (clamped to 1 .. 64; tests use it to run the combine kernel on every case).
// kDecodeCudaCores is kDecode on the CUDA-core decode kernels even where the
// tensor-core one applies. kRowInvariant (the backend's batch-invariant
// mode) sends every sequence to the decode kernel with one split and every
// pass's keys from 0 (a sliding window only masks), so each row's result
// depends on its own query, position and keys, not on what else the call
// holds: a decode row, the same row in a verification or in a prefill give
// the same bits. It gives up split-KV (a long context at a small batch
// runs on few blocks) and the prefill kernel (prompts run through the
// decode kernel's passes); decode_splits is ignored. kPrefill takes the
// wgmma prefill kernel where it applies; kPrefillMmaSync is kPrefill on the
// mma.sync kernel everywhere.
enum class CudaAttentionPath : uint8_t { kAuto, kDecode, kPrefill, kDecodeCudaCores, kRowInvariant, kPrefillMmaSync };
inline constexpr int64_t kDecodeMaxAverageRows = 4;
inline constexpr int64_t kPrefillMinExtraRows = 64;

void cuda_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
                    const AttentionParams& params, Tensor& out, cudaStream_t stream = nullptr,
                    CudaAttentionPath path = CudaAttentionPath::kAuto, int decode_splits = 0);

}  // namespace basalt
