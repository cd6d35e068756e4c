// ToolCallParser: for each format, real-looking outputs (one call, parallel
// calls, text around them, markup-like text inside JSON strings, malformed
// and unknown calls), each parsed whole, one byte at a time and in random
// chunks, with the same result every way.
#include "chat_output/tool_call_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace basalt {
namespace {

using nlohmann::json;

const json& tools() {
  static const json kTools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "run_code", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "now"}}
  ])");
  return kTools;
}

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Call& call) { return out << call.name << call.arguments; }

struct Result {
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Result&) const = default;
};

bool valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Feeds the chunks, checks the deltas against calls() and the id rules, and
// returns what the deltas add up to.
Result run(ToolCallFormat format, const std::vector<std::string>& chunks, bool whole_code_points) {
  ToolCallParser parser(format, tools());
  Result result;
  std::vector<ToolCall> from_deltas;
  const auto take = [&](const ChatOutputDelta& delta) {
    if (whole_code_points) {
      EXPECT_TRUE(valid_utf8(delta.content)) << delta.content;
    }
    result.content += delta.content;
    for (const ToolCallDelta& d : delta.tool_calls) {
      EXPECT_EQ(d.index, static_cast<int>(from_deltas.size()) - (d.id.empty() ? 1 : 0));
      if (!d.id.empty()) from_deltas.push_back({d.id, d.name, ""});
      ASSERT_FALSE(from_deltas.empty());
      from_deltas.back().arguments += d.arguments;
    }
  };
  for (const std::string& chunk : chunks) take(parser.feed(chunk));
  take(parser.finish());
  EXPECT_EQ(parser.calls().size(), from_deltas.size());
  std::set<std::string> ids;
  for (size_t i = 0; i < from_deltas.size() && i < parser.calls().size(); ++i) {
    const ToolCall& call = parser.calls()[i];
    EXPECT_EQ(call.id, from_deltas[i].id);
    EXPECT_EQ(call.name, from_deltas[i].name);
    EXPECT_EQ(call.arguments, from_deltas[i].arguments);
    EXPECT_EQ(call.id.size(), 29u);
    EXPECT_TRUE(call.id.starts_with("call_")) << call.id;
    EXPECT_TRUE(ids.insert(call.id).second) << "duplicate id " << call.id;
    result.calls.push_back({call.name, call.arguments});
  }
  return result;
}

// The output parsed whole, byte by byte, and in random chunks (cut at code
// point boundaries, as a detokenizer gives text): the same every way.
Result parse(ToolCallFormat format, const std::string& output) {
  const Result whole = run(format, {output}, true);
  std::vector<std::string> bytes;
  for (const char c : output) bytes.emplace_back(1, c);
  EXPECT_EQ(run(format, bytes, false), whole) << "byte by byte: " << output;
  std::mt19937 rng(static_cast<uint32_t>(output.size()));
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < output.size();) {
      size_t n = std::uniform_int_distribution<size_t>(1, 12)(rng);
      while (i + n < output.size() && (static_cast<unsigned char>(output[i + n]) & 0xC0) == 0x80) ++n;
      chunks.push_back(output.substr(i, n));
      i += n;
    }
    EXPECT_EQ(run(format, chunks, true), whole) << "in chunks: " << output;
  }
  return whole;
}

void expect_calls(ToolCallFormat format, const std::string& output, const std::string& content,
                  const std::vector<Call>& calls) {
  const Result result = parse(format, output);
  EXPECT_EQ(result.content, content) << output;
  EXPECT_EQ(result.calls, calls) << output;
}

// Malformed markup: all of it is content, and nothing is a call.
void expect_content(ToolCallFormat format, const std::string& output) { expect_calls(format, output, output, {}); }

const Call kParis{"get_weather", R"({"city":"Paris","unit":"c"})"};
const Call kOslo{"get_weather", R"({"city":"Oslo"})"};
const Call kNow{"now", "{}"};

// --- hermes ---

TEST(ToolCallParserHermes, OneCallParallelCallsAndTextAround) {
  const ToolCallFormat f = ToolCallFormat::kHermes;
  const std::string paris =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  const std::string oslo = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>";
  expect_calls(f, paris, "", {kParis});
  expect_calls(f, "Let me check the weather.\n\n" + paris, "Let me check the weather.\n\n", {kParis});
  // Whitespace between and after calls is markup; text after them is not.
  expect_calls(f, paris + "\n" + oslo + "\n", "", {kParis, kOslo});
  expect_calls(f, paris + oslo + "\n<tool_call>{\"name\": \"now\"}</tool_call>", "", {kParis, kOslo, kNow});
  expect_calls(f, paris + "\n\nDone, 完了 🌤.", "\n\nDone, 完了 🌤.", {kParis});
  // Arguments given as a JSON string holding the object; escapes as dump() writes them.
  expect_calls(
      f, R"(<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}</tool_call>)", "",
      {kParis});
  expect_calls(f, R"(<tool_call>{"name": "get_weather", "arguments": {"city": "K\u00f8ge\/\u00e9"}}</tool_call>)", "",
               {{"get_weather", R"({"city":"Køge/é"})"}});
  // The closing tag may be missing at the very end (a stop string took it).
  expect_calls(f, paris.substr(0, paris.size() - 12) + "  \n", "", {kParis});
}

TEST(ToolCallParserHermes, MarkupInsideJsonStringsAndNesting) {
  const std::string code = R"(def f():\n    return \"}</tool_call><tool_call>{\"\n# {[(\\\"\u0007)";
  const std::string output =
      "Running it:<tool_call>\n{\"name\": \"run_code\", \"arguments\": {\"code\": \"" + code +
      "\", \"opts\": {\"a\": [1, -2.5e3, {\"b\": null}], \"c\": true, \"d\": {}}}}\n</tool_call>";
  const std::string args = json::parse("{\"code\": \"" + code + "\"}")["code"].dump();
  expect_calls(ToolCallFormat::kHermes, output, "Running it:",
               {{"run_code", "{\"code\":" + args + R"(,"opts":{"a":[1,-2500.0,{"b":null}],"c":true,"d":{}}})"}});
}

TEST(ToolCallParserHermes, PlainTextPassesAtOnceAndPartialMarkersAreHeld) {
  ToolCallParser parser(ToolCallFormat::kHermes, tools());
  EXPECT_EQ(parser.feed("Hello <b>wor").content, "Hello <b>wor");
  EXPECT_EQ(parser.feed("ld</b> 1 < 2 <tool_").content, "ld</b> 1 < 2 ");
  EXPECT_EQ(parser.feed("box> x").content, "<tool_box> x");
  EXPECT_EQ(parser.feed(" <").content, " ");
  EXPECT_EQ(parser.finish().content, "<");
  EXPECT_TRUE(parser.calls().empty());
  expect_content(ToolCallFormat::kHermes, "a < b and <tool_calls> are <tool_call no");
}

TEST(ToolCallParserHermes, MalformedCallsAreContent) {
  const ToolCallFormat f = ToolCallFormat::kHermes;
  expect_content(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call> after");
  expect_content(f, "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {}}\n</tool_call>");  // unknown
  expect_content(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>");
  expect_content(f, "<tool_call>\n{\"name\": \"get_weather\", \"argu");  // cut off
  expect_content(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_");
  expect_content(f, "<tool_call>\nget_weather(city='Paris')\n</tool_call>");
  expect_content(f, "<tool_call>{\"name\": \"now\"} trailing</tool_call>");
  expect_content(f, "<tool_call>{\"name\": \"now\", \"arguments\": {}, \"parameters\": {}}</tool_call>");
  // A bad call between good ones: only it is content.
  const std::string good = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  const std::string bad = "<tool_call>{\"name\": \"now\", \"arguments\": {]}</tool_call>";
  expect_calls(f, good + "\n" + bad + "\n" + good, bad + "\n", {kNow, kNow});
  // A call cut off by the next one's opening tag.
  expect_calls(f, "<tool_call>{\"name\": \"now\", " + good, "<tool_call>{\"name\": \"now\", ", {kNow});
}

TEST(ToolCallParserHermes, NoToolsMeansNoCalls) {
  ToolCallParser parser(ToolCallFormat::kHermes, json());
  const std::string output = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(parser.feed(output).content + parser.finish().content, output);
  EXPECT_TRUE(parser.calls().empty());
}

// --- llama3_json ---

TEST(ToolCallParserLlama3, CallsAreTheWholeOutput) {
  const ToolCallFormat f = ToolCallFormat::kLlama3Json;
  const std::string paris = R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}})";
  expect_calls(f, paris, "", {kParis});
  expect_calls(f, "<|python_tag|>" + paris, "", {kParis});
  expect_calls(f, "\n <|python_tag|> " + paris + "\n", "", {kParis});
  expect_calls(f, R"({"name": "get_weather", "arguments": {"city": "Oslo"}})", "", {kOslo});
  expect_calls(f,
               paris + "; " + R"({"name": "now", "parameters": {}})" +
                   ";{\"name\": \"get_weather\", "
                   "\"parameters\": {\"city\": \"Oslo\"}}",
               "", {kParis, kNow, kOslo});
  expect_calls(f, paris + " Hope that helps; {\"name\"", " Hope that helps; {\"name\"", {kParis});
  expect_calls(f, paris + "; not a call", "; not a call", {kParis});
  expect_calls(f, R"({"name": "run_code", "parameters": {"code": "x = {\"}\": ';'}; y = \"<|python_tag|>\""}})", "",
               {{"run_code", R"({"code":"x = {\"}\": ';'}; y = \"<|python_tag|>\""})"}});
}

TEST(ToolCallParserLlama3, TextAndOtherJsonAreContent) {
  const ToolCallFormat f = ToolCallFormat::kLlama3Json;
  expect_content(f, "The weather in Paris is {\"temp\": 21}.");
  expect_content(f, "\n\nSure! Here you go: 🌍");
  expect_content(f, R"({"answer": 42, "name": "Bob"})");
  expect_content(f, R"({"name": "send_email", "parameters": {}})");
  expect_content(f, "<|python_tag|>brave_search.call(query=\"weather\")");
  expect_content(f, "{\"name\": \"now\", \"parameters\": {}");  // cut off
  expect_content(f, "<|python");
  expect_content(f, "  ");
}

// --- mistral ---

TEST(ToolCallParserMistral, ArraysAndArgsMarkers) {
  const ToolCallFormat f = ToolCallFormat::kMistral;
  const std::string array = R"([{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, )"
                            R"({"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}])";
  expect_calls(f, "[TOOL_CALLS]" + array, "", {kParis, kOslo});
  expect_calls(f, "[TOOL_CALLS] " + array, "", {kParis, kOslo});
  expect_calls(f, "Checking both. [TOOL_CALLS]" + array + " ok", "Checking both.  ok", {kParis, kOslo});
  expect_calls(f, "ok" + array, "ok" + array, {});            // a bare array is calls only as the whole output
  expect_calls(f, "\n" + array + "\n", "", {kParis, kOslo});  // what the grammar writes
  expect_calls(f, R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}[TOOL_CALLS]now[ARGS]{})", "",
               {kParis, kNow});
  expect_calls(f, R"([TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city":"Oslo"})", "", {kOslo});
  expect_calls(f, R"([TOOL_CALLS] [{"name": "run_code", "arguments": {"a": {"b": [{"c": "]}"}, []], "d": {}}}}])", "",
               {{"run_code", R"({"a":{"b":[{"c":"]}"},[]],"d":{}}})"}});
  expect_calls(f, R"(Sure.[TOOL_CALLS]run_code[ARGS]{"code": "[TOOL_CALLS]x[ARGS]{}"})", "Sure.",
               {{"run_code", R"({"code":"[TOOL_CALLS]x[ARGS]{}"})"}});
}

TEST(ToolCallParserMistral, MalformedCallsAreContent) {
  const ToolCallFormat f = ToolCallFormat::kMistral;
  expect_content(f, "[1] First, the list [2] then");
  expect_content(f, "[TOOL_CALLS");
  expect_content(f, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "nope", "arguments": {}}])");
  expect_content(f, R"([TOOL_CALLS][])");
  expect_content(f, R"([TOOL_CALLS]nope[ARGS]{})");
  expect_content(f, R"([TOOL_CALLS]now[ARGS][1])");
  expect_content(f, R"([TOOL_CALLS]now {})");
  expect_content(f, R"([{"name": "now", "arguments": {}})");
  expect_calls(f, R"([TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{)", "[TOOL_CALLS]now[ARGS]{", {kNow});
}

// --- deepseek_v3 / deepseek_v31 ---

std::string v3_call(const std::string& name, const std::string& args) {
  return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args + "\n```<｜tool▁call▁end｜>";
}
std::string v31_call(const std::string& name, const std::string& args) {
  return "<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜>";
}
const std::string kBegin = "<｜tool▁calls▁begin｜>";
const std::string kEnd = "<｜tool▁calls▁end｜>";

TEST(ToolCallParserDeepSeek, V3) {
  const ToolCallFormat f = ToolCallFormat::kDeepSeekV3;
  const std::string paris = v3_call("get_weather", R"({"city": "Paris", "unit": "c"})");
  const std::string oslo = v3_call("get_weather", R"({"city": "Oslo"})");
  expect_calls(f, kBegin + paris + kEnd, "", {kParis});
  expect_calls(f, "I'll look both up.\n\n" + kBegin + paris + "\n" + oslo + kEnd + "\n", "I'll look both up.\n\n",
               {kParis, kOslo});
  expect_calls(f, kBegin + paris + oslo, "", {kParis, kOslo});  // cut off after whole calls
  expect_calls(f, kBegin + v3_call("run_code", R"({"s": "```<｜tool▁call▁end｜>\n```"})") + kEnd + "Done.", "Done.",
               {{"run_code", R"({"s":"```<｜tool▁call▁end｜>\n```"})"}});
  // Malformed: no fence, unknown name, wrong type, cut off.
  expect_content(f, kBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n{}<｜tool▁call▁end｜>" + kEnd);
  expect_content(f, kBegin + v3_call("send_email", "{}") + kEnd);
  expect_content(f, kBegin + "<｜tool▁call▁begin｜>tool<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>" + kEnd);
  expect_content(f, kBegin + paris.substr(0, paris.size() - 5));
  expect_content(f, "text <｜tool▁calls");
  // Whitespace before a malformed call is content with it.
  expect_calls(f, kBegin + paris + "\n" + v3_call("now", "{") + kEnd, "\n" + v3_call("now", "{") + kEnd, {kParis});
}

TEST(ToolCallParserDeepSeek, V31) {
  const ToolCallFormat f = ToolCallFormat::kDeepSeekV31;
  const std::string paris = v31_call("get_weather", R"({"city": "Paris", "unit": "c"})");
  expect_calls(f, kBegin + paris + kEnd, "", {kParis});
  expect_calls(
      f,
      "Sure — 好的.\n" + kBegin + paris + v31_call("now", "{}") + v31_call("get_weather", R"({"city":"Oslo"})") + kEnd,
      "Sure — 好的.\n", {kParis, kNow, kOslo});
  expect_calls(f, kBegin + v31_call("run_code", R"({"x": {"y": ["<｜tool▁sep｜>", {"z": null}]}})") + kEnd, "",
               {{"run_code", R"({"x":{"y":["<｜tool▁sep｜>",{"z":null}]}})"}});
  expect_content(f, kBegin + v31_call("get_weather", "[]") + kEnd);
  expect_content(f, kBegin + v31_call("nope", "{}") + kEnd);
  expect_content(f, kBegin + "<｜tool▁call▁begin｜>now\n<｜tool▁sep｜>{}<｜tool▁call▁end｜>" + kEnd);
  expect_content(f, kBegin + "junk" + kEnd);
  expect_content(f, kBegin + kEnd + "hi");  // an empty block is no call
  expect_content(f, kBegin);
}

TEST(ToolCallParser, HeldTextIsBounded) {
  // In each format, a call that keeps going (a long string, a long name,
  // leading whitespace) goes out as content once past the limit.
  const std::string huge(ToolCallParser::kMaxHeldBytes + 100, 'x');
  const std::string spaces(ToolCallParser::kMaxHeldBytes + 100, ' ');
  const std::string args = "{\"code\": \"" + huge + "\"}";
  const std::pair<ToolCallFormat, std::string> outputs[] = {
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"run_code\", \"arguments\": " + args + "}</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>" + spaces + "{}</tool_call>"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"run_code\", \"parameters\": " + args + "}"},
      {ToolCallFormat::kLlama3Json, spaces + "{\"name\": \"now\"}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]" + huge + "[ARGS]{}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]run_code[ARGS]" + args},
      {ToolCallFormat::kDeepSeekV3, kBegin + v3_call(huge, "{}") + kEnd},
      {ToolCallFormat::kDeepSeekV31, kBegin + v31_call("run_code", args) + kEnd},
  };
  for (const auto& [format, output] : outputs) {
    ToolCallParser parser(format, tools());
    std::string content;
    size_t most_held = 0;
    for (size_t i = 0; i < output.size(); i += 4096) {
      content += parser.feed(output.substr(i, 4096)).content;
      most_held = std::max(most_held, std::min(output.size(), i + 4096) - content.size());
    }
    content += parser.finish().content;
    EXPECT_EQ(content, output) << to_string(format);
    EXPECT_TRUE(parser.calls().empty());
    EXPECT_LE(most_held, ToolCallParser::kMaxHeldBytes + 4096) << to_string(format);
  }
}

// Outputs of every format fed in every way never throw, whatever the bytes.
TEST(ToolCallParser, RandomBytesNeverThrow) {
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "\\",
                                           ":",
                                           ",",
                                           "\"name\"",
                                           "\"now\"",
                                           "\"arguments\"",
                                           "[TOOL_CALLS]",
                                           "[ARGS]",
                                           "now",
                                           "<|python_tag|>",
                                           ";",
                                           " ",
                                           "\n",
                                           "<｜tool▁calls▁begin｜>",
                                           "function",
                                           "<｜tool▁call▁begin｜>",
                                           "<｜tool▁sep｜>",
                                           "```json",
                                           "```",
                                           "1",
                                           "é",
                                           "<｜tool▁call▁end｜>",
                                           "<｜tool▁calls▁end｜>",
                                           "\xff",
                                           "null"};
  for (const ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                                 ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::string output;
      const int n = std::uniform_int_distribution<int>(1, 30)(rng);
      for (int i = 0; i < n; ++i) output += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
      const Result result = run(f, {output}, false);
      std::vector<std::string> bytes;
      for (const char c : output) bytes.emplace_back(1, c);
      EXPECT_EQ(run(f, bytes, false), result) << output;
      if (result.calls.empty()) {
        EXPECT_EQ(result.content, output);
      }
    }
  }
}

}  // namespace
}  // namespace basalt
