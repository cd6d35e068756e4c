// ModelRunner: runs planned steps (runtime/step.h) on a model: the forward
// pass, then the logits stage (raw logprobs for the report, the requests'
// logits processors, the constraints' token bitmask, all on the device),
// then sampling; and StepPipeline, which runs steps in plan order, inline or
// on a thread of its own (overlap), resolving each step's FutureTokens from
// the one before.
//
// Contract:
//  * run(plan, result) is called for one step at a time, in plan order, from
//    one thread. The plan's inputs are resolved (no FutureToken left) but
//    its device_drafts, which the runner takes from the step before's draft
//    head on the device and writes into the plan once the forward pass is
//    queued. It fills result.next (one token per sample row), the rows'
//    logprobs when asked, and calls each row's LogitsProcessor::append and
//    TokenConstraint::accept with its token, so that both see every token in
//    order. A failure becomes result.error (nothing thrown).
//  * The KV memory (KvBuffers) is the runner's: allocated at construction
//    for the slots the KvManager hands out, and prepared (CUDA graphs
//    recorded) before the first step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/step.h"

namespace basalt {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual void run(StepPlan& plan, StepResult& result) = 0;
};

// The runner of one model on one backend, in this process.
class LocalModelRunner : public ModelRunner {
 public:
  // `draft_model` (may be null): the separate model plan.run_draft_model
  // runs, on the same backend, with a vocabulary no larger than the model's.
  LocalModelRunner(Model& model, Backend& backend, int64_t kv_slots, DType kv_dtype, Model* draft_model = nullptr);
  void run(StepPlan& plan, StepResult& result) override;
  KvBuffers& kv() { return kv_; }

 private:
  // Per row of logprobs lp f32 [N, V] on the device, its `wanted[row]` most
  // likely tokens (none where 0), brought to the host.
  std::vector<std::vector<TokenLogprob>> top_alternatives(const Tensor& lp,
                                                          std::span<const int> wanted);
  // The score rows' logits (StepPlan::score_rows, in order) into
  // `scores`: each row's token's logprob and rank and its alternatives.
  void score_prompts(const StepPlan& plan, const Tensor& logits,
                     std::vector<PromptLogprob>& scores);
  // The draft head's pass after sampling (StepPlan::capture_hidden).
  void run_draft_head(const StepPlan& plan, const Tensor& hidden, StepResult& result);
  // The draft model's pass after sampling (StepPlan::run_draft_model).
  void run_draft_model(const StepPlan& plan, StepResult& result);
  void hand_out_drafts(const Tensor& drafts, int chain, const std::vector<size_t>& proposal_rows,
                       StepResult& result);
  // The draft head's pass right behind sampling, where every token of the
  // step samples (its drafts at every row go to `row_drafts` on the
  // device), and what the host does with them once the samples are known.
  Tensor launch_head_on_samples(const StepPlan& plan, const ForwardBatch& fb, const Tensor& hidden,
                                const Tensor& sampled, Tensor& row_drafts);
  // With one draft per sequence: the host takes the samples now and the
  // drafts once `drafts_down` has landed (StepResult::complete_proposals);
  // the next step takes them from `row_drafts` on the device.
  void defer_head_drafts(const StepPlan& plan, const Tensor& row_drafts, Tensor host_drafts,
                         std::unique_ptr<Backend::PendingDownload> drafts_down, StepResult& result);
  // The step's input ids on the device with its device_drafts moved in
  // from the drafts deferred last (`host_ids` has placeholders there).
  Tensor ids_with_device_drafts(const StepPlan& plan, const Tensor& host_ids);
  // Waits for the deferred drafts' copy and writes the values of the
  // plan's device_drafts into its token_ids and rows; clears them.
  void resolve_device_drafts(StepPlan& plan);
  // Where the draft for `draft` is in deferred_.rows; throws unless the
  // runner holds it (the step and row the plan names).
  int32_t deferred_at(const StepPlan& plan, const FutureToken& draft) const;
  void finish_head_on_samples(const StepPlan& plan, std::span<const int32_t> row_drafts, const Tensor& head_hidden,
                              StepResult& result);
  // The head's chained passes after its first draft (row 0 of `drafts`).
  void chain_head(int chain, Tensor& drafts, Tensor chained_hidden, const std::vector<int32_t>& kv_slots,
                  const std::vector<std::pair<size_t, size_t>>& context, const std::vector<int32_t>& next_position);
  // Drafts per sequence the head makes in a step of `sequences` drafting sequences.
  int head_chain(const StepPlan& plan, int64_t sequences) const;
  void ensure_head_kv(DraftHead& head);

  Model& model_;
  Backend& backend_;
  KvBuffers kv_;
  int32_t vocab_;
  int64_t kv_slots_;
  DType kv_dtype_;
  // The draft head's own KV, slot for slot beside the model's, then
  // kHeadScratchSlots more for chained drafts (allocated at the first step
  // that runs the head).
  static constexpr int64_t kHeadScratchSlots = 1024;
  KvBuffers head_kv_;
  bool head_kv_ready_ = false;
  // The draft model and its KV, laid out as the head's (allocated at its
  // first pass).
  Model* draft_model_ = nullptr;
  KvBuffers draft_kv_;
  bool draft_kv_ready_ = false;
  // The drafts of the last step whose head ran behind its samples: its
  // draft at every row on the device, per result row the index of that
  // row's draft in them (-1: none), and their copy to the host, which the
  // step's result and the next step both wait for (once).
  struct DraftsCopy {
    std::mutex mu;
    std::unique_ptr<Backend::PendingDownload> download;
    Tensor host;
    const int32_t* values();
  };
  struct DeferredDrafts {
    uint64_t step = 0;
    Tensor rows;
    std::vector<int32_t> row_of;
    std::shared_ptr<DraftsCopy> copy;
  };
  DeferredDrafts deferred_;
};

// Runs steps in order. Threaded (overlap): launch() queues a step and
// returns at once, wait() blocks until it is done. Inline: launch() does
// nothing and wait() runs the step on the caller.
class StepPipeline {
 public:
  StepPipeline(ModelRunner& runner, bool threaded);
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  bool threaded() const { return thread_.joinable(); }
  struct Step {
    std::shared_ptr<StepPlan> plan;
    StepResult result;
    bool done = false;  // under the pipeline's lock when threaded
    bool on_caller = false;  // runs on the thread that waits for it (launch_inline)
  };
  std::shared_ptr<Step> launch(std::shared_ptr<StepPlan> plan);
  // A step that runs on the caller's thread, at wait(), even when the
  // pipeline is threaded: for a step the caller takes at once (a
  // speculative one, whose drafts follow its tokens), where a hand-off to
  // the runner's thread and back would only add its latency. Only while no
  // launched step is still to run (the caller has waited for them all).
  std::shared_ptr<Step> launch_inline(std::shared_ptr<StepPlan> plan);
  void wait(Step& step);

 private:
  void loop();
  void run(Step& step);

  ModelRunner& runner_;
  // The last step that succeeded and its sampled tokens (the runner's thread).
  uint64_t last_id_ = 0;
  std::vector<int32_t> last_next_;

  std::mutex mu_;
  std::condition_variable cv_;       // work queued or stop
  std::condition_variable done_cv_;  // a step is done
  std::deque<std::shared_ptr<Step>> queue_;
  bool stop_ = false;
  bool running_ = false;  // the runner's thread is running a step
  std::thread thread_;
};

}  // namespace basalt
