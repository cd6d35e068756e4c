#include "runtime/output_processor.h"

#include <utility>

#include <fmt/format.h>

namespace basalt {

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const SamplingParams& params, uint64_t seed)
    : tokenizer_(tokenizer),
      min_tokens_(params.min_tokens),
      include_stop_(params.include_stop_str_in_output),
      seed_(seed) {
  if (tokenizer_ != nullptr) {
    decoder_.emplace(*tokenizer_, params.skip_special_tokens);
    checker_.emplace(params.stop, params.include_stop_str_in_output);
  }
}

std::string OutputProcessor::feed(const std::string& piece, bool check, std::optional<std::string>& stop) {
  if (piece.empty()) return {};
  StopChecker::Result r = checker_->feed(piece, check);
  stop = std::move(r.stop);
  return std::move(r.text);
}

std::string OutputProcessor::prime(std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t token = tokens[i];
    ++num_output_;
    if (tokenizer_ == nullptr || token < 0 || token >= tokenizer_->vocab_size()) continue;
    std::optional<std::string> stop;
    primed_text_ += feed(decoder_->push(token), num_output_ > min_tokens_, stop);
    if (!stop) continue;
    if (i + 1 < tokens.size())
      return fmt::format("resume_output already holds the stop string \"{}\" (by output token {})", *stop,
                         num_output_ - 1);
    // The run ended on this token's stop string: the request ends at once,
    // as it did (its finish names the string).
    stopped_by_string_ = true;
    string_stop_ = std::move(*stop);
  }
  return {};
}

void OutputProcessor::process(RequestUpdate u, std::deque<EngineEvent>& out) {
  if (finished_) return;  // a stop string ended it here; the engine's rest is dropped
  if (!u.finished) {
    ++num_output_;
    last_usage_ = u.usage;
    EngineEvent ev;
    ev.kind = EngineEvent::Kind::kToken;
    ev.token = u.token;
    ev.logprobs = std::move(u.logprobs);
    ev.logprob = u.logprob;
    ev.prompt_logprobs = std::move(u.prompt_logprobs);
    ev.usage = u.usage;
    const bool check = num_output_ > min_tokens_;
    // Ids past the tokenizer's vocabulary (padded embedding rows) carry no text.
    const bool has_text = tokenizer_ != nullptr && u.token < tokenizer_->vocab_size();
    std::optional<std::string> stop;
    if (has_text && (!u.stop_token || include_stop_)) ev.text = feed(decoder_->push(u.token), check, stop);
    out.push_back(std::move(ev));
    if (!stop) return;
    stopped_by_string_ = true;
    string_stop_ = std::move(*stop);
    if (u.stop_token) return;  // the engine finishes it anyway; its event takes the string
    // The stop string ends the request here; the engine is told to stop.
    EngineEvent done;
    done.kind = EngineEvent::Kind::kFinished;
    done.reason = FinishReason::kStop;
    done.stop_reason = string_stop_;
    done.usage = last_usage_;
    done.usage.completion_tokens = num_output_;
    done.seed = seed_;
    out.push_back(std::move(done));
    finished_ = true;
    stop_after_ = num_output_;
    return;
  }
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::kFinished;
  ev.reason = u.reason;
  ev.stop_reason = std::move(u.stop_reason);
  ev.error = std::move(u.error);
  ev.usage = u.usage;
  ev.seed = seed_;
  const bool natural = u.reason == FinishReason::kStop || u.reason == FinishReason::kLength;
  if (stopped_by_string_) {
    ev.reason = FinishReason::kStop;
    ev.stop_reason = string_stop_;
  } else if (tokenizer_ != nullptr && natural) {
    // The end of the stream releases what was held back, unless the held
    // text completes a stop string after all.
    std::optional<std::string> stop;
    ev.text = feed(decoder_->flush(), num_output_ > min_tokens_, stop);
    if (stop) {
      ev.reason = FinishReason::kStop;
      ev.stop_reason = std::move(*stop);
    } else {
      ev.text += checker_->flush();
    }
  }
  out.push_back(std::move(ev));
  finished_ = true;
}

}  // namespace basalt
