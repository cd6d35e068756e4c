// StopChecker: incremental stop-string matching over streamed text.
//
// Contract: feed() takes each new piece of detokenized text (for example
// from IncrementalDecoder) and returns the text that is now safe to emit,
// plus the stop string if one matched. Text that could still turn out to be
// the beginning of a stop string is held back: after every feed() the held
// text is the longest suffix of everything fed that is a proper prefix of
// some stop string. A match therefore never spans emitted text, whatever the
// piece boundaries are, and no byte after a matched stop is ever emitted.
//
// The stop that wins is the one that completes first when the text is read
// byte by byte; of stops completing at the same byte, the longest (the one
// that starts earliest). The result depends only on the concatenated text,
// never on how it was split into pieces. (vLLM checks the stop list in order
// within each new token's text, so when two stops complete inside one token
// it may pick a different one; ours is boundary-independent.) On a match the
// emitted text ends just before the stop string, vLLM's default
// include_stop_str_in_output=false, or just after it when include_stop is set;
// the checker is then finished and every later feed() returns nothing.
//
// feed(piece, false) adds text that may not complete a stop (vLLM does not
// match stop strings until min_tokens tokens are out): matches must end in
// text fed with check = true. Matching is on bytes; since stop strings and
// pieces are valid UTF-8, emitted text always splits between characters.
// flush() ends the stream and returns the held-back text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace basalt {

class StopChecker {
 public:
  struct Result {
    std::string text;                // safe to emit now
    std::optional<std::string> stop;  // the stop string that matched, if any
  };

  // Empty strings are rejected (basalt::Error); an empty list never matches.
  explicit StopChecker(std::vector<std::string> stops, bool include_stop = false);

  Result feed(std::string_view piece, bool check = true);
  // The text still held back; the checker then holds nothing.
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  // Length of the longest suffix of pending_ that is a proper prefix of a stop.
  size_t held_length() const;

  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_ = 0;
  std::string pending_;       // fed but not yet emitted
  size_t unchecked_end_ = 0;  // matches must end past this many bytes of pending_
  bool stopped_ = false;
};

}  // namespace basalt
