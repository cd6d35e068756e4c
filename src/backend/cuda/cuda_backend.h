// CudaBackend: the Backend op set on one NVIDIA GPU (built for sm_90a).
//
// Contract:
//  * Tensors are on the GPU (Device::kCuda) except where an op says
//    otherwise; empty() hands out blocks of the device cache (device.h).
//    Every op is enqueued on the backend's one stream, in call order; copy()
//    to the host waits for the stream, so anything read on the host after a
//    copy is complete.
//  * Activations: the residual stream, projections' outputs and logits are
//    f32, as on the CPU backend, so the same model code runs on both; the
//    activations that only feed linear layers are bf16 under bf16 weights
//    (activation_dtype), f32 otherwise. Weights keep their checkpoint dtype
//    (f32, bf16 or f16). linear() of decode sizes (up to 8 rows; up to 16
//    on layers under 16384 outputs) runs the GEMVs that stream the weights
//    once (skinny_linear, gemv_kernels.h); larger ones run cuBLASLt, after
//    rounding the activations to the weight's dtype where they differ; f32
//    accumulation and result either way (so results match the CPU backend
//    within bf16 rounding, not bit for bit).
//  * qkv_rope_store is one kernel (norms, rope, q out, K/V into the cache).
//    The row-wise kernels and the GEMVs are programmatic dependent launches
//    (element_types.cuh): each may start while the kernel before it ends.
//  * record() captures the ops into a CUDA graph (relaxed capture mode; the
//    ops' allocations come from the graph pool of device.h) and replays it
//    on the backend's stream.
//  * store_kv and attention work over the token-slot KV pool (f32 or bf16
//    caches) for any mix of prefill, extend and decode sequences in one call.
//  * sample(), adjust_logits(), top_k_rows(), gather_rows() and rank_rows()
//    run on the device (sampling.h): only the per-row controls and the edits
//    go up, one copy each, and nothing waits for the device. sample() follows
//    reference::sample exactly in every filter and in the random draw, but
//    sums masses in another order (exact integer sums of w * 2^44) and takes
//    exp in double rounded to f32: its token equals the CPU backend's except
//    where u * Z' (or top_p * Z, or a weight against min_p) falls within
//    about 1e-8 relative of a boundary; greedy rows always agree. softmax,
//    log_softmax and argmax run on the device.
//  * DeepSeek: moe_route runs on the device (moe.h: the CPU backend's ids,
//    but for near-ties within an f32 ulp of a selection boundary, and its
//    weights to about 1e-7 relative). linear_fp8_block quantizes the
//    activations per token in 1x128 groups, as DeepSeek-V3's inference
//    does, and multiplies in FP8 (fp8_linear.h: our weight-streaming kernel
//    for decode, cuBLASLt's block-scaled FP8 for prefill); it matches the
//    CPU backend (unquantized activations) within that quantization, not to
//    f32 rounding. moe_experts runs grouped GEMMs over the tokens each
//    expert gets (moe.h: bf16 or block-FP8 with activations quantized the
//    same way; no host round trip, so it records into graphs); each experts
//    span gets a device table of its weights once, kept by the backend (so
//    the weights must outlive the backend's use of them). The MLA ops run on
//    the device (mla.h: tensor-core attention core for bf16 caches at
//    DeepSeek's 512 + 64 dims, FP8 kv_b dequantized once to bf16).
//  * Fp8Compute::kW8A16 (weight-only FP8): linear_fp8_block and FP8
//    experts multiply by bf16 copies of the weights, dequantized once at
//    first use (dequantized.h), through the bf16 paths (the linear's
//    tensor-core GEMMs, the bf16 expert GEMMs): the activations are rounded
//    to bf16 as under a bf16 model, not quantized to e4m3, and every FP8
//    weight then takes 2 more bytes of device memory.
//  * Not batch invariant by default: cuBLASLt picks its algorithm by M, the
//    GEMVs their scheme by row count and attention its split count by
//    shapes. set_batch_invariant(true) (backend.h) makes every op compute a
//    row the same whatever the call holds: linear on the tensor-core GEMV's
//    arithmetic for any M (gemm.h: row_invariant_linear; bf16 or f16 weights
//    only, anything else throws), attention on the decode kernel unsplit
//    with keys from 0 (attention.h: kRowInvariant), MLA with its absorption
//    kernels at any T and an unsplit core (mla.h), the bf16 expert GEMMs as
//    they are (their tile sizes share one summation order), and block-FP8
//    weights only as w8a16 (w8a8 throws: the FP8 GEMMs choose kernels by
//    row count). The row-wise ops (norms, rope, routing, sampling) are
//    invariant as they are. The price: no split-KV and no prefill kernels
//    in attention, no cuBLASLt for large M (bench/README, "Batch-invariant
//    mode").
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"

namespace basalt {

class CudaDequantizedWeights;
class CudaFp8Linear;
class CudaMla;
class MoeExpertTables;
class ThreadPool;

// GPU time of one kind of op while profiling was on (CudaBackend::profile).
struct OpTime {
  std::string op;       // the op's name; linear layers also carry their shape, "linear 4096x14336"
  int64_t calls = 0;
  double ms = 0;        // GPU time between the events around the op's launches
  double bytes = 0;     // the fewest bytes the calls must move (inputs read once, outputs written once)
  double flops = 0;     // linear: 2 M N K per call; 0 for the others
};

class CudaBackend final : public Backend {
 public:
  // Runs on GPU `ordinal` (made current on the constructing thread); throws
  // basalt::Error when there is no such device.
  explicit CudaBackend(int ordinal = 0);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  int ordinal() const override { return ordinal_; }
  void make_current() override;
  cudaStream_t stream() const { return stream_; }
  void synchronize();

  Tensor empty(Shape shape, DType dtype) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void upload(const Tensor& src, Tensor& dst) override;
  std::unique_ptr<PendingDownload> download(const Tensor& src, Tensor& dst) override;
  // bf16 under bf16 weights; f32 otherwise (f16 weights keep the f32
  // activations, rounded once to f16 by the linear, rather than a double
  // rounding through bf16).
  DType activation_dtype(DType weights) const override {
    return weights == DType::kBF16 ? DType::kBF16 : DType::kF32;
  }
  std::unique_ptr<RecordedOps> record(const std::function<void()>& ops) override;
  bool can_record() const override { return true; }
  // Integer weight formats run on host backends only.
  bool supports(BackendOp op) const override { return op != BackendOp::kLinearInt; }
  Fp8Compute fp8_compute() const override { return fp8_compute_; }
  void set_fp8_compute(Fp8Compute mode) override { fp8_compute_ = mode; }
  bool batch_invariant() const override { return batch_invariant_; }
  void set_batch_invariant(bool on) override;

  // Op profiling for benchmarks: while on, every op is bracketed by two CUDA
  // events on the stream (which serialises nothing, but costs launches, so
  // profiled steps run a little slower than plain ones; recordings are made
  // without them). profile() waits for the stream and returns the totals per
  // op since profiling was turned on, in first-seen order, and clears them.
  void set_profiling(bool on);
  std::vector<OpTime> profile();

  // Whether cuBLASLt's plans for decode-sized calls are chosen by timing
  // (gemm.h; on by default). Affects plans made afterwards: benchmarks set
  // it before the first step.
  void set_gemm_tuning(bool on);
  GemmTuningStats gemm_tuning_stats() const;

 protected:
  void embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override;
  void rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                         Tensor& out) override;
  void rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) override;
  void store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                     Tensor& v_cache) override;
  void qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                           const Tensor& positions, const RopeParams& rope, int num_heads,
                           int num_kv_heads, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                           Tensor& q_out) override;
  void attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const AttentionLayout& layout, const AttentionParams& params,
                      Tensor& out) override;
  void silu_and_mul_impl(const Tensor& gate_up, Tensor& out) override;
  void add_impl(const Tensor& a, const Tensor& b, Tensor& out) override;
  void softmax_impl(const Tensor& x, Tensor& out) override;
  void log_softmax_impl(const Tensor& x, Tensor& out) override;
  void argmax_impl(const Tensor& logits, Tensor& out) override;
  void sample_impl(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) override;
  void adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) override;
  void apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) override;
  void top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) override;
  void gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override;
  void rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) override;
  void copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) override;

  void linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                             Tensor& out) override;
  void moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                      Tensor& ids, Tensor& weights) override;
  void moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                        std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) override;
  void mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                         const Tensor& positions, const RopeParams& rope, const Tensor& slots,
                         Tensor& cache) override;
  void mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                          const AttentionLayout& layout, const MlaParams& params,
                          Tensor& out) override;
  void mla_expand_kv_impl(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b,
                          const MlaParams& params, Tensor& k, Tensor& v) override;
  void concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) override;
  void moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) override;

 private:
  class Profiler;
  friend class OpScope;
  int ordinal_ = 0;
  uint32_t owner_ = 0;  // whose cached blocks its tensors use (device.h: CudaAllocationOwner)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CublasLt> blas_;
  std::unique_ptr<CudaFp8Linear> fp8_;
  std::unique_ptr<Profiler> profiler_;  // null while profiling is off
  std::unique_ptr<CudaMla> mla_;         // MLA state: cuBLAS handle, dequantized FP8 kv_b (mla.h)
  std::unique_ptr<MoeExpertTables> moe_tables_;
  Fp8Compute fp8_compute_ = Fp8Compute::kW8A8;
  bool batch_invariant_ = false;
  // Throws when the batch-invariant mode meets w8a8 FP8 weights.
  void check_fp8_invariance(const char* op) const;
  // kW8A16: bf16 copies of the FP8 weights, and of each FP8 experts span
  // (keyed by its first weight and size), made at first use.
  std::unique_ptr<CudaDequantizedWeights> dequantized_;
  std::map<std::pair<const void*, size_t>, std::vector<MoeExpert>> dequantized_experts_;
  // upload()'s pinned staging buffers, used in turn; each is reused once the
  // copy recorded by its event has run.
  struct Staging {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
  };
  static constexpr size_t kStagingBuffers = 4;
  Staging staging_[kStagingBuffers];
  size_t next_staging_ = 0;
  // Copies bytes from host memory (pageable or not) to the device through
  // the next staging buffer, memcpy'd by copy_pool's threads (the caller
  // alone when null); the DMA is queued on the stream, and the buffer is
  // reused once it has run.
  void stage_and_copy(const void* src, void* dst, size_t bytes, ThreadPool* copy_pool);
  std::unique_ptr<ThreadPool> copy_pool_;  // copy_staged_to_device's threads, made at its first use
  // copy() of a large host tensor (the weights at load): in chunks through
  // the staging buffers, so filling one overlaps the DMA of the others. A
  // pageable cudaMemcpy stages through the driver's own buffers one at a
  // time, 6.7 GB/s on the H200 machine against tens of GB/s for pinned DMA.
  void copy_staged_to_device(const void* src, void* dst, size_t bytes);
  static constexpr size_t kStagedCopyMinBytes = size_t{4} << 20;
  static constexpr size_t kStagedChunkBytes = size_t{16} << 20;
  // download()'s pinned buffers with their events, free for the next one
  // (a download takes one and gives it back once waited; any thread).
  class Download;
  struct Pinned {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
  };
  Pinned take_pinned(size_t bytes);
  void give_back_pinned(Pinned pinned);
  std::mutex pinned_mu_;
  std::vector<Pinned> free_pinned_;
};

}  // namespace basalt
