#include "server/chat_output_stream.h"

#include <utility>

namespace basalt {

using json = nlohmann::json;

ChatOutputStream::ChatOutputStream(const ChatOutputOptions& options)
    : include_reasoning_(options.include_reasoning), stream_reasoning_(options.stream_reasoning) {
  if (options.tool_format) tools_.emplace(*options.tool_format, options.tools);
  if (options.reasoning_format) reasoning_.emplace(*options.reasoning_format, options.starts_in_reasoning);
}

void ChatOutputStream::add_content(json& delta, const std::string& text) {
  if (!tools_) {
    if (text.empty()) return;
    content_ += text;
    delta["content"] = delta.value("content", "") + text;
    return;
  }
  add_tool_output(delta, tools_->feed(text));
}

void ChatOutputStream::add_tool_output(json& delta, ChatOutputDelta d) {
  if (!d.content.empty()) {
    content_ += d.content;
    delta["content"] = delta.value("content", "") + d.content;
  }
  for (ToolCallDelta& call : d.tool_calls) {
    json piece = {{"index", call.index}};
    json function = json::object();
    if (!call.id.empty()) {
      piece["id"] = std::move(call.id);
      piece["type"] = "function";
      function["name"] = std::move(call.name);
    }
    function["arguments"] = std::move(call.arguments);
    piece["function"] = std::move(function);
    delta["tool_calls"].push_back(std::move(piece));
  }
}

void ChatOutputStream::add(json& delta, const ReasoningDelta& r, bool last) {
  if (!r.reasoning.empty() && include_reasoning_) {
    reasoning_text_ += r.reasoning;
    any_reasoning_ = true;
    held_reasoning_ += r.reasoning;
  }
  // Held reasoning goes out at once, or (!stream_reasoning) in one piece
  // once it is over.
  if (!held_reasoning_.empty() && (stream_reasoning_ || last || reasoning_->in_content())) {
    delta["reasoning_content"] = delta.value("reasoning_content", "") + held_reasoning_;
    held_reasoning_.clear();
  }
  add_content(delta, r.content);
}

json ChatOutputStream::feed(std::string_view text) {
  json delta = json::object();
  if (reasoning_) add(delta, reasoning_->feed(text), false);
  else add_content(delta, std::string(text));
  return delta;
}

json ChatOutputStream::finish(std::string_view last_text) {
  json delta = feed(last_text);
  if (reasoning_) add(delta, reasoning_->finish(), true);
  if (tools_) add_tool_output(delta, tools_->finish());
  return delta;
}

json ChatOutputStream::message() const {
  json m = {{"role", "assistant"}};
  const bool calls = has_tool_calls();
  m["content"] = content_.empty() && calls ? json(nullptr) : json(content_);
  if (reasoning_ && include_reasoning_) m["reasoning_content"] = any_reasoning_ ? json(reasoning_text_) : json(nullptr);
  if (calls) {
    json list = json::array();
    for (const ToolCall& c : tools_->calls())
      list.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(list);
  }
  return m;
}

}  // namespace basalt
