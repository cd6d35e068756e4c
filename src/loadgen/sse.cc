#include "loadgen/sse.h"

#include <nlohmann/json.hpp>

namespace basalt::loadgen {

SseParser::SseParser(Callback on_event, size_t max_line_bytes)
    : on_event_(std::move(on_event)), max_line_bytes_(max_line_bytes) {}

bool SseParser::feed(std::string_view bytes) {
  if (!error_.empty()) return false;
  size_t i = 0;
  while (i < bytes.size()) {
    if (after_cr_) {
      after_cr_ = false;
      if (bytes[i] == '\n') {
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
    after_cr_ = bytes[j] == '\r';
    i = j + 1;
    line_done();
  }
  return true;
}

void SseParser::line_done() {
  if (line_.empty()) {
    dispatch();
    return;
  }
  if (line_[0] != ':') {
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
  }
  line_.clear();
}

void SseParser::dispatch() {
  if (has_data_) on_event_(data_);
  data_.clear();
  has_data_ = false;
}

void SseParser::finish() {
  if (!error_.empty()) return;
  if (!line_.empty()) line_done();
  dispatch();
  after_cr_ = false;
}

namespace {

using nlohmann::json;

// Reads usage when present and well-formed; false for a wrong type.
bool read_usage(const json& j, ChunkInfo& info, std::string& why) {
  auto it = j.find("usage");
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_object()) {
    why = "usage is not an object";
    return false;
  }
  auto ct = it->find("completion_tokens");
  if (ct != it->end()) {
    if (!ct->is_number_integer() || ct->get<int64_t>() < 0) {
      why = "usage.completion_tokens is not a non-negative integer";
      return false;
    }
    info.usage_completion_tokens = ct->get<int64_t>();
  }
  auto pt = it->find("prompt_tokens");
  if (pt != it->end() && pt->is_number_integer() && pt->get<int64_t>() >= 0) info.usage_prompt_tokens = pt->get<int64_t>();
  return true;
}

ChunkInfo malformed(std::string message) {
  ChunkInfo info;
  info.kind = ChunkInfo::Kind::kMalformed;
  info.text = std::move(message);
  return info;
}

}  // namespace

ChunkInfo read_chunk(std::string_view data) {
  ChunkInfo info;
  if (data == "[DONE]") {
    info.kind = ChunkInfo::Kind::kDone;
    return info;
  }
  json j = json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return malformed("an event is not JSON: " + std::string(data.substr(0, 80)));
  if (!j.is_object()) return malformed("an event is not a JSON object");
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    info.kind = ChunkInfo::Kind::kError;
    const json* message = e->is_object() && e->contains("message") ? &(*e)["message"] : nullptr;
    info.text = message != nullptr && message->is_string() ? message->get<std::string>() : e->dump();
    return info;
  }
  std::string why;
  if (!read_usage(j, info, why)) return malformed(why);
  auto choices = j.find("choices");
  if (choices == j.end() || choices->is_null()) return info;
  if (!choices->is_array()) return malformed("choices is not an array");
  for (const json& c : *choices) {
    if (!c.is_object()) return malformed("a choice is not an object");
    const json* text = nullptr;
    if (auto t = c.find("text"); t != c.end()) {
      text = &*t;
    } else if (auto d = c.find("delta"); d != c.end()) {
      if (d->is_null()) continue;
      if (!d->is_object()) return malformed("delta is not an object");
      auto content = d->find("content");
      if (content == d->end() || content->is_null() || (content->is_string() && content->get_ref<const std::string&>().empty()))
        content = d->find("reasoning_content");
      if (content != d->end()) text = &*content;
    }
    if (text == nullptr || text->is_null()) continue;
    if (!text->is_string()) return malformed("a choice's text is not a string");
    const std::string& s = text->get_ref<const std::string&>();
    if (!s.empty()) {
      info.kind = ChunkInfo::Kind::kToken;
      info.text += s;
    }
  }
  return info;
}

}  // namespace basalt::loadgen
