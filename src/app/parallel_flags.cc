#include "app/parallel_flags.h"

#include "app/device_choice.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/node_link.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/multi_node.h"
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
  cmd.add_option("--dp,--dp-size", flags.dp,
                 "With --dp-attention, the DP groups the --tp ranks form, each with its own scheduler, radix cache "
                 "and requests: --tp (the default) gives each rank its own; fewer, and each group's --tp / --dp "
                 "ranks split its attention heads between them (SGLang's --dp with --enable-dp-attention)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--dp-moe", flags.dp_moe,
                 "With --dp-attention, how tokens reach the routed experts: 'exchange' (each token's choices go to "
                 "their experts' ranks and back, all-to-all sized per layer) or 'gather' (every rank's rows are "
                 "all-gathered, each rank runs its experts on all of them, a reduce-scatter sums; sizes fixed per "
                 "step, as SGLang's DP attention without DeepEP) (default exchange)")
      ->check(CLI::IsMember({"exchange", "gather"}));
  cmd.add_option("--moe-dense-tp-size", flags.moe_dense_tp_size,
                 "With --dp-attention, the ranks DeepSeek's dense-layer MLPs and shared experts are split over: "
                 "--tp (each rank holds and reads 1/N of them; needs --dp-moe gather, where it is the default) or "
                 "--tp / --dp, each DP group's ranks (1 with --dp at --tp: whole on every rank, the default with "
                 "--dp-moe exchange), as SGLang's option of that name")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--nnodes", flags.nnodes,
                 "Machines the --tp ranks span, --tp / --nnodes on each (tensor parallelism across machines; node 0 "
                 "runs the engine and the server, the others run only their ranks) (default 1)");
  cmd.add_option("--node-rank", flags.node_rank,
                 "This machine's place among the --nnodes: 0 for the one that serves, 1.. for the others, which run "
                 "the same command (default 0)");
  cmd.add_option("--dist-init-addr", flags.dist_init_addr,
                 "With --nnodes > 1, HOST:PORT where node 0 listens for the other nodes (they connect to it)");
  cmd.add_option("--dist-timeout", flags.dist_timeout,
                 "With --nnodes > 1, seconds to wait for every node to join (default 600)")
      ->check(CLI::PositiveNumber);
}

void check_parallel_flags(const ParallelFlags& flags, const std::string& speculative_algorithm) {
  BASALT_CHECK(flags.tp >= 1 && flags.tp <= 64, "--tp must be in [1, 64], got {}", flags.tp);
  BASALT_CHECK(flags.ep == 0 || flags.ep == flags.tp,
               "--ep {}: the routed experts are split over the --tp ranks ({}); give --ep {} or leave it out",
               flags.ep, flags.tp, flags.tp);
  BASALT_CHECK(flags.dp_attention || flags.dp_moe == "exchange",
               "--dp-moe {} applies to --dp-attention only; give --dp-attention or leave --dp-moe out", flags.dp_moe);
  BASALT_CHECK(flags.dp_attention || flags.dp == 0,
               "--dp {} applies to --dp-attention only (replicas of a model run as processes behind `basalt route`); "
               "give --dp-attention or leave --dp out",
               flags.dp);
  BASALT_CHECK(flags.dp_attention || flags.moe_dense_tp_size == 0,
               "--moe-dense-tp-size applies to --dp-attention only (under --tp alone the dense layers are split "
               "over the --tp ranks); give --dp-attention or leave it out");
  BASALT_CHECK(flags.nnodes >= 1 && flags.nnodes <= 64, "--nnodes must be in [1, 64], got {}", flags.nnodes);
  BASALT_CHECK(flags.node_rank >= 0 && flags.node_rank < flags.nnodes, "--node-rank {} is not in [0, --nnodes {})",
               flags.node_rank, flags.nnodes);
  if (flags.nnodes > 1) {
    BASALT_CHECK(flags.tp % flags.nnodes == 0,
                 "--tp {} over --nnodes {}: every machine runs as many ranks; give a --tp that --nnodes divides",
                 flags.tp, flags.nnodes);
    BASALT_CHECK(!flags.dist_init_addr.empty(),
                 "--nnodes {}: give --dist-init-addr HOST:PORT, where node 0 listens for the others", flags.nnodes);
    split_host_port(flags.dist_init_addr, "--dist-init-addr");
    BASALT_CHECK(flags.dist_timeout > 0 && flags.dist_timeout <= 86400,
                 "--dist-timeout must be seconds in (0, 86400], got {}", flags.dist_timeout);
    BASALT_CHECK(!flags.dp_attention,
                 "--nnodes {} --dp-attention: DP attention runs over the ranks of one machine only; across machines "
                 "give --tp alone",
                 flags.nnodes);
  }
  if (!flags.dp_attention) return;
  BASALT_CHECK(flags.tp >= 2, "--dp-attention runs over the --tp ranks: give --tp 2 or more");
  BASALT_CHECK(flags.dp == 0 || (flags.dp >= 2 && flags.dp <= flags.tp && flags.tp % flags.dp == 0),
               "--dp {}: DP attention makes 2 to --tp ({}) groups of equal size of the --tp ranks; give a --dp that "
               "divides --tp{}",
               flags.dp, flags.tp, flags.dp == 1 ? " (one group is tensor parallelism: leave --dp-attention out)" : "");
  const int group = flags.attention_tp();
  BASALT_CHECK(flags.moe_dense_tp_size == 0 || flags.moe_dense_tp_size == group || flags.moe_dense_tp_size == flags.tp,
               "--moe-dense-tp-size {}: the dense layers are split over every --tp rank ({}) or over each DP "
               "group's ranks ({}{})",
               flags.moe_dense_tp_size, flags.tp, group, group == 1 ? ": held whole" : ", --tp / --dp");
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

// What every node must run alike, which the leader checks as each joins:
// the model's config.json (FNV-1a of its bytes), the rank layout, the
// device kind and whether the weights are random.
std::string node_fingerprint(const std::string& dir, const Backend& backend, const ParallelFlags& flags) {
  std::ifstream in(dir + "/config.json", std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  uint64_t hash = 1469598103934665603ull;
  for (const char c : bytes.str()) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return fmt::format("config.json {:016x}, --tp {} --nnodes {}, {}{}", hash, flags.tp, flags.nnodes,
                     backend.device() == Device::kCpu ? "cpu" : "cuda", flags.random_weights ? ", random weights" : "");
}

NodeLinkOptions node_link_options(const std::string& dir, const Backend& backend, const ParallelFlags& flags) {
  NodeLinkOptions options;
  options.nnodes = flags.nnodes;
  options.fingerprint = node_fingerprint(dir, backend, flags);
  options.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.dist_timeout * 1000));
  return options;
}

// This node's ranks of a model whose --tp ranks span --nnodes machines,
// their communicators reaching the others' through `link`.
std::unique_ptr<Model> load_node_ranks(const std::string& dir, Backend& backend, const ParallelFlags& flags,
                                       NodeLink& link, const LoadProgress& progress) {
  const int local = flags.tp / flags.nnodes;
  if (backend.device() == Device::kCpu)
    return load_tensor_parallel(
        dir, local, cpu_ranks(local, cpu_bf16_activations(backend)), progress, nullptr,
        [&link, local](std::span<Backend* const>) { return make_node_group(link, local); }, flags.weights());
#ifdef BASALT_HAVE_CUDA
  const GpuRanks gpus = gpu_ranks(local, backend);
  return load_tensor_parallel(
      dir, local, gpus.make_backend, progress, &backend,
      [&link, local](std::span<Backend* const> backends) { return make_node_group(link, local, backends); },
      flags.weights());
#else
  fail("--nnodes {} --device {}: this build has no GPU backend", flags.nnodes, backend.name());
#endif
}

}  // namespace

void serve_as_node_worker(const std::string& dir, Backend& backend, const ParallelFlags& flags) {
  BASALT_CHECK(flags.nnodes > 1 && flags.node_rank > 0, "serve_as_node_worker: --node-rank {} of --nnodes {}",
               flags.node_rank, flags.nnodes);
  const int local = flags.tp / flags.nnodes, first = flags.node_rank * local;
  LogLine("node").add("node_rank", flags.node_rank).add("joining", flags.dist_init_addr).emit();
  std::unique_ptr<NodeLink> link =
      NodeLink::join(flags.dist_init_addr, flags.node_rank, node_link_options(dir, backend, flags));
  std::unique_ptr<Model> ranks = load_node_ranks(dir, backend, flags, *link, {});
  LogLine("node")
      .add("node_rank", flags.node_rank)
      .add("ranks", fmt::format("{}-{}", first, first + local - 1))
      .add("serving", flags.dist_init_addr)
      .emit();
  serve_multi_node_worker(*link, *ranks, backend);
  LogLine("node").add("node_rank", flags.node_rank).add("stopped", "the leader stopped").emit();
}

std::unique_ptr<Model> load_model_for_tp(const std::string& dir, Backend& backend, const ParallelFlags& flags,
                                         const LoadProgress& progress, int graph_batch) {
  const int tp = flags.tp;
  BASALT_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got {}", tp);
  if (flags.nnodes > 1) {
    BASALT_CHECK(flags.node_rank == 0, "load_model_for_tp: node {} is not the leader", flags.node_rank);
    NodeLinkOptions options = node_link_options(dir, backend, flags);
    options.on_listening = [&](int port) {
      LogLine("node").add("node_rank", 0).add("listening_port", port).add("waiting_for_nodes", flags.nnodes - 1).emit();
    };
    std::unique_ptr<NodeLink> link = NodeLink::lead(flags.dist_init_addr, options);
    std::unique_ptr<Model> ranks = load_node_ranks(dir, backend, flags, *link, progress);
    return make_multi_node_leader(std::move(link), std::move(ranks), backend);
  }
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
                                   flags.dense_tp(), flags.attention_tp());
    return out;
  }
#ifdef BASALT_HAVE_CUDA
  const GpuRanks gpus = gpu_ranks(flags.tp, backend);
  out.model = load_data_parallel(
      dir, flags.tp, gpus.make_backend, progress, std::chrono::microseconds(1000), flags.weights(), gpus.make_group,
      flags.moe(),
      graph_batch > 0 ? std::optional<GraphOptions>(GraphOptions{.max_batch = graph_batch}) : std::nullopt,
      flags.dense_tp(), flags.attention_tp());
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
