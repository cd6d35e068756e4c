// tool_call_grammar: for each format, random sentences of the grammar are
// accepted by its compiled matcher and parse back (ToolCallParser) into
// exactly the calls they were generated from; hand-written outputs are
// accepted or rejected; schemas that cannot be translated are named.
#include "chat_output/tool_call_grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "chat_output/tool_call_parser.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "testing/error_test_util.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

using nlohmann::ordered_json;

const ordered_json& tools() {
  static const ordered_json kTools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                        "unit": {"enum": ["c", "f"]}},
                       "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "add", "parameters": {"properties": {
        "a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"],
        "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now"}},
    {"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "$defs": {"step": {
        "type": "object", "properties": {"do": {"type": "string"}, "then": {"type": "array",
        "items": {"$ref": "#/$defs/step"}, "maxItems": 2}}, "required": ["do"], "additionalProperties": false}},
        "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1, "maxItems": 3}},
        "required": ["steps"]}}}
  ])");
  return kTools;
}

constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                                       ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31};

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Call& call) { return out << call.name << call.arguments; }

// Random sentences of a grammar, walking its rules; past a depth it takes the
// shortest way out, so every walk ends. The text each "fnK.root" rule
// produced is recorded as a call of tools[K].
class SentenceGenerator {
 public:
  SentenceGenerator(const Grammar& grammar, uint32_t seed) : grammar_(grammar), rng_(seed) {
    constexpr int64_t kInfinite = std::numeric_limits<int32_t>::max();
    cost_.assign(grammar.rules.size(), kInfinite);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < grammar.rules.size(); ++r) {
        const int64_t c = std::min(kInfinite, cost(grammar.rules[r].body) + 1);
        if (c < cost_[r]) cost_[r] = c, changed = true;
      }
    }
  }

  std::string sentence(std::vector<Call>& calls) {
    std::string out;
    calls.clear();
    generate_rule(grammar_.root, 0, out, calls);
    return out;
  }

 private:
  int64_t cost(const GrammarExpr& e) const {
    constexpr int64_t kInfinite = std::numeric_limits<int32_t>::max();
    switch (e.kind) {
      case GrammarExpr::Kind::kBytes:
        return static_cast<int64_t>(e.bytes.size());
      case GrammarExpr::Kind::kClass:
        return 1;
      case GrammarExpr::Kind::kRuleRef:
        return cost_[static_cast<size_t>(e.rule)];
      case GrammarExpr::Kind::kSequence: {
        int64_t sum = 0;
        for (const GrammarExpr& child : e.children) sum = std::min(kInfinite, sum + cost(child));
        return sum;
      }
      case GrammarExpr::Kind::kChoice: {
        int64_t best = kInfinite;
        for (const GrammarExpr& child : e.children) best = std::min(best, cost(child));
        return best;
      }
      case GrammarExpr::Kind::kRepeat:
        return e.min == 0 ? 0 : std::min(kInfinite, e.min * cost(e.children[0]));
    }
    return kInfinite;
  }

  void generate_rule(int32_t rule, int depth, std::string& out, std::vector<Call>& calls) {
    const std::string& name = grammar_.rules[static_cast<size_t>(rule)].name;
    const size_t start = out.size();
    generate(grammar_.rules[static_cast<size_t>(rule)].body, depth + 1, out, calls);
    const size_t digits = name.find_first_not_of("0123456789", 2);
    if (name.starts_with("fn") && digits > 2 && digits != std::string::npos && name.substr(digits) == ".root") {
      const size_t index = std::stoul(name.substr(2, digits - 2));
      const std::string text = out.substr(start);
      calls.push_back({tools()[index]["function"]["name"].get<std::string>(), ordered_json::parse(text).dump()});
    }
  }

  void generate(const GrammarExpr& e, int depth, std::string& out, std::vector<Call>& calls) {
    const bool deep = depth > 12;
    switch (e.kind) {
      case GrammarExpr::Kind::kBytes:
        out += e.bytes;
        return;
      case GrammarExpr::Kind::kClass:
        unicode::append_utf8(pick(e), out);
        return;
      case GrammarExpr::Kind::kRuleRef:
        generate_rule(e.rule, depth, out, calls);
        return;
      case GrammarExpr::Kind::kSequence:
        for (const GrammarExpr& child : e.children) generate(child, depth, out, calls);
        return;
      case GrammarExpr::Kind::kChoice: {
        size_t chosen = std::uniform_int_distribution<size_t>(0, e.children.size() - 1)(rng_);
        if (deep) {
          for (size_t i = 0; i < e.children.size(); ++i)
            if (cost(e.children[i]) < cost(e.children[chosen])) chosen = i;
        }
        generate(e.children[chosen], depth, out, calls);
        return;
      }
      case GrammarExpr::Kind::kRepeat: {
        int32_t n = e.min;
        while (!deep && (e.max < 0 || n < e.max) && n < e.min + 4 && coin(0.5)) ++n;
        for (int32_t i = 0; i < n; ++i) generate(e.children[0], depth, out, calls);
        return;
      }
    }
  }

  bool coin(double p) { return std::bernoulli_distribution(p)(rng_); }

  static bool in(const GrammarExpr& e, uint32_t c) {
    const bool listed = std::any_of(e.ranges.begin(), e.ranges.end(),
                                    [&](const auto& range) { return range.first <= c && c <= range.second; });
    return listed != e.negated;
  }

  char32_t pick(const GrammarExpr& e) {
    static constexpr uint32_t kCandidates[] = {'a', 'Z', '7', ' ',  '_',    '"',     '\\',   '<', '{',
                                               '}', '[', ';', 0xE9, 0x4E2D, 0x1F600, 0xFF5C, '\n'};
    for (int tries = 0; tries < 64; ++tries) {
      uint32_t c;
      if (!e.negated && coin(0.7)) {
        const auto& range = e.ranges[std::uniform_int_distribution<size_t>(0, e.ranges.size() - 1)(rng_)];
        c = std::uniform_int_distribution<uint32_t>(range.first, std::min(range.second, range.first + 200))(rng_);
      } else {
        c = kCandidates[std::uniform_int_distribution<size_t>(0, std::size(kCandidates) - 1)(rng_)];
      }
      if ((c < 0xD800 || c > 0xDFFF) && in(e, c)) return c;
    }
    for (uint32_t c = 0x20; c < 0x10FFFF; ++c)
      if ((c < 0xD800 || c > 0xDFFF) && in(e, c)) return c;
    ADD_FAILURE() << "an empty class";
    return 'a';
  }

  const Grammar& grammar_;
  std::mt19937 rng_;
  std::vector<int64_t> cost_;
};

std::vector<Call> parse_calls(ToolCallFormat format, const std::string& output, std::string* content) {
  ToolCallParser parser(format, nlohmann::json::parse(tools().dump()));
  *content = parser.feed(output).content;
  *content += parser.finish().content;
  std::vector<Call> calls;
  for (const ToolCall& call : parser.calls()) calls.push_back({call.name, call.arguments});
  return calls;
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& grammar, const std::string& text) {
  GrammarMatcher matcher(grammar);
  return matcher.accept_bytes(text) && matcher.can_end();
}

TEST(ToolCallGrammar, SentencesParseBackIntoTheirCalls) {
  for (const ToolCallFormat format : kFormats) {
    for (const bool parallel : {false, true}) {
      const std::string ebnf = tool_call_grammar(format, tools(), ToolChoiceMode::kRequired, "", parallel);
      const Grammar grammar = parse_ebnf(ebnf);
      const auto compiled = compile_grammar(grammar);
      SentenceGenerator generator(grammar, 17);
      std::map<std::string, int> names_seen;
      size_t most_calls = 0;
      for (int i = 0; i < 60; ++i) {
        std::vector<Call> expected;
        const std::string sentence = generator.sentence(expected);
        ASSERT_TRUE(accepts(compiled, sentence)) << to_string(format) << ": " << sentence << "\n" << ebnf;
        std::string content;
        EXPECT_EQ(parse_calls(format, sentence, &content), expected) << to_string(format) << ": " << sentence;
        EXPECT_EQ(content, "") << to_string(format) << ": " << sentence;
        for (const Call& call : expected) ++names_seen[call.name];
        most_calls = std::max(most_calls, expected.size());
      }
      EXPECT_EQ(names_seen.size(), 4u) << to_string(format);
      if (parallel) {
        EXPECT_GT(most_calls, 1u) << to_string(format);
      } else {
        EXPECT_EQ(most_calls, 1u) << to_string(format);
      }
    }
  }
}

// With a reasoning parser on, the calls follow the reasoning block: its
// text is anything without "</think>" (checked against a plain search over
// random texts dense in the tag's pieces), and the parser splits the output
// back into that text and calls that parse.
TEST(ToolCallGrammar, ReasoningBeforeTheCalls) {
  const std::string call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":2}}\n</tool_call>";
  struct Case {
    ReasoningPrefix prefix;
    std::string open;  // what the output writes before the reasoning text
    bool reasoning_optional;
  };
  const Case cases[] = {{{ReasoningFormat::kDeepSeekR1, false}, "", false},
                        {{ReasoningFormat::kDeepSeekR1, false}, "<think>", false},
                        {{ReasoningFormat::kQwen3, true}, "", false},
                        {{ReasoningFormat::kQwen3, false}, "<think>", true}};
  std::mt19937 rng(23);
  const std::string pieces[] = {"<", "/", "t", "h", "i", "n", "k", ">", "a", "</", "</think", "<<", "é"};
  for (const Case& c : cases) {
    const auto compiled = compile_grammar(parse_ebnf(
        tool_call_grammar(ToolCallFormat::kHermes, tools(), ToolChoiceMode::kNamed, "add", false, c.prefix)));
    EXPECT_EQ(accepts(compiled, call), c.reasoning_optional);
    int with_tag = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string text;
      const int n = static_cast<int>(rng() % 9);
      for (int j = 0; j < n; ++j) text += pieces[rng() % std::size(pieces)];
      const bool has_tag = text.find("</think>") != std::string::npos;
      with_tag += has_tag;
      const std::string output = c.open + text + "</think>\n" + call;
      ASSERT_EQ(accepts(compiled, output), !has_tag) << output;
      if (has_tag) continue;
      ReasoningParser parser(c.prefix.format, c.prefix.starts_in_reasoning);
      ReasoningDelta d = parser.feed(output);
      const ReasoningDelta end = parser.finish();
      d.reasoning += end.reasoning;
      d.content += end.content;
      EXPECT_EQ(d.reasoning, text) << output;
      std::string content;
      EXPECT_EQ(parse_calls(ToolCallFormat::kHermes, d.content, &content).size(), 1u) << output;
    }
    EXPECT_GT(with_tag, 10);
  }
}

TEST(ToolCallGrammar, NamedFunctionOnly) {
  for (const ToolCallFormat format : kFormats) {
    const Grammar grammar = parse_ebnf(tool_call_grammar(format, tools(), ToolChoiceMode::kNamed, "add", true));
    SentenceGenerator generator(grammar, 5);
    for (int i = 0; i < 20; ++i) {
      std::vector<Call> expected;
      const std::string sentence = generator.sentence(expected);
      ASSERT_EQ(expected.size(), 1u) << sentence;
      EXPECT_EQ(expected[0].name, "add");
      std::string content;
      EXPECT_EQ(parse_calls(format, sentence, &content), expected) << sentence;
    }
  }
}

TEST(ToolCallGrammar, HandWrittenOutputs) {
  const auto grammar = [](ToolCallFormat format, ToolChoiceMode mode, bool parallel) {
    return compile_grammar(parse_ebnf(tool_call_grammar(format, tools(), mode, "get_weather", parallel)));
  };
  const auto hermes = grammar(ToolCallFormat::kHermes, ToolChoiceMode::kRequired, true);
  const std::string paris =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>";
  const std::string add = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":-3,\"b\":99}}\n</tool_call>";
  EXPECT_TRUE(accepts(hermes, paris));
  EXPECT_TRUE(accepts(hermes, paris + "\n" + add));
  EXPECT_FALSE(accepts(hermes, ""));
  EXPECT_FALSE(accepts(hermes, "Sure. " + paris));                    // text before
  EXPECT_FALSE(accepts(hermes, paris.substr(12)));                    // no marker
  EXPECT_FALSE(accepts(hermes, paris.substr(0, paris.size() - 12)));  // no closing tag
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));  // name
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":100}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                       "</tool_call>"));  // not compact
  EXPECT_FALSE(accepts(hermes,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\","
                       "\"x\":1}}\n</tool_call>"));  // additionalProperties: false
  EXPECT_TRUE(accepts(hermes, "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"any\":[1,{}]}}\n</tool_call>"));
  EXPECT_FALSE(accepts(hermes, "<tool_call>\n{\"name\": \"now\", \"arguments\": [1]}\n</tool_call>"));

  const auto single = grammar(ToolCallFormat::kHermes, ToolChoiceMode::kRequired, false);
  EXPECT_TRUE(accepts(single, add));
  EXPECT_FALSE(accepts(single, paris + "\n" + add));
  const auto named = grammar(ToolCallFormat::kHermes, ToolChoiceMode::kNamed, true);
  EXPECT_TRUE(accepts(named, paris));
  EXPECT_FALSE(accepts(named, add));
  EXPECT_FALSE(accepts(named, paris + "\n" + paris));

  const auto llama = grammar(ToolCallFormat::kLlama3Json, ToolChoiceMode::kRequired, true);
  EXPECT_TRUE(accepts(llama, R"({"name": "get_weather", "parameters": {"city":"Oslo","unit":"f"}}; )"
                             R"({"name": "now", "parameters": {}})"));
  EXPECT_FALSE(accepts(llama, R"({"name": "get_weather", "parameters": {"unit":"f","city":"Oslo"}})"));
  EXPECT_FALSE(accepts(llama, R"({"name": "get_weather", "parameters": {"city":"Oslo","unit":"k"}})"));

  const auto mistral = grammar(ToolCallFormat::kMistral, ToolChoiceMode::kRequired, true);
  EXPECT_TRUE(accepts(mistral, R"([{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a":0,"b":0}}])"));
  EXPECT_FALSE(accepts(mistral, R"([TOOL_CALLS][{"name": "now", "arguments": {}}])"));
  EXPECT_FALSE(accepts(mistral, R"([])"));

  const auto v3 = grammar(ToolCallFormat::kDeepSeekV3, ToolChoiceMode::kRequired, true);
  const std::string v3_now = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>";
  EXPECT_TRUE(accepts(v3, "<｜tool▁calls▁begin｜>" + v3_now + "\n" + v3_now + "<｜tool▁calls▁end｜>"));
  EXPECT_FALSE(accepts(v3, "<｜tool▁calls▁begin｜>" + v3_now));
  const auto v31 = grammar(ToolCallFormat::kDeepSeekV31, ToolChoiceMode::kRequired, true);
  const std::string v31_now = "<｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
  EXPECT_TRUE(accepts(v31, "<｜tool▁calls▁begin｜>" + v31_now + v31_now + "<｜tool▁calls▁end｜>"));
  EXPECT_FALSE(accepts(v31, "<｜tool▁calls▁begin｜>" + v3_now + "<｜tool▁calls▁end｜>"));

  // A valid output parses back to its calls.
  std::string content;
  EXPECT_EQ(parse_calls(ToolCallFormat::kHermes, paris + "\n" + add, &content),
            (std::vector<Call>{{"get_weather", R"({"city":"Paris"})"}, {"add", R"({"a":-3,"b":99})"}}));
  EXPECT_EQ(content, "");
}

TEST(ToolCallGrammar, ErrorsNameTheFunction) {
  const auto error = [](const std::string& tools_text, ToolChoiceMode mode = ToolChoiceMode::kRequired,
                        ToolCallFormat format = ToolCallFormat::kHermes) {
    return testing::error_of(
        [&] { tool_call_grammar(format, ordered_json::parse(tools_text), mode, "missing", false); });
  };
  const std::string bad_schema = R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"a": {"not": {"minLength": 2}}}}}}])";
  EXPECT_CONTAINS(error(bad_schema), "function \"f\"");
  EXPECT_CONTAINS(error(bad_schema), "unsupported keyword \"not\" at #/properties/a");
  EXPECT_CONTAINS(error(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])"),
                  "must be an object schema");
  EXPECT_CONTAINS(error("[]"), "no tools");
  EXPECT_CONTAINS(error(R"([{"type": "function", "function": {"name": "f"}}])", ToolChoiceMode::kNamed),
                  "\"missing\" is not among the tools");
  EXPECT_CONTAINS(error(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function",
                           "function": {"name": "f"}}])"),
                  "defined twice");
  EXPECT_CONTAINS(error(R"([{"type": "function", "function": {"name": "a b"}}])", ToolChoiceMode::kRequired,
                        ToolCallFormat::kDeepSeekV3),
                  "cannot be written");
  // Unnamed entries are refused; an empty schema or none is any object.
  EXPECT_CONTAINS(error(R"([{"type": "function"}])"), "tools[0] has no function name");
  const Grammar any = parse_ebnf(tool_call_grammar(
      ToolCallFormat::kLlama3Json, ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
          "parameters": {}}}])"),
      ToolChoiceMode::kRequired, "", false));
  EXPECT_TRUE(grammar_matches(any, R"({"name": "f", "parameters": {"x":[true]}})"));
  EXPECT_FALSE(grammar_matches(any, R"({"name": "f", "parameters": 1})"));
}

}  // namespace
}  // namespace basalt
