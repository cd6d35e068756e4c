// Multi-head latent attention (DeepSeek V2/V3) on the CUDA backend: the
// Backend ops mla_store_kv, mla_attention and mla_expand_kv (backend.h).
//
// Contract:
//  * Tensors are on the device and contiguous. kv_a is f32; norm_weight f32
//    or bf16; the cache f32 or bf16 [num_slots, L + R]; q f32 or bf16
//    [T, heads * (Dn + R)]; kv_b [heads * (Dn + Dv), L] in f32 or bf16, or
//    block FP8 (e4m3 with f32 scale_inv [ceil(N/128), ceil(K/128)]); out f32
//    (or bf16 under a bf16 / FP8 kv_b); k, v f32. Shapes, dtypes, placement
//    and params are checked on the host and a mismatch throws basalt::Error
//    before anything is launched. Slot and layout contents are never read
//    back (graph capture): mla_store_kv skips slots outside [0, num_slots)
//    (-1 marks padding); mla_expand_kv writes NaN rows for them; mla_attention
//    reads the layout as cuda_attention does (attention.h): padding rows
//    (negative positions) are 0, kv_slots entries past kv_start[num_seqs] are
//    ignored, a bad slot or layout gives NaN rows.
//  * Limits: L <= 512, R <= 256 and even, heads * (Dn + Dv) and T * heads
//    below 2^31. Any Dn, Dv.
//  * FP8 kv_b is dequantized once to bf16 (as SGLang keeps bf16 w_kc / w_vc)
//    and kept per weight by a CudaDequantizedWeights (dequantized.h: keyed
//    by the weight, which it keeps alive; a first use inside a graph capture
//    works and is never recorded).
//  * mla_attention (absorbed form) = three steps: q_lat(h) = q_nope(h) ·
//    W_uk(h) (cuBLAS strided-batched GEMM over heads, f32 accumulation,
//    written into q_full [T, heads, L + R] next to q_pe; for T <= 16 over a
//    bf16 kv_b one kernel that also copies q_pe), the attention core
//    (mla_kernels.cu: tensor cores for bf16 caches with L = 512, R = 64 and a
//    bf16 / FP8 kv_b, on wgmma where the GPU and build have sm_90a,
//    mla_wgmma_kernels.cu; q_full and the probabilities rounded to bf16: the
//    tests allow 2e-2 relative against the CPU backend; CUDA cores in f32
//    otherwise), then out(h) = o_lat(h) ·
//    W_uv(h)ᵀ (strided-batched GEMM; for T <= 16 over a bf16 kv_b one kernel,
//    a warp per W_uv row). Key splits (split-KV) and their merge
//    are chosen from shapes only.
//  * mla_expand_kv: the latent rows gathered by slot (in kv_b's compute
//    type), one GEMM with kv_bᵀ into f32, then split into k (with the cached
//    rope part) and v, rounded to their dtype (f32 or bf16; the model asks
//    for its cache's, and bf16 keys and values take the attention's
//    tensor-core prefill path).
//  * Every launch goes to the backend's stream; nothing synchronises it, and
//    grids and scratch sizes depend on shapes only, so all three ops can be
//    recorded in CUDA graphs. Not batch invariant by default (split counts
//    follow the call's shapes; set_row_invariant makes it so); each launch is
//    deterministic.
//  * Speed (H200, V3 decode, 4096 keys per sequence, bench/README.md): on
//    sm_90a the wgmma core (mla_wgmma_kernels.cu) runs at 44 / 213 / 239
//    TFLOP/s at batch 1 / 32 / 128, 1.2-1.6x the mma.sync core (37 / 140 /
//    152), which other GPUs and CudaMlaPath::kMmaSync use; at 128 heads MLA
//    decode is compute-bound and FlashMLA's anchor is ~660 TFLOP/s. What is
//    left: the two warpgroups wait on each other's P once per 64-key stage
//    instead of ping-ponging softmax under the other's GEMMs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/dequantized.h"
#include "core/tensor.h"

namespace basalt {

// Forces the attention core's path (tests, benchmarks); kAuto picks by
// dtype and dims as above, and on the tensor cores wgmma where it runs
// (sm_90a), mma.sync elsewhere; kMmaSync keeps the mma.sync kernel where the
// tensor cores serve the call.
enum class CudaMlaPath : uint8_t { kAuto, kCudaCores, kMmaSync };

class CudaMla {
 public:
  // Creates the cuBLAS handle (bound to `stream`) and its workspace.
  explicit CudaMla(cudaStream_t stream);
  ~CudaMla();
  CudaMla(const CudaMla&) = delete;
  CudaMla& operator=(const CudaMla&) = delete;

  void store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps, const Tensor& positions,
                const RopeParams& rope, const Tensor& slots, Tensor& cache);
  // splits > 0 forces the key split count (clamped to 1 .. 64).
  void attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b, const AttentionLayout& layout,
                 const MlaParams& params, Tensor& out, CudaMlaPath path = CudaMlaPath::kAuto, int splits = 0);
  void expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b, const MlaParams& params,
                 Tensor& k, Tensor& v);

  // Only the attention core of `attention` on an already built q_full
  // (benchmarks time it alone): q_full [T, heads, L + R], o_lat [T, heads, L].
  void attention_core(const Tensor& q_full, const Tensor& cache, const AttentionLayout& layout,
                      const MlaParams& params, Tensor& o_lat, CudaMlaPath path = CudaMlaPath::kAuto, int splits = 0);

  // Batch-invariant attention (the backend's mode): the absorption kernels
  // for any T (a bf16 or FP8 kv_b with Dn, L, Dv multiples of 8; anything
  // else throws) and the core unsplit, so each row's result depends on its
  // own query, position and keys alone (the core's key tiles start at 0
  // and rows are independent); `splits` is then ignored.
  void set_row_invariant(bool on) { row_invariant_ = on; }

 private:
  struct Weight {
    const void* data = nullptr;
    DType dtype = DType::kBF16;  // bf16 or f32: the GEMMs' operand type
  };
  Weight compute_weight(const LinearWeight& kv_b, int64_t rows, int64_t cols, const char* op);

  cudaStream_t stream_;
  void* blas_ = nullptr;  // cublasHandle_t
  void* workspace_ = nullptr;
  CudaDequantizedWeights dequantized_;
  bool row_invariant_ = false;
};

}  // namespace basalt
