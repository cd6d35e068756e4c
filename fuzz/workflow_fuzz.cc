// libFuzzer target: arbitrary bytes as a workflow definition (the operator's
// file behind `basalt route --workflows`, docs/WORKFLOWS.md). parse_workflow
// must return or throw basalt::Error, with no crash and no sanitizer
// report; a definition it accepts must hold what the runner trusts: `order`
// lists every step once, each after the steps it depends on; every template
// of every step renders (or throws TemplateError) against a scope of any
// shape; conditions evaluate once rendered.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "workflow/definition.h"
#include "workflow/template.h"

namespace {

using basalt::workflow::Step;
using basalt::workflow::TemplateError;
using nlohmann::json;

void render_all(const Step& step, const json& scope) {
  const auto attempt = [&](const json& value) {
    try {
      basalt::workflow::render_value(value, scope);
    } catch (const TemplateError&) {
    }
  };
  for (const auto& [role, content] : step.model.messages) attempt(content);
  attempt(step.model.prompt);
  for (const auto& [name, value] : step.http.headers) attempt(value);
  attempt(step.http.body);
  attempt(step.over);
  if (!step.condition.is_null()) {
    try {
      basalt::workflow::evaluate_condition(basalt::workflow::render_value(step.condition, scope));
    } catch (const TemplateError&) {
    }
  }
  if (step.inner) render_all(*step.inner, scope);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  basalt::workflow::Workflow wf;
  try {
    wf = basalt::workflow::parse_workflow(text, "fuzz");
  } catch (const basalt::Error& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
    return 0;
  }
  if (wf.order.size() != wf.steps.size()) __builtin_trap();
  std::vector<int> position(wf.steps.size(), -1);
  for (size_t i = 0; i < wf.order.size(); ++i) {
    if (wf.order[i] >= wf.steps.size() || position[wf.order[i]] != -1) __builtin_trap();
    position[wf.order[i]] = static_cast<int>(i);
  }
  for (size_t s = 0; s < wf.steps.size(); ++s)
    for (size_t d : wf.steps[s].depends_on)
      if (d >= wf.steps.size() || position[d] >= position[s]) __builtin_trap();
  // Scopes of several shapes: every step's output null, a string, a list,
  // an object; the input as given by the definition's own text.
  json steps = json::object();
  for (const json& output :
       {json(), json("x"), json::array({1, json::object()}), json{{"category", "bug"}}}) {
    for (const Step& s : wf.steps) steps[s.name] = {{"output", output}};
    const json scope = {{"input", {{"text", "t"}, {"items", {"a"}}}},
                        {"steps", steps},
                        {"item", output},
                        {"index", 0}};
    for (const Step& s : wf.steps) render_all(s, scope);
  }
  return 0;
}
