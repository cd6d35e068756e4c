// Engine: the serving runtime's door. submit(request) -> a stream of events;
// cancel() stops a request early. EngineClient is the interface the server
// and the CLI program against (an in-process Engine now, a remote client
// later).
//
// The engine is thin; the work is in its parts (docs/DESIGN.md draws them):
//   runtime/scheduler.h      what each step computes (pure, no threads)
//   runtime/kv_manager.h     whose KV slots are whose (pool and radix cache)
//   runtime/model_runner.h   forward, logits stage, sampling; the step pipeline
//   runtime/request_stream.h the client's end: ids in, text out
//
// Contract:
//  * ONE scheduling thread owns the scheduler, the KV manager and the
//    streams' engine side; submit(), cancel() and metrics() are thread-safe
//    and never block on a model step (they go through an inbox).
//  * submit() validates nothing itself: a bad request (empty prompt, ids
//    outside the vocabulary, invalid sampling params, n != 1 (submit_n gives
//    several samples), stop strings without a tokenizer, past the context
//    length, or a prompt plus max_tokens that can never fit in the pool) gets
//    a single finished event with reason kError and a message. Without a
//    seed, submit() draws one, so a request's draws are fixed from the start.
//  * Every stream ends with exactly one finished event (runtime/
//    request_stream.h). Cancellation is honoured at the next step boundary,
//    in any state: the request's unshared KV goes back to the pool and its
//    cache lock is dropped. Destroying the Engine cancels whatever is left.
//  * When a request's last event reaches its stream, metrics() already
//    counts it (the snapshot is published before the events are delivered).
//  * Outputs match runtime/generator.h's generate() for the same request
//    (greedy, or the same seed: step s draws with SamplingRow(seed, s)),
//    whatever else runs in the same batch, given batch-invariant kernels.
//
// Overlap (EngineOptions::overlap; off by default on the CPU backend): the
// step pipeline runs step N on a thread of its own while the scheduling
// thread plans step N+1 and then takes step N's results (SGLang's overlap
// scheduler). The scheduler treats a launched step as done (its KV
// positions count, its prefill chunks are in the radix cache); a token step
// N samples is a FutureToken of step N+1, resolved by the pipeline just
// before N+1 runs. The runner owns each request's logits processor and
// constraint calls, so penalties and masks see every token in order. A
// request that stops on step N's token is already in step N+1: that row is
// computed and dropped (EngineMetrics::discarded_tokens). A failed step fails
// the step after it, every request, and empties the cache. While a request
// may draft (speculation; jump-forward with a constrained request running)
// the engine takes the step in flight before it plans the next: drafts
// follow the last token.
//
// Pages (EngineOptions::page_size = P): the pool hands out KV in pages of P
// consecutive slots, every request's KV is page-aligned (position p at
// offset p % P of one of its pages), and the radix cache shares whole pages
// (runtime/radix_cache.h); outputs do not depend on P.
//
// EngineMetrics::schedule_time is the scheduling thread's CPU time per
// iteration (everything but the model and sampler); bubble is how long the
// runner sat idle between consecutive steps while the scheduler worked.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/engine_metrics.h"
#include "runtime/delivery.h"
#include "runtime/generator.h"
#include "runtime/kv_events.h"
#include "runtime/radix_cache.h"
#include "runtime/request.h"
#include "runtime/request_stream.h"
#include "runtime/sampling_params.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

struct EngineOptions {
  // KV pool size in token slots; 0: from kv_budget_bytes (0: a tenth of host
  // memory), capped at max_running * the model's context length. Rounded down
  // to whole pages.
  int64_t kv_slots = 0;
  // Slots per KV page (>= 1): every request's KV is page-aligned and the radix
  // cache shares whole pages. 1: token-granular.
  int32_t page_size = 1;
  size_t kv_budget_bytes = 0;
  DType kv_dtype = DType::kF32;
  bool radix_cache = true;
  EvictionPolicy eviction = EvictionPolicy::kLru;
  SchedulePolicy policy = SchedulePolicy::kLongestPrefixMatch;
  int lpm_max_queue = 128;
  // Tokens per step (decode tokens plus prefill chunks); >= 1.
  int64_t step_token_budget = 512;
  int max_running = 64;
  // Output slots reserved per request at admission (at most its max_tokens).
  int64_t output_reserve = 16;
  // The model's end-of-sequence ids; empty: ModelConfig::eos_token_ids.
  std::optional<std::vector<int32_t>> eos_ids;
  int max_logprobs = kDefaultMaxLogprobs;
  // Prompt positions a step may score (SchedulerOptions::score_rows_per_step;
  // 0: from the vocabulary's size).
  int64_t score_rows_per_step = 0;
  // Recount the pool and cache invariants after every step, and check every
  // request's (runtime/request.h); a violation fails the step (tests).
  bool check_invariants = false;
  // Test hook: called on the scheduling thread after every step with the KV
  // of every running request (the spans are valid during the call only).
  using RequestKv = RequestKvView;
  std::function<void(std::span<const RequestKv>)> on_step;
  // Overlap scheduling (see above). Outputs are the same either way. Off by
  // default: on the CPU backend the model's thread pool already keeps every
  // core busy, so the scheduler's few percent only move to another thread
  // that competes for the same cores (bench/README.md has the figures).
  bool overlap = false;
  // Tokens per block of the KV events (runtime/kv_events.h), rounded up to
  // whole pages. Events are computed only while someone subscribes.
  int32_t kv_event_block_size = 16;
  // Jump-forward of constrained requests (SchedulerOptions::jump_forward):
  // the text a grammar forces is drafted and verified, so outputs are token
  // for token those without it. Off here; the CLI turns it on for CUDA,
  // where a verification step costs about what a decode step costs, and
  // leaves it off on the CPU, where each draft row costs compute
  // (bench/README.md).
  bool jump_forward = false;
  // Speculative decoding (runtime/speculative.h): drafts verified in the
  // decode step, outputs token for token those of plain decoding. A step
  // that may draft needs the tokens of the one before, so with overlap such
  // steps run one at a time, on the scheduling thread; past the off-switch
  // (disable_from_batch) steps overlap as without speculation.
  SpeculativeOptions speculative;
  // The draft model of SpeculativeAlgorithm::kDraft, on the same backend
  // (its KV takes slots beside the model's, counted in the KV budget).
  std::shared_ptr<Model> draft_model;
};

// What the server and the CLI need of an engine.
class EngineClient {
 public:
  virtual ~EngineClient() = default;
  virtual RequestHandle submit(EngineRequest request) = 0;
  // n independent samples of one prompt (OpenAI's n), one stream each; the
  // prompt's KV is computed once and shared through the radix cache (the
  // first sample admitted prefills it, the others wait for it and compute
  // only the last prompt token). request.params.n is ignored. With a seed s,
  // sample i draws with sample_seed(s, i), so sample 0 is what submit()
  // gives; without one each sample draws its own seed. n outside
  // 1..kMaxSamples: a single handle whose only event is an error.
  static constexpr int kMaxSamples = 128;
  virtual std::vector<RequestHandle> submit_n(EngineRequest request, int n) = 0;
  // Several requests at once, a handle each in order. An Engine's scheduler
  // takes them in together (the same step sees all of them), so a batch's
  // steps do not depend on when a submitting thread was scheduled; this
  // default submits them one by one.
  virtual std::vector<RequestHandle> submit_batch(std::vector<EngineRequest> requests) {
    std::vector<RequestHandle> handles;
    for (EngineRequest& r : requests) handles.push_back(submit(std::move(r)));
    return handles;
  }
  virtual void cancel(uint64_t id) = 0;
  virtual EngineMetrics metrics() const = 0;
  virtual int64_t kv_capacity() const = 0;
  virtual const ModelConfig& model_config() const = 0;
  // KV events (runtime/kv_events.h): the listener first gets a snapshot of
  // everything cached, then every change, in numbered batches, on a thread
  // of the engine's (it must be quick: copy and wake). Returns the id that
  // unsubscribe takes; after unsubscribe returns, no further call is made
  // once the engine has caught up (a call may be in progress).
  virtual uint64_t subscribe_kv_events(KvEventListener listener) = 0;
  virtual void unsubscribe_kv_events(uint64_t id) = 0;
};

class Engine : public EngineClient, private StreamOwner {
 public:
  // Borrows model and backend (they must outlive the engine).
  Engine(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions options = {});
  // Owns them.
  Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model, std::unique_ptr<Tokenizer> tokenizer,
         EngineOptions options = {});
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RequestHandle submit(EngineRequest request) override;
  std::vector<RequestHandle> submit_n(EngineRequest request, int n) override;
  std::vector<RequestHandle> submit_batch(std::vector<EngineRequest> requests) override;
  void cancel(uint64_t id) override;
  EngineMetrics metrics() const override;
  int64_t kv_capacity() const override;
  // Requests in the engine, for load balancing (runtime/engine_group.h):
  // those running or queued when the last step ended, plus those submitted
  // since that its scheduler has not yet taken in. Cheap; approximate while
  // a step runs.
  int64_t load() const;
  const ModelConfig& model_config() const override { return model_->config(); }
  uint64_t subscribe_kv_events(KvEventListener listener) override;
  void unsubscribe_kv_events(uint64_t id) override;
  const Model& model() const { return *model_; }
  // Blocks until the scheduler is idle (nothing queued or running), then
  // evicts the whole radix cache; returns the pool's free slots afterwards
  // (== kv_capacity() when nothing leaked); metrics() then reflects every
  // request finished before it. For tests and benchmarks.
  int64_t drain_and_clear_cache();

 private:
  struct Parts;
  void start(EngineOptions options);
  void stop(uint64_t id, int kept_tokens) override;
  // A request to submit. group: the samples of one submit_n share the
  // first one's id (0 until then). refusal: non-empty, the request only gets
  // an error event with it.
  struct Pending {
    EngineRequest request;
    uint64_t* group;
    std::string refusal;
  };
  // Streams for all of them, handed to the scheduler under one lock.
  std::vector<RequestHandle> enqueue(std::vector<Pending> pending);
  void run();

  std::unique_ptr<Backend> owned_backend_;
  std::unique_ptr<Model> owned_model_;
  std::unique_ptr<Tokenizer> owned_tokenizer_;
  Model* model_;
  Backend* backend_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<Parts> parts_;
  std::thread thread_;
};

}  // namespace basalt
