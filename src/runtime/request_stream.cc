#include "runtime/request_stream.h"

#include <utility>

namespace basalt {

RequestStream::RequestStream(uint64_t id, StreamOwner* owner, OutputProcessor processor,
                             std::shared_ptr<StopLedger> ledger)
    : id_(id),
      resumed_text_(processor.primed_text()),
      owner_(owner),
      ledger_(std::move(ledger)),
      processor_(std::move(processor)) {}

void RequestStream::account_late_finish(const RequestUpdate& update) {
  if (!ledger_ || !client_kept_) return;
  const int64_t extra = update.usage.completion_tokens - *client_kept_;
  if (extra > 0) ledger_->discarded_tokens.fetch_add(static_cast<uint64_t>(extra));
  if (update.reason == FinishReason::kLength) ledger_->stopped_requests.fetch_add(1);
}

std::optional<EngineEvent> RequestStream::take_ready() {
  for (;;) {
    if (!events_.empty()) {
      EngineEvent e = std::move(events_.front());
      events_.pop_front();
      if (e.kind == EngineEvent::Kind::kFinished) taken_last_ = true;
      return e;
    }
    if (taken_last_) return std::nullopt;
    RequestUpdate u;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (updates_.empty()) return std::nullopt;
      u = std::move(updates_.front());
      updates_.pop_front();
    }
    const bool ended_before = processor_.finished();
    // The engine's own finish, kept for the ledger: the text that completes
    // a stop string can come with it (held-back text released at the end).
    std::optional<RequestUpdate> engine_finish;
    if (u.finished) {
      engine_finish.emplace();
      engine_finish->usage = u.usage;
      engine_finish->reason = u.reason;
    }
    processor_.process(std::move(u), events_);
    if (!ended_before && processor_.stop_after()) {
      // A stop string: the stream ends here and the engine is told to stop.
      StreamOwner* owner = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ended_ = true;
        client_kept_ = processor_.stop_after();
        if (engine_finish) account_late_finish(*engine_finish);
        for (const RequestUpdate& u : updates_)
          if (u.finished) account_late_finish(u);
        updates_.clear();
        owner = std::exchange(owner_, nullptr);
      }
      if (owner != nullptr) owner->stop(id_, *processor_.stop_after());
    }
  }
}

std::optional<EngineEvent> RequestStream::try_next_event() {
  std::lock_guard<std::mutex> consume(consume_mu_);
  return take_ready();
}

std::optional<EngineEvent> RequestStream::next_event() {
  std::lock_guard<std::mutex> consume(consume_mu_);
  for (;;) {
    if (auto e = take_ready()) return e;
    if (taken_last_) return std::nullopt;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !updates_.empty(); });
  }
}

std::optional<EngineEvent> RequestStream::next_event_until(Clock::time_point until) {
  std::lock_guard<std::mutex> consume(consume_mu_);
  for (;;) {
    if (auto e = take_ready()) return e;
    if (taken_last_) return std::nullopt;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, until, [&] { return !updates_.empty(); })) return std::nullopt;
  }
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

void RequestStream::cancel() {
  StreamOwner* owner = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    owner = owner_;
  }
  if (owner != nullptr) owner->cancel(id_);
}

void RequestStream::push(RequestUpdate update) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) {
      if (update.finished) account_late_finish(update);
      return;
    }
    if (update.finished) {
      ended_ = true;
      owner_ = nullptr;
    }
    updates_.push_back(std::move(update));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

void RequestStream::set_listener(std::function<void()> listener) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    pending = !updates_.empty();
  }
  if (pending && listener) listener();
}

void RequestStream::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  owner_ = nullptr;
}

RequestOutput collect(RequestStream& stream) {
  RequestOutput out;
  while (std::optional<EngineEvent> e = stream.next_event()) {
    out.text += e->text;
    if (e->kind == EngineEvent::Kind::kToken) {
      out.output_ids.push_back(e->token);
      if (!e->logprobs.empty()) out.top_logprobs.push_back(std::move(e->logprobs));
      if (!e->prompt_logprobs.empty()) out.prompt_logprobs = std::move(e->prompt_logprobs);
      continue;
    }
    out.reason = e->reason;
    out.stop_reason = std::move(e->stop_reason);
    out.error = std::move(e->error);
    out.usage = e->usage;
    out.seed = e->seed;
  }
  return out;
}

}  // namespace basalt
