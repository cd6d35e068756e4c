// Workflow definitions: see definition.h.
#include "workflow/definition.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "workflow/template.h"

namespace basalt::workflow {
namespace {

constexpr size_t kMaxFileBytes = size_t{1} << 20;
constexpr int kMaxDepth = 64;
constexpr size_t kMaxSteps = 64;
constexpr size_t kMaxMessages = 256;

// Every problem found, each with where it is.
struct Problems {
  std::vector<std::string> list;
  void add(const std::string& where, const std::string& what) {
    list.push_back(where + ": " + what);
  }
};

bool valid_name(std::string_view s, bool allow_dash) {
  if (s.empty() || s.size() > 64 || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || (allow_dash && c == '-');
  });
}

}  // namespace

int json_nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

namespace {

// Reports keys of `object` not in `allowed`.
void check_keys(const nlohmann::json& object, const std::string& where,
                std::initializer_list<const char*> allowed, Problems& problems) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }))
      problems.add(where + "." + key, "unknown field");
  }
}

const nlohmann::json* member(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Reads an optional number in [lo, hi] into `out`.
void read_number(const nlohmann::json& object, const char* key, const std::string& where, double lo,
                 double hi, double& out, Problems& problems) {
  const nlohmann::json* v = member(object, key);
  if (v == nullptr) return;
  if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) {
    problems.add(where + "." + key, fmt::format("must be a number from {} to {}", lo, hi));
    return;
  }
  out = v->get<double>();
}

void read_integer(const nlohmann::json& object, const char* key, const std::string& where,
                  int64_t lo, int64_t hi, int& out, Problems& problems) {
  const nlohmann::json* v = member(object, key);
  if (v == nullptr) return;
  if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
    problems.add(where + "." + key, fmt::format("must be an integer from {} to {}", lo, hi));
    return;
  }
  out = static_cast<int>(v->get<int64_t>());
}

// Checks a template string's syntax; returns whether it parsed.
bool check_template(const nlohmann::json& value, const std::string& where, Problems& problems) {
  try {
    collect_paths(value);
    return true;
  } catch (const TemplateError& e) {
    problems.add(where, e.what());
    return false;
  }
}

void read_string_list(const nlohmann::json& object, const char* key, const std::string& where,
                      std::vector<std::string>& out, Problems& problems) {
  const nlohmann::json* v = member(object, key);
  if (v == nullptr) return;
  if (!v->is_array()) {
    problems.add(where + "." + key, "must be a list of step names");
    return;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string() || !valid_name((*v)[i].get<std::string>(), false))
      problems.add(fmt::format("{}.{}[{}]", where, key, i), "must be a step name");
    else
      out.push_back((*v)[i].get<std::string>());
  }
}

void parse_model(const nlohmann::json& j, const std::string& where, Step& step,
                 Problems& problems) {
  ModelCall& m = step.model;
  const nlohmann::json* model = member(j, "model");
  if (model == nullptr || !model->is_string() || model->get<std::string>().empty() ||
      model->get<std::string>().size() > 256)
    problems.add(where + ".model", "required: a model name of 1-256 characters");
  else
    m.model = model->get<std::string>();
  if (const nlohmann::json* fb = member(j, "fallback_model")) {
    if (!fb->is_string() || fb->get<std::string>().empty() || fb->get<std::string>().size() > 256)
      problems.add(where + ".fallback_model", "must be a model name of 1-256 characters");
    else
      m.fallback_model = fb->get<std::string>();
  }
  const nlohmann::json* messages = member(j, "messages");
  const nlohmann::json* prompt = member(j, "prompt");
  if ((messages == nullptr) == (prompt == nullptr))
    problems.add(where, "a model step needs either messages (a chat) or prompt (a completion)");
  if (messages != nullptr) {
    m.chat = true;
    if (!messages->is_array() || messages->empty() || messages->size() > kMaxMessages) {
      problems.add(where + ".messages",
                   fmt::format("must be a list of 1-{} messages", kMaxMessages));
    } else {
      for (size_t i = 0; i < messages->size(); ++i) {
        const std::string at = fmt::format("{}.messages[{}]", where, i);
        const nlohmann::json& msg = (*messages)[i];
        if (!msg.is_object()) {
          problems.add(at, "must be an object {role, content}");
          continue;
        }
        check_keys(msg, at, {"role", "content"}, problems);
        const nlohmann::json* role = member(msg, "role");
        const nlohmann::json* content = member(msg, "content");
        static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};
        if (role == nullptr || !role->is_string() || !kRoles.count(role->get<std::string>()))
          problems.add(at + ".role", "must be system, user, assistant or tool");
        if (content == nullptr || !content->is_string()) {
          problems.add(at + ".content", "must be a template string");
          continue;
        }
        check_template(*content, at + ".content", problems);
        m.messages.emplace_back(
            role != nullptr && role->is_string() ? role->get<std::string>() : "",
            content->get<std::string>());
      }
    }
  }
  if (prompt != nullptr) {
    m.chat = false;
    if (!prompt->is_string())
      problems.add(where + ".prompt", "must be a template string");
    else if (check_template(*prompt, where + ".prompt", problems))
      m.prompt = prompt->get<std::string>();
  }
  // The request fields passed on, each checked for its type and range.
  if (const nlohmann::json* v = member(j, "max_tokens")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (int64_t{1} << 20))
      problems.add(where + ".max_tokens", "must be an integer from 1 to 1048576");
    else
      m.params["max_tokens"] = *v;
  }
  if (const nlohmann::json* v = member(j, "temperature")) {
    if (!v->is_number() || !(v->get<double>() >= 0 && v->get<double>() <= 2))
      problems.add(where + ".temperature", "must be a number from 0 to 2");
    else
      m.params["temperature"] = *v;
  }
  if (const nlohmann::json* v = member(j, "top_p")) {
    if (!v->is_number() || !(v->get<double>() > 0 && v->get<double>() <= 1))
      problems.add(where + ".top_p", "must be a number above 0 and at most 1");
    else
      m.params["top_p"] = *v;
  }
  if (const nlohmann::json* v = member(j, "seed")) {
    if (!v->is_number_integer())
      problems.add(where + ".seed", "must be an integer");
    else
      m.params["seed"] = *v;
  }
  if (const nlohmann::json* v = member(j, "stop")) {
    const bool ok = v->is_string() || (v->is_array() && v->size() <= 16 &&
                                       std::all_of(v->begin(), v->end(),
                                                   [](const auto& s) { return s.is_string(); }));
    if (!ok)
      problems.add(where + ".stop", "must be a string or a list of at most 16 strings");
    else
      m.params["stop"] = *v;
  }
  if (const nlohmann::json* v = member(j, "response_format")) {
    const nlohmann::json* type = v->is_object() ? member(*v, "type") : nullptr;
    const std::string t = type != nullptr && type->is_string() ? type->get<std::string>() : "";
    if (t != "text" && t != "json_object" && t != "json_schema")
      problems.add(where + ".response_format.type", "must be text, json_object or json_schema");
    else if (t == "json_schema" && !(member(*v, "json_schema") && (*v)["json_schema"].is_object()))
      problems.add(where + ".response_format.json_schema",
                   "required (an object) with type json_schema");
    else {
      m.params["response_format"] = *v;
      m.wants_json = t != "text";
    }
  }
  if (const nlohmann::json* v = member(j, "tools")) {
    if (!v->is_array() ||
        !std::all_of(v->begin(), v->end(), [](const auto& t) { return t.is_object(); }))
      problems.add(where + ".tools", "must be a list of tool objects");
    else
      m.params["tools"] = *v;
  }
  if (const nlohmann::json* v = member(j, "tool_choice")) {
    if (!v->is_string() && !v->is_object())
      problems.add(where + ".tool_choice", "must be a string or an object");
    else
      m.params["tool_choice"] = *v;
  }
}

void parse_http(const nlohmann::json& j, const std::string& where, Step& step, Problems& problems) {
  HttpCall& h = step.http;
  const nlohmann::json* url = member(j, "url");
  const std::string u = url != nullptr && url->is_string() ? url->get<std::string>() : "";
  const size_t scheme_end = u.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : u.substr(0, scheme_end);
  const std::string rest = scheme_end == std::string::npos ? "" : u.substr(scheme_end + 3);
  const std::string authority = rest.substr(0, rest.find_first_of("/?#"));
  if ((scheme != "http" && scheme != "https") || authority.empty() || authority[0] == ':' ||
      authority.find('@') != std::string::npos || u.find('#') != std::string::npos ||
      u.find("{{") != std::string::npos || u.size() > 2048 ||
      std::any_of(u.begin(), u.end(), [](char c) { return static_cast<unsigned char>(c) <= ' '; }))
    problems.add(where + ".url",
                 "required: an http or https URL with a host, without credentials, fragment, "
                 "spaces or templates");
  else
    h.url = u;
  if (const nlohmann::json* m = member(j, "method")) {
    if (!m->is_string() || (*m != "GET" && *m != "POST" && *m != "PUT"))
      problems.add(where + ".method", "must be GET, POST or PUT");
    else
      h.method = m->get<std::string>();
  }
  if (const nlohmann::json* headers = member(j, "headers")) {
    if (!headers->is_object()) {
      problems.add(where + ".headers", "must be an object of header names and template strings");
    } else {
      for (const auto& [name, value] : headers->items()) {
        const std::string at = where + ".headers." + name;
        const bool token =
            !name.empty() && name.size() <= 256 &&
            std::all_of(name.begin(), name.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
            });
        std::string lower = name;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (!token || lower == "host" || lower == "content-length" ||
            lower == "transfer-encoding" || lower == "connection")
          problems.add(
              at,
              "must be a header name of letters, digits, '-' or '_' (not Host, Content-Length, "
              "Transfer-Encoding or Connection)");
        else if (!value.is_string())
          problems.add(at, "must be a template string");
        else if (check_template(value, at, problems))
          h.headers.emplace_back(name, value.get<std::string>());
      }
    }
  }
  if (const nlohmann::json* body = member(j, "body")) {
    if (h.method == "GET")
      problems.add(where + ".body", "a GET carries no body");
    else if (check_template(*body, where + ".body", problems))
      h.body = *body;
  }
}

void check_condition(const nlohmann::json& c, const std::string& where, Problems& problems) {
  if (!c.is_object() || c.size() != 1) {
    problems.add(
        where, "must be an object with one operator: equals, not_equals, contains, truthy or not");
    return;
  }
  // (Not a structured binding of *items().begin(): that refers into a
  // temporary iteration proxy; and a named iterator, so no reference is
  // taken through a temporary one.)
  const auto first = c.begin();
  const std::string& op = first.key();
  const nlohmann::json& arg = first.value();
  const std::string at = where + "." + op;
  if (op == "equals" || op == "not_equals" || op == "contains") {
    if (!arg.is_array() || arg.size() != 2)
      problems.add(at, "must be a list of two values");
    else
      check_template(arg, at, problems);
  } else if (op == "truthy") {
    check_template(arg, at, problems);
  } else if (op == "not") {
    check_condition(arg, at, problems);
  } else {
    problems.add(at, "unknown operator (equals, not_equals, contains, truthy or not)");
  }
}

// One step (a map's inner step when `inner`).
Step parse_step(const nlohmann::json& j, const std::string& where, bool inner, Problems& problems) {
  Step step;
  if (!j.is_object()) {
    problems.add(where, "must be an object");
    return step;
  }
  const nlohmann::json* type = member(j, "type");
  const std::string t = type != nullptr && type->is_string() ? type->get<std::string>() : "";
  if (t == "model")
    step.type = StepType::kModel;
  else if (t == "http")
    step.type = StepType::kHttp;
  else if (t == "map" && !inner)
    step.type = StepType::kMap;
  else if (t == "condition" && !inner)
    step.type = StepType::kCondition;
  else {
    problems.add(where + ".type",
                 inner ? "must be model or http" : "must be model, http, map or condition");
    return step;
  }
  if (!inner) {
    const nlohmann::json* name = member(j, "name");
    if (name == nullptr || !name->is_string() || !valid_name(name->get<std::string>(), false))
      problems.add(where + ".name", "required: 1-64 of a-z, 0-9 and _, starting with a letter");
    else
      step.name = name->get<std::string>();
    read_string_list(j, "after", where, step.after, problems);
  } else if (member(j, "name") || member(j, "after")) {
    problems.add(where, "a map's step has no name or after of its own");
  }
  read_number(j, "timeout_s", where, 0.001, 3600, step.timeout_s, problems);
  read_integer(j, "retries", where, 0, 10, step.retries, problems);
  switch (step.type) {
    case StepType::kModel:
      check_keys(j, where,
                 {"name", "type", "after", "timeout_s", "retries", "model", "fallback_model",
                  "messages", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                  "response_format", "tools", "tool_choice"},
                 problems);
      parse_model(j, where, step, problems);
      break;
    case StepType::kHttp:
      check_keys(
          j, where,
          {"name", "type", "after", "timeout_s", "retries", "url", "method", "headers", "body"},
          problems);
      parse_http(j, where, step, problems);
      break;
    case StepType::kMap: {
      check_keys(j, where,
                 {"name", "type", "after", "timeout_s", "retries", "over", "concurrency", "step"},
                 problems);
      const nlohmann::json* over = member(j, "over");
      bool whole = false;
      if (over != nullptr && over->is_string()) {
        try {
          whole = Template::parse(over->get<std::string>()).whole_value();
        } catch (const TemplateError&) {
        }
      }
      if (!whole)
        problems.add(where + ".over",
                     "required: one reference to a list, such as '{{ input.items }}'");
      else
        step.over = over->get<std::string>();
      read_integer(j, "concurrency", where, 1, 64, step.concurrency, problems);
      const nlohmann::json* inner_step = member(j, "step");
      if (inner_step == nullptr) {
        problems.add(where + ".step", "required: the model or http step run for each item");
      } else {
        Step s = parse_step(*inner_step, where + ".step", true, problems);
        // The map's own timeout and retries are the items' unless the inner step sets them.
        if (!member(*inner_step, "timeout_s")) s.timeout_s = step.timeout_s;
        if (!member(*inner_step, "retries")) s.retries = step.retries;
        step.inner = std::make_shared<const Step>(std::move(s));
      }
      break;
    }
    case StepType::kCondition: {
      check_keys(j, where, {"name", "type", "after", "timeout_s", "retries", "if", "then", "else"},
                 problems);
      const nlohmann::json* c = member(j, "if");
      if (c == nullptr)
        problems.add(where + ".if", "required: the condition");
      else {
        check_condition(*c, where + ".if", problems);
        step.condition = *c;
      }
      read_string_list(j, "then", where, step.then_steps, problems);
      read_string_list(j, "else", where, step.else_steps, problems);
      if (step.then_steps.empty() && step.else_steps.empty() && !member(j, "then") &&
          !member(j, "else"))
        problems.add(where, "a condition needs then or else (the steps it gates)");
      break;
    }
  }
  return step;
}

// The fields of a step's definition that hold templates, by name.
std::vector<std::pair<std::string, nlohmann::json>> templates_of(const nlohmann::json& source) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const char* field : {"messages", "prompt", "headers", "body", "over", "if"})
    if (const nlohmann::json* v = member(source, field)) out.emplace_back(field, *v);
  return out;
}

// References of one step's templates: checks them and adds dependencies.
void check_references(Workflow& wf, size_t index, const nlohmann::json& source,
                      const std::string& where, bool inner, Problems& problems) {
  Step& step = wf.steps[index];
  for (const auto& [field, value] : templates_of(source)) {
    std::vector<LocatedPath> paths;
    try {
      paths = collect_paths(value);
    } catch (const TemplateError&) {
      continue;  // reported when the step was parsed
    }
    for (const LocatedPath& lp : paths) {
      const std::string at = where + "." + field + lp.where;
      const TemplatePath& p = lp.path;
      if (p.root == "input") continue;
      if (p.root == "item" || p.root == "index") {
        if (!inner)
          problems.add(at, fmt::format("'{}' is only defined in a map's step", p.root));
        else if (p.root == "index" && !p.selectors.empty())
          problems.add(at, "'index' is a number: no selectors");
        continue;
      }
      if (p.root != "steps") {
        problems.add(at, fmt::format("unknown name '{}' (input, steps, item or index)", p.root));
        continue;
      }
      if (p.selectors.size() < 2 || p.selectors[0].is_index || p.selectors[1].is_index ||
          p.selectors[1].field != "output") {
        problems.add(at, fmt::format("'{}': a step's value is read as steps.NAME.output", p.text));
        continue;
      }
      const std::string& name = p.selectors[0].field;
      const int64_t target = wf.find(name);
      if (target < 0)
        problems.add(at, fmt::format("refers to undefined step '{}'", name));
      else if (static_cast<size_t>(target) == index)
        problems.add(at, "refers to the step itself");
      else if (std::find(step.depends_on.begin(), step.depends_on.end(),
                         static_cast<size_t>(target)) == step.depends_on.end())
        step.depends_on.push_back(static_cast<size_t>(target));
    }
  }
}

std::string step_where(size_t index, const std::string& name) {
  return name.empty() ? fmt::format("steps[{}]", index)
                      : fmt::format("steps[{}] ({})", index, name);
}

}  // namespace

const char* step_type_name(StepType type) {
  switch (type) {
    case StepType::kModel:
      return "model";
    case StepType::kHttp:
      return "http";
    case StepType::kMap:
      return "map";
    case StepType::kCondition:
      return "condition";
  }
  return "?";
}

int64_t Workflow::find(std::string_view name) const {
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

Workflow parse_workflow(std::string_view text, std::string_view source) {
  BASALT_CHECK(text.size() <= kMaxFileBytes, "{}: {} bytes, more than a definition may have ({})",
               source, text.size(), kMaxFileBytes);
  BASALT_CHECK(json_nesting_depth(text) <= kMaxDepth, "{}: nested more than {} levels", source,
               kMaxDepth);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON: {}", source, e.what());
  }
  return parse_workflow_json(j, source);
}

Workflow parse_workflow_json(const nlohmann::json& j, std::string_view source) {
  BASALT_CHECK(j.is_object(), "{}: a workflow definition is a JSON object", source);
  Problems problems;
  Workflow wf;
  wf.source = j;
  check_keys(j, "workflow", {"name", "description", "input", "steps", "output"}, problems);
  const nlohmann::json* name = member(j, "name");
  if (name == nullptr || !name->is_string() || !valid_name(name->get<std::string>(), true))
    problems.add("name", "required: 1-64 of a-z, 0-9, _ and -, starting with a letter");
  else
    wf.name = name->get<std::string>();
  if (const nlohmann::json* d = member(j, "description")) {
    if (!d->is_string() || d->get<std::string>().size() > 4096)
      problems.add("description", "must be a string of at most 4096 characters");
    else
      wf.description = d->get<std::string>();
  }
  if (const nlohmann::json* input = member(j, "input")) {
    static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean",
                                                 "array",  "object", "any"};
    if (!input->is_object()) {
      problems.add("input", "must be an object of field names and types");
    } else {
      for (const auto& [field, type] : input->items()) {
        if (!valid_name(field, false))
          problems.add("input." + field,
                       "a field name is 1-64 of a-z, 0-9 and _, starting with a letter");
        else if (!type.is_string() || !kTypes.count(type.get<std::string>()))
          problems.add("input." + field,
                       "must be string, number, integer, boolean, array, object or any");
        else
          wf.input.push_back({field, type.get<std::string>()});
      }
    }
  }
  const nlohmann::json* steps = member(j, "steps");
  if (steps == nullptr || !steps->is_array() || steps->empty() || steps->size() > kMaxSteps) {
    problems.add("steps", fmt::format("required: a list of 1-{} steps", kMaxSteps));
  } else {
    for (size_t i = 0; i < steps->size(); ++i) {
      const nlohmann::json& s = (*steps)[i];
      const nlohmann::json* n = s.is_object() ? member(s, "name") : nullptr;
      const std::string where =
          step_where(i, n != nullptr && n->is_string() ? n->get<std::string>() : "");
      wf.steps.push_back(parse_step(s, where, false, problems));
    }
  }
  // Names are unique; references resolve.
  for (size_t i = 0; i < wf.steps.size(); ++i) {
    const Step& s = wf.steps[i];
    if (!s.name.empty() && wf.find(s.name) != static_cast<int64_t>(i))
      problems.add(step_where(i, s.name) + ".name",
                   fmt::format("'{}' is already the name of steps[{}]", s.name, wf.find(s.name)));
  }
  for (size_t i = 0; i < wf.steps.size(); ++i) {
    const std::string where = step_where(i, wf.steps[i].name);
    const nlohmann::json& src = (*steps)[i];
    if (!src.is_object()) continue;
    check_references(wf, i, src, where, false, problems);
    if (wf.steps[i].type == StepType::kMap && member(src, "step") && src["step"].is_object())
      check_references(wf, i, src["step"], where + ".step", true, problems);
    const auto name_list = [&](const std::vector<std::string>& names, const char* field, bool gate,
                               bool branch) {
      for (size_t k = 0; k < names.size(); ++k) {
        const std::string at = fmt::format("{}.{}[{}]", where, field, k);
        const int64_t target = wf.find(names[k]);
        if (target < 0) {
          problems.add(at, fmt::format("refers to undefined step '{}'", names[k]));
        } else if (static_cast<size_t>(target) == i) {
          problems.add(at, "refers to the step itself");
        } else if (!gate) {
          std::vector<size_t>& deps = wf.steps[i].depends_on;
          if (std::find(deps.begin(), deps.end(), static_cast<size_t>(target)) == deps.end())
            deps.push_back(static_cast<size_t>(target));
        } else {
          Step& gated = wf.steps[static_cast<size_t>(target)];
          for (const auto& [cond, need] : gated.gated_by)
            if (cond == i && need != branch)
              problems.add(at, fmt::format("step '{}' is in both then and else", names[k]));
          gated.gated_by.emplace_back(i, branch);
          if (std::find(gated.depends_on.begin(), gated.depends_on.end(), i) ==
              gated.depends_on.end())
            gated.depends_on.push_back(i);
        }
      }
    };
    name_list(wf.steps[i].after, "after", false, false);
    name_list(wf.steps[i].then_steps, "then", true, true);
    name_list(wf.steps[i].else_steps, "else", true, false);
  }
  if (const nlohmann::json* out = member(j, "output")) {
    wf.output = *out;
    wf.has_output = true;
    try {
      for (const LocatedPath& lp : collect_paths(*out)) {
        const TemplatePath& p = lp.path;
        const std::string at = "output" + lp.where;
        if (p.root == "input") continue;
        if (p.root != "steps" || p.selectors.size() < 2 || p.selectors[0].is_index ||
            p.selectors[1].is_index || p.selectors[1].field != "output")
          problems.add(at,
                       fmt::format("'{}': the output reads input or steps.NAME.output", p.text));
        else if (wf.find(p.selectors[0].field) < 0)
          problems.add(at, fmt::format("refers to undefined step '{}'", p.selectors[0].field));
      }
    } catch (const TemplateError& e) {
      problems.add("output", e.what());
    }
  }
  for (Step& s : wf.steps) std::sort(s.depends_on.begin(), s.depends_on.end());
  if (problems.list.empty()) {
    // Cycles, by depth-first search over the dependencies; then an order
    // (Kahn's, the file's order among steps ready together).
    const size_t n = wf.steps.size();
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<size_t> path;
    std::set<std::string> reported;
    std::function<void(size_t)> visit = [&](size_t v) {
      color[v] = 1;
      path.push_back(v);
      for (size_t d : wf.steps[v].depends_on) {
        if (color[d] == 1) {
          const auto from = std::find(path.begin(), path.end(), d);
          std::string cycle;
          for (auto it = from; it != path.end(); ++it) cycle += wf.steps[*it].name + " -> ";
          cycle += wf.steps[d].name;
          if (reported.insert(cycle).second)
            problems.add(step_where(d, wf.steps[d].name),
                         "is on a cycle: " + cycle + " (each step waits for the next)");
        } else if (color[d] == 0) {
          visit(d);
        }
      }
      path.pop_back();
      color[v] = 2;
    };
    for (size_t v = 0; v < n; ++v)
      if (color[v] == 0) visit(v);
    if (problems.list.empty()) {
      std::vector<size_t> waiting(n);
      for (size_t v = 0; v < n; ++v) waiting[v] = wf.steps[v].depends_on.size();
      std::vector<bool> placed(n, false);
      while (wf.order.size() < n) {
        size_t next = n;
        for (size_t v = 0; v < n && next == n; ++v)
          if (!placed[v] && waiting[v] == 0) next = v;
        BASALT_ASSERT(next < n);
        placed[next] = true;
        wf.order.push_back(next);
        for (size_t v = 0; v < n; ++v)
          for (size_t d : wf.steps[v].depends_on)
            if (d == next) --waiting[v];
      }
    }
  }
  if (!problems.list.empty()) {
    std::string message = fmt::format("{}: {} problem{}:", source, problems.list.size(),
                                      problems.list.size() == 1 ? "" : "s");
    for (const std::string& p : problems.list) message += "\n  " + p;
    throw Error(message);
  }
  return wf;
}

std::map<std::string, std::shared_ptr<const Workflow>> load_workflows(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
    BASALT_CHECK(!ec, "--workflows {}: {}", path, ec.message());
    std::sort(files.begin(), files.end());
    BASALT_CHECK(!files.empty(), "--workflows {}: the directory has no *.json file", path);
  } else {
    BASALT_CHECK(fs::is_regular_file(path, ec), "--workflows {}: no such file or directory", path);
    files.push_back(path);
  }
  std::map<std::string, std::shared_ptr<const Workflow>> out;
  std::map<std::string, std::string> file_of;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    BASALT_CHECK(in, "{}: cannot be read", file.string());
    std::string text;
    text.resize(kMaxFileBytes + 1);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    auto wf = std::make_shared<const Workflow>(parse_workflow(text, file.string()));
    BASALT_CHECK(!out.count(wf->name), "{}: workflow '{}' is already defined by {}", file.string(),
                 wf->name, file_of[wf->name]);
    file_of[wf->name] = file.string();
    out[wf->name] = std::move(wf);
  }
  return out;
}

std::string check_input(const Workflow& workflow, const nlohmann::json& input) {
  if (!input.is_object()) return "input: must be an object";
  for (const InputField& f : workflow.input) {
    const auto it = input.find(f.name);
    if (it == input.end()) return fmt::format("input.{}: required", f.name);
    const nlohmann::json& v = *it;
    const bool ok = f.type == "any" || (f.type == "string" && v.is_string()) ||
                    (f.type == "number" && v.is_number()) ||
                    (f.type == "integer" && v.is_number_integer()) ||
                    (f.type == "boolean" && v.is_boolean()) ||
                    (f.type == "array" && v.is_array()) || (f.type == "object" && v.is_object());
    if (!ok)
      return fmt::format("input.{}: must be of type {}, not {}", f.name, f.type, v.type_name());
  }
  return "";
}

bool evaluate_condition(const nlohmann::json& c) {
  // (Not a structured binding of *items().begin(): that refers into a
  // temporary iteration proxy; and a named iterator, so no reference is
  // taken through a temporary one.)
  const auto first = c.begin();
  const std::string& op = first.key();
  const nlohmann::json& arg = first.value();
  if (op == "equals") return arg[0] == arg[1];
  if (op == "not_equals") return arg[0] != arg[1];
  if (op == "contains") {
    if (arg[0].is_string() && arg[1].is_string())
      return arg[0].get_ref<const std::string&>().find(arg[1].get_ref<const std::string&>()) !=
             std::string::npos;
    if (arg[0].is_array()) return std::find(arg[0].begin(), arg[0].end(), arg[1]) != arg[0].end();
    return false;
  }
  if (op == "truthy") {
    if (arg.is_null()) return false;
    if (arg.is_boolean()) return arg.get<bool>();
    if (arg.is_number()) return arg.get<double>() != 0;
    if (arg.is_string()) return !arg.get_ref<const std::string&>().empty();
    if (arg.is_array() || arg.is_object()) return !arg.empty();
    return false;
  }
  if (op == "not") return !evaluate_condition(arg);
  fail("internal error: unknown condition operator '{}'", op);
}

}  // namespace basalt::workflow
