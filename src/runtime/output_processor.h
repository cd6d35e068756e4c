// OutputProcessor: turns one request's engine updates (token ids,
// runtime/request.h) into the events its client reads: the text of each
// token (incremental detokenization), stop strings, and the text held back
// until it cannot be the start of a stop string. It runs on the client's
// side of the stream (an HTTP I/O thread, the CLI's thread), so the engine's
// scheduling thread deals in token ids only.
//
// Contract (the same output as runtime/generator.h for the same tokens):
//  * each token update becomes one token event whose text is what became
//    final with it; an eos or stop-id token (update.stop_token) has no text
//    unless include_stop_str_in_output;
//  * when a stop string completes (not before min_tokens tokens are out),
//    the token event is followed at once by a finished event (kStop, the
//    string as stop_reason, usage counting the tokens so far), and
//    stop_after() tells the caller how many output tokens the client kept,
//    so the engine can stop the request; every later update is dropped;
//  * the engine's finished event gets the held-back text released (for stop
//    and length finishes) and, when the stop token's own text held a stop
//    string, that string as stop_reason;
//  * without a tokenizer, events carry no text and stop strings never match.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>

#include "runtime/request.h"
#include "runtime/stop_checker.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

class OutputProcessor {
 public:
  // The tokenizer is borrowed (it must outlive the processor); null: no text.
  OutputProcessor(const Tokenizer* tokenizer, const SamplingParams& params, uint64_t seed);

  // Takes in output tokens an earlier run produced (EngineRequest::
  // resume_output) as if they had been processed, without events: the
  // text, the text held back and the stop strings go on from there. Returns
  // why the continuation cannot be (a stop string already in their text
  // before the last token, past min_tokens), or "". A stop string that the
  // last token completes ended the run there: primed_stop() says so, and
  // the finish this processor then makes names it.
  std::string prime(std::span<const int32_t> tokens);
  bool primed_stop() const { return stopped_by_string_; }
  // The text priming let out: what the resumed run had reported by its
  // last resumed token (text held back for a possible stop string, or an
  // unfinished UTF-8 sequence, comes with the tokens after).
  const std::string& primed_text() const { return primed_text_; }
  // Appends the events of one update to `out`.
  void process(RequestUpdate update, std::deque<EngineEvent>& out);
  // The client's stream has ended (a finished event was produced).
  bool finished() const { return finished_; }
  // Set once a stop string ended the request on this side: the output tokens
  // the client kept.
  std::optional<int> stop_after() const { return stop_after_; }

 private:
  std::string feed(const std::string& piece, bool check, std::optional<std::string>& stop);

  const Tokenizer* tokenizer_;
  std::string primed_text_;
  int min_tokens_;
  bool include_stop_;
  uint64_t seed_;
  std::optional<IncrementalDecoder> decoder_;
  std::optional<StopChecker> checker_;
  int num_output_ = 0;
  bool stopped_by_string_ = false;
  StopReason string_stop_;
  Usage last_usage_;
  bool finished_ = false;
  std::optional<int> stop_after_;
};

}  // namespace basalt
