// RequestStream: the client's end of one engine request. The engine's
// scheduling thread pushes updates (token ids, runtime/request.h); the
// client takes events (ids with their text, runtime/output_processor.h),
// which are made when it takes them, on its own thread.
//
// Contract:
//  * Every stream ends with exactly one finished event; before it, one token
//    event per output token. The concatenation of all event texts is the
//    full output text.
//  * push() (the engine) only queues and wakes: it never detokenizes, never
//    blocks on the client, and is a no-op after the stream's end.
//  * When the client side finds a stop string, the stream ends there and
//    tells the engine to stop the request (StreamOwner::stop); updates the
//    engine produced meanwhile are dropped. If the engine had finished the
//    request on its own first (its length, say), the tokens it made past the
//    client's stop are recorded in the StopLedger, which the engine's
//    metrics subtract.
//  * Thread-safe: one thread may push while others take and cancel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "runtime/output_processor.h"
#include "runtime/request.h"

namespace basalt {

// What a stream asks of the engine that runs its request.
class StreamOwner {
 public:
  virtual ~StreamOwner() = default;
  virtual void cancel(uint64_t id) = 0;
  // A stop string ended the request on the client side after kept_tokens
  // output tokens.
  virtual void stop(uint64_t id, int kept_tokens) = 0;
};

// Corrections to an engine's counts from streams whose stop string came
// after the engine had finished the request.
struct StopLedger {
  std::atomic<uint64_t> discarded_tokens{0};  // made past the client's stop
  std::atomic<uint64_t> stopped_requests{0};  // counted as length by the engine
};

class RequestStream {
 public:
  RequestStream(uint64_t id, StreamOwner* owner, OutputProcessor processor,
                std::shared_ptr<StopLedger> ledger = nullptr);

  uint64_t id() const { return id_; }
  // A resumed request's text so far (OutputProcessor::primed_text; empty
  // for any other). Set at construction, so any thread may read it.
  const std::string& resumed_text() const { return resumed_text_; }
  // Blocks until the next event; nothing once the finished event was taken.
  std::optional<EngineEvent> next_event();
  // The next event if one is ready.
  std::optional<EngineEvent> try_next_event();
  // Like next_event, giving up at `until`.
  std::optional<EngineEvent> next_event_until(Clock::time_point until);
  // Whether the stream has ended (its finished event may not be taken yet).
  bool finished() const;
  void cancel();
  // Registers a callback run after every push (on the engine's thread,
  // outside the stream's lock; it must be quick and must not block — an
  // event loop posts a wake-up). Called at once when updates are already
  // waiting. Replaces any earlier listener; an empty function removes it.
  void set_listener(std::function<void()> listener);

  // The engine's side.
  void push(RequestUpdate update);
  void detach();

 private:
  // Turns queued updates into events until one is ready; under consume_mu_.
  std::optional<EngineEvent> take_ready();
  // The engine's finish of a request the client had stopped; under mu_.
  void account_late_finish(const RequestUpdate& update);

  const uint64_t id_;
  const std::string resumed_text_;
  mutable std::mutex mu_;  // updates_, ended_, owner_, listener_
  std::condition_variable cv_;
  std::deque<RequestUpdate> updates_;
  bool ended_ = false;     // the engine's finished update arrived, or a stop string ended it
  StreamOwner* owner_;     // null once the engine is done with the request
  std::function<void()> listener_;
  std::optional<int> client_kept_;  // a stop string ended it here after this many tokens
  std::shared_ptr<StopLedger> ledger_;

  std::mutex consume_mu_;  // processor_, events_, taken_last_
  OutputProcessor processor_;
  std::deque<EngineEvent> events_;
  bool taken_last_ = false;
};

using RequestHandle = std::shared_ptr<RequestStream>;

// A whole request's outcome, gathered from its stream.
struct RequestOutput {
  std::vector<int32_t> output_ids;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::vector<PromptLogprob> prompt_logprobs;  // params.prompt_logprobs >= 0
  std::string text;
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  Usage usage;
  uint64_t seed = 0;
};
RequestOutput collect(RequestStream& stream);

}  // namespace basalt
