// CpuBackend: the reference-quality, all-cores implementation of the Backend op set.
//
// Contract: implements every op of backend/backend.h for host tensors with f32
// activations and f32/bf16/f16 (and block-FP8) weights, using the ThreadPool it is given and
// AVX-512/AVX2 where the compiler targets them (scalar code otherwise). Results
// match the scalar references in backend/reference_ops.h within float
// rounding, except that linear ops on bf16 weights (linear, the MoE experts)
// round the activations to bf16 by default (core/bf16_product.h: the
// definition they reproduce bit for bit); set_bf16_activations(kF32) keeps
// them f32 (`--dtype float32`), which the reference's tolerance then holds.
// Thread-safe only in the sense that distinct CpuBackend calls on distinct
// tensors may run from one thread at a time (the pool is shared).
//
// Every op is batch-invariant (Backend's "Batch invariance"): a token's
// output row has the same bits whatever the other rows of the call, the
// token count, the pool's thread count and the chunking of work. linear,
// linear_fp8_block, the MoE experts and mla_expand_kv sum every output
// element in one fixed order set by K alone (K-blocks of at most 1024
// columns, one vector accumulator per block, a fixed horizontal sum, block
// sums left to right; bf16 weights in the default mode: core/bf16_product.h's
// order over the whole row) in both the few-token and the many-token kernels, and
// block-FP8 weights dequantize to the same f32 values in both; so grouping
// tokens by expert changes nothing. attention runs its online softmax over
// key blocks aligned to multiples of 64 in the sequence, and mla_attention
// works per (token, head) over all its keys, so a query's result is the same
// alone, among other sequences, or with its prompt prefilled in chunks. The
// row-wise ops (norms, rope, activations, softmax, argmax, sample, routing)
// work on each row alone. backend/cpu/cpu_batch_invariance_test.cc checks
// all of this bit for bit.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cpu/linear.h"
#include "core/thread_pool.h"

namespace basalt {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(ThreadPool* pool = &ThreadPool::global(),
                      cpu::Bf16Activations bf16_activations = cpu::Bf16Activations::kRounded)
      : pool_(pool), bf16_activations_(bf16_activations) {}

  // How linear ops take bf16 weights (cpu/linear.h); set before the first op.
  void set_bf16_activations(cpu::Bf16Activations mode) { bf16_activations_ = mode; }
  cpu::Bf16Activations bf16_activations() const { return bf16_activations_; }

  std::string_view name() const override { return "cpu"; }
  // Every kernel computes a row the same way whatever the call holds.
  bool batch_invariant() const override { return true; }
  Device device() const override { return Device::kCpu; }
  Tensor empty(Shape shape, DType dtype) override { return Tensor::empty(std::move(shape), dtype); }
  void copy(const Tensor& src, Tensor& dst) override;

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

  // DeepSeek V2/V3 ops (moe.cc, mla.cc).
  void linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                             Tensor& out) override;
  void linear_int_impl(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out) override;
  void prepare_int_weight_impl(LinearWeight& w) override;
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
  ThreadPool* pool_;
  cpu::Bf16Activations bf16_activations_;
};

// A CPU backend with a pool of `threads` threads of its own (at least one),
// for ranks that run side by side in one process (model/tensor_parallel.h)
// and must not share, or wait on, the global pool.
std::unique_ptr<Backend> make_cpu_backend_with_threads(
    int threads, cpu::Bf16Activations bf16_activations = cpu::Bf16Activations::kRounded);

}  // namespace basalt
