// The backend behind --device: "cpu" everywhere, "cuda" in builds with the
// CUDA backend (a clear error otherwise, and when no GPU is present).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/linear.h"
#include "model/model.h"

namespace basalt {

// threads > 0 sizes the CPU backend's thread pool (--threads); 0 keeps the
// default (BASALT_NUM_THREADS, else one per hardware thread). A malformed
// BASALT_NUM_THREADS is an error, not silently the default.
std::unique_ptr<Backend> make_backend(const std::string& device, int threads = 0);
// --fp8-compute: how block-FP8 weights multiply (Backend::fp8_compute).
// "auto" keeps the device's default (w8a8 on a GPU, as DeepSeek-V3's
// inference; w8a16 on the CPU); "w8a8" quantizes the activations, "w8a16"
// keeps them (weight-only); a mode the backend lacks (w8a8 on the CPU) or
// anything else throws. check_fp8_compute checks the same for a --device
// before any backend exists.
void check_fp8_compute(const std::string& choice, const std::string& device);
void apply_fp8_compute(const std::string& choice, Backend& backend);
// --batch-invariant: every row computed the same whatever the step holds
// (Backend::batch_invariant), so greedy output does not depend on the batch,
// on chunking or on speculation. The CPU always is; on a GPU it turns on the
// CUDA backend's batch-invariant kernels (slower: bench/README.md), and
// block-FP8 weights then multiply as w8a16 ("auto" becomes w8a16; "w8a8"
// with it throws), and tensor-parallel GPU ranks are refused (NCCL's sums
// follow the message size). Call after apply_fp8_compute;
// check_batch_invariant checks the flags before any backend exists.
inline constexpr const char* kBatchInvariantHelp =
    "Compute every token the same whatever else the step holds (batch, prefill chunking, speculative "
    "verification), so greedy output is reproducible and speculation never changes it; the CPU always does, a "
    "GPU runs slower kernels for it (block-FP8 weights multiply as w8a16)";
void check_batch_invariant(bool on, const std::string& fp8_choice, const std::string& device,
                           bool tensor_parallel);
void apply_batch_invariant(bool on, const std::string& fp8_choice, Backend& backend);
// --dtype: what bf16 weights multiply with. "bfloat16" rounds the
// activations to bf16 (core/bf16_product.h; on a GPU the tensor cores do the
// same), "float32" keeps them f32 on the CPU (exact up to f32 sums; slower
// where vdpbf16ps does two products per instruction), "auto" is bfloat16 on
// a GPU and on CPU builds with AVX-512 BF16, float32 on other CPU builds
// (cpu::auto_bf16_activations: there the rounded form is an emulation, and
// the slower one); a GPU has no float32 mode, and anything else throws. Weights in other dtypes always meet f32
// activations. check_dtype checks a --device before any backend exists;
// cpu_bf16_activations is the mode a CPU backend runs (its TP and DP ranks
// take the same).
inline constexpr const char* kDtypeHelp =
    "What bf16 weights multiply with: bfloat16 rounds the activations to bf16, as GPU matmuls and llama.cpp "
    "do; float32 keeps them f32 (CPU only: exact); auto is bfloat16 on a GPU and on CPUs whose build has "
    "AVX-512 BF16, float32 on other CPUs (the faster of the two there). Other weight dtypes always meet f32 "
    "activations (default auto)";
void check_dtype(const std::string& choice, const std::string& device);
void apply_dtype(const std::string& choice, Backend& backend);
cpu::Bf16Activations cpu_bf16_activations(const Backend& backend);
// make_backend with --fp8-compute, --batch-invariant and --dtype applied, in
// the order their contracts ask (what serve and generate run on).
std::unique_ptr<Backend> make_flagged_backend(const std::string& device, int threads, const std::string& fp8_compute,
                                              bool batch_invariant, const std::string& dtype);
// The KV pool's memory budget on that device: `fraction` of host memory for
// the CPU, of the memory still free for the GPU (call after loading weights).
// A fraction <= 0 picks the device's default: 0.1 of host memory on the CPU
// (shared with everything else on the machine), 0.8 of the free GPU memory
// (the GPU serves this one model; vLLM's default takes 0.9 of all of it).
size_t kv_budget_bytes(const std::string& device, double fraction);
// The KV cache dtype for --kv-cache-dtype: "auto" is bf16 on a GPU (the
// precision its attention multiplies in, half the memory and traffic) and
// f32 on the CPU; "bf16" and "f32" are taken as given; anything else throws.
DType kv_cache_dtype(const std::string& choice, const Backend& backend);
// Jump-forward for --jump-forward / --no-jump-forward (at most one given):
// on by default on a GPU, where a step that verifies the forced text costs
// about what a decode step costs; off by default on the CPU, where each of
// its rows costs compute (bench/README.md has both figures).
bool jump_forward_choice(bool on, bool off, const Backend& backend);
// SpeculativeOptions::adaptive_from_batch for the device: 1 on the CPU (each
// draft row costs compute), 16 on a GPU, where a few more rows per request
// cost almost nothing at small batches (bench/README.md: the H200 copy
// workload at batch 1 gives 2.17x capped at nothing, 1.56x capped; at batch
// 64 jump-forward gives 0.82x uncapped, 0.88x capped; 16 lies between).
int adaptive_drafts_from_batch(const Backend& backend);
// "cpu" or "cpu, cuda": what this build offers, for --help texts.
const char* available_devices();

}  // namespace basalt
