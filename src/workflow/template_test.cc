// Templates: placeholders parsed, looked up and substituted; malformed ones
// and paths that do not resolve refused with where and why.
#include "workflow/template.h"

#include <gtest/gtest.h>

namespace basalt::workflow {
namespace {

using nlohmann::json;

const json kScope = json::parse(R"({
  "input": {"text": "hello", "items": ["a", "b"], "n": 3, "nested": {"k": [1, {"deep": true}]}},
  "steps": {"classify": {"output": {"category": "bug", "score": 0.5}}},
  "item": "b", "index": 1})");

TEST(Template, LiteralTextHasNoPaths) {
  const Template t = Template::parse("plain text } { }");
  EXPECT_FALSE(t.has_paths());
  EXPECT_EQ(t.render(kScope), "plain text } { }");
  EXPECT_EQ(Template::parse("").render(kScope), "");
}

TEST(Template, WholePlaceholderIsTheValueItself) {
  EXPECT_EQ(Template::parse("{{ input.items }}").render(kScope), json::parse(R"(["a","b"])"));
  EXPECT_EQ(Template::parse("{{input.n}}").render(kScope), 3);
  EXPECT_EQ(Template::parse("{{ input.nested.k[1].deep }}").render(kScope), true);
  EXPECT_EQ(Template::parse("{{ index }}").render(kScope), 1);
  EXPECT_TRUE(Template::parse("{{ item }}").whole_value());
  EXPECT_FALSE(Template::parse(" {{ item }}").whole_value());
}

TEST(Template, TextSubstitutionWritesStringsAsTheyAreAndOthersAsJson) {
  EXPECT_EQ(Template::parse("Say {{ input.text }}!").render(kScope), "Say hello!");
  EXPECT_EQ(Template::parse("{{ input.items }} and {{ input.n }}").render(kScope),
            R"(["a","b"] and 3)");
  EXPECT_EQ(Template::parse("{{ steps.classify.output.category }}/{{ item }}").render(kScope),
            "bug/b");
  EXPECT_EQ(Template::parse("{{ steps.classify.output }}.").render(kScope),
            R"({"category":"bug","score":0.5}.)");
}

TEST(Template, MalformedPlaceholdersNameTheColumn) {
  const auto error_of = [](const char* text) {
    try {
      Template::parse(text);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("ab {{ input.text").find("column 4 has no closing"), std::string::npos);
  EXPECT_NE(error_of("{{ }}").find("expected a name"), std::string::npos);
  EXPECT_NE(error_of("{{ 1abc }}").find("expected a name"), std::string::npos);
  EXPECT_NE(error_of("{{ input. }}").find("field name after '.'"), std::string::npos);
  EXPECT_NE(error_of("{{ input.items[x] }}").find("[N]"), std::string::npos);
  EXPECT_NE(error_of("{{ input.items[-1] }}").find("[N]"), std::string::npos);
  EXPECT_NE(error_of("{{ input.items[99999999999] }}").find("[N]"), std::string::npos);
  EXPECT_NE(error_of("{{ input.items[1 }}").find("[N]"), std::string::npos);
  EXPECT_NE(error_of("{{ input.text | upper }}").find("one path only"), std::string::npos);
  EXPECT_NE(error_of("{{ system('rm') }}").find("unexpected '('"), std::string::npos);
  EXPECT_NE(error_of("x {{ a-b }}").find("column 3"), std::string::npos);
}

TEST(Template, PathsThatDoNotResolveSayWhereTheyStopped) {
  const auto error_of = [](const char* text) {
    try {
      Template::parse(text).render(kScope);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("{{ nothing }}"), "'nothing' does not resolve: nothing is not defined here");
  EXPECT_EQ(error_of("{{ input.missing }}"),
            "'input.missing' does not resolve: input has no field 'missing'");
  EXPECT_EQ(error_of("{{ input.items[2] }}"),
            "'input.items[2]' does not resolve: input.items has 2 items, no index 2");
  EXPECT_EQ(error_of("{{ input.text.x }}"),
            "'input.text.x' does not resolve: input.text is string, not an object");
  EXPECT_EQ(error_of("{{ input.n[0] }}"),
            "'input.n[0]' does not resolve: input.n is number, not a list");
  EXPECT_EQ(error_of("{{ input }}"), "no error");
}

TEST(Template, RenderValueRendersEveryStringButNotKeys) {
  const json value = json::parse(
      R"({"{{ input.text }}": ["{{ item }}", 7, {"x": "{{ input.items }}"}], "n": null})");
  EXPECT_EQ(render_value(value, kScope),
            json::parse(R"({"{{ input.text }}": ["b", 7, {"x": ["a","b"]}], "n": null})"));
}

TEST(Template, CollectPathsLocatesEachString) {
  const json value =
      json::parse(R"({"a": ["x {{ input.text }}", "{{ steps.s.output }} {{ item }}"], "b": 1})");
  const std::vector<LocatedPath> paths = collect_paths(value);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0].where, ".a[0]");
  EXPECT_EQ(paths[0].path.text, "input.text");
  EXPECT_EQ(paths[1].where, ".a[1]");
  EXPECT_EQ(paths[1].path.root, "steps");
  ASSERT_EQ(paths[1].path.selectors.size(), 2u);
  EXPECT_EQ(paths[1].path.selectors[0].field, "s");
  EXPECT_EQ(paths[2].path.root, "item");
  try {
    collect_paths(json::parse(R"({"a": {"b": "{{ oops"}})"));
    FAIL() << "a malformed template was accepted";
  } catch (const TemplateError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(".a.b: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace basalt::workflow
