#include "app/speculation_flags.h"

#include "app/device_choice.h"
#include "core/error.h"
#include "model/graphed_model.h"
#include "model/model.h"

namespace basalt {

void add_speculation_flags(CLI::App& cmd, SpeculationFlags& flags) {
  cmd.add_option("--speculative-algorithm", flags.algorithm,
                 "Speculative decoding: ngram (drafts looked up in the request's own text), mtp (the model's "
                 "multi-token-prediction layer drafts), draft (a small model with the same vocabulary drafts: "
                 "--speculative-draft-model) or none; the output is token for token that of plain decoding "
                 "(default none; turns --overlap off)");
  cmd.add_option("--speculative-draft-model", flags.draft_model,
                 "Speculative decoding with --speculative-algorithm draft: the draft model's directory (its "
                 "vocabulary must be the model's, e.g. models/basalt-draft beside models/basalt-mini)");
  cmd.add_option("--speculative-disable-by-batch-size", flags.disable_by_batch_size,
                 "Speculative decoding and jump-forward: no drafts while at least this many requests run "
                 "(default 32; 0: never)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--speculative-num-draft-tokens", flags.num_draft_tokens,
                 "Speculative decoding: the most draft tokens verified per request per step (default 4)")
      ->check(CLI::Range(1, 16));
}

void apply_speculation_flags(const SpeculationFlags& flags, Backend& backend, EngineOptions& options,
                             int graph_batch) {
  options.speculative = speculative_options(flags.algorithm, flags.num_draft_tokens);
  options.speculative.adaptive_from_batch = adaptive_drafts_from_batch(backend);
  options.speculative.disable_from_batch = flags.disable_by_batch_size;
  const bool draft = options.speculative.algorithm == SpeculativeAlgorithm::kDraft;
  BASALT_CHECK(!draft || !flags.draft_model.empty(), "--speculative-algorithm draft needs --speculative-draft-model DIR");
  BASALT_CHECK(draft || flags.draft_model.empty(),
               "--speculative-draft-model is used only with --speculative-algorithm draft");
  if (!draft) return;
  std::unique_ptr<Model> model = load_model(flags.draft_model, backend);
  if (graph_batch > 0) model = make_graphed_model(std::move(model), backend, {.max_batch = graph_batch});
  options.draft_model = std::move(model);
}

}  // namespace basalt
