#include "app/speculation_flags.h"

#include "app/device_choice.h"
#include "core/error.h"
#include "model/eagle_head.h"
#include "model/graphed_model.h"
#include "model/model.h"

namespace basalt {

void add_speculation_flags(CLI::App& cmd, SpeculationFlags& flags) {
  cmd.add_option("--speculative-algorithm", flags.algorithm,
                 "Speculative decoding: ngram (drafts looked up in the request's own text), mtp (the model's "
                 "multi-token-prediction layer drafts), eagle (an EAGLE head trained for the model drafts: "
                 "--speculative-draft-model), draft (a small model with the same vocabulary drafts: "
                 "--speculative-draft-model) or none; the output is token for token that of plain decoding "
                 "(default none)");
  cmd.add_option("--speculative-draft-model", flags.draft_model,
                 "Speculative decoding with --speculative-algorithm draft: the draft model's directory (its "
                 "vocabulary must be the model's, e.g. models/basalt-draft beside models/basalt-mini); with "
                 "eagle: the EAGLE head's directory (tools/train/train_eagle.py writes one)");
  cmd.add_option("--speculative-disable-by-batch-size", flags.disable_by_batch_size,
                 "Speculative decoding and jump-forward: no drafts while at least this many requests run or "
                 "wait (default 32; 0: never)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--speculative-num-draft-tokens", flags.num_draft_tokens,
                 "Speculative decoding: the most draft tokens verified per request per step (default 4)")
      ->check(CLI::Range(1, 16));
}

namespace {

// The algorithm's name checked against the draft directory flag.
SpeculativeAlgorithm checked_algorithm(const SpeculationFlags& flags) {
  const SpeculativeAlgorithm algorithm = parse_speculative_algorithm(flags.algorithm);
  const bool needs_dir = algorithm == SpeculativeAlgorithm::kDraft || algorithm == SpeculativeAlgorithm::kEagle;
  BASALT_CHECK(!needs_dir || !flags.draft_model.empty(), "--speculative-algorithm {} needs --speculative-draft-model DIR",
               to_string(algorithm));
  BASALT_CHECK(needs_dir || flags.draft_model.empty(),
               "--speculative-draft-model is used only with --speculative-algorithm draft or eagle");
  return algorithm;
}

}  // namespace

std::unique_ptr<Model> attach_speculation_head(const SpeculationFlags& flags, std::unique_ptr<Model> model,
                                               const std::string& model_dir, Backend& backend) {
  if (checked_algorithm(flags) != SpeculativeAlgorithm::kEagle) return model;
  std::unique_ptr<DraftHead> head = load_eagle_head(flags.draft_model, backend, model_dir);
  return with_draft_head(std::move(model), std::move(head));
}

void apply_speculation_flags(const SpeculationFlags& flags, Backend& backend, EngineOptions& options,
                             int graph_batch) {
  options.speculative = speculative_options(flags.algorithm, flags.num_draft_tokens);
  options.speculative.adaptive_from_batch = adaptive_drafts_from_batch(backend);
  options.speculative.disable_from_batch = flags.disable_by_batch_size;
  if (checked_algorithm(flags) != SpeculativeAlgorithm::kDraft) return;
  std::unique_ptr<Model> model = load_model(flags.draft_model, backend);
  if (graph_batch > 0) model = make_graphed_model(std::move(model), backend, {.max_batch = graph_batch});
  options.draft_model = std::move(model);
}

}  // namespace basalt
