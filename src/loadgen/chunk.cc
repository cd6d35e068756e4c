#include "loadgen/chunk.h"

#include <nlohmann/json.hpp>

namespace basalt::loadgen {

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
