#include "app/parallel_flags.h"

#include "app/device_choice.h"

#include <algorithm>
#include <chrono>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/tensor_parallel.h"
#include "runtime/kv_pool.h"
#ifdef BASALT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#endif
#ifdef BASALT_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

namespace basalt {

void add_parallel_flags(CLI::App& cmd, ParallelFlags& flags) {
  cmd.add_option("--tp,--tensor-parallel-size", flags.tp,
                 "Tensor parallelism: run the model over this many ranks (heads, MLP slices and vocabulary split; "
                 "DeepSeek's routed experts split whole; on the CPU the ranks are threads of this process sharing "
                 "--threads) (default 1)");
  cmd.add_option("--ep,--expert-parallel-size", flags.ep,
                 "Expert parallelism: the ranks DeepSeek's routed experts are split over; they are the --tp ranks, so "
                 "give the same number or leave it out");
  cmd.add_flag("--random-weights", flags.random_weights,
               "Random weights in the shapes of the model directory's config.json (no weight files read): to "
               "benchmark a model at full size where its weights are not at hand; it answers garbage");
  cmd.add_flag("--dp-attention", flags.dp_attention,
               "DeepSeek: DP attention over the --tp ranks: each rank holds the whole model but the routed experts "
               "(and, with --moe-dense-tp-size, the dense MLPs and shared experts), "
               "with a scheduler, radix cache and latent cache of its own and a share of the requests; tokens reach "
               "their experts by all-to-all (SGLang's --enable-dp-attention)");
  cmd.add_option("--dp-moe", flags.dp_moe,
                 "With --dp-attention, how tokens reach the routed experts: 'exchange' (each token's choices go to "
                 "their experts' ranks and back, all-to-all sized per layer) or 'gather' (every rank's rows are "
                 "all-gathered, each rank runs its experts on all of them, a reduce-scatter sums; sizes fixed per "
                 "step, as SGLang's DP attention without DeepEP) (default exchange)")
      ->check(CLI::IsMember({"exchange", "gather"}));
  cmd.add_option("--moe-dense-tp-size", flags.moe_dense_tp_size,
                 "With --dp-attention, the ranks DeepSeek's dense-layer MLPs and shared experts are split over: "
                 "--tp (each rank holds and reads 1/N of them; needs --dp-moe gather, where it is the default) or 1 "
                 "(whole on every rank, the default with --dp-moe exchange), as SGLang's option of that name")
      ->check(CLI::PositiveNumber);
}

void check_parallel_flags(const ParallelFlags& flags, const std::string& speculative_algorithm) {
  BASALT_CHECK(flags.tp >= 1 && flags.tp <= 64, "--tp must be in [1, 64], got {}", flags.tp);
  BASALT_CHECK(flags.ep == 0 || flags.ep == flags.tp,
               "--ep {}: the routed experts are split over the --tp ranks ({}); give --ep {} or leave it out",
               flags.ep, flags.tp, flags.tp);
  BASALT_CHECK(flags.dp_attention || flags.dp_moe == "exchange",
               "--dp-moe {} applies to --dp-attention only; give --dp-attention or leave --dp-moe out", flags.dp_moe);
  BASALT_CHECK(flags.dp_attention || flags.moe_dense_tp_size == 0,
               "--moe-dense-tp-size applies to --dp-attention only (under --tp alone the dense layers are split "
               "over the --tp ranks); give --dp-attention or leave it out");
  if (!flags.dp_attention) return;
  BASALT_CHECK(flags.tp >= 2, "--dp-attention runs over the --tp ranks: give --tp 2 or more");
  BASALT_CHECK(flags.moe_dense_tp_size == 0 || flags.moe_dense_tp_size == 1 || flags.moe_dense_tp_size == flags.tp,
               "--moe-dense-tp-size {}: the dense layers are split over every --tp rank ({}) or held whole (1)",
               flags.moe_dense_tp_size, flags.tp);
  BASALT_CHECK(!(flags.moe_dense_tp_size == flags.tp && flags.dp_moe != "gather"),
               "--moe-dense-tp-size {} splits the dense layers over the ranks, which runs with --dp-moe gather "
               "only; give --dp-moe gather or --moe-dense-tp-size 1",
               flags.tp);
  // n-gram drafts need nothing but the ranks' own forward passes (a
  // verification is a batch like any other), and the MTP layer's passes
  // meet in the expert exchanges as the steps do (model/data_parallel.h);
  // an EAGLE head or a draft model beside each rank is not built.
  BASALT_CHECK(speculative_algorithm == "none" || speculative_algorithm == "ngram" || speculative_algorithm == "mtp",
               "--dp-attention --speculative-algorithm {}: EAGLE heads and draft models do not run over "
               "DP-attention ranks yet (ngram and mtp do)",
               speculative_algorithm);
}

namespace {

// Each rank multiplies bf16 weights as the caller's backend does (--dtype).
RankBackendFactory cpu_ranks(int ranks, cpu::Bf16Activations bf16_activations) {
  const int per_rank = std::max(1, ThreadPool::global().size() / ranks);
  return [per_rank, bf16_activations](int) { return make_cpu_backend_with_threads(per_rank, bf16_activations); };
}

#ifdef BASALT_HAVE_CUDA
// GPU ranks: rank r on the r-th GPU from the caller's backend's, one thread
// each, NCCL between them; every rank multiplies FP8 weights as the
// caller's backend does (--fp8-compute) and is batch invariant when it is
// (--batch-invariant).
struct GpuRanks {
  RankBackendFactory make_backend;
  RankGroupFactory make_group;
};

GpuRanks gpu_ranks(int ranks, const Backend& backend) {
  const int gpus = cuda_device_count();
  BASALT_CHECK(ranks <= gpus, "--tp {} --device cuda: this machine has {} GPU{}", ranks, gpus, gpus == 1 ? "" : "s");
  GpuRanks out;
  const int base = backend.ordinal();
  const Fp8Compute fp8 = backend.fp8_compute();
  const bool invariant = backend.batch_invariant();
  out.make_backend = [base, gpus, fp8, invariant](int r) {
    auto rank = std::make_unique<CudaBackend>((base + r) % gpus);
    rank->set_fp8_compute(fp8);
    rank->set_batch_invariant(invariant);
    return rank;
  };
#ifdef BASALT_HAVE_NCCL
  out.make_group = [](std::span<Backend* const> backends) {
    std::vector<CudaBackend*> ranks;
    for (Backend* b : backends) ranks.push_back(dynamic_cast<CudaBackend*>(b));
    return make_nccl_group(ranks);
  };
#endif
  return out;
}
#endif

}  // namespace

std::unique_ptr<Model> load_model_for_tp(const std::string& dir, Backend& backend, const ParallelFlags& flags,
                                         const LoadProgress& progress, int graph_batch) {
  const int tp = flags.tp;
  BASALT_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got {}", tp);
  if (tp == 1) return load_model(dir, backend, progress, {}, flags.weights());
  if (backend.device() == Device::kCpu)
    return load_tensor_parallel(dir, tp, cpu_ranks(tp, cpu_bf16_activations(backend)), progress, nullptr, {},
                                flags.weights());
#ifdef BASALT_HAVE_CUDA
  const GpuRanks gpus = gpu_ranks(tp, backend);
  return load_tensor_parallel(
      dir, tp, gpus.make_backend, progress, &backend, gpus.make_group, flags.weights(),
      graph_batch > 0 ? std::optional<GraphOptions>(GraphOptions{.max_batch = graph_batch}) : std::nullopt);
#else
  fail("--tp {} --device {}: this build has no GPU backend", tp, backend.name());
#endif
}

DpAttentionEngines DpAttentionEngines::load(const std::string& dir, const ParallelFlags& flags,
                                            const Backend& backend, const LoadProgress& progress, int graph_batch) {
  DpAttentionEngines out;
  if (backend.device() == Device::kCpu) {
    out.model = load_data_parallel(dir, flags.tp, cpu_ranks(flags.tp, cpu_bf16_activations(backend)), progress,
                                   std::chrono::microseconds(1000), flags.weights(), {}, flags.moe(), std::nullopt,
                                   flags.dense_tp());
    return out;
  }
#ifdef BASALT_HAVE_CUDA
  const GpuRanks gpus = gpu_ranks(flags.tp, backend);
  out.model = load_data_parallel(
      dir, flags.tp, gpus.make_backend, progress, std::chrono::microseconds(1000), flags.weights(), gpus.make_group,
      flags.moe(),
      graph_batch > 0 ? std::optional<GraphOptions>(GraphOptions{.max_batch = graph_batch}) : std::nullopt,
      flags.dense_tp());
  return out;
#else
  fail("--dp-attention --device {}: this build has no GPU backend", backend.name());
#endif
}

void DpAttentionEngines::start(const Tokenizer* tokenizer, EngineOptions options) {
  const int ranks = model->world();
  // The KV budget (slots or bytes) is a device's: ranks sharing a device
  // (CPU ranks; GPU ranks on fewer GPUs) split it.
  const Backend& first = model->backend(0);
  int sharing = 0;
  for (int r = 0; r < ranks; ++r)
    sharing += model->backend(r).device() == first.device() && model->backend(r).ordinal() == first.ordinal();
  if (options.kv_slots > 0) options.kv_slots = std::max<int64_t>(options.kv_slots / sharing, options.page_size);
  if (options.kv_slots == 0) {
    const size_t budget = options.kv_budget_bytes > 0 ? options.kv_budget_bytes : KvPool::host_memory_budget(0.1);
    options.kv_budget_bytes = std::max<size_t>(budget / static_cast<size_t>(sharing), 1);
  }
  std::vector<std::unique_ptr<Engine>> made;
  for (int r = 0; r < ranks; ++r) {
    // CPU ranks sample on a one-thread backend of the engine's own; a GPU
    // rank's logits stay on its device and are sampled there.
    Backend* sampling = &model->backend(r);
    if (sampling->device() == Device::kCpu) {
      samplers.push_back(make_cpu_backend_with_threads(1));
      sampling = samplers.back().get();
    }
    made.push_back(std::make_unique<Engine>(model->rank(r), *sampling, tokenizer, options));
  }
  engines = std::make_unique<EngineGroup>(std::move(made));
  model->set_activity([group = engines.get()](int r) { return group->engine(r).load() > 0; });
}

DpAttentionEngines::~DpAttentionEngines() {
  if (model) model->set_activity({});  // before the engines it asks go
}

}  // namespace basalt
