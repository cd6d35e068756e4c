// Unit tests of the Jinja interpreter: one rendering per feature, compared
// with Python jinja2's output (testdata/chat_templates/features.json, written
// by tools/fixtures/make_chat_template_fixtures.py), then errors and limits.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "testing/error_test_util.h"
#include "template/jinja.h"
#include "testing/template_test_util.h"

namespace basalt {
namespace {

using basalt::testing::error_of;
using nlohmann::ordered_json;

RenderOptions fixed_clock() { return testing::fixture_clock(); }

std::string render(const std::string& source, const ordered_json& context = ordered_json::object(),
                   const RenderOptions& options = fixed_clock()) {
  return JinjaTemplate::parse(source).render(context, options);
}

std::string render_error(const std::string& source, const ordered_json& context = ordered_json::object(),
                         const RenderOptions& options = fixed_clock()) {
  return error_of([&] { render(source, context, options); });
}

ordered_json load_features() {
  std::ifstream in(std::string(BASALT_TESTDATA) + "/chat_templates/features.json", std::ios::binary);
  EXPECT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ordered_json::parse(ss.str());
}

// Each feature case's expected output came from Python jinja2.
class JinjaFeature : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaFeature, MatchesJinja2) {
  static const ordered_json doc = load_features();
  for (const auto& c : doc.at("cases")) {
    if (c.at("name") != GetParam()) continue;
    std::string source = c.at("template").get<std::string>();
    std::string out;
    try {
      out = render(source, doc.at("context"));
    } catch (const Error& e) {
      FAIL() << "threw " << e.what() << "\nfor: " << source;
    }
    EXPECT_EQ(out, c.at("expected").get<std::string>()) << "for: " << source;
    return;
  }
  FAIL() << "no feature case " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(
    Features, JinjaFeature,
    ::testing::Values("text", "output_types", "arith", "strings_ops", "compare", "logic", "undefined", "attr_item",
                      "slices", "str_methods", "dict_methods", "filters_str", "filters_num", "filters_list",
                      "filters_select", "tojson", "indent", "tests", "for_loop", "for_filter_else", "for_unpack",
                      "break_continue", "scoping", "set_forms", "macros", "call_block", "filter_block",
                      "whitespace", "lstrip_cases", "comments", "newlines", "trailing_newline", "string_escapes",
                      "globals", "markup", "generation", "nested_data", "unicode", "repr_escapes", "float_format"));

TEST(Jinja, ParseOnceRenderMany) {
  auto t = JinjaTemplate::parse("{% for m in messages %}[{{ m }}]{% endfor %}");
  EXPECT_EQ(t.render(nlohmann::json{{"messages", {1, 2}}}), "[1][2]");
  EXPECT_EQ(t.render(nlohmann::json{{"messages", {"a"}}}), "[a]");
  EXPECT_EQ(t.render(nlohmann::json(nullptr)), "");
}

TEST(Jinja, RenderFromManyThreads) {
  auto t = JinjaTemplate::parse("{% set ns = namespace(n=0) %}{% for i in range(x) %}{% set ns.n = ns.n + i %}"
                                "{% endfor %}{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { results[static_cast<size_t>(i)] = t.render(nlohmann::json{{"x", 100 + i}}); });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    int n = 100 + i;
    EXPECT_EQ(results[static_cast<size_t>(i)], std::to_string(n * (n - 1) / 2));
  }
}

TEST(Jinja, OrderedJsonKeepsKeyOrder) {
  auto ctx = ordered_json::parse(R"({"d": {"z": 1, "a": 2}})");
  EXPECT_EQ(render("{{ d|tojson }}", ctx), R"({"z": 1, "a": 2})");
  // nlohmann::json sorts keys; the ordered overload is the one to use for tools.
  EXPECT_EQ(JinjaTemplate::parse("{{ d|tojson }}").render(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})")),
            R"({"a": 2, "z": 1})");
}

TEST(Jinja, RenderChatTemplateContext) {
  std::string tpl =
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}|{{ tools is none }}{{ documents is none }}"
      "{{ enable_thinking }}";
  ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(render_chat_template(tpl, messages, true, {{"bos_token", "<s>"}, {"enable_thinking", false}}),
            "<s><user>hi<assistant>|TrueTrueFalse");
  EXPECT_EQ(render_chat_template(tpl, messages, false, {{"tools", ordered_json::array()}}),
            "<user>hi|FalseTrue");
}

TEST(Jinja, TojsonEnsureAscii) {
  // Expected strings from Python's json.dumps(..., ensure_ascii=True).
  EXPECT_EQ(render(R"({{ {'é': 'a\\u"😀\x01'}|tojson(true) }}|{{ 'é'|tojson(ensure_ascii=true, indent=1) }})"),
            R"({"\u00e9": "a\\u\"\ud83d\ude00\u0001"}|"\u00e9")");
}

TEST(Jinja, StrftimeNowUsesClockOverride) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "14 Mar 2025");
  // Without an override it formats the current time: just check the shape.
  EXPECT_EQ(render("{{ strftime_now('%Y')|length }}", ordered_json::object(), RenderOptions{}), "4");
}

// ---------------------------------------------------------------- errors

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  std::string e = error_of([] { JinjaTemplate::parse("line one\n{% if x %}\nno end"); });
  EXPECT_CONTAINS(e, "line 3");
  EXPECT_CONTAINS(e, "endif");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ 1 + }}"); }), "line 1");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("a\n\n{% frobnicate %}"); }), "line 3: syntax error: encountered unknown tag 'frobnicate'");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ 'unterminated }}"); }), "unterminated string");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{# never closed"); }), "comment");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ x"); }), "unexpected end of template");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{% endfor %}"); }), "unknown tag 'endfor'");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ a ) }}"); }), "unexpected ')'");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{% for x in y %}{% else %}{% else %}{% endfor %}"); }),
                  "syntax error");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{% macro m(a=1, b) %}{% endmacro %}"); }),
                  "non-default argument");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{% set true = 1 %}"); }), "can't assign");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ x is defined is defined }}"); }), "syntax error");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ 99999999999999999999 }}"); }), "too large");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{% for x in y recursive %}{% endfor %}"); }), "recursive");
}

TEST(JinjaErrors, RaiseExceptionCarriesMessageAndLine) {
  std::string e = render_error("a\n{% if true %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}");
  EXPECT_CONTAINS(e, "jinja template line 2");
  EXPECT_CONTAINS(e, "Conversation roles must alternate");
}

TEST(JinjaErrors, UndefinedBehavesLikeJinja2) {
  EXPECT_CONTAINS(render_error("\n{{ x.y }}"), "line 2: 'x' is undefined");
  EXPECT_CONTAINS(render_error("{{ x['y'] }}"), "'x' is undefined");
  EXPECT_CONTAINS(render_error("{{ {}.y.z }}"), "'dict object' has no attribute 'y'");
  EXPECT_CONTAINS(render_error("{{ x + 1 }}"), "'x' is undefined");
  EXPECT_CONTAINS(render_error("{{ foo() }}"), "'foo' is undefined");
  EXPECT_CONTAINS(render_error("{{ x < 1 }}"), "'x' is undefined");
  EXPECT_EQ(render("{{ x }}{{ x is defined }}{% for a in x %}a{% endfor %}{{ none.attr }}"), "False");
}

TEST(JinjaErrors, RuntimeTypeErrors) {
  EXPECT_CONTAINS(render_error("{{ 1 + 'a' }}"), "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_CONTAINS(render_error("{{ 'a' + 1 }}"), "can only concatenate str");
  EXPECT_CONTAINS(render_error("{{ 1 / 0 }}"), "division by zero");
  EXPECT_CONTAINS(render_error("{{ 1 // 0 }}"), "division or modulo by zero");
  EXPECT_CONTAINS(render_error("{{ 1 < 'a' }}"), "'<' not supported");
  EXPECT_CONTAINS(render_error("{{ [1, 'a']|sort }}"), "not supported between");
  EXPECT_CONTAINS(render_error("{{ x|nosuchfilter }}"), "no filter named 'nosuchfilter'");
  EXPECT_EQ(render("{% if false %}{{ x|nosuchfilter }}{% endif %}ok"), "ok");
  EXPECT_CONTAINS(render_error("{{ 1 is nosuchtest }}"), "no test named 'nosuchtest'");
  EXPECT_CONTAINS(render_error("{% for x in 5 %}{% endfor %}"), "'int' object is not iterable");
  EXPECT_CONTAINS(render_error("{% set a, b = [1, 2, 3] %}"), "too many values to unpack");
  EXPECT_CONTAINS(render_error("{% set x = 1 %}{% set x.y = 2 %}"), "non-namespace");
  EXPECT_CONTAINS(render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), "takes not more than 1");
  EXPECT_CONTAINS(render_error("{% macro m(a) %}{% endmacro %}{{ m(c=1) }}"), "no keyword argument 'c'");
  EXPECT_CONTAINS(render_error("{{ none|length }}"), "has no len()");
  EXPECT_CONTAINS(render_error("{{ 9223372036854775807 + 1 }}"), "integer overflow");
  EXPECT_CONTAINS(render_error("{{ 2 ** 64 }}"), "integer overflow");
  EXPECT_CONTAINS(render_error("{{ x|tojson }}"), "not JSON serializable");
  EXPECT_CONTAINS(render_error("{{ 'a'.split('') }}"), "empty separator");
  EXPECT_CONTAINS(render_error("{{ 'abc'[::0] }}"), "slice step cannot be zero");
}

TEST(JinjaErrors, ImmutableSandbox) {
  EXPECT_CONTAINS(render_error("{{ [1].append(2) }}"), "access to attribute 'append' of 'list' object is unsafe");
  EXPECT_CONTAINS(render_error("{% set d = {} %}{{ d.update({'a': 1}) }}"), "'update' of 'dict' object is unsafe");
  EXPECT_EQ(render("{{ ''.__class__ }}|{{ ''.__class__ is defined }}"), "|False");
}

// ---------------------------------------------------------------- limits

TEST(JinjaLimits, OutputSize) {
  RenderOptions o = fixed_clock();
  o.max_output_bytes = 1000;
  EXPECT_CONTAINS(render_error("{% for i in range(200) %}0123456789{% endfor %}", {}, o), "output exceeds");
  EXPECT_CONTAINS(render_error("{{ 'x' * 5000 }}", {}, o), "exceeds the limit");
  EXPECT_CONTAINS(render_error("{% set ns = namespace(s='xx') %}{% for i in range(20) %}{% set ns.s = ns.s + ns.s %}"
                               "{% endfor %}",
                               {}, o),
                  "exceeds the limit");
}

TEST(JinjaLimits, StepsAndLoops) {
  RenderOptions o = fixed_clock();
  o.max_steps = 10000;
  EXPECT_CONTAINS(render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", {}, o),
                  "evaluation steps");
  o.max_list_items = 100;
  EXPECT_CONTAINS(render_error("{{ range(1000)|length }}", {}, o), "exceeds the limit of 100 items");
  EXPECT_CONTAINS(render_error("{{ ([1] * 1000)|length }}", {}, o), "exceeds the limit");
}

TEST(JinjaLimits, RecursionDepth) {
  std::string e = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_CONTAINS(e, "recursion deeper than");
  EXPECT_CONTAINS(e, "line 1");
  // Deeply nested values cannot overflow the stack in repr/tojson/==.
  std::string deep = render_error(
      "{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}");
  EXPECT_CONTAINS(deep, "nested more than");
  // Deep syntax nesting is a syntax error, not a stack overflow.
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); }),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of([] {
                    std::string s;
                    for (int i = 0; i < 1000; ++i) s += "{% if true %}";
                    JinjaTemplate::parse(s);
                  }),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of([] { JinjaTemplate::parse("{{ " + std::string(5000, '-') + "1 }}"); }), "nested too deeply");
  // Long left-leaning chains parse (iteratively) but cannot evaluate past max_depth.
  std::string chain = "{{ x";
  for (int i = 0; i < 100000; ++i) chain += "[0]";
  EXPECT_CONTAINS(render_error(chain + " }}"), "deeper than 400 levels");
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += "+1";
  EXPECT_CONTAINS(render_error(sum + " }}"), "deeper than 400 levels");
}

TEST(JinjaLimits, DeepJsonContextIsRejected) {
  ordered_json j = 1;
  for (int i = 0; i < 1000; ++i) j = ordered_json::array({j});
  EXPECT_CONTAINS(error_of([&] { render("{{ x }}", {{"x", j}}); }), "nested more than");
}

}  // namespace
}  // namespace basalt
