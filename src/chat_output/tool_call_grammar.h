// The grammar of outputs that are nothing but tool calls, for OpenAI's
// tool_choice "required" (some call to one of the tools) and a named
// function (a call to it), in the EBNF of grammar/ebnf.h, so that structured
// output forces the model to call.
//
// Each call is written the way the format's chat templates render calls
// (the model's own spelling, spaces included), around arguments that are
// the compact JSON (grammar/json_schema.h) of an instance of the function's
// `parameters` schema (no `parameters`: any JSON object):
//
//   hermes        <tool_call>\n{"name": "f", "arguments": ARGS}\n</tool_call>, several joined by "\n"
//   llama3_json   {"name": "f", "parameters": ARGS}, several joined by "; "
//   mistral       [{"name": "f", "arguments": ARGS}, ...] (the bare array: the
//                 [TOOL_CALLS] marker is a special token no grammar can emit)
//   deepseek_v3   <｜tool▁calls▁begin｜>, calls joined by "\n", <｜tool▁calls▁end｜>;
//                 a call: <｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//                         ```json\nARGS\n```<｜tool▁call▁end｜>
//   deepseek_v31  <｜tool▁calls▁begin｜>, calls, <｜tool▁calls▁end｜>;
//                 a call: <｜tool▁call▁begin｜>f<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>
//
// Contract: every sentence of the grammar is parsed by ToolCallParser
// (chat_output/tool_call_parser.h) of the same format into exactly the calls
// it writes, with no content. Each function's schema is translated with
// json_schema_to_ebnf under its own rule_prefix ("fn0.", "fn1.", ...); the
// wrapper's own rules, "root" and "tool-call", have no prefix, so no
// translation defines them. Throws basalt::Error naming the function when its
// parameters schema cannot be translated or is not an object schema, when a
// function has no name or two have the same, when there are no tools, and
// when the named function is not among them.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "chat_output/reasoning_parser.h"
#include "chat_output/tool_call_format.h"

namespace basalt {

enum class ToolChoiceMode {
  kRequired,  // a call to any of the tools
  kNamed,     // a call to named_function
};

// A reasoning model's output with forced calls: its reasoning first, as
// its ReasoningParser reads it (the calls are what follows </think>).
struct ReasoningPrefix {
  ReasoningFormat format;
  bool starts_in_reasoning;  // the prompt opened the block (prompt_opens_reasoning())
};

// EBNF with root rule "root": one call, or with `parallel` one or more
// (kNamed: always one). tools: the request's `tools` array
// ([{"type": "function", "function": {"name", "parameters"?}}]), parsed as
// ordered_json so that the grammar keeps the schemas' property order.
// With `reasoning`, the calls come after the reasoning block, whose text is
// free but for "</think>", which ends it: kDeepSeekR1 and an opened kQwen3
// block must reason (and close the block); kQwen3 otherwise may open one.
std::string tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools, ToolChoiceMode mode,
                              const std::string& named_function, bool parallel,
                              std::optional<ReasoningPrefix> reasoning = std::nullopt);

}  // namespace basalt
