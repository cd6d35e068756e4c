#include "chat_output/tool_call_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/json_schema.h"

namespace basalt {
namespace {

using Json = nlohmann::ordered_json;

struct Function {
  size_t index;  // in `tools`, for its rule prefix
  std::string name;
  const Json* parameters;  // null when absent
};

// Names the deepseek formats write outside JSON must read back as names
// (tool_call_parser.cc's name bytes); OpenAI's own rule is [A-Za-z0-9_-]{1,64}.
bool is_plain_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == ':';
  });
}

std::vector<Function> functions_of(const Json& tools) {
  BASALT_CHECK(tools.is_array() && !tools.empty(), "tool call grammar: there are no tools to call");
  std::vector<Function> functions;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const Json* function = tool.is_object() && tool.contains("function") ? &tool.at("function") : nullptr;
    BASALT_CHECK(function && function->is_object() && function->contains("name") && function->at("name").is_string(),
                 "tool call grammar: tools[{}] has no function name", i);
    std::string name = function->at("name").get<std::string>();
    BASALT_CHECK(!name.empty(), "tool call grammar: tools[{}] has an empty function name", i);
    BASALT_CHECK(seen.insert(name).second, "tool call grammar: function \"{}\" is defined twice", name);
    const Json* parameters = function->contains("parameters") ? &function->at("parameters") : nullptr;
    if (parameters && parameters->is_null()) parameters = nullptr;
    functions.push_back({i, std::move(name), parameters});
  }
  return functions;
}

// The schema with its instances restricted to objects (arguments are one).
Json object_schema(const Json& parameters, const std::string& name) {
  if (parameters.is_boolean() && parameters.get<bool>()) return Json{{"type", "object"}};
  BASALT_CHECK(parameters.is_object(),
               "tool call grammar: the parameters of function \"{}\" must be a JSON Schema object", name);
  Json schema = parameters;
  if (!schema.contains("type")) {
    schema["type"] = "object";
    return schema;
  }
  const Json& type = schema.at("type");
  const bool allows_object =
      type == "object" || (type.is_array() && std::find(type.begin(), type.end(), Json("object")) != type.end());
  BASALT_CHECK(allows_object,
               "tool call grammar: the parameters of function \"{}\" must be an object schema, not type {}", name,
               type.dump());
  schema["type"] = "object";
  return schema;
}

// The grammar text of one function's arguments, its root rule prefix + "root".
std::string arguments_rules(const Function& function, const std::string& prefix) {
  JsonSchemaOptions options;
  options.rule_prefix = prefix;
  if (!function.parameters) return json_object_ebnf(options);
  try {
    return json_schema_to_ebnf(object_schema(*function.parameters, function.name), options);
  } catch (const Error& e) {
    fail("tool call grammar: the parameters of function \"{}\": {}", function.name, e.what());
  }
}

// One call of `name` with arguments `args` (a rule name), as the format writes it.
std::string call_expr(ToolCallFormat format, const std::string& name, const std::string& args) {
  const std::string quoted = nlohmann::json(name).dump();
  switch (format) {
    case ToolCallFormat::kHermes:
      return fmt::format("{} {} {}", ebnf_literal("<tool_call>\n{\"name\": " + quoted + ", \"arguments\": "), args,
                         ebnf_literal("}\n</tool_call>"));
    case ToolCallFormat::kLlama3Json:
      return fmt::format("{} {} {}", ebnf_literal("{\"name\": " + quoted + ", \"parameters\": "), args,
                         ebnf_literal("}"));
    case ToolCallFormat::kMistral:
      return fmt::format("{} {} {}", ebnf_literal("{\"name\": " + quoted + ", \"arguments\": "), args,
                         ebnf_literal("}"));
    case ToolCallFormat::kDeepSeekV3:
      return fmt::format("{} {} {}", ebnf_literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"),
                         args, ebnf_literal("\n```<｜tool▁call▁end｜>"));
    case ToolCallFormat::kDeepSeekV31:
      return fmt::format("{} {} {}", ebnf_literal("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>"), args,
                         ebnf_literal("<｜tool▁call▁end｜>"));
  }
  return {};
}

// "tool-call", once or (parallel) one or more times joined by `joiner`.
std::string calls_expr(bool parallel, std::string_view joiner) {
  if (!parallel) return "tool-call";
  if (joiner.empty()) return "tool-call+";
  return fmt::format("tool-call ({} tool-call)*", ebnf_literal(joiner));
}

// Text without "</think>" in it, as rule "think-text". A '<' starts either
// a run that breaks off before the tag is complete (and goes on with
// anything but '<', which would start a new run), or a run of proper
// prefixes of the tag, each followed by another '<', that the text may end
// with (then "</think>" follows, or another run does).
constexpr std::string_view kThinkTextRules = R"(think-text ::= ( [^<] | think-lt )* think-partial*
think-lt ::= think-partial* "<"+ ( [^</] | "/" ( [^<t] | "t" ( [^<h] | "h" ( [^<i] | "i" ( [^<n] | "n" ( [^<k] | "k" [^<>] ) ) ) ) ) )
think-partial ::= "<"+ ( "/" ( "t" ( "h" ( "i" ( "n" "k"? )? )? )? )? )?
)";

// The reasoning before the calls, as ReasoningParser reads each format
// (narrower: the parser also takes whitespace before <think>, which the
// grammar leaves out so that a model is not led into writing it).
std::string reasoning_expr(const ReasoningPrefix& r) {
  const std::string text_then_close = "think-text \"</think>\" [ \\t\\n]*";
  if (r.format == ReasoningFormat::kDeepSeekR1) return "\"<think>\"? " + text_then_close;
  if (r.starts_in_reasoning) return text_then_close;
  return "( \"<think>\" " + text_then_close + " )?";
}

}  // namespace

std::string tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools, ToolChoiceMode mode,
                              const std::string& named_function, bool parallel,
                              std::optional<ReasoningPrefix> reasoning) {
  std::vector<Function> functions = functions_of(tools);
  if (mode == ToolChoiceMode::kNamed) {
    const auto named =
        std::find_if(functions.begin(), functions.end(), [&](const Function& f) { return f.name == named_function; });
    BASALT_CHECK(named != functions.end(), "tool call grammar: the named function \"{}\" is not among the tools",
                 named_function);
    functions = {*named};
    parallel = false;
  }
  const bool deepseek = format == ToolCallFormat::kDeepSeekV3 || format == ToolCallFormat::kDeepSeekV31;
  std::string arguments, alternatives;
  for (const Function& function : functions) {
    BASALT_CHECK(!deepseek || is_plain_name(function.name),
                 "tool call grammar: function name \"{}\" cannot be written in the {} format (letters, digits, "
                 "_ - . : only)",
                 function.name, to_string(format));
    const std::string prefix = fmt::format("fn{}.", function.index);
    arguments += arguments_rules(function, prefix);
    alternatives += (alternatives.empty() ? "" : "\n    | ") + call_expr(format, function.name, prefix + "root");
  }
  std::string root;
  switch (format) {
    case ToolCallFormat::kHermes:
      root = calls_expr(parallel, "\n");
      break;
    case ToolCallFormat::kLlama3Json:
      root = calls_expr(parallel, "; ");
      break;
    case ToolCallFormat::kMistral:
      root = fmt::format("\"[\" {} \"]\"", calls_expr(parallel, ", "));
      break;
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kDeepSeekV31:
      root = fmt::format("{} {} {}", ebnf_literal("<｜tool▁calls▁begin｜>"),
                         calls_expr(parallel, format == ToolCallFormat::kDeepSeekV3 ? "\n" : ""),
                         ebnf_literal("<｜tool▁calls▁end｜>"));
      break;
  }
  if (!reasoning) return fmt::format("root ::= {}\ntool-call ::= {}\n{}", root, alternatives, arguments);
  return fmt::format("root ::= {} {}\ntool-call ::= {}\n{}{}", reasoning_expr(*reasoning), root, alternatives,
                     arguments, kThinkTextRules);
}

}  // namespace basalt
