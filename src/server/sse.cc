#include "server/sse.h"

namespace basalt {

SseParser::SseParser(Callback on_event, size_t max_line_bytes)
    : on_event_(std::move(on_event)), max_line_bytes_(max_line_bytes) {}

bool SseParser::feed(std::string_view bytes) {
  if (!error_.empty()) return false;
  size_t i = 0;
  while (i < bytes.size()) {
    if (after_cr_) {
      after_cr_ = false;
      if (bytes[i] == '\n') {
        if (lf_joins_raw_) raw_ += '\n';
        lf_joins_raw_ = false;
        ++i;
        continue;
      }
    }
    // Copy the run up to the next line end in one go.
    size_t j = i;
    while (j < bytes.size() && bytes[j] != '\n' && bytes[j] != '\r') ++j;
    if (line_.size() + (j - i) > max_line_bytes_) {
      error_ = "an event-stream line is longer than " + std::to_string(max_line_bytes_) + " bytes";
      return false;
    }
    line_.append(bytes.data() + i, j - i);
    if (j == bytes.size()) break;
    // The line's end as received: "\r\n" whole when both bytes are here.
    size_t end = j + 1;
    if (bytes[j] == '\r' && end < bytes.size() && bytes[end] == '\n') ++end;
    after_cr_ = bytes[end - 1] == '\r';
    i = end;
    line_done(bytes.substr(j, end - j));
    if (!error_.empty()) return false;
  }
  return true;
}

void SseParser::line_done(std::string_view end) {
  lf_joins_raw_ = false;
  if (line_.empty()) {
    dispatch(end);
    return;
  }
  if (line_[0] == ':') {
    if (on_comment_) on_comment_(std::string_view(line_).substr(1));
    line_.clear();
    return;
  }
  if (on_raw_) {
    if (raw_.size() + line_.size() + 2 > max_line_bytes_) {
      error_ = "an event-stream event is longer than " + std::to_string(max_line_bytes_) + " bytes";
      return;
    }
    raw_ += line_;
    raw_ += end;
    lf_joins_raw_ = end == "\r";
  }
  has_fields_ = true;
  const size_t colon = line_.find(':');
  const std::string_view field = std::string_view(line_).substr(0, colon);
  if (field == "data") {
    std::string_view value;
    if (colon != std::string::npos) {
      value = std::string_view(line_).substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    }
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
  }
  line_.clear();
}

void SseParser::dispatch(std::string_view end) {
  if (has_fields_ && on_raw_ && !end.empty()) {
    raw_ += end;
    on_raw_(raw_);
  }
  if (has_data_) on_event_(data_);
  data_.clear();
  raw_.clear();
  has_data_ = false;
  has_fields_ = false;
}

void SseParser::finish() {
  if (!error_.empty()) return;
  if (!line_.empty()) line_done({});
  dispatch({});
  after_cr_ = false;
  lf_joins_raw_ = false;
}

}  // namespace basalt
