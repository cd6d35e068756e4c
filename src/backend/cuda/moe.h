// Mixture-of-experts ops of the CUDA backend: the router and the experts.
//
// cuda_moe_route is Backend::moe_route (backend.h) on the device:
//  * logits f32 [T, E]; bias null or f32 [E]; ids i32 [T, top_k]; weights
//    f32 [T, top_k]; all on the device (Device::kCuda). Limits: E <= 256,
//    num_groups <= 32 (dividing E), top_k <= 32, besides the Backend's own
//    (0 < topk_groups <= num_groups, top_k <= topk_groups * E / num_groups).
//    Anything else throws basalt::Error before a launch. T = 0 launches
//    nothing.
//  * It computes the CPU backend's f32 arithmetic step for step (see
//    moe_kernels.cu), with exp taken in double and rounded to f32 and the
//    softmax denominator summed in double in another order. So its ids equal
//    the CPU backend's except where two candidates' scores lie within an f32
//    ulp or so of each other at a selection boundary, and its weights agree
//    to about 1e-7 relative (bit for bit wherever the scores do).
//  * Non-finite logits or bias give valid, distinct expert ids (a NaN choice
//    ranks as -inf) but an order the CPU backend need not share.
//  * Enqueued on `stream` (the default stream when null); nothing waits.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

void cuda_moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params, Tensor& ids,
                    Tensor& weights, cudaStream_t stream = nullptr);

// --- moe_experts ---------------------------------------------------------
//
// cuda_moe_experts is Backend::moe_experts (backend.h) on the device: out[t]
// = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), each expert
// silu(x · gateᵀ) * (x · upᵀ) · downᵀ over the tokens routed to it.
//  * x f32 or bf16 [T, H]; ids i32 [T, k]; weights f32 [T, k]; out f32
//    [T, H], not overlapping x; all on the device. The experts come as a
//    MoeExpertTable (below). Checked on the host; a mismatch throws
//    basalt::Error before a launch. T = 0 launches nothing.
//  * Pipeline (moe_gemm_kernels.h), all enqueued on `stream` with no host
//    synchronisation, so it can be recorded in a CUDA graph: a permutation
//    kernel sorts the T * k (token, slot) pairs by expert and cuts each
//    expert's rows into tiles of tile_m rows (16, 64 or 128, by the mean rows
//    per used expert; FP8 on Hopper 16, 64, or above 64 the 192 of the
//    TMA-fed kernel); grouped GEMM 1 computes gate and up of each tile's
//    rows (gathered from x) with silu(gate) * up in its epilogue; grouped
//    GEMM 2 applies down; an un-permutation sums each token's k rows in slot
//    order (no atomics: out is the same bits on every run).
//  * Block-FP8 experts (every matrix e4m3 with 128x128 scale_inv): x is
//    quantized per token in 1x128 groups (fp8.h's rule), and so is the f32
//    result of GEMM 1 before GEMM 2, as DeepSeek's inference does; each
//    128-K block's e4m3 products are summed on the tensor cores and added to
//    the f32 accumulator times act_scale * weight_scale. So the result
//    differs from the CPU backend's (which keeps activations in f32) by the
//    activations' e4m3 rounding, at most 2^-4 relative per element. On
//    Hopper above 16 rows an expert the sums run on wgmma, whose FP8 adds keep
//    about 14 bits (fixed point, aligned to the largest product): a further
//    ~3e-3 relative (L2) against exact sums of the same products, what
//    DeepGEMM and DeepSeek-V3's own inference compute (moe_gemm_kernels.h).
//  * bf16 experts: x (if f32) and GEMM 1's result are rounded to bf16, the
//    operands of bf16 mma; f32 accumulation.
//  * Any other experts (f32 or f16 weights, mixed dtypes, H or I with rows
//    not a multiple of 16 bytes): a generic path, f32 activations and sums
//    with weights dequantized to f32, as the CPU backend computes.
//  * An id outside [0, E) contributes nothing (the CPU backend throws; the
//    device cannot without a round trip).
//  * Limits: E <= 4096, T * k < 2^31; H, I > 0.

// The experts of one moe_experts span in device memory, built once.
struct MoeExpertTable {
  enum class Path { kBf16, kFp8, kGeneric };
  Tensor entries;  // the device table (cuda_kernels::MoeExpertPtrs [E]) as raw bytes
  // TMA descriptors of every expert's gate, up and down ([E][3]
  // TmaDescriptor as raw bytes) for the TMA-fed FP8 GEMM; set on the FP8
  // path of an sm_90a build on Hopper, undefined otherwise.
  Tensor weight_maps;
  int64_t experts = 0, hidden = 0, inter = 0;
  Path path = Path::kGeneric;
  std::vector<uint64_t> signature;  // every pointer, dtype and shape of the span
  bool written = false;             // filled by kernels outside a graph capture
};

// Tables of the spans a backend has seen, keyed by the span's first weight
// pointer and size, checked against the whole span's signature on every use
// (a freed and reallocated span at the same address is rebuilt). A table
// built while `stream` is being captured is filled by kernels recorded into
// the graph, and filled again by the next call outside a capture.
class MoeExpertTables {
 public:
  const MoeExpertTable& get(std::span<const MoeExpert> experts, cudaStream_t stream);

 private:
  std::map<std::pair<const void*, size_t>, MoeExpertTable> tables_;
};

// Benchmark and test controls (the backend uses the defaults).
struct MoeOptions {
  int fp8_mma = -1;    // cuda_kernels::MoeMmaMode of the FP8 path; -1: the default
  int tile_m = 0;      // 16, 64, 128 or 192 (the TMA-fed wgmma only); 0: by the mean rows per used expert
  bool generic = false;  // the generic path whatever the experts
  // Expert parallelism (Backend::moe_experts' first_expert): the table holds
  // experts [first_expert, first_expert + E) of the model, ids name the
  // model's experts, and pairs routed elsewhere are skipped.
  int32_t first_expert = 0;
};
// When given, events recorded at the stage boundaries: [0] start, [1] after
// the permutation and the activations' quantization (or bf16 rounding), [2]
// after GEMM 1, [3] after the quantization of GEMM 1's result, [4] after
// GEMM 2, [5] after the un-permutation.
struct MoeStageEvents {
  cudaEvent_t at[6];
};

void cuda_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExpertTable& table,
                      Tensor& out, cudaStream_t stream = nullptr, const MoeOptions& options = {},
                      const MoeStageEvents* events = nullptr);

// cuda_moe_combine is Backend::moe_combine (backend.h) on the device, the
// experts' un-permutation kernel on rows that came from elsewhere: out[t] =
// sum over j in order of weights[t, j] * rows[positions[t, j]] (negative
// positions skipped). rows f32 [P, H]; positions i32 [T, k]; weights f32
// [T, k]; out f32 [T, H]; all on the device. Positions are not read on the
// host: the caller has checked them. Enqueued on `stream`; nothing waits.
void cuda_moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out,
                      cudaStream_t stream = nullptr);

}  // namespace basalt
