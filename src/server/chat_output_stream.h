// ChatOutputStream: one chat choice's output text as OpenAI's chat API
// returns it — reasoning (`reasoning_content`), content and `tool_calls` —
// from the text the detokenizer makes final, as streamed deltas or as the
// whole message.
//
// Contract: feed() takes the choice's text in order as it becomes final and
// returns the delta fields to stream now ({"reasoning_content"?,
// "content"?, "tool_calls"?}; empty while everything is held back, e.g. a
// possible tool-call marker); finish() takes the last text and releases
// what is held. The reasoning
// parser runs first and the tool-call parser sees only the content, as
// vLLM's serving layer chains them. message() gives the whole message after
// finish(): content null when the output was nothing but calls. The
// options' include_reasoning and stream_reasoning decide whether and when
// reasoning_content goes out. Nothing
// here throws on what a model writes (the parsers' contracts,
// chat_output/*.h).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "chat_output/reasoning_parser.h"
#include "chat_output/tool_call_parser.h"

namespace basalt {

struct ChatOutputOptions {
  // Parse tool calls of this format (the request has tools and tool_choice
  // is not "none").
  std::optional<ToolCallFormat> tool_format;
  nlohmann::json tools;  // the request's tools
  std::optional<ReasoningFormat> reasoning_format;
  bool starts_in_reasoning = false;  // the prompt opened a reasoning block
  // vLLM's include_reasoning: false drops the reasoning (parsed, so it
  // stays out of the content too).
  bool include_reasoning = true;
  // SGLang's stream_reasoning: false holds a stream's reasoning back and
  // sends it as one delta when the content starts (or the output ends).
  bool stream_reasoning = true;
};

class ChatOutputStream {
 public:
  explicit ChatOutputStream(const ChatOutputOptions& options);

  // True when the text is plain content (no parser): the caller may skip
  // the stream and use the text as it is.
  bool passthrough() const { return !tools_ && !reasoning_; }

  nlohmann::json feed(std::string_view text);
  // The output's last text, then its end: one delta with both.
  nlohmann::json finish(std::string_view last_text = {});

  bool has_tool_calls() const { return tools_ && !tools_->calls().empty(); }
  // {"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}.
  nlohmann::json message() const;

 private:
  // `last`: the parser's finish() gave r.
  void add(nlohmann::json& delta, const ReasoningDelta& r, bool last);
  void add_content(nlohmann::json& delta, const std::string& text);
  void add_tool_output(nlohmann::json& delta, ChatOutputDelta d);

  std::optional<ToolCallParser> tools_;
  std::optional<ReasoningParser> reasoning_;
  std::string content_;
  std::string reasoning_text_;
  std::string held_reasoning_;  // !stream_reasoning: not sent yet
  bool any_reasoning_ = false;
  bool include_reasoning_ = true;
  bool stream_reasoning_ = true;
};

}  // namespace basalt
