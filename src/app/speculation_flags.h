// The speculative-decoding flags `basalt serve` and `basalt generate` share,
// and the engine options they make.
//
// Contract: add_speculation_flags() registers --speculative-algorithm,
// --speculative-num-draft-tokens, --speculative-disable-by-batch-size and
// --speculative-draft-model on `cmd`. attach_speculation_head() loads the
// EAGLE head (--speculative-draft-model) beside `model` (loaded from
// `model_dir`, whose embedding and lm_head the head shares) when the algorithm
// is "eagle" and returns the model with it as its draft head (otherwise
// `model` as it is); call it before wrapping the model in a GraphedModel,
// which then graphs the head's steps too. apply_speculation_flags()
// validates the flags (an unknown algorithm, a draft directory without the
// draft or eagle algorithm or the reverse throw basalt::Error naming the
// flag), sets EngineOptions::speculative for the backend, and loads the
// draft model on `backend` when the algorithm is "draft" (its one-token
// chain steps replay CUDA graphs up to `graph_batch` sequences; 0: eager).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "runtime/engine.h"

namespace basalt {

struct SpeculationFlags {
  std::string algorithm = "none";
  int num_draft_tokens = 4;
  int disable_by_batch_size = 32;
  std::string draft_model;  // a model directory
};

void add_speculation_flags(CLI::App& cmd, SpeculationFlags& flags);
std::unique_ptr<Model> attach_speculation_head(const SpeculationFlags& flags, std::unique_ptr<Model> model,
                                               const std::string& model_dir, Backend& backend);
void apply_speculation_flags(const SpeculationFlags& flags, Backend& backend, EngineOptions& options,
                             int graph_batch);

}  // namespace basalt
