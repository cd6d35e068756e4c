// libFuzzer target: the chat-output parsers (tool calls in every format,
// reasoning) on untrusted model text. The first byte picks the tool-call
// format and the reasoning parser, the second how the text is split into
// feed() calls; the rest is the output. Nothing may throw, crash or leak,
// every byte must come out exactly once (content, reasoning or a call's
// markup), and an output with no valid call must come back as content byte
// for byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat_output/reasoning_parser.h"
#include "chat_output/tool_call_parser.h"

namespace {

const nlohmann::json& tools() {
  static const nlohmann::json t = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "add"}}])");
  return t;
}

constexpr basalt::ToolCallFormat kFormats[] = {basalt::ToolCallFormat::kHermes, basalt::ToolCallFormat::kLlama3Json,
                                               basalt::ToolCallFormat::kMistral, basalt::ToolCallFormat::kDeepSeekV3,
                                               basalt::ToolCallFormat::kDeepSeekV31};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const basalt::ToolCallFormat format = kFormats[data[0] % 5];
  const int reasoning = (data[0] / 5) % 3;  // none, deepseek_r1, qwen3
  const size_t step = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  basalt::ToolCallParser parser(format, tools());
  std::string content;
  size_t calls = 0;
  auto take = [&](basalt::ChatOutputDelta d) {
    content += d.content;
    calls += d.tool_calls.size();
  };
  for (size_t at = 0; at < text.size(); at += step) take(parser.feed(text.substr(at, step)));
  take(parser.finish());
  if (calls != parser.calls().size()) std::abort();
  if (parser.calls().empty() && content != text) std::abort();
  for (const basalt::ToolCall& c : parser.calls())
    if (!nlohmann::json::parse(c.arguments, nullptr, false).is_object()) std::abort();

  if (reasoning > 0) {
    basalt::ReasoningParser r(reasoning == 1 ? basalt::ReasoningFormat::kDeepSeekR1 : basalt::ReasoningFormat::kQwen3,
                              (data[1] & 0x80) != 0);
    size_t out = 0;
    for (size_t at = 0; at < text.size(); at += step) {
      const basalt::ReasoningDelta d = r.feed(text.substr(at, step));
      out += d.reasoning.size() + d.content.size();
    }
    const basalt::ReasoningDelta d = r.finish();
    out += d.reasoning.size() + d.content.size();
    if (out > text.size()) std::abort();  // only tags are taken out
  }
  return 0;
}
