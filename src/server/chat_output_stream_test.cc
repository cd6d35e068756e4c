// ChatOutputStream: the reasoning and tool-call parsers chained as the chat
// API uses them, streamed deltas against the whole message.
#include "server/chat_output_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace basalt {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
  {"type": "function", "function": {"name": "add"}}])");

// Feeds `text` in pieces of `step` bytes and returns the deltas merged the
// way a client adds them up.
json streamed(const ChatOutputOptions& options, const std::string& text, size_t step) {
  ChatOutputStream s(options);
  json total = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}};
  auto merge = [&](const json& d) {
    if (d.contains("content")) total["content"] = total["content"].get<std::string>() + d["content"].get<std::string>();
    if (d.contains("reasoning_content"))
      total["reasoning_content"] =
          total["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
    for (const json& call : d.value("tool_calls", json::array())) total["tool_calls"].push_back(call);
  };
  for (size_t at = 0; at < text.size(); at += step) merge(s.feed(std::string_view(text).substr(at, step)));
  merge(s.finish());
  return total;
}

TEST(ChatOutputStream, ReasoningThenToolCallsStreamAsTheWholeMessage) {
  ChatOutputOptions options;
  options.tool_format = ToolCallFormat::kHermes;
  options.tools = kTools;
  options.reasoning_format = ReasoningFormat::kDeepSeekR1;
  const std::string text =
      "Need the weather.</think>Checking. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  ChatOutputStream whole(options);
  whole.finish(text);
  const json m = whole.message();
  EXPECT_EQ(m["reasoning_content"], "Need the weather.");
  EXPECT_EQ(m["content"], "Checking. ");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], "{\"a\":1}");
  EXPECT_EQ(m["tool_calls"][1]["type"], "function");
  EXPECT_TRUE(whole.has_tool_calls());

  for (size_t step : {1, 3, 7, 1000}) {
    const json s = streamed(options, text, step);
    EXPECT_EQ(s["reasoning_content"], m["reasoning_content"]) << step;
    EXPECT_EQ(s["content"], m["content"]) << step;
    ASSERT_EQ(s["tool_calls"].size(), 2u) << step;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(s["tool_calls"][i]["index"], static_cast<int>(i));
      EXPECT_EQ(s["tool_calls"][i]["function"], m["tool_calls"][i]["function"]);
      EXPECT_EQ(s["tool_calls"][i]["type"], "function");
      EXPECT_FALSE(s["tool_calls"][i]["id"].get<std::string>().empty());
    }
  }
}

// include_reasoning false drops the reasoning from deltas and message (the
// content stays the content); stream_reasoning false sends it as one delta
// when the content starts, or at the end when it never does.
TEST(ChatOutputStream, ReasoningLeftOutOrSentWhole) {
  ChatOutputOptions options;
  options.reasoning_format = ReasoningFormat::kDeepSeekR1;
  const std::string text = "Step one. Step two.</think>The answer.";
  options.include_reasoning = false;
  for (size_t step : {1, 4, 1000}) {
    ChatOutputStream s(options);
    json deltas = json::array();
    for (size_t at = 0; at < text.size(); at += step) deltas.push_back(s.feed(std::string_view(text).substr(at, step)));
    deltas.push_back(s.finish());
    for (const json& d : deltas) EXPECT_FALSE(d.contains("reasoning_content")) << d;
    EXPECT_FALSE(s.message().contains("reasoning_content"));
    EXPECT_EQ(s.message()["content"], "The answer.");
    EXPECT_EQ(streamed(options, text, step)["content"], "The answer.");
  }
  options.include_reasoning = true;
  options.stream_reasoning = false;
  for (const std::string& t : {text, std::string("Only thinking, cut off")}) {
    for (size_t step : {1, 4, 1000}) {
      ChatOutputStream s(options);
      std::vector<json> deltas;
      for (size_t at = 0; at < t.size(); at += step) deltas.push_back(s.feed(std::string_view(t).substr(at, step)));
      deltas.push_back(s.finish());
      int reasoning_deltas = 0;
      bool content_seen = false;
      for (const json& d : deltas) {
        if (d.contains("reasoning_content")) {
          ++reasoning_deltas;
          EXPECT_FALSE(content_seen) << "reasoning after content";
          EXPECT_EQ(d["reasoning_content"], s.message()["reasoning_content"]);
        }
        content_seen |= d.contains("content");
      }
      EXPECT_EQ(reasoning_deltas, 1) << t << " step " << step;
      EXPECT_EQ(streamed(options, t, step)["reasoning_content"], s.message()["reasoning_content"]);
    }
  }
}

TEST(ChatOutputStream, OnlyCallsMeansNullContentAndPlainTextHasNoCalls) {
  ChatOutputOptions options;
  options.tool_format = ToolCallFormat::kHermes;
  options.tools = kTools;
  ChatOutputStream calls(options);
  calls.finish("<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>");
  EXPECT_TRUE(calls.message()["content"].is_null());
  EXPECT_FALSE(calls.message().contains("reasoning_content"));

  ChatOutputStream text(options);
  text.feed("No tools <tool");
  text.finish("s needed.");
  EXPECT_EQ(text.message()["content"], "No tools <tools needed.");
  EXPECT_FALSE(text.message().contains("tool_calls"));
  EXPECT_FALSE(text.has_tool_calls());
}

TEST(ChatOutputStream, AnUnknownFunctionStaysContent) {
  ChatOutputOptions options;
  options.tool_format = ToolCallFormat::kHermes;
  options.tools = kTools;
  const std::string text = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>";
  ChatOutputStream s(options);
  s.finish(text);
  EXPECT_EQ(s.message()["content"], text);
  EXPECT_FALSE(s.has_tool_calls());
}

TEST(ChatOutputStream, ReasoningWithoutToolsHasNullReasoningWhenNoneCame) {
  ChatOutputOptions options;
  options.reasoning_format = ReasoningFormat::kQwen3;
  ChatOutputStream s(options);
  s.finish("Just an answer.");
  EXPECT_TRUE(s.message()["reasoning_content"].is_null());
  EXPECT_EQ(s.message()["content"], "Just an answer.");
}

}  // namespace
}  // namespace basalt
