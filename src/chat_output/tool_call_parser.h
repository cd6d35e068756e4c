// ToolCallParser: splits a chat model's output text, as it streams, into
// content and the tool calls written in one ToolCallFormat
// (chat_output/tool_call_format.h), in the shapes OpenAI's chat API returns:
// content deltas, tool_calls deltas, and the calls of the whole output.
//
// Contract:
// - feed() takes the output text as it becomes final, in order, in chunks of
//   any size (the same text split anywhere gives the same content and calls);
//   finish() marks its end. Neither throws on anything a model can write, and
//   memory stays bounded by kMaxHeldBytes past what the caller holds.
// - The concatenated content of every delta is the output with the markup of
//   the calls taken out (opening and closing markers, separators, the call
//   JSON, and whitespace that only separates calls or trails the last one).
//   Text that may be the start of a marker (a trailing "<tool_" or "<｜tool")
//   is held back until it is decided, then released as content if it is no
//   marker; other text goes out at once. Held-back text always starts at a
//   marker's first byte, an ASCII character, so content is never cut inside
//   a UTF-8 code point that the caller gave whole.
// - A call is given out once, whole, when it ends and is valid: one delta
//   with its index, id, name and all of its arguments. The parser never has
//   to take anything back: a call can still turn out malformed or be cut off
//   until its last byte, and such a call must come out as content instead,
//   so neither its name nor its arguments can go out before. (Calls of a
//   parallel output each go out as soon as each ends.)
// - Arguments are the compact JSON of the object the model wrote, members in
//   its order (nlohmann::ordered_json::dump()): "{"a":1,"b":[2]}". Where the
//   model wrote the arguments as a JSON string holding an object, that
//   object. Absent arguments are "{}".
// - Malformed markup is content, never an error, and its call is not
//   reported. A call goes wrong at the first byte that cannot continue it
//   (JSON syntax, a missing or misplaced marker, the end of the output), or,
//   when only its meaning is wrong (a name not among `tools`, arguments
//   that are no object, a JSON value that is no call), where that is known:
//   after the JSON (hermes, llama3_json, a mistral array) or after the name
//   (mistral's [ARGS] form, deepseek). What the call held up to there is
//   content, and parsing goes on from there as text (llama3_json: all the
//   rest is content). The one leniency: hermes accepts a complete last call
//   without </tool_call> when only whitespace follows it (a stop string may
//   have taken the tag). A call read past kMaxHeldBytes is content at once.
//   An output with no valid call is all content, byte for byte.
// - What each format takes as calls (whitespace between tokens allowed):
//     hermes       <tool_call>{"name", "arguments"}</tool_call>, anywhere in text.
//     llama3_json  only at the start of the output: <|python_tag|>? then
//                  {"name", "parameters" or "arguments"} objects joined by ";";
//                  text after them is content.
//     mistral      [TOOL_CALLS] then a JSON array of {"name", "arguments"}
//                  (other members, like "id", ignored; all valid or all
//                  content), or [TOOL_CALLS]name([CALL_ID]id)?[ARGS]{...};
//                  anywhere in text; and a bare array of calls opening the output.
//     deepseek     the calls block anywhere in text; its end marker may be
//                  missing at the end of the output; an empty block is content.
//   Call objects take "arguments" or "parameters" (not both).
// - calls() lists the valid calls so far, in order; their ids are "call_"
//   and 24 random alphanumerics, unique per call.
//
// Within one ChatOutputDelta the order of content and calls is not kept
// (OpenAI's delta has one field of each); their concatenations are.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat_output/tool_call_format.h"

namespace basalt {

// One piece of one call, in OpenAI's streamed shape.
struct ToolCallDelta {
  int index = 0;          // the call's position among this output's calls
  std::string id;         // set on the call's first delta only
  std::string name;       // set on the call's first delta only
  std::string arguments;  // text appended to the call's JSON arguments
};

struct ChatOutputDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
};

struct ToolCall {
  std::string id, name;
  std::string arguments;  // compact JSON text of an object
};

class ToolCallParser {
 public:
  // The most text one undecided call (or the whitespace before it) may hold.
  static constexpr size_t kMaxHeldBytes = size_t{1} << 20;

  // tools: the request's `tools` array as the server validated it
  // ([{"type": "function", "function": {"name": ...}}]); entries without a
  // function name are skipped, and null means no tools.
  ToolCallParser(ToolCallFormat format, const nlohmann::json& tools);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  // Text of the output that became final, in order.
  ChatOutputDelta feed(std::string_view text);
  // The end of the output: whatever is still undecided is decided. Text fed
  // after it is content.
  ChatOutputDelta finish();
  // The complete, valid calls so far.
  const std::vector<ToolCall>& calls() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace basalt
