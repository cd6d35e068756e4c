// Server-sent events: an incremental parser for `text/event-stream` bodies
// and the reading of one OpenAI streaming chunk.
//
// Contract:
//  * SseParser::feed accepts the body in pieces split at any byte boundary
//    (even inside a "\r\n" pair) and calls on_event once per complete event
//    with its data: the values of its `data:` lines joined with '\n' (one
//    leading space after the colon is dropped, as the SSE spec says).
//    Lines end with "\n", "\r\n" or "\r"; a blank line ends an event; events
//    with no data line are not reported; comment lines (":...") and other
//    fields (event, id, retry, unknown) are ignored. finish() reports an
//    event left without its closing blank line.
//  * A line longer than max_line_bytes makes feed() return false and the
//    parser stays failed (error() says why): a server that never ends a
//    line cannot grow memory without bound.
//  * read_chunk(data) reads one event's data from /v1/completions or
//    /v1/chat/completions and never throws: "[DONE]" is kDone; a JSON object
//    with "error" is kError; one whose choices carry text (completions
//    `text`, chat `delta.content` or `delta.reasoning_content`) non-empty is
//    kToken; anything else that is a JSON object (a role delta, an empty
//    final chunk, a usage-only chunk) is kOther. Any chunk may also carry
//    usage (an object with integer completion_tokens), reported in
//    usage_completion_tokens (-1 when absent). Text that is not JSON, JSON
//    that is not an object, or fields of the wrong type are kMalformed with
//    a message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace basalt::loadgen {

class SseParser {
 public:
  using Callback = std::function<void(std::string_view data)>;
  explicit SseParser(Callback on_event, size_t max_line_bytes = 16u << 20);

  // false once a line is over the limit (then error() says so).
  bool feed(std::string_view bytes);
  // Reports an event whose closing blank line never came.
  void finish();
  const std::string& error() const { return error_; }

 private:
  void line_done();
  void dispatch();

  Callback on_event_;
  size_t max_line_bytes_;
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was '\r': a following '\n' is part of it
  std::string error_;
};

struct ChunkInfo {
  enum class Kind { kToken, kOther, kDone, kError, kMalformed };
  Kind kind = Kind::kOther;
  std::string text;     // kToken: the text; kError/kMalformed: the message
  int64_t usage_completion_tokens = -1;
  int64_t usage_prompt_tokens = -1;
};

ChunkInfo read_chunk(std::string_view data);

}  // namespace basalt::loadgen
