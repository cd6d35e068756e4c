// Workflow definitions (docs/WORKFLOWS.md §1): the JSON format, parsed and
// checked once at load into a Workflow the runner trusts.
//
// Contract:
//  * parse_workflow() reads one definition (text up to 1 MiB, nested at
//    most 64 levels, checked before the JSON parser, which recurses per
//    level) and throws basalt::Error listing every problem found, each
//    naming where: the step by index and name and the field
//    (`steps[2] (combine).prompt: refers to undefined step 'sumaries'`).
//    Unknown keys, wrong types, out-of-range numbers, duplicate names,
//    malformed templates, references to undefined steps, to the step
//    itself, to `item`/`index` outside a map, and cycles (named by the
//    steps on them) are refused.
//  * A loaded Workflow's steps keep the file's order; `depends_on` lists,
//    per step, the steps it must follow (those its templates read, its
//    `after`, the conditions naming it in a branch), and `order` is a
//    topological order of the steps (the file's order among equals).
//  * load_workflows() reads a file, or every `*.json` file of a directory
//    (sorted by name); two workflows of one name are an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt::workflow {

enum class StepType { kModel, kHttp, kMap, kCondition };
const char* step_type_name(StepType type);

struct ModelCall {
  std::string model;
  std::string fallback_model;  // empty: none
  bool chat = true;            // messages (chat) or prompt (completion)
  // Chat: role and content template of each message.
  std::vector<std::pair<std::string, std::string>> messages;
  std::string prompt;  // completion: a template
  // Fields passed to the request as they are (max_tokens, temperature,
  // top_p, seed, stop, response_format, tools, tool_choice).
  nlohmann::json params = nlohmann::json::object();
  // response_format asks for JSON: the output is the parsed text.
  bool wants_json = false;
};

struct HttpCall {
  std::string url;  // as written (validated: http or https, a host)
  std::string method = "POST";
  std::vector<std::pair<std::string, std::string>> headers;  // name, value template
  nlohmann::json body;                                       // a template value; null: none
};

struct Step {
  std::string name;  // empty for a map's inner step
  StepType type = StepType::kModel;
  std::vector<std::string> after;
  double timeout_s = 300;
  int retries = 0;
  ModelCall model;  // kModel
  HttpCall http;    // kHttp
  // kMap
  std::string over;  // a template of one path
  int concurrency = 4;
  std::shared_ptr<const Step> inner;
  // kCondition
  nlohmann::json condition;  // the validated `if`
  std::vector<std::string> then_steps;
  std::vector<std::string> else_steps;

  // Filled by the loader: indices into Workflow::steps.
  std::vector<size_t> depends_on;
  // The conditions that gate this step: (condition index, branch it needs).
  std::vector<std::pair<size_t, bool>> gated_by;
};

struct InputField {
  std::string name;
  std::string type;  // string, number, integer, boolean, array, object, any
};

struct Workflow {
  std::string name;
  std::string description;
  std::vector<InputField> input;
  std::vector<Step> steps;
  nlohmann::json output;  // a template value; null: the last step's output
  bool has_output = false;
  std::vector<size_t> order;
  nlohmann::json source;  // the definition as loaded (served by GET /v1/workflows)

  // The index of the step named `name`, or -1.
  int64_t find(std::string_view name) const;
};

// `source` names the file in errors.
Workflow parse_workflow(std::string_view text, std::string_view source);
Workflow parse_workflow_json(const nlohmann::json& definition, std::string_view source);

std::map<std::string, std::shared_ptr<const Workflow>> load_workflows(const std::string& path);

// An empty string when `input` satisfies the workflow's `input` fields,
// else what is wrong (`input.text: required`).
std::string check_input(const Workflow& workflow, const nlohmann::json& input);

// The deepest nesting of objects and arrays in JSON text (strings
// skipped): checked before nlohmann's parser, which recurses per level.
int json_nesting_depth(std::string_view text);

// Evaluates a validated condition (`if`) after its templates are rendered
// (render_value), to true or false.
bool evaluate_condition(const nlohmann::json& rendered);

}  // namespace basalt::workflow
