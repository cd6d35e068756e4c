// The model-parallelism flags `basalt serve` and `basalt generate` share,
// and what they build.
//
// Contract: add_parallel_flags() registers --tp/--tensor-parallel-size,
// --ep/--expert-parallel-size, --dp-attention, --dp/--dp-size (the DP
// groups DP attention makes of the --tp ranks: --tp by default, a rank
// each; fewer, and each group's tp/dp ranks split its attention heads,
// SGLang's attention TP inside DP), --dp-moe (exchange or gather:
// how DP attention's tokens reach the routed experts, model/model.h's DpMoe),
// --moe-dense-tp-size (1 or --tp: DeepSeek's dense MLPs and shared experts
// whole on each DP-attention rank or split over them, RankRole::dense_tp;
// with --dp below --tp, tp/dp splits them over each DP group's ranks; not
// given, split over all by gathering and over the DP group by the exchange) and
// --random-weights (the model's weights random, model/model.h's
// Weights::kRandom), and --nnodes, --node-rank, --dist-init-addr and
// --dist-timeout (the --tp ranks over several machines, SGLang's flags) on
// `cmd`.
// check_parallel_flags() refuses, naming the flag, what is not offered: --tp
// outside [1, 64]; --ep other than --tp (a model's routed experts are split
// over its --tp ranks); --dp-attention with --tp 1 or with EAGLE heads or
// draft models; --dp without --dp-attention, outside [2, --tp] or not
// dividing --tp; --dp-moe gather without --dp-attention; --moe-dense-tp-size
// without --dp-attention, other than tp/dp or --tp, or --tp with the exchange;
// --nnodes outside [1, 64] or not dividing --tp, a --node-rank outside
// [0, --nnodes), --nnodes > 1 without --dist-init-addr or with
// --dp-attention.
// load_model_for_tp() is the model for --tp without
// --dp-attention: on `backend` itself with tp 1; otherwise over tp
// tensor-parallel ranks (model/tensor_parallel.h), CPU ranks as threads of
// this process, each with a pool of its own and an equal share of
// `backend`'s threads (at least one), while `backend` keeps sampling; on a
// GPU, tp GPUs, a rank each (rank 0 on `backend`), NCCL between them, each
// rank recording CUDA graphs of its own when graph_batch > 0. With --nnodes
// N > 1 (node 0 calls it) this machine's --tp / N ranks, the others' joined
// over the network (model/multi_node.h; CPU ranks share `backend`'s threads
// as above, GPU ranks take a GPU each and reach the other machines' ranks
// through host memory, eagerly: no NCCL between machines yet).
// DpAttentionEngines is --dp-attention: load() puts the model over --tp ranks
// in --dp DP groups (model/data_parallel.h), CPU ranks' threads shared the
// same way, or on a
// GPU a rank per GPU from `backend`'s, NCCL between them (eager: no graphs);
// start() then makes an engine per DP rank with `options` (kv_slots and
// kv_budget_bytes split evenly between ranks that share a device), each
// sampling on a one-thread CPU backend of its own (CPU ranks) or on its
// rank's GPU, behind one EngineGroup (runtime/engine_group.h); a step does
// not wait for the ranks whose engines have no request (set_activity).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "model/data_parallel.h"
#include "runtime/engine.h"
#include "runtime/engine_group.h"

namespace basalt {

struct ParallelFlags {
  int tp = 1;
  int ep = 0;  // 0: not given (the --tp ranks)
  bool dp_attention = false;
  int dp = 0;                       // --dp: DP groups of --dp-attention; 0 not given (--tp)
  std::string dp_moe = "exchange";  // --dp-moe: exchange or gather (model/model.h's DpMoe)
  int moe_dense_tp_size = 0;        // --moe-dense-tp-size: 0 not given, 1, or tp (RankRole::dense_tp)
  bool random_weights = false;  // --random-weights: Weights::kRandom
  int nnodes = 1;               // --nnodes: machines the --tp ranks span (model/multi_node.h)
  int node_rank = 0;            // --node-rank: this machine's; 0 runs the engine
  std::string dist_init_addr;   // --dist-init-addr HOST:PORT: where node 0 listens for the others
  double dist_timeout = 600;    // --dist-timeout: seconds to wait for every node to join
  Weights weights() const { return random_weights ? Weights::kRandom : Weights::kCheckpoint; }
  DpMoe moe() const { return dp_moe == "gather" ? DpMoe::kGather : DpMoe::kExchange; }
  int dp_groups() const { return dp == 0 ? tp : dp; }
  int attention_tp() const { return tp / dp_groups(); }  // ranks per DP group
  // Not given: split by gathering (SGLang's default), whole by the exchange.
  bool dense_tp() const {
    return moe_dense_tp_size == 0 ? moe() == DpMoe::kGather : moe_dense_tp_size == tp;
  }
};

void add_parallel_flags(CLI::App& cmd, ParallelFlags& flags);
void check_parallel_flags(const ParallelFlags& flags, const std::string& speculative_algorithm);
// With graph_batch > 0, GPU ranks over NCCL record CUDA graphs per rank for
// decode batches up to that size (model/tensor_parallel.h); one rank (--tp
// 1) is left to the caller to wrap.
std::unique_ptr<Model> load_model_for_tp(const std::string& dir, Backend& backend, const ParallelFlags& flags,
                                         const LoadProgress& progress = {}, int graph_batch = 0);
// --node-rank K > 0: this machine's --tp / --nnodes ranks, joined to node
// 0 at --dist-init-addr, carrying out its calls until it stops (model/
// multi_node.h); returns when node 0 says stop, throws when the link breaks.
void serve_as_node_worker(const std::string& dir, Backend& backend, const ParallelFlags& flags);

struct DpAttentionEngines {
  std::unique_ptr<DataParallelGroup> model;
  std::vector<std::unique_ptr<Backend>> samplers;
  std::unique_ptr<EngineGroup> engines;  // declared last: stopped first

  DpAttentionEngines() = default;
  DpAttentionEngines(DpAttentionEngines&&) = default;
  DpAttentionEngines& operator=(DpAttentionEngines&&) = default;
  ~DpAttentionEngines();

  // The ranks multiply bf16 weights as `backend` does (--dtype). With
  // graph_batch > 0, GPU ranks over NCCL by gathering (--dp-moe gather)
  // replay CUDA graphs of decode rounds up to graph_batch sequences
  // (model/data_parallel.h).
  static DpAttentionEngines load(const std::string& dir, const ParallelFlags& flags, const Backend& backend,
                                 const LoadProgress& progress = {}, int graph_batch = 0);
  void start(const Tokenizer* tokenizer, EngineOptions options);
};

}  // namespace basalt
