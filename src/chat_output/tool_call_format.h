// The ways chat models write tool calls into their output text, one per
// model family, named as vLLM's --tool-call-parser names them.
//
//   kHermes      Hermes 2 Pro, Qwen 2.5 / 3: JSON objects in tags, one tag
//                pair per call, text may come before them:
//                  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   kLlama3Json  Llama 3.1 / 3.2 / 3.3 / 4: the whole output is the calls,
//                optionally after <|python_tag|>, separated by "; ":
//                  {"name": "f", "parameters": {...}}
//   kMistral     [TOOL_CALLS] then a JSON array of {"name", "arguments"}
//                (tokenizers up to v3), or [TOOL_CALLS]f[ARGS]{...} per call
//                (newer ones); also a bare JSON array of calls as the whole
//                output (what tool_call_grammar() writes, since [TOOL_CALLS]
//                is a special token that a grammar cannot emit).
//   kDeepSeekV3  DeepSeek V3 and R1:
//                  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//                  ```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   kDeepSeekV31 DeepSeek V3.1:
//                  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}
//                  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//
// Contract: parse_tool_call_format() throws basalt::Error for a name it does
// not know, listing the ones it does. detect_tool_call_format() reads a chat
// template's text for the markup it renders tool calls with and returns
// nullopt for a template that renders none of these (no tools at all, or
// another family's style: Qwen3-Coder's <function=...>, GLM's <arg_key>,
// Command R's actions, pythonic calls), so a caller never parses a model's
// output in a format the model was not taught.
#pragma once

#include <optional>
#include <string_view>

namespace basalt {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral, kDeepSeekV3, kDeepSeekV31 };

// vLLM's name of the format: "hermes", "llama3_json", "mistral", "deepseek_v3", "deepseek_v31".
std::string_view to_string(ToolCallFormat format);

// The format of a vLLM parser name; "qwen" and "qwen25" are hermes too.
ToolCallFormat parse_tool_call_format(std::string_view name);

// The format a chat template renders assistant tool calls in, if it is one of these.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view chat_template);

}  // namespace basalt
