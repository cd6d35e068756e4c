// Byte-exact conformance with Python's jinja2 on real chat templates: every
// (template, conversation) pair in testdata/chat_templates/expected.json
// (written by tools/fixtures/make_chat_template_fixtures.py) must render to
// exactly the recorded text, or throw basalt::Error where jinja2 raised.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "template/jinja.h"
#include "testing/template_test_util.h"

namespace basalt {
namespace {

using nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string dir() { return std::string(BASALT_TESTDATA) + "/chat_templates/"; }

RenderOptions fixed_clock() { return testing::fixture_clock(); }

TEST(ChatTemplateFixtures, RenderExactlyAsJinja2) {
  ordered_json doc = ordered_json::parse(read_file(dir() + "expected.json"));
  const ordered_json& conversations = doc.at("conversations");
  std::map<std::string, JinjaTemplate> parsed;
  std::map<std::string, int> failures_by_template;
  int rendered = 0, errors = 0;
  for (const auto& r : doc.at("results")) {
    std::string name = r.at("template").get<std::string>();
    std::string case_name = r.at("case").get<std::string>();
    SCOPED_TRACE(name + " / " + case_name);
    if (!parsed.count(name)) parsed.emplace(name, JinjaTemplate::parse(read_file(dir() + name)));
    const ordered_json& conv = conversations.at(case_name);
    ordered_json context = ordered_json::object();
    context["messages"] = conv.at("messages");
    context["tools"] = nullptr;
    context["documents"] = nullptr;
    context["add_generation_prompt"] = conv.at("add_generation_prompt");
    for (auto it = conv.at("extra").begin(); it != conv.at("extra").end(); ++it) context[it.key()] = it.value();
    const JinjaTemplate& tpl = parsed.at(name);
    if (r.at("output").is_null()) {
      ++errors;
      bool threw = false;
      try {
        tpl.render(context, fixed_clock());
      } catch (const Error&) {
        threw = true;
      }
      EXPECT_TRUE(threw) << "jinja2 raised " << r.value("error", "");
      if (!threw) ++failures_by_template[name];
      continue;
    }
    ++rendered;
    std::string out;
    try {
      out = tpl.render(context, fixed_clock());
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
      ++failures_by_template[name];
      continue;
    }
    EXPECT_EQ(out, r.at("output").get<std::string>());
    if (out != r.at("output").get<std::string>()) ++failures_by_template[name];
  }
  for (const auto& [name, n] : failures_by_template) std::cerr << "FAILING " << name << ": " << n << "\n";
  EXPECT_EQ(parsed.size(), 67u);
  EXPECT_GT(rendered, 500);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace basalt
