// DP attention: a DeepSeek model over N ranks that run as threads of this
// process, each rank with a batch and a latent cache of its own and the
// routed experts split over the ranks (model/deepseek_v3.h says what a rank
// holds and how tokens reach their experts), as SGLang runs DeepSeek-V3 with
// --enable-dp-attention. Each rank is fed by a scheduler of its own.
//
// Contract: load_data_parallel(dir, world, make_backend) makes a backend
// per rank (all of one device kind: CPU ranks, or GPU ranks, one GPU each or
// several sharing one), the communicator group between them (make_group's;
// by default the in-process group, which stages device tensors through host
// memory), one thread per rank, and loads every rank's part on its thread
// (a config whose experts do not divide by the ranks, or a model without
// latent attention, is refused). rank(r) is the Model that rank r's
// scheduler drives: its KV is rank r's own, and its forward() hands the
// batch to the group and returns when the step it joined has run. A step (a
// round) starts once every rank has handed in a batch, or `round_wait` after
// a rank has handed one in, with whatever has come by then; a rank without a
// batch takes part idle (forward_idle), serving its experts to the others.
// So ranks under load step together. set_activity(busy) names the ranks
// worth waiting for: a round also starts once every rank with busy(rank)
// true has handed in its batch, so a lone busy rank does not wait round_wait
// per step (busy is called with the group's lock held, from the ranks'
// callers' threads; it must be quick and must not call into the group).
// rank(r).draft_head() is rank r's MTP layer (null without one), whose
// passes meet in rounds the same way, apart from the steps': a round runs
// the kind handed in first, steps or passes, with every rank not handing in
// that kind idle in it (forward_idle, forward_mtp_idle), and the other kind
// waits for the next round. Each rank's Model is called by one thread at a
// time; the errors of a step go to the caller whose batch failed (an idle
// rank's to every caller of that step). The caller's tensors (logits,
// hidden states) live where rank r's backend keeps them: backend(r), on
// which the caller samples; rank(r).allocate_kv makes that backend's device
// current on the calling thread. With `graphs`, by gathering, and where
// every rank's backend and communicator record (GPU ranks over NCCL), each
// rank's model is a GraphedModel (model/graphed_model.h) that records
// nothing on its own: when the last rank's engine hands in its KV
// (Model::prepare), every rank records every decode size together, each on
// batches of one size; then a round whose steps are all decode steps (one
// row per sequence, every row's logits, no hidden states) pads every
// rank's batch on the host to the round's largest recorded size and
// replays, ranks without a step taking part eagerly with that many rows;
// other rounds (prompts, verifications, the MTP layer's passes) run
// eagerly. A rank that gets a new engine turns the graphs off until every
// rank's engine has handed in its KV again (new engines on every rank),
// when they are recorded afresh. Otherwise GPU ranks run eagerly (the
// expert exchange reads its counts on the host each layer). `moe` is how
// tokens reach the routed experts (model/model.h's DpMoe: the exchange, or
// gathering; by gathering, the round's leader sets the rows every rank pads
// to from the batches handed in, DeepseekModel::set_step_rows, so no rank
// reads counts from its device in a step). With `dense_tp` (by gathering
// only) the dense layers' MLPs and the shared experts are split over the
// ranks instead of held whole by each (model/model.h's RankRole::dense_tp).
// With `attention_tp` A > 1 (SGLang's --dp smaller than --tp) the `world`
// ranks form world / A DP groups of A consecutive ranks: world() is the
// number of DP groups, each a DP rank with a scheduler of its own, whose
// batches all A of its ranks run, the attention heads, vocabulary and
// (without dense_tp) dense and shared MLPs split over them as tensor
// parallelism splits them, over a communicator of their own
// (RankRole::attention), the routed experts over every rank as before;
// each of the A sends its share of the rows to the experts (model/model.h).
// A DP rank's KV holds each of its ranks' latent cache (the latent is not
// split by heads), rank after rank (model/rank_buffers.h); backend(d) is its
// first rank's, which writes the caller's outputs, and an MTP pass
// broadcasts the caller's hidden states from it to the others.
// The group outlives the Models it hands out.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/graphed_model.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace basalt {

class DataParallelGroup {
 public:
  virtual ~DataParallelGroup() = default;
  // The DP ranks (each with a scheduler): the ranks / attention_tp.
  virtual int world() const = 0;
  virtual Model& rank(int r) = 0;
  virtual Backend& backend(int r) = 0;
  // Null: every rank is waited for (up to round_wait).
  virtual void set_activity(std::function<bool(int rank)> busy) = 0;
  // Rank r's graph counters (model/graphed_model.h; zeros without graphs).
  virtual GraphStats graph_stats(int r) const = 0;
};

std::unique_ptr<DataParallelGroup> load_data_parallel(const std::string& dir, int world,
                                                      const RankBackendFactory& make_backend,
                                                      const LoadProgress& progress = {},
                                                      std::chrono::microseconds round_wait =
                                                          std::chrono::microseconds(1000),
                                                      Weights weights = Weights::kCheckpoint,
                                                      const RankGroupFactory& make_group = {},
                                                      DpMoe moe = DpMoe::kExchange,
                                                      const std::optional<GraphOptions>& graphs = std::nullopt,
                                                      bool dense_tp = false, int attention_tp = 1);

}  // namespace basalt
