// Engine: the serving runtime's only door. submit(request) -> a stream of
// events; cancel() is the only way to stop a request early.
//
// Contract:
//  * An Engine owns (or borrows) the Model and Backend, and owns the KV
//    storage (KvBuffers sized from the KvPool), the KvPool, the RadixCache and
//    ONE scheduler thread. Only that thread touches the model, the pool, the
//    tree and the per-request state; other threads talk to it through an
//    inbox (submissions and cancellations) guarded by a mutex and woken by a
//    condition variable, and it talks back through each request's stream.
//  * submit() and cancel() are thread-safe and never block on a model step.
//    submit() validates nothing itself: a bad request (empty prompt, ids
//    outside the vocabulary, invalid sampling params, n != 1 (submit_n gives
//    several samples), stop strings
//    without a tokenizer, past the context length, or a prompt plus
//    max_tokens that can never fit in the pool) gets a single "finished"
//    event with reason kError and a message.
//  * Every stream ends with exactly one "finished" event; before it, one
//    "token" event per output token (id, the text that became final with it
//    after stop-string hold-back, and its logprobs when asked). The finished
//    event carries the text released at the end (held-back text), so the
//    concatenation of all event texts is the full output text.
//  * Cancellation (RequestStream::cancel or Engine::cancel) is honoured at
//    the next step boundary, in any state (queued, prefilling, decoding,
//    preempted): the request's unshared KV slots go back to the pool and its
//    cache lock is dropped. Destroying the Engine cancels whatever is left.
//  * Outputs match runtime/generator.h's generate() for the same request
//    (greedy, or the same seed: step s draws with SamplingRow(seed, s)),
//    whatever else runs in the same batch, provided the backend's kernels are
//    batch invariant.
//
// Scheduling (one ForwardBatch per step; see engine.cc for the details):
//  * running requests that have prefilled their prompt decode one token;
//  * partially prefilled requests continue with a chunk of at most the
//    remaining per-step token budget (chunked prefill); each finished chunk
//    is inserted into the radix cache and the lock moves to its node;
//  * new requests are admitted while the budget, max_running and memory
//    allow: highest priority first, then FCFS or longest prefix match
//    (FCFS when more than lpm_max_queue requests wait); one that shares at
//    least 32 uncached leading tokens with a request admitted in the same
//    step waits a step and takes them from the cache. Admission needs the
//    uncached prompt plus a reserve for output to fit in free + evictable
//    slots minus what the running requests have reserved;
//  * when a decode token finds no slot, the running request with the lowest
//    priority (latest arrival among equals) is preempted: its unshared KV is
//    freed, its lock dropped, and it goes back to the queue with its output
//    so far, to be recomputed later; a step that preempted admits nobody.
//    Nothing deadlocks: a request that fits the pool alone always progresses
//    once the others are preempted.
//  * a request finishes on eos / stop ids / stop strings / max_tokens
//    (runtime/generator.h's rules), deadline or cancellation; on finish its
//    sequence is inserted into the radix cache, unlocked and the rest freed.
//
// Pages (EngineOptions::page_size = P, 1 by default): the pool hands out KV
// in pages of P consecutive slots and every request's KV is page-aligned, so
// a paged attention kernel can address it by (page table, position):
//  * the slot of position p of a request is at offset p % P of one of the
//    request's pages, and positions [k*P, (k+1)*P) are one page:
//      page_table[k] = slots[k*P] / P,  slot(p) = page_table[p / P] * P + p % P.
//    In a ForwardBatch, a request's kv_slots (positions 0 .. end-1) and its
//    out_slots follow this rule, and every kv_slots run starts at a page
//    boundary (position 0), so a kernel may read the page table off kv_slots
//    at stride P (KvPool::is_page_aligned states the property). The pages of a
//    cached prefix are shared between requests; a request's last page is its
//    own (it holds the tail it will decode into, which no one else reads).
//  * the radix cache matches and caches whole pages only (see
//    runtime/radix_cache.h): a request reuses floor(matched / P) pages of a
//    prefix and computes the rest itself, a finished or partly prefilled
//    request caches its whole pages, and its partial last page is freed (on
//    finish) or kept for the next chunk or decode token.
//  * a decode token goes to the tail of the request's last page and takes a
//    new page only when that page is full; admission and the reserves count
//    whole pages. kv_slots is rounded down to whole pages.
//  * outputs do not depend on P (the kernels address KV by slot).
//
// Overlap (EngineOptions::overlap; off by default on the CPU backend): a
// step is launch() (CPU: schedule, allocate slots, build the ForwardBatch),
// execute (the model, the sampler, the logits processors; the Executor) and
// process() (CPU: stop checks, detokenization, events, frees). Off, the
// scheduler thread runs the three in turn. On, an executor thread runs the
// model and the sampler of step N while the scheduler thread launches step
// N+1 and then processes step N's results (SGLang's overlap scheduler):
//  * launch() treats every launched step as done: a request's KV positions
//    count from launch (kv_done), prefill chunks enter the radix cache at
//    launch, and a request admitted in step N+1 may read KV that step N is
//    still writing. This is safe because the executor runs steps strictly in
//    order and the scheduler never reads KV memory; a slot freed while step
//    N runs (a finish, a preemption) is only handed to step N+1 or later.
//  * a token step N samples is a "future" for step N+1: its input id is
//    -(row + 1), which the executor replaces with step N's sampled token just
//    before it runs N+1. The executor also owns each request's
//    LogitsProcessor (apply and append), so penalties see every token in
//    order; the sampling row is (seed, outputs + pending).
//  * a request whose last token (max_tokens) is in flight is not scheduled
//    again; one that stops on step N's token (eos, stop id or string) is in
//    step N+1 already: that row is computed and dropped
//    (EngineMetrics::discarded_tokens), the finish caches only the KV of
//    processed steps (the extra row's slot is freed), and the Sequence lives
//    on (retired) until step N+1 is processed. Cancellations and deadlines
//    are handled the same way at the next iteration; a request preempted
//    while its token is in flight takes the token when it lands and is not
//    readmitted before.
//  * a failed step fails the step launched after it (its futures are
//    missing), every request, and empties the cache (launched chunks were
//    inserted before they ran).
// EngineMetrics::schedule_time is the scheduler thread's CPU time per
// iteration; bubble is how long the executor sat idle between consecutive
// steps while the scheduler worked (overlap hides the scheduler in it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/engine_metrics.h"
#include "runtime/radix_cache.h"
#include "runtime/generator.h"
#include "runtime/sampling_params.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

using Clock = std::chrono::steady_clock;

enum class SchedulePolicy : uint8_t { kFcfs, kLongestPrefixMatch };

struct EngineOptions {
  // KV pool size in token slots; 0: from kv_budget_bytes (0: a tenth of host
  // memory), capped at max_running * the model's context length. Rounded down
  // to whole pages.
  int64_t kv_slots = 0;
  // Slots per KV page (>= 1): every request's KV is page-aligned and the radix
  // cache shares whole pages (see "Pages" above). 1: token-granular.
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
  // Recount the pool and cache invariants after every step, and check every
  // request's slots (page-aligned, whole pages, the cache's held count);
  // a violation throws on the scheduler thread (tests).
  bool check_invariants = false;
  // Test hook: called on the scheduler thread after every step with the KV of
  // every running request (the spans are valid during the call only).
  struct RequestKv {
    uint64_t id = 0;
    int64_t kv_len = 0;      // positions computed or being computed by a launched step
    int64_t cached_len = 0;  // leading positions whose slots are the radix cache's
    std::span<const int32_t> slots;  // slot of each position; kv_len rounded up to pages
  };
  std::function<void(std::span<const RequestKv>)> on_step;
  // Overlap scheduling: an executor thread runs the model and the sampler for
  // step N while the scheduler thread processes step N-1 and schedules step
  // N+1 (see "Overlap" above). Outputs are the same either way. Off by
  // default: on the CPU backend the model's thread pool already keeps every
  // core busy, so the scheduler's few percent only move to another thread
  // that competes for the same cores (bench/README.md has the figures).
  bool overlap = false;
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t cache_namespace = 0;  // tenant / cache salt: no sharing across
  int priority = 0;              // higher is admitted first
  std::optional<Clock::time_point> deadline;
};

enum class FinishReason : uint8_t { kStop, kLength, kCancelled, kError, kDeadline };
const char* to_string(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens found in the radix cache
  int preemptions = 0;
  double queue_seconds = 0;  // submit -> first admission
};

struct EngineEvent {
  enum class Kind : uint8_t { kToken, kFinished };
  Kind kind = Kind::kToken;
  // kToken: the id; both kinds: text that became final.
  int32_t token = -1;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  // kToken: the drawn token's logprob (natural log of the full softmax at
  // temperature 1, before penalties and filters) when params.logprobs > 0 or
  // params.sampled_logprob; NaN otherwise.
  float logprob = std::numeric_limits<float>::quiet_NaN();
  // kFinished:
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  Usage usage;
  uint64_t seed = 0;
};

class Engine;

// The caller's end of one request: events in order, then nothing.
class RequestStream {
 public:
  uint64_t id() const { return id_; }
  // Blocks until the next event; nothing once the finished event was taken.
  std::optional<EngineEvent> next_event();
  // The next event if one is ready.
  std::optional<EngineEvent> try_next_event();
  // Like next_event, giving up at `until`.
  std::optional<EngineEvent> next_event_until(Clock::time_point until);
  // Whether the finished event has been produced (it may not be taken yet).
  bool finished() const;
  void cancel();
  // Registers a callback run after every event is pushed (on the scheduler
  // thread, outside the stream's lock; it must be quick and must not block —
  // an event loop posts a wake-up). Called at once when events are already
  // waiting. Replaces any earlier listener; an empty function removes it.
  void set_listener(std::function<void()> listener);

  // Used by the engine.
  RequestStream(uint64_t id, Engine* engine) : id_(id), engine_(engine) {}
  void push(EngineEvent event);
  void detach();

 private:
  uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> events_;
  std::function<void()> listener_;
  bool finished_ = false;
  bool taken_last_ = false;
  Engine* engine_;  // null once the engine is gone
};

using RequestHandle = std::shared_ptr<RequestStream>;

// A whole request's outcome, gathered from its stream.
struct RequestOutput {
  std::vector<int32_t> output_ids;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string text;
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  Usage usage;
  uint64_t seed = 0;
};
RequestOutput collect(RequestStream& stream);

class Scheduler;

class Engine {
 public:
  // Borrows model and backend (they must outlive the engine).
  Engine(Model& model, Backend& backend, const Tokenizer* tokenizer, EngineOptions options = {});
  // Owns them.
  Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
         std::unique_ptr<Tokenizer> tokenizer, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RequestHandle submit(EngineRequest request);
  // n independent samples of one prompt (OpenAI's n), one stream each; the
  // prompt's KV is computed once and shared through the radix cache (the
  // first sample admitted prefills it, the others wait for it and compute only
  // the last prompt token). request.params.n is ignored. With a seed s, sample
  // i draws with sample_seed(s, i), so sample 0 is what submit() gives;
  // without one each sample draws its own seed. n outside 1..kMaxSamples: a
  // single handle whose only event is an error.
  static constexpr int kMaxSamples = 128;
  std::vector<RequestHandle> submit_n(EngineRequest request, int n);
  void cancel(uint64_t id);

  EngineMetrics metrics() const;
  int64_t kv_capacity() const;
  const Model& model() const { return *model_; }
  // Blocks until the scheduler is idle (nothing queued or running), then
  // evicts the whole radix cache; returns the pool's free slots afterwards
  // (== kv_capacity() when nothing leaked); metrics() then reflects every
  // request finished before it. For tests and benchmarks.
  int64_t drain_and_clear_cache();

 private:
  friend class Scheduler;
  void start(EngineOptions options);
  // group: the samples of one submit_n share the first one's id.
  // refusal: non-empty, the request only gets an error event with it.
  RequestHandle submit(EngineRequest request, uint64_t* group, std::string refusal);

  std::unique_ptr<Backend> owned_backend_;
  std::unique_ptr<Model> owned_model_;
  std::unique_ptr<Tokenizer> owned_tokenizer_;
  Model* model_;
  Backend* backend_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread thread_;
};

}  // namespace basalt
