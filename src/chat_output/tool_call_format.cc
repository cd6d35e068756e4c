#include "chat_output/tool_call_format.h"

#include <string>

#include "core/error.h"

namespace basalt {
namespace {

struct FormatName {
  std::string_view name;
  ToolCallFormat format;
};

// The first name of each format is its own (to_string's).
constexpr FormatName kFormatNames[] = {
    {"hermes", ToolCallFormat::kHermes},
    {"qwen", ToolCallFormat::kHermes},
    {"qwen25", ToolCallFormat::kHermes},
    {"llama3_json", ToolCallFormat::kLlama3Json},
    {"mistral", ToolCallFormat::kMistral},
    {"deepseek_v3", ToolCallFormat::kDeepSeekV3},
    {"deepseek_v31", ToolCallFormat::kDeepSeekV31},
};

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// DeepSeek's templates differ in what they render between the call's begin
// marker and the separator: the call's type ("function", V3 and R1) or its
// name (V3.1). Templates write it as an expression (tool['type'],
// tool['function']['name']) or, in their instructions, as a placeholder.
std::optional<ToolCallFormat> detect_deepseek(std::string_view text) {
  constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
  constexpr std::string_view kSep = "<｜tool▁sep｜>";
  constexpr size_t kMaxBetween = 200;
  bool name_first = false, type_first = false;
  for (size_t at = text.find(kCallBegin); at != std::string_view::npos; at = text.find(kCallBegin, at + 1)) {
    const size_t from = at + kCallBegin.size();
    const size_t sep = text.find(kSep, from);
    if (sep == std::string_view::npos || sep - from > kMaxBetween) continue;
    const std::string_view between = text.substr(from, sep - from);
    if (contains(between, "name")) {
      name_first = true;
    } else if (contains(between, "type") || contains(between, "function")) {
      type_first = true;
    }
  }
  if (name_first) return ToolCallFormat::kDeepSeekV31;
  if (type_first) return ToolCallFormat::kDeepSeekV3;
  return std::nullopt;
}

}  // namespace

std::string_view to_string(ToolCallFormat format) {
  for (const FormatName& entry : kFormatNames)
    if (entry.format == format) return entry.name;
  return "unknown";
}

ToolCallFormat parse_tool_call_format(std::string_view name) {
  for (const FormatName& entry : kFormatNames)
    if (entry.name == name) return entry.format;
  std::string known;
  for (const FormatName& entry : kFormatNames) known += (known.empty() ? "" : ", ") + std::string(entry.name);
  fail("unknown tool call format \"{}\" (known: {})", name, known);
}

std::optional<ToolCallFormat> detect_tool_call_format(std::string_view chat_template) {
  const std::string_view t = chat_template;
  if (contains(t, "<｜tool▁calls▁begin｜>") && contains(t, "<｜tool▁sep｜>")) return detect_deepseek(t);
  if (contains(t, "[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (contains(t, "<tool_call>")) {
    // Other families use the same tag around other contents: Qwen3-Coder's
    // XML parameters, GLM 4.5's key/value pairs, Falcon 3's JSON array.
    if (contains(t, "<function=") || contains(t, "<arg_key>")) return std::nullopt;
    if (contains(t, "<tool_call>\n[") || contains(t, "<tool_call>\\n[")) return std::nullopt;
    // The call object as a literal, or built as a mapping and passed to
    // tojson (the bundled model's template).
    if (contains(t, "{\"name\"") || contains(t, "\"name\": \"") || contains(t, "{'name':")) return ToolCallFormat::kHermes;
    return std::nullopt;
  }
  // Llama's templates ask for {"name": function name, "parameters": ...}
  // (3.2 and later) or render <|python_tag|> before calls (3.1, 3.3).
  if (contains(t, "\"parameters\"") && (contains(t, "<|python_tag|>") || contains(t, "{\"name\": function name")))
    return ToolCallFormat::kLlama3Json;
  return std::nullopt;
}

}  // namespace basalt
