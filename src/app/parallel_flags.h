// The model-parallelism flags `basalt serve` and `basalt generate` share,
// and what they build.
//
// Contract: add_parallel_flags() registers --tp/--tensor-parallel-size,
// --ep/--expert-parallel-size and --dp-attention on `cmd`.
// check_parallel_flags() refuses, naming the flag, what is not offered: --tp
// outside [1, 64]; --ep other than --tp (a model's routed experts are split
// over its --tp ranks); --dp-attention with --tp 1, on a GPU, or with
// speculative decoding. load_model_for_tp() is the model for --tp without
// --dp-attention: on `backend` itself with tp 1; otherwise over tp
// tensor-parallel ranks (model/tensor_parallel.h), CPU ranks as threads of
// this process, each with a pool of its own and an equal share of
// `backend`'s threads (at least one), while `backend` keeps sampling; a GPU
// with tp > 1 is refused (not built yet). DpAttentionEngines is
// --dp-attention: load() puts the model over `ranks` ranks
// (model/data_parallel.h), their threads shared the same way; start() then
// makes an engine per rank with `options` (kv_slots and kv_budget_bytes
// split evenly between them), each sampling on a one-thread CPU backend of
// its own, behind one EngineGroup (runtime/engine_group.h).
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
};

void add_parallel_flags(CLI::App& cmd, ParallelFlags& flags);
void check_parallel_flags(const ParallelFlags& flags, const std::string& device, bool speculation);
std::unique_ptr<Model> load_model_for_tp(const std::string& dir, Backend& backend, int tp,
                                         const LoadProgress& progress = {});

struct DpAttentionEngines {
  std::unique_ptr<DataParallelGroup> model;
  std::vector<std::unique_ptr<Backend>> samplers;
  std::unique_ptr<EngineGroup> engines;  // declared last: stopped first

  static DpAttentionEngines load(const std::string& dir, int ranks, const LoadProgress& progress = {});
  void start(const Tokenizer* tokenizer, EngineOptions options);
};

}  // namespace basalt
