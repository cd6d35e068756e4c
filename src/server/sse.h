// Server-sent events: an incremental parser for `text/event-stream` bodies,
// for the load generator (which reads each event's data) and the gateway
// (which forwards each complete event as the bytes it received).
//
// Contract:
//  * feed() accepts the body in pieces split at any byte boundary (even
//    inside a "\r\n" pair). Lines end with "\n", "\r\n" or "\r"; a blank line
//    ends an event.
//  * on_event (given at construction) is called once per event that has a
//    `data:` line, with the values of its `data:` lines joined with '\n'
//    (one leading space after the colon is dropped, as the SSE spec says);
//    other fields (event, id, retry, unknown) are not in it. finish()
//    reports an event left without its closing blank line.
//  * on_raw, when set, is called once per event that has any field line
//    and was closed by its blank line, with the event's bytes as received:
//    its field lines and their line ends, then the blank line. Comment
//    lines are not in them: on_comment, when set, gets each comment line's
//    text after the colon. (A blank line's "\r\n" split between two pieces
//    reaches on_raw as "\r": the event is reported at the "\r", before the
//    next piece comes; "\r" alone ends a line, so the bytes mean the same.)
//  * A line, or an event's bytes, longer than max_line_bytes makes feed()
//    return false and the parser stays failed (error() says why): a server
//    that never ends a line or an event cannot grow memory without bound.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace basalt {

class SseParser {
 public:
  using Callback = std::function<void(std::string_view data)>;
  using RawCallback = std::function<void(std::string_view raw)>;
  using CommentCallback = std::function<void(std::string_view comment)>;
  explicit SseParser(Callback on_event, size_t max_line_bytes = 16u << 20);
  void on_raw(RawCallback callback) { on_raw_ = std::move(callback); }
  void on_comment(CommentCallback callback) { on_comment_ = std::move(callback); }

  // false once a line or an event is over the limit (then error() says so).
  bool feed(std::string_view bytes);
  // Reports an event whose closing blank line never came (to on_event).
  void finish();
  const std::string& error() const { return error_; }

 private:
  // `end`: the line's end as received ("\n", "\r\n" or "\r"; empty at
  // finish()).
  void line_done(std::string_view end);
  void dispatch(std::string_view end);

  Callback on_event_;
  RawCallback on_raw_;
  CommentCallback on_comment_;
  size_t max_line_bytes_;
  std::string line_;
  std::string data_;
  std::string raw_;          // the event's field lines so far, with their ends
  bool has_data_ = false;
  bool has_fields_ = false;
  bool after_cr_ = false;     // the last byte was '\r': a following '\n' is part of it
  bool lf_joins_raw_ = false;  // and that '\n' belongs in raw_ (the '\r' ended a field line)
  std::string error_;
};

}  // namespace basalt
