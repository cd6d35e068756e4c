// Workflow definitions: a valid one loaded with its dependencies and order;
// every field's bad values, undefined references and cycles refused with
// the step and field named; inputs checked; conditions evaluated.
#include "workflow/definition.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"

namespace basalt::workflow {
namespace {

using nlohmann::json;

json base() {
  return json::parse(R"({
    "name": "triage",
    "description": "classify, summarize each item, combine",
    "input": {"text": "string", "items": "array"},
    "steps": [
      {"name": "classify", "type": "model", "model": "basalt-mini",
       "messages": [{"role": "system", "content": "You sort tickets."},
                    {"role": "user", "content": "Ticket: {{ input.text }}"}],
       "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}},
       "max_tokens": 32, "temperature": 0, "seed": 5, "timeout_s": 30, "retries": 2,
       "fallback_model": "basalt-draft"},
      {"name": "summaries", "type": "map", "over": "{{ input.items }}", "concurrency": 2, "retries": 1,
       "step": {"type": "model", "model": "basalt-draft", "prompt": "{{ index }}: {{ item }} is", "max_tokens": 8,
                "stop": ["\n"]}},
      {"name": "is_bug", "type": "condition",
       "if": {"equals": ["{{ steps.classify.output.category }}", "bug"]}, "then": ["notify"], "else": []},
      {"name": "notify", "type": "http", "url": "http://127.0.0.1:9/hook?x=1", "method": "POST",
       "headers": {"X-Ticket": "{{ input.text }}"}, "body": {"s": "{{ steps.summaries.output }}"}},
      {"name": "combine", "type": "model", "model": "basalt-mini", "after": ["notify"],
       "prompt": "{{ input.text }} {{ steps.summaries.output }}", "top_p": 0.9}
    ],
    "output": {"category": "{{ steps.classify.output.category }}", "summary": "{{ steps.combine.output }}"}
  })");
}

// The error parse_workflow_json gives for `definition`, or "" when it loads.
std::string error_of(const json& definition) {
  try {
    parse_workflow_json(definition, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The error after `change` is applied to the base definition.
std::string error_after(const std::function<void(json&)>& change) {
  json d = base();
  change(d);
  return error_of(d);
}

TEST(WorkflowDefinition, LoadsEveryField) {
  const Workflow wf = parse_workflow_json(base(), "test.json");
  EXPECT_EQ(wf.name, "triage");
  EXPECT_EQ(wf.description, "classify, summarize each item, combine");
  ASSERT_EQ(wf.input.size(), 2u);
  EXPECT_EQ(wf.input[0].name, "items");  // in name order
  EXPECT_EQ(wf.input[0].type, "array");
  ASSERT_EQ(wf.steps.size(), 5u);
  const Step& classify = wf.steps[0];
  EXPECT_EQ(classify.type, StepType::kModel);
  EXPECT_TRUE(classify.model.chat);
  EXPECT_TRUE(classify.model.wants_json);
  EXPECT_EQ(classify.model.model, "basalt-mini");
  EXPECT_EQ(classify.model.fallback_model, "basalt-draft");
  ASSERT_EQ(classify.model.messages.size(), 2u);
  EXPECT_EQ(classify.model.messages[1].first, "user");
  EXPECT_EQ(classify.model.messages[1].second, "Ticket: {{ input.text }}");
  EXPECT_EQ(classify.model.params["max_tokens"], 32);
  EXPECT_EQ(classify.model.params["seed"], 5);
  EXPECT_EQ(classify.model.params["temperature"], 0);
  EXPECT_DOUBLE_EQ(classify.timeout_s, 30);
  EXPECT_EQ(classify.retries, 2);
  const Step& map = wf.steps[1];
  EXPECT_EQ(map.type, StepType::kMap);
  EXPECT_EQ(map.concurrency, 2);
  ASSERT_TRUE(map.inner);
  EXPECT_FALSE(map.inner->model.chat);
  EXPECT_EQ(map.inner->retries, 1);  // the map's, as the inner step sets none
  EXPECT_DOUBLE_EQ(map.inner->timeout_s, 300);
  EXPECT_EQ(map.inner->model.params["stop"], json::parse(R"(["\n"])"));
  const Step& cond = wf.steps[2];
  EXPECT_EQ(cond.type, StepType::kCondition);
  EXPECT_EQ(cond.then_steps, std::vector<std::string>{"notify"});
  EXPECT_EQ(cond.depends_on, std::vector<size_t>{0});
  const Step& notify = wf.steps[3];
  EXPECT_EQ(notify.http.method, "POST");
  EXPECT_EQ(notify.http.url, "http://127.0.0.1:9/hook?x=1");
  ASSERT_EQ(notify.http.headers.size(), 1u);
  EXPECT_EQ(notify.gated_by, (std::vector<std::pair<size_t, bool>>{{2, true}}));
  EXPECT_EQ(notify.depends_on, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(wf.steps[4].depends_on, (std::vector<size_t>{1, 3}));
  EXPECT_TRUE(wf.has_output);
  EXPECT_EQ(wf.order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(wf.find("combine"), 4);
  EXPECT_EQ(wf.find("nope"), -1);
}

TEST(WorkflowDefinition, OrderFollowsDependenciesNotTheFile) {
  const json d = json::parse(R"({"name": "w", "steps": [
    {"name": "last", "type": "model", "model": "m", "prompt": "{{ steps.first.output }}"},
    {"name": "first", "type": "model", "model": "m", "prompt": "x"}]})");
  const Workflow wf = parse_workflow_json(d, "t");
  EXPECT_EQ(wf.order, (std::vector<size_t>{1, 0}));
  EXPECT_FALSE(wf.has_output);
}

TEST(WorkflowDefinition, TopLevelFieldsRefused) {
  EXPECT_NE(error_of(json::array()).find("a workflow definition is a JSON object"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["name"] = "Bad Name"; }).find("name: required: 1-64"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d.erase("name"); }).find("name: required"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["name"] = std::string(65, 'a'); }).find("name: required"),
            std::string::npos);
  EXPECT_EQ(error_after([](json& d) { d["name"] = "a-b_9"; }), "");
  EXPECT_NE(
      error_after([](json& d) { d["description"] = 3; }).find("description: must be a string"),
      std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["extra"] = 1; }).find("workflow.extra: unknown field"),
            std::string::npos);
  EXPECT_NE(
      error_after([](json& d) { d["input"] = json::array(); }).find("input: must be an object"),
      std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              d["input"]["x"] = "float";
            }).find("input.x: must be string, number"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["input"]["X"] = "string"; }).find("input.X: a field name"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              d["steps"] = json::array();
            }).find("steps: required: a list of 1-64"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              json many = json::array();
              for (int i = 0; i < 65; ++i) many.push_back(d["steps"][0]);
              d["steps"] = many;
            }).find("steps: required: a list of 1-64"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              d["output"] = "{{ steps.nope.output }}";
            }).find("output: refers to undefined step 'nope'"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              d["output"] = {{"a", "{{ item }}"}};
            }).find("output.a: 'item': the output reads input or steps.NAME.output"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["output"] = "{{ oops"; }).find("output: '{{' at column 1"),
            std::string::npos);
}

TEST(WorkflowDefinition, CommonStepFieldsRefused) {
  const auto at = [](size_t i, const char* key, json value) {
    return error_after([&](json& d) { d["steps"][i][key] = value; });
  };
  EXPECT_NE(at(0, "name", "Classify").find("steps[0] (Classify).name: required: 1-64 of a-z"),
            std::string::npos);
  EXPECT_NE(at(0, "name", 5).find("steps[0].name: required"), std::string::npos);
  EXPECT_NE(at(1, "name", "classify")
                .find("steps[1] (classify).name: 'classify' is already the name of steps[0]"),
            std::string::npos);
  EXPECT_NE(at(0, "type", "lambda")
                .find("steps[0] (classify).type: must be model, http, map or condition"),
            std::string::npos);
  EXPECT_NE(at(0, "timeout_s", 0)
                .find("steps[0] (classify).timeout_s: must be a number from 0.001 to 3600"),
            std::string::npos);
  EXPECT_NE(at(0, "timeout_s", 3601).find("timeout_s: must be a number"), std::string::npos);
  EXPECT_NE(at(0, "timeout_s", "5").find("timeout_s: must be a number"), std::string::npos);
  EXPECT_NE(
      at(0, "retries", -1).find("steps[0] (classify).retries: must be an integer from 0 to 10"),
      std::string::npos);
  EXPECT_NE(at(0, "retries", 11).find("retries: must be an integer"), std::string::npos);
  EXPECT_NE(at(0, "retries", 1.5).find("retries: must be an integer"), std::string::npos);
  EXPECT_NE(at(4, "after", "notify").find("steps[4] (combine).after: must be a list of step names"),
            std::string::npos);
  EXPECT_NE(at(4, "after", json::array({"nope"}))
                .find("steps[4] (combine).after[0]: refers to undefined step 'nope'"),
            std::string::npos);
  EXPECT_NE(at(4, "after", json::array({"combine"}))
                .find("steps[4] (combine).after[0]: refers to the step itself"),
            std::string::npos);
  EXPECT_NE(at(0, "colour", "red").find("steps[0] (classify).colour: unknown field"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["steps"][0] = 3; }).find("steps[0]: must be an object"),
            std::string::npos);
}

TEST(WorkflowDefinition, ModelStepFieldsRefused) {
  const auto at = [](const char* key, json value) {
    return error_after([&](json& d) { d["steps"][0][key] = value; });
  };
  const std::string s = "steps[0] (classify).";
  EXPECT_NE(at("model", "").find(s + "model: required"), std::string::npos);
  EXPECT_NE(at("model", std::string(257, 'm')).find(s + "model: required"), std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["steps"][0].erase("model"); }).find(s + "model: required"),
            std::string::npos);
  EXPECT_NE(at("fallback_model", 1).find(s + "fallback_model: must be a model name"),
            std::string::npos);
  EXPECT_NE(at("prompt", "both").find("steps[0] (classify): a model step needs either messages"),
            std::string::npos);
  EXPECT_NE(
      error_after([](json& d) { d["steps"][0].erase("messages"); }).find("needs either messages"),
      std::string::npos);
  EXPECT_NE(at("messages", json::array()).find(s + "messages: must be a list of 1-256"),
            std::string::npos);
  EXPECT_NE(at("messages", json::array({"hi"})).find(s + "messages[0]: must be an object"),
            std::string::npos);
  EXPECT_NE(at("messages", json::parse(R"([{"role": "robot", "content": "x"}])"))
                .find(s + "messages[0].role: must be"),
            std::string::npos);
  EXPECT_NE(at("messages", json::parse(R"([{"role": "user", "content": 4}])"))
                .find(s + "messages[0].content: must be"),
            std::string::npos);
  EXPECT_NE(at("messages", json::parse(R"([{"role": "user", "content": "x", "name": "n"}])"))
                .find(s + "messages[0].name: unknown field"),
            std::string::npos);
  EXPECT_NE(at("messages", json::parse(R"([{"role": "user", "content": "{{ input.text"}])"))
                .find(s + "messages[0].content: '{{' at column 1 has no closing"),
            std::string::npos);
  EXPECT_NE(at("max_tokens", 0).find(s + "max_tokens: must be an integer from 1 to 1048576"),
            std::string::npos);
  EXPECT_NE(at("max_tokens", 2.5).find(s + "max_tokens: must be an integer"), std::string::npos);
  EXPECT_NE(at("temperature", 2.5).find(s + "temperature: must be a number from 0 to 2"),
            std::string::npos);
  EXPECT_NE(at("temperature", "hot").find(s + "temperature: must be a number"), std::string::npos);
  EXPECT_NE(at("top_p", 0).find(s + "top_p: must be a number above 0"), std::string::npos);
  EXPECT_NE(at("top_p", 1.5).find(s + "top_p: must be a number above 0"), std::string::npos);
  EXPECT_NE(at("seed", 1.5).find(s + "seed: must be an integer"), std::string::npos);
  EXPECT_NE(at("stop", 3).find(s + "stop: must be a string or a list"), std::string::npos);
  EXPECT_NE(at("stop", json::array({"a", 1})).find(s + "stop: must be a string or a list"),
            std::string::npos);
  EXPECT_EQ(at("stop", "\n\n"), "");
  EXPECT_NE(at("response_format", json::parse(R"({"type": "xml"})"))
                .find(s + "response_format.type: must be"),
            std::string::npos);
  EXPECT_NE(at("response_format", json::parse(R"({"type": "json_schema"})"))
                .find(s + "response_format.json_schema: required"),
            std::string::npos);
  EXPECT_EQ(at("response_format", json::parse(R"({"type": "json_object"})")), "");
  EXPECT_NE(at("tools", json::array({1})).find(s + "tools: must be a list of tool objects"),
            std::string::npos);
  EXPECT_NE(at("tool_choice", 1).find(s + "tool_choice: must be a string or an object"),
            std::string::npos);
  EXPECT_EQ(at("tool_choice", "auto"), "");
  // A text response_format: the output stays text.
  json d = base();
  d["steps"][0]["response_format"] = {{"type", "text"}};
  EXPECT_FALSE(parse_workflow_json(d, "t").steps[0].model.wants_json);
}

TEST(WorkflowDefinition, HttpStepFieldsRefused) {
  const auto at = [](const char* key, json value) {
    return error_after([&](json& d) { d["steps"][3][key] = value; });
  };
  const std::string s = "steps[3] (notify).";
  for (const char* url :
       {"ftp://h/x", "http://", "http:///x", "http://user:pw@h/x", "http://h/x#frag", "h:80/x",
        "http://h/{{ input.text }}", "http://h/a b", "http://:80/x"})
    EXPECT_NE(at("url", url).find(s + "url: required: an http or https URL"), std::string::npos)
        << url;
  EXPECT_EQ(at("url", "https://example.com"), "");
  EXPECT_NE(at("method", "DELETE").find(s + "method: must be GET, POST or PUT"), std::string::npos);
  EXPECT_NE(at("method", "GET").find(s + "body: a GET carries no body"), std::string::npos);
  EXPECT_NE(at("headers", "x").find(s + "headers: must be an object"), std::string::npos);
  EXPECT_NE(at("headers", json::parse(R"({"Host": "x"})"))
                .find(s + "headers.Host: must be a header name"),
            std::string::npos);
  EXPECT_NE(
      at("headers", json::parse(R"({"Bad Name": "x"})")).find(s + "headers.Bad Name: must be"),
      std::string::npos);
  EXPECT_NE(at("headers", json::parse(R"({"X-A": 1})"))
                .find(s + "headers.X-A: must be a template string"),
            std::string::npos);
  EXPECT_NE(at("body", json::parse(R"({"a": ["{{ steps.nope.output }}"]})"))
                .find(s + "body.a[0]: refers to undefined step 'nope'"),
            std::string::npos);
  EXPECT_NE(at("model", "m").find(s + "model: unknown field"), std::string::npos);
}

TEST(WorkflowDefinition, MapStepFieldsRefused) {
  const auto at = [](const char* key, json value) {
    return error_after([&](json& d) { d["steps"][1][key] = value; });
  };
  const std::string s = "steps[1] (summaries).";
  EXPECT_NE(
      at("over", "items: {{ input.items }}").find(s + "over: required: one reference to a list"),
      std::string::npos);
  EXPECT_NE(at("over", json::array()).find(s + "over: required"), std::string::npos);
  EXPECT_NE(at("over", "{{ steps.nope.output }}").find(s + "over: refers to undefined step 'nope'"),
            std::string::npos);
  EXPECT_NE(at("concurrency", 0).find(s + "concurrency: must be an integer from 1 to 64"),
            std::string::npos);
  EXPECT_NE(at("concurrency", 65).find(s + "concurrency: must be an integer"), std::string::npos);
  EXPECT_NE(error_after([](json& d) { d["steps"][1].erase("step"); }).find(s + "step: required"),
            std::string::npos);
  EXPECT_NE(
      at("step", json::parse(R"({"type": "map"})")).find(s + "step.type: must be model or http"),
      std::string::npos);
  EXPECT_NE(
      at("step", json::parse(R"({"type": "model", "name": "x", "model": "m", "prompt": "p"})"))
          .find("steps[1] (summaries).step: a map's step has no name"),
      std::string::npos);
  EXPECT_NE(
      at("step", json::parse(R"({"type": "model", "model": "m", "prompt": "{{ item.x[z] }}"})"))
          .find(s + "step.prompt: placeholder at column 1"),
      std::string::npos);
  EXPECT_NE(at("step", json::parse(R"({"type": "model", "model": "m", "prompt": "{{ index.x }}"})"))
                .find(s + "step.prompt: 'index' is a number"),
            std::string::npos);
  EXPECT_NE(at("step",
               json::parse(
                   R"({"type": "model", "model": "m", "prompt": "{{ steps.summaries.output }}"})"))
                .find(s + "step.prompt: refers to the step itself"),
            std::string::npos);
  // item and index belong to a map's step only.
  EXPECT_NE(error_after([](json& d) {
              d["steps"][4]["prompt"] = "{{ item }}";
            }).find("steps[4] (combine).prompt: 'item' is only defined in a map's step"),
            std::string::npos);
}

TEST(WorkflowDefinition, ConditionStepFieldsRefused) {
  const auto at = [](const char* key, json value) {
    return error_after([&](json& d) { d["steps"][2][key] = value; });
  };
  const std::string s = "steps[2] (is_bug).";
  EXPECT_NE(at("if", json::parse(R"({"equals": [1]})"))
                .find(s + "if.equals: must be a list of two values"),
            std::string::npos);
  EXPECT_NE(
      at("if", json::parse(R"({"matches": [1, 2]})")).find(s + "if.matches: unknown operator"),
      std::string::npos);
  EXPECT_NE(at("if", json::parse(R"({"equals": [1, 1], "truthy": 1})"))
                .find(s + "if: must be an object with one"),
            std::string::npos);
  EXPECT_NE(at("if", json::parse(R"({"not": {"truthy": "{{ steps.x.output }}"}})"))
                .find(s + "if.not.truthy: refers to undefined step 'x'"),
            std::string::npos);
  EXPECT_EQ(at("if", json::parse(R"({"not": {"contains": ["{{ input.text }}", "urgent"]}})")), "");
  EXPECT_NE(
      at("then", json::array({"ghost"})).find(s + "then[0]: refers to undefined step 'ghost'"),
      std::string::npos);
  EXPECT_NE(at("else", json::array({"notify"}))
                .find(s + "else[0]: step 'notify' is in both then and else"),
            std::string::npos);
  EXPECT_NE(at("then", json::array({"is_bug"})).find(s + "then[0]: refers to the step itself"),
            std::string::npos);
  EXPECT_NE(error_after([](json& d) {
              d["steps"][2].erase("then");
              d["steps"][2].erase("else");
            }).find("steps[2] (is_bug): a condition needs then or else"),
            std::string::npos);
}

TEST(WorkflowDefinition, CyclesAreNamedByTheirSteps) {
  const json d = json::parse(R"({"name": "w", "steps": [
    {"name": "a", "type": "model", "model": "m", "prompt": "{{ steps.c.output }}"},
    {"name": "b", "type": "model", "model": "m", "prompt": "{{ steps.a.output }}"},
    {"name": "c", "type": "model", "model": "m", "prompt": "x", "after": ["b"]},
    {"name": "d", "type": "model", "model": "m", "prompt": "x"}]})");
  const std::string e = error_of(d);
  EXPECT_NE(e.find("is on a cycle: a -> c -> b -> a"), std::string::npos) << e;
  // A condition gating its own predecessor is a cycle too.
  const json g = json::parse(R"({"name": "w", "steps": [
    {"name": "a", "type": "model", "model": "m", "prompt": "x"},
    {"name": "c", "type": "condition", "if": {"truthy": "{{ steps.a.output }}"}, "then": ["a"]}]})");
  EXPECT_NE(error_of(g).find("is on a cycle"), std::string::npos) << error_of(g);
}

TEST(WorkflowDefinition, EveryProblemIsReportedAtOnce) {
  const std::string e = error_after([](json& d) {
    d["steps"][0]["retries"] = 99;
    d["steps"][4]["prompt"] = "{{ steps.sumaries.output }}";
  });
  EXPECT_NE(e.find("test.json: 2 problems:"), std::string::npos) << e;
  EXPECT_NE(e.find("steps[0] (classify).retries"), std::string::npos);
  EXPECT_NE(e.find("steps[4] (combine).prompt: refers to undefined step 'sumaries'"),
            std::string::npos);
}

TEST(WorkflowDefinition, TextLimitsAndJsonErrors) {
  EXPECT_THROW(parse_workflow("{", "t"), Error);
  EXPECT_THROW(parse_workflow(std::string(2u << 20, ' '), "t"), Error);
  std::string deep(100, '[');
  deep += std::string(100, ']');
  try {
    parse_workflow(deep, "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 64"), std::string::npos);
  }
  // Brackets inside strings do not count as nesting.
  json d = base();
  d["description"] = std::string(100, '[');
  EXPECT_NO_THROW(parse_workflow(d.dump(), "t"));
}

TEST(WorkflowDefinition, LoadsAFileOrADirectory) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / fs::path("basalt_wf_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.json") << base().dump();
  json other = base();
  other["name"] = "second";
  std::ofstream(dir / "b.json") << other.dump();
  std::ofstream(dir / "notes.txt") << "ignored";
  const auto all = load_workflows(dir.string());
  EXPECT_EQ(all.size(), 2u);
  EXPECT_TRUE(all.count("triage") && all.count("second"));
  EXPECT_EQ(load_workflows((dir / "a.json").string()).size(), 1u);
  std::ofstream(dir / "c.json") << base().dump();
  try {
    load_workflows(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workflow 'triage' is already defined by"),
              std::string::npos);
  }
  EXPECT_THROW(load_workflows((dir / "missing.json").string()), Error);
  fs::remove_all(dir);
}

TEST(WorkflowDefinition, InputsAreChecked) {
  const Workflow wf = parse_workflow_json(base(), "t");
  EXPECT_EQ(check_input(wf, json::parse(R"({"text": "x", "items": [], "extra": 1})")), "");
  EXPECT_EQ(check_input(wf, json::parse(R"({"items": []})")), "input.text: required");
  EXPECT_EQ(check_input(wf, json::parse(R"({"text": 1, "items": []})")),
            "input.text: must be of type string, not number");
  EXPECT_EQ(check_input(wf, json::array()), "input: must be an object");
}

TEST(WorkflowDefinition, ConditionsEvaluate) {
  EXPECT_TRUE(evaluate_condition(json::parse(R"({"equals": ["bug", "bug"]})")));
  EXPECT_FALSE(evaluate_condition(json::parse(R"({"equals": ["bug", "Bug"]})")));
  EXPECT_TRUE(evaluate_condition(json::parse(R"({"not_equals": [1, 2]})")));
  EXPECT_TRUE(evaluate_condition(json::parse(R"({"contains": ["an urgent bug", "urgent"]})")));
  EXPECT_TRUE(evaluate_condition(json::parse(R"({"contains": [[1, "a"], "a"]})")));
  EXPECT_FALSE(evaluate_condition(json::parse(R"({"contains": [5, 5]})")));
  for (const char* falsy : {"null", "false", "0", "\"\"", "[]", "{}"})
    EXPECT_FALSE(evaluate_condition(json{{"truthy", json::parse(falsy)}})) << falsy;
  for (const char* truthy : {"true", "0.5", "\"x\"", "[0]", "{\"a\":0}"})
    EXPECT_TRUE(evaluate_condition(json{{"truthy", json::parse(truthy)}})) << truthy;
  EXPECT_TRUE(evaluate_condition(json::parse(R"({"not": {"truthy": null}})")));
}

}  // namespace
}  // namespace basalt::workflow
