// Structural tags (grammar/structural_tag.h): the text rule against a
// direct search for the triggers over every short string of an alphabet
// that holds the triggers' characters and others; whole outputs with and
// without structures; and the refusals, each naming its field.
#include "grammar/structural_tag.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "testing/error_test_util.h"

namespace basalt {
namespace {

using basalt::testing::error_of;
using nlohmann::ordered_json;

ordered_json tag(const std::vector<std::string>& triggers, const ordered_json& structures) {
  return {{"structures", structures}, {"triggers", triggers}};
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// Every string of up to `length` characters of `alphabet` (UTF-8 pieces):
// the text rule takes exactly those in which no trigger occurs.
void expect_text_rule(const std::vector<std::string>& triggers, const std::vector<std::string>& alphabet,
                      int length) {
  const ordered_json structures = ordered_json::array(
      {{{"begin", triggers[0] + "!"}, {"schema", {{"type", "integer"}}}, {"end", "."}}});
  const std::string ebnf = structural_tag_to_ebnf(tag(triggers, structures));
  const auto text = compile_grammar(parse_ebnf(ebnf, "st-text"));
  std::vector<std::string> level = {""};
  int64_t checked = 0;
  for (int n = 0; n <= length; ++n) {
    std::vector<std::string> next;
    for (const std::string& s : level) {
      bool has_trigger = false;
      for (const std::string& t : triggers) has_trigger = has_trigger || s.find(t) != std::string::npos;
      EXPECT_EQ(matches(text, s), !has_trigger) << "\"" << s << "\"\n" << ebnf;
      ++checked;
      if (n < length)
        for (const std::string& c : alphabet) next.push_back(s + c);
    }
    level = std::move(next);
  }
  EXPECT_GT(checked, 1000);
}

TEST(StructuralTag, TextIsEveryStringWithoutATrigger) {
  expect_text_rule({"<f="}, {"<", "f", "=", "x"}, 7);
  // Triggers sharing a first character, one inside another's path, one
  // of a single character, and a code point past ASCII.
  expect_text_rule({"<ab", "<c", "[d", "@"}, {"<", "a", "b", "c", "[", "d", "@", "é"}, 5);
  expect_text_rule({"«é»"}, {"«", "é", "»", "e"}, 6);
}

TEST(StructuralTag, StructuresFollowTheirTriggers) {
  const ordered_json structures = ordered_json::array(
      {{{"begin", "<function=get_weather>"},
        {"schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}},
                    {"additionalProperties", false}}},
        {"end", "</function>"}},
       {{"begin", "<function=add>"},
        {"schema", {{"type", "array"}, {"items", {{"type", "integer"}}}}},
        {"end", "</function>"}}});
  const std::string ebnf = structural_tag_to_ebnf(tag({"<function="}, structures));
  const auto g = compile_grammar(parse_ebnf(ebnf));
  for (const std::string& ok :
       {std::string(""), std::string("Let me look that up."),
        std::string("Sure. <function=get_weather>{\"city\":\"Paris\"}</function>"),
        std::string("<function=add>[1,2]</function> and <function=get_weather>{\"city\":\"Oslo\"}</function> done"),
        std::string("a <<function=add>[]</function>"), std::string("ends on a partial <function")})
    EXPECT_TRUE(matches(g, ok)) << ok << "\n" << ebnf;
  for (const std::string& bad :
       {std::string("<function=other>{}</function>"), std::string("<function=get_weather>{\"town\":\"Paris\"}</function>"),
        std::string("<function=add>[1,2]"), std::string("<function=add>[\"x\"]</function>"),
        std::string("text <function= then text")})
    EXPECT_FALSE(matches(g, bad)) << bad << "\n" << ebnf;
}

TEST(StructuralTag, RefusalsNameTheField) {
  const ordered_json one = ordered_json::array({{{"begin", "<t>"}, {"schema", {{"type", "integer"}}}, {"end", "</t>"}}});
  const auto refused = [](const ordered_json& spec) { return error_of([&] { structural_tag_to_ebnf(spec); }); };
  EXPECT_NE(refused(tag({"<x"}, one)).find("structures[0].begin"), std::string::npos);
  EXPECT_NE(refused(tag({"<a<"}, one)).find("triggers[0]"), std::string::npos);
  EXPECT_NE(refused(tag({""}, one)).find("triggers[0]"), std::string::npos);
  EXPECT_NE(refused(tag({"<"}, ordered_json::array())).find("structures"), std::string::npos);
  EXPECT_NE(refused({{"structures", one}}).find("triggers"), std::string::npos);
  EXPECT_NE(refused({{"structures", one}, {"triggers", {"<"}}, {"format", 1}}).find("'format'"), std::string::npos);
  ordered_json no_end = one;
  no_end[0].erase("end");
  EXPECT_NE(refused(tag({"<"}, no_end)).find("structures[0]"), std::string::npos);
  ordered_json bad_schema = one;
  bad_schema[0]["schema"] = {{"type", "integer"}, {"minimum", "x"}};
  EXPECT_NE(refused(tag({"<"}, bad_schema)).find("structures[0].schema"), std::string::npos);
}

}  // namespace
}  // namespace basalt
